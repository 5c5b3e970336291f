"""When the experiment's disk takes no writes: telling it from a bug, saying it once, noticing it passed.

A full, read-only, unwritable or failing disk (ENOSPC, EROFS, EACCES, EPERM,
EIO, EDQUOT; SQLite's FULL, IOERR, READONLY, CANTOPEN, PERM) is a condition
of the machine, not of the experiment: the manager keeps running, answers
keepers 503 (they keep their records in their spools and retry), starts no
trial, and goes on by itself once writes pass again. `DiskWatch` holds the
condition: the server and the experiment loop report each failed write to
it, it logs one line when the condition starts and one when it ends, and
while it lasts it tries a small write in the experiment dir every
`probe_seconds` so that it ends even when no keeper is left to write.
"""
from __future__ import annotations

import errno
import os
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Callable, Optional

FAULT_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EDQUOT})
# SQLite's primary result codes for the same conditions (the extended codes keep them in the low byte).
_SQLITE_FAULTS = {3: "permission denied", 8: "the database is read-only", 10: "disk I/O error",
                  13: "the disk is full", 14: "cannot open the database file", 23: "not authorized"}
PROBE_SECONDS = 1.0
PROBE_NAME = ".trialkit-write-probe"


def fault_reason(err: BaseException) -> Optional[str]:
    """A short reason when `err` is the disk refusing a write; None for anything else (a bug)."""
    if isinstance(err, OSError) and err.errno in FAULT_ERRNOS:
        return os.strerror(err.errno)
    if isinstance(err, sqlite3.OperationalError):
        code = getattr(err, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in _SQLITE_FAULTS:
            return _SQLITE_FAULTS[code & 0xFF]
    return None


class DiskWatch:
    """The condition of one experiment dir's disk, shared by the server's threads and the experiment loop."""

    def __init__(self, directory: Path, log: Optional[Callable[[str], None]] = None,
                 probe_seconds: float = PROBE_SECONDS):
        self.directory = Path(directory)
        self.probe_seconds = probe_seconds
        self._log = log or (lambda line: print(f"trialkit-manager: {line}", file=sys.stderr, flush=True))
        self._lock = threading.Lock()
        self._problem: Optional[str] = None
        self._stop = threading.Event()
        self._prober: Optional[threading.Thread] = None

    @property
    def problem(self) -> Optional[str]:
        """What is wrong now (one line), or None while writes pass."""
        return self._problem

    def failed(self, err: BaseException, what: str) -> bool:
        """Note a failed write of `what`; False (nothing noted) when `err` is not a disk fault."""
        reason = fault_reason(err)
        if reason is None:
            return False
        with self._lock:
            started = self._problem is None
            self._problem = f"cannot write {what} in {self.directory}: {reason}"
            if started:
                self._log(f"{self._problem}; keepers keep their records and retry, no trial starts, "
                          "and the experiment goes on by itself once the disk takes writes again")
                if not self._stop.is_set():
                    self._prober = threading.Thread(target=self._probe, name="trialkit-disk-probe", daemon=True)
                    self._prober.start()
        return True

    def passed(self) -> None:
        """A write went through: the condition, if any, is over."""
        with self._lock:
            if self._problem is None:
                return
            self._problem = None
        self._log(f"the disk of {self.directory} takes writes again; going on")

    def close(self) -> None:
        self._stop.set()
        prober = self._prober
        if prober is not None and prober is not threading.current_thread():
            prober.join()

    def _probe(self) -> None:
        while self._problem is not None and not self._stop.wait(self.probe_seconds):
            if probe_write(self.directory):
                self.passed()


def probe_write(directory: Path) -> bool:
    """Whether a small file can be written, synced and removed in `directory` now."""
    path = Path(directory) / PROBE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"x" * 4096)  # a page: a disk with no page free refuses it
            os.fsync(fd)
        finally:
            os.close(fd)
        path.unlink()
        return True
    except OSError:
        try:
            path.unlink()
        except OSError:
            pass
        return False
