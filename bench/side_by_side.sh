#!/usr/bin/env bash
# Two builds of the learner's benchmarks in one sitting, alternated (old, new, old,
# new) so that the VM's drift hits both: the ceiling, the overlap (the learner thread
# of a real run against its ceiling) and a population's stacked update.
#
#   bench/side_by_side.sh OLD_DIR NEW_DIR
#
# Each DIR holds the `ceiling`, `overlap` and `population` bench executables, e.g.
# from `cargo bench -p millrace-learner --no-default-features --features cuda --bench
# ceiling --bench overlap --bench population --no-run` at each commit (the paths cargo
# prints), copied into the folder. Prints every run's output, labelled.
set -uo pipefail
old="$1"
new="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
run() {
    local label="$1" dir="$2"
    shift 2
    echo "== $label: $*"
    "$dir/$@" 2>&1 | grep -v '^\s*$'
}
for round in 1 2; do
    for side in old new; do
        dir="$old"
        [[ "$side" == new ]] && dir="$new"
        run "$side $round" "$dir" ceiling --cpu --hidden 64,64 --batch 32,512 --seconds 3
        run "$side $round" "$dir" population --cpu --seconds 2 --k 1,8,64
        run "$side $round" "$dir" overlap --cpu --only mlp --seconds 4
    done
done
