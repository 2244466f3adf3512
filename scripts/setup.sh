#!/usr/bin/env bash
# Idempotent set-up: the project virtualenv with PyTorch 2.11.0 (libtorch for tch 0.24.0),
# the Gymnasium bridge's packages (gymnasium, ale-py, minatar)
# and the Python packages the tests and scripts need (scripts/requirements.txt, pinned).
# Quick when already present: it checks every pinned package's installed version and
# installs only when one is missing or different. Run by scripts/train.sh and
# scripts/test.sh.
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

requirements="$here/requirements.txt"
# Prints each pinned requirement that is missing or at another version; nothing when all
# match.
check='
import sys
from importlib.metadata import version, PackageNotFoundError
bad = []
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    try:
        got = version(name).split("+")[0]
    except PackageNotFoundError:
        got = None
    if got != want:
        bad.append(name + "==" + want + " (installed: " + (got or "none") + ")")
print("\n".join(bad))
'
[[ -x "$MILLRACE_VENV/bin/python" ]] || { mkdir -p "$(dirname "$MILLRACE_VENV")"; python3 -m venv "$MILLRACE_VENV"; }
missing="$("$MILLRACE_VENV/bin/python" -c "$check" "$requirements")"
if [[ -n "$missing" ]]; then
    echo "setup: installing into $MILLRACE_VENV (torch is about 5 GB, a few minutes, once):" >&2
    echo "$missing" | sed 's/^/setup:   /' >&2
    "$MILLRACE_VENV/bin/pip" install --quiet --progress-bar off --disable-pip-version-check -r "$requirements"
    missing="$("$MILLRACE_VENV/bin/python" -c "$check" "$requirements")"
    if [[ -n "$missing" ]]; then
        echo "setup: still not as pinned after installing:" >&2
        echo "$missing" | sed 's/^/setup:   /' >&2
        exit 1
    fi
    # What was installed imports, not only installs (a broken wheel is caught here, not
    # in a test). Once, after installing: importing torch takes seconds.
    "$MILLRACE_VENV/bin/python" -c 'import torch, gymnasium, safetensors.torch, numpy, ale_py, minatar' || {
        echo "setup: the Python packages in $MILLRACE_VENV do not import; remove it and rerun" >&2
        exit 1
    }
fi
