"""One trial as every platform receives it: the TrialSpec and its environment contract.

The experiment loop submits what `build_spec` gives, and `trialkit render`
shows the same spec rendered, so what a user inspects is what would run.
"""
from __future__ import annotations

from typing import Any, Dict

from trialkit import env, records
from trialkit.control.config import ExperimentConfig
from trialkit.manager.paths import trial_id as make_trial_id
from trialkit.platforms.base import TrialSpec


def build_spec(config: ExperimentConfig, experiment_id: str, sequence: int, parameter_id: int,
               parameters: Dict[str, Any], manager_url: str, token: str, restart_count: int = 0) -> TrialSpec:
    """The spec of trial `sequence`, with the whole environment contract (the token among its secrets)."""
    trial = make_trial_id(experiment_id, sequence)
    contract = {
        env.EXPERIMENT_ID: experiment_id,
        env.TRIAL_ID: trial,
        env.SEQUENCE: str(sequence),
        env.PLATFORM: config.platform,
        env.MANAGER_URL: manager_url,
        env.TOKEN: token,
        env.PARAMETERS: records.dumps(parameters),
        env.PARAMETER_ID: str(parameter_id),
        env.GRACE_SECONDS: f"{config.trial_grace_seconds:g}",
        env.CODE_DIR: config.trial_code_directory,
        env.RESTART_COUNT: str(restart_count),
    }
    if config.trial_command is not None:
        contract[env.COMMAND] = config.trial_command
    if config.trial_checkpoint_every is not None:
        contract[env.CHECKPOINT_EVERY] = f"{config.trial_checkpoint_every:g}"
    storage = config.checkpoint_storage
    if storage is not None and storage.store is not None:
        contract[env.CHECKPOINT_STORE] = records.dumps(storage.store)
    return TrialSpec(
        experiment_id=experiment_id,
        trial_id=trial,
        sequence=sequence,
        command=config.trial_command,
        env=contract,
        code_dir=config.trial_code_directory,
        priority=config.priority,
        env_from_secrets=(storage.secret_name,) if storage is not None and storage.secret_name else (),
    )
