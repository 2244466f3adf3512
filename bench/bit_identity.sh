#!/usr/bin/env bash
# Bit-identity of two learner binaries (e.g. the commit before a refactor and after):
# the same lock-step runs with each, then every saved parameter, optimizer and replay
# file compared byte for byte. Lock-step runs (--deterministic, and every population)
# give bit-identical files for the same binary, seed and flags on one machine, so any
# difference is the code's.
#
#   bench/bit_identity.sh OLD_LEARNER NEW_LEARNER [WORKDIR]
#
# Exits 0 when every file matches, 1 otherwise (the differing files are listed).
set -euo pipefail
old="$1"
new="$2"
work="${3:-$(mktemp -d)}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"

# name|flags (all on CartPole-v1, the CPU, out of steps before solving)
runs=(
    "single|--deterministic --seed 3 --max-steps 20000"
    "single-prioritized-lr-decay|--deterministic --seed 4 --max-steps 20000 --replay prioritized --lr-final 1e-4"
    "single-dueling|--deterministic --seed 5 --max-steps 15000 --dueling"
    "population|--population 3 --seed 1 --max-steps 15000 --population-threads 1"
    "population-queued|--population 3 --seed 2 --max-steps 12000 --population-threads 1 --max-concurrent-agents 2"
)

status=0
for run in "${runs[@]}"; do
    name="${run%%|*}"
    flags="${run#*|}"
    for which in old new; do
        bin="$old"
        [[ "$which" == new ]] && bin="$new"
        dir="$work/$which/$name"
        rm -rf "$dir"
        mkdir -p "$(dirname "$dir")"
        # shellcheck disable=SC2086
        "$bin" --env CartPole-v1 --cpu $flags --target-return 1000 --no-progress \
            --logdir "$dir" >"$dir.log" 2>&1 || true
    done
    # Saved networks, optimizer state, policies and replay (not logs, configs or
    # TensorBoard files, which hold times).
    list() {
        (cd "$1" && find . -type f \( -name '*.safetensors' -o -name '*.bin' \) | sort)
    }
    files="$(list "$work/old/$name")"
    if [[ -z "$files" ]]; then
        echo "$name: the old binary saved nothing (see $work/old/$name.log)" >&2
        status=1
        continue
    fi
    if [[ "$files" != "$(list "$work/new/$name")" ]]; then
        echo "$name: DIFFERENT set of files" >&2
        diff <(echo "$files") <(list "$work/new/$name") >&2 || true
        status=1
        continue
    fi
    same=0
    differ=0
    while read -r f; do
        if cmp -s "$work/old/$name/$f" "$work/new/$name/$f"; then
            same=$((same + 1))
        else
            echo "$name: $f differs" >&2
            differ=$((differ + 1))
        fi
    done <<<"$files"
    # A population's results table, but for its wall times: each agent's end, steps
    # and its final and best evaluations (the final one plays its last parameters), in
    # the columns both binaries write (a column one of them adds is named, not compared).
    if [[ -f "$work/old/$name/population.csv" ]]; then
        if python3 - "$work/old/$name/population.csv" "$work/new/$name/population.csv" <<'PY'
import csv, sys
old, new = (list(csv.DictReader(open(p))) for p in sys.argv[1:3])
keys = [k for k in old[0] if k in new[0] and k != "wall_s"]
for only, rows in (("old", old), ("new", new)):
    extra = [k for k in rows[0] if k not in keys and k != "wall_s"]
    if extra:
        print(f"  columns only the {only} binary writes: {', '.join(extra)}", file=sys.stderr)
sys.exit(0 if [[r[k] for k in keys] for r in old] == [[r[k] for k in keys] for r in new] else 1)
PY
        then
            same=$((same + 1))
        else
            echo "$name: population.csv differs" >&2
            differ=$((differ + 1))
        fi
    fi
    echo "$name: $same file(s) identical, $differ different"
    [[ "$differ" == 0 ]] || status=1
done
exit "$status"
