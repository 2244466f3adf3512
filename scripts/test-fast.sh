#!/usr/bin/env bash
# The fast tier (docs/development/testing.md): every crate's unit tests and the loopback and
# single-process behaviour tests, in a few minutes once built. No lints, no training
# to solved, no multi-process runs: scripts/test.sh runs those (and this tier too).
# Arguments go to each `cargo test` (e.g. a test name filter).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/env.sh"
cd "$here/.."
cargo test --workspace --lib --locked "$@"
cargo test --locked -p millrace-server --test service "$@"
cargo test --locked -p millrace-learner --test population --test population_prioritized --test cli "$@"
cargo test --locked -p millrace-tests --test data_path "$@"
