"""Where the keeper puts what it learns about the trial.

The status file in the trial dir always; records (metrics and status changes)
go through the durable spool to the manager (see spool.py and shipper.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from trialkit.env import TrialEnv
from trialkit.keeper.status import StatusFile
from trialkit.process import EventLoop


class Reporter:
    def __init__(self, trial: TrialEnv, home: Path):
        self.trial = trial
        self.home = home
        self.status_file = StatusFile(home / "status.json")

    def attach(self, loop: EventLoop) -> None:
        """Hook the reporter's event sources into the keeper's loop."""

    def status(self, status: str, **fields: Any) -> None:
        self.status_file.update(status, **fields)

    def nni_stdout_line(self, line: bytes) -> None:
        """A `NNISDK_MEb'...'` line from the trial's stdout."""

    def finish(self, deadline: float) -> None:
        """Deliver what is pending until the deadline (monotonic seconds)."""
