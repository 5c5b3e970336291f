"""NNI's advisors: Hyperband and BOHB, each trial's budget among its parameters as `TRIAL_BUDGET`.

Brackets and rounds as NNI's advisors form them (hyperband_advisor.py and
bohb_advisor.py, NNI 3.0). With s_max = floor(log_eta(R)) (BOHB:
log_eta(max_budget / min_budget)), bracket s starts n = ceil((s_max + 1) *
eta^s / (s + 1)) configurations on r = R / eta^s; its round i runs
floor(n / eta^i) of them on floor(r * eta^i) (R is BOHB's max_budget). Brackets
go s_max, s_max - 1, ..., 0, then again. A round's trials are ranked by their
result (the final one, else the latest intermediate, as NNI's advisors take
it); when every one of them ended, the best go on to the next round, each a new
trial with the same parameters and the next budget, whose checkpoint dir holds
a copy of the one its round before left (`continues_from`: code that reads
`trialkit.checkpoint_dir()` trains only the epochs its budget adds, as Ray
Tune's Hyperband resumes a paused trial; NNI's code starts over, as under
NNI). A trial that ended with no result at all goes on from no round (NNI's
advisors fail on it).

The next trial is, in this order: the next configuration of the newest
bracket's first round; a trial that a finished round sends on (older brackets
first, then lower rounds, then by rank); the first of a new bracket. Hyperband
opens a new bracket whenever nothing else is left (`exec_mode: parallelism`,
NNI's default) or once the newest bracket's last round is out (`serial`); BOHB
once the newest bracket's last round ended. Otherwise the advisor waits for
running trials. Which bracket and round a trial is in follows from the
parameters alone (a configuration seen before goes on from its round; a new one
belongs to the bracket whose first round has room), so `replay` rebuilds the
brackets of an interrupted experiment and a resumed one continues the bracket
it was in. A new configuration is never one tried before.

BOHB draws its configurations from a model of the results so far (bohb.py),
built when the bracket opens, as NNI's BOHB builds them.
"""
from __future__ import annotations

import math
import random
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple

from trialkit import schema
from trialkit.control.searchspace import SearchSpace
from trialkit.control.tuners.base import (Tuner, point_key, check_flat, check_fraction, check_mode, check_positive,
                                         check_seed, check_unset)
from trialkit.errors import UserError

BUDGET = "TRIAL_BUDGET"
_EPSILON = 1e-6  # NNI's: log and floor of values that are whole numbers in exact arithmetic


def _eta(value: Any, where: str) -> int:
    return schema.as_int(value, where, minimum=2)


def s_max(ratio: float, eta: int) -> int:
    """The largest bracket: floor(log_eta(ratio)), as NNI computes it."""
    return math.floor(math.log(ratio, eta) + _EPSILON)


def bracket_rounds(s: int, top: int, eta: int, max_budget: float) -> List[Tuple[int, int]]:
    """(configurations, budget) of each round of bracket s, as NNI's Bracket.get_n_r gives them."""
    n = math.ceil((top + 1) * eta ** s / (s + 1) - _EPSILON)
    r = max_budget / eta ** s
    return [(math.floor(n / eta ** i + _EPSILON), math.floor(r * eta ** i + _EPSILON)) for i in range(s + 1)]


class HyperbandTuner(Tuner):
    """NNI's Hyperband: classArgs R, eta, exec_mode, optimize_mode (and trialkit's seed)."""

    ARGS = {
        "optimize_mode": check_mode,
        "R": lambda v, w: schema.as_int(v, w, minimum=1),
        "eta": _eta,
        "exec_mode": lambda v, w: schema.as_choice(v, ("serial", "parallelism"), w),
        "seed": check_seed,
    }
    TAKES_ASSESSOR = False
    ROUND = "round"
    HANDS_ON_CHECKPOINTS = True

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        check_unset(space, (BUDGET,), "Hyperband")

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        self.eta: int = class_args.get("eta", 3)
        self.max_budget: float = class_args.get("R", 60)  # NNI's defaults
        self.top = s_max(self.max_budget, self.eta)
        self.exec_mode: str = class_args.get("exec_mode", "parallelism")
        self._slot: Dict[int, Tuple[int, int]] = {}  # parameter id -> (bracket, round)
        self._point: Dict[int, str] = {}  # parameter id -> its configuration (point_key, without the budget)
        self._holder: Dict[str, int] = {}  # configuration -> the latest parameter id that ran it
        self._previous: Dict[int, int] = {}  # parameter id -> the one that ran its configuration in the round before
        self._members: Dict[Tuple[int, int], List[int]] = {}  # (bracket, round) -> parameter ids, in order
        self._brackets = 0  # opened so far; bracket b has s = top - b % (top + 1)
        self._finals: Dict[int, float] = {}
        self._latest: Dict[int, float] = {}  # the latest intermediate result
        self._out_of_points = False  # a finite space whose every configuration ran

    # -- the schedule --------------------------------------------------------------------
    def rounds(self, bracket: int) -> List[Tuple[int, int]]:
        """(configurations, budget) of each round of bracket number `bracket` (0: the first opened)."""
        return bracket_rounds(self.top - bracket % (self.top + 1), self.top, self.eta, self.max_budget)

    def slot(self, parameter_id: int) -> Tuple[int, int]:
        """(bracket, round) of a trial: bracket 0 is the first opened."""
        return self._slot[parameter_id]

    def result(self, parameter_id: int) -> Optional[float]:
        """What the round ranks the trial by: its final result, else its latest intermediate one."""
        return self._finals.get(parameter_id, self._latest.get(parameter_id))

    def _ranked(self, bracket: int, round_: int) -> Optional[List[int]]:
        """The round's trials that go on, best first, once every trial of the round ended; None before."""
        members = self._members.get((bracket, round_), [])
        if len(members) < self._size(bracket, round_) or not all(pid in self._finished for pid in members):
            return None
        if round_ == 0 and self._room(bracket):
            return None
        rounds = self.rounds(bracket)
        if round_ + 1 >= len(rounds):
            return []
        sign = -1.0 if self.optimize_mode == "maximize" else 1.0
        scored = sorted((pid for pid in members if self.result(pid) is not None),
                        key=lambda pid: (sign * self.result(pid), pid))
        return scored[:rounds[round_ + 1][0]]

    def _size(self, bracket: int, round_: int) -> int:
        """How many trials round `round_` runs: its share, or fewer when the round before had fewer results."""
        if round_ == 0:
            return len(self._members.get((bracket, 0), [])) if self._out_of_points else self.rounds(bracket)[0][0]
        ranked = self._ranked(bracket, round_ - 1)
        return len(ranked) if ranked is not None else self.rounds(bracket)[round_][0]

    def _room(self, bracket: int) -> bool:
        """Whether the bracket's first round takes another new configuration."""
        return not self._out_of_points and len(self._members.get((bracket, 0), [])) < self.rounds(bracket)[0][0]

    def _out(self, bracket: int, round_: int) -> bool:
        """Whether every trial of the round was handed out (so the round after it may start)."""
        if round_ == 0:
            return not self._room(bracket)
        ranked = self._ranked(bracket, round_ - 1)
        return ranked is not None and len(self._members.get((bracket, round_), [])) >= len(ranked)

    def _bracket_done(self, bracket: int) -> bool:
        """Every trial of its last round ran to its end."""
        last = len(self.rounds(bracket)) - 1
        return self._out(bracket, last) and all(pid in self._finished for pid in self._members.get((bracket, last), []))

    def _may_open(self) -> bool:
        """Whether a new bracket may start now that nothing else is left (exec_mode)."""
        newest = self._brackets - 1
        return newest < 0 or self.exec_mode == "parallelism" or self._out(newest, len(self.rounds(newest)) - 1)

    def _promotion(self) -> Optional[int]:
        """The trial whose configuration goes on next, from a round that ended; None when none waits."""
        for bracket in range(self._brackets):
            for round_ in range(len(self.rounds(bracket)) - 1):
                ranked = self._ranked(bracket, round_)
                if not ranked:
                    continue
                went_on = {self._point[pid] for pid in self._members.get((bracket, round_ + 1), [])}
                for pid in ranked:
                    if self._point[pid] not in went_on:
                        return pid
        return None

    # -- the hooks -------------------------------------------------------------------------
    def _propose(self, parameter_id: int, rng: random.Random) -> Optional[Dict[str, Any]]:
        newest = self._brackets - 1
        params = None
        if newest >= 0 and self._room(newest):
            params = self._new_configuration(newest, parameter_id, rng)
        if params is None:
            source = self._promotion()
            if source is not None:
                bracket, round_ = self._slot[source]
                params = {**self._params[source], BUDGET: self.rounds(bracket)[round_ + 1][1]}
        if params is None and self._may_open() and not self._out_of_points:
            params = self._new_configuration(self._brackets, parameter_id, rng)
        if params is not None:
            self._place(parameter_id, params)
        return params

    def _new_configuration(self, bracket: int, parameter_id: int, rng: random.Random) -> Optional[Dict[str, Any]]:
        """A configuration not run before, on the first budget of `bracket`; None once a finite space has none."""
        point = self._draw(bracket, parameter_id, rng)
        if point_key(point) in self._holder:
            point = self._untried(rng, set(self._holder))
        if point is None:
            self._out_of_points = True
            return None
        return {**point, BUDGET: self.rounds(bracket)[0][1]}

    def _draw(self, bracket: int, parameter_id: int, rng: random.Random) -> Dict[str, Any]:
        """A new configuration for `bracket` (Hyperband: at random)."""
        return self.space.sample(rng)

    def _place(self, parameter_id: int, params: Mapping[str, Any]) -> None:
        """Put a handed-out trial in its bracket and round: a configuration seen before goes on from its
        round, a new one joins the newest bracket's first round while it has room, else opens a bracket."""
        point = point_key({k: v for k, v in params.items() if k != BUDGET})
        holder = self._holder.get(point)
        if holder is not None:
            bracket, round_ = self._slot[holder]
            slot = (bracket, round_ + 1)
            self._previous[parameter_id] = holder
        else:
            if self._brackets == 0 or not self._room(self._brackets - 1):
                self._brackets += 1
            slot = (self._brackets - 1, 0)
        self._slot[parameter_id] = slot
        self._point[parameter_id] = point
        self._holder[point] = parameter_id
        self._members.setdefault(slot, []).append(parameter_id)

    def _adopt(self, parameter_id: int, params: Dict[str, Any]) -> None:
        self._place(parameter_id, params)

    def _completed(self, parameter_id: int, value: float) -> None:
        self._finals[parameter_id] = value

    def _intermediate(self, parameter_id: int, value: float) -> None:
        self._latest[parameter_id] = value

    @property
    def waiting(self) -> bool:
        return any(pid not in self._finished for pid in self._params)

    def continues_from(self, parameter_id: int) -> Optional[int]:
        """A configuration that goes on starts from the checkpoint its round before left (trialkit's checkpoint dir;
        NNI's trial code, which does not read it, starts over as under NNI)."""
        return self._previous.get(parameter_id)

    @property
    def points_tried(self) -> int:
        return len(self._holder)

    def import_results(self, results: List[Tuple[Dict[str, Any], float]]) -> None:
        """NNI's Hyperband takes no imported data (its handle_import_data does nothing): neither does this."""


# ---------------------------------------------------------------- BOHB


class BohbTuner(HyperbandTuner):
    """NNI's BOHB: Hyperband's brackets, one at a time, each opened with configurations from a model of the
    results so far (bohb.py). classArgs: NNI's."""

    ARGS = {
        "optimize_mode": check_mode,
        "min_budget": check_positive,
        "max_budget": check_positive,
        "eta": _eta,
        "min_points_in_model": lambda v, w: schema.as_int(v, w, minimum=0),
        "top_n_percent": lambda v, w: schema.as_int(v, w, minimum=1, maximum=99),
        "num_samples": lambda v, w: schema.as_int(v, w, minimum=1),
        "random_fraction": check_fraction,
        "bandwidth_factor": check_positive,
        "min_bandwidth": lambda v, w: schema.as_number(v, w, minimum=0),
        "config_space": lambda v, w: _refuse_config_space(w),
        "seed": check_seed,
    }
    NEEDS = ("statsmodels", "scipy", "numpy")

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        min_budget, max_budget = class_args.get("min_budget", 1), class_args.get("max_budget", 3)  # NNI's defaults
        super().__init__(space, optimize_mode, seed, {**class_args, "R": max_budget, "exec_mode": "serial"})
        self.top = s_max(max_budget / min_budget, self.eta)
        from trialkit.control.tuners.bohb import KdeSettings

        self.settings = KdeSettings.from_args(class_args, len(space.params))
        self._models: Dict[int, Any] = {}  # bracket -> the model its configurations come from
        self._imported: List[Tuple[Dict[str, Any], float, float]] = []  # (parameters, value, budget) from elsewhere
        self._loading: Optional[threading.Thread] = None

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        check_flat(space, "BOHB", "Hyperband")
        check_unset(space, (BUDGET,), "BOHB")

    @classmethod
    def check_class_args(cls, args: Dict[str, Any], where: str) -> None:
        if args.get("min_budget", 1) >= args.get("max_budget", 3):
            raise UserError(f"min_budget {args.get('min_budget', 1):g} is not below max_budget "
                            f"{args.get('max_budget', 3):g}", schema.path(where, "min_budget"),
                            "give a min_budget below max_budget; NNI's defaults are 1 and 3")

    def warm_up(self) -> None:
        # scipy and statsmodels take a second or two to import. The first model is fitted when the second
        # bracket opens, after every trial of the first ended: each slot would wait for the import then.
        from trialkit.control.tuners import bohb

        self._loading = threading.Thread(target=bohb.load_libraries, name="trialkit-bohb-libraries")
        self._loading.start()

    def close(self) -> None:
        if self._loading is not None:
            self._loading.join()

    def _may_open(self) -> bool:
        newest = self._brackets - 1
        return newest < 0 or self._bracket_done(newest)

    def _draw(self, bracket: int, parameter_id: int, rng: random.Random) -> Dict[str, Any]:
        from trialkit.control.tuners import bohb

        if bracket not in self._models:
            # The results of the brackets before this one: every one of them ended before it opened.
            observations = [(self._params[pid], value, self._params[pid][BUDGET]) for pid, value in self._finals.items()
                            if self._slot[pid][0] < bracket] + self._imported
            self._models[bracket] = bohb.fit(self.space, observations, self.optimize_mode, self.settings)
        return bohb.sample(self.space, self._models[bracket], self.settings, rng)


    def import_results(self, results: List[Tuple[Dict[str, Any], float]]) -> None:
        """As NNI's BOHB: the model learns them, each on its TRIAL_BUDGET, else on max_budget; the brackets do not
        (they are not trials of this experiment). Brackets that open from now on draw from them."""
        self._imported += [({k: v for k, v in params.items() if k != BUDGET}, float(value),
                            params.get(BUDGET, self.max_budget)) for params, value in results]


def _refuse_config_space(where: str) -> None:
    raise UserError("config_space (a ConfigSpace .pcs file) is not read by trialkit", where,
                    "write the space as searchSpace or searchSpaceFile and remove config_space")
