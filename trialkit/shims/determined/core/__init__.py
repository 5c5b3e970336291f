"""Determined's Core API (`det.core`), over trialkit: see _context.py and _distributed.py."""
from ._context import (  # noqa: F401
    CheckpointContext,
    Context,
    DownloadMode,
    EarlyExitReason,
    PreemptContext,
    PreemptMode,
    SearcherContext,
    SearcherMode,
    SearcherOperation,
    TensorboardMode,
    TrainContext,
    Unit,
    init,
)
from ._distributed import DistributedContext, DummyDistributedContext  # noqa: F401
