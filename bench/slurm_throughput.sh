#!/usr/bin/env bash
# The Slurm service job's training throughput against the compose cluster's, side by
# side in one sitting on this machine: CartPole-v1 with millrace's defaults, the
# learner and 2 actors (8 envs each) in both; no evaluation and no target within the
# window. The Slurm cluster is deploy/slurm/cluster (a controller and three nodes in
# Docker: deploy/slurm/service.sbatch puts the learner on one node and an actor on each
# of the two others); the compose cluster is deploy/docker-compose.yml with 2 actor
# replicas. Each trains for --warmup seconds, then env steps and updates are read from
# the learner's /metrics at the start and end of --window seconds. Prints a Markdown
# table.
#
#   bench/slurm_throughput.sh [--warmup 20] [--window 30]
#
# Needs a running Docker daemon and the images (deploy/slurm/cluster/build.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
deploy="$here/../deploy"
warmup=20 window=30
while [[ $# -gt 0 ]]; do
    case "$1" in
        --warmup) warmup="$2"; shift 2 ;;
        --window) window="$2"; shift 2 ;;
        *) echo "slurm_throughput: unknown argument $1" >&2; exit 2 ;;
    esac
done
project="millrace-slurm-bench-$$"
port=19100
tmp="$(mktemp -d)"
mkdir -p "$tmp/shared" "$tmp/munge"
chown 1000:1000 "$tmp/shared"
(umask 077 && head -c 1024 /dev/urandom >"$tmp/munge/munge.key")
echo "bench-token-$$" >"$tmp/token"
flags="--eval-every 100000000 --max-steps 100000000"
slurm() {
    MILLRACE_SLURM_SHARED="$tmp/shared" MILLRACE_SLURM_MUNGE="$tmp/munge" \
        docker-compose -p "$project" -f "$deploy/slurm/cluster/docker-compose.yml" "$@"
}
compose() {
    MILLRACE_TOKEN_FILE="$tmp/token" MILLRACE_METRICS_PORT=$port MILLRACE_RUN=bench \
        MILLRACE_LEARNER_ARGS="$flags" \
        docker-compose -p "$project-compose" -f "$deploy/docker-compose.yml" "$@"
}
cleanup() {
    slurm down -v --timeout 5 >/dev/null 2>&1 || true
    compose down -v --timeout 5 >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# sample URL NAME: the unlabelled sample NAME of the /metrics page at URL.
sample() {
    curl -fsS "$1" | awk -v n="$2" '$1 == n {print $2}'
}
wait_ready() {
    for _ in $(seq 480); do
        [[ "$(sample "$1" millrace_updates_total 2>/dev/null || true)" =~ ^[1-9] ]] && return 0
        sleep 0.5
    done
    echo "slurm_throughput: the learner did not start training" >&2
    return 1
}
rows=()
# measure URL LABEL: steps/s and updates/s over the window.
measure() {
    sleep "$warmup"
    local s0 u0 s1 u1 line
    s0="$(sample "$1" millrace_env_steps_total)" u0="$(sample "$1" millrace_updates_total)"
    sleep "$window"
    s1="$(sample "$1" millrace_env_steps_total)" u1="$(sample "$1" millrace_updates_total)"
    line="$(awk -v l="$2" -v s0="$s0" -v s1="$s1" -v u0="$u0" -v u1="$u1" -v w="$window" \
        'BEGIN {printf "| %s | %.0f | %.0f |", l, (s1 - s0) / w, (u1 - u0) / w}')"
    echo "$line" >&2
    rows+=("$line")
}

compose up -d --scale actor=2 >/dev/null 2>&1
wait_ready "http://127.0.0.1:$port/metrics"
measure "http://127.0.0.1:$port/metrics" "compose cluster: learner + 2 actor containers"
compose down -v --timeout 5 >/dev/null 2>&1

slurm up -d >/dev/null 2>&1
for _ in $(seq 120); do
    [[ "$(slurm exec -T slurmctld sinfo -h -o '%T %D' 2>/dev/null)" == "idle 3" ]] && break
    sleep 1
done
# shellcheck disable=SC2086
job="$(slurm exec -T -u millrace slurmctld sbatch --parsable --chdir=/shared --nodes=3 \
    --output=/shared/service-%j.out /opt/millrace/slurm/service.sbatch /shared/bench \
    --env CartPole-v1 --metrics-addr 0.0.0.0:9100 $flags | tr -d '\r')"
for _ in $(seq 120); do
    grep -q "actors on" "$tmp/shared/service-$job.out" 2>/dev/null && break
    sleep 1
done
node="$(sed -n 's/.*learner on \([^:]*\):.*/\1/p' "$tmp/shared/service-$job.out")"
ip="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' \
    "$(slurm ps -q "$node")")"
wait_ready "http://$ip:9100/metrics"
measure "http://$ip:9100/metrics" "Slurm job: learner on $node + 2 actor steps on the other nodes"
slurm exec -T -u millrace slurmctld scancel "$job"
echo
echo "| configuration | env steps/s | updates/s |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
