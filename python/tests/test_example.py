"""examples/pytorch/snapshots.py under plain python: a run stopped at step 3
and started again goes on from its snapshot and ends bit-identical to a run
that never stopped; without GORUN_SNAPSHOT_DIR it snapshots nothing; with
snapshots off, a run stopped after a checkpoint goes on from the newest
checkpoint and ends bit-identical too."""
import os
import socket
import subprocess
import sys
import tempfile
from typing import Callable, Dict, Optional

import torch

from .helpers import ShmTest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                      "examples", "pytorch", "snapshots.py")


class ExampleTest(ShmTest):
    """Each fault-free reference (5 steps of one process, 6 of a DDP job of
    3) runs once for every test that compares with it: a run is mostly
    python and torch starting."""

    _refs: Dict[str, str] = {}
    _refs_dir: Optional[tempfile.TemporaryDirectory] = None

    @classmethod
    def tearDownClass(cls) -> None:
        if cls._refs_dir is not None:
            cls._refs_dir.cleanup()
            cls._refs_dir, cls._refs = None, {}

    def reference(self, name: str, run: Callable[[str], object]) -> str:
        """The path of reference name, which run(path) writes the first time."""
        cls = type(self)
        if name not in cls._refs:
            if cls._refs_dir is None:
                cls._refs_dir = tempfile.TemporaryDirectory()
            path = os.path.join(cls._refs_dir.name, name + ".pt")
            run(path)
            cls._refs[name] = path
        return cls._refs[name]

    def straight(self) -> str:
        """The model of 5 steps of one process, no snapshots."""
        def run(out: str) -> None:
            self.assertIn("step 5 loss", self.run_script(5, out, snapshots=False))
        return self.reference("straight", run)

    def straight_ddp(self) -> str:
        """The model of 6 steps of a DDP job of 3 plain processes."""
        return self.reference("straight-ddp", lambda out: self.run_ddp(6, out))

    def run_script(self, steps: int, out: str, snapshots: bool, *extra: str) -> str:
        env = {k: v for k, v in os.environ.items()
               if k not in ("GORUN_SNAPSHOT_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
        if snapshots:
            env["GORUN_SNAPSHOT_DIR"] = self.dir
        return subprocess.run(
            [sys.executable, SCRIPT, "--model-mb", "1", "--steps", str(steps), "--out", out, *extra],
            env=env, stdout=subprocess.PIPE, check=True, text=True).stdout

    def test_restarted_run_ends_bit_identical(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            straight, resumed = self.straight(), os.path.join(tmp, "b.pt")
            self.assertEqual(os.listdir(self.dir), [])
            self.run_script(3, resumed, snapshots=True)
            out = self.run_script(5, resumed, snapshots=True)
            lines = out.splitlines()
            self.assertEqual(lines[0], "restored step 3")
            self.assertEqual([line.split()[1] for line in lines[1:]], ["4", "5"])
            a, b = torch.load(straight), torch.load(resumed)
            self.assertEqual(list(a), list(b))
            for k in a:
                self.assertTrue(torch.equal(a[k], b[k]), k)

    def test_save_blocks_saves_every_other_block(self) -> None:
        """--save-blocks 2 (the bench's cost runs): saves after steps 1-2 and
        5-6, none after 3-4, and each step line carries rank 0's CPU seconds,
        growing."""
        with tempfile.TemporaryDirectory() as tmp:
            for steps, newest in ((4, 2), (5, 5)):
                for name in os.listdir(self.dir):
                    os.unlink(os.path.join(self.dir, name))
                out = self.run_script(steps, os.path.join(tmp, "m.pt"), True, "--save-blocks", "2")
                cpu = [float(line.split()[5]) for line in out.splitlines() if line.startswith("step ")]
                self.assertEqual(len(cpu), steps, out)
                self.assertEqual(cpu, sorted(cpu), out)
                self.assertEqual(self.run_script(steps + 1, os.path.join(tmp, "n.pt"), True).splitlines()[0],
                                 f"restored step {newest}", f"{steps} steps in blocks of 2")

    def test_checkpoint_resume_ends_bit_identical(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            straight, resumed = self.straight(), os.path.join(tmp, "b.pt")
            ckpt = os.path.join(tmp, "ckpt")
            # Stopped at step 3: its newest checkpoint is step 2's, so step 3 is trained again.
            out = self.run_script(3, resumed, False, "--ckpt-dir", ckpt, "--ckpt-every", "2")
            self.assertEqual(os.listdir(ckpt), ["ckpt-00000002.pt"])
            self.assertEqual(out.splitlines()[0].split()[:2], ["step", "1"])
            out = self.run_script(5, resumed, False, "--ckpt-dir", ckpt, "--ckpt-every", "2")
            lines = out.splitlines()
            self.assertEqual(lines[0], "restored step 2 from checkpoint " + os.path.join(ckpt, "ckpt-00000002.pt"))
            self.assertEqual([line.split()[1] for line in lines[1:]], ["3", "4", "5"])
            self.assertEqual(os.listdir(ckpt), ["ckpt-00000004.pt"])  # the older one removed, no temporary left
            self.assertEqual(os.listdir(self.dir), [])
            a, b = torch.load(straight), torch.load(resumed)
            self.assertEqual(list(a), list(b))
            for k in a:
                self.assertTrue(torch.equal(a[k], b[k]), k)

    def run_ddp(self, steps: int, out: str, *extra: str) -> None:
        """The script as a DDP job of 3 plain python processes (gloo on
        loopback), of 2 layers: with 2 ranks every sum is the same whatever
        its order, and DDP's rebuilt buckets split a model of 2 layers
        otherwise than its first, so only 3 ranks and 2 layers show a
        summation order that changed."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for rank in range(3):
            env = {k: v for k, v in os.environ.items() if k != "GORUN_SNAPSHOT_DIR"}
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="3", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(
                [sys.executable, SCRIPT, "--model-mb", "2", "--steps", str(steps), "--out", out, *extra],
                env=env, stdout=subprocess.DEVNULL))
        self.assertEqual([p.wait() for p in procs], [0, 0, 0])

    def test_ddp_checkpoint_resume_ends_bit_identical(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            straight, resumed = self.straight_ddp(), os.path.join(tmp, "b.pt")
            ckpt = os.path.join(tmp, "ckpt")
            self.run_ddp(3, resumed, "--ckpt-dir", ckpt, "--ckpt-every", "2")
            self.run_ddp(6, resumed, "--ckpt-dir", ckpt, "--ckpt-every", "2")
            a, b = torch.load(straight), torch.load(resumed)
            self.assertEqual(list(a), list(b))
            for k in a:
                self.assertTrue(torch.equal(a[k], b[k]), k)

    def test_checkpoint_every_needs_a_directory(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            env = {k: v for k, v in os.environ.items() if k not in ("GORUN_SNAPSHOT_DIR", "RANK")}
            r = subprocess.run([sys.executable, SCRIPT, "--ckpt-every", "2", "--out", os.path.join(tmp, "x.pt")],
                               env=env, stderr=subprocess.PIPE, text=True)
            self.assertEqual(r.returncode, 2)
            self.assertIn("--ckpt-every needs --ckpt-dir", r.stderr)

    def test_under_torchrun_snapshots_do_nothing(self) -> None:
        """torchrun (Debian's torch.distributed.run) sets RANK, WORLD_SIZE and
        the rest but no GORUN_SNAPSHOT_DIR: the script trains, its snapshot
        calls do nothing (nothing restored, no slot file in /dev/shm) and it
        ends as the same job of plain processes does."""
        with tempfile.TemporaryDirectory() as tmp:
            plain, torchrun = self.straight_ddp(), os.path.join(tmp, "b.pt")
            before = set(os.listdir("/dev/shm"))
            env = {k: v for k, v in os.environ.items() if k != "GORUN_SNAPSHOT_DIR"}
            env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
            # --redirects/--tee: torch 1.13's torchrun under Python 3.11 crashes at start without them.
            r = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3",
                 "--redirects", "9:1", "--tee", "9:1", "--log_dir", os.path.join(tmp, "logs"),
                 SCRIPT, "--model-mb", "2", "--steps", "6", "--out", torchrun],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout[-2000:])
            self.assertIn("step 6 loss", r.stdout)
            self.assertNotIn("restored", r.stdout)
            self.assertEqual([n for n in set(os.listdir("/dev/shm")) - before if n.startswith("rank-")], [])
            a, b = torch.load(plain), torch.load(torchrun)
            self.assertEqual(list(a), list(b))
            for k in a:
                self.assertTrue(torch.equal(a[k], b[k]), k)
