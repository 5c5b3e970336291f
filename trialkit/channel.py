"""The trial's side of the SDK -> keeper channel: an append-only file of framed records.

Why a file and not a pipe or a socket: appending to a local file never blocks
on the keeper (a pipe fills up, a socket needs a reader), it survives a
keeper restart (the new keeper reads on from where the spool says the old one
stopped), and any number of processes (all ranks, forked data loaders) can
share it without a lock: with O_APPEND each record is one write(2) that the
kernel places at the end as a whole. A process killed inside that write
leaves at most a torn last frame, which the keeper's decoder skips; so does a
write that a full disk cut short (the SDK writes that frame again whole).
"""
from __future__ import annotations

import os
from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Optional

# What a trial ending on a full disk hands its keeper on stdout besides its held records (NNI's record
# lines, `NNISDK_MEb'{"type": "LOST", "value": N}'`): how many records it could neither write nor hold.
# Never a record: the keeper adds N to the count its final status carries.
LOST = "LOST"


class ChannelWriter:
    def __init__(self, path: Path):
        self.path = path
        self._fd: Optional[int] = None

    def write(self, data: bytes) -> int:
        """Append `data` with one write(2); the bytes written, fewer only when the disk filled up
        (the caller sends a frame cut short again whole: the keeper's decoder skips the torn piece).
        Raises OSError (the caller decides what a failure means)."""
        fd = self._fd
        if fd is None:
            fd = self._open()
        return os.write(fd, data)

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
