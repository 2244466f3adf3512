#!/usr/bin/env bash
# Builds, here, everything the GPU checks (bench/gpu/*.sh) run on a machine with a
# GPU and PyTorch 2.11.0 but no Rust toolchain: the learner, the ceiling, overlap and
# population benchmarks and the lib tests of the device core and the learner (the
# GPU-only ones among them),
# in the CUDA feature set without the Gymnasium bridge (libtorch_cuda linked, no
# libpython: the Rust ports and CatchPixels-v0 only), stripped into one git-ignored
# folder, .gpu/ (or $GPU_BIN).
#
# Fails loudly on any cargo error or missing output. Prints the folder's size (it
# travels with the working tree: 64 MiB in all, so it must stay under 60 MiB), the
# highest glibc symbol version the binaries need (the GPU machine's glibc must be at
# least that) and that none of them needs libpython.
#
# Then one call per script on the GPU machine, from the repository root, with .gpu
# carried, at most 6 minutes each (docs/results/gpu.md lists which have run):
#   bash bench/gpu/overlap-scaling.sh    (or check.sh, runs.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
"$here/../scripts/setup.sh"
out="${GPU_BIN:-.gpu}"
rm -rf "$out"
mkdir -p "$out"
# Everything in the release profile (the benchmarks' own): one build of the
# dependencies serves all three, and the lib tests run optimised there.
features=(-p millrace-learner --no-default-features --features cuda --locked)
messages="$(mktemp)"
trap 'rm -f "$messages"' EXIT
cargo build --release "${features[@]}" --bin learner --message-format=json-render-diagnostics >>"$messages"
cargo bench "${features[@]}" --bench ceiling --bench overlap --bench population --no-run \
    --message-format=json-render-diagnostics >>"$messages"
# The core's lib tests with the learner's: one invocation, so that the features (and
# with them every dependency already built above) are the same.
cargo test --release -p millrace-learner -p millrace-core --no-default-features \
    --features millrace-learner/cuda --locked --lib --no-run \
    --message-format=json-render-diagnostics >>"$messages"
# name<TAB>executable for each binary built.
executables='
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        t = m["target"]
        if t["kind"] == ["lib"]:
            name = t["name"].removeprefix("millrace_") + "-tests"
        else:
            name = t["name"]
        print(name + "\t" + m["executable"])
'
declare -A built=()
while IFS=$'\t' read -r name exe; do
    built[$name]="$exe"
done < <(python3 -c "$executables" "$messages")
for name in learner ceiling overlap population learner-tests core-tests; do
    exe="${built[$name]:-}"
    if [[ -z "$exe" || ! -x "$exe" ]]; then
        echo "gpu_prepare: cargo reported no executable for $name" >&2
        exit 1
    fi
    strip -o "$out/$name" "$exe"
done
echo "gpu_prepare: $out/"
(cd "$out" && du -h -- *) | sed 's/^/  /'
size_kib="$(du -sk "$out" | cut -f1)"
echo "gpu_prepare: $((size_kib / 1024)) MiB in all (the limit here: 60 MiB, so the tree still travels)"
if ((size_kib > 60 * 1024)); then
    echo "gpu_prepare: $out is over 60 MiB: it would not travel with the working tree" >&2
    exit 1
fi
glibc="$(objdump -T "$out"/* | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -1)"
echo "gpu_prepare: the highest glibc symbol version needed: $glibc (this machine: $(ldd --version | head -1 | grep -o '[0-9.]*$'))"
for f in "$out"/*; do
    if readelf -d "$f" | grep -q 'NEEDED.*libpython'; then
        echo "gpu_prepare: $f needs libpython; the GPU machine's python is not ours" >&2
        exit 1
    fi
done
echo "gpu_prepare: none of them needs libpython; libraries needed: $(readelf -d "$out"/* | grep -o 'NEEDED.*\[.*\]' | grep -o '\[.*\]' | sort -u | tr -d '[]' | tr '\n' ' ')"
echo "gpu_prepare: ready; carry $out (run: bash bench/gpu/NAME.sh, timeout 360 s each; docs/results/gpu.md lists them)"
