"""Turns time_to_solve.sh's JSON lines into a Markdown table with medians and ratios."""

import json
import statistics
import sys

runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
impls = []
for r in runs:
    name = "millrace" if r["impl"] == "millrace" else r["impl"]
    if name not in impls:
        impls.append(name)
print("| implementation | seed | solved | env steps | wall s | updates |")
print("|---|---|---|---|---|---|")
for r in runs:
    print(f"| {r['impl']} | {r['seed']} | {'yes' if r['solved'] else 'no'} | {r['env_steps']} | {r['train_s']:.2f} | {r['updates']} |")
print()
med = {}
for name in impls:
    rs = [r for r in runs if r["impl"] == name]
    med[name] = statistics.median(r["train_s"] for r in rs)
    solved = sum(r["solved"] for r in rs)
    steps = statistics.median(r["env_steps"] for r in rs if r["env_steps"] is not None)
    print(f"- {name}: {solved}/{len(rs)} solved, median {med[name]:.2f} s, median {steps:.0f} env steps")
if len(impls) == 2:
    a, b = impls
    print(f"- wall-clock ratio (median {b} / median {a}): {med[b] / med[a]:.1f}x")
