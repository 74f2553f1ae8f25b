#!/usr/bin/env python3
"""A worker whose ranks agree on a stop for a requeue and leave together, as a
script that all-reduces a stop flag and meets a barrier before it exits does:
SIGUSR1 to any rank creates $STOP_DIR/stop; every rank, seeing it, "saves",
says it stops for a requeue (gorun.exit_for_requeue, its line first), marks
$STOP_DIR/said-<rank>, and leaves once every rank has."""
import os
import signal
import time

import gorun

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
stop = os.path.join(os.environ["STOP_DIR"], "stop")
signal.signal(signal.SIGUSR1, lambda *_: open(stop, "w").close())
print(f"rank {rank} ready", flush=True)
while not os.path.exists(stop):
    time.sleep(0.02)
print(f"rank {rank} stops for a requeue", flush=True)
try:
    gorun.exit_for_requeue()
finally:  # SystemExit: the line is written; the barrier, then the exit
    open(os.path.join(os.environ["STOP_DIR"], f"said-{rank}"), "w").close()
    while not all(os.path.exists(os.path.join(os.environ["STOP_DIR"], f"said-{r}")) for r in range(world)):
        time.sleep(0.02)
