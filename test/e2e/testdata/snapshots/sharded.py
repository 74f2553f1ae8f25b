#!/usr/bin/env python3
"""A job whose ranks each keep state of their own (sharded, not replicated):
rank r's tensor is a pure function of (r, step), so a restore must give each
rank its own rank's snapshot, and a run that restarts ends bit-identical to
one that did not. The ranks step together (a gloo all_reduce per step). Rank 0
prints `step N` after each step and `restored step N` after a restore; every
rank writes its final state to OUT/rank-<RANK>.pt.

    sharded.py --steps N --out DIR [--mb M] [--step-sleep S] [--pause-at P]

--step-sleep paces the steps (a step of real training takes far longer than
its snapshot's copy to another node). --pause-at P stops each rank (SIGSTOP,
to itself) once its snapshot of step P is complete, the first time that rank
number gets there in the job (a file OUT/paused-rank-<RANK> says it did): a
test then acts on a job paused at a known step, and SIGCONT goes on.
"""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

import gorun


def pause_once(snaps: gorun.Snapshots, marker: str) -> None:
    """Stop this process once its newest snapshot is complete, unless marker
    exists (this rank number paused before: a restarted worker goes on)."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    snaps.wait()
    os.kill(os.getpid(), signal.SIGSTOP)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mb", type=float, default=1)
    ap.add_argument("--step-sleep", type=float, default=0)
    ap.add_argument("--pause-at", type=int, default=-1)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    n = int(args.mb * 2**20 / 4)
    state = {"x": torch.full((n,), float(rank)), "step": 0}
    snaps = gorun.Snapshots()  # sharded: rank r restores rank r's snapshot only
    start = snaps.restore(state)
    if start is not None and rank == 0:
        print(f"restored step {start}", flush=True)
    for step in range(start or 0, args.steps):
        g = torch.Generator().manual_seed(rank * 1_000_003 + step)
        state["x"].mul_(0.5).add_(torch.rand(n, generator=g))
        time.sleep(args.step_sleep)
        state["step"] = step + 1
        total = torch.tensor([float(step)])
        dist.all_reduce(total)  # the ranks step together
        snaps.save(step + 1, state)
        if rank == 0:
            print(f"step {step + 1}", flush=True)
        if step + 1 == args.pause_at:
            pause_once(snaps, os.path.join(args.out, f"paused-rank-{rank}"))
    snaps.close()
    torch.save(state["x"], os.path.join(args.out, f"rank-{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
