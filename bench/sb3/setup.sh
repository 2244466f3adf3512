#!/usr/bin/env bash
# Creates the SB3 benchmark virtualenv next to the project one, sharing its torch 2.11.0
# (a .pth file adds the project venv's site-packages) so nothing is downloaded twice.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/../../scripts/env.sh"
"$here/../../scripts/setup.sh"
SB3_VENV="${SB3_VENV:-$MILLRACE_CACHE/sb3-venv}"
if ! "$SB3_VENV/bin/python" -c 'import stable_baselines3, rl_zoo3, tensorboard' >/dev/null 2>&1; then
    python3 -m venv "$SB3_VENV"
    torch_site="$("$MILLRACE_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    sb3_site="$("$SB3_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$torch_site" > "$sb3_site/millrace-torch.pth"
    "$SB3_VENV/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
fi
echo "$SB3_VENV"
