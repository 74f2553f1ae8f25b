#!/usr/bin/env python3
"""A plain PyTorch DDP training script, written the way users write them for torchrun.

Nothing in here knows about gorun: it relies only on the torchrun environment
contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...) and on
init_process_group(init_method="env://"). Run it with either launcher:

    gorun --standalone --nproc-per-node=4 examples/ddp/train.py --out /tmp/ddp
    torchrun --standalone --nproc_per_node=4 examples/ddp/train.py --out /tmp/ddp

At the end every rank writes its final parameters to OUT/rank-<RANK>.pt and
their sha256 (over the concatenated float32 bytes, in state_dict order) to
OUT/rank-<RANK>.sha256, plus OUT/rank-<RANK>.json with what the rank saw, so a
test can check that all replicas ended bit-identical and that the world size
was right.
"""
import argparse
import time
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

# The torchrun worker environment contract this script depends on.
REQUIRED_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
)


def check_env():
    missing = [k for k in REQUIRED_ENV if os.environ.get(k, "") == ""]
    if missing:
        sys.stderr.write(
            "train.py: launcher environment contract violated: missing %s "
            "(run me with gorun or torchrun)\n" % ", ".join(missing)
        )
        sys.exit(3)
    env = {k: os.environ[k] for k in REQUIRED_ENV}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"):
        try:
            int(env[k])
        except ValueError:
            sys.stderr.write("train.py: %s=%r is not an integer\n" % (k, env[k]))
            sys.exit(3)
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank, local_world = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    if not (0 <= rank < world and 0 <= local_rank < local_world <= world):
        sys.stderr.write("train.py: inconsistent ranks: %r\n" % env)
        sys.exit(3)
    return env


def make_data(n, d_in, seed):
    # The same synthetic regression problem on every rank: y = tanh(x W1) w2 + noise.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    w1 = torch.randn(d_in, 16, generator=g) / d_in ** 0.5
    w2 = torch.randn(16, 1, generator=g) / 4.0
    y = torch.tanh(x @ w1) @ w2 + 0.01 * torch.randn(n, 1, generator=g)
    return x, y


def main():
    p = argparse.ArgumentParser(description="tiny DDP regression example")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--global-batch", type=int, default=64,
                   help="samples per step for the whole job (split across ranks)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--out", default="", help="directory for rank-<RANK>.{pt,sha256,json}")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to sleep after each step (fault-injection tests need a longer run)")
    args = p.parse_args()

    env = check_env()
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    print("env ok: rank=%s local_rank=%s world_size=%s local_world_size=%s group_rank=%s "
          "master=%s:%s restart_count=%s" % (
              env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"],
              env["GROUP_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"],
              env["TORCHELASTIC_RESTART_COUNT"]), flush=True)

    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo", init_method="env://")
    assert dist.get_rank() == rank and dist.get_world_size() == world

    # Same initial weights everywhere (DDP also broadcasts rank 0's at construction).
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()

    x, y = make_data(args.steps * args.global_batch, 8, seed=1234 + args.seed)
    # Each rank takes its own contiguous slice of every global batch.
    per_rank = [args.global_batch // world + (1 if r < args.global_batch % world else 0)
                for r in range(world)]
    lo = sum(per_rank[:rank])
    hi = lo + per_rank[rank]

    loss = torch.tensor(0.0)
    for step in range(args.steps):
        b = step * args.global_batch
        xb, yb = x[b + lo:b + hi], y[b + lo:b + hi]
        opt.zero_grad()
        loss = loss_fn(ddp(xb), yb)
        loss.backward()
        opt.step()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if step % args.log_every == 0 or step == args.steps - 1:
            # Mean loss over the job, for the log line.
            l = loss.detach().clone()
            dist.all_reduce(l)
            if rank == 0:
                print("step %d loss %.6f world_size %d" % (step, l.item() / world, world),
                      flush=True)

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        h = hashlib.sha256()
        for k in sorted(sd):
            h.update(sd[k].to(torch.float32).numpy().tobytes())
        digest = h.hexdigest()
        base = os.path.join(args.out, "rank-%d" % rank)
        torch.save(sd, base + ".pt")
        with open(base + ".sha256", "w") as f:
            f.write(digest + "\n")
        with open(base + ".json", "w") as f:
            json.dump({"rank": rank, "world_size": world, "env": env, "sha256": digest,
                       "final_loss": loss.item(), "steps": args.steps}, f, sort_keys=True)
            f.write("\n")

    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("done: %d steps, world_size %d" % (args.steps, world), flush=True)


if __name__ == "__main__":
    main()
