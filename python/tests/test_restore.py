"""Where a restore puts what has no tensor to be read into: an optimizer's
state on its parameter's device, other new CPU tensors in one mapping with
huge pages asked for."""
import os
import subprocess
import sys
import textwrap
import unittest
from typing import Dict, Tuple

import torch

import gorun
from gorun import snapshots

from .helpers import ShmTest
from .test_snapshots import PYTHON_DIR, assert_identical, dicts, make, train

M = snapshots._Missing


def mapping_of(address: int) -> Dict[str, str]:
    """The /proc/self/smaps fields of the mapping holding address."""
    fields: Dict[str, str] = {}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                if inside:
                    break
                inside = lo <= address < hi
            elif inside:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
    return fields


class StateDevicesTest(unittest.TestCase):
    def test_table(self) -> None:
        # "meta" stands in for a GPU: only the parameters' .device is read.
        cpu = torch.zeros(1)
        gpu = torch.empty(1, device="meta")
        adam = {"state": {0: {"step": M(0, "float32", ()), "exp_avg": M(1, "float32", (1,)),
                              "exp_avg_sq": M(2, "float32", (1,))},
                          1: {"step": M(3, "float32", ()), "exp_avg": M(4, "float32", (1,))}},
                "param_groups": [{"params": [0], "lr": 0.1}, {"params": [1], "lr": 0.2}]}
        cases: Tuple[Tuple[str, object, list, dict], ...] = (
            ("two groups, step left where it was", adam, [gpu, cpu],
             {1: gpu.device, 2: gpu.device, 4: cpu.device}),
            ("the saved indices name the places, not the keys' order",
             {"state": {7: {"m": M(0, "float32", (1,))}, 3: {"m": M(1, "float32", (1,))}},
              "param_groups": [{"params": [3, 7]}]},
             [cpu, gpu], {0: gpu.device, 1: cpu.device}),
            ("an index without a parameter",
             {"state": {5: {"m": M(0, "float32", (1,))}}, "param_groups": [{"params": [0]}]},
             [gpu], {}),
            ("a value that is not a tensor, a nested one",
             {"state": {0: {"n": 3, "l": [M(0, "float32", (1,))]}},
              "param_groups": [{"params": [0]}]}, [gpu], {}),
            ("no optimizer layout", {"state": [M(0, "float32", (1,))]}, [gpu], {}),
            ("no param_groups", {"state": {0: {"m": M(0, "float32", (1,))}}}, [gpu], {}),
            ("params not a list", {"state": {0: {"m": M(0, "float32", (1,))}},
                                   "param_groups": [{"params": 0}]}, [gpu], {}),
            ("not a mapping", [M(0, "float32", (1,))], [gpu], {}),
        )
        for name, saved, params, want in cases:
            with self.subTest(name):
                self.assertEqual(snapshots._state_devices(saved, params), want)

    def test_the_parameters_in_state_dict_order(self) -> None:
        a, b, c = (torch.nn.Parameter(torch.zeros(1)) for _ in range(3))
        opt = torch.optim.SGD([{"params": [b, c]}, {"params": [a], "lr": 1.0}], lr=0.1)
        got = snapshots._params(opt)
        self.assertEqual([id(p) for p in got], [id(b), id(c), id(a)])
        self.assertEqual(opt.state_dict()["param_groups"][1]["params"], [2])


class NewCpuTest(ShmTest):
    def test_large_ones_in_a_huge_page_mapping_of_their_own(self) -> None:
        big = snapshots._new_cpu(5 << 20)
        self.assertEqual((big.numel(), big.storage_offset()), (5 << 20, 0))
        self.assertEqual(len(big.storage()), 5 << 20)  # a deepcopy copies it alone
        self.assertEqual(big.data_ptr() % snapshots._HUGE, 0)
        flags = mapping_of(big.data_ptr())["VmFlags"].split()
        self.assertIn("hg", flags)  # madvise(MADV_HUGEPAGE) took
        self.assertNotIn("sh", flags)  # private: shmem would get no huge pages
        big.fill_(7)
        small = snapshots._new_cpu(100)
        self.assertEqual(small.numel(), 100)
        self.assertNotIn("hg", mapping_of(small.data_ptr()).get("VmFlags", "").split())

    def test_a_restores_new_cpu_tensors_have_huge_pages(self) -> None:
        a = make()
        train(a, 2)
        a["big"] = torch.arange(1 << 20, dtype=torch.float64)
        with gorun.Snapshots(self.dir, 0) as snaps:
            snaps.save(2, a)
        b = make(seed=3)
        b["big"] = None
        with gorun.Snapshots(self.dir, 0) as snaps:
            self.assertEqual(snaps.restore(b), 2)
        assert_identical(self, dicts(a), dicts(b))
        self.assertIn("hg", mapping_of(b["big"].data_ptr())["VmFlags"].split())
        train(a, 3)
        train(b, 3)
        assert_identical(self, dicts(a), dicts(b))


def make_big(seed: int):
    """A model with a 4 MiB weight, Adam and a scheduler (make's keys)."""
    state = make(seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 1024), torch.nn.Linear(1024, 1024),
                                torch.nn.Linear(1024, 3))
    state["model"] = model
    state["optim"] = torch.optim.Adam(model.parameters(), lr=0.01)
    state["sched"] = torch.optim.lr_scheduler.StepLR(state["optim"], step_size=2, gamma=0.5)
    return state


class OptimizerTest(ShmTest):
    def test_its_state_is_the_tensors_read_and_training_goes_on_alike(self) -> None:
        a = make_big(0)
        train(a, 2)
        with gorun.Snapshots(self.dir, 0) as snaps:
            snaps.save(2, a)
        b = make_big(1)
        with gorun.Snapshots(self.dir, 0) as snaps:
            self.assertEqual(snaps.restore(b), 2)
        assert_identical(self, dicts(a), dicts(b))
        weight = b["model"][1].weight
        for name in ("exp_avg", "exp_avg_sq"):
            t = b["optim"].state[weight][name]
            # read into a mapping of ours, not copied by load_state_dict
            self.assertIn("hg", mapping_of(t.data_ptr())["VmFlags"].split(), name)
            self.assertEqual(t.stride(), (1024, 1), name)
        train(a, 3)
        train(b, 3)
        assert_identical(self, dicts(a), dicts(b))

    def test_one_that_loads_its_own_way_gets_the_state_as_it_is(self) -> None:
        seen = []

        class Mine(torch.optim.Adam):
            def load_state_dict(self, state_dict):  # type: ignore[override]
                seen.extend(t.stride() for s in state_dict["state"].values()
                            for t in s.values() if t.dim() == 2)
                super().load_state_dict(state_dict)

        a = make_big(0)
        a["optim"] = Mine(a["model"].parameters(), lr=0.01)
        a["sched"] = torch.optim.lr_scheduler.StepLR(a["optim"], step_size=2, gamma=0.5)
        train(a, 2)
        with gorun.Snapshots(self.dir, 0) as snaps:
            snaps.save(2, a)
        b = make_big(1)
        b["optim"] = Mine(b["model"].parameters(), lr=0.01)
        b["sched"] = torch.optim.lr_scheduler.StepLR(b["optim"], step_size=2, gamma=0.5)
        with gorun.Snapshots(self.dir, 0) as snaps:
            self.assertEqual(snaps.restore(b), 2)
        self.assertNotIn((0, 0), seen)  # no placeholder reached it
        self.assertTrue(seen)
        train(a, 2)
        train(b, 2)
        assert_identical(self, dicts(a), dicts(b))


class NoHugePagesTest(ShmTest):
    def test_a_process_without_huge_pages_restores_alike(self) -> None:
        # PR_SET_THP_DISABLE (41): no huge page for this process, whatever
        # it asks; the restore still completes, bit-identical.
        script = textwrap.dedent(f"""
            import ctypes, sys, torch
            sys.path.insert(0, {PYTHON_DIR!r})
            assert ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0) == 0
            import gorun
            from tests.test_snapshots import make, train
            from tests.test_restore import mapping_of
            a = make(); train(a, 2); a["big"] = torch.arange(1 << 20, dtype=torch.float64)
            with gorun.Snapshots({self.dir!r}, 0) as s:
                s.save(2, a)
            b = make(seed=3); b["big"] = None
            with gorun.Snapshots({self.dir!r}, 0) as s:
                assert s.restore(b) == 2
            assert torch.equal(a["big"], b["big"])
            print(mapping_of(b["big"].data_ptr())["AnonHugePages"])
        """)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "0 kB")


if __name__ == "__main__":
    unittest.main()
