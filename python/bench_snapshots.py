#!/usr/bin/env python3
"""Measure gorun snapshots on this machine: CRC-32 MB/s, and save and
restore GB/s beside a plain memcpy (Tensor.copy_) of the same bytes.

    /usr/bin/python3 python/bench_snapshots.py --mb 100 --reps 3

The state is a module of --mb megabytes of float32 parameters (plain
values besides). Times are the median of --reps; save is reported twice:
until save() returns (the CPU copy; the CRC and header go on in the
background) and until the snapshot is complete (save + wait).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gorun  # noqa: E402


def model_of(mb: int) -> torch.nn.Module:
    layers = [torch.nn.Linear(1024, 1024) for _ in range(max(1, mb * 2**20 // (4 * 1025 * 1024)))]
    return torch.nn.Sequential(*layers)


def median(f, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        f()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm")
    args = ap.parse_args()
    model = model_of(args.mb)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gb = nbytes / 1e9
    src = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages
    memcpy = median(lambda: dst.copy_(src), args.reps)
    raw = memoryview(src.view(torch.uint8).numpy())
    t_crc = median(lambda: zlib.crc32(raw), args.reps)

    d = tempfile.mkdtemp(prefix="gorun-snapshot-bench-", dir=args.dir)
    try:
        state = {"model": model, "step": 0}
        snaps = gorun.Snapshots(d, 0)
        snaps.save(0, state)
        snaps.wait()
        step = [0]

        def save_blocking() -> None:
            snaps.wait()
            step[0] += 1
            t0 = time.process_time()
            snaps.save(step[0], state)
            save_blocking.times.append(time.process_time() - t0)
        save_blocking.times = []
        for _ in range(args.reps):
            save_blocking()
        snaps.wait()
        t_save_block = statistics.median(save_blocking.times)

        def save_whole() -> None:
            step[0] += 1
            snaps.save(step[0], state)
            snaps.wait()
        t_save = median(save_whole, args.reps)
        snaps.close()

        fresh = {"model": model_of(args.mb), "step": 0}

        def restore() -> None:
            with gorun.Snapshots(d, 0) as s:
                assert s.restore(fresh) == step[0]
        t_restore = median(restore, args.reps)
    finally:
        shutil.rmtree(d)
    out = {
        "bytes": nbytes, "threads": torch.get_num_threads(),
        "memcpy_GBps": gb / memcpy, "crc32_MBps": nbytes / 1e6 / t_crc,
        "save_returns_GBps": gb / t_save_block, "save_complete_GBps": gb / t_save,
        "restore_GBps": gb / t_restore,
    }
    for k, v in out.items():
        print(f"{k:20s} {v:.3f}" if isinstance(v, float) else f"{k:20s} {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
