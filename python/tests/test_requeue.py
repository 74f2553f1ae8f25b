"""gorun.exit_for_requeue: exit 75, after a requeue line on the agent's
channel when the worker has one (a real socket pair handed to a real child
process, as the agent hands it), with nothing written without one."""
import os
import socket
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); import gorun; "
         "print('saved', flush=True); gorun.exit_for_requeue()")


class ExitForRequeueTest(unittest.TestCase):
    def run_child(self, env: dict, pass_fds: tuple = ()) -> subprocess.CompletedProcess:
        base = {k: v for k, v in os.environ.items() if k != "GORUN_HEARTBEAT_FD"}
        return subprocess.run([sys.executable, "-c", CHILD, os.path.join(HERE, "..")],
                              env={**base, **env}, pass_fds=pass_fds, stdout=subprocess.PIPE,
                              text=True, timeout=120)

    def test_says_requeue_on_the_channel_then_exits_75(self) -> None:
        agent, worker = socket.socketpair()
        with agent, worker:
            r = self.run_child({"GORUN_HEARTBEAT_FD": str(worker.fileno())}, (worker.fileno(),))
            worker.close()  # the child's copy is gone too: the agent reads to end of file
            agent.settimeout(30)
            said = b""
            while True:
                chunk = agent.recv(64)
                if not chunk:
                    break
                said += chunk
        self.assertEqual(r.returncode, 75)
        self.assertEqual(r.stdout, "saved\n", "atexit and the script's output come first")
        self.assertEqual(said, b"requeue\n")

    def test_without_a_channel_it_only_exits_75(self) -> None:
        for env in ({}, {"GORUN_HEARTBEAT_FD": "99"}, {"GORUN_HEARTBEAT_FD": "x"}):
            with self.subTest(env=env):
                self.assertEqual(self.run_child(env).returncode, 75)


if __name__ == "__main__":
    unittest.main()
