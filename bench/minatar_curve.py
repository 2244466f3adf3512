"""Learning curves from learner logs: greedy evaluation return against env steps, one
line per run, beside a published reference; writes the points as CSV and a PNG.

    python bench/minatar_curve.py [--keep] OUT_PREFIX REFERENCE LABEL=LOG [LABEL=LOG ...]

REFERENCE is the published score to draw (e.g. 10 for MinAtar Breakout's DQN at 5M
frames; "none" draws no line). Each LOG is a `learner` log (its `eval:` lines are read). Runs whose labels
share the part before the first comma ("uniform, seed 0", "uniform, seed 1") share a
colour and differ in marker and line style. Prints the table too.

With --keep, the points already in OUT_PREFIX.csv of runs not given here are kept (an
earlier machine's runs, whose logs are gone); a run given here replaces its points.
"""

import csv
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

EVAL = re.compile(
    r"eval: mean return (?P<mean>-?[\d.]+) ± (?P<se>[\d.]+) .*?"
    r"(?P<episodes>\d+) episodes, parameters v\d+ at (?P<steps>\d+) env steps"
)


def read(log):
    points = []
    for line in open(log, errors="replace"):
        m = EVAL.search(line)
        if m and "confirmation" not in line:
            points.append((int(m["steps"]), float(m["mean"]), float(m["se"])))
    return points


def kept(path):
    """The points of OUT_PREFIX.csv by run label (none when it does not exist)."""
    runs = {}
    try:
        rows = list(csv.DictReader(open(path)))
    except FileNotFoundError:
        return runs
    for row in rows:
        runs.setdefault(row["run"], []).append(
            (int(row["env_steps"]), float(row["mean_return"]), float(row["stderr"]))
        )
    return runs


def main():
    args = sys.argv[1:]
    keep = args[0] == "--keep"
    if keep:
        args = args[1:]
    prefix = args[0]
    reference = None if args[1] == "none" else float(args[1])
    runs = kept(prefix + ".csv") if keep else {}
    for arg in args[2:]:
        label, log = arg.split("=", 1)
        runs[label] = read(log)
    fig, ax = plt.subplots(figsize=(7, 4))
    colours, seen = {}, {}
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]
    with open(prefix + ".csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["run", "env_steps", "mean_return", "stderr"])
        for label, points in sorted(runs.items()):
            for p in points:
                out.writerow([label, *p])
            if not points:
                continue
            xs, ys, se = zip(*points)
            group = label.split(",")[0]
            colour = colours.setdefault(group, f"C{len(colours)}")
            marker, style = styles[seen.get(group, 0) % len(styles)]
            seen[group] = seen.get(group, 0) + 1
            ax.plot(xs, ys, marker=marker, markersize=3, linestyle=style, color=colour, label=label)
            lows, highs = [y - s for y, s in zip(ys, se)], [y + s for y, s in zip(ys, se)]
            ax.fill_between(xs, lows, highs, color=colour, alpha=0.15)
            print(f"{label}: " + ", ".join(f"{x // 1000}k {y:.1f}" for x, y, _ in points))
    if reference is not None:
        ax.axhline(reference, color="grey", linestyle="--", label=f"MinAtar paper DQN, 5M frames (≈{reference:g})")
    ax.set_xlabel("env steps (frames)")
    ax.set_ylabel("greedy evaluation return")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(prefix + ".png", dpi=120)


if __name__ == "__main__":
    main()
