"""Numeric metrics as TensorBoard scalars, written by the keeper (never the training loop).

tensorboardX is imported on the first metric, and only when a TensorBoard dir
is set: a keeper without one never pays for it. Intermediate results go under
`metric/<name>` at step = their sequence; final results under `final/<name>`.
If tensorboardX is missing or the dir cannot be written, that is said once and
metrics keep flowing to the manager.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict

from trialkit import records


class Scalars:
    def __init__(self, logdir: Path, warn: Callable[[str], None]):
        self.logdir = logdir
        self.warn = warn
        self._writer = None
        self._broken = False

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
        step = rec.get("sequence") or 0
        try:
            for name, value in pairs:
                writer.add_scalar(f"{prefix}/{name}", value, step, walltime=rec["time"])
        except OSError as err:
            self._give_up(f"cannot write to {self.logdir} ({err})")

    def _open(self):
        try:
            from tensorboardX import SummaryWriter

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
