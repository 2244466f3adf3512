#!/usr/bin/env bash
# Issue 46's check: does the learner keep up end to end, and do the actors scale? The
# overlap benchmark's scaling table (learner/benches/overlap.rs: ceiling, end-to-end
# updates/s against it, the actors' total env steps/s and inserts/s in a steady-state
# window, the most transitions admitted between two samples, the learner's time split,
# CPU time per kind of thread) on the Nature CNN at batch 32 and 512 with 1, 2, 4, 8
# and 14 actor threads and `auto`, with and without --copy-stream, and a 64×64 MLP
# row; the machine's CPUs (`lscpu -e`, the affinity mask, a cgroup quota) and the steal
# time over the whole script. About 4 minutes on an H100/H200. See bench/gpu/lib.sh.
#
#   bash bench/gpu/overlap-scaling.sh  # CPU_DRY=1 rehearses it on the CPU
name=overlap-scaling
# shellcheck source=bench/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
preflight overlap

if [[ "$dry" == 1 ]]; then
    # The 2-vCPU VM's CPU: a few Nature CNN updates a second at batch 32.
    secs=0.5 window=1 cnn_batches=32 counts=1,auto
else
    secs=2 window=6 cnn_batches=32,512 counts=1,2,4,8,14,auto
fi
stat0="$(grep -E '^cpu ' /proc/stat)"

run_step cpus 15 0 bash -c 'lscpu -e; echo "nproc: $(nproc)"; grep -m1 "model name" /proc/cpuinfo || true; grep Cpus_allowed_list /proc/self/status; echo "cgroup cpu.max: $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo none)"'
add_row cpus "$(figures 'nproc|model name|Cpus_allowed|cpu.max' 4)"

run_step overlap-cnn 150 0 "$bin/overlap" "${dev[@]}" --only cnn --batch "$cnn_batches" --actors "$counts" --seconds "$secs" --max-window "$window"
add_row overlap-cnn "$(figures '^CPU plan|^\| Nature' 16)"
if [[ "$dry" == 1 ]]; then
    # No side stream on a CPU: the flag is checked, and refused in one line.
    run_step overlap-cnn-copy-stream 30 fail "$bin/overlap" "${dev[@]}" --only cnn --batch "$cnn_batches" --actors "$counts" --seconds "$secs" --copy-stream
    [[ $rc == skipped ]] || grep -q 'copy-stream needs a CUDA device' "$log" \
        || status="**not refused as meant (exit $rc)**"
    add_row overlap-cnn-copy-stream "$(figures 'copy-stream' 1)"
else
    run_step overlap-cnn-copy-stream 150 0 "$bin/overlap" "${dev[@]}" --only cnn --batch "$cnn_batches" --actors "$counts" --seconds "$secs" --max-window "$window" --copy-stream
    add_row overlap-cnn-copy-stream "$(figures '^\| Nature' 16)"
fi
run_step overlap-mlp 60 0 "$bin/overlap" "${dev[@]}" --only mlp --batch 32 --actors 1,auto --seconds "$secs" --max-window "$window"
add_row overlap-mlp "$(figures '^\| MLP' 4)"

# Steal time over the script: the share of CPU time the hypervisor took (of user,
# nice, system, idle, iowait, irq, softirq and steal; guest time is inside user's).
export STAT0="$stat0"
run_step steal 10 0 bash -c 'awk -v a="$STAT0" -v b="$(grep -E "^cpu " /proc/stat)" '"'"'BEGIN { n = split(a, x); split(b, y); t = 0; for (i = 2; i <= 9 && i <= n; i++) t += y[i] - x[i]; printf "steal: %.2f%% of CPU time (%d of %d ticks)\n", t ? 100 * (y[9] - x[9]) / t : 0, y[9] - x[9], t }'"'"
add_row steal "$(figures '^steal' 1)"
finish
