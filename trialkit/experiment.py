"""The Python API, as NNI's:

    from trialkit.experiment import Experiment
    exp = Experiment('local')
    exp.config.search_space = {"lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]}}
    exp.config.trial_command = "python3 train.py"
    exp.config.tuner.name = "TPE"
    exp.config.tuner.class_args["optimize_mode"] = "maximize"
    exp.config.max_trial_number = 10
    exp.config.trial_concurrency = 2
    exp.config.training_service.use_active_gpu = False
    exp.run(8080)

`exp.config` is a draft: `validate()` turns it into the same ExperimentConfig a
YAML file gives, through the same checks (relative paths against the current
directory).
"""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, Optional

from trialkit import schema
from trialkit.control.config import V2_KEYS, ExperimentConfig, parse_config


class ConfigBag:
    """Keys as attributes (or items). Reading a key that is not there makes an
    empty bag, so `ts.storage.server = ...` works without a config class;
    empty bags are left out of to_dict()."""

    def __init__(self, **items: Any):
        object.__setattr__(self, "_items", dict(items))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe these
            raise AttributeError(name)
        return self._items.setdefault(name, ConfigBag())

    def __setattr__(self, name: str, value: Any) -> None:
        self._items[name] = value

    def __getitem__(self, name: str) -> Any:
        return self._items[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self._items[name] = value

    def __repr__(self) -> str:
        return f"ConfigBag({self.to_dict()!r})"

    def to_dict(self) -> Dict[str, Any]:
        return {k: _plain(v) for k, v in self._items.items() if not _empty(v)}


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, ConfigBag) and not value.to_dict())


def _plain(value: Any) -> Any:
    if isinstance(value, ConfigBag):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return copy.deepcopy(value)


class ExperimentDraft:
    """`exp.config`: the v2 keys as snake_case attributes, None until set."""

    def __init__(self, platform: str):
        for key in V2_KEYS:
            setattr(self, _snake(key), None)
        self.tuner = ConfigBag(name=None, class_args={})
        self.assessor = ConfigBag(name=None, class_args={})
        self.training_service = ConfigBag(platform=platform)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names never set: a typo when reading.
        near = schema.suggest(name, list(vars(self)))
        raise AttributeError(f"experiment config has no {name!r}" + (f"; did you mean {near!r}?" if near else ""))

    def to_dict(self) -> Dict[str, Any]:
        """The v2 config this draft describes; unset keys and nameless algorithms left out."""
        out = {}
        for key, value in vars(self).items():
            if isinstance(value, ConfigBag) and key in ("tuner", "assessor") and value.to_dict().get("name") is None:
                continue
            if not _empty(value):
                out[key] = _plain(value)
        return out

    def validate(self, base_dir: Optional[str] = None) -> ExperimentConfig:
        return parse_config(self.to_dict(), base_dir or os.getcwd(), source="Experiment.config")


def _snake(key: str) -> str:
    return "".join("_" + ch.lower() if ch.isupper() else ch for ch in key)


class Experiment:
    def __init__(self, platform: str = "local"):
        self.config = ExperimentDraft(platform)

    def run(self, port: int = 8080) -> Any:
        """Validate, run the experiment until it ends, and return its results."""
        from trialkit.control.runner import run_experiment  # the control plane loads only when run

        return run_experiment(self.config.validate(), port=port)
