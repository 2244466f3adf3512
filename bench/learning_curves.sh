#!/usr/bin/env bash
# Is learning any worse when it is asynchronous? CartPole greedy-evaluation curves at the
# same env steps, for the one-process run (embedded: one actor thread, 8 envs) and the
# rate-limited asynchronous service (learner --listen + two `actor --n 4` processes over
# loopback), several seeds each; writes docs/results/data/learning_curves.{csv,png}.
#
#   bench/learning_curves.sh [SEEDS...]        (default: 0 1 2)
#   STEPS=30000 bench/learning_curves.sh 0 1 2 3 4
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
seeds=("${@:-0}")
[ $# -eq 0 ] && seeds=(0 1 2)
steps="${STEPS:-30000}"
out=docs/results/data
mkdir -p "$out"
cargo build --release --locked --bin learner --bin actor >&2
bin="$CARGO_TARGET_DIR/release"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
# Never stop early: the curves run to the same env steps.
common=(--env CartPole-v1 --max-steps "$steps" --target-return 1e9 --eval-every 2000 --no-progress)

csv="$out/learning_curves.csv"
echo "mode,seed,env_steps,mean_return" >"$csv"
extract() { # mode seed log
  # "eval: mean return 227.9 ± 7.9 (...; parameters v64 at 3912 env steps)"
  sed -n 's/.*eval: mean return \([-0-9.]*\) ± .* at \([0-9]*\) env steps).*/\2 \1/p' "$3" |
    while read -r s r; do echo "$1,$2,$s,$r"; done >>"$csv"
}
for seed in "${seeds[@]}"; do
  echo "seed $seed: one process" >&2
  RUST_LOG=info "$bin/learner" "${common[@]}" --seed "$seed" --logdir "$work/e$seed" \
    2>"$work/e$seed.log" >/dev/null || true
  extract one-process "$seed" "$work/e$seed.log"

  echo "seed $seed: asynchronous service, 2 actor processes" >&2
  RUST_LOG=info "$bin/learner" "${common[@]}" --seed "$seed" --logdir "$work/s$seed" \
    --listen 127.0.0.1:0 2>"$work/s$seed.log" >/dev/null &
  learner=$!
  addr=""
  for _ in $(seq 100); do
    addr="$(sed -n 's/.*listening for actors on \(.*\)$/\1/p' "$work/s$seed.log" | head -1)"
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "learner did not start" >&2; exit 1; }
  for a in 0 1; do
    "$bin/actor" --n 4 --learner "$addr" --seed "$((seed * 10 + a))" 2>/dev/null &
  done
  wait "$learner" || true
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  extract async "$seed" "$work/s$seed.log"
done

plot_venv="${MILLRACE_CACHE:-$HOME/.cache/millrace}/plot-venv"
if [ ! -x "$plot_venv/bin/python" ]; then
  python3 -m venv "$plot_venv" && "$plot_venv/bin/pip" install -q matplotlib==3.10.* >&2
fi
"$plot_venv/bin/python" bench/plot_curves.py "$csv" "$out/learning_curves.png"
