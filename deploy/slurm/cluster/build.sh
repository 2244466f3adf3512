#!/usr/bin/env bash
# Builds the test cluster's image, millrace/slurm:bookworm (deploy/slurm/cluster), with
# nothing pulled: the learner and actor images first (deploy/build.sh, which also makes
# the Debian base image offline), then Debian's Slurm and munge on that base with the
# two binaries copied in. Docker's cache makes a rebuild seconds when nothing changed.
#
#   deploy/slurm/cluster/build.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/../../build.sh"
start=$SECONDS
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! DOCKER_BUILDKIT=0 docker build -f "$here/slurm.Dockerfile" \
    --build-arg BASE=millrace/base:bookworm -t millrace/slurm:bookworm "$here" >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "build: millrace/slurm:bookworm failed (above)" >&2
    exit 1
fi
bytes="$(docker image inspect -f '{{.Size}}' millrace/slurm:bookworm)"
echo "build: millrace/slurm:bookworm $((bytes / 1000000)) MB, built in $((SECONDS - start)) s" >&2
