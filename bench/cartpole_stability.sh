#!/usr/bin/env bash
# Does CartPole-v1 stay solved? Trains past the target and reads every evaluation:
#
#   bench/cartpole_stability.sh [seeds...]     (default: 0 1 2 3 4)
#   STEPS=100000 AFTER=50000 FLAGS="--replay prioritized" bench/cartpole_stability.sh
#
# Each run trains STEPS env steps (default 100,000) with an unreachable target, 100
# greedy episodes every 2,000 steps. Per run: the first evaluation at >= 475 ("reached"),
# and the share of the evaluations in the AFTER steps (default 50,000) after it that
# stay >= 475 (the issue's bar: at least 90% on every seed). The best/ policy of each
# run is replayed in Gymnasium. Writes one CSV line per evaluation to
# docs/results/data/cartpole_stability.csv (mode,seed,env_steps,mean_return) and prints a table.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
seeds=("${@:-0 1 2 3 4}")
# shellcheck disable=SC2206
seeds=(${seeds[*]})
steps="${STEPS:-100000}"
after="${AFTER:-50000}"
flags="${FLAGS:-}"
mode="${MODE:-${flags:-defaults}}"
# MILLRACE_BIN=DIR runs the learner in DIR (a copy, so rebuilding meanwhile does not
# touch the running binary); by default it is built here.
if [[ -z "${MILLRACE_BIN:-}" ]]; then
    cargo build --release --locked --bin learner >&2
    MILLRACE_BIN="$CARGO_TARGET_DIR/release"
fi
learner="$MILLRACE_BIN/learner"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p docs/results/data
csv=docs/results/data/cartpole_stability.csv
[[ -f "$csv" ]] || echo "mode,seed,env_steps,mean_return" >"$csv"
echo "| flags | seed | reached 475 at | evals in the next $after steps | share >= 475 | min | best/ in Gymnasium |"
echo "|---|---|---|---|---|---|---|"
for seed in "${seeds[@]}"; do
    # shellcheck disable=SC2086
    RUST_LOG=info "$learner" --cpu --no-progress $flags --seed "$seed" --max-steps "$steps" \
        --target-return 1e9 --logdir "$work/$seed" >/dev/null 2>"$work/$seed.log" || true
    sed -n 's/.*eval: mean return \([-0-9.]*\) ± .* at \([0-9]*\) env steps).*/\2 \1/p' "$work/$seed.log" \
        >"$work/$seed.evals"
    # The mode quoted as CSV (flags may hold commas: --hidden 256,256).
    awk -v m="\"${mode//\"/\"\"}\"" -v s="$seed" '{print m "," s "," $1 "," $2}' "$work/$seed.evals" >>"$csv"
    row="$("$MILLRACE_VENV/bin/python" bench/stability_summary.py --run "$work/$seed.evals" "$after")"
    "$learner" export --checkpoint "$work/$seed/checkpoint" --which best \
        --out "$work/best-$seed.safetensors" >/dev/null
    gym="$("$MILLRACE_VENV/bin/python" scripts/play_policy.py "$work/best-$seed.safetensors" \
        --episodes 100 --seed 1000 | tail -1 |
        "$MILLRACE_VENV/bin/python" -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["mean"])')"
    echo "| ${flags:-defaults} | $seed | $row | $gym |"
done
