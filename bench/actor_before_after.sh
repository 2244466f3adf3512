#!/usr/bin/env bash
# The actor step before and after a change, in one sitting: the throughput bench
# (actor/benches/throughput.rs) built at BASE and at the working tree, each row run
# for both in turn, twice (A B A B), so that the VM's drift falls on both alike.
#
# Rows: a whole actor (--mode actor: environments, batched inference, n-step, batches
# handed on) and the forward pass alone (--mode infer), for the three networks the
# learner picks: the MLP (CartPole-v1), the MinAtar CNN (MinAtar Breakout, stepped in
# Python) and the Nature CNN (CatchPixels-v0 in Rust, and Pong through ale-py).
#
# Usage: bench/actor_before_after.sh [BASE rev, default 794abb8] [seconds per row, 5]
#   [envs per actor, 8]. BASE is built in a worktree with its own target directory
#   ($MILLRACE_CACHE/target-base), so the working tree's builds are left alone.
# Output: a table on stdout, JSON lines in docs/results/data/actor-before-after-DATE.jsonl.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/../scripts/setup.sh"
# shellcheck source=scripts/env.sh
source "$here/../scripts/env.sh"
cd "$here/.."
pip install --quiet --disable-pip-version-check -r bench/atari_requirements.txt
base="${1:-794abb8}"
secs="${2:-5}"
envs="${3:-8}"

newest_bench() { ls -t "$1"/release/deps/throughput-* | grep -v '\.d$' | head -1; }

tree="$(mktemp -d)/base"
cleanup() { git worktree remove --force "$tree" 2>/dev/null || true; }
trap cleanup EXIT
git worktree add --detach --quiet "$tree" "$base"
base_target="${MILLRACE_CACHE:-$HOME/.cache/millrace}/target-base"
(cd "$tree" && CARGO_TARGET_DIR="$base_target" \
    cargo bench -p millrace-actor --bench throughput --no-run --locked 2>/dev/null)
before="$(newest_bench "$base_target")"
cargo bench -p millrace-actor --bench throughput --no-run --locked 2>/dev/null
after="$(newest_bench "$CARGO_TARGET_DIR")"

out=docs/results/data/actor-before-after-$(date -u +%Y-%m-%d).jsonl
: > "$out"
stamp="$(date -u +"%Y-%m-%d %H:%M UTC"), $(nproc) CPUs, base $(git rev-parse --short "$base"), head $(git rev-parse --short HEAD)$(git diff --quiet || echo ' + uncommitted')"
echo "# $stamp" | tee -a "$out"
for env in CartPole-v1 gym:MinAtar/Breakout-v1 CatchPixels-v0 PongNoFrameskip-v4; do
    for mode in actor infer; do
        for round in 1 2; do
            for which in before after; do
                bin="$before"; [ "$which" = after ] && bin="$after"
                "$bin" --env "$env" --envs "$envs" --mode "$mode" --seconds "$secs" 2>/dev/null \
                    | tail -1 \
                    | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r["build"]=sys.argv[1]; r["round"]=int(sys.argv[2]); print(json.dumps(r))' "$which" "$round" \
                    | tee -a "$out"
            done
        done
    done
done

python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print()
print("| environment (network) | mode | before | after | after / before |")
print("|---|---|---|---|---|")
net = {"CartPole-v1": "MLP", "gym:MinAtar/Breakout-v1": "MinAtar CNN",
       "CatchPixels-v0": "Nature CNN", "PongNoFrameskip-v4": "Nature CNN"}
seen = []
for r in rows:
    key = (r["env"], r["mode"])
    if key not in seen:
        seen.append(key)
for env, mode in seen:
    def mean(build):
        xs = [r["steps_per_s"] for r in rows if (r["env"], r["mode"], r["build"]) == (env, mode, build)]
        return sum(xs) / len(xs)
    b, a = mean("before"), mean("after")
    print(f"| {env} ({net.get(env, '?')}) | {mode} | {b:,.0f} | {a:,.0f} | {a / b:.2f} |")
PY
