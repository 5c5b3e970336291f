"""The fail-fast supervisor every launcher shares.

A launcher runs one engine (torchrun, deepspeed, horovodrun) that starts the
workers; every worker runs under wrap_rank, which reports over a link
(trialkit.launch.link) its rank, its script's process group and how the
script ended. So the supervisor hears of a failure when it happens, not when
the engine next polls, and reaches every worker itself:

- a worker ends non-zero, or its wrap_rank vanishes: the stop signal (SIGTERM;
  SIGINT for horovod) goes to every other worker (through its wrap_rank, to
  the script's whole group), and SIGKILL to every worker's group, wrap_rank
  and the engine's group when the grace runs out;
- a signal reaches the launcher: it goes to every worker the same way;
  SIGTERM and SIGINT also start the grace;
- the engine is not signalled while workers can take the signal (it would
  pass it down a second time); once a stop has no worker left, the engine
  has nothing to do but tear itself down (half a second for a Python that
  imported torch) and report what we already know: it gets ENGINE_LINGER to
  exit on its own, then SIGKILL. When it exits, what is left of its tree is
  swept.

Then it exits with the first failure's code and one line naming the rank, the
exit code or signal and the user's script; 0 when every worker exited 0.
Everything runs in process.EventLoop: no polling, no threads.

The workers write to the launcher's own stdout and stderr (wrap_rank gets
them over the link); the engine's own output goes to a log file instead, so
that its banner and the traceback it prints when a worker fails never reach
the user's terminal before the one line that matters. The log has no name
while the engine runs, so that no kill (the keeper's SIGKILL after its grace
included) leaves it behind; it is written out, and named with its last line,
only when the engine fails before any worker starts: then an engine that was
given overrides refused them (exit 2).
"""
from __future__ import annotations

import os
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from trialkit.errors import USAGE_EXIT
from trialkit.launch.link import Connection, Listener, engine_environ
from trialkit.process import (
    STOP_SIGNALS,
    Child,
    EventLoop,
    LaunchError,
    describe_exit,
    set_child_subreaper,
    signal_group,
    spawn,
)

LINK_EOF_WAIT = 1.0  # after the tree is swept, how long a worker's last report may take to arrive
ENGINE_LINGER = 0.25  # in a stop with no worker left, the engine's time to notice and say so before SIGKILL


@dataclass
class Worker:
    rank: int
    pid: int  # its wrap_rank
    link: Connection
    group: Optional[int] = None  # its script's process group
    exit_code: Optional[int] = None
    killed_by: int = 0
    linked: bool = True  # the link is open, so the wrap_rank is alive
    asked_to_stop: bool = False  # we sent it a stop signal: the verdict may say we stopped it

    @property
    def running(self) -> bool:
        return self.exit_code is None and self.linked

    @property
    def lost(self) -> bool:
        return self.exit_code is None and not self.linked

    def signal(self, signum: int) -> None:
        """Through wrap_rank, which forwards a stop signal once however many layers send it."""
        self.link.send("signal", signum)

    def stop(self, signum: int) -> None:
        self.signal(signum)
        self.asked_to_stop = True

    def kill(self) -> None:
        if self.group is not None:
            signal_group(self.group, signal.SIGKILL)
        _kill(self.pid, signal.SIGKILL)

    def describe(self) -> str:
        """How it ended, to follow "failed with" / "ended with"."""
        if self.lost:
            return "no report (its wrap_rank died)"
        if self.killed_by:
            return describe_exit(128 + self.killed_by)
        return f"exit code {self.exit_code}"


class Supervisor:
    """Runs one engine command and watches its workers until nothing of them is left."""

    def __init__(self, prog: str, engine: str, script: str, grace: float,
                 stop_signal: int = signal.SIGTERM, overrides: Sequence[str] = ()):
        self.prog = prog
        self.engine_name = engine
        self.script = script
        self.grace = grace
        self.stop_signal = stop_signal
        self.overrides = tuple(overrides)  # the user's options for the engine
        self.engine_log = -1  # the engine's own output: an unnamed file's descriptor, while run() runs
        self.loop = EventLoop()
        self.engine: Optional[Child] = None
        self.workers: Dict[Connection, Worker] = {}
        self.ended: List[Worker] = []  # in the order they ended
        self.failed: Optional[Worker] = None  # the first failure, the one the launcher reports
        self.stopped_by: Optional[int] = None  # a stop signal the launcher itself received
        self.stopping_with: Optional[int] = None  # what workers get while we stop them
        self.engine_released = False
        self.kill_at: Optional[float] = None
        self.swept = False

    # -- the story ----------------------------------------------------------
    def run(self, argv: Sequence[str], environ: Mapping[str, str]) -> int:
        """Start the engine, serve events until its tree is gone, say how it went."""
        # Before we are a subreaper: the cleaner the listener forks (process.when_gone) must not come to us, whose
        # sweep of orphans would stop it, but go where a SIGKILL of us leaves it to clean.
        listener = Listener(share_fds=(sys.stdout.fileno(), sys.stderr.fileno()))
        set_child_subreaper()  # workers orphaned by a dying engine come to us, to be swept
        self.loop.install_signal_handlers()
        log = tempfile.TemporaryFile()  # unnamed (O_TMPFILE): nothing to remove, however we end
        self.engine_log = log.fileno()
        try:
            self.loop.add_reader(listener.sock, lambda: self._on_connect(listener))
            self.loop.on_signal = self._on_signal
            self.loop.on_exit = self._on_exit
            try:
                self.engine = spawn(argv, env=engine_environ(environ, listener), stdout=self.engine_log,
                                    stderr=self.engine_log)
            except LaunchError as err:
                print(f"{self.prog}: {err}", file=sys.stderr, flush=True)
                return err.code
            self.loop.watch(self.engine)
            self.loop.run_until(lambda: self.swept)
            self.loop.run_until(lambda: not self._running(), deadline=time.monotonic() + LINK_EOF_WAIT)
            return announce(self.prog, self._outcome())
        finally:
            log.close()
            for peer in self.workers:
                peer.close()
            listener.close()
            self.loop.restore_signal_handlers()
            self.loop.close()

    # -- events -------------------------------------------------------------
    def _on_connect(self, listener: Listener) -> None:
        peer = listener.accept()
        if peer is not None:
            self.loop.add_reader(peer.sock, lambda: self._on_readable(peer))

    def _on_readable(self, peer: Connection) -> None:
        for kind, values in peer.read():
            self._on_message(peer, kind, values)
        if peer.closed:
            self.loop.remove_reader(peer.sock)
            peer.close()
            worker = self.workers.get(peer)
            if worker is not None and worker.linked:
                worker.linked = False
                if worker.lost:
                    self._on_worker_end(worker)

    def _on_message(self, peer: Connection, kind: str, values: Tuple[int, ...]) -> None:
        if kind == "rank" and len(values) == 2:
            self.workers[peer] = Worker(rank=values[0], pid=values[1], link=peer)
            if self.stopping_with is not None:
                self.workers[peer].stop(self.stopping_with)  # it started while we stop: it stops too
            return
        worker = self.workers.get(peer)
        if worker is None or not values:
            return
        if kind == "group":
            worker.group = values[0]
        elif kind == "exit" and worker.exit_code is None:
            worker.exit_code = values[0]
            worker.killed_by = values[1] if len(values) > 1 else 0
            self._on_worker_end(worker)

    def _on_worker_end(self, worker: Worker) -> None:
        self.ended.append(worker)
        if worker.exit_code != 0 and self.stopping_with is None:
            self.failed = worker
            self._stop(self.stop_signal)
        elif self.stopping_with is not None and not self._running():
            self._release_engine()

    def _on_signal(self, signum: int) -> None:
        if signum in STOP_SIGNALS:
            self.stopped_by = self.stopped_by or signum
            self._stop(signum)
            return
        running = self._running()
        for worker in running:
            worker.signal(signum)
        if not running and self.engine is not None and self.engine.running:
            signal_group(self.engine.pgid, signum)

    def _on_exit(self, child: Child) -> None:
        if child is not self.engine:
            return
        # A worker's last report is sent before its wrap_rank exits, so before
        # the engine could exit: read it now, or the engine would take the blame.
        for peer in [p for p in self.workers if not p.closed]:
            self._on_readable(peer)
        if self.stopping_with is None and self._running():
            self._stop(self.stop_signal)
        self.loop.sweep(child, on_done=lambda: setattr(self, "swept", True))

    # -- stopping -----------------------------------------------------------
    def _stop(self, signum: int) -> None:
        """Signal every running worker now; SIGKILL everything when the grace is over."""
        self.stopping_with = signum
        running = self._running()
        for worker in running:
            worker.stop(signum)
        if not running:
            self._release_engine()
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace
            self.loop.call_at(self.kill_at, self._kill_all)

    def _release_engine(self) -> None:
        if not self.engine_released:
            self.engine_released = True
            self.loop.call_later(ENGINE_LINGER, self._kill_engine)

    def _kill_all(self) -> None:
        for worker in self._running():
            worker.kill()
        self._kill_engine()

    def _kill_engine(self) -> None:
        if self.engine is not None and self.engine.running:
            signal_group(self.engine.pgid, signal.SIGKILL)

    def _running(self) -> List[Worker]:
        return [w for w in self.workers.values() if w.running]

    # -- the end ------------------------------------------------------------
    def _outcome(self) -> Tuple[int, str]:
        if self.failed:
            return failed_verdict(self.failed, self.workers.values(), self.script)
        if self.stopped_by:
            name = signal.Signals(self.stopped_by).name
            first = stopped_verdict(self.stopped_by, self.ended)
            if first:
                return first
            if not self.workers or any(w.lost for w in self.workers.values()):
                return 128 + self.stopped_by, f"stopped by {name} running {self.script}"
            return 0, ""
        code = self.engine.exit_code if self.engine else 0
        if not code:
            return 0, ""
        if self.workers:
            return code, f"{self.engine_name} failed with {describe_exit(code)} before any worker did, " \
                         f"running {self.script}"
        said = f"{_last_line(self.engine_log)} (its output: {keep_log(self.engine_log, self.engine_name)})"
        if self.overrides:  # it stopped before starting anything: what trialkit set works, so the user's did not
            return USAGE_EXIT, f"{self.engine_name} refused the overrides {shlex.join(self.overrides)}: {said}"
        return code, f"{self.engine_name} failed with {describe_exit(code)} before starting a worker: {said}"


def announce(prog: str, outcome: Tuple[int, str]) -> int:
    """A launcher's end: its verdict line (if any) on stderr, and its exit code."""
    code, line = outcome
    if line:
        print(f"{prog}: {line}", file=sys.stderr, flush=True)
    return code


def failed_verdict(failed: Any, workers: Iterable[Any], script: str) -> Tuple[int, str]:
    """The exit code and line when rank `failed` failed first; the other workers were
    stopped only if we said so: an engine that tears its workers down must not pass for us."""
    stopped = "; stopped the other workers" if any(w.asked_to_stop for w in workers) else ""
    return failed.exit_code or 1, f"rank {failed.rank} failed with {failed.describe()} running {script}{stopped}"


def stopped_verdict(signum: int, ended: Iterable[Any]) -> Optional[Tuple[int, str]]:
    """After a stop signal: the first worker that ended with a code of its own, if any."""
    first = next((w for w in ended if w.exit_code), None)
    if first is None:
        return None
    return first.exit_code, f"stopped by {signal.Signals(signum).name}; rank {first.rank} ended with {first.describe()}"


def keep_log(fd: int, engine: str) -> str:
    """A named copy of the engine's unnamed log, for the user to read; its path."""
    out_fd, path = tempfile.mkstemp(prefix=f"trialkit-{engine}-", suffix=".log")
    with open(out_fd, "wb") as out:
        offset = 0
        while True:
            chunk = os.pread(fd, 1 << 16, offset)
            if not chunk:
                return path
            out.write(chunk)
            offset += len(chunk)


def _last_line(fd: int, limit: int = 300) -> str:
    """The last line of a log that says something (a traceback's exception, argparse's error)."""
    try:
        data = os.pread(fd, 8192, max(0, os.fstat(fd).st_size - 8192))
        lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return "no output"
    last = lines[-1] if lines else "no output"
    return last if len(last) <= limit else last[:limit - 3] + "..."


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
