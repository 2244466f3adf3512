# shellcheck shell=bash
# Sourced by scripts/*.sh: where the PyTorch virtualenv and the cargo target dir live.
# Both stay outside the clone so fresh clones (CI) reuse them; override with
# MILLRACE_VENV / CARGO_TARGET_DIR.
MILLRACE_CACHE="${MILLRACE_CACHE:-$HOME/.cache/millrace}"
export MILLRACE_VENV="${MILLRACE_VENV:-$MILLRACE_CACHE/venv}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$MILLRACE_CACHE/target}"
# torch-sys finds libtorch through the virtualenv's python (tch 0.24.0 <-> torch 2.11.0).
export LIBTORCH_USE_PYTORCH=1
export VIRTUAL_ENV="$MILLRACE_VENV"
export PATH="$MILLRACE_VENV/bin:$PATH"
