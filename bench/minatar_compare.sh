#!/usr/bin/env bash
# Learner variants side by side on MinAtar games, from pixels, on the CPU
# (docs/results/learning.md): every game and variant on the first seed, then the next
# seed, so that a partial matrix is still a complete comparison; RUNS at a time.
#
#   GAMES="Asterix Breakout Freeway Seaquest SpaceInvaders" VARIANTS="double munchausen m-iqn" \
#       STEPS=1000000 SEEDS="0 1" bench/minatar_compare.sh
#   bench/minatar_compare.sh report          # only the curves, CSV and the replayed policies
#
# Defaults: STEPS=500000, SEEDS="0 1", GAMES="Breakout SpaceInvaders", VARIANTS="double
# munchausen", RUNS=1, OUT=runs/minatar_compare, REPORT=minatar_compare (the files
# docs/results/data/$REPORT.md and $REPORT_<game>.{png,csv}).
#
# The variants: double (the settings below, double DQN), munchausen (--target
# munchausen), iqn (--head iqn), m-iqn (both), impala (--network impala), uniform (as
# double) and prioritized (--replay prioritized).
#
# Runs resume: each has its own logdir under $OUT and a checkpoint every 10 minutes; an
# interrupted run continues where its checkpoint is (--resume-if-present), a finished
# one is skipped, and a larger STEPS extends finished runs (their --max-steps grows).
# The logs are appended to, so a resumed run's curve is whole.
#
# Settings: bench/minatar.sh's (the MinAtar paper's DQN where millrace has it: batch 32,
# one update per env step, replay 100k, learning from 5k steps, target every 1,000
# updates, ε from 1 over 100k steps, γ 0.99, 1-step returns; Adam at 1e-4), the same
# for every variant. Evaluations: 30 greedy episodes every 50,000 steps. The report
# replays each run's best/ policy in Gymnasium (scripts/play_policy.py, 100 episodes).
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
read -r -a variants <<<"${VARIANTS:-double munchausen}"
runs="${RUNS:-1}"
out="${OUT:-runs/minatar_compare}"
report="${REPORT:-minatar_compare}"
mkdir -p "$out" docs/results/data

declare -A flags=(
    [double]=""
    [munchausen]="--target munchausen"
    [iqn]="--head iqn"
    [m-iqn]="--head iqn --target munchausen"
    [impala]="--network impala"
    [uniform]=""
    [prioritized]="--replay prioritized"
)
for v in "${variants[@]}"; do
    [[ -v "flags[$v]" ]] || { echo "minatar_compare: unknown variant $v (${!flags[*]})" >&2; exit 2; }
done

common=(--cpu --batch-size 32 --samples-per-insert 32 --learning-starts 5000
        --replay-capacity 100000 --lr 1e-4 --target-period 1000 --eps-decay-steps 100000
        --n-step 1 --eval-every 50000 --eval-episodes 30 --target-return 1000
        --checkpoint-every-s 600 --no-progress)

if [[ "${1:-}" != report ]]; then
    for seed in "${seeds[@]}"; do
        for game in "${games[@]}"; do
            for variant in "${variants[@]}"; do
                name="$game-$variant-$seed"
                # At most $runs at once.
                while (($(jobs -rp | wc -l) >= runs)); do
                    wait -n || true
                done
                echo "$(date -u +%FT%TZ) $name: $steps steps" >&2
                # shellcheck disable=SC2086
                RUST_LOG=info "$learner" "${common[@]}" --env "gym:MinAtar/$game-v1" \
                    ${flags[$variant]} --seed "$seed" --max-steps "$steps" \
                    --logdir "$out/$name" --resume-if-present >>"$out/$name.log" 2>&1 &
            done
        done
    done
    wait || true
fi

# The report: curves per game, and each run's best/ replayed in Gymnasium. The
# references: the MinAtar paper's DQN at 5M frames (Young & Tian 2019), where this
# project has recorded it.
declare -A reference=([Breakout]=10 [SpaceInvaders]=43)
table="docs/results/data/$report.md"
{
    echo "| game | variant | seed | env steps | best evaluation (30 episodes) | best/ in Gymnasium (100 episodes) |"
    echo "|---|---|---|---|---|---|"
} >"$table"
for game in "${games[@]}"; do
    curves=()
    for variant in "${variants[@]}"; do
        for seed in "${seeds[@]}"; do
            name="$game-$variant-$seed"
            [[ -f "$out/$name.log" ]] || continue
            curves+=("$variant, seed $seed=$out/$name.log")
            meta="$out/$name/checkpoint/best/meta.json"
            [[ -f "$meta" ]] || continue
            "$learner" export --checkpoint "$out/$name/checkpoint" --which best \
                --out "$out/$name-best.safetensors" >/dev/null
            played="$(python scripts/play_policy.py "$out/$name-best.safetensors" \
                --episodes 100 --seed 1000 | tail -1)"
            python - "$meta" "$played" "$game" "$variant" "$seed" >>"$table" <<'PY'
import json, sys
meta, played = json.load(open(sys.argv[1])), json.loads(sys.argv[2])
ev = meta.get("eval", meta)
print(f"| {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {meta['env_steps']} "
      f"| {ev['mean']:.1f} ± {ev['stderr']:.1f} "
      f"| {played['mean']:.1f} ± {played['stderr']:.1f} (sd {played['std']:.1f}) |")
PY
        done
    done
    [[ ${#curves[@]} -gt 0 ]] || continue
    lower="$(echo "$game" | tr '[:upper:]' '[:lower:]')"
    python bench/minatar_curve.py "docs/results/data/${report}_$lower" "${reference[$game]:-none}" "${curves[@]}"
done
cat "$table"
