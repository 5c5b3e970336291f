"""The tuners that need nothing but the space and the results: Random, GridSearch, Batch, Evolution, TPE,
Anneal.

Names and classArgs are NNI's. TPE is optuna's TPESampler through its ask-and-tell API.
"""
from __future__ import annotations

import json
import math
import random
from typing import Any, Dict, List, Mapping, Optional, Tuple

from trialkit import schema
from trialkit.control.searchspace import Choice, Nested, SearchSpace
from trialkit.control.tuners.base import Checker, Tuner, point_key, check_args, check_mode, check_seed, derived_seed, quiet_optuna
from trialkit.errors import UserError


class RandomTuner(Tuner):
    ARGS = {"optimize_mode": check_mode, "seed": check_seed, "deduplicate": schema.as_bool}

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


class BatchTuner(Tuner):
    """NNI's Batch (BatchTuner): the space is one choice whose options are whole parameter sets; each is tried
    once, in the order written. Its one classArg is optimize_mode (which trial is best), as GridSearch's."""

    ARGS = {"optimize_mode": check_mode}

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        key = next(iter(space.params), None)
        param = space.params.get(key)
        if len(space.params) != 1 or not isinstance(param, Choice):
            raise UserError("Batch takes one parameter, a choice whose options are the parameter sets to try",
                            space.where, 'write {"combine_params": {"_type": "choice", "_value": [{...}, {...}]}}')
        for i, option in enumerate(param.options):
            if not isinstance(option, Mapping) or isinstance(option, Nested):
                raise UserError(f"option {i} is not a set of parameters", schema.path(space.where, key),
                                "make each option a mapping of parameter names to values")

    def _propose(self, parameter_id: int, rng: random.Random) -> Optional[Dict[str, Any]]:
        options = next(iter(self.space.params.values())).options
        return next((dict(option) for option in options if point_key(option) not in self._tried), None)


class EvolutionTuner(Tuner):
    """NNI's Evolution: random until the population is there, then tournaments.

    The population is the latest `population_size` results (by parameter id: the
    oldest leaves as a newer one joins, regularized evolution's aging, so the
    population is a function of the results and not of the order they came in).
    Each ask picks two members at random and proposes a copy of the better one with
    one parameter sampled anew.
    """

    ARGS = {"optimize_mode": check_mode, "population_size": lambda v, w: schema.as_int(v, w, minimum=2), "seed": check_seed}

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
        "seed": check_seed,
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

    ARGS = {"optimize_mode": check_mode, "seed": check_seed}
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
