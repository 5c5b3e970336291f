"""What the keeper's tests share: run a keeper (or run.sh) as a real process and
read its output as events, never by sleeping.

A test waits for a line the trial prints (`expect`), then acts (a signal, a
file), then waits for the exit; timeouts are only upper bounds for a loaded
machine. `assert_gone` checks with psutil that the processes a test learnt of
are gone, on top of conftest's check that nothing tagged is left.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Mapping, Sequence

import psutil

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
KEEPER = [PYTHON, "-m", "trialkit.keeper"]
RUN_SH = str(ROOT / "scripts" / "run.sh")
CLEANUP_SH = str(ROOT / "scripts" / "cleanup.sh")
TIMEOUT = 60.0  # the most anything may take on a loaded machine; never waited for on success


def py(code: str, *args: str) -> List[str]:
    """argv of a Python child running `code` (dedented)."""
    return [PYTHON, "-c", textwrap.dedent(code), *args]


class Proc:
    """A started process whose stdout and stderr are read as they come."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], stdout=subprocess.PIPE, **popen):
        self.proc = subprocess.Popen(list(argv), env=dict(env), stdout=stdout, stderr=subprocess.PIPE, **popen)
        self._fds = {pipe.fileno(): name for pipe, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr"))
                     if pipe is not None}
        self._data: Dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self._seen = {"stdout": 0, "stderr": 0}

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stdout(self) -> bytes:
        return bytes(self._data["stdout"])

    @property
    def stderr(self) -> bytes:
        return bytes(self._data["stderr"])

    def _pump(self, until: float) -> bool:
        """Read whatever is ready; False when nothing came before `until` or both streams ended."""
        if not self._fds:
            return False
        ready, _, _ = select.select(list(self._fds), [], [], max(0.0, until - time.monotonic()))
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                self._data[self._fds[fd]] += chunk
            else:
                del self._fds[fd]
        return bool(ready)

    def expect(self, needle: bytes, stream: str = "stdout", timeout: float = TIMEOUT) -> bytes:
        """Wait for the next line holding `needle`; return that line."""
        until = time.monotonic() + timeout
        while True:
            data = self._data[stream]
            at = data.find(needle, self._seen[stream])
            end = data.find(b"\n", at) if at >= 0 else -1
            if end >= 0:
                start = data.rfind(b"\n", 0, at) + 1
                self._seen[stream] = end + 1
                return bytes(data[start:end])
            if not self._pump(until) and (time.monotonic() >= until or not self._fds):
                raise AssertionError(f"no line with {needle!r} on {stream} of {self.proc.args!r}:\n"
                                     f"stdout: {self.stdout[-2000:]!r}\nstderr: {self.stderr[-2000:]!r}")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = TIMEOUT) -> int:
        """Wait for the exit and the end of its output; return the exit code."""
        until = time.monotonic() + timeout
        while self._fds and time.monotonic() < until:
            self._pump(until)
        try:
            return self.proc.wait(max(0.0, until - time.monotonic()))
        finally:
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()


def keeper(command: Sequence[str], env: Mapping[str, str], *options: str, **popen) -> Proc:
    return Proc([*KEEPER, *options, "--", *command], env, **popen)


def run_sh(env: Mapping[str, str], *command: str) -> Proc:
    return Proc(["sh", RUN_SH, *command], env)


def cleanup_sh(env: Mapping[str, str], **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", CLEANUP_SH], env={**env, **extra}, capture_output=True, timeout=TIMEOUT)


def trial_dir(env: Mapping[str, str]) -> Path:
    return Path(env["TRIALKIT_TRIAL_DIR"])


def status(env: Mapping[str, str]) -> dict:
    return json.loads((trial_dir(env) / ".trialkit" / "status.json").read_text())


def numbers_after(line: bytes, word: bytes) -> List[int]:
    """The integers that follow `word` in a line: `ready 12 34` -> [12, 34]."""
    return [int(n) for n in line.split(word, 1)[1].split() if n.lstrip(b"-").isdigit()]


def assert_gone(*pids: int, timeout: float = 10.0) -> None:
    """Every pid has exited (a zombie counts as gone: it runs nothing)."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    alive = [p for p in alive if _status(p) not in (None, psutil.STATUS_ZOMBIE)]
    assert not alive, f"still running: {alive}"


def _status(proc: psutil.Process):
    try:
        return proc.status()
    except psutil.NoSuchProcess:
        return None


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
