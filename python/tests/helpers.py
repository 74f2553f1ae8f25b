"""Shared set-up of the tests: a snapshot directory under /dev/shm that the
test removes, and the check that none is left behind."""
import os
import shutil
import tempfile
import unittest

PREFIX = "gorun-snapshot-test-"
SHM = "/dev/shm"


class ShmTest(unittest.TestCase):
    """A test with self.dir, a fresh directory under /dev/shm, removed after
    the test (and checked to be gone)."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix=PREFIX, dir=SHM)

    def tearDown(self) -> None:
        shutil.rmtree(self.dir)
        self.assertFalse(os.path.exists(self.dir), "left behind in /dev/shm: " + self.dir)
