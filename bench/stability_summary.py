"""Summarises bench/cartpole_stability.csv per setting with the issue's bar: from a
run's first evaluation at >= 475 on, the share of evaluations in the next AFTER env
steps (default 50,000) that stay >= 475 must be at least 90%, on every seed. A run that
ends before AFTER steps past its first 475 is counted on the evaluations it has, and
marked short.

    python bench/stability_summary.py docs/results/data/cartpole_stability.csv [AFTER]
    python bench/stability_summary.py --run EVALS [AFTER]
    THRESHOLD=-80 python bench/stability_summary.py docs/results/data/classic_acrobot.csv

THRESHOLD (default 475, CartPole-v1's) is the return that counts as solved: Acrobot-v1's
-80 or MountainCar-v0's -105 apply the same measure to those environments.

Prints one Markdown row per setting: seeds, seeds meeting the bar, each seed's share,
the median env steps to the first 475, and the lowest evaluation after it. With --run,
EVALS holds one run's evaluations ("env_steps return" per line) and it prints that
run's cells (first 475 | evaluations in the window | share | lowest), as
bench/cartpole_stability.sh tabulates each run.
"""

import csv
import os
import statistics
import sys
from collections import defaultdict

THRESHOLD = float(os.environ.get("THRESHOLD", "475"))


def judge(points, after):
    """One run's (steps, return) points, sorted -> (first step at >= THRESHOLD or None,
    the returns in the AFTER steps past it, share of them >= THRESHOLD, whether the run
    ended before the window did)."""
    reached = next((s for s, r in points if r >= THRESHOLD), None)
    if reached is None:
        return None, [], None, False
    window = [r for s, r in points if reached < s <= reached + after]
    short = points[-1][0] < reached + after - 2_000
    share = sum(r >= THRESHOLD for r in window) / len(window) if window else 0.0
    return reached, window, share, short


def one_run(path, after):
    points = sorted((int(s), float(r)) for s, r in (line.split() for line in open(path) if line.strip()))
    reached, window, share, _ = judge(points, after)
    if reached is None:
        print("never | — | — | —")
    else:
        print(f"{reached} | {len(window)} | {share:.0%} | {min(window, default='—')}")


def main():
    if sys.argv[1] == "--run":
        one_run(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 50_000)
        return
    path = sys.argv[1]
    after = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000
    runs = defaultdict(list)  # (mode, seed) -> [(steps, return)]
    for row in csv.DictReader(open(path)):
        runs[(row["mode"], int(row["seed"]))].append((int(row["env_steps"]), float(row["mean_return"])))
    modes = defaultdict(list)
    for (mode, seed), points in sorted(runs.items()):
        reached, window, share, short = judge(sorted(points), after)
        modes[mode].append((seed, reached, share, min(window, default=None), short))
    t = f"{THRESHOLD:g}"
    print(f"| setting | seeds | seeds >= 90% | share >= {t} per seed | median first {t} | lowest eval after |")
    print("|---|---|---|---|---|---|")
    for mode, seeds in modes.items():
        ok = sum(1 for _, _, share, _, _ in seeds if share is not None and share >= 0.9)
        shares = " ".join(
            "never" if share is None else f"{share:.0%}{'*' if short else ''}" for _, _, share, _, short in seeds
        )
        reached = [r for _, r, _, _, _ in seeds if r is not None]
        lows = [m for _, _, _, m, _ in seeds if m is not None]
        print(
            f"| `{mode}` | {len(seeds)} | {ok}/{len(seeds)} | {shares} "
            f"| {statistics.median(reached):,.0f} | {min(lows, default=float('nan')):.1f} |"
        )


if __name__ == "__main__":
    main()
