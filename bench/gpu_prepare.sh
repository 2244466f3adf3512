#!/usr/bin/env bash
# Builds the benchmarks, the learner binary and the learner's unit tests, and copies
# them, stripped, into .gpu/ (ignored by git) for a machine with a GPU and PyTorch
# 2.11.0 but no Rust toolchain. There, point LD_LIBRARY_PATH at that PyTorch's torch/lib
# and run, e.g.:
#
#   TL=$(python -c 'import torch, os; print(os.path.dirname(torch.__file__))')/lib
#   LD_LIBRARY_PATH=$TL .gpu/learner doctor                     # the set-up, checked
#   LD_LIBRARY_PATH=$TL .gpu/learner-tests --include-ignored     # every unit test, the
#                                                 # GPU-only ones (#[ignore] here) included
#   LD_LIBRARY_PATH=$TL .gpu/overlap --seconds 6 --actors 64 [--copy-stream]
#   LD_LIBRARY_PATH=$TL .gpu/overlap --seconds 6 --only cnn --checkpoint-every 2
#   LD_LIBRARY_PATH=$TL .gpu/ceiling --hidden 64,64 --batch 32,512
#   LD_LIBRARY_PATH=$TL .gpu/ceiling --net nature --batch 32,512 --precision fp32,bf16,fp32,bf16
#   LD_LIBRARY_PATH=$TL .gpu/learner --logdir /tmp/run [--copy-stream]
#   LD_LIBRARY_PATH=$TL .gpu/population --k 1,8,64,256,1024 --seconds 2   # stacked updates
#   LD_LIBRARY_PATH=$TL .gpu/population --net cnn --k 1,8,32,64 --seconds 2
#   LD_LIBRARY_PATH=$TL .gpu/learner --population 64 --hidden 64,64 --batch-size 32 \
#       --gpu 0 --logdir /tmp/pop                                # wall time to targets
#
# The binaries' rpath points at this machine's virtualenv; LD_LIBRARY_PATH overrides it.
# They are built without the Gymnasium bridge (--no-default-features --features cuda:
# libtorch_cuda linked, no libpython needed there; the Rust ports and CatchPixels-v0
# only).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
"$here/../scripts/setup.sh" >/dev/null
mkdir -p .gpu
executables='
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        lib_tests = m["target"]["kind"] == ["lib"]
        print("learner-tests" if lib_tests else m["target"]["name"], m["executable"])
'
{
  cargo bench -p millrace-learner --no-default-features --features cuda --bench overlap --bench ceiling --bench population --no-run --message-format=json
  cargo build --release -p millrace-learner --no-default-features --features cuda --bin learner --message-format=json
  cargo test -p millrace-learner --no-default-features --features cuda --lib --no-run --message-format=json
} 2>/dev/null | python3 -c "$executables" | sort -u -k1,1 | while read -r name exe; do
  strip -o ".gpu/$name" "$exe"
  echo ".gpu/$name ($(du -h ".gpu/$name" | cut -f1))"
done
