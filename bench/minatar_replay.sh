#!/usr/bin/env bash
# Uniform against prioritized replay on MinAtar Breakout and SpaceInvaders, from pixels,
# on the CPU (issue 12's learning-quality report; docs/results/learning.md). One run at a time, in
# the order that makes a partial matrix useful: every game and replay on the first
# seed, then the next seed.
#
#   bench/minatar_replay.sh                 # STEPS=500000 SEEDS="0 1" GAMES="Breakout SpaceInvaders"
#   STEPS=1000000 SEEDS="0 1 2" bench/minatar_replay.sh
#   bench/minatar_replay.sh report          # only the curves, CSV and the replayed policies
#
# Runs resume: each has its own logdir under runs/minatar_replay/ and a checkpoint every
# 10 minutes; an interrupted run continues where its checkpoint is (--resume-if-present),
# a finished one is skipped, and a larger STEPS extends finished runs (their --max-steps
# grows). The logs are appended to, so a resumed run's curve is whole.
#
# Settings: bench/minatar.sh's (the MinAtar paper's DQN where millrace has it: batch 32,
# one update per env step, replay 100k, learning from 5k steps, target every 1,000
# updates, ε from 1 over 100k steps, γ 0.99, 1-step returns; Adam at 1e-4), the same
# for both replays; "prioritized" adds --replay prioritized (α 0.6, β 0.4, the
# learner's |TD| fed back every 8 updates, actors' initial priorities). Evaluations: 30
# greedy episodes every 50,000 steps. The report replays each run's best/ policy in
# Gymnasium (scripts/play_policy.py, 100 episodes) and writes
# docs/results/data/minatar_replay_<game>.{png,csv} and docs/results/data/minatar_replay.md.
#
# MILLRACE_BIN=DIR runs the learner in DIR (a copy, so rebuilding meanwhile does not
# touch the running binary); by default it is built here.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/../scripts/setup.sh"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
if [[ -z "${MILLRACE_BIN:-}" ]]; then
    cargo build --release --bins --locked
    MILLRACE_BIN="$CARGO_TARGET_DIR/release"
fi
learner="$MILLRACE_BIN/learner"
steps="${STEPS:-500000}"
read -r -a seeds <<<"${SEEDS:-0 1}"
read -r -a games <<<"${GAMES:-Breakout SpaceInvaders}"
replays=(uniform prioritized)
out="${OUT:-runs/minatar_replay}"
mkdir -p "$out" docs/results/data

common=(--cpu --batch-size 32 --samples-per-insert 32 --learning-starts 5000
        --replay-capacity 100000 --lr 1e-4 --target-period 1000 --eps-decay-steps 100000
        --n-step 1 --eval-every 50000 --eval-episodes 30 --target-return 1000
        --checkpoint-every-s 600 --no-progress)

if [[ "${1:-}" != report ]]; then
    for seed in "${seeds[@]}"; do
        for game in "${games[@]}"; do
            for replay in "${replays[@]}"; do
                name="$game-$replay-$seed"
                echo "$(date -u +%FT%TZ) $name: $steps steps" >&2
                RUST_LOG=info "$learner" "${common[@]}" --env "gym:MinAtar/$game-v1" \
                    --replay "$replay" --seed "$seed" --max-steps "$steps" \
                    --logdir "$out/$name" --resume-if-present >>"$out/$name.log" 2>&1 || true
            done
        done
    done
fi

# The report: curves per game, and each run's best/ replayed in Gymnasium.
declare -A reference=([Breakout]=10 [SpaceInvaders]=43)
table=docs/results/data/minatar_replay.md
{
    echo "| game | replay | seed | env steps | best evaluation (30 episodes) | best/ in Gymnasium (100 episodes) |"
    echo "|---|---|---|---|---|---|"
} >"$table"
for game in "${games[@]}"; do
    curves=()
    for replay in "${replays[@]}"; do
        for seed in "${seeds[@]}"; do
            name="$game-$replay-$seed"
            [[ -f "$out/$name.log" ]] || continue
            curves+=("$replay, seed $seed=$out/$name.log")
            meta="$out/$name/checkpoint/best/meta.json"
            [[ -f "$meta" ]] || continue
            "$learner" export --checkpoint "$out/$name/checkpoint" --which best \
                --out "$out/$name-best.safetensors" >/dev/null
            played="$(python scripts/play_policy.py "$out/$name-best.safetensors" \
                --episodes 100 --seed 1000 | tail -1)"
            python - "$meta" "$played" "$game" "$replay" "$seed" >>"$table" <<'EOF'
import json, sys
meta, played = json.load(open(sys.argv[1])), json.loads(sys.argv[2])
ev = meta.get("eval", meta)
print(f"| {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {meta['env_steps']} "
      f"| {ev['mean']:.1f} ± {ev['stderr']:.1f} "
      f"| {played['mean']:.1f} ± {played['stderr']:.1f} (sd {played['std']:.1f}) |")
EOF
        done
    done
    [[ ${#curves[@]} -gt 0 ]] || continue
    lower="$(echo "$game" | tr '[:upper:]' '[:lower:]')"
    python bench/minatar_curve.py "docs/results/data/minatar_replay_$lower" "${reference[$game]}" "${curves[@]}"
done
cat "$table"
