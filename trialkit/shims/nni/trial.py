"""NNI 3.0's trial API (nni.trial), each function over trialkit's SDK."""
from typing import Any, Dict, Optional

import trialkit

__all__ = [
    "get_next_parameter", "get_next_parameters", "get_current_parameter", "report_intermediate_result",
    "report_final_result", "get_experiment_id", "get_trial_id", "get_sequence_id",
]

_received: Optional[Dict[str, Any]] = None  # NNI's: what get_next_parameter last gave


def get_next_parameter() -> Dict[str, Any]:
    """The trial's hyperparameters, as the tuner proposed them."""
    global _received
    _received = trialkit.get_next_parameter()
    return _received


def get_next_parameters() -> Dict[str, Any]:
    """NNI's alias of get_next_parameter."""
    return get_next_parameter()


def get_current_parameter(tag: Optional[str] = None) -> Any:
    """As NNI: None before get_next_parameter; then all of them, or the one named `tag` (KeyError if absent)."""
    if _received is None:
        return None
    return _received if tag is None else _received[tag]


def report_intermediate_result(metric: Any) -> None:
    """A number, or a dict whose "default" is the number (per epoch, typically)."""
    trialkit.report_intermediate_result(metric)


def report_final_result(metric: Any) -> None:
    trialkit.report_final_result(metric)


def get_experiment_id() -> str:
    return trialkit.get_experiment_id()


def get_trial_id() -> str:
    return trialkit.get_trial_id()


def get_sequence_id() -> int:
    return trialkit.get_sequence_id()
