#!/usr/bin/env bash
# Time to solve CartPole-v1 (100 greedy episodes averaging >= 475, checked every 2,000 env
# steps), millrace side by side with Stable-Baselines3 2.9.2's DQN and rl-zoo3 2.9.2's
# hyperparameters, in one sitting on one machine. Prints one JSON line per run, then a
# Markdown table with medians and the wall-clock ratio.
#
#   bench/time_to_solve.sh [seeds...]        (default: 0 1 2 3 4)
#
# millrace's time is the whole process wall clock (start-up, evaluation and checkpoint
# included); SB3's is its training time with evaluation excluded.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
seeds=("${@:-0 1 2 3 4}")
# shellcheck disable=SC2206
seeds=(${seeds[*]})
sb3_venv="$("$here/sb3/setup.sh" | tail -1)"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
(cd "$here/.." && cargo build --release --locked --bin learner >&2)
out="$(mktemp -d)"
results="$out/results.jsonl"
for seed in "${seeds[@]}"; do
    start=$(date +%s.%N)
    summary="$("$CARGO_TARGET_DIR/release/learner" --no-progress --seed "$seed" --logdir "$out/millrace-$seed" 2>/dev/null || true)"
    end=$(date +%s.%N)
    steps="$(sed -n 's/.*solved at \([0-9]*\) env steps.*/\1/p' <<<"$summary")"
    updates="$(sed -n 's/^  updates: *\([0-9]*\).*/\1/p' <<<"$summary")"
    printf '{"impl": "millrace", "seed": %s, "solved": %s, "env_steps": %s, "train_s": %.2f, "updates": %s}\n' \
        "$seed" "$([[ -n $steps ]] && echo true || echo false)" "${steps:-null}" \
        "$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" "${updates:-0}" | tee -a "$results"
done
"$sb3_venv/bin/python" "$here/sb3/time_to_solve.py" --seeds "${seeds[@]}" | tee -a "$results"
"$sb3_venv/bin/python" "$here/summarize.py" "$results"
