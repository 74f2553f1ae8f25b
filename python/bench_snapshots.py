#!/usr/bin/env python3
"""Measure gorun snapshots on this machine: CRC-32 (zlib) GB/s, and save and
restore GB/s beside a plain memcpy (Tensor.copy_) of the same bytes.

    /usr/bin/python3 python/bench_snapshots.py --mb 100 --reps 5
    python3 python/bench_snapshots.py --mb 1024 --device cuda --wall   # on a GPU

The state is a module of --mb megabytes of float32 parameters (plain
values besides). Times are CPU seconds of the process (time.process_time:
steadier than the wall clock on a shared machine, and they count the
background thread's work), the median of --reps. Save is reported twice:
until save() returns (the copy into the slot; the CRC and the header go on
in the background) and until the snapshot is complete (save + wait), both
in steady state (the slots already mapped and touched), and for the first
save into each slot of a restarted worker (first_save: the files there, the
pages not yet mapped). Restore is reported with the CRC checked (GORUN_SNAPSHOT_STEP
unset) and with GORUN_SNAPSHOT_VERIFIED=1 (the agent checked it), into a
model built beforehand as a script builds it. With --device cuda the model
is on the GPU, memcpy is the device-to-host copy into pinned memory, and
--wall should be given (CPU time does not count the GPU's copies).

--optim adds an Adam optimizer after one step to the state (its exp_avg and
exp_avg_sq: three times the model's bytes in all), restored into a fresh
Adam each time, as a restarted worker has it; the GB/s count every byte of
the state.

Beside memcpy, the ceilings of a restore's reads from the tmpfs: the slot
read with preadv into a touched buffer of its size (one thread, and in
pieces on the threads a restore uses), into a new torch.empty, and into a
new private mapping with huge pages asked for (what restore uses for the
tensors it makes on the CPU).
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


CLOCK = [time.process_time]


def median(f, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = CLOCK[0]()
        f()
        times.append(CLOCK[0]() - t0)
    return statistics.median(times)


def stepped_adam(model: torch.nn.Module) -> torch.optim.Optimizer:
    """An Adam optimizer of model after one step (its state made)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    for p in model.parameters():
        p.grad = None
    return opt


def read_ceilings(path: str, reps: int) -> dict:
    """Seconds (the median of reps) to read the file at path whole, with
    preadv, into: a touched buffer, on one thread and on the threads of a
    restore (gorun's pool); a new torch.empty; a new mapping with huge
    pages asked for (gorun's _new_cpu).
    And "bytes": the file's size."""
    n = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    pool = gorun._parallel.Pool()
    try:
        touched = torch.ones(n, dtype=torch.uint8)
        view = gorun.snapshots._memory(touched)

        def one_thread(v) -> None:
            done = 0
            while done < n:
                done += os.preadv(fd, [v[done:]], done)

        def new(make) -> None:
            t = make()
            assert pool.pread(fd, gorun.snapshots._memory(t), 0) == n
        return {
            "bytes": n,
            "tmpfs_read_1thread": median(lambda: one_thread(view), reps),
            "tmpfs_read": median(lambda: pool.pread(fd, view, 0), reps),
            "tmpfs_read_new_empty": median(
                lambda: new(lambda: torch.empty(n, dtype=torch.uint8)), reps),
            "tmpfs_read_new_huge": median(
                lambda: new(lambda: gorun.snapshots._new_cpu(n)), reps),
        }
    finally:
        pool.close()
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--device", default="cpu", help="where the model lives: cpu or cuda")
    ap.add_argument("--wall", action="store_true",
                    help="time with the wall clock (a quiet machine; needed for cuda)")
    ap.add_argument("--optim", action="store_true",
                    help="an Adam optimizer's state too, restored into a fresh optimizer")
    args = ap.parse_args()
    if args.wall:
        CLOCK[0] = time.perf_counter
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for k in ("GORUN_SNAPSHOT_STEP", "GORUN_SNAPSHOT_VERIFIED", "RANK", "WORLD_SIZE"):
        os.environ.pop(k, None)
    model = model_of(args.mb).to(device)
    state = {"model": model, "step": 0}
    if args.optim:
        state["optim"] = stepped_adam(model)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model_gb = nbytes / 1e9  # what memcpy and crc32 are timed on
    if args.optim:
        nbytes *= 3  # exp_avg and exp_avg_sq beside the parameters
    gb = nbytes / 1e9
    src = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=device.type == "cuda")
    dst.copy_(src)  # touch the pages
    # memcpy: a CPU copy; for cuda, the device-to-host copy into pinned memory.
    memcpy = median(lambda: (dst.copy_(src), sync()), args.reps)
    src = dst
    raw = src.view(torch.uint8)
    view = gorun.snapshots._memory(raw)
    t_crc = median(lambda: zlib.crc32(view), args.reps)

    d = tempfile.mkdtemp(prefix="gorun-snapshot-bench-", dir=args.dir)
    try:
        step = [2]
        with gorun.Snapshots(d, 0) as snaps:  # the slot files made
            snaps.save(1, state)
            snaps.save(2, state)
        snaps = gorun.Snapshots(d, 0)  # a restarted worker: the files there, not mapped
        first = []
        for _ in range(2):  # the first save into each slot
            step[0] += 1
            t0 = CLOCK[0]()
            snaps.save(step[0], state)
            first.append(CLOCK[0]() - t0)
            snaps.wait()

        def save_blocking() -> None:
            snaps.wait()
            step[0] += 1
            t0 = CLOCK[0]()
            snaps.save(step[0], state)
            save_blocking.times.append(CLOCK[0]() - t0)
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
        ceilings = read_ceilings(snaps.path(0), args.reps)

        fresh = {"model": model_of(args.mb).to(device), "step": 0}

        def restore() -> float:
            if args.optim:  # a restarted worker's: no state yet
                fresh["optim"] = torch.optim.Adam(fresh["model"].parameters(), lr=1e-3)
            t0 = CLOCK[0]()
            with gorun.Snapshots(d, 0) as s:
                assert s.restore(fresh) == step[0]
            sync()
            return CLOCK[0]() - t0
        t_restore = statistics.median(restore() for _ in range(args.reps))
        os.environ["GORUN_SNAPSHOT_STEP"] = str(step[0])
        os.environ["GORUN_SNAPSHOT_VERIFIED"] = "1"
        t_restore_verified = statistics.median(restore() for _ in range(args.reps))
        for a, b in zip(model.parameters(), fresh["model"].parameters()):
            assert torch.equal(a, b)
        if args.optim:
            saved, got = state["optim"].state_dict()["state"], fresh["optim"].state_dict()["state"]
            assert saved.keys() == got.keys()
            for i in saved:
                for k in ("exp_avg", "exp_avg_sq"):
                    assert got[i][k].device == saved[i][k].device, (i, k)
                    assert torch.equal(got[i][k], saved[i][k]), (i, k)
    finally:
        shutil.rmtree(d)
    slot_gb = ceilings.pop("bytes") / 1e9
    out = {
        "bytes": nbytes, "device": args.device, "optim": args.optim,
        "threads": torch.get_num_threads(), "clock": "wall" if args.wall else "cpu",
        "torch": torch.__version__, "loadavg": os.getloadavg()[0],
        "memcpy_GBps": model_gb / memcpy, "crc32_GBps": model_gb / t_crc,
        **{k + "_GBps": slot_gb / v for k, v in ceilings.items()},
        "first_save_returns_GBps": gb / max(first),
        "save_returns_GBps": gb / t_save_block, "save_complete_GBps": gb / t_save,
        "restore_GBps": gb / t_restore, "restore_verified_GBps": gb / t_restore_verified,
        "restore_verified_of_memcpy": gb / t_restore_verified / (model_gb / memcpy),
    }
    for k, v in out.items():
        print(f"{k:24s} {v:.3f}" if isinstance(v, float) else f"{k:24s} {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
