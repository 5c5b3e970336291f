"""What every tuner is to the experiment loop, and the contract each keeps.

    tuner.replay(history)                  # on resume, before the first ask
    parameter_id, params = tuner.ask()     # None: nothing now (`tuner.waiting`) or nothing ever
    tuner.tell_intermediate(parameter_id, 0.71)   # each intermediate result (most tuners ignore them)
    tuner.tell(parameter_id, 0.93)         # its final result, or tuner.tell_failed(parameter_id)

The contract every tuner keeps, so that a resumed search goes on as the
uninterrupted one would: a proposal is a function of the seed, its parameter
id and the points and results the tuner holds, never of the order in which
they came. Each proposal draws from a random state of its own
(`derived_seed(seed, parameter_id)`), so the first run's draws are never drawn
again, and `replay` of the store's trials (parameters and final results, then
each trial's latest intermediate result and which trials ended) rebuilds
exactly what the uninterrupted tuner holds. No tuner hands out a point twice
(NNI 3.0's deduplication): a repeated proposal is replaced by the first point
of the grid not tried yet (a finite space) or a fresh random one; a finite
space whose every point was tried ends the search. Random's
`deduplicate: false` samples with replacement, as Determined's random and
adaptive_asha searchers do (a Determined config's tuner).

A tuner that runs trials in rounds (Hyperband's brackets, PBT's generations)
may have nothing to propose until a running trial ends: ask() then answers
None and `waiting` is true, and the loop asks again when a trial ends.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import random
from typing import Any, Callable, ClassVar, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from trialkit import schema
from trialkit.control.searchspace import Choice, Nested, SearchSpace
from trialkit.errors import UserError

MODES = ("maximize", "minimize")
# (parameter_id, params, final value or None when none arrived yet)
History = Iterable[Tuple[int, Mapping[str, Any], Optional[float]]]
Checker = Callable[[Any, str], Any]


def check_mode(value: Any, where: str) -> str:
    return schema.as_choice(value, MODES, where)


def check_seed(value: Any, where: str) -> int:
    return schema.as_int(value, where, minimum=0, maximum=2**32 - 1)  # numpy's seed range


def check_positive(value: Any, where: str) -> float:
    return schema.as_number(value, where, positive=True)


def check_fraction(value: Any, where: str) -> float:
    """A probability or a share: from 0 to 1."""
    number = schema.as_number(value, where, minimum=0)
    if number > 1:
        raise UserError(f"{number:g} is above 1", where, "use a number from 0 to 1")
    return number


def check_args(args: Any, spec: Mapping[str, Checker], where: str) -> Dict[str, Any]:
    """classArgs checked against `spec` (arg name -> checker); names as NNI spells them, or camelCased
    (`start_step`, `startStep`). Another case is another arg: NNI's Hyperband rejects `r`, whose R it is not."""
    if args is None:
        return {}
    spellings = {spelling for name in spec for spelling in (name, schema.camel(name))}
    by_fold = {schema.fold(name): name for name in spec}
    for key in schema.mapping(args, where):
        meant = by_fold.get(schema.fold(key)) if isinstance(key, str) and key not in spellings else None
        if meant is not None:
            schema.report(UserError(f"unknown key {key!r}", schema.path(where, key),
                                    f"did you mean {meant!r}? classArgs names are case-sensitive, as NNI's"))
    args = schema.normalize_keys(args, list(spec), where)
    return {key: spec[key](value, schema.path(where, key)) for key, value in args.items()}


class Abandoned(Exception):
    """A tuner's proposal stopped before it was done: the run that asked for it ended (Tuner.abandon)."""


def derived_seed(seed: int, parameter_id: int) -> int:
    """The seed of proposal `parameter_id` (numpy's and optuna's range): what one proposal draws depends on
    nothing another drew, so a resumed tuner never draws the first run's numbers again."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{parameter_id}".encode()).digest()[:4], "big")


class Tuner:
    """Base: parameter ids, idempotent results, replay and deduplication; subclasses fill the hooks."""

    ARGS: ClassVar[Dict[str, Checker]] = {"optimize_mode": check_mode}
    DEFAULT_MODE: ClassVar[str] = "maximize"
    FRESH_DRAWS: ClassVar[int] = 100  # random draws for an untried point of an infinite space before giving up
    # False for a tuner that decides itself which trials go on (NNI's advisors, PBT): NNI refuses an assessor
    # beside one, and so does the config here.
    TAKES_ASSESSOR: ClassVar[bool] = True
    # What a tuner that ranks a round or generation once every trial of it has its final result calls it (NNI's
    # words: Hyperband's and BOHB's round, PBT's generation); None for the others. A trial a user's stop of the
    # experiment cut short without a checkpoint or final result runs again on `experiment resume` under every
    # tuner (loop._stopped); its reason names what waits for it (queue.rerun).
    ROUND: ClassVar[Optional[str]] = None
    # True for a tuner that starts a trial from another's checkpoint (continues_from: PBT's exploit, a configuration
    # Hyperband or BOHB sends on): the config checks the checkpoint can reach it (config.checkpoint_handover).
    HANDS_ON_CHECKPOINTS: ClassVar[bool] = False
    # Python packages the tuner needs beyond optuna (trialkit's `search` extra): the config says so when one is
    # missing, rather than the experiment failing at its first ask.
    NEEDS: ClassVar[Tuple[str, ...]] = ()

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        self.space = space
        self.optimize_mode = optimize_mode
        self.seed = seed  # the effective one: store it to rebuild this tuner
        self._next_id = 0
        self._params: Dict[int, Dict[str, Any]] = {}
        self._finished: Set[int] = set()
        self._tried: Set[str] = set()  # every point handed out or replayed (point_key)
        self._grid: Optional[Iterator[Dict[str, Any]]] = None  # a finite space's points, from the first untried
        self._deduplicate: bool = class_args.get("deduplicate", True)
        self._abandoned = False  # set from the loop's thread while ask() runs on another (trialkit.control.pick)

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        """UserError when this tuner cannot search `space` (a grid of a continuous range)."""

    @classmethod
    def check_class_args(cls, args: Dict[str, Any], where: str) -> None:
        """UserError for classArgs that are each valid but do not go together (min_budget above max_budget)."""

    def better(self, a: float, b: float) -> bool:
        return a > b if self.optimize_mode == "maximize" else a < b

    def ask(self) -> Optional[Tuple[int, Dict[str, Any]]]:
        """The next point to try, never one tried before; None when there is none (see `waiting`)."""
        parameter_id = self._next_id
        rng = random.Random(derived_seed(self.seed, parameter_id))
        params = self._propose(parameter_id, rng)
        if params is not None and self._deduplicate and point_key(params) in self._tried:
            self._withdraw(parameter_id)
            params = self._untried(rng)
            if params is not None:
                self._adopt(parameter_id, params)
        if params is None:
            return None
        self._next_id += 1
        self._params[parameter_id] = params
        self._tried.add(point_key(params))
        return parameter_id, copy.deepcopy(params)

    def warm_up(self) -> None:
        """The run starts: what later proposals need may load now, in the background (default: nothing)."""

    def close(self) -> None:
        """The run is done with the tuner: what warm_up loads is waited for (default: nothing)."""

    def abandon(self) -> None:
        """No proposal is wanted any more (the run ends): an ask() in progress ends at its tuner's next
        `_check_abandoned` with Abandoned, handing out nothing."""
        self._abandoned = True

    def _check_abandoned(self) -> None:
        """Where a long proposal can stop (between the GP's L-BFGS-B starts)."""
        if self._abandoned:
            raise Abandoned()

    @property
    def waiting(self) -> bool:
        """After ask() gave None: true when it will have a proposal once a running trial ends (the rest of a
        round, the next generation), false when the search is over."""
        return False

    @property
    def points_tried(self) -> int:
        """How many distinct points were handed out (or replayed)."""
        return len(self._tried)

    def continues_from(self, parameter_id: int) -> Optional[int]:
        """The parameter id whose trial's checkpoint the trial of `parameter_id` starts from (PBT's exploit), or
        None: it starts from its own checkpoint dir as it finds it."""
        return None

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

    def tell_intermediate(self, parameter_id: int, value: float) -> None:
        """One of the trial's intermediate results, in the order it reported them (NaN and infinities ignored)."""
        if parameter_id not in self._params:
            raise KeyError(f"parameter id {parameter_id} was never handed out")
        value = float(value)
        if math.isfinite(value) and parameter_id not in self._finished:
            self._intermediate(parameter_id, value)

    def replay(self, history: History) -> None:
        """Rebuild state from stored trials, on a fresh tuner before its first ask.

        An entry without a value is taken as still running: tell() or
        tell_failed() it later. Parameter ids continue after the largest one.
        """
        for parameter_id, params, value in sorted(history, key=lambda entry: entry[0]):
            self._params[parameter_id] = copy.deepcopy(dict(params))
            self._tried.add(point_key(params))
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

    def _untried(self, rng: random.Random, tried: Optional[Set[str]] = None) -> Optional[Dict[str, Any]]:
        """A point not among `tried` (default: every point handed out): a finite space's first in grid order
        (None when none is left), else a random one, as NNI's Deduplicator does."""
        tried = self._tried if tried is None else tried
        if finite_space(self.space):
            if self._grid is None:
                self._grid = self.space.grid()
            # Points passed over were tried when passed and stay tried: the iterator never goes back.
            return next((point for point in self._grid if point_key(point) not in tried), None)
        for _ in range(self.FRESH_DRAWS):
            point = self.space.sample(rng)
            if point_key(point) not in tried:
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

    def _intermediate(self, parameter_id: int, value: float) -> None:
        pass


def point_key(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=repr)


def finite_space(space: SearchSpace) -> bool:
    try:
        space.check_grid()
    except UserError:
        return False
    return True


def check_unset(space: SearchSpace, keys: Sequence[str], tuner: str) -> None:
    """UserError naming a search-space key that `tuner` sets in every trial's parameters itself (it would
    replace the space's value without a word)."""
    for key in keys:
        if key in space.params:
            raise UserError(f"{key} is set by {tuner} in each trial's parameters, so the search space cannot give it",
                            schema.path(space.where, key), f"remove {key} from the search space: the trial reads "
                            f"{tuner}'s value")


def check_flat(space: SearchSpace, tuner: str, nearest: str) -> None:
    """UserError naming the first nested choice: `tuner` models a fixed set of parameters."""
    for key, param in space.params.items():
        if isinstance(param, Choice) and any(isinstance(option, Nested) for option in param.options):
            raise UserError(f"{tuner} models a fixed set of parameters and cannot search a nested choice",
                            schema.path(space.where, key), f"flatten the choice, or use {nearest}")


@functools.lru_cache(maxsize=None)
def quiet_optuna() -> Any:
    # Imported on first use: optuna costs about half a second, and validating a
    # config needs none of it.
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna
