#!/usr/bin/env bash
# Wall time for K CartPole agents to reach their targets, side by side in one sitting:
# (1) one `learner --population K` process; (2) K separate `learner` processes, two at
# a time (this machine's core count; `--jobs N` to change); (3) optionally K separate
# SB3 DQN processes (rl-zoo3's CartPole settings, bench/sb3/time_to_solve.py), two at a
# time. MLP 64x64, batch 32 (`--hidden 64,64 --batch-size 32`), millrace's CartPole
# defaults otherwise. Each agent or process gets its own seed; the same rule everywhere: every 2,000
# env steps, 100 greedy episodes; solved at a mean of 475 (millrace: confirmed on fresh
# episodes). Prints one line per run and a Markdown table.
#
#   bench/population_wall.sh [--jobs 2] [--sb3] K...       (default K: 1 8 32 64)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
jobs=2
sb3=0
ks=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --jobs) jobs="$2"; shift 2 ;;
        --sb3) sb3=1; shift ;;
        *) ks+=("$1"); shift ;;
    esac
done
[[ ${#ks[@]} -gt 0 ]] || ks=(1 8 32 64)
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
"$here/../scripts/setup.sh"
(cd "$here/.." && cargo build --release --locked --bin learner >&2)
learner="$CARGO_TARGET_DIR/release/learner"
[[ $sb3 -eq 1 ]] && sb3_venv="$("$here/sb3/setup.sh" | tail -1)"
out="$(mktemp -d)"
now() { date +%s.%N; }
table="| K | one population process: wall s | solved | K learner processes ($jobs at a time): wall s | solved |"
[[ $sb3 -eq 1 ]] && table+=" K SB3 processes ($jobs at a time): wall s | solved |"
table+=$'\n'"|---|---|---|---|---|"
[[ $sb3 -eq 1 ]] && table+="---|---|"
for k in "${ks[@]}"; do
    t0=$(now)
    "$learner" --no-progress --env CartPole-v1 --cpu --population "$k" --seed 1 \
        --hidden 64,64 --batch-size 32 --max-steps 100000 --logdir "$out/pop-$k" \
        > "$out/pop-$k.txt" 2>/dev/null || true
    sed -n '1,2p' "$out/pop-$k.txt" >&2
    t1=$(now)
    pop_s=$(echo "$t1 - $t0" | bc)
    pop_solved=$(grep -c ',solved,' "$out/pop-$k/population.csv" || true)
    echo "population K=$k: ${pop_s} s, $pop_solved/$k solved" >&2
    t0=$(now)
    seq 1 "$k" | xargs -P "$jobs" -I{} sh -c \
        "'$learner' --no-progress --env CartPole-v1 --cpu --seed {} --hidden 64,64 \
         --batch-size 32 --max-steps 100000 --logdir '$out/proc-$k-{}' >/dev/null 2>&1; \
         echo \$? > '$out/proc-$k-{}.status'"
    t1=$(now)
    proc_s=$(echo "$t1 - $t0" | bc)
    proc_solved=$(cat "$out"/proc-"$k"-*.status | grep -c '^0$' || true)
    echo "processes K=$k: ${proc_s} s, $proc_solved/$k solved" >&2
    row="| $k | $(printf %.1f "$pop_s") | $pop_solved/$k | $(printf %.1f "$proc_s") | $proc_solved/$k |"
    if [[ $sb3 -eq 1 ]]; then
        t0=$(now)
        seq 1 "$k" | xargs -P "$jobs" -I{} sh -c \
            "'$sb3_venv/bin/python' '$here/sb3/time_to_solve.py' --seeds {} --max-steps 100000 \
             > '$out/sb3-$k-{}.json' 2>/dev/null || true"
        t1=$(now)
        sb3_s=$(echo "$t1 - $t0" | bc)
        sb3_solved=$(cat "$out"/sb3-"$k"-*.json | grep -c '"solved": true' || true)
        echo "SB3 K=$k: ${sb3_s} s, $sb3_solved/$k solved" >&2
        row+=" $(printf %.1f "$sb3_s") | $sb3_solved/$k |"
    fi
    table+=$'\n'"$row"
done
echo "$table"
