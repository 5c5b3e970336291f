"""What AdaptDL's exit 143 means. Its variables are named in trialkit/env.py.

AdaptDL's library saves its state on SIGTERM and exits 143.
"""
from __future__ import annotations

CHECKPOINTED_EXIT = 143  # 128 + SIGTERM: "checkpointed, reschedule me"


def is_checkpointed_exit(exit_code: int, stop_requested: bool) -> bool:
    """143 after a stop we forwarded is a checkpoint, not a failure."""
    return stop_requested and exit_code == CHECKPOINTED_EXIT
