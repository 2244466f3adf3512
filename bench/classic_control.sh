#!/usr/bin/env bash
# Acrobot-v1 and MountainCar-v0, uniform against prioritized replay, several seeds, each
# run to its whole budget (learner/hyperparams.toml's: 100,000 and 120,000 env steps,
# rl-zoo3's) with an unreachable target, so every curve is whole and the policy at the
# budget is what rl-zoo3's published number measures (issue 12; docs/results/learning.md).
#
#   bench/classic_control.sh                       # seeds 0 1 2, both environments
#   SEEDS="0 1 2 3 4" ENVS=Acrobot-v1 bench/classic_control.sh
#   SEEDS="3 4" REPLAYS=table bench/classic_control.sh  # the tables' own settings (issue 28)
#
# REPLAYS: uniform, prioritized, table (no --replay: what learner/hyperparams.toml's
# table gives the environment) or preset-NAME (--preset NAME over the table); default
# "uniform prioritized". Rows of other modes and
# seeds already in the CSV are kept, so confirmation runs add to the runs that chose.
# Per environment: docs/results/data/classic_<env>.csv (mode,seed,env_steps,mean_return: every
# evaluation, 100 greedy episodes every 2,000 steps) and .png (each seed thin, the mean of
# seeds thick, the issue's target dotted, rl-zoo3's DQN dashed), and a table: where each
# run first evaluated at the target, its last and best evaluations, and its best/ and
# latest/ policies exported and replayed in Gymnasium (scripts/play_policy.py, 100
# episodes, seed 1000). MILLRACE_BIN=DIR runs a copy of the learner.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
if [[ -z "${MILLRACE_BIN:-}" ]]; then
    cargo build --release --locked --bin learner >&2
    MILLRACE_BIN="$CARGO_TARGET_DIR/release"
fi
learner="$MILLRACE_BIN/learner"
read -r -a seeds <<<"${SEEDS:-0 1 2}"
read -r -a envs <<<"${ENVS:-Acrobot-v1 MountainCar-v0}"
read -r -a replays <<<"${REPLAYS:-uniform prioritized}"
declare -A target=([Acrobot-v1]=-80 [MountainCar-v0]=-105)
declare -A zoo=([Acrobot-v1]="rl-zoo3 DQN at 100k=-76.6" [MountainCar-v0]="rl-zoo3 DQN at 120k=-100.8")
# The return axis: the region where the target is (the first evaluations sit at -500
# and -200, the floors).
declare -A ylim=([Acrobot-v1]="-200,-60" [MountainCar-v0]="-205,-90")
work="${OUT:-runs/classic_control}"
mkdir -p "$work" docs/results/data

play() { # checkpoint which out -> "mean ± stderr"
    "$learner" export --checkpoint "$1" --which "$2" --out "$3" >/dev/null
    python scripts/play_policy.py "$3" --episodes 100 --seed 1000 | tail -1 |
        python -c 'import json,sys; r=json.load(sys.stdin); print("%.1f ± %.1f" % (r["mean"], r["stderr"]))'
}

for env in "${envs[@]}"; do
    csv="docs/results/data/classic_${env%%-*}.csv"
    csv="${csv,,}"
    [[ -f "$csv" ]] || echo "mode,seed,env_steps,mean_return" >"$csv"
    rows=()
    for seed in "${seeds[@]}"; do
        for replay in "${replays[@]}"; do
            name="$env-$replay-$seed"
            rm -rf "${work:?}/$name"
            echo "$(date -u +%T) $name" >&2
            case "$replay" in
                table) replay_flag=() ;;
                preset-*) replay_flag=(--preset "${replay#preset-}") ;;
                *) replay_flag=(--replay "$replay") ;;
            esac
            RUST_LOG=info "$learner" --cpu --no-progress --env "$env" "${replay_flag[@]}" \
                --seed "$seed" --target-return 1e9 --logdir "$work/$name" \
                >/dev/null 2>"$work/$name.log" || true
            sed -n 's/.*eval: mean return \([-0-9.]*\) ± .* at \([0-9]*\) env steps).*/\2 \1/p' \
                "$work/$name.log" >"$work/$name.evals"
            # This run's evaluations replace any earlier ones of the same mode and seed.
            awk -F, -v m="$replay" -v s="$seed" '!($1 == m && $2 == s)' "$csv" >"$csv.tmp"
            awk -v m="$replay" -v s="$seed" '{print m "," s "," $1 "," $2}' "$work/$name.evals" >>"$csv.tmp"
            mv "$csv.tmp" "$csv"
            # The late-collapse measure (docs/results/learning.md): the share of the
            # evaluations in the 50k steps after the first at the target that stay there.
            held="$(THRESHOLD="${target[$env]}" python bench/stability_summary.py --run "$work/$name.evals" 50000 |
                awk -F' [|] ' '{print $3}')"
            stats="$(awk -v t="${target[$env]}" '
                first == "" && $2 >= t { first = $1 }
                best == "" || $2 > best { best = $2; at = $1 }
                { last = $2 }
                END { printf "%s | %s | %s at %s", (first == "" ? "never" : first), last, best, at }
            ' "$work/$name.evals")"
            best="$(play "$work/$name/checkpoint" best "$work/$name-best.safetensors")"
            latest="$(play "$work/$name/checkpoint" latest "$work/$name-latest.safetensors")"
            rows+=("| $replay | $seed | $stats | $held | $best | $latest |")
        done
    done
    echo
    echo "$env (target ${target[$env]}; ${zoo[$env]%%=*}: ${zoo[$env]##*=})"
    echo
    echo "| replay | seed | first eval ≥ target (env steps) | last eval | best eval (at) | share ≥ target in the next 50k | best/ in Gymnasium | latest/ in Gymnasium |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    python bench/plot_curves.py "$csv" "${csv%.csv}.png" \
        "$env: $(tail -n +2 "$csv" | cut -d, -f1 | sort -u | paste -sd/ -) replay, by seed" \
        --target "${target[$env]}" --reference "${zoo[$env]}" --ylim="${ylim[$env]}"
done
