#!/usr/bin/env bash
# Training throughput of the compose cluster with 1, 2 and 4 actor containers against
# the embedded mode (one learner container with as many actor threads), side by side
# in one sitting on this machine, CartPole-v1 with millrace's defaults (8 envs per
# actor). No evaluation and no target within the window: each configuration trains for
# --warmup seconds, then env steps and updates are read from the learner's /metrics at
# the start and end of --window seconds. Prints one line per configuration and a
# Markdown table.
#
#   bench/cluster_throughput.sh [--warmup 15] [--window 30] [N...]   (default N: 1 2 4)
#
# Needs the images (deploy/build.sh) and a running Docker daemon.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
deploy="$here/../deploy"
warmup=15 window=30 ns=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --warmup) warmup="$2"; shift 2 ;;
        --window) window="$2"; shift 2 ;;
        *) ns+=("$1"); shift ;;
    esac
done
[[ ${#ns[@]} -gt 0 ]] || ns=(1 2 4)
port=19100
project="millrace-bench-$$"
tmp="$(mktemp -d)"
echo "bench-token-$$" >"$tmp/token"
compose() {
    MILLRACE_TOKEN_FILE="$tmp/token" MILLRACE_METRICS_PORT=$port MILLRACE_RUN=bench \
        MILLRACE_LEARNER_ARGS="--eval-every 100000000 --max-steps 100000000" \
        docker-compose -p "$project" -f "$deploy/docker-compose.yml" "$@"
}
cleanup() {
    compose down -v --timeout 5 >/dev/null 2>&1 || true
    docker rm -fv "$project-embedded" >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# sample NAME: the learner's unlabelled sample NAME.
sample() {
    curl -fsS "http://127.0.0.1:$port/metrics" | awk -v n="$1" '$1 == n {print $2}'
}
wait_ready() {
    for _ in $(seq 240); do
        [[ "$(sample millrace_updates_total 2>/dev/null || true)" =~ ^[1-9] ]] && return 0
        sleep 0.5
    done
    echo "bench: the learner did not start training" >&2
    return 1
}
# measure LABEL: steps/s and updates/s over the window.
measure() {
    sleep "$warmup"
    local s0 u0 s1 u1
    s0="$(sample millrace_env_steps_total)" u0="$(sample millrace_updates_total)"
    sleep "$window"
    s1="$(sample millrace_env_steps_total)" u1="$(sample millrace_updates_total)"
    local line
    line="$(awk -v l="$1" -v s0="$s0" -v s1="$s1" -v u0="$u0" -v u1="$u1" -v w="$window" \
        'BEGIN {printf "| %s | %.0f | %.0f |", l, (s1 - s0) / w, (u1 - u0) / w}')"
    echo "$line" >&2
    rows+=("$line")
}

rows=()
for n in "${ns[@]}"; do
    docker run -d --name "$project-embedded" --init -p "127.0.0.1:$port:9100" \
        millrace/learner:cpu --env CartPole-v1 --actors "$n" --logdir /runs/bench \
        --metrics-addr 0.0.0.0:9100 --no-progress --eval-every 100000000 \
        --max-steps 100000000 >/dev/null
    wait_ready
    measure "embedded, $n actor thread(s)"
    docker rm -fv "$project-embedded" >/dev/null
    compose up -d --scale "actor=$n" >/dev/null 2>&1
    wait_ready
    measure "cluster, $n actor container(s)"
    compose down -v --timeout 5 >/dev/null 2>&1
done
echo
echo "| configuration | env steps/s | updates/s |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
