#!/usr/bin/env bash
# The test cluster in one command: builds its image (deploy/slurm/cluster/build.sh),
# makes the cluster's munge key and the shared directory when missing
# (deploy/slurm/cluster/munge/ and shared/, ignored by git; owned by the job user, UID
# 1000), starts the controller and three nodes, and waits until they are idle.
#
#   deploy/slurm/cluster/up.sh
#   docker-compose -f deploy/slurm/cluster/docker-compose.yml exec -u millrace slurmctld \
#       sbatch --chdir=/shared /opt/millrace/slurm/service.sbatch /shared/cartpole
#   docker-compose -f deploy/slurm/cluster/docker-compose.yml down
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/build.sh"
export MILLRACE_SLURM_SHARED="${MILLRACE_SLURM_SHARED:-$here/shared}"
export MILLRACE_SLURM_MUNGE="${MILLRACE_SLURM_MUNGE:-$here/munge}"
mkdir -p "$MILLRACE_SLURM_SHARED" "$MILLRACE_SLURM_MUNGE"
chown 1000:1000 "$MILLRACE_SLURM_SHARED"
if [[ ! -s "$MILLRACE_SLURM_MUNGE/munge.key" ]]; then
    (umask 077 && head -c 1024 /dev/urandom >"$MILLRACE_SLURM_MUNGE/munge.key")
fi
compose=(docker-compose -f "$here/docker-compose.yml")
"${compose[@]}" up -d
for _ in $(seq 120); do
    if [[ "$("${compose[@]}" exec -T slurmctld sinfo -h -o '%T %D' 2>/dev/null)" == "idle 3" ]]; then
        "${compose[@]}" exec -T slurmctld sinfo
        exit 0
    fi
    sleep 1
done
echo "up: the nodes did not become idle in 120 s; see ${compose[*]} logs" >&2
exit 1
