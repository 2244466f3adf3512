#!/usr/bin/env bash
# Starts one test-cluster container (deploy/slurm/cluster): munged with the cluster's
# key (bind-mounted at /etc/munge-key/munge.key; copied so that it can be owned by the
# munge user, read-only to it), then slurmctld (`controller`) or slurmd (`node`) in the
# foreground, logging to stderr (docker logs).
set -euo pipefail
role="${1:?controller or node}"
install -o munge -g munge -m 0400 /etc/munge-key/munge.key /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
runuser -u munge -- munged --force
case "$role" in
    controller)
        install -d -o slurm -g slurm /var/spool/slurmctld /var/log/slurm
        exec slurmctld -D -i
        ;;
    node)
        install -d /var/spool/slurmd /var/log/slurm
        exec slurmd -D -N "$(hostname)"
        ;;
    *) echo "entrypoint: unknown role $role (controller or node)" >&2; exit 2 ;;
esac
