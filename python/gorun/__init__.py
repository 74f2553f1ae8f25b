"""gorun's worker-side API: per-rank training-state snapshots in memory the
gorun agent owns, so a restarted worker goes on at the step the job reached.

    snaps = gorun.Snapshots(replicated=True)  # DDP: the state is the same on every rank
    state = {"model": model, "optim": opt, "sched": sched, "epoch": 0}
    start = snaps.restore(state)  # the step to go on from, or None
    for step in range(start or 0, steps):
        train_step()
        snaps.save(step + 1, state)

Outside gorun (no GORUN_SNAPSHOT_DIR) every call does nothing.
gorun.exit_for_requeue() ends a worker that saved its checkpoint for a
SLURM requeue (exit 75), telling its gorun agent so.
"""
from .requeue import EXIT_REQUEUE, exit_for_requeue
from .snapshots import (ENV_DIR, ENV_REASON, ENV_STEP, ENV_VERIFIED, NoSpaceError,
                        SnapshotError, Snapshots, StateMismatchError)

__all__ = ["EXIT_REQUEUE", "exit_for_requeue", "ENV_DIR", "ENV_REASON", "ENV_STEP", "ENV_VERIFIED", "NoSpaceError",
           "SnapshotError", "Snapshots", "StateMismatchError"]
__version__ = "0.2.0"
