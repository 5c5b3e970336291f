"""Tuners: what to try next, from what was learned so far (the contract: tuners/base.py).

    tuner = build_tuner("TPE", {"optimize_mode": "maximize"}, space, seed=7)

Names and classArgs are NNI's (matched case-insensitively, NNI 3.0's aliases
too: BatchTuner, GPTuner, PBTTuner), NNI's advisors among them (Hyperband, BOHB:
`advisor:` or `tuner:` in a config), with optuna's and Katib's samplers under
their own names (CMAES, QMC, Sobol). NNI tuners trialkit does not carry are
refused with the nearest one that it does, and why.

    module        tuners
    classic.py    Random, GridSearch, Batch, Evolution, TPE (optuna), Anneal
    hyperband.py  Hyperband, BOHB (its model: bohb.py, statsmodels' KDE)
    pbt.py        PBT (NNI's generations; `synchronous: false`: asynchronous, as Ray Tune's)
    samplers.py   GP (scikit-learn), CMAES (cmaes), QMC and Sobol (scipy)
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Dict, Mapping, Optional, Tuple, Type

from trialkit import schema
from trialkit.control.searchspace import SearchSpace
from trialkit.control.tuners.base import (
    Checker,
    History,
    Tuner,
    check_args,
    check_mode,
    derived_seed,
    quiet_optuna,
)
from trialkit.control.tuners.classic import (
    AnnealTuner,
    BatchTuner,
    EvolutionTuner,
    GridSearchTuner,
    RandomTuner,
    TPETuner,
)
from trialkit.control.tuners.hyperband import BohbTuner, HyperbandTuner
from trialkit.control.tuners.pbt import Pbt
from trialkit.control.tuners.samplers import CmaEsTuner, GPTuner, QmcTuner, SobolTuner
from trialkit.errors import UserError

# What the rest of the control plane takes from here (assessors share the classArgs checks and optuna).
__all__ = ["TUNERS", "ALIASES", "NNI_ONLY", "NNI_ONLY_ALIASES", "Checker", "History", "Tuner", "build_tuner",
           "canonical_name", "check_args", "check_mode", "check_tuner", "derived_seed", "quiet_optuna"]

TUNERS: Dict[str, Type[Tuner]] = {
    "Random": RandomTuner,
    "GridSearch": GridSearchTuner,
    "Batch": BatchTuner,
    "TPE": TPETuner,
    "Evolution": EvolutionTuner,
    "Anneal": AnnealTuner,
    "Hyperband": HyperbandTuner,
    "BOHB": BohbTuner,
    "PBT": Pbt,
    "GP": GPTuner,
    "CMAES": CmaEsTuner,
    "QMC": QmcTuner,
    "Sobol": SobolTuner,
}
# NNI 3.0's other names for them (its builtin_algorithms.yml).
ALIASES = {"BatchTuner": "Batch", "GPTuner": "GP", "PBTTuner": "PBT"}
# NNI tuners trialkit does not carry: (why, what to use instead), for the one-line refusal.
NNI_ONLY: Dict[str, Tuple[str, str]] = {
    "SMAC": ("SMAC3 builds its random forest (pyrfr) from C++ sources with SWIG and pins a ConfigSpace of its own",
             "TPE, a model of the results that takes choices and conditions as SMAC's forest does, or BOHB"),
    "Metis": ("Metis is NNI's own Gaussian-process and mixture-model code, with no maintained library behind it",
              "GP, the Gaussian process Metis is built around, scikit-learn's"),
    "DNGO": ("DNGO comes from pybnn, unmaintained since 2019",
             "GP: DNGO is a neural network standing in for a Gaussian process"),
    "PPO": ("PPO searches NNI's neural-architecture spaces by reinforcement learning", "TPE for hyperparameters"),
    "NetworkMorphism": ("network morphism searches neural architectures, which trialkit does not",
                        "TPE for hyperparameters"),
    "RegularizedEvolutionTuner": ("it is NNI's second evolution tuner", "Evolution, whose population ages as "
                                  "regularized evolution's does"),
    "TPE_legacy": ("it runs hyperopt, unmaintained since 2021", "TPE, optuna's, univariate as hyperopt's"),
}
NNI_ONLY_ALIASES = {"MetisTuner": "Metis", "DNGOTuner": "DNGO", "PPOTuner": "PPO"}


def canonical_name(name: Any, where: str) -> str:
    """The registered name `name` spells (NNI's aliases included), the one-line refusal of an NNI tuner trialkit
    does not carry, or the nearest name of them all."""
    kind = "advisor" if where.partition(".")[0] == "advisor" else "tuner"  # as the config calls it
    return schema.lookup(kind, name, list(TUNERS), where, {**ALIASES, **NNI_ONLY_ALIASES}, NNI_ONLY)


def check_tuner(name: Any, class_args: Any, space: SearchSpace, where: str = "tuner") -> Tuple[str, Dict[str, Any]]:
    """The canonical name and checked classArgs (optimize_mode filled in), or UserError."""
    cls_name = canonical_name(name, schema.path(where, "name"))
    cls = TUNERS[cls_name]
    args_where = schema.path(where, "classArgs")
    args = check_args(class_args, cls.ARGS, args_where)
    args.setdefault("optimize_mode", cls.DEFAULT_MODE)
    cls.check_class_args(args, args_where)
    cls.check_space(space)
    missing = [module for module in cls.NEEDS if importlib.util.find_spec(module) is None]
    if missing:
        raise UserError(f"{cls_name} needs {', '.join(missing)}, which this Python lacks", schema.path(where, "name"),
                        "install trialkit's search extra: pip install 'trialkit[search]'")
    return cls_name, args


def build_tuner(name: str, class_args: Optional[Mapping[str, Any]], space: SearchSpace, seed: int,
                experiment_dir: Optional[str] = None) -> Tuner:
    """A ready tuner; classArgs `seed` (NNI's) wins over the experiment's `seed`. PBT's checkpoints go under
    `experiment_dir`/checkpoint unless its all_checkpoint_dir says otherwise (NNI's default too)."""
    cls_name, args = check_tuner(name, class_args, space)
    if "all_checkpoint_dir" in TUNERS[cls_name].ARGS and experiment_dir is not None:
        args.setdefault("all_checkpoint_dir", os.path.join(experiment_dir, "checkpoint"))
    return TUNERS[cls_name](space, args["optimize_mode"], args.get("seed", seed), args)
