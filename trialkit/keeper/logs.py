"""Capture of one output stream of the trial: into a file, echoed, scanned.

The event loop reads the child's pipe as soon as it is readable, so the child
never blocks on a full pipe however slow our own stdout is: the file gets every
byte at once, and the echo goes through a bounded buffer drained by a thread.
When that buffer is full, echoed output is dropped (never the file's) and the
drop is said once the echo catches up. A full disk turns the file off with one
warning and the echo goes on.
"""
from __future__ import annotations

import os
import sys
import threading
from collections import deque
from typing import Callable, Optional

READ_SIZE = 1 << 16
ECHO_BUFFER_BYTES = 64 << 20


class Echo:
    """Writes chunks to a file descriptor from a thread, holding at most a bounded amount."""

    def __init__(self, fd: int, limit: int = ECHO_BUFFER_BYTES):
        self.fd = fd
        self.limit = limit
        self._chunks: deque = deque()
        self._held = 0
        self._dropped = 0
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"echo-{fd}", daemon=True)
        self._thread.start()

    def put(self, data: bytes) -> None:
        with self._cond:
            if self._held + len(data) > self.limit:
                self._dropped += len(data)
                return
            self._chunks.append(data)
            self._held += len(data)
            self._cond.notify()

    def close(self, timeout: float) -> None:
        """Let the thread write what it holds, for at most `timeout` seconds."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._chunks and not self._closed:
                    self._cond.wait()
                if not self._chunks:
                    return
                data = self._chunks.popleft()
                self._held -= len(data)
                dropped, self._dropped = self._dropped, 0
            if dropped:
                data = (b"[trialkit-keeper] %d bytes of output were not echoed (the reader was too slow); "
                        b"the trial's log file has them\n" % dropped) + data
            try:
                _write_all(self.fd, data)
            except OSError:
                return  # our own stdout is gone (reader closed): the file still has everything


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class LineScanner:
    """Finds whole lines that start with a prefix in a byte stream, without holding other lines."""

    def __init__(self, prefix: bytes, on_line: Callable[[bytes], None], max_line: int = 1 << 24):
        self.prefix = prefix
        self.on_line = on_line
        self.max_line = max_line
        self._partial = b""
        self._skipping = False  # inside a line that cannot match

    def feed(self, data: bytes) -> None:
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            if not self._skipping:
                self._partial += piece
                head = self._partial[: len(self.prefix)]
                if not self.prefix.startswith(head) or len(self._partial) > self.max_line:
                    self._partial, self._skipping = b"", True
            if end < 0:
                return
            if not self._skipping and self._partial.startswith(self.prefix):
                self.on_line(self._partial.rstrip(b"\r"))
            self._partial, self._skipping = b"", False
            start = end + 1


class Capture:
    """One stream: pipe -> file (+ echo, + optional line scanner)."""

    def __init__(self, pipe_fd: int, path: str, echo_fd: Optional[int], scanner: Optional[LineScanner] = None):
        self.pipe_fd = pipe_fd
        self.path = path
        self.scanner = scanner
        self.echo = Echo(echo_fd) if echo_fd is not None else None
        self.open = True
        self._file: Optional[int] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.set_blocking(pipe_fd, False)

    def on_readable(self) -> None:
        """Read what the pipe holds now; close on EOF."""
        while True:
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
            if self.echo:
                self.echo.put(data)
            if self.scanner:
                self.scanner.feed(data)
            if len(data) < READ_SIZE:
                return

    def _to_file(self, data: bytes) -> None:
        if self._file is None:
            return
        try:
            _write_all(self._file, data)
        except OSError as err:
            print(f"[trialkit-keeper] warning: cannot write {self.path} ({err.strerror}); "
                  "output is only echoed from now on", file=sys.stderr, flush=True)
            os.close(self._file)
            self._file = None

    def close(self, echo_timeout: float = 5.0) -> None:
        if self._file is not None:
            os.close(self._file)
            self._file = None
        if self.echo:
            self.echo.close(echo_timeout)
        try:
            os.close(self.pipe_fd)
        except OSError:
            pass
