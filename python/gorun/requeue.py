"""Stopping a job to be requeued (SLURM's --signal warning) from a PyTorch
script under gorun."""
import os
from typing import NoReturn

EXIT_REQUEUE = 75
"""The exit status of a worker that saved what the requeued job resumes from
and stopped: EX_TEMPFAIL of sysexits.h, "try again later". gorun exits with
it too, and its sbatch script requeues the job."""

ENV_CHANNEL = "GORUN_HEARTBEAT_FD"
"""The worker's end of its channel to the gorun agent (a file descriptor),
when the agent gave it one."""


def exit_for_requeue() -> NoReturn:
    """Exit with EXIT_REQUEUE after telling the gorun agent, when there is one,
    that this worker stops for a requeue of the job.

    Call it once the script saved what the requeued job resumes from (its own
    storage checkpoint). SLURM sends its warning to each node's gorun on its
    own, so ranks that agree on the stop (an all-reduce of a stop flag) can
    stop before their own node's gorun got the signal: that gorun then takes
    the exit for a requeue, not a failure to restart from, only because the
    worker said so on its channel (docs/design.md, "The channel"). Without a
    channel (outside gorun, or a launch without one) it only exits. It raises
    SystemExit, so finally blocks and atexit handlers (Snapshots.close) run.
    """
    fd = os.environ.get(ENV_CHANNEL)
    if fd:
        try:
            os.write(int(fd), b"requeue\n")
        except (OSError, ValueError):
            pass  # no agent reads it: the exit status alone says what happened
    raise SystemExit(EXIT_REQUEUE)
