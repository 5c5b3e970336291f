"""Tuners: what to try next, from what was learned so far.

The experiment loop speaks to every tuner the same way:

    tuner = build_tuner("TPE", {"optimize_mode": "maximize"}, space, seed=7)
    tuner.replay(history)            # on resume, before the first ask
    parameter_id, params = tuner.ask()   # None once the tuner has nothing left
    tuner.tell(parameter_id, 0.93)   # or tuner.tell_failed(parameter_id)

Names and classArgs are NNI's (Random, GridSearch, TPE, Evolution, Anneal; matched
case-insensitively). TPE is optuna's TPESampler through its ask-and-tell API.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import random
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Mapping, Optional, Set, Tuple, Type

from trialkit import schema
from trialkit.control.searchspace import Choice, Nested, SearchSpace

MODES = ("maximize", "minimize")
# (parameter_id, params, final value or None when none arrived yet)
History = Iterable[Tuple[int, Mapping[str, Any], Optional[float]]]
Checker = Callable[[Any, str], Any]


def check_mode(value: Any, where: str) -> str:
    return schema.as_choice(value, MODES, where)


def _seed(value: Any, where: str) -> int:
    return schema.as_int(value, where, minimum=0, maximum=2**32 - 1)  # numpy's seed range


def check_args(args: Any, spec: Mapping[str, Checker], where: str) -> Dict[str, Any]:
    """classArgs checked against `spec` (arg name -> checker); names as NNI spells them."""
    if args is None:
        return {}
    args = schema.normalize_keys(args, list(spec), where)
    return {key: spec[key](value, schema.path(where, key)) for key, value in args.items()}


class Tuner:
    """Base: parameter ids, idempotent results and replay; subclasses fill the hooks."""

    ARGS: ClassVar[Dict[str, Checker]] = {"optimize_mode": check_mode}
    DEFAULT_MODE: ClassVar[str] = "maximize"

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        self.space = space
        self.optimize_mode = optimize_mode
        self.seed = seed  # the effective one: store it to rebuild this tuner
        self._next_id = 0
        self._params: Dict[int, Dict[str, Any]] = {}
        self._finished: Set[int] = set()

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        """UserError when this tuner cannot search `space` (a grid of a continuous range)."""

    def better(self, a: float, b: float) -> bool:
        return a > b if self.optimize_mode == "maximize" else a < b

    def ask(self) -> Optional[Tuple[int, Dict[str, Any]]]:
        parameter_id = self._next_id
        params = self._propose(parameter_id)
        if params is None:
            return None
        self._next_id += 1
        self._params[parameter_id] = params
        return parameter_id, copy.deepcopy(params)

    def tell(self, parameter_id: int, final_value: float) -> None:
        """The trial's final metric; a NaN or infinite one counts as a failure. Repeats are ignored."""
        if self._finish(parameter_id):
            value = float(final_value)
            if math.isfinite(value):
                self._completed(parameter_id, value)
            else:
                self._failed(parameter_id)

    def tell_failed(self, parameter_id: int) -> None:
        """The trial ended without a final metric (failed, killed, early-stopped)."""
        if self._finish(parameter_id):
            self._failed(parameter_id)

    def replay(self, history: History) -> None:
        """Rebuild state from stored trials, on a fresh tuner before its first ask.

        An entry without a value is taken as still running: tell() or
        tell_failed() it later. Parameter ids continue after the largest one.
        """
        for parameter_id, params, value in sorted(history, key=lambda entry: entry[0]):
            self._params[parameter_id] = copy.deepcopy(dict(params))
            self._adopt(parameter_id, self._params[parameter_id])
            self._next_id = max(self._next_id, parameter_id + 1)
            if value is not None:
                self.tell(parameter_id, value)

    def import_results(self, results: List[Tuple[Dict[str, Any], float]]) -> None:
        """Results found elsewhere (`nnictl experiment import`'s data), learned from as if run here, under
        parameter ids after every one handed out."""
        self.replay([(self._next_id + i, params, value) for i, (params, value) in enumerate(results)])

    def _finish(self, parameter_id: int) -> bool:
        if parameter_id not in self._params:
            raise KeyError(f"parameter id {parameter_id} was never handed out")
        if parameter_id in self._finished:
            return False
        self._finished.add(parameter_id)
        return True

    # hooks
    def _propose(self, parameter_id: int) -> Optional[Dict[str, Any]]:
        raise NotImplementedError

    def _adopt(self, parameter_id: int, params: Dict[str, Any]) -> None:
        """A replayed trial's parameters, as if `_propose` had given them."""

    def _completed(self, parameter_id: int, value: float) -> None:
        pass

    def _failed(self, parameter_id: int) -> None:
        pass


class RandomTuner(Tuner):
    ARGS = {"optimize_mode": check_mode, "seed": _seed}

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        self._rng = random.Random(seed)

    def _propose(self, parameter_id: int) -> Dict[str, Any]:
        return self.space.sample(self._rng)

    def _adopt(self, parameter_id: int, params: Dict[str, Any]) -> None:
        # Draw what the first run drew, so a resumed run continues its sequence.
        self.space.sample(self._rng)


class GridSearchTuner(Tuner):
    ARGS = {"optimize_mode": check_mode}

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        self._points = space.grid()
        self._seen: Set[str] = set()

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        space.check_grid()

    def _propose(self, parameter_id: int) -> Optional[Dict[str, Any]]:
        for point in self._points:
            if _key(point) not in self._seen:
                return point
        return None

    def _adopt(self, parameter_id: int, params: Dict[str, Any]) -> None:
        self._seen.add(_key(params))


def _key(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=repr)


class EvolutionTuner(Tuner):
    """NNI's Evolution: random until the population is there, then tournaments.

    Each ask picks two members of the population at random; the worse one leaves
    the population and a copy of the better one with one parameter sampled anew
    is proposed. Each result joins the population.
    """

    ARGS = {"optimize_mode": check_mode, "population_size": lambda v, w: schema.as_int(v, w, minimum=2), "seed": _seed}

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        self._rng = random.Random(seed)
        self._size = class_args.get("population_size", 32)
        self._population: List[Tuple[Dict[str, Any], float]] = []

    def _propose(self, parameter_id: int) -> Dict[str, Any]:
        if len(self._params) < self._size or len(self._population) < 2:
            return self.space.sample(self._rng)
        a, b = self._rng.sample(range(len(self._population)), 2)
        winner, loser = (a, b) if self.better(self._population[a][1], self._population[b][1]) else (b, a)
        child = self.space.mutate(self._population[winner][0], self._rng)
        del self._population[loser]
        return child

    def _completed(self, parameter_id: int, value: float) -> None:
        params = self._params[parameter_id]
        if self.space.contains(params):
            self._population.append((params, value))
            # Replayed history can exceed the population; the oldest members go first.
            del self._population[: -self._size]


class TPETuner(Tuner):
    """optuna's TPE. Choices are categorical over option indexes (nested ones
    suggest their sub-parameters conditionally); numeric parameters are modelled
    in their unit coordinate (see searchspace)."""

    ARGS = {
        "optimize_mode": check_mode,
        "seed": _seed,
        "tpe_args": lambda v, w: check_args(v, _TPE_ARGS, w),
    }
    DEFAULT_MODE = "minimize"  # NNI's TPE default

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        optuna = quiet_optuna()
        tpe = class_args.get("tpe_args") or {}
        options: Dict[str, Any] = {
            "seed": seed,
            "n_startup_trials": tpe.get("n_startup_jobs", 20),  # NNI's defaults
            "n_ei_candidates": tpe.get("n_ei_candidates", 24),
            # NNI's liars (best/worst/mean) all map onto optuna's one; null turns it off.
            "constant_liar": tpe.get("constant_liar_type", "best") is not None,
        }
        self._study = optuna.create_study(direction=optimize_mode, sampler=optuna.samplers.TPESampler(**options))
        self._trials: Dict[int, Any] = {}

    def _propose(self, parameter_id: int) -> Dict[str, Any]:
        trial = self._study.ask()
        self._trials[parameter_id] = trial
        return _suggest(self.space, trial, ())

    def _adopt(self, parameter_id: int, params: Dict[str, Any]) -> None:
        if self.space.contains(params):  # history from an older space teaches nothing
            self._study.enqueue_trial(_fixed(self.space, params, ()))
            self._propose(parameter_id)

    def _completed(self, parameter_id: int, value: float) -> None:
        trial = self._trials.pop(parameter_id, None)
        if trial is not None:
            self._study.tell(trial, value)

    def _failed(self, parameter_id: int) -> None:
        trial = self._trials.pop(parameter_id, None)
        if trial is not None:
            self._study.tell(trial, state=quiet_optuna().trial.TrialState.FAIL)


class AnnealTuner(Tuner):
    """NNI's Anneal (hyperopt's anneal.suggest): samples from the search space until a result is
    in, then near one of the best so far, in a neighbourhood that shrinks as results come in.

    The trial annealed around is drawn down the ranking, the best most often (a geometric draw
    of mean AVG_BEST_IDX, hyperopt's 2.0); each numeric parameter moves in its unit coordinate
    by a normal step of deviation WIDTH / (1 + results * SHRINK_COEF) (hyperopt's shrink_coef
    0.1), clipped to the range; a choice is drawn anew with that same probability, else kept
    (a kept nested choice anneals its own parameters). NNI's classArgs: optimize_mode
    (default minimize, as NNI's); trialkit's seed.
    """

    ARGS = {"optimize_mode": check_mode, "seed": _seed}
    DEFAULT_MODE = "minimize"
    AVG_BEST_IDX = 2.0
    SHRINK_COEF = 0.1
    WIDTH = 0.5  # the first neighbourhood: half the range either way

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        self._rng = random.Random(seed)
        self._results: List[Tuple[float, Dict[str, Any]]] = []

    def _propose(self, parameter_id: int) -> Dict[str, Any]:
        if not self._results:
            return self.space.sample(self._rng)
        ranked = sorted(self._results, key=lambda result: result[0], reverse=self.optimize_mode == "maximize")
        # Geometric over ranks with mean AVG_BEST_IDX: P(k) = p (1 - p)^k, p = 1 / (1 + mean).
        p = 1.0 / (1.0 + self.AVG_BEST_IDX)
        rank = min(int(math.log(1.0 - self._rng.random()) / math.log(1.0 - p)), len(ranked) - 1)
        width = self.WIDTH / (1.0 + len(self._results) * self.SHRINK_COEF)
        return _anneal(self.space, ranked[rank][1], width, self._rng)

    def _adopt(self, parameter_id: int, params: Dict[str, Any]) -> None:
        self._rng.random()  # a resumed run continues a sequence, not the first one again

    def _completed(self, parameter_id: int, value: float) -> None:
        params = self._params[parameter_id]
        if self.space.contains(params):  # history from an older space has no place to anneal around
            self._results.append((value, params))


def _anneal(space: SearchSpace, point: Mapping[str, Any], width: float, rng: random.Random) -> Dict[str, Any]:
    """Parameters near `point` (which `space.contains`), each within `width` of it as AnnealTuner says."""
    out: Dict[str, Any] = {}
    for key, param in space.params.items():
        if isinstance(param, Choice):
            index = param.index_of(point[key])
            if rng.random() < width:
                out[key] = param.value_at(rng.randrange(len(param.options)), lambda sub: sub.sample(rng))
            else:
                near = {k: v for k, v in point[key].items() if k != "_name"} if isinstance(point[key], Mapping) else {}
                out[key] = param.value_at(index, lambda sub: _anneal(sub, near, width, rng))
        else:
            u = param.to_unit(point[key]) + rng.gauss(0.0, width)
            out[key] = param.from_unit(min(max(u, 0.0), 1.0))
    return out


# NNI's tpe_args that optuna's sampler has. NNI's gamma, prior_weight and
# linear_forgetting are not among them: optuna deprecated the first two (4.9)
# and fixes the last, so they are refused rather than half-honoured.
_TPE_ARGS: Dict[str, Checker] = {
    "n_startup_jobs": lambda v, w: schema.as_int(v, w, minimum=0),
    "n_ei_candidates": lambda v, w: schema.as_int(v, w, minimum=1),
    "constant_liar_type": lambda v, w: None if v is None else schema.as_choice(v, ("best", "worst", "mean"), w),
}


def _name(path: Tuple[str, ...]) -> str:
    return json.dumps(list(path))


def _suggest(space: SearchSpace, trial: Any, prefix: Tuple[str, ...]) -> Dict[str, Any]:
    out = {}
    for key, param in space.params.items():
        name = _name(prefix + (key,))
        if isinstance(param, Choice):
            index = trial.suggest_categorical(name, list(range(len(param.options))))
            option = param.options[index]
            out[key] = param.value_at(index, lambda sub: _suggest(sub, trial, prefix + (key, option.name)))
        else:
            out[key] = param.from_unit(trial.suggest_float(name, 0.0, 1.0))
    return out


def _fixed(space: SearchSpace, params: Mapping[str, Any], prefix: Tuple[str, ...]) -> Dict[str, Any]:
    """optuna's internal values for `params` (which `space.contains`)."""
    out: Dict[str, Any] = {}
    for key, param in space.params.items():
        name = _name(prefix + (key,))
        if isinstance(param, Choice):
            index = param.index_of(params[key])
            out[name] = index
            option = param.options[index]
            if isinstance(option, Nested):
                sub = {k: v for k, v in params[key].items() if k != "_name"}
                out.update(_fixed(option.space, sub, prefix + (key, option.name)))
        else:
            out[name] = param.to_unit(params[key])
    return out


@functools.lru_cache(maxsize=None)
def quiet_optuna() -> Any:
    # Imported on first use: optuna costs about half a second, and validating a
    # config needs none of it.
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


TUNERS: Dict[str, Type[Tuner]] = {
    "Random": RandomTuner,
    "GridSearch": GridSearchTuner,
    "TPE": TPETuner,
    "Evolution": EvolutionTuner,
    "Anneal": AnnealTuner,
}
# NNI tuners trialkit does not carry; named so the error says so instead of guessing.
NNI_ONLY = ("SMAC", "BatchTuner", "Hyperband", "MetisTuner", "GPTuner", "PBTTuner", "DNGOTuner", "BOHB")


def check_tuner(name: Any, class_args: Any, space: SearchSpace, where: str = "tuner") -> Tuple[str, Dict[str, Any]]:
    """The canonical name and checked classArgs (optimize_mode filled in), or UserError."""
    cls_name = schema.lookup("tuner", name, list(TUNERS), NNI_ONLY, schema.path(where, "name"))
    cls = TUNERS[cls_name]
    args = check_args(class_args, cls.ARGS, schema.path(where, "classArgs"))
    args.setdefault("optimize_mode", cls.DEFAULT_MODE)
    cls.check_space(space)
    return cls_name, args


def build_tuner(name: str, class_args: Optional[Mapping[str, Any]], space: SearchSpace, seed: int) -> Tuner:
    """A ready tuner; classArgs `seed` (NNI's) wins over the experiment's `seed`."""
    cls_name, args = check_tuner(name, class_args, space)
    return TUNERS[cls_name](space, args["optimize_mode"], args.get("seed", seed), args)
