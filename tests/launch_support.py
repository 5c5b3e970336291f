"""What the launcher tests share: environments, scripts, and a process whose output can be awaited.

Waits are on output (a script prints `ready ...`), never on sleeps.
"""
from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# A gloo all_reduce over every worker: each prints the sum of rank+1.
ALLREDUCE = """
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item():g} args {sys.argv[1:]}", flush=True)
dist.destroy_process_group()  # else gloo's threads may abort the interpreter's exit (pytorch/pytorch#179291)
"""

# Joins the group, says it is ready, then waits; SIGTERM runs a handler that says so and exits 143.
WAIT_FOR_STOP = """
import os, signal, sys, time
import torch.distributed as dist
def on_term(signum, frame):
    print(f"handler rank={os.environ['RANK']} signal={signal.Signals(signum).name}", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()  # else gloo's threads may abort the exit (see ALLREDUCE)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
dist.init_process_group("gloo")
print(f"ready rank={dist.get_rank()} pid={os.getpid()}", flush=True)
while True:
    signal.pause()
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def launch_env(tmp_path: Path, **extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    for name in [n for n in env if n.startswith("TRIALKIT_") and n != "TRIALKIT_TEST_TAG"]:
        del env[name]
    env.update({
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        "PYTHONUNBUFFERED": "1",
        "TRIALKIT_TRIAL_DIR": str(tmp_path / "trial"),
        "OMP_NUM_THREADS": "1",
    })
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Proc:
    """A started command whose stdout and stderr are read as they come."""

    def __init__(self, argv: List[str], env: Dict[str, str], cwd: Optional[Path] = None, stdin=subprocess.DEVNULL):
        self.popen = subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out = b""
        self.err = b""
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.popen.stdout, selectors.EVENT_READ, "out")
        self._selector.register(self.popen.stderr, selectors.EVENT_READ, "err")

    def wait_for(self, pattern: str, timeout: float = 120.0, stream: str = "out") -> re.Match:
        """Read until `pattern` shows in stdout (or stderr); fail with what was seen after timeout."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern.encode())
        while True:
            match = regex.search(self.out if stream == "out" else self.err)
            if match:
                return match
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"no {pattern!r} in {stream} within {timeout}s;\n"
                                     f"stdout: {self.out[-3000:]!r}\nstderr: {self.err[-3000:]!r}")

    def finish(self, timeout: float = 180.0) -> int:
        """Read to the end of both streams and wait for the exit status (kill on timeout)."""
        deadline = time.monotonic() + timeout
        while self._selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                self.popen.kill()
                raise AssertionError(f"still running after {timeout}s;\nstdout: {self.out[-3000:]!r}\n"
                                     f"stderr: {self.err[-3000:]!r}")
            self._read(left)
        return self.popen.wait(max(0.1, deadline - time.monotonic()))

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.popen.send_signal(signum)

    def _read(self, timeout: float) -> bool:
        events = self._selector.select(timeout)
        for key, _ in events:
            data = os.read(key.fileobj.fileno(), 1 << 16)
            if not data:
                self._selector.unregister(key.fileobj)
                key.fileobj.close()
            elif key.data == "out":
                self.out += data
            else:
                self.err += data
        return bool(events) or bool(self._selector.get_map())

    @property
    def text(self) -> str:
        return self.out.decode(errors="replace")

    @property
    def err_lines(self) -> List[str]:
        return self.err.decode(errors="replace").splitlines()
