#!/usr/bin/env bash
# Double DQN against Munchausen DQN (`--target munchausen`, the paper's τ 0.03, α 0.9,
# clip −1), IQN (`--head iqn`) and M-IQN (both) on CartPole-v1 with every other flag at
# its default, side by side on the same seeds in one sitting (VARIANTS picks some:
# "double munchausen iqn m-iqn" by default). Each run stops when an evaluation reaches 475 and a second
# one on fresh episodes confirms it; its `solved/` policy is then exported and replayed
# in Gymnasium itself (scripts/play_policy.py, 100 episodes, seed 1000), and only that
# replay counts. Prints one JSON line per run, then each target's medians.
#
#   [VARIANTS="iqn m-iqn"] bench/targets_cartpole.sh [seeds...]   (default: 11 to 20)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
seeds=("${@:-11 12 13 14 15 16 17 18 19 20}")
# shellcheck disable=SC2206
seeds=(${seeds[*]})
# shellcheck disable=SC2206
variants=(${VARIANTS:-double munchausen iqn m-iqn})
declare -A flags=(
    [double]=""
    [munchausen]="--target munchausen"
    [iqn]="--head iqn"
    [m-iqn]="--head iqn --target munchausen"
)
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
(cd "$here/.." && cargo build --release --locked --bin learner >&2)
learner="$CARGO_TARGET_DIR/release/learner"
py="$MILLRACE_VENV/bin/python"
out="$(mktemp -d)"
results="$out/results.jsonl"
for seed in "${seeds[@]}"; do
    for target in "${variants[@]}"; do
        dir="$out/$target-$seed"
        start=$(date +%s.%N)
        status=0
        # shellcheck disable=SC2086
        summary="$("$learner" --no-progress --cpu --seed "$seed" ${flags[$target]} \
            --logdir "$dir" 2>/dev/null)" || status=$?
        end=$(date +%s.%N)
        steps="$(sed -n 's/.*solved at \([0-9]*\) env steps.*/\1/p' <<<"$summary")"
        replay='{"mean": null, "min": null}'
        if [[ $status -eq 0 ]]; then
            "$learner" export --checkpoint "$dir/checkpoint" --which solved \
                --out "$dir.safetensors" >/dev/null
            replay="$("$py" "$here/../scripts/play_policy.py" "$dir.safetensors" \
                --episodes 100 --seed 1000)"
        fi
        "$py" -c '
import json, sys
r = json.loads(sys.argv[5])
print(json.dumps({"target": sys.argv[1], "seed": int(sys.argv[2]),
    "env_steps": int(sys.argv[3]) if sys.argv[3] else None,
    "wall_s": round(float(sys.argv[4]), 2), "replay_mean": r.get("mean"),
    "replay_min": r.get("min")}))' "$target" "$seed" "${steps:-}" \
            "$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" "$replay" | tee -a "$results"
    done
done
"$py" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| target | runs | replay ≥ 475 | median env steps to solve | median wall s | worst replay mean |")
print("|---|---|---|---|---|---|")
for t in dict.fromkeys(r["target"] for r in rows):
    rs = [r for r in rows if r["target"] == t]
    ok = [r for r in rs if r["replay_mean"] is not None and r["replay_mean"] >= 475]
    steps = [r["env_steps"] for r in rs if r["env_steps"]]
    means = [r["replay_mean"] for r in rs if r["replay_mean"] is not None]
    print(f"| {t} | {len(rs)} | {len(ok)} | {statistics.median(steps):.0f} | "
          f"{statistics.median(r['wall_s'] for r in rs):.1f} | {min(means):.1f} |")
PY
