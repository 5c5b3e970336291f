"""Capture of one output stream of the trial: into a file, echoed, scanned.

The event loop reads the child's pipe as soon as it is readable, so the child
never blocks on a full pipe however slow our own stdout is: the file gets every
byte at once, and the echo goes through a bounded buffer drained by a thread.
When that buffer is full, echoed output is left out (never the file's) and a
note marks the gap in the echo. A full disk turns the file off with one
warning and the echo goes on.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Callable, List, Optional, Tuple

READ_SIZE = 1 << 16
READS_PER_TURN = 16  # then back to the loop: a flood of output must not delay a signal
ECHO_BUFFER_BYTES = 64 << 20
ECHO_DRAIN_SECONDS = 5.0  # at exit, how long a slow reader of our output may hold us
DROP_NOTE = (b"[trialkit-keeper] %d bytes of output were not echoed here (the reader was too slow); "
             b"the trial's log file has them\n")


class Echo:
    """Writes chunks to a file descriptor from a thread, holding at most `limit` bytes.

    What does not fit is left out of the echo (the log file has it) and a note
    stands in its place in the stream, so a reader sees where the gap is.
    The thread starts with the first chunk, and an idle one is left asleep at
    close (the keeper leaves by os._exit): a thread woken on the way out takes
    the GIL from the keeper's last steps, which on a loaded machine waited
    for it to be scheduled (bench/bench_keeper.py).
    """

    def __init__(self, fd: int, limit: int = ECHO_BUFFER_BYTES):
        self.fd = fd
        self.limit = limit
        self._chunks: deque = deque()  # bytes to write, or the size of a gap (int)
        self._held = 0
        self._writing = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def put(self, data: bytes) -> None:
        with self._cond:
            if self._closed:
                return
            if self._held + len(data) <= self.limit:
                self._chunks.append(data)
                self._held += len(data)
            elif self._chunks and isinstance(self._chunks[-1], int):
                self._chunks[-1] += len(data)  # the same gap goes on
            else:
                self._chunks.append(len(data))
            self._cond.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"echo-{self.fd}", daemon=True)
            self._thread.start()

    def close(self, timeout: float) -> None:
        """Let the thread write what it holds, for at most `timeout` seconds; an idle one is not woken."""
        with self._cond:
            self._closed = True
            if not self._chunks and not self._writing:
                return
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._writing = False
                while not self._chunks and not self._closed:
                    self._cond.wait()
                if not self._chunks:
                    return
                self._writing = True
                item = self._chunks.popleft()
                if isinstance(item, int):
                    data = DROP_NOTE % item
                else:
                    data = item
                    self._held -= len(item)
            try:
                _write_all(self.fd, data)
            except OSError:
                # Our own stdout is gone (reader closed): the file still has everything.
                with self._cond:
                    self._closed = True
                    self._chunks.clear()
                return


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class LineScanner:
    """Finds whole lines that start with a prefix in a byte stream, at C speed.

    Only lines that can still match are held (up to max_line bytes); from a
    line that cannot, it jumps to the next newline followed by the prefix, so
    ordinary output costs one bytes.find per chunk.
    """

    def __init__(self, prefix: bytes, on_line: Callable[[bytes], None], max_line: int = 1 << 24):
        self.prefix = prefix
        self.on_line = on_line
        self.max_line = max_line
        self._line: Optional[bytearray] = bytearray()  # None: inside a line that cannot match

    def feed(self, data: bytes) -> None:
        pos = 0
        while pos < len(data):
            if self._line is None:
                pos = self._skip(data, pos)
                continue
            end = data.find(b"\n", pos)
            stop = len(data) if end < 0 else end
            missing = len(self.prefix) - len(self._line)
            if missing > 0 and not self.prefix.startswith(bytes(self._line) + data[pos:min(stop, pos + missing)]):
                self._line = None
                continue
            self._line += data[pos:stop]
            if len(self._line) > self.max_line:
                self._line = None
                continue
            if end < 0:
                return
            if self._line.startswith(self.prefix):
                self.on_line(bytes(self._line).rstrip(b"\r"))
            self._line = bytearray()
            pos = end + 1

    def _skip(self, data: bytes, pos: int) -> int:
        """From inside a line that cannot match, to the start of the next one that may."""
        hit = data.find(b"\n" + self.prefix, pos)
        last = hit if hit >= 0 else data.rfind(b"\n", pos)  # the last line may begin the prefix
        if last < 0:
            return len(data)
        self._line = bytearray()
        return last + 1


class Capture:
    """One stream: pipe -> file (+ echo, + optional line scanner)."""

    def __init__(self, pipe_fd: int, path: str, echo_fd: Optional[int], scanner: Optional[LineScanner] = None,
                 tee: Optional[Callable[[bytes], None]] = None):
        self.pipe_fd = pipe_fd
        self.path = path
        self.scanner = scanner
        self.tee = tee  # the manager's copy (keeper.logship), when there is a manager
        self.echo = Echo(echo_fd) if echo_fd is not None else None
        self.open = True
        self._at_line_start = True  # where the last write left the file: a note goes on a line of its own
        self._file = self._open_log()
        os.set_blocking(pipe_fd, False)

    def on_readable(self) -> None:
        """Read what the pipe holds now (a bounded amount); close on EOF."""
        for _ in range(READS_PER_TURN):
            try:
                data = os.read(self.pipe_fd, READ_SIZE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.open = False
                return
            self._to_file(data)
            self._at_line_start = data.endswith(b"\n")
            if self.echo:
                self.echo.put(data)
            if self.scanner:
                self.scanner.feed(data)
            if self.tee:
                self.tee(data)
            if len(data) < READ_SIZE:
                return

    def note(self, line: bytes) -> None:
        """A line of the keeper's own into the file and the manager's copy (not the echo: that is the keeper's
        stderr, which has it already), on a line of its own."""
        if self._file is None:
            return
        line = line if self._at_line_start else b"\n" + line
        self._to_file(line)
        if self.tee:
            self.tee(line)

    def _open_log(self) -> Optional[int]:
        try:
            return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as err:
            self._lost_file(err)
            return None

    def _to_file(self, data: bytes) -> None:
        if self._file is None:
            return
        try:
            _write_all(self._file, data)
        except OSError as err:
            os.close(self._file)
            self._file = None
            self._lost_file(err)

    def _lost_file(self, err: OSError) -> None:
        print(f"[trialkit-keeper] warning: cannot write {self.path} ({err.strerror}); "
              "output is only echoed from now on", file=sys.stderr, flush=True)

    def close(self, echo_deadline: float) -> None:
        """Close the file and the pipe; the echo may catch up until the deadline (monotonic)."""
        if self._file is not None:
            os.close(self._file)
            self._file = None
        if self.echo:
            self.echo.close(max(0.0, echo_deadline - time.monotonic()))
        try:
            os.close(self.pipe_fd)
        except OSError:
            pass


# A failed trial's reason is its stderr's last line: a traceback's last line is the error.
# A trial that cannot import a module usually ran on another Python than the user meant:
# the reason says which one, and for the SDK (trialkit, nni) a hint goes to trial.log too.
_SDK_MODULES = ("trialkit", "nni")
_HINT_TAIL_BYTES = 1 << 16
_OURS = ("trialkit:", "[trialkit-keeper]")  # trialkit's own lines (a fallback nni's note): never the error
REASON_CHARS = 300  # a reason is one line of a table, a progress line, the page


def explain_failure(command: List[str], stderr_path: str, path: Optional[str]) -> Tuple[str, Optional[str]]:
    """(why a failed trial failed, in one line; the hint for its log, or None)."""
    import re  # only on this rare path: the keeper starts in milliseconds

    try:
        with open(stderr_path, "rb") as f:
            f.seek(max(0, os.path.getsize(stderr_path) - _HINT_TAIL_BYTES))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return "", None
    last = next((line.strip() for line in reversed(lines) if line.strip() and not line.startswith(_OURS)), "")
    missing = re.search(r"No module named '([\w.]+)'", last)
    if missing is None:
        return last[:REASON_CHARS], None
    module = missing.group(1).split(".")[0]
    found = _interpreter(command, path)
    hint = None
    if module in _SDK_MODULES:
        hint = (f"hint: the trial's command ran on {found}, which cannot import {module}: install it there "
                f"({found} -m pip install {module}), or start the experiment with the environment that has it "
                f"first on PATH")
    return f"{last} (the trial's command ran on {found})"[:REASON_CHARS], hint


def _interpreter(command: List[str], path: Optional[str]) -> str:
    import shlex
    import shutil

    try:
        words = shlex.split(command[2]) if command[:2] == ["/bin/sh", "-c"] else command
    except ValueError:
        words = command
    interpreter = next((w for w in words if os.path.basename(w).startswith("python")), words[0])
    return shutil.which(interpreter, path=path) or f"{interpreter} (not found on PATH)"
