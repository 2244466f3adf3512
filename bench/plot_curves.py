"""Plots bench/learning_curves.sh's CSV: mean greedy return against env steps, one thin
line per seed and the mean across seeds per mode; prints the per-mode means at each
evaluation so the comparison is also in text.

    python bench/plot_curves.py docs/results/data/learning_curves.csv out.png [title]
        [--target 475] [--reference "LABEL=VALUE" ...] [--modes MODE,MODE] [--ylim LOW,HIGH]
        [--label "MODE=LABEL" ...]

Any CSV with columns mode,seed,env_steps,mean_return works (bench/cartpole_stability.sh
writes one too); modes other than the two below get colours of their own.
"""

import argparse
import csv
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("png")
    parser.add_argument("title", nargs="?", default="CartPole-v1: one process vs. rate-limited asynchronous service")
    parser.add_argument("--target", type=float, default=475, help="the target return, dotted")
    parser.add_argument("--reference", action="append", default=[], help="LABEL=VALUE, dashed")
    parser.add_argument("--modes", help="only these modes (comma-separated)")
    parser.add_argument("--ylim", help="LOW,HIGH: the return axis (default: all points)")
    parser.add_argument("--label", action="append", default=[], help="MODE=LABEL: the legend's name for a mode")
    args = parser.parse_args()
    path, png = args.csv, args.png
    only = set(args.modes.split(",")) if args.modes else None
    labels = dict(label.split("=", 1) for label in args.label)
    runs = defaultdict(list)  # (mode, seed) -> [(steps, return)]
    with open(path) as f:
        for row in csv.DictReader(f):
            if only is not None and row["mode"] not in only:
                continue
            runs[(row["mode"], row["seed"])].append(
                (int(row["env_steps"]), float(row["mean_return"]))
            )
    colours = {"one-process": "tab:blue", "async": "tab:orange"}
    others = iter(["tab:green", "tab:red", "tab:purple", "tab:brown", "tab:olive", "tab:cyan"])
    for mode, _ in sorted(runs):
        if mode not in colours:
            colours[mode] = next(others, "grey")
    by_mode = defaultdict(lambda: defaultdict(list))  # mode -> eval index -> returns
    fig, ax = plt.subplots(figsize=(7, 4))
    for (mode, seed), points in sorted(runs.items()):
        points.sort()
        xs, ys = zip(*points)
        ax.plot(xs, ys, color=colours.get(mode, "grey"), alpha=0.3, linewidth=1)
        for i, (x, y) in enumerate(points):
            by_mode[mode][i].append((x, y))
    print(f"{'eval':>4} " + " ".join(f"{m:>22}" for m in sorted(by_mode)))
    for mode, evals in sorted(by_mode.items()):
        xs = [sum(p[0] for p in v) / len(v) for _, v in sorted(evals.items())]
        ys = [sum(p[1] for p in v) / len(v) for _, v in sorted(evals.items())]
        n = max(len(v) for v in evals.values())
        ax.plot(xs, ys, color=colours.get(mode, "grey"), linewidth=2.5, label=f"{labels.get(mode, mode)} (mean of {n} seeds)")
    rows = max(len(e) for e in by_mode.values())
    for i in range(rows):
        cells = []
        for mode in sorted(by_mode):
            v = by_mode[mode].get(i, [])
            cells.append(
                f"{sum(p[0] for p in v) / len(v):>9.0f} {sum(p[1] for p in v) / len(v):>7.1f} n={len(v)}"
                if v
                else f"{'':>22}"
            )
        print(f"{i:>4} " + " ".join(f"{c:>22}" for c in cells))
    # Seed noise: each run's mean over all its evaluations (area under the curve).
    print("mean return over all evaluations, per run:")
    summary = {}
    for mode in sorted(by_mode):
        aucs = [sum(y for _, y in pts) / len(pts) for (m, _), pts in sorted(runs.items()) if m == mode]
        mean = sum(aucs) / len(aucs)
        sd = (sum((a - mean) ** 2 for a in aucs) / max(len(aucs) - 1, 1)) ** 0.5
        summary[mode] = (mean, sd, len(aucs))
        print(f"  {mode:<12} {' '.join(f'{a:6.1f}' for a in aucs)}  mean {mean:.1f}, sd {sd:.1f}")
    if len(summary) == 2:
        (m1, s1, n1), (m2, s2, n2) = summary.values()
        se = (s1 * s1 / n1 + s2 * s2 / n2) ** 0.5
        print(f"  difference {m1 - m2:+.1f} = {(m1 - m2) / se if se else 0:+.2f} standard errors (Welch)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean greedy return (100 episodes)")
    ax.set_title(args.title)
    if args.ylim:
        low, high = (float(v) for v in args.ylim.split(","))
        ax.set_ylim(low, high)
    ax.axhline(args.target, color="black", linestyle=":", linewidth=1, label=f"target {args.target:g}")
    for reference in args.reference:
        label, value = reference.rsplit("=", 1)
        ax.axhline(float(value), color="grey", linestyle="--", linewidth=1, label=label)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
