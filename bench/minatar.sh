#!/usr/bin/env bash
# Learning from pixels on MinAtar Breakout (gym:MinAtar/Breakout-v1, through the
# Gymnasium bridge), on the CPU: embedded (actors as threads), and as a service (a
# learner with --listen and one `actor --n 8` process over loopback). Writes the logs to
# runs/minatar/, the curve (PNG) and its points (CSV) to docs/results/data/.
#
# Settings follow the MinAtar paper's DQN (Young & Tian 2019) where millrace has them:
# batch 32, one update per env step (--samples-per-insert 32), replay 100k, 5k steps
# before learning, target network every 1,000 updates, ε from 1 over 100k steps (to
# millrace's default 0.04; the paper's 0.1), γ 0.99, 1-step returns; Adam at 1e-4
# instead of the paper's RMSProp at 2.5e-4.
#
# Usage: bench/minatar.sh [embedded steps, default 1000000] [service steps, default 500000]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/../scripts/setup.sh"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
cargo build --release --bins --locked
B="$CARGO_TARGET_DIR/release"
embedded="${1:-1000000}"
service="${2:-500000}"
out=runs/minatar
rm -rf "$out"
mkdir -p "$out"
common=(--env gym:MinAtar/Breakout-v1 --cpu --batch-size 32 --samples-per-insert 32
        --learning-starts 5000 --replay-capacity 100000 --lr 1e-4 --target-period 1000
        --eps-decay-steps 100000 --n-step 1 --eval-every 50000 --eval-episodes 30
        --target-return 1000 --seed 0 --no-progress)
"$B/learner" "${common[@]}" --max-steps "$embedded" --logdir "$out/embedded" \
    > "$out/embedded.log" 2>&1 || true
"$B/learner" "${common[@]}" --max-steps "$service" --logdir "$out/service" \
    --listen 127.0.0.1:7799 > "$out/service.log" 2>&1 &
learner=$!
sleep 5
"$B/actor" --learner 127.0.0.1:7799 --n 8 --name minatar > "$out/actor.log" 2>&1 || true
wait "$learner" || true
python bench/minatar_curve.py docs/results/data/minatar_breakout 10 \
    "embedded=$out/embedded.log" "service (1 actor process x 8 envs)=$out/service.log"
for run in embedded service; do
    "$B/learner" eval --checkpoint "$out/$run/checkpoint" --which best --episodes 100 --seed 7
    "$B/learner" export --checkpoint "$out/$run/checkpoint" --which best --out "$out/$run.safetensors"
    python scripts/play_policy.py "$out/$run.safetensors" --episodes 100 --seed 7
done
