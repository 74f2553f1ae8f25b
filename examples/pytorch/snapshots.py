#!/usr/bin/env python3
"""A DDP training script that keeps its state in gorun snapshots.

Runs unchanged under gorun, torchrun and plain python:

    python3 examples/pytorch/snapshots.py --steps 20 --model-mb 100 --out /tmp/final.pt
    python3 -m torch.distributed.run --standalone --nproc_per_node=2 examples/pytorch/snapshots.py ...

(torch 1.13's torchrun under Python 3.11 also needs --redirects 9:1 --tee 9:1
to get past a start-up crash.)

Under gorun (GORUN_SNAPSHOT_DIR set) every step ends with a snapshot, and a
restarted worker goes on from the newest one; elsewhere the snapshot calls do
nothing. The data is a pure function of (--seed, global sample index), so a
run that restarts ends bit-identical to one that did not (CPU, gloo). Rank 0
prints `step N loss L` after each step and, with --out, saves the final
state_dict there with torch.save. The process group is gloo on CPU and NCCL
when CUDA is there; without RANK in the environment there is none (one
process).

The script's own storage checkpoint, the fallback when the snapshots restore
nothing (under torchrun, under gorun --snapshots=false, or after losing more
nodes than there are copies): with --ckpt-dir D --ckpt-every N rank 0 writes
{model, optim, step} to D/ckpt-<step>.pt every N steps with torch.save
(atomically: a temporary file, fsynced, renamed), keeping only the newest, and
at start, when restore returns None, every rank loads the newest one there.

For measuring what the snapshots cost (bench/pytorch-chaos.sh), --save-blocks B
saves only in every other block of B steps (steps 1..B save, B+1..2B do not,
...) and makes rank 0 add its process's CPU seconds to each step line
(`step N loss L cpu_s C`): one run then holds steps with and without a
snapshot side by side, on the same machine at the same moment.
"""
import argparse
import os
import re
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

try:
    import gorun
except ImportError:  # run from a checkout without gorun on PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import gorun

WIDTH = 512  # features of every layer


def model_of(mb: float) -> nn.Module:
    """Linear layers of WIDTH x WIDTH, about mb megabytes of float32."""
    per_layer = (WIDTH * WIDTH + WIDTH) * 4
    layers = []
    for _ in range(max(1, round(mb * 2**20 / per_layer))):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def sample(seed: int, index: int) -> "tuple[torch.Tensor, torch.Tensor]":
    """Sample index of the data set: an input and a target, a pure function
    of (seed, index)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    x = torch.randn(WIDTH, generator=g)
    return x, torch.roll(x, 1) * 0.5


CKPT = re.compile(r"ckpt-(\d+)\.pt")  # the name of a checkpoint of step N


def save_checkpoint(directory: str, step: int, model: nn.Module, optim: torch.optim.Optimizer) -> str:
    """Write {model, optim, step} to directory/ckpt-<step>.pt atomically: into a
    temporary file there, fsynced, renamed over the name, the directory fsynced;
    then remove the older checkpoints. A crash at any point leaves the newest
    complete checkpoint whole. Returns the path written."""
    path = os.path.join(directory, f"ckpt-{step:08d}.pt")
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    for name in os.listdir(directory):
        m = CKPT.fullmatch(name)
        if m and int(m.group(1)) < step:
            os.unlink(os.path.join(directory, name))
    return path


def load_checkpoint(directory: str, model: nn.Module, optim: torch.optim.Optimizer) -> "tuple[int, str] | None":
    """Load the newest directory/ckpt-<step>.pt into model and optim; returns
    (its step, its path), or None when the directory holds none."""
    steps = [int(m.group(1)) for m in map(CKPT.fullmatch, os.listdir(directory)) if m]
    if not steps:
        return None
    path = os.path.join(directory, f"ckpt-{max(steps):08d}.pt")
    ckpt = torch.load(path, map_location="cpu")
    model.load_state_dict(ckpt["model"])
    optim.load_state_dict(ckpt["optim"])
    return ckpt["step"], path


def settle_buckets(ddp: nn.Module, optim: torch.optim.Optimizer, device: torch.device) -> None:
    """One forward and backward that changes no weight (no optimizer step; the
    gradients are dropped). DDP all-reduces the gradients of its first
    iteration as one bucket and rebuilds its buckets after it; a bucket's
    layout decides the order in which gloo sums each element. Without this, a
    run that resumed at step k would sum step k+1 in another order than a run
    that never stopped, and end different in the last bits."""
    ddp(torch.zeros(1, WIDTH, device=device)).sum().backward()
    optim.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-mb", type=float, default=100)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--ckpt-dir", default="",
                    help="storage checkpoints: loaded at start when the snapshots restore nothing")
    ap.add_argument("--ckpt-every", type=int, default=0,
                    help="rank 0 writes a checkpoint to --ckpt-dir every this many steps (0: never)")
    ap.add_argument("--save-blocks", type=int, default=0,
                    help="for measuring the snapshots' cost: save only in every other block of this many "
                         "steps, and print rank 0's CPU seconds with each step (0: save every step)")
    args = ap.parse_args()
    if args.save_blocks < 0:
        ap.error(f"--save-blocks must be 0 (save every step) or a positive number of steps, got {args.save_blocks}")
    if args.ckpt_every < 0:
        ap.error(f"--ckpt-every must be 0 (no checkpoints) or a positive number of steps, got {args.ckpt_every}")
    if args.ckpt_every and not args.ckpt_dir:
        ap.error("--ckpt-every needs --ckpt-dir, the directory to write the checkpoints to")
    if args.ckpt_dir:
        os.makedirs(args.ckpt_dir, exist_ok=True)

    distributed = "RANK" in os.environ
    cuda = torch.cuda.is_available()
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = model_of(args.model_mb).to(device)
    ddp = nn.parallel.DistributedDataParallel(model) if distributed else model
    optim = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = {"model": model, "optim": optim}

    # DDP keeps the same state on every rank: any rank may restore any
    # rank's snapshot, so the job can come back at another world size.
    snaps = gorun.Snapshots(replicated=True)
    start = snaps.restore(state)
    if start and rank == 0:
        print(f"restored step {start}", flush=True)
    if start is None and args.ckpt_dir:
        loaded = load_checkpoint(args.ckpt_dir, model, optim)
        if loaded:
            start = loaded[0]
            if rank == 0:
                print(f"restored step {start} from checkpoint {loaded[1]}", flush=True)
    start = start or 0
    if distributed:
        settle_buckets(ddp, optim, device)
    for step in range(start, args.steps):
        first = (step * world + rank) * args.batch
        xs, ys = zip(*(sample(args.seed, first + i) for i in range(args.batch)))
        x, y = torch.stack(xs).to(device), torch.stack(ys).to(device)
        optim.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optim.step()
        if not args.save_blocks or (step // args.save_blocks) % 2 == 0:
            snaps.save(step + 1, state)
        if rank == 0 and args.save_blocks:
            print(f"step {step + 1} loss {loss.item():.6f} cpu_s {time.process_time():.4f}", flush=True)
        elif rank == 0:
            print(f"step {step + 1} loss {loss.item():.6f}", flush=True)
        if rank == 0 and args.ckpt_every and (step + 1) % args.ckpt_every == 0:
            save_checkpoint(args.ckpt_dir, step + 1, model, optim)
    snaps.close()
    if rank == 0 and args.out:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, args.out)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
