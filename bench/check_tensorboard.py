"""Reads a millrace log directory with TensorBoard's own event reader and prints every
scalar tag with its number of points and last value; exits non-zero if none are found.
With a TAG, prints that tag's points instead, one "step value" line each.

    python bench/check_tensorboard.py runs/millrace [TAG]
"""

import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags()["scalars"]
if not tags:
    sys.exit("no scalars found")
if len(sys.argv) > 2:
    if sys.argv[2] not in tags:
        sys.exit(f"no scalar {sys.argv[2]}; the tags are {sorted(tags)}")
    for event in acc.Scalars(sys.argv[2]):
        print(event.step, repr(event.value))
    sys.exit(0)
for tag in sorted(tags):
    events = acc.Scalars(tag)
    print(f"{tag:32s} {len(events):5d} points, last {events[-1].value:.4g} at step {events[-1].step}")
