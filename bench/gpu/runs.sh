#!/usr/bin/env bash
# The GPU check, part 2: short training runs on the device (CartPole with prioritized
# replay in bf16, CatchPixels with the Nature CNN and with IMPALA), the stacked
# population update as K grows, and a population run with and without --copy-stream.
# About 4 minutes on an H200. See bench/gpu/lib.sh.
#
#   bash bench/gpu/runs.sh             # CPU_DRY=1 rehearses it on the CPU
name=runs
# shellcheck source=bench/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
preflight learner population

if [[ "$dry" == 1 ]]; then
    secs=0.2 steps=3000 pixel_steps=1000 pop_k=1,8 pop_agents=4 pop_steps=2000
else
    secs=2 steps=30000 pixel_steps=30000 pop_k=1,8,64,256,1024 pop_agents=64 pop_steps=10000
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

finish
