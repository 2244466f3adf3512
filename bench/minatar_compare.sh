#!/usr/bin/env bash
# Learner variants side by side on MinAtar games, from pixels, on the CPU
# (docs/results/learning.md): every game and variant on the first seed, then the next
# seed, so that a partial matrix is still a complete comparison; RUNS at a time.
#
#   GAMES="Asterix Breakout Freeway Seaquest SpaceInvaders" VARIANTS="double munchausen m-iqn" \
#       STEPS=1000000 SEEDS="0 1" bench/minatar_compare.sh
#   bench/minatar_compare.sh report          # only the curves, CSV and the replayed policies
#                                            # of the runs that finished STEPS
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
# Settings: `--preset minatar` (the MinAtar paper's DQN where millrace has it: batch 32,
# one update per env step, replay 100k, learning from 5k steps, target every 1,000
# updates, ε from 1 over 100k steps, γ 0.99, 1-step returns; Adam at 1e-4), the same
# for every variant. Evaluations: 30 greedy episodes every 50,000 steps. The report
# replays each run's best/ policy in Gymnasium (scripts/play_policy.py, 100 episodes).
#
# The report adds to what is committed: a run whose directory is not under $OUT (an
# earlier machine's) keeps its row in docs/results/data/$REPORT.md and its points in
# the per-game CSV; a run found under $OUT replaces them.
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
table="docs/results/data/$report.md"

# Whether run $1 finished its $steps steps here (its log's summary says so).
finished() {
    [[ -f "$out/$1.log" ]] &&
        grep -Eq "result: +(solved|target .* not reached within $steps env steps)" "$out/$1.log"
}
# The committed table's rows, each as "game-variant-seed<TAB>row".
rows_by_run() {
    [[ -f "$table" ]] || return 0
    tail -n +3 "$table" | awk -F'|' '
        { g = $2; v = $3; s = $4; gsub(/ /, "", g); gsub(/ /, "", v); gsub(/ /, "", s)
          print g "-" v "-" s "\t" $0 }'
}
# Whether run $1 (game-variant-seed) has a row in the committed table (finished on an
# earlier machine: not run again unless its directory is here).
committed() {
    rows_by_run | cut -f1 | grep -qxF "$1"
}

declare -A flags=(
    [double]="--target double"
    [munchausen]="--target munchausen"
    [iqn]="--head iqn --target double"
    [m-iqn]="--head iqn --target munchausen"
    [impala]="--network impala --target double"
    [uniform]="--target double"
    [prioritized]="--replay prioritized --target double"
)
for v in "${variants[@]}"; do
    [[ -v "flags[$v]" ]] || { echo "minatar_compare: unknown variant $v (${!flags[*]})" >&2; exit 2; }
done

# The `minatar` preset is the settings (learner/src/presets.rs); MinAtar's tables in
# learner/hyperparams.toml name it, and it is given here too so that a change to a
# table cannot change these runs unseen.
common=(--cpu --preset minatar --eval-every 50000 --eval-episodes 30 --target-return 1000
        --checkpoint-every-s 600 --no-progress)

if [[ "${1:-}" != report ]]; then
    for seed in "${seeds[@]}"; do
        for game in "${games[@]}"; do
            for variant in "${variants[@]}"; do
                name="$game-$variant-$seed"
                if committed "$name" && [[ ! -d "$out/$name" ]]; then
                    echo "minatar_compare: $name is in $table already: skipped" >&2
                    continue
                fi
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
# The MinAtar paper's DQN at 5M frames, read off the MinAtar repository's learning-curve
# figure (kenjyoung/MinAtar, img/learning_curves.gif, 2020: the mean of 30 runs over
# their last 100 episodes), about ±1 (±2 for Freeway and SpaceInvaders); its Seaquest
# is from MinAtar <= 1.0.10, before an oxygen bug was fixed.
declare -A reference=([Asterix]=17 [Breakout]=10 [Freeway]=50 [Seaquest]=20 [SpaceInvaders]=43)
header="| game | variant | seed | env steps | best evaluation (30 episodes) | best/ in Gymnasium (100 episodes) |"
# Whether this invocation reports run $1 afresh: one of its games, variants and seeds,
# finished here.
reported() {
    local g v s
    for g in "${games[@]}"; do
        for v in "${variants[@]}"; do
            for s in "${seeds[@]}"; do
                [[ "$1" == "$g-$v-$s" ]] && finished "$1" && return 0
            done
        done
    done
    return 1
}
# The committed rows this invocation does not report afresh (other games, variants or
# seeds, or runs not under $OUT) are kept; the others are written afresh below.
kept=()
while IFS=$'\t' read -r name row; do
    reported "$name" || kept+=("$row")
done < <(rows_by_run)
{
    echo "$header"
    echo "|---|---|---|---|---|---|"
    [[ ${#kept[@]} -eq 0 ]] || printf '%s\n' "${kept[@]}"
} >"$table"
for game in "${games[@]}"; do
    curves=()
    for variant in "${variants[@]}"; do
        for seed in "${seeds[@]}"; do
            name="$game-$variant-$seed"
            [[ -f "$out/$name.log" ]] || continue
            # Only finished runs are reported: one still running, or cut short with the
            # session, waits for its resumption.
            if ! finished "$name"; then
                echo "minatar_compare: $name has not finished $steps steps: left out" >&2
                continue
            fi
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
    lower="$(echo "$game" | tr '[:upper:]' '[:lower:]')"
    prefix="docs/results/data/${report}_$lower"
    [[ ${#curves[@]} -gt 0 || -f "$prefix.csv" ]] || continue
    python bench/minatar_curve.py --keep "$prefix" "${reference[$game]:-none}" "${curves[@]}"
done
# One order whatever the runs' history: by game, variant, seed.
{
    head -2 "$table"
    tail -n +3 "$table" | sort -t'|' -k2,2 -k3,3 -k4,4n
} >"$table.tmp" && mv "$table.tmp" "$table"
cat "$table"
