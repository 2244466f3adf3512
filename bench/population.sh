#!/usr/bin/env bash
# One stacked update for K agents, side by side in one sitting: millrace's
# (learner/benches/population.rs) and PyTorch's torch.func vmap over stacked modules
# (bench/population_vmap.py, and its Python loop over K modules), the same MLP
# (4-64-64-2), batch 32, one thread; then millrace's Nature CNN population.
#
# Usage: bench/population.sh [seconds per point, default 2]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/../scripts/setup.sh"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
s="${1:-2}"
cargo bench --locked -p millrace-learner --bench population --no-run
echo "== millrace, MLP"
cargo bench --locked -q -p millrace-learner --bench population -- --cpu --seconds "$s" \
    --k 1,8,32,64,256,1024
echo "== PyTorch torch.func (vmap) and a Python loop, MLP"
python bench/population_vmap.py --k 1,8,32,64,256,1024 --seconds "$s" --loop
echo "== millrace, Nature CNN"
cargo bench --locked -q -p millrace-learner --bench population -- --cpu --net cnn \
    --seconds "$s" --k 1,2,4,8
