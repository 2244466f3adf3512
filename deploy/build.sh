#!/usr/bin/env bash
# Builds the cluster's images from binaries built here, without pulling anything:
#
#   deploy/build.sh [--cuda] [--gym] [--base IMAGE]
#
#   millrace/learner:cpu   the learner for the Rust environments, CPU only: libtorch's
#                          CPU libraries, no libtorch_cuda, no CUDA maths libraries
#   millrace/actor:native  the actor for the Rust environments: no libtorch, no Python
#   --cuda   also millrace/learner:cuda   (libtorch_cuda and CUDA's libraries, ~4 GB)
#   --gym    also millrace/learner:gym, millrace/actor:gym: the Gymnasium bridge, with
#            Python and the environment packages (Gymnasium, ale-py, MinAtar) installed
#            by pip in a build stage (millrace/python:bookworm)
#   both     also millrace/learner:gym-cuda (the bridge on a GPU)
#
# Every image also carries millrace-health, its health probe (no libtorch, no Python).
#
# Steps: the base image (deploy/base-image.sh makes millrace/base:bookworm when it is
# missing and no --base is given); each image's files staged under
# $CARGO_TARGET_DIR/deploy/ by deploy/stage.sh (release binaries, stripped, in bin/; the
# libraries they load from the project virtualenv in lib/, found through their
# $ORIGIN/../lib rpath); `docker build` with the classic builder. Images whose context
# did not change are rebuilt from Docker's cache in seconds. To build inside Docker
# instead (no Rust or Python on the host), see deploy/source.Dockerfile.
#
# Where this host trusts extra CA certificates (/usr/local/share/ca-certificates, e.g.
# a TLS-intercepting proxy), the pip stage trusts them too: they are copied into its
# build context here, at build time, and never into the repository or a final image.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$here/.."
cuda=0 gym=0 base=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cuda) cuda=1 ;;
        --gym) gym=1 ;;
        --base) [[ $# -ge 2 ]] || { echo "build: --base needs an image" >&2; exit 2; }
                base="$2"; shift ;;
        -h|--help) sed -n '2,/^set -euo/{/^#/p}' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "build: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

"$root/scripts/setup.sh"
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
cd "$root"
if [[ -z "$base" ]]; then
    base=millrace/base:bookworm
    "$here/base-image.sh" "$base"
fi
stage="$CARGO_TARGET_DIR/deploy"
# shellcheck source=deploy/stage.sh
source "$here/stage.sh"
export DOCKER_BUILDKIT=0  # the classic builder: no buildx plugin needed

# docker_build TAG DOCKERFILE CONTEXT BASE [TARGET]
docker_build() {
    local tag="$1" dockerfile="$2" ctx="$3" from="$4" target="${5:-}"
    local start=$SECONDS log="$stage/docker-build.log"
    # The classic builder warns that it is deprecated on every build: its output is
    # shown only when the build fails.
    if ! docker build -f "$dockerfile" ${target:+--target "$target"} --build-arg "BASE=$from" \
        -t "$tag" "$ctx" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "build: $tag failed (above)" >&2
        exit 1
    fi
    local bytes
    bytes="$(docker image inspect -f '{{.Size}}' "$tag")"
    echo "build: $tag $((bytes / 1000000)) MB, built in $((SECONDS - start)) s" >&2
}

if [[ $gym -eq 1 ]]; then
    py="$stage/python"
    rm -rf "$py" && mkdir -p "$py/certs"
    # The environment packages at the versions the project pins (scripts/requirements.txt).
    grep -E "^(gymnasium|numpy|ale-py|minatar)==" "$root/scripts/requirements.txt" >"$py/requirements-gym.txt"
    # The host's extra CAs (update-ca-certificates reads *.crt, subfolders included),
    # for the pip stage only; removed from the context again once it is built.
    find /usr/local/share/ca-certificates -name '*.crt' -type f -exec cp {} "$py/certs/" \; 2>/dev/null || true
    docker_build millrace/python:bookworm "$here/python.Dockerfile" "$py" "$base" runtime
    rm -rf "$py/certs"
fi

# learner_image TAG FEATURES FROM: the learner built with FEATURES (deploy/stage.sh), on
# FROM.
learner_image() {
    local tag="$1" features="$2" from="$3" dir="$stage/learner-${1#*:}"
    stage_learner "$dir" "$features"
    docker_build "$tag" "$here/learner.Dockerfile" "$dir" "$from"
}

# actor_image TAG FEATURES FROM: the actor built with FEATURES, on FROM.
actor_image() {
    local tag="$1" features="$2" from="$3" dir="$stage/actor-${1#*:}"
    stage_actor "$dir" "$features"
    docker_build "$tag" "$here/actor.Dockerfile" "$dir" "$from"
}

learner_image millrace/learner:cpu "" "$base"
actor_image millrace/actor:native "" "$base"
if [[ $cuda -eq 1 ]]; then
    learner_image millrace/learner:cuda cuda "$base"
fi
if [[ $gym -eq 1 ]]; then
    learner_image millrace/learner:gym gym millrace/python:bookworm
    actor_image millrace/actor:gym gym millrace/python:bookworm
fi
if [[ $gym -eq 1 && $cuda -eq 1 ]]; then
    learner_image millrace/learner:gym-cuda gym,cuda millrace/python:bookworm
fi
