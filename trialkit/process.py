"""The one process-control core: the keeper, the launchers and wrap_rank use it.

It starts children in their own session (so a signal reaches a child's whole
tree through its process group), forwards signals to those groups, stops them
with a bounded grace, reaps every child (orphans too, as a subreaper or PID 1)
and turns a wait status into an exit code the way tini does (128+N for a
signal). Everything is driven by events: signals arrive on a wakeup fd, so one
`select` waits for signals, child exits, pipe data and timers at once.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import heapq
import os
import selectors
import signal
import sys
import time

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    import subprocess
    from typing import Callable, Dict, Iterable, List, Optional, Sequence

FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PIPE_EOF_WAIT = 1.0  # after a tree is gone, how long a pipe held elsewhere may stay open
STRAGGLER_GRACE = 2.0  # after the main child exits, what is left of its group gets this long

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# The C library, for what only it offers (prctl here, inotify in keeper/watch.py); None off Linux.
libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


# `python -m` puts the working directory first on sys.path, and a folder named `trialkit` there (the checkout's
# parent, a code dir's) is taken for a namespace package `trialkit` ahead of an editable install, whose finder
# comes after the path's (setuptools issue 3557). So our own modules start with the working directory off the
# path: `-P` where this Python has it (3.11+), else this code, which takes off the '' that -c puts first and
# runs the module named after it as -m would. scripts/run.sh runs the same code (its Python may be older).
RUN_MODULE_OFF_CWD = ('import runpy, sys; getattr(sys.flags, "safe_path", 0) or sys.path.pop(0); '
                      'runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)')


def own_module_argv(module: str, *args: str) -> List[str]:
    """`python -m MODULE ARGS...` for one of trialkit's modules, in this Python, the working directory off sys.path."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", RUN_MODULE_OFF_CWD, module, *args]


class LaunchError(Exception):
    """The command could not be started; `code` is the shell's code for it."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def set_child_subreaper() -> bool:
    """Become the reaper of orphaned descendants (PID 1 already is)."""
    if os.getpid() == 1:
        return True
    if libc is None:
        return False
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _clear_signal_mask() -> None:
    # A parent that blocked signals must not pass that on to the trial.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def set_parent_death_signal(parent: int, signum: int = signal.SIGKILL) -> None:
    # Runs in the child between fork and exec: if the parent is SIGKILLed the
    # kernel sends the child `signum`, and each trialkit layer below does the
    # same for its own children, so the whole chain goes down.
    if libc is not None:
        libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:
            # The parent died before prctl took effect: the signal will never
            # come, so leave now (a signal to ourselves would meet the
            # parent's Python handlers, still installed until exec).
            os._exit(128 + signum)
    _clear_signal_mask()


def exit_code(status: int) -> int:
    """A wait status as an exit code: the code, or 128+N for death by signal N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def describe_exit(code: int) -> str:
    if code > 128 and code - 128 < signal.NSIG:
        try:
            return f"signal {signal.Signals(code - 128).name} (exit {code})"
        except ValueError:
            pass
    return f"exit code {code}"


def signal_group(pgid: int, sig: int) -> bool:
    """Send a signal to a whole process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def group_alive(pgid: int) -> bool:
    return signal_group(pgid, 0)


def _stat_fields(pid: str) -> List[bytes]:
    """/proc/PID/stat from the state on (field 3 of proc(5) is index 0); [] if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return []
    # The command name may hold spaces and parentheses: parse after the last ')'.
    return stat[stat.rfind(b")") + 2 :].split()


def start_ticks(pid: int) -> int:
    """When a process started (clock ticks after boot): with its pid, it names it for good."""
    return int(_stat_fields(str(pid))[19])


def is_running(pid: int, ticks: int) -> bool:
    """Whether the process that started at `ticks` with this pid still runs: not gone, not
    a zombie waiting to be reaped (it has exited), not a reused pid."""
    fields = _stat_fields(str(pid))
    return len(fields) > 19 and fields[0] != b"Z" and int(fields[19]) == ticks


def adopted_children() -> List[int]:
    """Our own children, found in /proc (orphans a subreaper inherited included)."""
    me = str(os.getpid()).encode()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    return [int(entry) for entry in entries if entry.isdigit() and _stat_fields(entry)[1:2] == [me]]


def when_gone(cleanup: Callable[[], None]) -> None:
    """Run `cleanup` once this process is gone, however it ends: a SIGKILL too (the keeper's, of its whole
    group, when its grace is over). For what only this process knows to remove (a launcher's shared memory).

    The cleaner is forked twice, into a session of its own, so that it is nobody's straggler here (a
    sweep would stop it) and a kill of our group misses it; it waits for the end of a pipe whose write end
    only this process holds, and ignores the stop signals a sweep sends it in its few milliseconds of work.
    """
    read, write = os.pipe()  # not inheritable: what we start does not hold the write end open
    middle = os.fork()
    if middle == 0:
        try:
            os.close(write)
            os.setsid()
            if os.fork() == 0:
                _clean_after_eof(read, cleanup)
        finally:
            os._exit(0)
    os.close(read)
    os.waitpid(middle, 0)
    # `write` stays open for the rest of this process's life: its close is the cleaner's cue.


def _clean_after_eof(read: int, cleanup: Callable[[], None]) -> None:
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)  # the trial's log pipes must not wait for us
    os.closerange(3, read)
    os.closerange(read + 1, os.sysconf("SC_OPEN_MAX"))
    try:
        while os.read(read, 1):
            pass
    except OSError:
        pass
    try:
        cleanup()
    finally:
        os._exit(0)


class Child:
    """A started child (its own session: its pid is its group's id) and how it ended.

    A plain class, not a dataclass: dataclasses imports inspect, a few ms of
    every keeper's start before the trial can run.
    """

    def __init__(self, pid: int, argv: Sequence[str], name: str = "", popen: Optional[subprocess.Popen] = None):
        self.pid = pid
        self.argv = argv
        self.name = name
        self.exit_code: Optional[int] = None
        self.killed_by: Optional[int] = None  # the signal that ended it, if one did
        self.stop_deadline: Optional[float] = None  # set once; a second stop keeps the clock
        self.outlived_its_grace = False  # still running at the stop's deadline: SIGKILLed then
        self.popen = popen

    def __repr__(self) -> str:
        return f"Child(pid={self.pid}, argv={self.argv!r}, exit_code={self.exit_code}, killed_by={self.killed_by})"

    @property
    def pgid(self) -> int:
        return self.pid  # started with setsid: its pid is its group's id

    @property
    def running(self) -> bool:
        return self.exit_code is None


# Characters that give a command line a meaning only a shell knows.
_SHELL_SYNTAX = set("|&;<>()$`\\*?[]{}~!#\n")


# Builtins and keywords that exist only inside a shell (no program of that name runs them).
_SHELL_WORDS = frozenset(
    "exec cd export source . set unset eval if for while until case time alias ulimit umask trap wait "
    "read shift return exit ! { [[ function select readonly local declare typeset".split()
)


def shell_line_argv(line: str) -> List[str]:
    """The argv that runs a user's command line.

    A plain command (`python3 train.py --lr 0.1`, quotes allowed) runs
    directly; anything with shell syntax runs under /bin/sh -c. Running plain
    commands directly matters: dash does not exec its last command, so under
    `sh -c` the shell, not the training process, would take the SIGTERM and die
    of it, and the training's exit 143 (checkpointed) would never be seen.
    """
    import shlex  # only for command lines, not on every keeper's path

    if not _SHELL_SYNTAX.intersection(line):
        try:
            argv = shlex.split(line)
        except ValueError:
            argv = []
        # VAR=value cmd is an assignment, `exec`/`cd`/... are builtins: the shell's job.
        if argv and "=" not in argv[0] and argv[0] not in _SHELL_WORDS:
            return argv
    return ["/bin/sh", "-c", line]


_SHELLS = frozenset("sh bash dash ash zsh ksh".split())


def _shell_tokens(argv: Sequence[str]) -> List[str]:
    """The words and operators of the line a shell runs (`sh -c LINE`); none where argv is no shell's."""
    if len(argv) < 3 or os.path.basename(argv[0]) not in _SHELLS or argv[1] != "-c":
        return []
    import shlex

    lexer = shlex.shlex(argv[2], posix=True, punctuation_chars=True)
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: the shell refuses it anyway
        return []


def pipes_output(argv: Sequence[str]) -> Optional[str]:
    """Where argv is a shell running a line whose output goes through a pipe (`python3 main.py | tee log`), the
    pipe as the line has it from its first bar on (`| tee log`); else None."""
    tokens = _shell_tokens(argv)
    bar = next((i for i, token in enumerate(tokens) if token in ("|", "|&")), None)
    return None if bar is None else " ".join(tokens[bar:])


_TO_FILE = frozenset((">", ">>", ">|", "&>", "&>>"))  # what sends a command's standard output to a file


def output_file(argv: Sequence[str]) -> Optional[str]:
    """Where argv is a shell running a line that sends its standard output to a file (`python3 train.py >
    train.log 2>&1`), that file as the line names it; else None (`2> err.log` sends only its errors)."""
    tokens = _shell_tokens(argv)
    for i, token in enumerate(tokens[:-1]):
        if token in _TO_FILE and (i == 0 or tokens[i - 1] != "2" or token.startswith("&")):
            return tokens[i + 1]
    return None


def spawn(
    argv: Sequence[str],
    *,
    env: Optional[Dict[str, str]] = None,
    cwd: Optional[str] = None,
    stdin=None,
    stdout=None,
    stderr=None,
    name: str = "",
    die_with_parent: bool = True,
    parent_death_signal: int = signal.SIGKILL,
    in_child: bool = True,
    pass_fds: Sequence[int] = (),
) -> Child:
    """Start argv in its own session. Raises LaunchError(127|126) if it cannot run.

    die_with_parent=False is for what outlives its parent (a background
    control plane). The local platform's keepers, which outlive a killed
    control plane too (`experiment resume` reattaches), are started with
    in_child=False.
    parent_death_signal=SIGTERM is for keepers under a Ray worker: when Ray
    kills the worker, the keeper takes its graceful path (the trial checkpoints).
    in_child=False runs nothing in the child before exec (neither of the above):
    Python then vforks rather than forks, which from a big parent (a Ray worker,
    a control plane) is ~3 ms instead of ~10 to 60. The child inherits the
    calling thread's signal mask, so the mask is cleared for the vfork's few ms
    (as the forked child clears its own); argv sets any death signal itself
    (setpriv).
    pass_fds: fds the child keeps (every other is closed).
    """
    import subprocess  # here: what only reads /proc (is_running: `trialkit experiment list`) starts without it

    if not argv:
        raise LaunchError("no command given", 127)
    mask = None if in_child else signal.pthread_sigmask(signal.SIG_SETMASK, [])
    try:
        popen = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=(None if not in_child
                        else functools.partial(set_parent_death_signal, os.getpid(), parent_death_signal)
                        if die_with_parent else _clear_signal_mask),
            close_fds=True,
            pass_fds=pass_fds,
        )
    except FileNotFoundError:
        raise LaunchError(f"{argv[0]}: command not found", 127) from None
    except PermissionError:
        raise LaunchError(f"{argv[0]}: permission denied (not executable)", 126) from None
    except OSError as err:
        code = 126 if err.errno in (errno.EACCES, errno.ENOEXEC, errno.EISDIR) else 127
        raise LaunchError(f"{argv[0]}: {err.strerror}", code) from None
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return Child(pid=popen.pid, argv=list(argv), name=name, popen=popen)


class EventLoop:
    """One select() over signals, child exits, readable fds and timers.

    The owner installs callbacks: `on_signal(signum)` for forwarded signals,
    `on_exit(child)` when a child it spawned ends. Orphans adopted as a
    subreaper are reaped silently.
    """

    def __init__(self, signals: Iterable[int] = FORWARDED_SIGNALS):
        self.selector = selectors.DefaultSelector()
        self.children: Dict[int, Child] = {}
        self.on_signal: Callable[[int], None] = lambda signum: None
        self.on_exit: Callable[[Child], None] = lambda child: None
        self._timers: list = []
        self._timer_seq = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._signals = tuple(signals)
        self.selector.register(self._wake_r, selectors.EVENT_READ, self._drain_signals)

    # -- setup ------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        for signum in self._signals + (signal.SIGCHLD,):
            signal.signal(signum, _note_signal)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

    def restore_signal_handlers(self) -> None:
        signal.set_wakeup_fd(-1)
        for signum in self._signals + (signal.SIGCHLD,):
            signal.signal(signum, signal.SIG_DFL)

    def watch(self, child: Child) -> Child:
        self.children[child.pid] = child
        self.reap()  # it may have died before we were listening
        return child

    def add_reader(self, fileobj, callback: Callable[[], None]) -> None:
        self.selector.register(fileobj, selectors.EVENT_READ, callback)

    def remove_reader(self, fileobj) -> None:
        try:
            self.selector.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (when, self._timer_seq, callback))

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.call_at(time.monotonic() + delay, callback)

    # -- stopping -----------------------------------------------------------
    def stop(self, child: Child, grace: float, first: int = signal.SIGTERM) -> None:
        """Signal the child's group now and SIGKILL it when the grace runs out.

        The clock starts at the first stop; later stops resend the signal but
        never extend the deadline.
        """
        if not child.running:
            return
        signal_group(child.pgid, first)
        if child.stop_deadline is None:
            child.stop_deadline = time.monotonic() + grace
            self.call_at(child.stop_deadline, lambda: self._kill_if_running(child))

    def _kill_if_running(self, child: Child) -> None:
        if child.running:
            child.outlived_its_grace = True
            signal_group(child.pgid, signal.SIGKILL)

    # -- the loop ---------------------------------------------------------
    def run_until(self, done: Callable[[], bool], deadline: Optional[float] = None) -> bool:
        """Serve events until done() is true (True) or the deadline passes (False)."""
        while not done():
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, callback = heapq.heappop(self._timers)
                callback()
                if done():
                    return True
            if deadline is not None and now >= deadline:
                return False
            timeout = None
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - now)
            if deadline is not None:
                timeout = max(0.0, deadline - now) if timeout is None else min(timeout, max(0.0, deadline - now))
            for key, _ in self.selector.select(timeout):
                key.data()
        return True

    def _drain_signals(self) -> None:
        try:
            data = os.read(self._wake_r, 4096)
        except BlockingIOError:
            return
        reap = False
        for signum in data:
            if signum == signal.SIGCHLD:
                reap = True
            else:
                self.on_signal(signum)
        if reap:
            self.reap()

    def reap(self) -> bool:
        """Collect every exited child: ours get on_exit, adopted orphans are just reaped.

        Returns whether any child (ours or adopted) is still alive.
        """
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            child = self.children.get(pid)
            if child is not None and child.running:
                child.exit_code = exit_code(status)
                if os.WIFSIGNALED(status):
                    child.killed_by = os.WTERMSIG(status)
                if child.popen is not None:
                    child.popen.returncode = child.exit_code  # Popen must not wait again
                self.on_exit(child)

    def serve(self, child: Child, on_signal: Callable[[int], None], pipes_open: Callable[[], bool]) -> None:
        """Serve events until `child` and what is left of its tree are gone,
        then until its output pipes close: at most PIPE_EOF_WAIT more, since a
        process outside the tree may hold a pipe open forever."""
        swept: List[bool] = []

        def on_exit(exited: Child) -> None:
            if exited is child:
                self.sweep(child, on_done=lambda: swept.append(True))

        self.on_signal = on_signal
        self.on_exit = on_exit
        if not child.running:  # it exited before on_exit was set; later exits arrive as SIGCHLD
            on_exit(child)
        self.run_until(lambda: bool(swept))
        self.run_until(lambda: not pipes_open(), deadline=time.monotonic() + PIPE_EOF_WAIT)

    def sweep(self, child: Child, on_done: Callable[[], None], grace: float = STRAGGLER_GRACE) -> None:
        """After a child exited, stop what is left of its group and of our adopted orphans.

        Stragglers get SIGTERM once, then SIGKILL when `grace` runs out; the
        sweep ends when they are gone (or a second after SIGKILL, for what
        cannot die), then calls on_done. Orphans that left the group with
        setsid reach us as a subreaper; their groups are stopped the same way.
        Runs inside the loop, so pipes keep draining meanwhile.
        """
        deadline = time.monotonic() + grace
        termed: set = set()
        state = {"pause": 0.002, "killed_at": None}

        def step() -> None:
            # No child left at all (the usual case) means no adopted orphan
            # either: the scan of /proc is skipped on the way out.
            orphans = [p for p in adopted_children() if p not in self.children] if self.reap() else []
            alive = [g for g in [child.pgid] + _groups_of(orphans) if group_alive(g)]
            now = time.monotonic()
            if not alive or (state["killed_at"] and now > state["killed_at"] + 1.0):
                on_done()
                return
            if now >= deadline:
                state["killed_at"] = state["killed_at"] or now
                for pgid in alive:
                    signal_group(pgid, signal.SIGKILL)
            else:
                for pgid in set(alive) - termed:
                    signal_group(pgid, signal.SIGTERM)
                    termed.add(pgid)
            # Stragglers are not our children until orphaned, so no SIGCHLD
            # tells us they are gone: check again after a short, growing pause.
            self.call_later(state["pause"], step)
            state["pause"] = min(state["pause"] * 2, 0.05)

        step()

    def close(self) -> None:
        self.selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def _groups_of(pids: Iterable[int]) -> List[int]:
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    groups.discard(os.getpgid(0))  # never our own group
    return sorted(groups)


def _note_signal(signum, frame) -> None:
    # The C-level handler has already written signum to the wakeup fd; the loop
    # reads it there. Python needs a handler installed for that to happen.
    pass
