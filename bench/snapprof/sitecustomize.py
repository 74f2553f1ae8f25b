"""Per-rank timings of gorun.Snapshots inside a real job, for bench/pytorch-chaos.sh.

Put this directory on PYTHONPATH and set SNAPPROF; every worker that gorun starts with snapshots
then prints one line to stderr at exit (in the bench's logs with KEEP=DIR):

    SNAPPROF rank R local L saves N save-blocked B ms (of it wait W ms) crc C ms cpu P ms/step

save-blocked: the mean time save() held the training loop (W of it waiting for the previous
save); crc: the mean wall time of a save's background CRC-32 pass; cpu: the process's CPU time
(every thread) over the saves. SNAPPROF=nocrc replaces the CRC pass by a read of one byte a page
(the pass also brings the slot's pages into the mapping, which later saves copy into), so that a
run shows what the CRC costs; its snapshots carry CRC 0 and do not verify: for measuring only.

    SNAPPROF=1 PYTHONPATH=$PWD/bench/snapprof KEEP=/tmp/pc WAYS=gorun+snapshots PERIOD=100000 \\
      STEPS=40 COST_PAIRS=3 bash bench/pytorch-chaos.sh
    grep -h SNAPPROF /tmp/pc/logs/*.log

It wraps private functions of python/gorun/snapshots.py (Snapshots.save, Snapshots.wait,
_crc32): a change there may need one here. Python imports sitecustomize at start-up, before the
script; this one does nothing unless GORUN_SNAPSHOT_DIR and SNAPPROF are both set.
"""
import atexit
import os
import sys
import time

if os.environ.get("GORUN_SNAPSHOT_DIR") and os.environ.get("SNAPPROF"):
    from gorun import snapshots as _s

    _acc = {"wait": 0.0, "save": 0.0, "crc": 0.0, "n": 0}
    _wait, _save, _crc32 = _s.Snapshots.wait, _s.Snapshots.save, _s._crc32

    def _timed_wait(self: "_s.Snapshots") -> None:
        t = time.perf_counter()
        _wait(self)
        _acc["wait"] += time.perf_counter() - t

    def _timed_save(self: "_s.Snapshots", step: int, state: dict) -> None:
        t = time.perf_counter()
        _save(self, step, state)
        _acc["save"] += time.perf_counter() - t
        _acc["n"] += 1

    def _timed_crc32(m, length, io):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            if os.environ["SNAPPROF"] != "nocrc":
                return _crc32(m, length, io)
            view = memoryview(m.mm)
            try:
                bytes(view[_s._slot.HEADER_SIZE:_s._slot.HEADER_SIZE + length:4096])
            finally:
                view.release()
            return 0
        finally:
            _acc["crc"] += time.perf_counter() - t

    _s.Snapshots.wait, _s.Snapshots.save, _s._crc32 = _timed_wait, _timed_save, _timed_crc32

    @atexit.register
    def _report() -> None:
        n = max(_acc["n"], 1)
        print(f"SNAPPROF rank {os.environ.get('RANK')} local {os.environ.get('LOCAL_RANK')} saves {_acc['n']} "
              f"save-blocked {1000 * _acc['save'] / n:.1f} ms (of it wait {1000 * _acc['wait'] / n:.1f} ms) "
              f"crc {1000 * _acc['crc'] / n:.1f} ms cpu {1000 * time.process_time() / n:.0f} ms/step",
              file=sys.stderr, flush=True)
