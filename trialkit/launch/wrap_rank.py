"""Run one worker with every output line prefixed by its rank.

    python -m trialkit.launch.wrap_rank RANK [--] COMMAND [ARGS...]

RANK is an integer, or comma-separated environment variable names tried in
order (RANK,HOROVOD_RANK,OMPI_COMM_WORLD_RANK,PMI_RANK). Each line the command
prints goes out as `[rank=N] line`, stdout to stdout and stderr to stderr, in
bytes (see trialkit.launch.prefix). Its life, as the keeper's: tell the
launcher above who we are, become the reaper of orphans, listen for signals,
start the command in its own session with pipes read as soon as they are
readable (so the command never waits on us, whatever its lines look like),
forward signals to its group (SIGTERM/SIGINT with a bounded grace),
sweep what is left when it exits, report its end to the launcher, and exit
with its code (128+N when signal N ended it). A stop signal (SIGTERM, SIGINT)
is forwarded once: the launcher and the engine both pass it down, and a
script's checkpoint handler must not run twice.
"""
from __future__ import annotations

import fcntl
import os
import select
import signal
import stat
import sys

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Iterator, List, Optional, Sequence, Tuple

    from trialkit.launch.prefix import Buffer

from trialkit import env
from trialkit.errors import UserError, report_and_exit
from trialkit.launch import link as links
from trialkit.launch.prefix import LinePrefixer
from trialkit.process import STOP_SIGNALS, Child, EventLoop, LaunchError, set_child_subreaper, signal_group, spawn
from trialkit.process import set_parent_death_signal  # the same prctl the core sets for its own children

PROG = "trialkit.launch.wrap_rank"
USAGE = f"usage: python -m {PROG} RANK [--] COMMAND [ARGS...]; RANK: an integer or VAR[,VAR...]"
READ_SIZE = 1 << 16  # below malloc's mmap threshold: no page faults for each buffer
READS_PER_WAKEUP = 16  # a pipe-full; then the loop serves signals and the other pipe
PIPE_SIZE = READ_SIZE * READS_PER_WAKEUP  # room for a fast writer while its pipe rests
COALESCE = 0.001  # seconds a drained pipe rests before it is watched again
SMALL_WAKEUP = 4096  # bytes: a wakeup that found less rests its pipe
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def parse_args(argv: Sequence[str]) -> Tuple[str, List[str]]:
    argv = list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        raise SystemExit(0)
    if not argv:
        raise UserError("no RANK given", fix=USAGE)
    spec, command = argv[0], argv[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UserError("no command given", fix=USAGE)
    return spec, command


def resolve_rank(spec: str, environ) -> int:
    """An integer, or the first of the named variables that is set (env.rank_of: a value that is no rank is
    refused, as the SDK reads it)."""
    if spec.isdigit():
        return env.parse_rank("RANK", spec)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    rank = env.rank_of(environ, names) if names else None
    if rank is not None:
        return rank
    what = f"none of {', '.join(names)} is set" if names else f"{spec!r} is neither a rank nor variable names"
    raise UserError(what, "RANK", "give an integer or the variables the launcher sets")


class Relay:
    """One pipe of the command -> prefixed lines on one of our fds, served by the loop.

    A wakeup drains the pipe (up to a pipe-full): after a short read it reads
    on until the pipe is empty, since a writer on another core refills it
    meanwhile (`yes | head`, 512 MiB: 3,949 wakeups instead of 43,843 when
    a short read ended the wakeup). When it found less than a
    page waiting (SMALL_WAKEUP: a command writing many small pieces, a line
    at a time), the pipe rests for COALESCE seconds before it is watched
    again, so that the pieces are read in large chunks, one wakeup per many
    of the command's writes instead of one per write (the per-wakeup cost is
    what a Python reader pays over sed); a line that comes alone is not
    delayed at all, and a burst at most COALESCE. A command that has written
    more by the time we wake is read again at once: a rest would stall it on
    a full pipe (`yes | head`, 8 KiB writes: 0.68x sed when a wakeup below
    64 KiB rested, 1.06x with this threshold; the same CPU as before for a
    command writing a line at a time).
    """

    def __init__(self, loop: EventLoop, pipe_fd: int, out_fd: int, prefix: bytes):
        self.loop = loop
        self.pipe_fd = pipe_fd
        self.out_fd: Optional[int] = out_fd
        # Every rank of a launch writes to the same pipe: a write larger than
        # PIPE_BUF may be cut in the middle of a line by another rank's. Writes
        # of whole lines within PIPE_BUF are atomic, so each line arrives whole.
        self.shared_pipe = stat.S_ISFIFO(os.fstat(out_fd).st_mode)
        self.lines = LinePrefixer(prefix)
        self.open = True
        os.set_blocking(pipe_fd, False)
        loop.add_reader(pipe_fd, self.on_readable)

    def on_readable(self) -> None:
        got = 0
        for _ in range(READS_PER_WAKEUP):
            try:
                data = os.read(self.pipe_fd, READ_SIZE)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.close()
                return
            got += len(data)
            self._write(self.lines.feed(data))
        if got < SMALL_WAKEUP:  # small pieces: let them gather
            self.loop.remove_reader(self.pipe_fd)
            self.loop.call_later(COALESCE, self._resume)

    def _resume(self) -> None:
        if self.open:
            self.loop.add_reader(self.pipe_fd, self.on_readable)

    def close(self) -> None:
        if self.open:
            self.open = False
            self.loop.remove_reader(self.pipe_fd)
            self._write(self.lines.finish())
            os.close(self.pipe_fd)

    def _write(self, buffers: List[Buffer]) -> None:
        if not buffers or self.out_fd is None:
            return
        try:
            if self.shared_pipe:
                for piece in whole_line_pieces(b"".join(buffers), select.PIPE_BUF):
                    _writev_all(self.out_fd, [piece])
            else:
                _writev_all(self.out_fd, buffers)
        except OSError:
            # Our reader is gone: keep draining the command so that it never
            # blocks on a full pipe, and drop what it says.
            self.out_fd = None


def whole_line_pieces(data: bytes, limit: int) -> Iterator[memoryview]:
    """`data` in pieces of at most `limit` bytes, each ending at a line end where a line
    fits (a longer line goes out in pieces of `limit`: it cannot be written atomically)."""
    view, start, size = memoryview(data), 0, len(data)
    while start < size:
        end = min(start + limit, size)
        if end < size:
            cut = data.rfind(b"\n", start, end)
            if cut >= start:
                end = cut + 1
        yield view[start:end]
        start = end


def _writev_all(fd: int, buffers: List[Buffer]) -> None:
    # One writev per batch of whole lines. It nearly always takes them all at
    # once: checked by length, without a view per buffer (a third of the
    # per-chunk cost at 8 KiB chunks). A short write (signal, full
    # non-blocking fd) continues where it stopped.
    try:
        n = os.writev(fd, buffers)
    except BlockingIOError:
        n = 0
    if n == sum(map(len, buffers)):
        return
    views = [memoryview(b) for b in buffers if len(b)]
    while True:
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if not views:
            return
        if n:
            views[0] = views[0][n:]
        try:
            n = os.writev(fd, views)
        except BlockingIOError:
            select.select([], [fd], [])
            n = 0


def connect(rank: int, environ) -> Optional[links.Connection]:
    """The launcher's link when one started us; a missing launcher only costs the report."""
    path = environ.get(env.LAUNCH_SOCKET)
    if not path:
        return None
    try:
        return links.connect(path, rank)
    except OSError as err:
        print(f"[rank={rank}] {PROG}: warning: cannot reach the launcher at {path} ({err}); "
              "running without it", file=sys.stderr, flush=True)
        return None


def start(command: List[str], loop: EventLoop) -> Tuple[Child, List[int]]:
    """The command in its own session, its stdout and stderr into pipes; returns their read ends."""
    environ = links.script_environ(os.environ)
    pipes = [os.pipe(), os.pipe()]
    for read_end, _ in pipes:
        try:
            fcntl.fcntl(read_end, F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass
    try:
        child = spawn(command, env=environ, stdout=pipes[0][1], stderr=pipes[1][1])
    except LaunchError:
        for read_end, _ in pipes:
            os.close(read_end)
        raise
    finally:
        for _, write_end in pipes:
            os.close(write_end)
    return loop.watch(child), [read_end for read_end, _ in pipes]


def supervise(loop: EventLoop, child: Child, relays: List[Relay], grace: float,
              link: Optional[links.Connection]) -> None:
    """Serve events until the command and its tree are gone and its output is out."""
    stops_sent: set = set()

    def on_signal(signum: int) -> None:
        if signum not in STOP_SIGNALS:
            signal_group(child.pgid, signum)
        elif signum not in stops_sent:
            stops_sent.add(signum)
            loop.stop(child, grace, first=signum)

    def on_link() -> None:
        for kind, values in link.read():
            if kind == "signal" and values:
                on_signal(values[0])
        if link.closed:
            loop.remove_reader(link.sock)

    if link:
        loop.add_reader(link.sock, on_link)
    loop.reap()
    loop.serve(child, on_signal, lambda: any(r.open for r in relays))
    for relay in relays:
        relay.close()
    if link:
        loop.remove_reader(link.sock)


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        spec, command = parse_args(sys.argv[1:] if argv is None else argv)
        rank = resolve_rank(spec, os.environ)
    except UserError as err:
        report_and_exit(PROG, err)
    prefix = b"[rank=%d] " % rank
    grace = env.read().grace_seconds
    # The engine above starts us without a parent-death signal: if it is
    # killed, we stop our command as for SIGTERM, so that no worker outlives it.
    set_parent_death_signal(os.getppid(), signal.SIGTERM)
    set_child_subreaper()
    loop = EventLoop()
    loop.install_signal_handlers()
    try:
        child, pipes = start(command, loop)
    except LaunchError as err:
        return report_unstartable(err, rank, prefix)
    # Only now the launcher: the command is on its way while it answers.
    link = connect(rank, os.environ)
    if link:
        link.send("group", child.pgid)
    relays = [Relay(loop, pipe, out_fd, prefix) for pipe, out_fd in zip(pipes, output_fds(link))]
    supervise(loop, child, relays, grace, link)
    if link:
        link.send("exit", child.exit_code, child.killed_by or 0)
        link.close()
    loop.restore_signal_handlers()
    return child.exit_code


def output_fds(link: Optional[links.Connection]) -> Tuple[int, int]:
    """The launcher's stdout and stderr when it shares them, else ours."""
    return (link.fds[0], link.fds[1]) if link and len(link.fds) == 2 else (1, 2)


def report_unstartable(err: LaunchError, rank: int, prefix: bytes) -> int:
    """A command that cannot start is a worker failure like any other: say so, tell the launcher."""
    link = connect(rank, os.environ)
    _writev_all(output_fds(link)[1], [prefix, f"{PROG}: {err}\n".encode()])
    if link:
        link.send("exit", err.code, 0)
        link.close()
    return err.code


if __name__ == "__main__":
    sys.exit(main())
