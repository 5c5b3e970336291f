"""The link between each wrap_rank and the launcher above it: a Unix socket.

The launcher listens in a private directory and names the socket in
TRIALKIT_LAUNCH_SOCKET; the engine (torchrun, deepspeed, horovodrun) passes
its environment on to the workers. Messages are ASCII lines.

wrap_rank -> launcher: `rank R PID` (who it is), `group PGID` (the process
group of the script it started), `exit CODE SIGNAL` (how the script ended;
SIGNAL 0 when it exited by itself). A link that closes before `exit` means
the wrap_rank itself died. So the launcher learns of a failure the moment it
happens, whatever the engine's own polling, and knows every worker's group.

launcher -> wrap_rank: `signal N`, handled as if N had reached wrap_rank.
The launcher stops workers this way rather than signalling their scripts
itself: the engine will soon pass the same signal down to wrap_rank too, and
wrap_rank forwards a stop signal only once, so the script's handler runs once.

The launcher's directory is also the engine's TMPDIR (torchrun leaves a
torchelastic_* dir in its TMPDIR every run, a normal end included), so it is
removed, whatever is in it, at the launcher's end; wrap_rank gives the script
the user's own TMPDIR back (`engine_environ`, `script_environ`).

The launcher's greeting can carry its stdout and stderr (SCM_RIGHTS), for
engines that would otherwise rewrite the workers' output on its way
(horovodrun decodes it as UTF-8 and prefixes it again).
"""
from __future__ import annotations

import os
import socket

from trialkit import env

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

    Message = Tuple[str, Tuple[int, ...]]

GREETING = b"ok\n"
SOCKET_DIR_MAX = 107 - len("/workers.sock")  # sun_path: 108 bytes with its NUL
CONNECT_TIMEOUT = 10.0  # the launcher answers from an idle event loop; this only bounds a wedged one


class Connection:
    """One end of a link, one per connection (hashed by identity).

    A plain class, not a dataclass: dataclasses imports inspect, a few ms of
    every worker's wrap_rank start.
    """

    def __init__(self, sock: socket.socket, fds: Optional[List[int]] = None):
        self.sock = sock
        self.fds: List[int] = fds if fds is not None else []  # the launcher's stdout and stderr, when shared
        self.closed = False  # the other end is gone; the owner unregisters, then closes
        self._buffer = b""

    def read(self) -> List[Message]:
        """The complete messages that arrived (a non-blocking socket)."""
        data = b""
        while not self.closed:
            try:
                chunk = self.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            self.closed = not chunk
            data += chunk
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        return [m for m in map(_parse, lines) if m is not None]

    def send(self, kind: str, *values: int) -> None:
        """Best effort: a vanished peer must not stop training, nor the launcher."""
        try:
            self.sock.sendall(" ".join([kind, *map(str, values)]).encode() + b"\n")
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


class Listener:
    """The launcher's end: accepts wrap_ranks and greets them."""

    def __init__(self, share_fds: Sequence[int] = ()):
        import tempfile  # here, not at the top: every worker's wrap_rank imports this module, and starts faster

        self.dir = tempfile.mkdtemp(prefix="trialkit-launch-")  # mode 0700: only our user connects
        if len(os.fsencode(self.dir)) > SOCKET_DIR_MAX:  # under a long TMPDIR: a socket's path holds 107 bytes
            os.rmdir(self.dir)
            self.dir = tempfile.mkdtemp(prefix="trialkit-launch-", dir="/tmp")
        self.path = os.path.join(self.dir, "workers.sock")
        from trialkit.process import when_gone

        when_gone(self._remove)  # also when the keeper's grace ends in a SIGKILL of the launcher's group
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(128)
        self.sock.setblocking(False)
        self.share_fds = list(share_fds)

    def accept(self) -> Optional[Connection]:
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return None
        # A fresh socket's buffer takes the greeting at once: this never blocks.
        if self.share_fds:
            socket.send_fds(conn, [GREETING], self.share_fds)
        else:
            conn.sendall(GREETING)
        conn.setblocking(False)
        return Connection(conn)

    def close(self) -> None:
        self.sock.close()
        self._remove()

    def _remove(self) -> None:
        import shutil  # here, as tempfile above

        shutil.rmtree(self.dir, ignore_errors=True)  # the socket, and what the engine left in its TMPDIR


def engine_environ(environ: Mapping[str, str], listener: Listener) -> Dict[str, str]:
    """The engine's environment: the link's socket, and the launcher's directory as its TMPDIR."""
    return {**environ, env.LAUNCH_SOCKET: listener.path, "TMPDIR": listener.dir,
            env.LAUNCH_USER_TMPDIR: environ.get("TMPDIR", "")}


def script_environ(environ: Mapping[str, str]) -> Dict[str, str]:
    """A worker's script's environment: without the link (a launcher nested below makes its own), with the
    user's TMPDIR (unset when it was)."""
    out = {name: value for name, value in environ.items() if name != env.LAUNCH_SOCKET}
    if env.LAUNCH_USER_TMPDIR in out:
        user_tmpdir = out.pop(env.LAUNCH_USER_TMPDIR)
        if user_tmpdir:
            out["TMPDIR"] = user_tmpdir
        else:
            out.pop("TMPDIR", None)
    return out


def connect(path: str, rank: int) -> Connection:
    """wrap_rank's end: connect and say who we are; raises OSError when no launcher is there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(path)
        _, fds, _, _ = socket.recv_fds(sock, len(GREETING), 2)
        sock.sendall(b"rank %d %d\n" % (rank, os.getpid()))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return Connection(sock, fds)


def _parse(line: bytes) -> Optional[Message]:
    words = line.decode("ascii", "replace").split()
    if not words:
        return None
    kind, *values = words
    try:
        return kind, tuple(int(v) for v in values)
    except ValueError:
        return None  # not ours: ignore rather than fail a training job over it
