# shellcheck shell=bash
# What every bench/gpu/ script shares. Each script is one call to a lent GPU machine
# (at most 6 minutes), run from the repository root with the folder
# bench/gpu_prepare.sh built here carried over (.gpu/):
#
#   bash bench/gpu/NAME.sh
#
# That machine has one GPU, PyTorch 2.11.0 in the venv its python3 runs, no Rust and
# no network. `preflight` finds that torch's lib/ with python3 and puts it first on
# LD_LIBRARY_PATH (prepended: the driver may be found through that variable too), and
# stops within 30 s with one clear line if the binaries do not load or CUDA is not
# visible; `run_step` runs each step under its own timeout and all of them under a
# 330-second deadline. Every step names its device (--gpu 0): nothing falls back to
# the CPU. A script writes, under $OUT, summary.txt (one short table, also printed
# last) and logs.tar.gz (every step's log).
#
# CPU_DRY=1 rehearses a script here on the CPU (--cpu instead of --gpu 0, every step
# shortened) and fails unless every step ran as meant and summary.txt has its rows:
# CI runs every script so (scripts/test.sh), so none can rot between the days a GPU is
# lent. docs/results/gpu.md lists which scripts have run on a device.
#
# The sourcing script sets `name` (its own, for the summary and the log lines) first.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dry="${CPU_DRY:-0}"
bin="${GPU_BIN:-.gpu}"
# Each script fits a 6-minute call with room to start and copy back.
deadline_s="${GPU_DEADLINE_S:-330}"
start=$SECONDS
if [[ -z "${OUT:-}" ]]; then
    OUT="$(mktemp -d)"
fi
mkdir -p "$OUT"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
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
    mode="on the GPU"
fi

write_summary() {
    {
        echo "millrace bench/gpu/$name.sh, $mode, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
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
    echo "$name: $*" >&2
    rows+=("| preflight | **stopped** | $((SECONDS - start)) | $* |")
    write_summary
    pack_logs
    cat "$summary"
    exit 1
}

# preflight BINARY...: within 30 s, libtorch found through python3, the binaries there
# and loading, `learner doctor` run, and (on the GPU) CUDA visible; else one line, the
# summary and exit 1.
preflight() {
    tl="$(python3 -c 'import importlib.util, os; s = importlib.util.find_spec("torch"); print(os.path.join(os.path.dirname(s.origin), "lib") if s else "")' 2>/dev/null)"
    [[ -n "$tl" && -e "$tl/libtorch_cpu.so" ]] || die "python3 ($(command -v python3)) has no PyTorch with a torch/lib"
    export LD_LIBRARY_PATH="$tl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # The lib tests that read the workspace (Cargo.toml) find it here.
    export CARGO_MANIFEST_DIR="$PWD/learner"
    export RUST_BACKTRACE=0
    for b in "$@"; do
        [[ -x "$bin/$b" ]] || die "$bin/$b is missing: run bench/gpu_prepare.sh where Rust is, and carry $bin"
    done
    missing="$(for b in "$@"; do ldd "$bin/$b"; done 2>&1 | grep 'not found' | sort -u | tr -s ' \t' ' ' | tr '\n' ';')"
    [[ -z "$missing" ]] || die "the binaries do not load: $missing (LD_LIBRARY_PATH starts with $tl)"
    timeout -k 2 25 "$bin/learner" doctor >"$logs/00-doctor.log" 2>&1
    doctor_rc=$?
    grep -q 'tch' "$logs/00-doctor.log" || die "learner doctor did not run (exit $doctor_rc): $(tail -1 "$logs/00-doctor.log")"
    cuda_line="$(grep -m1 'CUDA devices' "$logs/00-doctor.log" | tr -s ' ')"
    if [[ "$dry" != 1 ]] && ! grep -q 'visible to libtorch' "$logs/00-doctor.log"; then
        die "CUDA is not visible to libtorch: ${cuda_line:-no CUDA line from learner doctor} (exit $doctor_rc)"
    fi
    rows+=("| doctor | $([[ $doctor_rc == 0 ]] && echo ok || echo "**exit $doctor_rc**") | $((SECONDS - start)) | ${cuda_line:-} |")
    echo "$name: $mode; torch/lib $tl; preflight done in $((SECONDS - start)) s"
}

# --- Steps. --------------------------------------------------------------------------
step_no=0
# run_step NAME LIMIT_S EXPECT CMD...: runs CMD under min(LIMIT_S, time left) with its
# output in logs/NN-NAME.log; EXPECT says which exit status means it went as meant: 0;
# "ran" (0, or 2 for a run that ended without reaching its target); "fail" (the
# failure an out-of-memory step provokes). Sets $log, $rc, $status and $step_s.
run_step() {
    local step="$1" limit="$2" expect="$3"
    shift 3
    step_no=$((step_no + 1))
    log="$logs/$(printf '%02d' "$step_no")-$step.log"
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
    echo "$name: $step: $status in ${step_s} s"
}

# Figures from a log: the lines matching a pattern, joined (a table's bold marks
# dropped: `**` in the summary means a step that did not go as meant).
figures() {
    grep -v '^\$ ' "$log" | grep -E "$1" | sed -E 's/\x1b\[[0-9;]*m//g; s/^[0-9-]+T[0-9:.]+Z +[A-Z]+ [^ ]+: //; s/^ +//; s/ +/ /g; s/\*\*//g' | head -"${2:-8}" | tr '\n' ';' | sed 's/;$//; s/|/\//g'
}

add_row() {
    rows+=("| $1 | $status | $step_s | $2 |")
}


# Writes the summary and the logs, prints the summary; in the rehearsal, fails unless
# every step ran as meant and every row is there.
finish() {
    write_summary
    pack_logs
    echo
    cat "$summary"
    echo
    echo "$name: $((SECONDS - start)) s; $summary and $OUT/logs.tar.gz ($(du -h "$OUT/logs.tar.gz" | cut -f1))"
    local failed
    failed="$(grep -c '\*\*' "$summary")"
    if [[ "$dry" == 1 ]]; then
        local expected=$((step_no + 1)) have=${#rows[@]}
        if ((failed > 0 || have != expected)); then
            echo "$name: the rehearsal failed: $failed step(s) did not go as meant, $have of $expected rows" >&2
            exit 1
        fi
        echo "$name: rehearsal passed: $step_no steps and the preflight, $have rows"
        exit 0
    fi
    ((failed == 0))
}
