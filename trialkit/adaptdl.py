"""AdaptDL wiring: where its library looks for checkpoints, and what 143 means.

AdaptDL's library saves its state on SIGTERM and exits 143; it names each
checkpoint after ADAPTDL_NUM_RESTARTS and refuses to save twice under one
number, so the restart counter must rise on every restart (the keeper takes it
from TRIALKIT_RESTART_COUNT, which the platform raises).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict

if TYPE_CHECKING:
    from trialkit.env import TrialEnv

CHECKPOINTED_EXIT = 143  # 128 + SIGTERM: "checkpointed, reschedule me"


def environ(trial: "TrialEnv") -> Dict[str, str]:
    out = {
        "ADAPTDL_CHECKPOINT_PATH": str(trial.checkpoint_dir),
        "ADAPTDL_SHARE_PATH": str(trial.share_dir),
        "ADAPTDL_NUM_RESTARTS": str(trial.restart_count),
        "ADAPTDL_JOB_ID": f"{trial.experiment_id}/{trial.trial_id}",
        # adaptdl 0.2.11 pickles whole objects into its checkpoints; torch 2.x
        # refuses to load them unless weights-only loading is turned off.
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
    }
    if trial.tensorboard_dir:
        out["ADAPTDL_TENSORBOARD_LOGDIR"] = str(trial.tensorboard_dir)
        out["ADAPTDLCTL_TENSORBOARD_LOGDIR"] = str(trial.tensorboard_dir)  # the name NNI's docs use
    return out


def is_checkpointed_exit(exit_code: int, stop_requested: bool) -> bool:
    """143 after a stop we forwarded is a checkpoint, not a failure."""
    return stop_requested and exit_code == CHECKPOINTED_EXIT
