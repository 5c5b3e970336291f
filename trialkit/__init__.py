"""trialkit's face for training code: parameters in, metrics out, stop when asked.

    import trialkit
    params = trialkit.get_next_parameter()
    for epoch in range(epochs):
        trialkit.report_intermediate_result(accuracy)
        if trialkit.should_preempt():
            save_checkpoint(trialkit.checkpoint_dir()); break
    trialkit.report_final_result(accuracy)

Each function is a line over one Session (trialkit/sdk.py), made on first use
so that importing trialkit (the keeper does) costs nothing. A metric is a
number or a dict with a numeric "default"; numpy and torch scalars are taken;
NaN and infinities are kept. These functions never raise into training.
"""
from __future__ import annotations

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Any, Dict, Optional

__all__ = [
    "Trial",
    "get_next_parameter", "get_current_parameter", "report_intermediate_result", "report_final_result",
    "get_trial_id", "get_experiment_id", "get_sequence_id", "should_preempt",
    "checkpoint_dir", "share_dir", "tensorboard_dir", "output_dir",
]

__version__ = "0.1.0"  # setup.py reads it from here; keepers tell it to the manager

_session = None


def _start():
    global _session
    from trialkit.sdk import session

    _session = session()
    return _session


def get_next_parameter() -> Dict[str, Any]:
    """The trial's hyperparameters (a dict; empty when none were given)."""
    return dict((_session or _start()).parameters())


def get_current_parameter(name: Optional[str] = None) -> Any:
    """One parameter by name (None when absent), or all of them."""
    parameters = (_session or _start()).parameters()
    return dict(parameters) if name is None else parameters.get(name)


def report_intermediate_result(metric: Any) -> None:
    (_session or _start()).report("PERIODICAL", metric)


def report_final_result(metric: Any) -> None:
    (_session or _start()).report("FINAL", metric)


def get_trial_id() -> str:
    return (_session or _start()).trial.trial_id


def get_experiment_id() -> str:
    return (_session or _start()).trial.experiment_id


def get_sequence_id() -> int:
    return (_session or _start()).trial.sequence


def should_preempt() -> bool:
    """True once the trial was asked to stop (SIGTERM/SIGINT to the keeper): checkpoint and exit."""
    return (_session or _start()).should_preempt()


def checkpoint_dir() -> str:
    session = _session or _start()
    return session.directory(session.trial.checkpoint_dir)


def share_dir() -> str:
    session = _session or _start()
    return session.directory(session.trial.share_dir)


def output_dir() -> str:
    session = _session or _start()
    return session.directory(session.trial.output_dir)


def tensorboard_dir() -> Optional[str]:
    """Where TensorBoard events go, or None when no TensorBoard dir was set."""
    session = _session or _start()
    return session.directory(session.trial.tensorboard_dir)


def __getattr__(name: str):
    # trialkit.Trial without importing the trial-loading machinery on every `import trialkit`.
    if name == "Trial":
        from trialkit.trial import Trial

        return Trial
    raise AttributeError(f"module 'trialkit' has no attribute {name!r}")
