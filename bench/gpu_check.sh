#!/usr/bin/env bash
# The one command a lent GPU machine runs, from the repository root, with the folder
# bench/gpu_prepare.sh built here carried over (.gpu/), under a 600-second limit:
#
#   bash bench/gpu_check.sh
#
# That machine has one GPU, PyTorch 2.11.0 in the venv its python3 runs, no Rust and
# no network. This script finds that torch's lib/ with python3 and puts it first on
# LD_LIBRARY_PATH (prepended: the driver may be found through that variable too),
# stops within 30 s with one clear line if the binaries do not load or CUDA is not
# visible, then runs each step under its own timeout and all of them under a 9-minute
# deadline, most valuable first: the set-up (doctor, nvidia-smi, driver, glibc), the
# device core's and the learner's lib tests with the GPU-only ones, the learner's
# ceiling, the overlap
# benchmark, short runs, out of memory (injected and real), populations (with and
# without --copy-stream). Every step
# names its device (--gpu 0): nothing falls back to the CPU. It writes, under $OUT,
# summary.txt (one short table, also printed last) and logs.tar.gz (every step's log).
#
# CPU_DRY=1 rehearses it here on the CPU (--cpu instead of --gpu 0, every step
# shortened, the lib tests listed rather than run a second time) and fails unless
# every step ran and summary.txt has its rows: CI runs this, so the script cannot rot
# between the days a GPU is lent.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dry="${CPU_DRY:-0}"
bin="${GPU_BIN:-.gpu}"
deadline_s="${GPU_DEADLINE_S:-540}"
start=$SECONDS
if [[ -z "${OUT:-}" ]]; then
    OUT="$(mktemp -d)"
fi
mkdir -p "$OUT"
work="$(mktemp -d)"
logs="$work/logs"
runs="$work/runs"
mkdir -p "$logs" "$runs"
summary="$OUT/summary.txt"
rows=()

if [[ "$dry" == 1 ]]; then
    # The project's virtualenv is this machine's PyTorch.
    # shellcheck source=scripts/env.sh
    source scripts/env.sh
    dev=(--cpu)
    mode="CPU rehearsal (CPU_DRY=1): every step shortened, on the CPU"
else
    dev=(--gpu 0)
    mode="GPU check"
fi

write_summary() {
    {
        echo "millrace $mode, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
        echo "| step | result | s | figures |"
        echo "|---|---|---:|---|"
        printf '%s\n' "${rows[@]}"
    } >"$summary"
}

pack_logs() {
    tar -czf "$OUT/logs.tar.gz" -C "$work" logs
}

# One line, the summary and the logs, then exit 1.
die() {
    echo "gpu_check: $*" >&2
    rows+=("| preflight | **stopped** | $((SECONDS - start)) | $* |")
    write_summary
    pack_logs
    cat "$summary"
    exit 1
}

# --- Preflight (within 30 s): libtorch, the binaries, CUDA. -----------------------
tl="$(python3 -c 'import importlib.util, os; s = importlib.util.find_spec("torch"); print(os.path.join(os.path.dirname(s.origin), "lib") if s else "")' 2>/dev/null)"
[[ -n "$tl" && -e "$tl/libtorch_cpu.so" ]] || die "python3 ($(command -v python3)) has no PyTorch with a torch/lib"
export LD_LIBRARY_PATH="$tl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The lib tests that read the workspace (Cargo.toml) find it here.
export CARGO_MANIFEST_DIR="$PWD/learner"
export RUST_BACKTRACE=0
for b in learner learner-tests core-tests ceiling overlap population; do
    [[ -x "$bin/$b" ]] || die "$bin/$b is missing: run bench/gpu_prepare.sh where Rust is, and carry $bin"
done
missing="$(ldd "$bin/learner" "$bin/learner-tests" "$bin/core-tests" 2>&1 | grep 'not found' | sort -u | tr -s ' \t' ' ' | tr '\n' ';')"
[[ -z "$missing" ]] || die "the binaries do not load: $missing (LD_LIBRARY_PATH starts with $tl)"
timeout -k 2 25 "$bin/learner" doctor >"$logs/00-doctor.log" 2>&1
doctor_rc=$?
grep -q 'tch' "$logs/00-doctor.log" || die "learner doctor did not run (exit $doctor_rc): $(tail -1 "$logs/00-doctor.log")"
cuda_line="$(grep -m1 'CUDA devices' "$logs/00-doctor.log" | tr -s ' ')"
if [[ "$dry" != 1 ]] && ! grep -q 'visible to libtorch' "$logs/00-doctor.log"; then
    die "CUDA is not visible to libtorch: ${cuda_line:-no CUDA line from learner doctor} (exit $doctor_rc)"
fi
rows+=("| doctor | $([[ $doctor_rc == 0 ]] && echo ok || echo "**exit $doctor_rc**") | $((SECONDS - start)) | ${cuda_line:-} |")
echo "gpu_check: $mode; torch/lib $tl; preflight done in $((SECONDS - start)) s"

# --- Steps. --------------------------------------------------------------------------
step_no=0
# run_step NAME LIMIT_S EXPECT CMD...: runs CMD under min(LIMIT_S, time left) with its
# output in logs/NN-NAME.log; EXPECT says which exit status means it went as meant: 0;
# "ran" (0, or 2 for a run that ended without reaching its target); "fail" (the
# failure an out-of-memory step provokes). Sets $log, $rc, $status and $step_s.
run_step() {
    local name="$1" limit="$2" expect="$3"
    shift 3
    step_no=$((step_no + 1))
    log="$logs/$(printf '%02d' "$step_no")-$name.log"
    local left=$((deadline_s - (SECONDS - start) - 10))
    if ((left < 5)); then
        # The caller's add_row records it (once).
        rc=skipped status="**skipped** (deadline)" step_s=0
        echo "skipped: no time left before the deadline" >"$log"
        return
    fi
    ((limit > left)) && limit=$left
    local t0=$SECONDS
    echo "\$ $*" >"$log"
    timeout -k 5 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    step_s=$((SECONDS - t0))
    if ((rc == 124 || (rc == 137 && step_s >= limit))); then
        status="**timeout** (${limit} s)"
    elif ((rc == 137)); then
        status="**killed** (SIGKILL: out of host memory?)"
    elif [[ "$expect" == 0 && $rc == 0 ]] || [[ "$expect" == ran && ($rc == 0 || $rc == 2) ]] \
        || [[ "$expect" == fail && $rc != 0 ]]; then
        status=ok
    else
        status="**exit $rc**"
    fi
    echo "gpu_check: $name: $status in ${step_s} s"
}

# Figures from a log: the lines matching a pattern, joined.
figures() {
    grep -v '^\$ ' "$log" | grep -E "$1" | sed -E 's/\x1b\[[0-9;]*m//g; s/^[0-9-]+T[0-9:.]+Z +[A-Z]+ [^ ]+: //; s/^ +//; s/ +/ /g' | head -"${2:-8}" | tr '\n' ';' | sed 's/;$//; s/|/\//g'
}

add_row() {
    rows+=("| $1 | $status | $step_s | $2 |")
}

# The rehearsal's CPU takes seconds per Nature CNN update at batch 512 (and in bf16):
# its steps run the same flags on smaller sizes.
if [[ "$dry" == 1 ]]; then
    secs=0.2 min_updates=2 nature_batches=32 actors=4 overlap_s=1 overlap_batches=32
    # Atari's IMPALA ×2 in bf16 takes over 10 s an update on a 2-vCPU VM: the rehearsal
    # runs the step in fp32 alone (it checks the step runs, not its figures).
    x2_precision=fp32
    steps=3000 pixel_steps=1000 pop_k=1,8 pop_agents=4 pop_steps=2000
else
    secs=2 min_updates=50 nature_batches=32,512 actors=64 overlap_s=4 overlap_batches=32,512
    x2_precision=fp32,bf16
    steps=30000 pixel_steps=30000 pop_k=1,8,64,256,1024 pop_agents=64 pop_steps=10000
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

# Overlap: end-to-end against the ceiling with 64 actors, without and with the side
# copy stream, and with as many actors as the cores keep busy.
run_step "overlap-$actors" 150 0 "$bin/overlap" "${dev[@]}" --only cnn --actors "$actors" --batch "$overlap_batches" --seconds "$overlap_s"
add_row "overlap-$actors" "$(figures '^\| nature|^\| cnn|b[0-9]+: ceiling' 4)"
if [[ "$dry" == 1 ]]; then
    # No side stream on a CPU: the flag is checked, and refused in one line.
    run_step "overlap-$actors-copy-stream" 30 fail "$bin/overlap" "${dev[@]}" --only cnn --actors "$actors" --batch "$overlap_batches" --seconds "$overlap_s" --copy-stream
    [[ $rc == skipped ]] || grep -q 'copy-stream needs a CUDA device' "$log" \
        || status="**not refused as meant (exit $rc)**"
    add_row "overlap-$actors-copy-stream" "$(figures 'copy-stream' 1)"
else
    run_step "overlap-$actors-copy-stream" 150 0 "$bin/overlap" "${dev[@]}" --only cnn --actors "$actors" --batch "$overlap_batches" --seconds "$overlap_s" --copy-stream
    add_row "overlap-$actors-copy-stream" "$(figures '^\| nature|^\| cnn|b[0-9]+: ceiling' 4)"
fi

# Short runs on the device: prioritized replay (the asynchronous priority read-back)
# in bf16; no pin_memory deprecation warnings.
run_step cartpole 90 ran "$bin/learner" "${dev[@]}" --env CartPole-v1 --replay prioritized --precision bf16 --max-steps "$steps" --no-progress --logdir "$runs/cartpole"
add_row cartpole "$(figures 'result:|learner time:|priorities:' 3); deprecation warnings: $(grep -ci 'deprecat' "$log")"
run_step catchpixels 90 ran "$bin/learner" "${dev[@]}" --env CatchPixels-v0 --replay prioritized --precision bf16 --max-steps "$pixel_steps" --no-progress --logdir "$runs/catch"
add_row catchpixels "$(figures 'result:|learner time:' 2); deprecation warnings: $(grep -ci 'deprecat' "$log")"
# The IMPALA network end to end: the actors' CPU forward pass, the learner's on the device.
run_step catchpixels-impala 90 ran "$bin/learner" "${dev[@]}" --env CatchPixels-v0 --network impala --replay prioritized --precision bf16 --max-steps "$pixel_steps" --no-progress --logdir "$runs/catch-impala"
add_row catchpixels-impala "$(figures 'result:|learner time:|network:|IMPALA' 3)"

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

# Populations: the stacked update as K grows, and one population run.
run_step population-bench 60 0 "$bin/population" "${dev[@]}" --k "$pop_k" --seconds "$secs"
add_row population-bench "$(figures '^ *[0-9]+ ' 6)"
run_step population-run 90 ran "$bin/learner" "${dev[@]}" --population "$pop_agents" --hidden 64,64 --batch-size 32 --max-steps "$pop_steps" --no-progress --logdir "$runs/pop"
add_row population-run "$(figures 'population of .* solved|solved at|per agent' 3)"
# The same population with its batches copied on a side stream (on the CPU: refused in
# one line; --cpu itself does not combine with the flag, so no device flag is given).
if [[ "$dry" == 1 ]]; then
    run_step population-copy-stream 30 fail "$bin/learner" --population "$pop_agents" --hidden 64,64 --batch-size 32 --max-steps "$pop_steps" --no-progress --logdir "$runs/pop-cs" --copy-stream
    [[ $rc == skipped ]] || grep -q 'copy-stream needs a CUDA device' "$log" \
        || status="**not refused as meant (exit $rc)**"
    add_row population-copy-stream "$(figures 'copy-stream' 1)"
else
    run_step population-copy-stream 90 ran "$bin/learner" "${dev[@]}" --population "$pop_agents" --hidden 64,64 --batch-size 32 --max-steps "$pop_steps" --no-progress --logdir "$runs/pop-cs" --copy-stream
    add_row population-copy-stream "$(figures 'population of .* solved|solved at|per agent' 3)"
fi

# With as many actors as the cores keep busy, where that differs from 64 (last: the
# least new).
cores=$(($(nproc) - 2))
if [[ "$dry" != 1 ]] && ((cores >= 1 && cores != actors)); then
    run_step "overlap-$cores" 120 0 "$bin/overlap" "${dev[@]}" --only cnn --actors "$cores" --batch "$overlap_batches" --seconds "$overlap_s"
    add_row "overlap-$cores" "$(figures '^\| nature|^\| cnn|b[0-9]+: ceiling' 4)"
fi

write_summary
pack_logs
echo
cat "$summary"
echo
echo "gpu_check: $((SECONDS - start)) s; $summary and $OUT/logs.tar.gz ($(du -h "$OUT/logs.tar.gz" | cut -f1))"
failed="$(grep -c '\*\*' "$summary")"
if [[ "$dry" == 1 ]]; then
    # Every step ran as meant, and every row is there.
    expected=$((step_no + 1))
    have=${#rows[@]}
    if ((failed > 0 || have != expected)); then
        echo "gpu_check: the rehearsal failed: $failed step(s) did not go as meant, $have of $expected rows" >&2
        exit 1
    fi
    echo "gpu_check: rehearsal passed: $step_no steps and the preflight, $have rows"
    exit 0
fi
((failed == 0))
