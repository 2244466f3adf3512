#!/usr/bin/env bash
# The test command (README; .ci/run calls exactly this): set-up, lints, the docs, all tests.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/setup.sh"
# shellcheck source=scripts/env.sh
source "$here/env.sh"
cd "$here/.."
cargo fmt --all --check
# The documentation: the mdBook site builds, and no link in it or in the top-level
# Markdown is broken (the flag, metric and protocol references are checked against the
# code by tests/tests/reference.rs, tests/tests/metrics.rs and proto's wire tests).
"$here/docs.sh"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The multi-process tests run the learner and actor binaries.
cargo build --workspace --bins --locked
cargo test --workspace --locked "$@"
# The actor without the Gymnasium bridge (`--no-default-features`: no Python linked) in
# its own target dir, so the binaries above stay the default build.
no_gym=(env CARGO_TARGET_DIR="$CARGO_TARGET_DIR/no-gym")
"${no_gym[@]}" cargo clippy -p millrace-actor --all-targets --no-default-features --locked -- -D warnings
"${no_gym[@]}" cargo test -p millrace-actor --no-default-features --locked "$@"
# The server takes its shared names from proto, not from the actor crate.
if cargo tree -p millrace-server -e normal --locked | grep -q 'millrace-actor'; then
    echo "millrace-server depends on millrace-actor:" >&2
    cargo tree -p millrace-server -e normal -i millrace-actor >&2
    exit 1
fi
# The network service without libtorch: no tch or torch-sys in its graph (tests and
# benches included), and its tests built and run in the no-gym target dir, where
# nothing else links libtorch.
if cargo tree -p millrace-server -e normal,build,dev --locked | grep -q 'torch'; then
    echo "millrace-server depends on libtorch:" >&2
    cargo tree -p millrace-server -e normal,build,dev -i torch-sys >&2
    exit 1
fi
"${no_gym[@]}" cargo test -p millrace-server --locked "$@"
# The GPU checks' rehearsal: the CUDA-feature build they carry (bench/gpu_prepare.sh:
# the learner, the benchmarks and the lib tests, stripped into .gpu/) and every script
# a lent GPU machine runs (bench/gpu/, one call each), here on the CPU with every step
# shortened (CPU_DRY=1), so none rots between the days a device is lent.
bench/gpu_prepare.sh
for check in bench/gpu/*.sh; do
    [[ "$check" == bench/gpu/lib.sh ]] || CPU_DRY=1 bash "$check"
done
# The local cluster (deploy/): where Docker runs, the images are built (deploy/build.sh;
# Docker's cache makes this seconds after the first time) and the cluster is brought up
# and put through its paces; elsewhere the test is reported as skipped, not passed.
if command -v docker-compose >/dev/null 2>&1; then
    cargo test -p millrace-tests --test deploy_manifests --locked -- --ignored
else
    echo "SKIPPED (not passed): the compose file against the binaries (tests/tests/deploy_manifests.rs): no docker-compose here" >&2
fi
# The Slurm cluster in Docker (deploy/slurm/cluster): its image on top of those, then
# deploy/slurm's scripts through sbatch on a controller and three nodes.
if docker info >/dev/null 2>&1 && command -v docker-compose >/dev/null 2>&1; then
    deploy/build.sh
    cargo test -p millrace-tests --test compose_cluster --locked -- --ignored --nocapture
    deploy/slurm/cluster/build.sh
    cargo test -p millrace-tests --test slurm_cluster --locked -- --ignored --nocapture
else
    echo "SKIPPED (not passed): tests/tests/compose_cluster.rs, the docker-compose cluster: no Docker daemon or no docker-compose here" >&2
    echo "SKIPPED (not passed): tests/tests/slurm_cluster.rs, the Slurm cluster in Docker: no Docker daemon or no docker-compose here" >&2
fi
