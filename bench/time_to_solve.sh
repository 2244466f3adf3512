#!/usr/bin/env bash
# Time to solve CartPole-v1, millrace side by side with Stable-Baselines3 2.9.2's DQN and
# rl-zoo3 2.9.2's hyperparameters, in one sitting on one machine. Prints one JSON line
# per run, then a Markdown table with medians and the wall-clock ratio.
#
#   bench/time_to_solve.sh [seeds...]        (default: 0 1 2 3 4)
#
# The rule for both: every 2,000 env steps, 100 greedy episodes; a run that reaches a
# mean of 475 (millrace: and confirms it on fresh episodes) saves its solving policy,
# which is then replayed from the saved file in Gymnasium itself on 100 other episodes.
# A run counts as solved only if that replay also averages >= 475. millrace's policy is
# exported (`learner export --which solved`) and played by scripts/play_policy.py;
# SB3's model is saved, loaded and played by bench/sb3/time_to_solve.py.
#
# millrace's time is the whole process wall clock (start-up, evaluation, confirmation
# and checkpoint included); SB3's is its training time with evaluation excluded.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
seeds=("${@:-0 1 2 3 4}")
# shellcheck disable=SC2206
seeds=(${seeds[*]})
sb3_venv="$("$here/sb3/setup.sh" | tail -1)"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
(cd "$here/.." && cargo build --release --locked --bin learner >&2)
learner="$CARGO_TARGET_DIR/release/learner"
out="$(mktemp -d)"
results="$out/results.jsonl"
for seed in "${seeds[@]}"; do
    start=$(date +%s.%N)
    status=0
    summary="$("$learner" --no-progress --seed "$seed" --logdir "$out/millrace-$seed" 2>/dev/null)" || status=$?
    end=$(date +%s.%N)
    steps="$(sed -n 's/.*solved at \([0-9]*\) env steps.*/\1/p' <<<"$summary")"
    updates="$(sed -n 's/^  updates: *\([0-9]*\).*/\1/p' <<<"$summary")"
    replay=null
    if [[ $status -eq 0 ]]; then
        "$learner" export --checkpoint "$out/millrace-$seed/checkpoint" --which solved \
            --out "$out/policy-$seed.safetensors" >/dev/null
        replay="$("$MILLRACE_VENV/bin/python" "$here/../scripts/play_policy.py" \
            "$out/policy-$seed.safetensors" --episodes 100 --seed $((20000 + seed)) \
            | "$MILLRACE_VENV/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["mean"])')"
    fi
    solved="$(awk -v r="$replay" 'BEGIN { print (r != "null" && r + 0 >= 475) ? "true" : "false" }')"
    printf '{"impl": "millrace", "seed": %s, "claimed": %s, "replay_mean": %s, "solved": %s, "env_steps": %s, "train_s": %.2f, "updates": %s}\n' \
        "$seed" "$([[ $status -eq 0 ]] && echo true || echo false)" "$replay" "$solved" \
        "${steps:-null}" "$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" "${updates:-0}" | tee -a "$results"
done
"$sb3_venv/bin/python" "$here/sb3/time_to_solve.py" --seeds "${seeds[@]}" | tee -a "$results"
"$sb3_venv/bin/python" "$here/summarize.py" "$results"
