# shellcheck shell=bash
# Lays out an image's files in a folder: bin/ (the binary and millrace-health, release
# builds, stripped), lib/ (the libraries the binary loads from the project virtualenv,
# found through its $ORIGIN/../lib rpath) and, for the learner, PyTorch's version.py
# (which `learner doctor` reads beside lib/). Sourced by deploy/build.sh (host-built
# images) and by the build stage of deploy/source.Dockerfile; needs scripts/env.sh
# sourced and the repository root as the working directory.
#
#   stage_learner DIR FEATURES     e.g. stage_learner /stage/learner "" (CPU only)
#   stage_actor DIR FEATURES       e.g. stage_actor /stage/actor gym

millrace_site="$("$MILLRACE_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# cargo_bin PACKAGE BIN FEATURES: builds a release binary, prints its path.
cargo_bin() {
    local pkg="$1" bin="$2" features="$3"
    cargo build --release --locked -p "$pkg" --bin "$bin" --no-default-features \
        ${features:+--features "$features"} --message-format=json-render-diagnostics |
        python3 -c '
import json, sys
exe = [m["executable"] for m in map(json.loads, sys.stdin)
       if m.get("reason") == "compiler-artifact" and m.get("executable")]
print(exe[-1])'
}

# The libraries `exe` loads from the virtualenv (ldd follows every dependency).
venv_libs() {
    ldd "$1" | awk '{print $3}' | grep -F "$millrace_site/" | sort -u
}

# stage_files DIR EXE LIBS...: a fresh DIR with bin/EXE, bin/millrace-health and lib/.
stage_files() {
    local dir="$1" exe="$2" probe
    shift 2
    probe="$(cargo_bin millrace-telemetry millrace-health "")"
    rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
    strip -o "$dir/bin/$(basename "$exe")" "$exe"
    strip -o "$dir/bin/millrace-health" "$probe"
    # Timestamps do not enter Docker's cache key, contents do: unchanged files reuse the
    # cached layers.
    [[ $# -eq 0 ]] || cp -L "$@" "$dir/lib/"
}

stage_learner() {
    local dir="$1" features="$2" exe
    local -a libs
    exe="$(cargo_bin millrace-learner learner "$features")"
    if [[ ",$features," == *,cuda,* ]]; then
        # libtorch_cuda dlopens some of CUDA's libraries (cuDNN's parts, NVRTC's
        # builtins): all of torch/lib and nvidia/*/lib, not only what ldd lists.
        mapfile -t libs < <(find "$millrace_site/torch/lib" "$millrace_site"/nvidia/*/lib \
            -maxdepth 1 -name '*.so*' ! -name 'libtorch_python.so' | sort)
    else
        mapfile -t libs < <(venv_libs "$exe")
        if printf '%s\n' "${libs[@]}" | grep -q libtorch_cuda; then
            echo "stage: the learner links libtorch_cuda without the cuda feature; see learner/build.rs" >&2
            return 1
        fi
    fi
    stage_files "$dir" "$exe" "${libs[@]}"
    cp "$millrace_site/torch/version.py" "$dir/"
}

stage_actor() {
    local dir="$1" features="$2" exe
    exe="$(cargo_bin millrace-actor actor "$features")"
    stage_files "$dir" "$exe"
}
