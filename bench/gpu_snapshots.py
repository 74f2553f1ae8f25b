#!/usr/bin/env python3
"""Measure gorun snapshots of a state that lives on a CUDA device.

    python3 bench/gpu_snapshots.py --mb 1024 --dir /dev/shm

The state is a model of --mb megabytes of float32 parameters on the device
and its SGD optimizer with momentum (as many bytes again), so the snapshot
holds twice --mb. It prints, beside this card's copy-engine figures (one
device-to-host and one host-to-device copy of the same bytes into pinned
memory, timed with CUDA events) and a host memcpy:

- save_returns: how long save() keeps the caller (it only queues the
  device-to-host copies);
- save_complete: save() until the snapshot is complete (the copies, the
  write into the slot file, its CRC and its header);
- step and step_with_save: a training step alone, and a step during which
  the previous step's snapshot completes in the background (the cost of a
  snapshot every step is their difference);
- restore: a fresh process's work to load the snapshot back onto the device,
  checked bit for bit against the saved state.

With --device cpu it runs on the CPU (a dry run of the script). Times are
medians of --reps; JSON on the last line.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gorun  # noqa: E402

WIDTH = 4096


def model_of(mb: int, device: torch.device) -> torch.nn.Module:
    """Linear layers of WIDTH x WIDTH on device, about mb megabytes."""
    per_layer = (WIDTH * WIDTH + WIDTH) * 4
    n = max(1, round(mb * 2**20 / per_layer))
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, device=device) for _ in range(n)])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_wall(f: Callable[[], None], reps: int, device: torch.device) -> float:
    times: List[float] = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        f()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_engine(nbytes: int, reps: int, device: torch.device) -> Dict[str, float]:
    """GB/s of one device-to-host and one host-to-device copy of nbytes
    between the device and pinned memory, and of a host memcpy."""
    out: Dict[str, float] = {}
    host = torch.empty(nbytes, dtype=torch.uint8)
    host2 = torch.empty(nbytes, dtype=torch.uint8)
    host.fill_(1)
    host2.fill_(2)
    out["host_memcpy_GBps"] = nbytes / 1e9 / median_wall(lambda: host2.copy_(host), reps, device)
    if device.type != "cuda":
        return out
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    pinned = torch.empty(nbytes, dtype=torch.uint8).pin_memory()

    def timed(f: Callable[[], None]) -> float:
        ms = []
        for _ in range(reps + 1):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        return nbytes / 1e6 / statistics.median(ms[1:])

    out["copy_engine_d2h_GBps"] = timed(lambda: pinned.copy_(dev, non_blocking=True))
    out["copy_engine_h2d_GBps"] = timed(lambda: dev.copy_(pinned, non_blocking=True))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="model megabytes (the state is twice that)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = model_of(args.mb, device)
    optim = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(args.batch, WIDTH, device=device)

    def train_step() -> None:
        optim.zero_grad()
        model(x).square().mean().backward()
        optim.step()

    train_step()  # the momentum buffers exist from here on
    state = {"model": model, "optim": optim, "step": 0}
    nbytes = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    gb = nbytes / 1e9
    out: Dict[str, object] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "state_bytes": nbytes,
    }
    out.update(copy_engine(nbytes, args.reps, device))

    d = tempfile.mkdtemp(prefix="gorun-gpu-snapshots-", dir=args.dir)
    try:
        snaps = gorun.Snapshots(d)
        step = [0]

        def save_complete() -> None:
            step[0] += 1
            snaps.save(step[0], state)
            snaps.wait()

        save_complete()  # pinned buffers and slot files made once
        returns: List[float] = []
        completes: List[float] = []
        for _ in range(args.reps):
            sync(device)
            t0 = time.perf_counter()
            step[0] += 1
            snaps.save(step[0], state)
            returns.append(time.perf_counter() - t0)
            snaps.wait()
            completes.append(time.perf_counter() - t0)
        out["save_returns_s"] = statistics.median(returns)
        out["save_complete_s"] = statistics.median(completes)
        out["save_complete_GBps"] = gb / out["save_complete_s"]

        t_step = median_wall(train_step, args.reps, device)

        def step_with_save() -> None:
            step[0] += 1
            snaps.save(step[0], state)
            train_step()
            snaps.wait()

        t_both = median_wall(step_with_save, args.reps, device)
        out["step_s"] = t_step
        out["step_with_save_s"] = t_both
        out["snapshot_cost_fraction_of_step"] = (t_both - t_step) / t_step
        save_complete()  # the state as it is now, to compare the restore with
        last = step[0]
        snaps.close()

        fresh = model_of(args.mb, device)
        fresh_optim = torch.optim.SGD(fresh.parameters(), lr=1e-3, momentum=0.9)
        fresh_state = {"model": fresh, "optim": fresh_optim, "step": 0}
        sync(device)
        t0 = time.perf_counter()
        with gorun.Snapshots(d) as s:
            got = s.restore(fresh_state)
        sync(device)
        t_restore = time.perf_counter() - t0
        assert got == last, f"restored step {got}, saved {last}"
        same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
        mom = [optim.state[p]["momentum_buffer"] for p in model.parameters()]
        fresh_mom = [fresh_optim.state[p]["momentum_buffer"] for p in fresh.parameters()]
        same = same and all(torch.equal(a, b) for a, b in zip(mom, fresh_mom))
        on_device = all(p.device.type == device.type for p in fresh.parameters()) and all(m.device.type == device.type for m in fresh_mom)
        out["restore_s"] = t_restore
        out["restore_GBps"] = gb / t_restore
        out["restored_bit_identical"] = bool(same)
        out["restored_on_device"] = bool(on_device)
    finally:
        shutil.rmtree(d)
    for k, v in out.items():
        print(f"{k:34s} {v:.4f}" if isinstance(v, float) else f"{k:34s} {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
