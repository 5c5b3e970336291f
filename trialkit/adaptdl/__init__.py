"""AdaptDL wiring: what its exit 143 means, and what its checkpoints hold.
Its variables are named in trialkit/env.py.

AdaptDL's library saves its state on SIGTERM and exits 143. With
TRIALKIT_CHECKPOINT_EVERY above 0 the keeper also hooks it (boot/: periodic
checkpoints, atomic saves, the step count kept in each checkpoint).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from trialkit.adaptdl.boot._trialkit_adaptdl import CHECKPOINT_PREFIX, read_progress
from trialkit.adaptdl.boot._trialkit_adaptdl import STAGING  # noqa: F401  (where a checkpoint is written before its commit)

CHECKPOINTED_EXIT = 143  # 128 + SIGTERM: "checkpointed, reschedule me"


def is_checkpointed_exit(exit_code: int, stop_requested: bool) -> bool:
    """143 after a stop we forwarded is a checkpoint, not a failure."""
    return stop_requested and exit_code == CHECKPOINTED_EXIT


def checkpoint_name(restart: int) -> str:
    """AdaptDL's name for the checkpoint written under restart count `restart`."""
    return f"{CHECKPOINT_PREFIX}{restart}"


def checkpoint_step(checkpoint: Path) -> Optional[int]:
    """The training step a committed checkpoint dir was taken at; None if it does not say
    (written without trialkit's hook)."""
    progress = read_progress(str(checkpoint))
    return None if progress is None else int(progress["step"])
