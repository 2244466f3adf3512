#!/usr/bin/env bash
# Idempotent set-up: the project virtualenv with PyTorch 2.11.0 (libtorch for tch 0.24.0).
# Quick when already present. Run by scripts/train.sh and scripts/test.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/env.sh"

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found; install Rust (https://rustup.rs) first" >&2
    exit 1
fi
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "setup: installing python3 and python3-venv with apt-get" >&2
    apt-get update -qq && apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
fi

installed="$("$MILLRACE_VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
if [[ "$installed" != "$TORCH_VERSION" ]]; then
    echo "setup: installing torch==$TORCH_VERSION into $MILLRACE_VENV (about 5 GB, a few minutes, once)" >&2
    mkdir -p "$(dirname "$MILLRACE_VENV")"
    [[ -x "$MILLRACE_VENV/bin/python" ]] || python3 -m venv "$MILLRACE_VENV"
    "$MILLRACE_VENV/bin/pip" install --quiet --progress-bar off --disable-pip-version-check "torch==$TORCH_VERSION"
fi
