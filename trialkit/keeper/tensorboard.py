"""Numeric metrics as TensorBoard scalars, written by the keeper (never the training loop).

tensorboardX is imported on the first metric, and only when a TensorBoard dir
is set: a keeper without one never pays for it. Intermediate results go under
`metric/<name>`, final results under `final/<name>` (records.scalars' names).

A trial's runs (paused and activated, preempted, retried) are one series, as
every other view shows them: a report that names its step (Determined's
steps_completed) is written at that step, where TensorBoard lets a later
run's report replace an earlier one's; the others at their place in the
series, each run going on after what the dir's event files already hold (an
earlier run's reports) rather than from 0 again, where its steps would lie
over the earlier run's. The event files are read once, when the first metric
opens the writer.

If tensorboardX is missing or the dir cannot be written, that is said once and
metrics keep flowing to the manager.
"""
from __future__ import annotations

import struct
from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: 2 of the 5.6 ms the reporting side imports beside the trial's start
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional

from trialkit import records

EVENT_FILES = "events.out.tfevents.*"  # the names tensorboardX (and TensorFlow) give their event files


class Scalars:
    def __init__(self, logdir: Path, warn: Callable[[str], None]):
        self.logdir = logdir
        self.warn = warn
        self._writer = None
        self._broken = False
        self._last: Optional[int] = None  # the last step in the dir, of an earlier run or this keeper's
        self._offsets: Dict[Any, int] = {}  # run -> the step its sequence numbers count from

    def add(self, rec: Dict[str, Any]) -> None:
        if self._broken or rec["type"] not in records.METRIC_TYPES:
            return
        pairs = list(records.scalars(rec["value"]))
        if not pairs:
            return
        writer = self._writer or self._open()
        if writer is None:
            return
        prefix = "metric" if rec["type"] == records.PERIODICAL else "final"
        step = self._step(rec)
        try:
            for name, value in pairs:
                writer.add_scalar(f"{prefix}/{name}", value, step, walltime=rec["time"])
        except OSError as err:
            self._give_up(f"cannot write to {self.logdir} ({err})")
        self._last = step if self._last is None else max(self._last, step)

    def _step(self, rec: Dict[str, Any]) -> int:
        """The report's own step where it names one, else its sequence number counted from where its run's first
        report went: right after the last step written (0 in an empty dir)."""
        named = records.report_step(rec["value"])
        if named is not None:
            return named[1]
        sequence = rec.get("sequence") or 0
        run = rec.get("run")
        if run not in self._offsets:
            self._offsets[run] = 0 if self._last is None else self._last + 1 - sequence
        return self._offsets[run] + sequence

    def _open(self):
        try:
            from tensorboardX import SummaryWriter

            self._last = last_step(self.logdir)  # before the writer adds its own file
            self._writer = SummaryWriter(str(self.logdir))
        except (ImportError, OSError) as err:
            self._give_up(f"cannot write TensorBoard scalars to {self.logdir} ({err})")
        return self._writer

    def _give_up(self, why: str) -> None:
        self._broken = True
        self.warn(f"{why}; metrics still go to the manager")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def last_step(logdir: Path) -> Optional[int]:
    """The last step of the scalars in the dir's event files, None when they hold none (or there are none).

    An event file is TFRecords: a little-endian uint64 length, its masked CRC, the serialized Event, the data's
    CRC; a file cut short (a writer killed mid-event) is read up to the cut.
    """
    from google.protobuf.message import DecodeError
    from tensorboardX.proto.event_pb2 import Event

    last = None
    for path in sorted(logdir.glob(EVENT_FILES)):
        data = path.read_bytes()
        at = 0
        while at + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            body = data[at + 12:at + 12 + length]
            if len(body) < length:
                break
            try:
                event = Event.FromString(body)
            except DecodeError:
                break
            if event.summary.value:
                last = event.step if last is None else max(last, event.step)
            at += 12 + length + 4
    return last
