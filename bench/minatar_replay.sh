#!/usr/bin/env bash
# Uniform against prioritized replay on MinAtar Breakout and SpaceInvaders, from pixels,
# on the CPU (issue 12's learning-quality report; docs/results/learning.md):
# bench/minatar_compare.sh with the variants uniform and prioritized (--replay
# prioritized: α 0.6, β 0.4, the learner's |TD| fed back every 8 updates, actors'
# initial priorities), its logs under runs/minatar_replay/ and its report
# docs/results/data/minatar_replay.md and minatar_replay_<game>.{png,csv}.
#
#   bench/minatar_replay.sh                 # STEPS=500000 SEEDS="0 1" GAMES="Breakout SpaceInvaders"
#   STEPS=1000000 SEEDS="0 1 2" bench/minatar_replay.sh
#   bench/minatar_replay.sh report          # only the curves, CSV and the replayed policies
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VARIANTS="uniform prioritized" OUT="${OUT:-runs/minatar_replay}" REPORT=minatar_replay \
    exec "$here/minatar_compare.sh" "$@"
