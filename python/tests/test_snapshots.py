"""Snapshots: round trip, refusals, a save killed half-way, the no-op."""
import contextlib
import io
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import zlib

import torch

import gorun
from gorun import _slot

from .helpers import ShmTest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make(seed: int = 0, out: int = 3):
    """A module, an Adam optimizer, a step scheduler and plain values."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, out))
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)
    return {"model": model, "optim": optim, "sched": sched, "epoch": 0,
            "rng": torch.arange(5), "notes": {"seen": [1, 2]}}


def train(state, steps: int, seed: int = 7) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, 8, generator=g)
        state["optim"].zero_grad()
        state["model"](x).square().sum().backward()
        state["optim"].step()
        state["sched"].step()
        state["epoch"] += 1


def flat(value, path=""):
    """Every leaf of value (a state dict) with its path, in order."""
    if isinstance(value, dict):
        return [x for k in value for x in flat(value[k], f"{path}.{k}")]
    if isinstance(value, (list, tuple)):
        return [x for i, v in enumerate(value) for x in flat(v, f"{path}.{i}")]
    return [(path, value)]


def assert_identical(test, a, b) -> None:
    """a and b have the same leaves, tensors equal bit for bit."""
    la, lb = flat(a), flat(b)
    test.assertEqual([p for p, _ in la], [p for p, _ in lb])
    for (path, x), (_, y) in zip(la, lb):
        if isinstance(x, torch.Tensor):
            test.assertEqual((x.dtype, x.shape), (y.dtype, y.shape), path)
            test.assertTrue(torch.equal(x.reshape(-1).view(torch.uint8),
                                        y.reshape(-1).view(torch.uint8)), path)
        else:
            test.assertEqual(x, y, path)


@contextlib.contextmanager
def patched_env(env):
    """os.environ with env set (a value None: unset), restored after."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def dicts(state):
    return {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in state.items()}


class SnapshotsTest(ShmTest):
    def test_round_trip_is_bit_identical(self) -> None:
        for background in (True, False):
            with self.subTest(background=background):
                for f in os.listdir(self.dir):
                    os.remove(os.path.join(self.dir, f))
                a = make()
                with gorun.Snapshots(self.dir, 0, background=background) as snaps:
                    self.assertIsNone(snaps.restore(a))  # nothing yet
                    for step in range(1, 5):
                        train(a, 1, seed=step)
                        a["notes"]["seen"].append(step)
                        snaps.save(step, a)
                        snaps.wait()
                        # Each step as a restarted worker finds it: steps 1
                        # and 2 were written into a fresh mapping (pwrite),
                        # 3 and 4 into one already touched (a copy).
                        b = make(seed=1)
                        with gorun.Snapshots(self.dir, 0) as again:
                            self.assertEqual(again.restore(b), step)
                        assert_identical(self, dicts(a), dicts(b))
                b = make(seed=1)
                with gorun.Snapshots(self.dir, 0) as snaps:
                    self.assertEqual(snaps.restore(b), 4)
                assert_identical(self, dicts(a), dicts(b))
                # Both go on alike: nothing of the state was left out.
                train(a, 2)
                train(b, 2)
                assert_identical(self, dicts(a), dicts(b))

    def test_restores_the_newer_slot_and_overwrites_the_older(self) -> None:
        a = make()
        with gorun.Snapshots(self.dir, 2, world_size=4) as snaps:
            for step in (10, 11, 12):
                a["epoch"] = step
                snaps.save(step, a)
        # 12 went to the slot of 10.
        steps = sorted(self.header(s).step for s in (0, 1))
        self.assertEqual(steps, [11, 12])
        b = make()
        with gorun.Snapshots(self.dir, 2, world_size=4) as snaps:
            self.assertEqual(snaps.restore(b), 12)
            self.assertEqual(b["epoch"], 12)
            snaps.save(13, b)
        self.assertEqual(sorted(self.header(s).step for s in (0, 1)), [12, 13])

    def test_a_bad_crc_falls_back_to_the_other_slot(self) -> None:
        a = make()
        with gorun.Snapshots(self.dir, 0) as snaps:
            for step in (1, 2):
                a["epoch"] = step
                snaps.save(step, a)
        newest = 0 if self.header(0).step == 2 else 1
        path = os.path.join(self.dir, f"rank-0.slot{newest}")
        with open(path, "r+b") as f:
            f.seek(_slot.HEADER_SIZE + 100)
            byte = f.read(1)
            f.seek(_slot.HEADER_SIZE + 100)
            f.write(bytes([byte[0] ^ 1]))
        b = make()
        with gorun.Snapshots(self.dir, 0) as snaps:
            self.assertEqual(snaps.restore(b), 1)
        self.assertEqual(b["epoch"], 1)

    def test_a_changed_shape_is_refused_naming_the_key(self) -> None:
        with gorun.Snapshots(self.dir, 0) as snaps:
            a = make()
            train(a, 1)
            snaps.save(1, a)
        cases = [
            ("model.2.weight", make(out=5)),
            ("optim", {**make(), "optim": torch.optim.SGD(make()["model"].parameters(), lr=1)}),
            ("extra", {**make(), "extra": 1}),
            ("epoch", {k: v for k, v in make().items() if k != "epoch"}),
        ]
        for key, state in cases:
            with self.subTest(key=key), gorun.Snapshots(self.dir, 0) as snaps:
                before = [p.clone() for p in state["model"].parameters()]
                with self.assertRaises(gorun.StateMismatchError) as cm:
                    snaps.restore(state)
                self.assertIn(key, str(cm.exception))
                for p, q in zip(before, state["model"].parameters()):
                    self.assertTrue(torch.equal(p, q), "a refused restore changed the model")

    def test_too_little_space_names_the_size(self) -> None:
        # 2**40 float32 elements that take no memory: the refusal comes
        # before any byte is copied.
        huge = torch.zeros(1).expand(1 << 40)
        with gorun.Snapshots(self.dir, 0) as snaps:
            with self.assertRaises(gorun.NoSpaceError) as cm:
                snaps.save(1, {"w": huge})
        msg = str(cm.exception)
        self.assertIn(self.dir, msg)
        slot = int(re.search(r"two slots of (\d+) bytes", msg).group(1))
        self.assertGreaterEqual(slot, _slot.HEADER_SIZE + (1 << 42))
        self.assertIn(f"need {2 * slot} bytes more", msg)

    def test_a_save_killed_before_its_header_leaves_the_previous_one(self) -> None:
        script = textwrap.dedent(f"""
            import os, sys, threading, torch
            sys.path.insert(0, {PYTHON_DIR!r})
            import gorun
            from tests.test_snapshots import make, train
            def hook(step):
                if step == 2:
                    print("paused", flush=True)
                    threading.Event().wait()  # until killed
            s = make()
            snaps = gorun.Snapshots({self.dir!r}, 0, _before_header=hook)
            train(s, 1)
            snaps.save(1, s)
            snaps.wait()
            torch.save({{k: v.state_dict() for k, v in s.items() if hasattr(v, "state_dict")}},
                       os.path.join({self.dir!r}, "expected.pt"))
            train(s, 1)
            snaps.save(2, s)
            snaps.wait()
        """)
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            self.assertEqual(line.strip(), "paused")
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait()
            proc.stdout.close()
        self.assertEqual(proc.returncode, -signal.SIGKILL)
        expected = torch.load(os.path.join(self.dir, "expected.pt"))
        b = make(seed=3)
        with gorun.Snapshots(self.dir, 0) as snaps:
            self.assertEqual(snaps.restore(b), 1)
        assert_identical(self, expected, {k: v.state_dict() for k, v in b.items() if hasattr(v, "state_dict")})

    def test_header(self) -> None:
        h = _slot.Header(7, 123, 0xDEADBEEF, _slot.FLAG_REPLICATED, 3, 4)
        raw = _slot.pack(h)
        self.assertEqual(len(raw), 64)
        self.assertEqual(_slot.unpack(raw), h)
        self.assertTrue(_slot.unpack(raw).replicated)
        self.assertEqual(raw[52:], bytes(12))
        for i in range(52):
            torn = bytearray(raw)
            torn[i] ^= 0x10
            self.assertIsNone(_slot.unpack(bytes(torn)), f"byte {i} flipped")

    def test_header_is_zlib_crc32(self) -> None:
        # CRC-32 (IEEE) check value of the catalogue, and the header's own
        # CRC over bytes [0, 48): what Go's crc32.ChecksumIEEE computes.
        self.assertEqual(zlib.crc32(b"123456789"), 0xCBF43926)
        raw = _slot.pack(_slot.Header(1, 2, 3, 0, 0, 1))
        self.assertEqual(struct.unpack("<I", raw[48:52])[0], zlib.crc32(raw[:48]))

    def header(self, slot: int):
        with open(os.path.join(self.dir, f"rank-{self._rank()}.slot{slot}"), "rb") as f:
            return _slot.unpack(f.read(64))

    def _rank(self) -> int:
        names = [n for n in os.listdir(self.dir) if n.startswith("rank-")]
        return int(names[0].split("-")[1].split(".")[0])


class AgreedStepTest(ShmTest):
    """The environment the agent sets after the agreement (spec section 3)."""

    def save_steps(self, *steps: int, rank: int = 0, world: int = 1,
                   replicated: bool = False) -> None:
        a = make()
        with gorun.Snapshots(self.dir, rank, world_size=world, replicated=replicated) as snaps:
            for step in steps:
                a["epoch"] = step
                snaps.save(step, a)

    def test_the_agreed_step_not_the_newest(self) -> None:
        self.save_steps(11, 12)
        b = make(seed=2)
        with patched_env({gorun.ENV_STEP: "11"}), gorun.Snapshots(self.dir, 0) as snaps:
            self.assertEqual(snaps.restore(b), 11)
        self.assertEqual(b["epoch"], 11)

    def test_an_agreed_step_the_slots_lack_is_an_error(self) -> None:
        self.save_steps(11, 12)
        b = make(seed=2)
        with patched_env({gorun.ENV_STEP: "10"}), gorun.Snapshots(self.dir, 0) as snaps:
            with self.assertRaises(gorun.SnapshotError) as cm:
                snaps.restore(b)
        self.assertIn("agreed on step 10", str(cm.exception))
        self.assertIn("[12, 11]", str(cm.exception))
        self.assertEqual(b["epoch"], 0)
        for bad in ("-1", "twelve", ""):
            with self.subTest(step=bad), patched_env({gorun.ENV_STEP: bad}), \
                    gorun.Snapshots(self.dir, 0) as snaps:
                with self.assertRaises(gorun.SnapshotError) as cm:
                    snaps.restore(b)
                self.assertIn(gorun.ENV_STEP, str(cm.exception))

    def test_none_restores_nothing_and_says_why_once(self) -> None:
        self.save_steps(11, 12)
        b = make(seed=2)
        before = {k: v.clone() for k, v in b["model"].state_dict().items()}
        err = io.StringIO()
        reason = "rank 4's snapshots were only on node c (lost)"
        with patched_env({gorun.ENV_STEP: "none", gorun.ENV_REASON: reason}), \
                contextlib.redirect_stderr(err), gorun.Snapshots(self.dir, 0) as snaps:
            self.assertIsNone(snaps.restore(b))
            self.assertIsNone(snaps.restore(b))
        self.assertEqual(err.getvalue(), f"gorun snapshots: not restoring: {reason}; the "
                         "script's own checkpoint is the fallback\n")
        self.assertEqual(b["epoch"], 0)
        for k, v in b["model"].state_dict().items():
            self.assertTrue(torch.equal(before[k], v), k)

    def test_a_step_with_a_reason_says_where_it_comes_from_once(self) -> None:
        self.save_steps(11, 12)
        b = make(seed=2)
        err = io.StringIO()
        reason = "restoring step 11, rank 0 from the durable directory (newest step any rank had: 12; steps redone: 1)"
        with patched_env({gorun.ENV_STEP: "11", gorun.ENV_REASON: reason}), \
                contextlib.redirect_stderr(err), gorun.Snapshots(self.dir, 0) as snaps:
            self.assertEqual(snaps.restore(b), 11)
            self.assertEqual(snaps.restore(b), 11)
        self.assertEqual(err.getvalue(), f"gorun snapshots: {reason}\n")

    def test_verified_skips_the_crc(self) -> None:
        self.save_steps(11, 12)
        # Corrupt step 12's last payload byte: only a CRC can tell.
        slot = next(s for s in (0, 1) if self.header(s).step == 12)
        path = os.path.join(self.dir, f"rank-0.slot{slot}")
        with open(path, "r+b") as f:
            pos = _slot.HEADER_SIZE + self.header(slot).length - 1
            f.seek(pos)
            byte = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([byte ^ 0x80]))
        with patched_env({gorun.ENV_STEP: "12"}), gorun.Snapshots(self.dir, 0) as snaps:
            with self.assertRaises(gorun.SnapshotError) as cm:
                snaps.restore(make())
        self.assertIn("step 12 is corrupt", str(cm.exception))
        b = make()
        with patched_env({gorun.ENV_STEP: "12", gorun.ENV_VERIFIED: "1"}), \
                gorun.Snapshots(self.dir, 0) as snaps:
            self.assertEqual(snaps.restore(b), 12)
        self.assertEqual(b["epoch"], 12)
        # Without an agreed step VERIFIED means nothing: the CRC is checked
        # and the older slot restored.
        with patched_env({gorun.ENV_VERIFIED: "1"}), gorun.Snapshots(self.dir, 0) as snaps:
            self.assertEqual(snaps.restore(make()), 11)

    def test_a_sharded_slot_of_another_world_or_rank_is_refused(self) -> None:
        self.save_steps(5, rank=1, world=2)
        cases = [("another world", 1, 4, "rank 1 of 2"), ("another rank", 0, 2, "rank 1 of 2")]
        for name, rank, world, says in cases:
            with self.subTest(name):
                if rank != 1:  # as if rank 1's files were put under rank 0's name
                    for s in (0, 1):
                        shutil.copy(os.path.join(self.dir, f"rank-1.slot{s}"),
                                    os.path.join(self.dir, f"rank-{rank}.slot{s}"))
                b = make(seed=2)
                for env in ({}, {gorun.ENV_STEP: "5"}):
                    with patched_env(env), gorun.Snapshots(self.dir, rank, world_size=world) as snaps:
                        with self.assertRaises(gorun.SnapshotError) as cm:
                            snaps.restore(b)
                    msg = str(cm.exception)
                    self.assertIn(says, msg)
                    self.assertIn("sharded", msg)
                    self.assertIn(f"rank {rank} of {world}", msg)
                    self.assertEqual(b["epoch"], 0)

    def test_a_replicated_slot_restores_at_any_rank_and_world(self) -> None:
        self.save_steps(5, rank=1, world=2, replicated=True)
        self.assertTrue(self.header(0, rank=1).replicated)
        for s in (0, 1):
            shutil.copy(os.path.join(self.dir, f"rank-1.slot{s}"),
                        os.path.join(self.dir, f"rank-2.slot{s}"))
        b = make(seed=2)
        with patched_env({gorun.ENV_STEP: "5"}), gorun.Snapshots(self.dir, 2, world_size=3) as snaps:
            self.assertEqual(snaps.restore(b), 5)
        self.assertEqual(b["epoch"], 5)

    def header(self, slot: int, rank: int = 0):
        with open(os.path.join(self.dir, f"rank-{rank}.slot{slot}"), "rb") as f:
            return _slot.unpack(f.read(64))


class OutsideGorunTest(ShmTest):
    def test_without_the_variable_it_does_nothing(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != gorun.ENV_DIR}
        env["PYTHONPATH"] = PYTHON_DIR
        script = textwrap.dedent("""
            import os, torch, gorun
            from tests.test_snapshots import make, train
            s = make()
            snaps = gorun.Snapshots()
            assert not snaps.enabled
            before = {k: v.clone() for k, v in s["model"].state_dict().items()}
            assert snaps.restore(s) is None
            assert all(torch.equal(before[k], v) for k, v in s["model"].state_dict().items())
            train(s, 1)
            snaps.save(1, s)
            snaps.close()
            print("no-op")
        """)
        listing = sorted(os.listdir("/dev/shm"))
        out = subprocess.run([sys.executable, "-c", script], env=env, cwd=self.dir,
                             stdout=subprocess.PIPE, check=True, text=True).stdout
        self.assertEqual(out.strip(), "no-op")
        self.assertEqual(os.listdir(self.dir), [])
        # Other processes of the machine come and go in /dev/shm: none of
        # the new entries may be a slot file (what the package writes).
        new = set(os.listdir("/dev/shm")) - set(listing)
        self.assertEqual([n for n in new if n.startswith("rank-")], [])

    def test_rank_and_world_are_checked_only_when_on(self) -> None:
        with patched_env({"RANK": "4", "WORLD_SIZE": "4"}):
            self.assertFalse(gorun.Snapshots().enabled)
            with self.assertRaises(ValueError) as cm:
                gorun.Snapshots(self.dir)
        self.assertIn("rank 4 is not in [0, 4)", str(cm.exception))
        with patched_env({"RANK": "x"}), self.assertRaises(ValueError) as cm:
            gorun.Snapshots(self.dir)
        self.assertIn("RANK='x'", str(cm.exception))

    def test_the_variable_names_the_directory(self) -> None:
        env = {gorun.ENV_DIR: self.dir, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
        with patched_env(env):
            with gorun.Snapshots() as snaps:
                self.assertTrue(snaps.enabled)
                snaps.save(4, {"x": 1})
        # Named by the global rank, not the local one.
        self.assertEqual(sorted(os.listdir(self.dir)), ["rank-3.slot0", "rank-3.slot1"])
        with open(os.path.join(self.dir, "rank-3.slot0"), "rb") as f:
            h = _slot.unpack(f.read(64))
        self.assertEqual((h.step, h.rank, h.world, h.replicated), (4, 3, 4, False))

    def test_a_replicated_state_is_saved_by_local_rank_0_only(self) -> None:
        # DDP on a node of 2 workers, global ranks 2 and 3: the state is the
        # same on both, so one copy is kept; a sharded state is every rank's.
        cases = [  # (replicated, LOCAL_RANK, files written)
            (True, "0", ["rank-2.slot0", "rank-2.slot1"]),
            (True, "1", []),
            (False, "1", ["rank-3.slot0", "rank-3.slot1"]),
        ]
        for replicated, local, want in cases:
            with self.subTest(replicated=replicated, local_rank=local):
                rank = str(2 + int(local))
                with patched_env({gorun.ENV_DIR: self.dir, "RANK": rank, "WORLD_SIZE": "4", "LOCAL_RANK": local}):
                    with gorun.Snapshots(replicated=replicated) as snaps:
                        self.assertEqual(snaps.saves, bool(want))
                        snaps.save(1, {"x": torch.ones(3)})
                self.assertEqual(sorted(os.listdir(self.dir)), want)
                for name in os.listdir(self.dir):
                    os.remove(os.path.join(self.dir, name))


class CudaTest(ShmTest):
    """The GPU path: pinned host buffers, non_blocking copies, a CUDA event.
    Skipped where CUDA is missing (CI: CPU only)."""

    def setUp(self) -> None:
        if not torch.cuda.is_available():
            self.skipTest("needs CUDA")
        super().setUp()

    def test_round_trip_on_the_gpu(self) -> None:
        a = make()
        a["model"].cuda()
        a["optim"] = torch.optim.Adam(a["model"].parameters(), lr=0.01)
        a["sched"] = torch.optim.lr_scheduler.StepLR(a["optim"], step_size=2)
        train_gpu(a, 2)
        with gorun.Snapshots(self.dir, 0) as snaps:
            snaps.save(2, a)
            expected = {k: v.clone() for k, v in a["model"].state_dict().items()}
            moments = {(i, k): v.clone() for i, s in a["optim"].state_dict()["state"].items()
                       for k, v in s.items() if k != "step"}
            train_gpu(a, 1)  # changes the parameters while the copy may be in flight
            snaps.wait()
        b = make(seed=5)
        b["model"].cuda()
        b["optim"] = torch.optim.Adam(b["model"].parameters(), lr=0.01)
        b["sched"] = torch.optim.lr_scheduler.StepLR(b["optim"], step_size=2)
        with gorun.Snapshots(self.dir, 0) as snaps:
            self.assertEqual(snaps.restore(b), 2)
        for k, v in b["model"].state_dict().items():
            self.assertEqual(v.device.type, "cuda")
            self.assertTrue(torch.equal(v, expected[k]), k)
        # The optimizer's state made on the GPU (read through the staging
        # buffers), where load_state_dict leaves it.
        got = {(i, k): v for i, s in b["optim"].state_dict()["state"].items()
               for k, v in s.items() if k != "step"}
        self.assertEqual(got.keys(), moments.keys())
        for key, v in got.items():
            self.assertEqual(v.device.type, "cuda", key)
            self.assertTrue(torch.equal(v, moments[key]), key)


def train_gpu(state, steps: int) -> None:
    g = torch.Generator().manual_seed(11)
    for _ in range(steps):
        x = torch.randn(4, 8, generator=g).cuda()
        state["optim"].zero_grad()
        state["model"](x).square().sum().backward()
        state["optim"].step()
        state["sched"].step()
