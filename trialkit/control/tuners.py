"""Tuners: what to try next, from what was learned so far.

The experiment loop speaks to every tuner the same way:

    tuner = build_tuner("TPE", {"optimize_mode": "maximize"}, space, seed=7)
    tuner.replay(history)            # on resume, before the first ask
    parameter_id, params = tuner.ask()   # None once the tuner has nothing left
    tuner.tell(parameter_id, 0.93)   # or tuner.tell_failed(parameter_id)

Names and classArgs are NNI's (Random, GridSearch, TPE, Evolution, Anneal; matched
case-insensitively). TPE is optuna's TPESampler through its ask-and-tell API.

The contract every tuner keeps, so that a resumed search goes on as the
uninterrupted one would: a proposal is a function of the seed, its parameter
id and the points and results the tuner holds, never of the order in which
they came. Each proposal draws from a random state of its own
(`derived_seed(seed, parameter_id)`), so the first run's draws are never drawn
again, and `replay` of the store's trials (parameters and final results)
rebuilds exactly what the uninterrupted tuner holds. No tuner hands out a point
twice (NNI 3.0's deduplication): a repeated proposal is replaced by the first
point of the grid not tried yet (a finite space) or a fresh random one; a
finite space whose every point was tried ends the search. Random's
`deduplicate: false` samples with replacement, as Determined's random and
adaptive_asha searchers do (a Determined config's tuner).
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import random
from typing import Any, Callable, ClassVar, Dict, Iterable, Iterator, List, Mapping, Optional, Set, Tuple, Type

from trialkit import schema
from trialkit.control.searchspace import Choice, Nested, SearchSpace
from trialkit.errors import UserError

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


def derived_seed(seed: int, parameter_id: int) -> int:
    """The seed of proposal `parameter_id` (numpy's and optuna's range): what one proposal draws depends on
    nothing another drew, so a resumed tuner never draws the first run's numbers again."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{parameter_id}".encode()).digest()[:4], "big")


class Tuner:
    """Base: parameter ids, idempotent results, replay and deduplication; subclasses fill the hooks."""

    ARGS: ClassVar[Dict[str, Checker]] = {"optimize_mode": check_mode}
    DEFAULT_MODE: ClassVar[str] = "maximize"
    FRESH_DRAWS: ClassVar[int] = 100  # random draws for an untried point of an infinite space before giving up

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        self.space = space
        self.optimize_mode = optimize_mode
        self.seed = seed  # the effective one: store it to rebuild this tuner
        self._next_id = 0
        self._params: Dict[int, Dict[str, Any]] = {}
        self._finished: Set[int] = set()
        self._tried: Set[str] = set()  # every point handed out or replayed (_key)
        self._grid: Optional[Iterator[Dict[str, Any]]] = None  # a finite space's points, from the first untried
        self._deduplicate: bool = class_args.get("deduplicate", True)

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        """UserError when this tuner cannot search `space` (a grid of a continuous range)."""

    def better(self, a: float, b: float) -> bool:
        return a > b if self.optimize_mode == "maximize" else a < b

    def ask(self) -> Optional[Tuple[int, Dict[str, Any]]]:
        """The next point to try, never one tried before; None once a finite space has none left."""
        parameter_id = self._next_id
        rng = random.Random(derived_seed(self.seed, parameter_id))
        params = self._propose(parameter_id, rng)
        if params is not None and self._deduplicate and _key(params) in self._tried:
            self._withdraw(parameter_id)
            params = self._untried(rng)
            if params is not None:
                self._adopt(parameter_id, params)
        if params is None:
            return None
        self._next_id += 1
        self._params[parameter_id] = params
        self._tried.add(_key(params))
        return parameter_id, copy.deepcopy(params)

    @property
    def points_tried(self) -> int:
        """How many distinct points were handed out (or replayed)."""
        return len(self._tried)

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
            self._tried.add(_key(params))
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

    def _untried(self, rng: random.Random) -> Optional[Dict[str, Any]]:
        """A point not tried yet: a finite space's first in grid order (None when none is left), else a random
        one, as NNI's Deduplicator does."""
        if _finite(self.space):
            if self._grid is None:
                self._grid = self.space.grid()
            # Points passed over were tried when passed and stay tried: the iterator never goes back.
            return next((point for point in self._grid if _key(point) not in self._tried), None)
        for _ in range(self.FRESH_DRAWS):
            point = self.space.sample(rng)
            if _key(point) not in self._tried:
                return point
        return None

    # hooks
    def _propose(self, parameter_id: int, rng: random.Random) -> Optional[Dict[str, Any]]:
        """The tuner's point for `parameter_id`, drawing only from `rng` (that proposal's own)."""
        raise NotImplementedError

    def _withdraw(self, parameter_id: int) -> None:
        """`_propose`'s point was tried already: another replaces it (`_adopt`)."""

    def _adopt(self, parameter_id: int, params: Dict[str, Any]) -> None:
        """A point the tuner did not propose itself (replayed, or replacing a repeat), as if it had."""

    def _completed(self, parameter_id: int, value: float) -> None:
        pass

    def _failed(self, parameter_id: int) -> None:
        pass


class RandomTuner(Tuner):
    ARGS = {"optimize_mode": check_mode, "seed": _seed, "deduplicate": schema.as_bool}

    def _propose(self, parameter_id: int, rng: random.Random) -> Dict[str, Any]:
        return self.space.sample(rng)


class GridSearchTuner(Tuner):
    """Every point of the grid once, in grid order (searchspace.grid: the last parameter varying fastest)."""

    ARGS = {"optimize_mode": check_mode}

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        space.check_grid()

    def _propose(self, parameter_id: int, rng: random.Random) -> Optional[Dict[str, Any]]:
        return self._untried(rng)


def _key(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=repr)


def _finite(space: SearchSpace) -> bool:
    try:
        space.check_grid()
    except UserError:
        return False
    return True


class EvolutionTuner(Tuner):
    """NNI's Evolution: random until the population is there, then tournaments.

    The population is the latest `population_size` results (by parameter id: the
    oldest leaves as a newer one joins, regularized evolution's aging, so the
    population is a function of the results and not of the order they came in).
    Each ask picks two members at random and proposes a copy of the better one with
    one parameter sampled anew.
    """

    ARGS = {"optimize_mode": check_mode, "population_size": lambda v, w: schema.as_int(v, w, minimum=2), "seed": _seed}

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        self._size = class_args.get("population_size", 32)
        self._results: Dict[int, float] = {}  # parameter id -> final value, for points of this space

    def population(self) -> List[Tuple[Dict[str, Any], float]]:
        """(parameters, value) of the members, oldest first."""
        latest = sorted(self._results)[-self._size:]
        return [(self._params[pid], self._results[pid]) for pid in latest]

    def _propose(self, parameter_id: int, rng: random.Random) -> Dict[str, Any]:
        population = self.population()
        if len(self._params) < self._size or len(population) < 2:
            return self.space.sample(rng)
        a, b = rng.sample(population, 2)
        parent = b if self.better(b[1], a[1]) else a
        return self.space.mutate(parent[0], rng)

    def _completed(self, parameter_id: int, value: float) -> None:
        if self.space.contains(self._params[parameter_id]):
            self._results[parameter_id] = value


class TPETuner(Tuner):
    """optuna's TPE, univariate as NNI's (and hyperopt's) is. Choices are categorical over option indexes
    (nested ones suggest their sub-parameters conditionally); numeric parameters are modelled in their unit
    coordinate (see searchspace). Each ask gets a sampler seeded for its parameter id (derived_seed)."""

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
        self._options: Dict[str, Any] = {
            # Each parameter modelled on its own, as NNI's TPE does; optuna 5.0 made the joint
            # (multivariate) model its default, so it is said here, not left to optuna's version.
            "multivariate": False,
            "n_startup_trials": tpe.get("n_startup_jobs", 20),  # NNI's defaults
            "n_ei_candidates": tpe.get("n_ei_candidates", 24),
            # NNI's liars (best/worst/mean) all map onto optuna's one; null turns it off. optuna 5.0
            # turned it on by default: said here too.
            "constant_liar": tpe.get("constant_liar_type", "best") is not None,
        }
        self._study = optuna.create_study(direction=optimize_mode, sampler=self._sampler(0))
        self._trials: Dict[int, Any] = {}

    def _sampler(self, parameter_id: int) -> Any:
        return quiet_optuna().samplers.TPESampler(seed=derived_seed(self.seed, parameter_id), **self._options)

    def _propose(self, parameter_id: int, rng: random.Random) -> Dict[str, Any]:
        self._study.sampler = self._sampler(parameter_id)
        trial = self._study.ask()
        self._trials[parameter_id] = trial
        return _suggest(self.space, trial, ())

    def _withdraw(self, parameter_id: int) -> None:
        # A failed trial is no observation to TPE: the point that replaces it takes its place in the model.
        self._failed(parameter_id)

    def _adopt(self, parameter_id: int, params: Dict[str, Any]) -> None:
        if self.space.contains(params):  # history from an older space teaches nothing
            self._study.enqueue_trial(_fixed(self.space, params, ()))
            trial = self._trials[parameter_id] = self._study.ask()
            _suggest(self.space, trial, ())  # an enqueued trial holds its values once they are suggested

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

    The trial annealed around is drawn down the ranking (by value, then parameter id), the best most
    often (a geometric draw of mean AVG_BEST_IDX, hyperopt's 2.0); each numeric parameter moves in its
    unit coordinate by a normal step of deviation WIDTH / (1 + results * SHRINK_COEF) (hyperopt's
    shrink_coef 0.1), clipped to the range; a choice is drawn anew with that same probability, else kept
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
        self._results: Dict[int, float] = {}  # parameter id -> final value, for points of this space

    def _propose(self, parameter_id: int, rng: random.Random) -> Dict[str, Any]:
        if not self._results:
            return self.space.sample(rng)
        sign = -1.0 if self.optimize_mode == "maximize" else 1.0
        ranked = sorted(self._results, key=lambda pid: (sign * self._results[pid], pid))
        # Geometric over ranks with mean AVG_BEST_IDX: P(k) = p (1 - p)^k, p = 1 / (1 + mean).
        p = 1.0 / (1.0 + self.AVG_BEST_IDX)
        rank = min(int(math.log(1.0 - rng.random()) / math.log(1.0 - p)), len(ranked) - 1)
        width = self.WIDTH / (1.0 + len(self._results) * self.SHRINK_COEF)
        return _anneal(self.space, self._params[ranked[rank]], width, rng)

    def _completed(self, parameter_id: int, value: float) -> None:
        if self.space.contains(self._params[parameter_id]):  # history from an older space has no place to anneal around
            self._results[parameter_id] = value


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
