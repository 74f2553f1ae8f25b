"""A warm Python worker: an interpreter that imported torch ahead of a
restart and waits for the environment of the worker it becomes.

The gorun agent starts it, one per local rank, while the job runs (and at
its start), as

    python [options] /path/to/gorun/_warm.py script.py [args...]
    python [options] /path/to/gorun/_warm.py -m module [args...]

It imports torch (what a PyTorch worker spends most of its start on), then
reads one line on its channel to the agent (GORUN_HEARTBEAT_FD):

    exec {"env": ["KEY=VALUE", ...]}

and runs the script (or module) as `python [options] script.py [args...]`
would, in this process, with exactly that environment: __name__ is
"__main__", sys.argv and sys.path[0] are the script's, and its exit status
is the process's. End of file instead (the agent did not need it) ends the
process with status 0 and no output. Running it as a file, not as
`-m gorun._warm`, keeps the gorun package (which needs torch) out of a
worker that does not use it.

What differs from a cold start: torch is imported before the script sets
any variable of its own, so variables that torch's libraries read when
they load (OMP_NUM_THREADS, MKL_NUM_THREADS) must come from the
environment gorun gives, not from os.environ assignments at the top of the
script; `gorun --warm-workers=false` starts every worker cold.
"""
import ctypes
import json
import os
import runpy
import sys
from typing import Dict, List, NoReturn

ENV_CHANNEL = "GORUN_HEARTBEAT_FD"
EXEC_WORD = "exec"
MAX_LINE = 1 << 20
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel")
WARM_COMM = b"gorun-warm"
"""The command name (ps, /proc/PID/comm) of a warm worker while it waits:
tools that look for a job's workers leave it out (bench/benchproc)."""
PR_SET_NAME = 15


def set_comm(name: bytes) -> None:
    """Set this process's command name (prctl PR_SET_NAME; Linux only, 15
    bytes at most); where it cannot be set, the name stays as it is."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def own_comm() -> bytes:
    """This process's command name now (the interpreter's: python3)."""
    try:
        with open("/proc/self/comm", "rb") as f:
            return f.read().rstrip(b"\n")
    except OSError:
        return b"python"


def preload() -> None:
    """Import what a PyTorch worker imports first; an interpreter without
    torch imports nothing (its script may not need it)."""
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            return


def read_line(fd: int) -> bytes:
    """One line from fd, read a byte at a time so that nothing after it is
    taken from the channel the script goes on using; b"" at end of file."""
    line = bytearray()
    while len(line) < MAX_LINE:
        b = os.read(fd, 1)
        if not b:
            return b""
        if b == b"\n":
            return bytes(line)
        line += b
    raise ValueError(f"gorun warm worker: a line over {MAX_LINE} bytes on the channel")


def parse_exec(line: bytes) -> Dict[str, str]:
    """The environment an exec line gives (ValueError if it is not one)."""
    word, _, rest = line.decode().partition(" ")
    if word != EXEC_WORD:
        raise ValueError(f"gorun warm worker: expected an {EXEC_WORD} line, got {line[:80]!r}")
    env: List[str] = json.loads(rest)["env"]
    out = {}
    for kv in env:
        name, sep, value = kv.partition("=")
        if not sep:
            raise ValueError(f"gorun warm worker: {kv!r} is not KEY=VALUE")
        out[name] = value
    return out


def first_path(argv: List[str]) -> str:
    """sys.path[0] as `python argv...` sets it: the working directory for a
    module, the script's directory (symbolic links resolved) for a script."""
    if argv[0] == "-m":
        return os.getcwd()
    return os.path.dirname(os.path.realpath(argv[0]))


def become(argv: List[str], env: Dict[str, str]) -> None:
    """Run argv (script [args] or -m module [args]) as __main__ with env as
    the whole environment, as `python argv...` runs it."""
    os.environ.clear()
    os.environ.update(env)
    if argv[0] == "-m":
        sys.argv = [argv[1]] + argv[2:]  # runpy sets argv[0] to the module's file
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    if not os.path.exists(script):
        print(f"{sys.executable}: can't open file {os.path.abspath(script)!r}: "
              f"[Errno 2] No such file or directory", file=sys.stderr)
        raise SystemExit(2)
    sys.argv = list(argv)
    runpy.run_path(script, run_name="__main__")


def main() -> NoReturn:
    """Preload, wait for the exec line, and become the worker."""
    argv = sys.argv[1:]
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        raise SystemExit("usage: _warm.py script.py [args...] | -m module [args...]")
    fd = int(os.environ[ENV_CHANNEL])
    comm = own_comm()
    set_comm(WARM_COMM)
    sys.path[0] = first_path(argv)  # not gorun's directory, this file's
    preload()
    os.write(fd, b"ready\n")
    line = read_line(fd)
    if not line:
        raise SystemExit(0)
    env = parse_exec(line)
    set_comm(comm)
    become(argv, env)
    raise SystemExit(0)


if __name__ == "__main__":
    main()
