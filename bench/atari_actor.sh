#!/usr/bin/env bash
# Actor throughput on Atari (Pong) and MinAtar, one sitting, side by side:
#   1. one process, one actor, --envs N: millrace's environments alone (ale-py's C++
#      vectorised interface through the bridge) and millrace's whole actor (batched
#      Nature-CNN inference in Rust, n-step, batches), beside ale-py's own vectorised
#      env driven from Python and a plain Gymnasium AtariPreprocessing +
#      FrameStackObservation loop, each alone and with PyTorch CPU inference;
#   2. scaling: environments per actor, and two actors as two threads of one process
#      (sharing one Python interpreter and its lock) or as two processes.
# Usage: bench/atari_actor.sh [seconds per row, default 10]. Results: a table on stdout
# and JSON lines in docs/results/data/atari_actor.jsonl.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/../scripts/setup.sh"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
pip install --quiet --disable-pip-version-check -r bench/atari_requirements.txt
secs="${1:-10}"
cargo bench -p millrace-actor --bench throughput --no-run --locked 2>/dev/null
bench="$(ls -t "$CARGO_TARGET_DIR"/release/deps/throughput-* | grep -v '\.d$' | head -1)"
out=docs/results/data/atari_actor.jsonl
: > "$out"
row() { "$@" --seconds "$secs" 2>/dev/null | tail -1 | tee -a "$out"; }
# Several processes at once; prints their summed steps/s as one JSON line.
together() {
    local label="$1"; shift
    local tmp; tmp="$(mktemp -d)"
    local i=0
    for cmd in "$@"; do
        # shellcheck disable=SC2086
        $cmd --seconds "$secs" > "$tmp/$i" 2>/dev/null &
        i=$((i + 1))
    done
    wait
    python3 - "$label" "$tmp" <<'PY' | tee -a "$out"
import json, os, sys
label, tmp = sys.argv[1], sys.argv[2]
rows = [json.loads(open(os.path.join(tmp, f)).read().strip().splitlines()[-1]) for f in sorted(os.listdir(tmp))]
r = dict(rows[0]); r["processes"] = len(rows); r["label"] = label
r["steps_per_s"] = round(sum(x["steps_per_s"] for x in rows), 1)
print(json.dumps(r))
PY
    rm -rf "$tmp"
}

date -u +"# %Y-%m-%d %H:%M UTC, $(nproc) CPUs" | tee -a "$out"
for n in 8 64; do
    row "$bench" --env PongNoFrameskip-v4 --envs "$n" --mode env
    row "$bench" --env PongNoFrameskip-v4 --envs "$n" --mode actor
    row python bench/atari_python.py --impl ale-vector --envs "$n"
    row python bench/atari_python.py --impl ale-vector --envs "$n" --infer
    row python bench/atari_python.py --impl gymnasium --envs "$n"
    row python bench/atari_python.py --impl gymnasium --envs "$n" --infer
done
row "$bench" --env PongNoFrameskip-v4 --envs 1 --mode actor
for env in PongNoFrameskip-v4 gym:MinAtar/Breakout-v1; do
    row "$bench" --env "$env" --envs 8 --mode actor
    row "$bench" --env "$env" --envs 8 --mode actor --threads 2
    together "2 processes" "$bench --env $env --envs 8 --mode actor" "$bench --env $env --envs 8 --mode actor"
done
python3 bench/summarize_actor.py "$out"
