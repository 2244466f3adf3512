#!/usr/bin/env bash
# Issue 47's check: nothing on the learner's path. The publisher's GPU test (each
# snapshot copied to pinned memory on a side stream after its update, the newest kept);
# the overlap benchmark (learner/benches/overlap.rs) on the Nature CNN at batch 32 with
# parameters published every 1, 20 and 200 updates (end to end against the ceiling;
# the "publish" column is the learner thread's time publishing: the snapshot and an
# event), prioritized replay end to end (TD errors applied inline against on their own
# thread: the "priorities" column), and the actors' scaling with the new actor step
# (1, 4 and 14 actor threads and `auto`: "× one actor alone"). About 3 minutes on an
# H100/H200. See bench/gpu/lib.sh.
#
#   bash bench/gpu/publish.sh          # CPU_DRY=1 rehearses it on the CPU
name=publish
# shellcheck source=bench/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
preflight overlap core-tests

if [[ "$dry" == 1 ]]; then
    # The 2-vCPU VM's CPU: a few Nature CNN updates a second at batch 32.
    secs=0.5 window=1 counts=1 scaling=1,auto
else
    secs=2 window=6 counts=4 scaling=1,4,14,auto
fi

# The publisher on a GPU: a side stream, or (on the CPU) the fallback a GPU publisher
# takes when it cannot make one.
if [[ "$dry" == 1 ]]; then
    run_step publisher-test 60 0 "$bin/core-tests" --exact publisher::tests::without_a_side_stream_the_thread_publishes_through_the_default_stream
else
    run_step publisher-test 60 0 "$bin/core-tests" --include-ignored publisher::tests
fi
add_row publisher-test "$(figures '^test |^test result' 4)"

run_step publish-every 120 0 "$bin/overlap" "${dev[@]}" --only cnn --batch 32 --actors "$counts" --publish-every 1,20,200 --seconds "$secs" --max-window "$window"
add_row publish-every "$(figures '^\| Nature' 6)"

run_step prioritized 90 0 "$bin/overlap" "${dev[@]}" --only cnn --batch 32 --actors "$counts" --replay prioritized --priorities inline,thread --seconds "$secs" --max-window "$window"
add_row prioritized "$(figures '^\| Nature' 6)"

run_step actor-scaling 120 0 "$bin/overlap" "${dev[@]}" --only cnn --batch 32 --actors "$scaling" --seconds "$secs" --max-window "$window"
add_row actor-scaling "$(figures '^\| Nature' 8)"
finish
