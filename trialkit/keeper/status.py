"""The trial's life in a small JSON file in the trial dir, replaced atomically.

Readers (cleanup.sh, the local platform, a person) never see half a file: each
update is written to a temporary file and renamed over the old one. The file
only mirrors what the keeper holds in memory: when the disk refuses a write
(full, read-only) the keeper says so once and goes on, and the next update
writes everything again. The status itself still reaches the manager as a
record, and the keeper's exit code is the trial's.
"""
from __future__ import annotations

import errno
import json
import os
import sys
import time
from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional

PROG = "trialkit-keeper"  # the keeper's name in its own lines (main.py's usage, its errors, say())


def say(message: str) -> None:
    """A line of the keeper's own on its stderr, told apart from the trial's."""
    print(f"[{PROG}] {message}", file=sys.stderr, flush=True)


_also: Optional[Callable[[bytes], None]] = None  # the trial's stderr once the keeper captures it (warnings_also_to)


def warn(message: str) -> None:
    """A warning on the keeper's stderr, and in the trial's stderr (stderr.log, the manager's copy) where the user
    reads the trial's output: the keeper's stderr is trial.log on the local platform, which few open."""
    say(f"warning: {message}")
    if _also is not None:
        _also(f"[{PROG}] warning: {message}\n".encode("utf-8", "replace"))


def warnings_also_to(write: Callable[[bytes], None]) -> None:
    global _also
    _also = write


class StatusFile:
    def __init__(self, path: Path, warn: Callable[[str], None] = warn):
        self.path = path
        self.data: Dict[str, Any] = {"history": []}
        self._warn = warn
        self._failing: Optional[str] = None  # why the last write failed, said once
        self._tmp = str(path.with_name(path.name + ".tmp"))
        self._tmp_ready = False  # made empty ahead by ready_next()

    @staticmethod
    def previous(path: Path) -> Optional[Dict[str, Any]]:
        """What an earlier keeper on this trial dir left, if anything readable."""
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def update(self, status: Optional[str] = None, **fields: Any) -> bool:
        """Record the change and write the file; False when the disk refused it (the next update tries again)."""
        self.data.update(fields)
        if status is not None:
            self.data["status"] = status
            self.data["history"].append({"status": status, "time": time.time()})
        tmp = self._tmp
        # Made ahead, the file is opened, not created: on the keeper's way out that is a quarter of the
        # cost on a busy journal (0.45 against 1.83 ms median, a CPU burner beside it).
        flags = os.O_WRONLY | os.O_CLOEXEC | (0 if self._tmp_ready else os.O_CREAT | os.O_TRUNC)
        self._tmp_ready = False
        data = json.dumps(self.data).encode()
        try:
            fd = os.open(tmp, flags, 0o644)
            try:
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a short write: the disk filled up
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as err:
            self._lost(Path(tmp), err)
            return False
        if self._failing is not None:
            self._warn(f"{self.path} is written again")
            self._failing = None
        return True

    def ready_next(self) -> None:
        """Make the next update's temporary file now, empty, while nothing waits for it (the final status
        is written on the keeper's way out)."""
        try:
            os.close(os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644))
        except OSError:
            return  # the update creates it then
        self._tmp_ready = True

    def _lost(self, tmp: Path, err: OSError) -> None:
        try:
            tmp.unlink()  # a half-written file would take the little room there is
        except OSError:
            pass
        if self._failing is None:
            self._warn(f"cannot write {self.path} ({err.strerror}); it lags until the disk takes writes "
                       "again (the manager still gets every status)")
        self._failing = err.strerror or str(err)
