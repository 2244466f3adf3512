#!/usr/bin/env bash
# Prioritized replay against uniform in the learner, side by side in one sitting:
#
#   bench/priorities.sh [rounds] [seeds...]      (default: 3 rounds; seeds 0 1 2 3 4)
#
# 1. Updates per second: CartPole-v1 for 30,000 env steps with an unreachable target
#    and no evaluation, so every run does the same work: uniform, prioritized (priority
#    updates on, the prefetch ring bounded to 8 batches), and prioritized with a
#    256-batch ring. The kinds alternate, `rounds` times.
# 2. Time to solve, per seed (the default rule: 100 greedy episodes every 2,000 steps,
#    confirmed on fresh ones), for the same three kinds: what the ring's bound buys.
#
# Prints a Markdown table for each.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rounds="${1:-3}"
shift || true
seeds=("${@:-0 1 2 3 4}")
# shellcheck disable=SC2206
seeds=(${seeds[*]})
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
(cd "$here/.." && cargo build --release --locked --bin learner >&2)
learner="$CARGO_TARGET_DIR/release/learner"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
declare -A flags=(
    [uniform]="--replay uniform"
    [prioritized]="--replay prioritized"
    [prioritized-256]="--replay prioritized --prefetch-depth 256"
)
kinds=(uniform prioritized prioritized-256)

field() { sed -n "s/^  $1: *\([0-9.]*\).*/\1/p"; }
rate() { sed -n 's/^  updates: .*(\([0-9.]*\)\/s over.*/\1/p'; }

echo "## updates/s, 30,000 env steps, $rounds rounds" >&2
for ((r = 0; r < rounds; r++)); do
    # Rotate the order each round.
    for ((k = 0; k < ${#kinds[@]}; k++)); do
        kind="${kinds[$(((k + r) % ${#kinds[@]}))]}"
        # shellcheck disable=SC2086
        summary="$("$learner" --cpu --no-progress ${flags[$kind]} --max-steps 30000 \
            --target-return 1000 --eval-every 1000000 --logdir "$out/rate-$kind-$r" 2>/dev/null)" || true
        echo "$kind $(rate <<<"$summary")" >>"$out/rates"
        echo "  round $r $kind: $(rate <<<"$summary") updates/s" >&2
    done
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
u="$(awk '$1=="uniform"{print $2}' "$out/rates" | median)"
echo
echo "| replay | updates/s (median of $rounds) | vs uniform |"
echo "|---|---|---|"
for kind in "${kinds[@]}"; do
    m="$(awk -v k="$kind" '$1==k{print $2}' "$out/rates" | median)"
    echo "| $kind | $m | $(awk -v a="$m" -v b="$u" 'BEGIN{printf "%.2f", a/b}') |"
done

echo "## time to solve, seeds ${seeds[*]}" >&2
echo
echo "| replay | seed | solved at (env steps) | updates | wall s | priorities: updated / stale |"
echo "|---|---|---|---|---|---|"
for seed in "${seeds[@]}"; do
    for kind in "${kinds[@]}"; do
        # shellcheck disable=SC2086
        summary="$("$learner" --cpu --no-progress ${flags[$kind]} --seed "$seed" \
            --max-steps 100000 --logdir "$out/solve-$kind-$seed" 2>/dev/null)" || true
        steps="$(sed -n 's/.*solved at \([0-9]*\) env steps.*/\1/p' <<<"$summary")"
        prio="$(sed -n 's/^  priorities: *\([0-9]*\) updated by TD error, \([0-9]*\) stale.*/\1 \/ \2/p' <<<"$summary")"
        echo "| $kind | $seed | ${steps:-not solved} | $(field updates <<<"$summary") | $(field "wall time" <<<"$summary") | ${prio:-—} |"
    done
done
