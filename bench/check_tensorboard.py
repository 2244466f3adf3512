"""Reads a millrace log directory with TensorBoard's own event reader and prints every
scalar tag with its number of points and last value; exits non-zero if none are found.

    python bench/check_tensorboard.py runs/millrace
"""

import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags()["scalars"]
for tag in sorted(tags):
    events = acc.Scalars(tag)
    print(f"{tag:32s} {len(events):5d} points, last {events[-1].value:.4g} at step {events[-1].step}")
if not tags:
    sys.exit("no scalars found")
