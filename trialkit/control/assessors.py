"""Assessors: whether a running trial should stop early, from its intermediate results.

    assessor = build_assessor("Medianstop", {"optimize_mode": "maximize", "start_step": 3})
    assessor.should_stop(trial_id, [0.41, 0.47, 0.52])   # every intermediate result so far
    assessor.trial_end(trial_id, succeeded=True)          # when the trial ends, whatever way

On resume, call trial_end(trial_id, succeeded, step_results) for each finished
trial from the store before assessing running ones.
"""
from __future__ import annotations

import bisect
import inspect
import itertools
import math
import statistics
from typing import Any, ClassVar, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple, Type

from trialkit import schema
from trialkit.control.results import metric_value
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

    def step_value(self, value: Any) -> Any:
        """What this assessor judges of one PERIODICAL record's value (None: nothing); the loop keeps it
        in the trial's steps. Most judge the metric's number; ASHA also the validation's time."""
        return metric_value(value)

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


class AshaAssessor(Assessor):
    """Determined's adaptive_asha, as its searcher stops trials (asha_stopping.go, 0.38).

    Brackets of rungs: a bracket of n rungs has rung k at max_time / divisor**(n-1-k)
    units of the time metric (at least 1), its last at max_time. A trial joins the
    bracket furthest below its share of max_trials (most rungs first). Each
    validation that reaches a rung puts its metric into that rung; a trial not in
    the rung's best max(len / divisor, 1) so far is stopped. A validation is what
    Determined's Core API reports (trialkit/shims/determined: group "validation",
    `metric` and `time_metric` among its metrics; without time_metric, its
    steps_completed), or an intermediate result that is a number (or a dict's
    "default"), whose time is its position: 1 for the first. At the top rung
    Determined tells the trial it is done; here it ends by itself, with its final
    result. A trial that fails (not stopped here) counts as the worst at its rung,
    as Determined counts an early exit.
    """

    ARGS = {
        "optimize_mode": check_mode,
        "metric": schema.as_str,
        "time_metric": lambda v, w: None if v is None else schema.as_str(v, w),
        "max_time": lambda v, w: schema.as_int(v, w, minimum=1),
        "max_trials": lambda v, w: schema.as_int(v, w, minimum=1),
        "divisor": lambda v, w: _above_one(v, w),
        "max_rungs": lambda v, w: schema.as_int(v, w, minimum=1),
        "mode": lambda v, w: schema.as_choice(v, ("aggressive", "standard", "conservative"), w),
        "bracket_rungs": lambda v, w: _rung_counts(v, w),
        "max_concurrent_trials": lambda v, w: schema.as_int(v, w, minimum=0),
    }

    def __init__(self, class_args: Mapping[str, Any]):
        super().__init__(class_args)
        self.metric = class_args.get("metric")  # Determined's searcher metric; not needed for plain numbers
        self.time_metric = class_args.get("time_metric")
        self.divisor = float(class_args.get("divisor", 4))
        self.brackets = asha_brackets(class_args)
        # Each bracket's rungs: (units needed, the metrics seen there, ascending; smaller is better).
        self._rungs = [[(units, []) for units in bracket.units] for bracket in self.brackets]
        self._assigned = [0] * len(self.brackets)
        self._bracket: Dict[str, int] = {}
        self._rung: Dict[str, int] = {}
        self._seen: Dict[str, int] = {}
        self._stopped: Set[str] = set()

    @classmethod
    def check_args(cls, class_args: Any, where: str) -> Dict[str, Any]:
        args = check_args(class_args, cls.ARGS, where)
        for key in ("max_time", "max_trials"):
            if key not in args:
                raise UserError(f"{key} is missing", schema.path(where, key), f"add {key}")
        return args

    def step_value(self, value: Any) -> Any:
        if not isinstance(value, dict) or "group" not in value:
            number = metric_value(value)
            return None if number is None else (None, number)  # its time: its position
        if value["group"] != "validation" or not isinstance(value.get("metrics"), dict):
            return None
        metrics = value["metrics"]
        time = metrics.get(self.time_metric) if self.time_metric else value.get("steps_completed")
        metric, time = metric_value(metrics.get(self.metric)), metric_value(time)
        return None if metric is None or time is None else (time, metric)

    def should_stop(self, trial_id: str, step_results: Sequence[Any]) -> bool:
        if trial_id in self._stopped:
            return True
        seen = self._seen.get(trial_id, 0)
        self._seen[trial_id] = len(step_results)
        for position, (time, metric) in enumerate(step_results[seen:], start=seen + 1):
            if self._record(trial_id, position if time is None else time, metric):
                self._stopped.add(trial_id)
                return True
        return False

    def trial_end(self, trial_id: str, succeeded: bool, step_results: Optional[Sequence[Any]] = None) -> None:
        if step_results is not None:
            self.should_stop(trial_id, step_results)
        if not succeeded and trial_id not in self._stopped and trial_id in self._bracket:
            rung = self._rung[trial_id]
            rungs = self._rungs[self._bracket[trial_id]]
            if rung < len(rungs):
                bisect.insort(rungs[rung][1], math.inf)

    def _record(self, trial_id: str, time: float, metric: float) -> bool:
        """Put one validation into the rungs it reaches; True when the trial should stop."""
        if trial_id not in self._bracket:
            shares = [self._assigned[i] / b.max_trials for i, b in enumerate(self.brackets)]
            self._bracket[trial_id] = shares.index(min(shares))
            self._assigned[self._bracket[trial_id]] += 1
            self._rung[trial_id] = 0
        rungs = self._rungs[self._bracket[trial_id]]
        value = metric if self.optimize_mode == "minimize" else -metric
        while self._rung[trial_id] < len(rungs):
            units, metrics = rungs[self._rung[trial_id]]
            if time < units:
                return False
            index = bisect.bisect_left(metrics, value)
            metrics.insert(index, value)
            self._rung[trial_id] += 1
            if self._rung[trial_id] == len(rungs):
                return False  # the top rung: the trial is done and ends by itself
            if index >= max(int(len(metrics) / self.divisor), 1):
                return True
        return False


def _above_one(value: Any, where: str) -> float:
    number = schema.as_number(value, where)
    if number <= 1:
        raise UserError(f"divisor {value!r} does not halve anything", where, "use a number above 1; 4 is usual")
    return number


def _rung_counts(value: Any, where: str) -> List[int]:
    if not isinstance(value, list) or not value:
        raise UserError(f"expected a list of rung counts, got {schema.show(value)}", where, "write it like [3, 2]")
    return [schema.as_int(item, f"{where}[{i}]", minimum=1) for i, item in enumerate(value)]


class Bracket(NamedTuple):
    units: Tuple[int, ...]  # the time metric's value each rung needs, lowest first
    max_trials: int
    max_concurrent_trials: int


def asha_brackets(args: Mapping[str, Any]) -> List[Bracket]:
    """Determined's adaptive_asha brackets (adaptive_asha.go): rungs, trials and concurrency of each,
    the bracket with the most rungs first."""
    divisor, max_time, max_trials = float(args.get("divisor", 4)), args["max_time"], args["max_trials"]
    rungs = args.get("bracket_rungs")
    if not rungs:
        top = min(args.get("max_rungs", 5), int(math.log(max_time) / math.log(divisor)) + 1,
                  int(math.log(max_trials) / math.log(divisor)) + 1)
        first = {"aggressive": top, "standard": (top - 1) // 2 + 1, "conservative": 1}[args.get("mode", "standard")]
        rungs = list(range(first, top + 1))
    rungs = sorted(rungs, reverse=True)
    weights = [divisor ** (n - 1) / n for n in rungs]
    trials = [max(int(w / sum(weights) * max_trials), 1) for w in weights]
    trials[0] += max(max_trials - sum(trials), 0)
    concurrent = args.get("max_concurrent_trials", 0)
    if concurrent:
        concurrent = max(concurrent, len(rungs))
        each = [concurrent // len(rungs) + (1 if i < concurrent % len(rungs) else 0) for i in range(len(rungs))]
    else:
        each = [max(trials[-1], int(divisor))] * len(rungs)
    return [Bracket(tuple(max(int(max_time / divisor ** (n - 1 - k)), 1) for k in range(n)), t, c)
            for n, t, c in zip(rungs, trials, each)]


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


class CurvefittingAssessor(Assessor):
    """NNI's Curvefitting, with NNI's classArgs: from `start_step` results on (every `gap`-th),
    predict the trial's result at step `epoch_num` from its curve so far, and stop it when the
    prediction is worse than `threshold` times the best final result of the trials that
    succeeded (divided by it when minimizing; NNI's is for maximizing only). No judgement before
    one trial has succeeded, nor while the curve models disagree.

    The prediction follows NNI's CurveModel: fit each curve family to the results (least
    squares), keep those that fit better than the mean does (squared error under avg² · n),
    then those whose predictions lie within n/10 standard deviations of their median; fewer
    than 4 left: no prediction yet. NNI weighs the survivors by MCMC over 12 nonlinear
    families; here they are linear in their parameters (so each fit is one lstsq) and averaged.
    """

    ARGS = {
        "optimize_mode": check_mode,  # NNI's docs and configs give it, and NNI's validator takes it
        "epoch_num": lambda v, w: schema.as_int(v, w, 0, 9999),
        "start_step": lambda v, w: schema.as_int(v, w, 0, 9999),
        "threshold": lambda v, w: _at_most(schema.as_number(v, w, minimum=0), 9999, w),
        "gap": lambda v, w: schema.as_int(v, w, 1, 9999),
    }
    LEAST_FITTED = 4  # NNI's LEAST_FITTED_FUNCTION
    # Each family as its basis functions of the step x (1-based; numpy as np): y = basis(x) . theta.
    FAMILIES = (
        lambda x, np: [x ** 0, x],  # linear
        lambda x, np: [x ** 0, np.log(x)],  # logx_linear
        lambda x, np: [x ** 0, 1 / np.log(x + 1)],  # ilog2
        lambda x, np: [x ** 0, 1 / x],  # a hyperbola's approach to its asymptote
        lambda x, np: [x ** 0, 1 / np.sqrt(x)],
        lambda x, np: [x ** 0, np.log(x), np.log(x) ** 2],  # log_power-like
        lambda x, np: [x ** 0, x, x ** 2],  # quadratic
    )

    def __init__(self, class_args: Mapping[str, Any]):
        super().__init__(class_args)
        self.epoch_num = class_args.get("epoch_num", 20)  # NNI's defaults
        self.start_step = class_args.get("start_step", 6)
        self.threshold = class_args.get("threshold", 0.95)
        self.gap = class_args.get("gap", 1)
        self.best: Optional[float] = None
        self._last: Dict[str, List[float]] = {}
        self._judged: Dict[str, int] = {}

    def should_stop(self, trial_id: str, step_results: Sequence[float]) -> bool:
        results = [r for r in step_results if r is not None]
        self._last[trial_id] = results
        step = len(results)
        if self.best is None or step < self.start_step or step - self._judged.get(trial_id, -self.gap) < self.gap:
            return False
        self._judged[trial_id] = step
        predicted = predict_curve(results, self.epoch_num, self.FAMILIES, self.LEAST_FITTED)
        if predicted is None:
            return False
        if self.optimize_mode == "maximize":
            return predicted <= self.best * self.threshold
        return predicted >= self.best / self.threshold if self.threshold else False

    def trial_end(self, trial_id: str, succeeded: bool, step_results: Optional[Sequence[float]] = None) -> None:
        results = [r for r in (step_results or self._last.get(trial_id) or []) if r is not None]
        self._last.pop(trial_id, None)
        if succeeded and results:
            last = results[-1]
            better = self.best is None or (last > self.best if self.optimize_mode == "maximize" else last < self.best)
            self.best = last if better else self.best


def _at_most(value: float, limit: float, where: str) -> float:
    if value > limit:
        raise UserError(f"{value:g} is above {limit:g}", where, f"use a number from 0 to {limit:g} , NNI's range")
    return value


def predict_curve(results: Sequence[float], target: int, families: Sequence[Any], least: int) -> Optional[float]:
    """The result at step `target` that the curve families agree on (NNI's filters), or None."""
    import numpy

    y = numpy.asarray(results, dtype=float)
    x = numpy.arange(1, len(y) + 1, dtype=float)
    fits = []
    for basis in families:
        design = numpy.column_stack(basis(x, numpy))
        if design.shape[1] > len(y):
            continue
        theta = numpy.linalg.lstsq(design, y, rcond=None)[0]
        error = float(numpy.sum((design @ theta - y) ** 2))
        fits.append((error, float(numpy.column_stack(basis(numpy.array([float(target)]), numpy))[0] @ theta)))
    standard = (float(numpy.mean(y)) ** 2) * len(y)
    kept = [prediction for error, prediction in fits if error < standard and math.isfinite(prediction)]
    if not kept:
        return None
    median, spread = float(numpy.median(kept)), float(numpy.std(kept)) * len(y) / 10
    agreeing = [p for p in kept if median - spread <= p <= median + spread]
    return sum(agreeing) / len(agreeing) if len(agreeing) >= least else None


ASSESSORS: Dict[str, Type[Assessor]] = {"Medianstop": MedianstopAssessor, "Pruner": PrunerAssessor, "ASHA": AshaAssessor,
                                        "Curvefitting": CurvefittingAssessor}
NNI_ONLY: Dict[str, Tuple[str, str]] = {}  # NNI assessors trialkit does not carry: (why, what to use instead)


def check_assessor(name: Any, class_args: Any, where: str = "assessor") -> Tuple[str, Dict[str, Any]]:
    """The canonical name and checked classArgs, or UserError."""
    cls_name = schema.lookup("assessor", name, list(ASSESSORS), schema.path(where, "name"), refused=NNI_ONLY)
    return cls_name, ASSESSORS[cls_name].check_args(class_args, schema.path(where, "classArgs"))


def build_assessor(name: str, class_args: Optional[Mapping[str, Any]] = None) -> Assessor:
    cls_name, args = check_assessor(name, class_args)
    return ASSESSORS[cls_name](args)
