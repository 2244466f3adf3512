"""Turns time_to_solve.sh's JSON lines into a Markdown table with medians and ratios.

A run counts as solved only if its saved solving policy replayed at the target in
Gymnasium ("solved"); "claimed" is what the run itself reported.
"""

import json
import statistics
import sys

runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
impls = []
for r in runs:
    if r["impl"] not in impls:
        impls.append(r["impl"])


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


print("| implementation | seed | reported solved | saved policy in Gymnasium (100 ep.) | solved | env steps | wall s | updates |")
print("|---|---|---|---|---|---|---|---|")
for r in runs:
    print(
        f"| {r['impl']} | {r['seed']} | {'yes' if r['claimed'] else 'no'} | {fmt(r['replay_mean'])} "
        f"| {'**yes**' if r['solved'] else '**no**'} | {r['env_steps']} | {r['train_s']:.2f} | {r['updates']} |"
    )
print()
med = {}
for name in impls:
    rs = [r for r in runs if r["impl"] == name]
    ok = [r for r in rs if r["solved"]]
    claimed = sum(r["claimed"] for r in rs)
    if ok:
        med[name] = statistics.median(r["train_s"] for r in ok)
        steps = statistics.median(r["env_steps"] for r in ok)
        print(
            f"- {name}: {len(ok)}/{len(rs)} solved by the saved-policy rule ({claimed} reported), "
            f"median {med[name]:.2f} s, median {steps:.0f} env steps over the solved runs"
        )
    else:
        print(f"- {name}: 0/{len(rs)} solved by the saved-policy rule ({claimed} reported)")
if len(med) == 2:
    a, b = impls
    print(f"- wall-clock ratio (median {b} / median {a}, solved runs): {med[b] / med[a]:.1f}x")
