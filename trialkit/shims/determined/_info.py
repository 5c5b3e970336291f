"""`det.get_cluster_info()`: what Determined tells a trial about itself, from trialkit's environment.

The trial id is trialkit's trial sequence number (Determined's ids are
integers, and scripts store and compare them, as its tutorial's checkpoints
do); the hyperparameters are the trial's parameters with Determined's nesting
(a nested group travels as NNI's `_name` choice, which is dropped here); the
latest checkpoint is the last one this trial stored (checkpoint.py), across
its pauses and restarts; the slots and containers are the trial's topology.
"""
import base64
import json
from typing import Any, Dict, List, Optional

from trialkit import env

from . import _storage


def settings(environ: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """The experiment config's part that the Core API serves (env.DETERMINED): searcher, data."""
    import os

    raw = (os.environ if environ is None else environ).get(env.DETERMINED, "")
    if not raw:
        return {}
    try:
        settings = json.loads(base64.urlsafe_b64decode(raw.encode()))
        problem = None if isinstance(settings, dict) else f"a JSON {type(settings).__name__}, not an object"
    except ValueError as err:  # binascii.Error, JSONDecodeError, UnicodeDecodeError: all ValueErrors
        problem = str(err)[:80]
    if problem is not None:
        # What Determined does with cluster info it cannot read: a ValueError. This one says where it came from.
        raise ValueError(f"{env.DETERMINED} in the environment is not what `trialkit run` writes there (base64 of "
                         f"a JSON object: the config's searcher and data): {problem}; unset it, or start the "
                         f"trial with `trialkit run CONFIG CONTEXT_DIR`")
    return settings


def hparams(parameters: Any) -> Any:
    """The parameters as Determined nests them: NNI's `_name` of a nested group dropped, at every depth."""
    if isinstance(parameters, dict):
        return {key: hparams(value) for key, value in parameters.items() if key != "_name"}
    return parameters


class TrialInfo:
    """Determined's `info.trial`."""

    def __init__(self, trial: env.TrialEnv, config: Dict[str, Any]):
        self.trial_id = trial.sequence
        self.experiment_id = trial.experiment_id
        self.trial_run_id = trial.restart_count
        self.trial_seed = trial.sequence
        self.hparams = hparams(trial.parameters())
        self._config = config
        self.steps_completed = 0  # read from your checkpoint: trialkit does not track steps
        self.debug = False


class ClusterInfo:
    """Determined's `det.ClusterInfo`, for a trial task."""

    task_type = "TRIAL"

    def __init__(self, trial: env.TrialEnv, topology: env.Topology, config: Dict[str, Any]):
        self.trial = TrialInfo(trial, config)
        self.task_id = self.allocation_id = f"{trial.experiment_id}.{trial.trial_id}.{trial.restart_count}"
        self.master_url = trial.manager_url
        self.cluster_id = "trialkit"
        self.agent_id = topology.hosts[topology.node_rank] if topology.hosts else topology.chief_addr
        self.slot_ids: List[int] = list(range(topology.slots_per_node))
        self.container_addrs: List[str] = list(topology.hosts) or [topology.chief_addr] * topology.num_nodes
        self.container_rank = topology.node_rank
        self.gpu_uuids: List[str] = []
        self.user_data = config.get("data") or {}
        self.latest_checkpoint = _storage.latest(trial.checkpoint_dir)


def get_cluster_info() -> Optional[ClusterInfo]:
    """The trial's info; None outside a trialkit trial (a script run by hand), as Determined off-cluster."""
    trial = env.read()
    if not trial.under_keeper:
        return None
    return ClusterInfo(trial, env.topology(), settings())
