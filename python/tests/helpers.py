"""Shared set-up of the tests: a snapshot directory under /dev/shm that the
test removes, and the check that none is left behind."""
import os
import shutil
import tempfile
import unittest

PREFIX = "gorun-snapshot-test-"
SHM = "/dev/shm"

# The worker environment a test must not inherit from whoever runs it (a
# gorun job, torchrun): each test sets what it needs.
WORKER_ENV = ("GORUN_SNAPSHOT_DIR", "GORUN_SNAPSHOT_STEP", "GORUN_SNAPSHOT_REASON",
              "GORUN_SNAPSHOT_VERIFIED", "RANK", "WORLD_SIZE", "LOCAL_RANK")


class ShmTest(unittest.TestCase):
    """A test with self.dir, a fresh directory under /dev/shm, removed after
    the test (and checked to be gone), and none of WORKER_ENV set."""

    def setUp(self) -> None:
        self._saved_env = {k: os.environ.pop(k) for k in WORKER_ENV if k in os.environ}
        self.dir = tempfile.mkdtemp(prefix=PREFIX, dir=SHM)

    def tearDown(self) -> None:
        for k in WORKER_ENV:
            os.environ.pop(k, None)
        os.environ.update(self._saved_env)
        shutil.rmtree(self.dir)
        self.assertFalse(os.path.exists(self.dir), "left behind in /dev/shm: " + self.dir)
