#!/usr/bin/env python3
"""What a snapshot every step costs the training step of the example's model.

    /usr/bin/python3 python/bench_step_cost.py --model-mb 100 --batch 64 --blocks 6

One process trains examples/pytorch/snapshots.py's model (SGD with momentum,
so the state is twice --model-mb) in blocks of --block steps, alternately
with a gorun snapshot saved after every step and without, so that both see
the same machine (a busy one drifts block by block, not within a block). It
prints the median step time of each kind, their difference as a fraction of
a step, and what one save costs the caller (until it returns) and in all
(until complete), beside a memcpy of the same bytes. JSON on the last line.

Under gorun it saves into the agent's snapshot directory, and the agent
computes the CRCs, as it does for a training job's workers:

    gorun --standalone --nproc-per-node=1 -- /usr/bin/python3 python/bench_step_cost.py
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Dict, List

import torch
import torch.nn as nn

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "examples", "pytorch"))
import gorun  # noqa: E402
import snapshots as example  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-mb", type=float, default=100)
    ap.add_argument("--batch", type=int, default=64, help="samples per step")
    ap.add_argument("--block", type=int, default=5, help="steps per block")
    ap.add_argument("--blocks", type=int, default=6, help="blocks of each kind")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (gorun gives 1 per worker)")
    ap.add_argument("--dir", default="/dev/shm")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = example.model_of(args.model_mb)
    optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = [example.sample(0, i) for i in range(args.batch)]
    x = torch.stack([d[0] for d in data])
    y = torch.stack([d[1] for d in data])

    def train_step() -> None:
        optim.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optim.step()

    train_step()
    state = {"model": model, "optim": optim}
    nbytes = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    src = torch.cat([p.detach().reshape(-1) for p in model.parameters()] * 2)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    dst.copy_(src)
    memcpy = time.perf_counter() - t0
    agent_dir = os.environ.get(gorun.snapshots.ENV_DIR)
    d = agent_dir or tempfile.mkdtemp(prefix="gorun-step-cost-", dir=args.dir)
    times: Dict[bool, List[float]] = {True: [], False: []}
    returns: List[float] = []
    completes: List[float] = []
    try:
        snaps = gorun.Snapshots(d, 0)
        step = 0
        snaps.save(step, state)  # slots reserved and warm
        snaps.wait()
        for b in range(2 * args.blocks):
            saving = b % 2 == 0
            for _ in range(args.block):
                t0 = time.perf_counter()
                train_step()
                if saving:
                    step += 1
                    s0 = time.perf_counter()
                    snaps.save(step, state)
                    returns.append(time.perf_counter() - s0)
                times[saving].append(time.perf_counter() - t0)
            snaps.wait()  # the block's last save does not spill into the next block
        for _ in range(3):
            step += 1
            s0 = time.perf_counter()
            snaps.save(step, state)
            snaps.wait()
            completes.append(time.perf_counter() - s0)
        snaps.close()
    finally:
        if not agent_dir:
            shutil.rmtree(d)
    with_s, without_s = statistics.median(times[True]), statistics.median(times[False])
    out = {
        "state_bytes": nbytes, "batch": args.batch, "threads": args.threads,
        "crc_by": "agent" if os.environ.get(gorun.snapshots.ENV_CRC) and agent_dir else "worker",
        "step_s": without_s, "step_with_snapshot_s": with_s,
        "cost_fraction_of_step": (with_s - without_s) / without_s,
        "save_returns_s": statistics.median(returns), "save_complete_s": statistics.median(completes),
        "save_returns_GBps": nbytes / 1e9 / statistics.median(returns),
        "save_complete_GBps": nbytes / 1e9 / statistics.median(completes),
        "memcpy_GBps": nbytes / 1e9 / memcpy,
    }
    for k, v in out.items():
        print(f"{k:24s} {v:.4f}" if isinstance(v, float) else f"{k:24s} {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
