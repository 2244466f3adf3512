#!/usr/bin/env bash
# The main job (README): set-up, release build, then `learner` with any flags given
# (default: train CartPole-v1 to its target in one process).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/setup.sh"
# shellcheck source=scripts/env.sh
source "$here/env.sh"
cd "$here/.."
cargo build --release --locked --bin learner
exec "$CARGO_TARGET_DIR/release/learner" "$@"
