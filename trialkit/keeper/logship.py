"""The trial's output to the manager, beside its files: records of whole lines.

Each stream's bytes are gathered into chunks of whole lines (flushed at
CHUNK_BYTES, or FLUSH_SECONDS after the first unflushed byte, and at the end)
and each chunk becomes one LOG record through the reporter, so the output
travels as the metrics do: spooled on disk first, shipped in order, surviving
a manager restart, stored once. Lines keep what wrap_rank put before them
(`[rank=N] `): that is how a reader picks one rank.

Bounded, never blocking: a token bucket (RATE_BYTES a second, BURST_BYTES at
once) and a cap on the whole run (CAP_BYTES). What does not fit is dropped
from the records only (the trial's log files keep everything) and counted;
the next record that fits, or the end, carries one line saying what was cut.
"""
from __future__ import annotations

import time

TYPE_CHECKING = False  # no typing at run time: 2 of the 5.6 ms the reporting side imports beside the trial's start
if TYPE_CHECKING:
    from typing import Callable, Optional

CHUNK_BYTES = 64 * 1024
FLUSH_SECONDS = 0.5
RATE_BYTES = 1 << 20  # a second, over the run
BURST_BYTES = 32 << 20  # at once: a training script's start, a long traceback, a test's 10 MB
CAP_BYTES = 256 << 20  # in all, for one run of the trial


class Budget:
    """What the streams of one trial may still ship; shared by stdout and stderr."""

    def __init__(self, rate: float = RATE_BYTES, burst: float = BURST_BYTES, cap: int = CAP_BYTES):
        self.rate, self.burst, self.left = rate, burst, cap
        self.tokens = burst
        self._at = time.monotonic()
        self.cut_lines = 0
        self.cut_bytes = 0
        self.capped = False

    def take(self, size: int, lines: int) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self._at) * self.rate)
        self._at = now
        if size <= self.tokens and size <= self.left:
            self.tokens -= size
            self.left -= size
            return True
        self.capped = self.capped or size > self.left
        self.cut_lines += lines
        self.cut_bytes += size
        return False

    def note(self) -> Optional[str]:
        """The line that says what was cut since the last note, once; None when nothing was."""
        if not self.cut_lines:
            return None
        why = (f"the log cap of {CAP_BYTES >> 20} MiB a run" if self.capped
               else f"the log rate of {int(self.rate) >> 20} MiB/s")
        line = (f"[trialkit: {self.cut_lines} lines ({self.cut_bytes} bytes) of output not sent to the manager: "
                f"over {why}; the trial dir's stdout.log and stderr.log hold them]\n")
        self.cut_lines = self.cut_bytes = 0
        return line


class LogStream:
    """One stream (stdout or stderr) in chunks of whole lines to `ship(stream, text)`."""

    def __init__(self, name: str, budget: Budget, ship: Callable[[str, str], None],
                 call_later: Callable[[float, Callable[[], None]], None]):
        self.name = name
        self.budget = budget
        self.ship = ship
        self.call_later = call_later
        self._buffer = bytearray()
        self._timer_set = False

    def feed(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) >= CHUNK_BYTES:
            self.flush()
        elif not self._timer_set:
            self._timer_set = True
            self.call_later(FLUSH_SECONDS, self._timed)

    def _timed(self) -> None:
        self._timer_set = False
        self.flush()

    def flush(self, final: bool = False) -> None:
        """Ship the whole lines held (everything, at the end)."""
        end = len(self._buffer) if final else self._buffer.rfind(b"\n") + 1
        if end > 0:
            chunk = bytes(self._buffer[:end])
            del self._buffer[:end]
            if final and not chunk.endswith(b"\n"):
                chunk += b"\n"
            if self.budget.take(len(chunk), chunk.count(b"\n")):
                self.ship(self.name, (self.budget.note() or "") + chunk.decode("utf-8", "replace"))
        if final:
            note = self.budget.note()  # what was cut since the last chunk that went out
            if note:
                self.ship(self.name, note)
