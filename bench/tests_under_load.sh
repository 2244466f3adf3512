#!/usr/bin/env bash
# The tests that train (to a target, or to a step budget whose learning they check),
# run ROUNDS times (default 3) with a CPU burner beside them: what a newcomer's first
# `scripts/test.sh` on a busy machine meets. Prints one line per round and test binary
# with its result and wall time; exits 1 if any failed. The binaries must be built
# (`cargo build --workspace --bins --tests`; the tests run with the workspace's features, as
# `scripts/test.sh` builds them, so nothing is rebuilt here).
#
#   bench/tests_under_load.sh [ROUNDS]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
rounds="${1:-3}"
burner() { while :; do :; done; }
burner &
burn=$!
trap 'kill $burn 2>/dev/null || true' EXIT
echo "# $(date -u +%FT%TZ), $(nproc) CPUs, one busy-loop burner beside the tests"
failed=0
for round in $(seq 1 "$rounds"); do
    for t in "millrace-tests cluster" "millrace-tests remote_population" "millrace-tests metrics" \
        "millrace-tests population_features" "millrace-learner train" "millrace-learner population_run"; do
        set -- $t
        start=$(date +%s)
        if cargo test -q --locked --workspace --test "$2" >"/tmp/under-load-$round-$2.log" 2>&1; then
            result=passed
        else
            result=FAILED
            failed=1
        fi
        echo "round $round  $2: $result in $(( $(date +%s) - start )) s (log: /tmp/under-load-$round-$2.log)"
    done
done
exit "$failed"
