"""gorun/_warm.py: a warm worker (a real interpreter started as the agent
starts it, with a real socket pair as its channel) preloads torch, says it
is ready, and on its exec line becomes the script as `python script.py`
would run it: the environment it was given and no other, the script's argv,
sys.path[0] and __name__, its exit status, and the channel left to it."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import unittest
from typing import List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
WARM = os.path.join(HERE, "..", "gorun", "_warm.py")

# What the script reports: everything a cold start would have set.
SCRIPT = textwrap.dedent("""\
    import json, os, sys
    preloaded = "torch" in sys.modules
    fd = int(os.environ["GORUN_HEARTBEAT_FD"])
    os.write(fd, b"beat from the script\\n")
    comm = open("/proc/self/comm").read().strip()
    print(json.dumps({"comm": comm, "name": __name__, "argv": sys.argv, "path0": sys.path[0], "file": __file__,
                      "env": dict(os.environ), "preloaded": preloaded}), flush=True)
    sys.exit(int(os.environ.get("EXIT", "0")))
    """)


class WarmWorkerTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.script = os.path.join(self.dir.name, "train.py")
        with open(self.script, "w") as f:
            f.write(SCRIPT)

    def start(self, argv: List[str]) -> Tuple[subprocess.Popen, socket.socket]:
        agent, worker = socket.socketpair()
        self.fd = worker.fileno()  # pass_fds keeps the number in the child
        env = {"PATH": os.environ.get("PATH", ""), "GORUN_HEARTBEAT_FD": str(worker.fileno()),
               "LEFT_FROM_THE_START": "1"}
        p = subprocess.Popen([sys.executable, "-u", WARM] + argv, env=env, pass_fds=(worker.fileno(),),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.dir.name)
        worker.close()
        self.proc = p
        agent.settimeout(120)
        self.addCleanup(agent.close)
        return p, agent

    def comm(self, p: subprocess.Popen) -> str:
        with open(f"/proc/{p.pid}/comm") as f:
            return f.read().strip()

    def read_line(self, agent: socket.socket) -> bytes:
        line = b""
        while not line.endswith(b"\n"):
            chunk = agent.recv(1)
            if not chunk:
                break
            line += chunk
        return line

    def exec_(self, agent: socket.socket, env: List[str], extra: Optional[bytes] = None) -> None:
        self.assertEqual(self.read_line(agent), b"ready\n")
        self.assertEqual(self.comm(self.proc), "gorun-warm", "waiting, it goes by gorun-warm")
        agent.sendall(b"exec " + json.dumps({"env": env}).encode() + b"\n" + (extra or b""))

    def test_becomes_the_script_with_the_environment_it_is_given(self) -> None:
        p, agent = self.start([self.script, "--steps", "3"])
        env = ["GORUN_HEARTBEAT_FD=%d" % self.fd, "RANK=3", "EXIT=7", "PATH=" + os.environ["PATH"]]
        self.exec_(agent, env)
        self.assertEqual(self.read_line(agent), b"beat from the script\n", "the channel is the script's")
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 7, err)
        got = json.loads(out)
        self.assertEqual(got["name"], "__main__")
        self.assertEqual(got["argv"], [self.script, "--steps", "3"])
        self.assertEqual(got["file"], self.script)
        self.assertEqual(got["path0"], os.path.realpath(self.dir.name))
        self.assertNotIn("LEFT_FROM_THE_START", got["env"], "the exec line's environment replaces the start's")
        self.assertEqual(got["env"]["RANK"], "3")
        self.assertTrue(got["preloaded"], "torch was imported before the script ran")
        self.assertTrue(got["comm"].startswith("python"), "the interpreter's name back: %s" % got["comm"])

    def test_a_module(self) -> None:
        mod = os.path.join(self.dir.name, "trainmod.py")
        with open(mod, "w") as f:
            f.write(SCRIPT)
        p, agent = self.start(["-m", "trainmod", "x"])
        self.exec_(agent, ["GORUN_HEARTBEAT_FD=%d" % self.fd, "PATH=" + os.environ["PATH"]])
        self.read_line(agent)
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, err)
        got = json.loads(out)
        self.assertEqual(got["name"], "__main__")
        self.assertEqual(got["argv"], [mod, "x"])
        self.assertEqual(got["path0"], self.dir.name)

    def test_end_of_file_ends_it_quietly(self) -> None:
        p, agent = self.start([self.script])
        self.assertEqual(self.read_line(agent), b"ready\n")
        agent.shutdown(socket.SHUT_WR)
        out, err = p.communicate(timeout=120)
        self.assertEqual((p.returncode, out, err), (0, "", ""))

    def test_a_missing_script_exits_2_as_python_does(self) -> None:
        p, agent = self.start([os.path.join(self.dir.name, "gone.py")])
        self.exec_(agent, ["PATH=" + os.environ["PATH"]])
        _, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 2)
        self.assertIn("can't open file", err)

    def test_a_line_that_is_not_exec_is_an_error(self) -> None:
        p, agent = self.start([self.script])
        self.assertEqual(self.read_line(agent), b"ready\n")
        agent.sendall(b"round {}\n")
        _, err = p.communicate(timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("expected an exec line", err)


if __name__ == "__main__":
    unittest.main()
