"""What runs one keeper on a Ray node: run.sh -> keeper -> command.

The keeper does the process control (own session, signal forwarding, grace,
reaping, status); the runner starts it, waits for it, asks it to stop with a
SIGTERM (the keeper's graceful path: the trial may checkpoint) and kills what
is left when that takes longer than the grace. The runner lives in an async
actor: stop() is served while wait() is pending, and the keeper is started from
the actor's one long-lived event-loop thread, which matters because a
parent-death signal fires when the starting *thread* ends. That signal is
SIGTERM: when Ray kills the worker (node stopped, actor killed), the keeper
still stops the trial gracefully, bounded by its grace. util-linux's setpriv
sets it at exec, so nothing runs in the child before exec and Python vforks
the keeper rather than fork the worker (~3 ms against ~60 ms of the agent's
loop a start, more on a loaded node).

The ray platform's node agent (trialkit/ray/agent.py) holds one runner a
trial, all on its event loop; adaptdl-ray's replicas are actors of their own
(trialkit/ray/replica.py). When nobody collects an ended trial's result within
LINGER_SECONDS, the runner leaves (`leave`: a replica's worker exits, the
agent forgets the trial and gives its resources back), so a control plane
that never comes back does not hold the trial's CPUs and GPUs for ever.

The class is plain Python; callers wrap it with ray.remote or hold it in an
actor of theirs, so importing this module does not import ray.
"""
from __future__ import annotations

import asyncio
import functools
import importlib.resources
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional, Sequence

from trialkit import env, layout
from trialkit.keeper import leftover
from trialkit.keeper.status import StatusFile
from trialkit.statuses import FAILED, FINAL_STATUSES, USER_CANCELED
from trialkit.process import Child, LaunchError, describe_exit, exit_code, signal_group, spawn

FORCE_MARGIN = 1.0  # after grace + the keeper's flush time, before the runner kills
# How long an ended trial's result waits for a control plane to collect it: a
# resume after a crash comes within minutes; after this the actor's resources go back.
LINGER_SECONDS = 600.0


@dataclass(frozen=True)
class RunResult:
    exit_code: Optional[int]  # None: stopped before it started
    status: Optional[str]  # the keeper's final status (SUCCEEDED, PREEMPTED, ...); None if it wrote none
    reason: str
    node_id: str


def run_sh() -> str:
    return str(importlib.resources.files("trialkit.scripts") / "run.sh")


@functools.lru_cache(maxsize=None)
def setpriv() -> Optional[str]:
    """This node's setpriv, if it can set a parent-death signal (util-linux 2.33 and later)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    usage = subprocess.run([path, "--help"], stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    return path if "--pdeathsig" in usage.stdout else None


def start_keeper(argv: Sequence[str], environ: Dict[str, str]) -> Child:
    """argv (run.sh ...) in its own session, SIGTERMed when this thread's worker dies."""
    path = setpriv()
    if path is None:  # a node without it: the keeper pays a fork of the worker
        return spawn(argv, env=environ, stdin=subprocess.DEVNULL, parent_death_signal=signal.SIGTERM)
    # Ray's threads block SIGINT: spawn clears the mask for the vfork, as the forked child's preexec step does.
    return spawn([path, "--pdeathsig", "TERM", *argv], env=environ, stdin=subprocess.DEVNULL, in_child=False)


def node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _waitpid(child: Child) -> int:
    _, status = os.waitpid(child.pid, 0)
    child.exit_code = exit_code(status)
    if child.popen is not None:
        child.popen.returncode = child.exit_code  # Popen must not wait again
    return child.exit_code


async def _exit_code(child: Child) -> int:
    """The child's exit code, once it has exited. A pidfd on the event loop says when, holding no thread:
    asyncio.to_thread's pool has min(32, CPUs + 4) threads, and an agent's 25 keepers waiting in it would
    leave the later ones' exits unseen until earlier keepers ended."""
    loop = asyncio.get_running_loop()
    fd = os.pidfd_open(child.pid)
    exited = loop.create_future()
    loop.add_reader(fd, lambda: exited.done() or exited.set_result(None))
    try:
        await exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return _waitpid(child)  # at once: it has exited


def exit_worker() -> None:
    # Ends this worker, which gives the actor's resources back (a detached actor is never released otherwise).
    os._exit(0)


class TrialRunner:
    def __init__(self, label: str, leave: Callable[[], None] = exit_worker):
        self.label = label
        self._leave = leave  # when nobody collected the ended trial's result in time
        self._child: Optional[Child] = None
        self._status_path: Optional[Path] = None
        self._result: Optional[asyncio.Future] = None
        self._stop_asked = False
        self._started: Optional[asyncio.Event] = None
        self._collected = False

    def __repr__(self) -> str:
        return self.label  # Ray prefixes the keeper's forwarded output with it

    def _future(self) -> asyncio.Future:
        if self._result is None:
            self._result = asyncio.get_running_loop().create_future()
        return self._result

    def _started_event(self) -> asyncio.Event:
        if self._started is None:
            self._started = asyncio.Event()
        return self._started

    async def start(self, args: Sequence[str], environ: Mapping[str, str]) -> int:
        """Start run.sh ARGS (none: it runs $TRIALKIT_COMMAND) with `environ` over the
        worker's own environment; returns the keeper's pid (0 if it did not start)."""
        result = self._future()
        self._started_event().set()
        if self._stop_asked:
            result.set_result(RunResult(None, USER_CANCELED, "stopped before it started", node_id()))
            return 0
        full = {**os.environ, **environ}
        # The worker's interpreter is the one with trialkit and the user's packages:
        # the keeper's, and the trial command's `python3`.
        full.setdefault(env.PYTHON, sys.executable)
        full["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full.get("PATH", os.defpath)
        self._status_path = layout.status_path(Path(full.get(env.TRIAL_DIR) or os.getcwd()))
        try:
            self._child = start_keeper(["/bin/sh", run_sh(), *args], full)
        except LaunchError as err:
            result.set_result(RunResult(err.code, FAILED, str(err), node_id()))
            return 0
        asyncio.ensure_future(self._reap(self._child, result))
        return self._child.pid

    async def _reap(self, child: Child, result: asyncio.Future) -> None:
        code = await _exit_code(child)
        final = StatusFile.previous(self._status_path) or {}
        if final.get("status") not in FINAL_STATUSES:  # the keeper was killed before it could say
            final = {"reason": f"the keeper ended ({describe_exit(code)}) before the trial did"}
        result.set_result(RunResult(code, final.get("status"), final.get("reason", ""), node_id()))
        asyncio.get_running_loop().call_later(LINGER_SECONDS, self._leave_unless_collected)

    def _leave_unless_collected(self) -> None:
        if not self._collected:  # no control plane took the result
            self._leave()

    async def wait(self) -> RunResult:
        """The keeper's exit code and final status, once it has exited."""
        return await asyncio.shield(self._future())

    async def ended(self) -> bool:
        """Whether the keeper has exited (its result is ready)."""
        return self._result is not None and self._result.done()

    async def started(self) -> int:
        """The keeper's pid, once start() has run (0 if the trial never started)."""
        await self._started_event().wait()
        return self._child.pid if self._child is not None else 0

    async def collect(self) -> list:
        """The control plane has the result: the actor may go. What the keeper spooled and
        could not deliver (its manager was away when it ended), and what the trial wrote that it had not
        spooled (a keeper killed)."""
        self._collected = True
        if self._status_path is None:
            return []
        return leftover.undelivered(self._status_path.parent.parent)  # <trial dir>/.trialkit/status.json

    async def stop(self, grace: float) -> bool:
        """SIGTERM to the keeper; kill the trial and keeper if they outlast the grace.
        True if they had to be killed."""
        self._stop_asked = True
        child = self._child
        if child is None or not child.running:
            return False
        os.kill(child.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self._future()), grace + layout.FLUSH_SECONDS + FORCE_MARGIN)
        except asyncio.TimeoutError:
            await self.kill()
            return True
        # The keeper killed the trial itself when the grace ran out.
        return self._future().result().exit_code == 128 + signal.SIGKILL

    async def kill(self) -> None:
        """SIGKILL the trial's process group and the keeper's, now."""
        self._stop_asked = True
        child = self._child
        if child is None or not child.running:
            return
        trial_pid = (StatusFile.previous(self._status_path) or {}).get("pid")
        if trial_pid:
            signal_group(int(trial_pid), signal.SIGKILL)  # started in its own session: pid == group
        signal_group(child.pgid, signal.SIGKILL)
        await asyncio.shield(self._future())

    async def ping(self) -> str:
        """This runner's node; answering at all shows it (and its node) are alive."""
        return node_id()
