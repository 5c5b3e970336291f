"""Assessors: whether a running trial should stop early, from its intermediate results.

    assessor = build_assessor("Medianstop", {"optimize_mode": "maximize", "start_step": 3})
    assessor.should_stop(trial_id, [0.41, 0.47, 0.52])   # every intermediate result so far
    assessor.trial_end(trial_id, succeeded=True)          # when the trial ends, whatever way

On resume, call trial_end(trial_id, succeeded, step_results) for each finished
trial from the store before assessing running ones.
"""
from __future__ import annotations

import inspect
import itertools
import math
import statistics
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Type

from trialkit import schema
from trialkit.control.tuners import Checker, check_args, check_mode, quiet_optuna
from trialkit.errors import UserError


class Assessor:
    ARGS: ClassVar[Dict[str, Checker]] = {}

    def __init__(self, class_args: Mapping[str, Any]):
        self.optimize_mode = class_args.get("optimize_mode", "maximize")  # NNI's default

    @classmethod
    def check_args(cls, class_args: Any, where: str) -> Dict[str, Any]:
        """classArgs checked and normalized, or UserError."""
        return check_args(class_args, cls.ARGS, where)

    def should_stop(self, trial_id: str, step_results: Sequence[float]) -> bool:
        raise NotImplementedError

    def trial_end(self, trial_id: str, succeeded: bool, step_results: Optional[Sequence[float]] = None) -> None:
        """`step_results` only when this assessor did not see them (resume)."""
        raise NotImplementedError


class MedianstopAssessor(Assessor):
    """Stop a trial whose running average at step s is worse than the median of the
    running averages, at step s, of the trials that completed successfully (NNI's
    Medianstop; the median is the true one, the mean of the middle two for an even
    count). Steps before `start_step` are never judged."""

    ARGS = {"optimize_mode": check_mode, "start_step": lambda v, w: schema.as_int(v, w, minimum=0)}

    def __init__(self, class_args: Mapping[str, Any]):
        super().__init__(class_args)
        self.start_step = class_args.get("start_step", 0)
        self._running: Dict[str, List[float]] = {}
        self._completed_averages: Dict[str, List[float]] = {}

    def should_stop(self, trial_id: str, step_results: Sequence[float]) -> bool:
        results = [float(x) for x in step_results]
        self._running[trial_id] = results
        step = len(results)
        if step == 0 or step < self.start_step:
            return False
        peers = [avg[step - 1] for avg in self._completed_averages.values() if len(avg) >= step]
        peers = [p for p in peers if math.isfinite(p)]
        if not peers:
            return False
        mine = sum(results) / step
        median = statistics.median(peers)
        return mine < median if self.optimize_mode == "maximize" else mine > median

    def trial_end(self, trial_id: str, succeeded: bool, step_results: Optional[Sequence[float]] = None) -> None:
        results = self._running.pop(trial_id, [])
        if step_results is not None:
            results = [float(x) for x in step_results]
        if succeeded and results:
            self._completed_averages[trial_id] = [
                total / n for n, total in enumerate(itertools.accumulate(results), start=1)
            ]


# optuna pruners by the name classArgs `pruner` gives them.
PRUNERS = {
    "median": "MedianPruner",
    "percentile": "PercentilePruner",
    "successivehalving": "SuccessiveHalvingPruner",
    "hyperband": "HyperbandPruner",
    "threshold": "ThresholdPruner",
}


class PrunerAssessor(Assessor):
    """An optuna pruner judging our trials: classArgs `pruner` (median, percentile,
    successivehalving, hyperband, threshold) and that pruner's own arguments,
    e.g. {pruner: percentile, percentile: 25, n_warmup_steps: 3}. Step s is the
    s-th intermediate result (1-based)."""

    ARGS = {"optimize_mode": check_mode, "pruner": lambda v, w: schema.as_choice(v, list(PRUNERS), w)}

    def __init__(self, class_args: Mapping[str, Any]):
        super().__init__(class_args)
        optuna = quiet_optuna()
        pruner = _make_pruner(class_args, "classArgs")
        self._study = optuna.create_study(direction=self.optimize_mode, pruner=pruner)
        self._trials: Dict[str, Any] = {}
        self._results: Dict[str, List[float]] = {}
        self._pruned: Set[str] = set()

    @classmethod
    def check_args(cls, class_args: Any, where: str) -> Dict[str, Any]:
        # The pruner's own arguments pass through; _make_pruner checks them by its signature.
        raw = dict(schema.mapping(class_args or {}, where))
        own = {k: raw.pop(k) for k in list(raw) if k not in cls.ARGS}
        args = {**check_args(raw, cls.ARGS, where), **own}
        _make_pruner(args, where)
        return args

    def should_stop(self, trial_id: str, step_results: Sequence[float]) -> bool:
        trial = self._report(trial_id, step_results)
        if trial.should_prune():
            self._pruned.add(trial_id)
            return True
        return False

    def trial_end(self, trial_id: str, succeeded: bool, step_results: Optional[Sequence[float]] = None) -> None:
        if step_results is not None:
            self._report(trial_id, step_results)
        trial = self._trials.pop(trial_id, None)
        results = self._results.pop(trial_id, [])
        if trial is None:
            return
        TrialState = quiet_optuna().trial.TrialState
        if trial_id in self._pruned:
            self._study.tell(trial, state=TrialState.PRUNED)
        elif succeeded and results:
            self._study.tell(trial, results[-1])
        else:
            self._study.tell(trial, state=TrialState.FAIL)

    def _report(self, trial_id: str, step_results: Sequence[float]) -> Any:
        trial = self._trials.get(trial_id)
        if trial is None:
            trial = self._trials[trial_id] = self._study.ask()
        seen = self._results.setdefault(trial_id, [])
        for step in range(len(seen), len(step_results)):
            seen.append(float(step_results[step]))
            trial.report(seen[-1], step + 1)
        return trial


def _make_pruner(args: Mapping[str, Any], where: str) -> Any:
    """The optuna pruner `args` describe; UserError for arguments it does not take."""
    cls = getattr(quiet_optuna().pruners, PRUNERS[args.get("pruner", "median")])
    own = {k: v for k, v in args.items() if k not in PrunerAssessor.ARGS}
    accepted = [name for name in inspect.signature(cls).parameters if name != "self"]
    for key in own:
        if key not in accepted:
            raise schema.unknown(f"argument of {cls.__name__}", key, accepted + list(PrunerAssessor.ARGS),
                                 schema.path(where, key))
    try:
        return cls(**own)
    except (TypeError, ValueError) as err:
        raise UserError(f"{cls.__name__} refused its arguments: {err}", where,
                        f"see optuna's {cls.__name__} documentation") from None


ASSESSORS: Dict[str, Type[Assessor]] = {"Medianstop": MedianstopAssessor, "Pruner": PrunerAssessor}
NNI_ONLY = ("Curvefitting",)


def check_assessor(name: Any, class_args: Any, where: str = "assessor") -> Tuple[str, Dict[str, Any]]:
    """The canonical name and checked classArgs, or UserError."""
    cls_name = schema.lookup("assessor", name, list(ASSESSORS), NNI_ONLY, schema.path(where, "name"))
    return cls_name, ASSESSORS[cls_name].check_args(class_args, schema.path(where, "classArgs"))


def build_assessor(name: str, class_args: Optional[Mapping[str, Any]] = None) -> Assessor:
    cls_name, args = check_assessor(name, class_args)
    return ASSESSORS[cls_name](args)
