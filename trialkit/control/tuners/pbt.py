"""Population-based training: NNI's PBTTuner in generations, and asynchronous (`synchronous: false`).

Both train a population of `population_size` members; each trial is one
member's step. Its parameters carry `load_checkpoint_dir` (the checkpoint to
start from) and `save_checkpoint_dir` (where to leave its own), as NNI's
(pbt_tuner.py, NNI 3.0): `all_checkpoint_dir/<member>/<step>`; a member's
first step is given its first dir as both (nothing to load yet). A member that
exploits takes a top member's parameters and checkpoint (a top picked at
random) and perturbs each parameter: resampled with probability
resample_probability, else moved one step up or down (a choice's next option,
a randint's next integer, a quantized one's next multiple; a uniform one by
factor times its range, a log-uniform one by factor times its log range, a
normal one by factor times sigma), within the parameter's bounds. The others go
on from their own checkpoint with their own parameters. A trial without a final
result ranks as the worst.

By default (NNI's contract, under both of NNI's names, `PBT` and
`PBTTuner`; PbtTuner) the population trains in
generations (a member's step is its generation). A generation starts once
every trial of the one before ended; its trials are ranked by their final
result, the bottom ceil(fraction * population_size) exploit, and they start in
NNI's order: the worst of the generation before first. Which member and
generation a trial is follows from its parameter id (generation = id //
population_size, in NNI's order), so `replay` rebuilds the population of an
interrupted experiment from the store.

With `synchronous: false` (Pbt; trialkit's classArg, not NNI's) it is
asynchronous, as the PBT paper's (Jaderberg et al. 2017) and Ray Tune's
PopulationBasedTraining by default (`synch=False`): no generation waits for
its slowest member. When a slot frees, the member to step next is
the one of least progress among those not training: a member never started
first (in member order), else the one whose latest finished step's checkpoint
has trained the fewest steps, counting the steps of every checkpoint it went on
from (ties: the lower member). That is Ray's choose_trial_to_run (the least
`last_train_time`, which an exploit takes over from the member it copies): every
member gets its share of the slots, where letting the member that just ended
go on would leave all but `trialConcurrency` members behind for good; measured
in docs/searches.md. Its next step is decided then, from every member's latest
finished step (a member in training counts by the step it finished last, as
Ray's last score), each ranked at the progress of the member that steps: by
the result of the step on its checkpoint's way that had trained as many steps
(its own earlier step, or one it went on from), or by its latest where it
trained no more. Among the n members that have a finished step, best first, the bottom
min(ceil(fraction * n), n // 2) exploit a top one's latest checkpoint (Ray's
quantiles, so that no member is both), the others go on from their own.
Ranked by their latest results, a member was measured against members that had
trained more (one that exploited carries the top's steps with it) and lost to
them for that, so which lineages survived turned on the order trials ended: in
the race (bench/bench_search.py), a seed's best ranged over 0.015 to 0.022
from run to run; ranked at equal progress, over 0.003 to 0.008
(docs/searches.md). Ray decides when a member reaches its perturbation
interval and runs it later; deciding when the step is handed out ranks it
against results as fresh as they come, and the decision is then in the new
trial's parameters, which the store holds from the moment the trial is made:
its member and step in its save dir, the step it goes on from in its load dir. `replay` rebuilds the
population from those, so a resumed experiment repeats no step and loses none
(a step that a stop cut short runs again under the same trial), whatever order
the trials ended in.

For code written for trialkit or Determined rather than NNI, the same exploit
goes through the trial's checkpoint dir: `continues_from` names the trial whose
checkpoint a new trial starts from, and the loop has the platform copy that
trial's checkpoint dir into the new trial's before it starts, so
`trialkit.checkpoint_dir()` (and Determined's `latest_checkpoint`) holds the
better member's checkpoint.
"""
from __future__ import annotations

import math
import os
import random
from typing import Any, Dict, List, Mapping, Optional, Tuple

from trialkit import schema
from trialkit.control.searchspace import Choice, Numeric, SearchSpace, _sample_param
from trialkit.control.tuners.base import (Tuner, check_flat, check_fraction, check_mode, check_seed, check_unset,
                                         derived_seed)
from trialkit.errors import UserError

LOAD = "load_checkpoint_dir"
SAVE = "save_checkpoint_dir"


def _checkpoint_root(value: Any, where: str) -> str:
    path = os.path.expanduser(schema.as_str(value, where))
    if not os.path.isabs(path):
        raise UserError(f"all_checkpoint_dir {value!r} is not an absolute path", where,
                        "give an absolute path: every trial reads it from a directory of its own")
    return path


class PbtTuner(Tuner):
    """NNI's PBTTuner: classArgs optimize_mode, all_checkpoint_dir, population_size, factor,
    resample_probability, fraction (and trialkit's seed)."""

    ARGS = {
        "optimize_mode": check_mode,
        "all_checkpoint_dir": _checkpoint_root,
        "population_size": lambda v, w: schema.as_int(v, w, minimum=1, maximum=99999),
        "factor": lambda v, w: schema.as_number(v, w, minimum=0),
        "resample_probability": check_fraction,
        "fraction": check_fraction,
        "seed": check_seed,
    }
    TAKES_ASSESSOR = False
    ROUND = "generation"
    HANDS_ON_CHECKPOINTS = True

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        # NNI's default is its experiment's checkpoint directory (NNI_CHECKPOINT_DIRECTORY); build_tuner gives
        # trialkit's, the experiment dir's.
        self.root: str = class_args.get("all_checkpoint_dir") or os.path.abspath("checkpoint")
        self.size: int = class_args.get("population_size", 10)  # NNI's defaults
        self.factor: float = class_args.get("factor", 0.2)
        self.resample_probability: float = class_args.get("resample_probability", 0.25)
        self.fraction: float = class_args.get("fraction", 0.2)
        self._scores: Dict[int, float] = {}  # parameter id -> final value, for those that have one
        self._rankings: Dict[int, List[int]] = {}  # generation -> its members, best first

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        check_flat(space, "PBT", "Evolution")
        check_unset(space, (LOAD, SAVE), "PBT")

    def generation(self, parameter_id: int) -> Tuple[int, int]:
        """(generation, position in it) of a trial."""
        return divmod(parameter_id, self.size)

    def member(self, parameter_id: int) -> int:
        """The population member a trial trains (its checkpoints' folder under all_checkpoint_dir)."""
        generation, position = self.generation(parameter_id)
        return position if generation == 0 else self._ranking(generation - 1)[self.size - 1 - position]

    def _ranking(self, generation: int) -> List[int]:
        """The members of `generation`, best first (ties: the lower member first); asked only once each of its
        trials ended, so it never changes and is kept."""
        if generation in self._rankings:
            return self._rankings[generation]
        worst = -math.inf if self.optimize_mode == "maximize" else math.inf
        sign = -1.0 if self.optimize_mode == "maximize" else 1.0
        first = generation * self.size
        scored = [(sign * self._scores.get(pid, worst), self.member(pid)) for pid in range(first, first + self.size)]
        self._rankings[generation] = [member for _, member in sorted(scored)]
        return self._rankings[generation]

    def _trial_of(self, generation: int, member: int) -> int:
        """The parameter id of `member`'s trial in `generation`."""
        first = generation * self.size
        if generation == 0:
            return member
        return first + self.size - 1 - self._ranking(generation - 1).index(member)

    def _cutoff(self) -> int:
        return math.ceil(self.fraction * self.size)

    def continues_from(self, parameter_id: int) -> Optional[int]:
        if self.generation(parameter_id)[0] == 0:
            return None
        return self._source(parameter_id, random.Random(derived_seed(self.seed, parameter_id)))[0]

    def _source(self, parameter_id: int, rng: random.Random) -> Tuple[int, bool]:
        """(the trial of the generation before whose checkpoint and parameters this trial goes on from, whether it
        is one of the bottom members, which exploit a top one picked with `rng`'s first draw and explore)."""
        generation, _ = self.generation(parameter_id)
        member = self.member(parameter_id)
        ranking = self._ranking(generation - 1)
        tops, bottoms = ranking[:self._cutoff()], ranking[self.size - self._cutoff():]
        if member in bottoms and tops:
            return self._trial_of(generation - 1, tops[rng.randrange(len(tops))]), True
        return self._trial_of(generation - 1, member), False

    def _propose(self, parameter_id: int, rng: random.Random) -> Optional[Dict[str, Any]]:
        generation, position = self.generation(parameter_id)
        if generation == 0:
            first = os.path.join(self.root, str(position), "0")
            return {**self.space.sample(rng), LOAD: first, SAVE: first}
        previous = range((generation - 1) * self.size, generation * self.size)
        if not all(pid in self._finished for pid in previous):
            return None  # the generation before is still training
        member = self.member(parameter_id)
        source, exploits = self._source(parameter_id, rng)  # the first draw of this proposal's numbers, as continues_from's
        params = {key: self._params[source][key] for key in self.space.params}
        if exploits:
            params = perturb(self.space, params, self.factor, self.resample_probability, rng)
        return {**params, LOAD: self._params[source][SAVE], SAVE: os.path.join(self.root, str(member), str(generation))}

    def _completed(self, parameter_id: int, value: float) -> None:
        self._scores[parameter_id] = value

    @property
    def waiting(self) -> bool:
        return any(pid not in self._finished for pid in self._params)

    def import_results(self, results: List[Tuple[Dict[str, Any], float]]) -> None:
        """A population is its own trials' checkpoints: results from elsewhere have none, and are not taken."""


class Pbt(PbtTuner):
    """PBT (NNI's PBTTuner too): NNI's generations, or asynchronous with classArg `synchronous: false`."""

    ARGS = {**PbtTuner.ARGS, "synchronous": schema.as_bool}

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        self.synchronous: bool = class_args.get("synchronous", True)
        self._steps: Dict[int, List[int]] = {}  # member -> its trials' parameter ids, step by step
        self._by_save: Dict[str, int] = {}  # a save dir -> the parameter id of the trial that writes it
        self._trained: Dict[int, int] = {}  # parameter id -> steps its checkpoint holds, its sources' included
        self._from: Dict[int, Optional[int]] = {}  # parameter id -> the step it went on from (None: a first step)

    def continues_from(self, parameter_id: int) -> Optional[int]:
        if self.synchronous:
            return super().continues_from(parameter_id)
        params = self._params[parameter_id]
        return None if params[LOAD] == params[SAVE] else self._by_save[params[LOAD]]

    def _propose(self, parameter_id: int, rng: random.Random) -> Optional[Dict[str, Any]]:
        if self.synchronous:
            return super()._propose(parameter_id, rng)
        member = self._next_member()
        if member is None:
            return None  # every member is training: the next one to end goes on
        steps = self._steps.get(member, [])
        save = os.path.join(self.root, str(member), str(len(steps)))
        if not steps:
            params = {**self.space.sample(rng), LOAD: save, SAVE: save}
        else:
            source, exploits = self._async_source(member, rng)  # the first draw of this proposal's numbers
            params = {key: self._params[source][key] for key in self.space.params}
            if exploits:
                params = perturb(self.space, params, self.factor, self.resample_probability, rng)
            params = {**params, LOAD: self._params[source][SAVE], SAVE: save}
        self._adopt(parameter_id, params)
        return params

    def _adopt(self, parameter_id: int, params: Dict[str, Any]) -> None:
        """Where the trial stands in the population, from its checkpoint dirs (a proposal's, or a stored one's)."""
        if self.synchronous:
            return
        save = params[SAVE]
        member = int(os.path.basename(os.path.dirname(save)))
        self._steps.setdefault(member, []).append(parameter_id)
        self._by_save[save] = parameter_id
        source = None if params[LOAD] == save else self._by_save[params[LOAD]]
        self._trained[parameter_id] = 1 + (self._trained[source] if source is not None else 0)
        self._from[parameter_id] = source

    def _latest(self, member: int) -> Optional[int]:
        """The member's latest finished step (None: it has none yet)."""
        return next((pid for pid in reversed(self._steps.get(member, [])) if pid in self._finished), None)

    def _next_member(self) -> Optional[int]:
        """The member of least progress among those not training (see the module's docstring)."""
        idle = [m for m in range(self.size) if all(pid in self._finished for pid in self._steps.get(m, []))]
        if not idle:
            return None

        def progress(member: int) -> int:
            latest = self._latest(member)
            return -1 if latest is None else self._trained[latest]

        return min(idle, key=lambda member: (progress(member), member))

    def _async_source(self, member: int, rng: random.Random) -> Tuple[int, bool]:
        """(the step `member` goes on from, whether it exploits a top member's): its own latest unless it is in
        the bottom of the members ranked at its progress (see the module's docstring)."""
        sign = -1.0 if self.optimize_mode == "maximize" else 1.0
        latest = {m: pid for m in range(self.size) if (pid := self._latest(m)) is not None}
        progress = self._trained[latest[member]]
        judged = {m: self._lineage_at(pid, progress) for m, pid in latest.items()}
        # Best first; a step without a result last (ties: the lower member first).
        ranking = sorted(latest, key=lambda m: (sign * self._scores[judged[m]] if judged[m] in self._scores
                                                else math.inf, m))
        cutoff = min(math.ceil(self.fraction * len(ranking)), len(ranking) // 2)
        if member in ranking[len(ranking) - cutoff:]:
            return latest[ranking[rng.randrange(cutoff)]], True
        return latest[member], False

    def _lineage_at(self, parameter_id: int, progress: int) -> int:
        """The step whose checkpoint had trained `progress` steps on the way to this one's (its own or one it went
        on from, directly or through others); this one where it trained no more."""
        while self._trained[parameter_id] > progress:
            parameter_id = self._from[parameter_id]
        return parameter_id


def perturb(space: SearchSpace, params: Mapping[str, Any], factor: float, resample_probability: float,
            rng: random.Random) -> Dict[str, Any]:
    """Each parameter resampled (with probability resample_probability) or moved one step, as NNI's PBT."""
    out = {}
    for key, param in space.params.items():
        if rng.random() < resample_probability:
            out[key] = _sample_param(param, rng)
            continue
        up = rng.random() > 0.5
        if isinstance(param, Choice):
            index = param.index_of(params[key]) + (1 if up else -1)
            out[key] = param.value_at(min(max(index, 0), len(param.options) - 1), lambda sub: {})
        else:
            out[key] = _step(param, params[key], factor, up)
    return out


def _step(param: Numeric, value: float, factor: float, up: bool) -> Any:
    """The value one step up or down, within the bounds (NNI's perturbation table)."""
    sign = 1 if up else -1
    if param.kind == "randint":
        return min(max(value + sign, int(param.a)), int(param.b) - 1)
    if param.q is not None:
        moved = (round(value / param.q) + sign) * param.q
        if param.kind == "qlognormal":
            moved = max(moved, 1e-10)
        # from_unit quantizes and clips as sampling does: the step lands on a value the space holds.
        return param.from_unit(param.to_unit(moved)) if param.bounded else moved
    if param.kind == "uniform":
        return min(max(value + sign * (param.b - param.a) * factor, param.a), param.b)
    if param.kind == "loguniform":
        moved = math.exp(math.log(value) + sign * (math.log(param.b) - math.log(param.a)) * factor)
        return min(max(moved, param.a), param.b)  # clipped as a value: exp(log(b)) may come out a bit above b
    if param.kind == "normal":
        return value + sign * param.b * factor
    return math.exp(math.log(value) + sign * param.b * factor)  # lognormal
