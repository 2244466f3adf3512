#!/usr/bin/env bash
# The GPU check, part 1 (of today's one check, split to fit 6-minute calls): the set-up
# (doctor, nvidia-smi, driver, glibc), the device core's and the learner's lib tests with
# the GPU-only ones, the learner's ceiling on every network (fp32 against bf16, TF32
# off, IMPALA ×1 and ×2, Munchausen), and out of memory (injected and real). About
# 3 minutes on an H200 (2026-12-04). See bench/gpu/lib.sh.
#
#   bash bench/gpu/check.sh            # CPU_DRY=1 rehearses it on the CPU
name=check
# shellcheck source=bench/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
preflight learner learner-tests core-tests ceiling

# The rehearsal's CPU takes seconds per Nature CNN update at batch 512 (and in bf16):
# its steps run the same flags on smaller sizes.
if [[ "$dry" == 1 ]]; then
    secs=0.2 min_updates=2 nature_batches=32
    # Atari's IMPALA ×2 in bf16 takes over 10 s an update on a 2-vCPU VM: the rehearsal
    # runs the step in fp32 alone (it checks the step runs, not its figures).
    x2_precision=fp32
else
    secs=2 min_updates=50 nature_batches=32,512
    x2_precision=fp32,bf16
fi

# The machine.
run_step machine 15 0 bash -c 'nvidia-smi || echo "no nvidia-smi here"; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader || true; ldd --version | head -1; echo "cores: $(nproc)"; grep -m1 "model name" /proc/cpuinfo || true'
add_row machine "$(figures 'MiB|cores|GLIBC|glibc|no nvidia' 4)"

# The device core's and the learner's lib tests, the GPU-only ones included (listed
# only in the rehearsal: CI has just run them).
if [[ "$dry" == 1 ]]; then
    run_step lib-tests 60 0 bash -c "\"$bin/core-tests\" --list && \"$bin/learner-tests\" --list"
    add_row lib-tests "$(grep -c ': test$' "$log") tests listed, $(grep -c 'GPU\|gpu\|cuda' "$log") of them about the GPU"
else
    # One at a time: one test flips libtorch's process-wide TF32 settings, which the
    # GPU precision tests' fp32 references must not see.
    run_step lib-tests 150 0 bash -c "\"$bin/core-tests\" --include-ignored --test-threads 1; c=\$?; \"$bin/learner-tests\" --include-ignored --test-threads 1 && exit \$c"
    add_row lib-tests "$(figures '^test result|FAILED' 6)"
fi

# The ceiling, on the learner's cadence, fp32 against bf16 in one run.
run_step ceiling-mlp 60 0 "$bin/ceiling" "${dev[@]}" --hidden 64,64 --batch 32,512 --precision fp32,bf16 --seconds "$secs" --min-updates "$min_updates"
add_row ceiling-mlp "$(figures '^64x64 ')"
run_step ceiling-nature 90 0 "$bin/ceiling" "${dev[@]}" --net nature --batch "$nature_batches" --precision fp32,bf16 --seconds "$secs" --min-updates "$min_updates"
add_row ceiling-nature "$(figures '^nature |^GPU math')"
run_step ceiling-nature-ieee 60 0 "$bin/ceiling" "${dev[@]}" --net nature --batch "$nature_batches" --precision fp32 --tf32 off --seconds "$secs" --min-updates "$min_updates"
add_row ceiling-nature-ieee "$(figures '^nature |^GPU math')"

# Issue 28's candidates against today's networks, side by side in one run: the IMPALA
# network (×1 and ×2, Atari's pooled to 6×6) beside the MinAtar and Nature CNNs, and
# the Munchausen target beside double DQN.
run_step ceiling-impala 90 0 "$bin/ceiling" "${dev[@]}" --net minatar,impala-minatar,nature,impala --batch "$nature_batches" --precision fp32,bf16 --seconds "$secs" --min-updates "$min_updates"
add_row ceiling-impala "$(figures '^minatar|^nature |^impala' 16)"
run_step ceiling-impala-x2 60 0 "$bin/ceiling" "${dev[@]}" --net impala-minatar,impala --impala-width 2 --batch "$nature_batches" --precision "$x2_precision" --seconds "$secs" --min-updates "$min_updates"
add_row ceiling-impala-x2 "$(figures '^minatar-impala|^impala' 8)"
run_step ceiling-targets 60 0 "$bin/ceiling" "${dev[@]}" --net minatar,nature --batch "$nature_batches" --target double,munchausen --seconds "$secs" --min-updates "$min_updates"
add_row ceiling-targets "$(figures '^minatar |^nature ' 8)"

# Out of memory: CUDA's message injected at the copy (exit 1, explained, checkpoint
# kept), and a real over-allocation through PyTorch's allocator.
MILLRACE_INJECT_FAULT=oom:copy:cuda run_step oom-injected 60 fail "$bin/learner" "${dev[@]}" --replay prioritized --target-return 1000 --max-steps 100000000 --no-progress --logdir "$runs/oom"
kept=no
[[ -e "$runs/oom/checkpoint/latest/meta.json" ]] && kept=yes
[[ $rc == skipped || ($rc == 1 && $kept == yes) ]] || status="**exit $rc, checkpoint $kept**"
add_row oom-injected "exit $rc; checkpoint kept: $kept; $(grep -m1 -o 'error: the learner failed: out of memory on [^:]*' "$log")"
# (On the CPU only where the kernel refuses an allocation past its memory outright:
# with overcommit always on, the 262 GB would be granted and then filled.)
if [[ "$dry" == 1 && "$(cat /proc/sys/vm/overcommit_memory 2>/dev/null)" == 1 ]]; then
    run_step oom-real 5 0 echo "skipped: vm.overcommit_memory=1 would grant the allocation"
else
    run_step oom-real 60 fail "$bin/ceiling" "${dev[@]}" --hidden 8192,8192 --batch 8000000 --seconds 1 --min-updates 1
fi
[[ $rc == skipped || $rc == 0 ]] || grep -qiE "out of memory|not enough memory|can't allocate memory" "$log" \
    || status="**no allocation failure seen (exit $rc)**"
add_row oom-real "exit $rc; $(grep -m1 -oiE "(CUDA out of memory|not enough memory|can't allocate memory)[^.]*" "$log")"

finish
