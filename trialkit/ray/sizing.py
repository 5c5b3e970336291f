"""How many workers each elastic job gets: AdaptDL's goodput model over its own hints.

A running AdaptDL trainer measures itself and sends scheduling hints
(`perfParams`, `gradParams`, batch-size limits; see trialkit.ray.supervisor).
From them `Speedup` predicts, through AdaptDL's own `adaptdl.goodput`, how much
faster the job trains on N workers over K nodes than on one worker (goodput:
throughput times statistical efficiency, at the best batch size for that
shape). `plan` then shares a cluster's slots among jobs as Pollux does:
every job starts at its minimum, and each further worker goes to the job whose
predicted speedup it raises most, while that gain is worth a worker at all.
(Pollux searches allocations with a genetic algorithm over a fairness-weighted
objective; for the few jobs of one experiment, adding workers one at a time by
marginal gain finds the same optimum of the summed speedups, since speedup is
concave in the number of workers.) A job without hints yet runs on one worker,
as AdaptDL does, or on what the user pinned.

Why not AdaptDL's own scheduler package (adaptdl-sched 0.2.11): it pins
aiohttp 3.7 and kubernetes-asyncio 9.1, which do not install beside our pins on
Python 3.11, and its policy needs pymoo with numpy's removed aliases. This
module uses only `adaptdl.goodput`, which ships with the trainer.

Hysteresis: a job is rescaled only when the new size promises a clear gain
over the restart it costs (`Hysteresis`): every rescale is a checkpoint, a
stop and a restart of every worker.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

PERF_FIELDS = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma")
# A worker is added only if it raises the job's speedup by at least this much
# (in units of one worker's ideal contribution): below it the worker is better
# left to another job, or not paid for.
MIN_MARGINAL_GAIN = 0.3
# Pollux lets a job grow to at most twice the replicas it has been profiled on:
# the model is trusted near what it has seen.
EXPLORATION_FACTOR = 2


class HintsError(ValueError):
    """Hints a trainer sent that cannot be used; the message says which field and why."""


@dataclass(frozen=True)
class Hints:
    """AdaptDL's scheduling hints (adaptdl.sched_hints.SCHED_HINTS), checked."""

    perf: Tuple[float, ...]  # PerfParams, in PERF_FIELDS order
    grad_sqr: float
    grad_var: float
    init_batch_size: int
    max_batch_size: int
    local_bsz_bounds: Optional[Tuple[int, int]]
    accumulation: bool
    max_profiled_replicas: int

    @classmethod
    def parse(cls, data: Any) -> "Hints":
        if not isinstance(data, Mapping):
            raise HintsError(f"expected a JSON object, got {type(data).__name__}")
        perf = data.get("perfParams")
        grad = data.get("gradParams")
        if not isinstance(perf, Mapping) or set(perf) != set(PERF_FIELDS):
            raise HintsError(f"perfParams must hold exactly {', '.join(PERF_FIELDS)}")
        if not isinstance(grad, Mapping) or not {"norm", "var"} <= set(grad):
            raise HintsError("gradParams must hold norm and var (no gradient statistics yet)")
        values = [_finite(perf[name], f"perfParams.{name}") for name in PERF_FIELDS]
        bounds = data.get("localBszBounds")
        if bounds is not None:
            if not (isinstance(bounds, Sequence) and len(bounds) == 2):
                raise HintsError("localBszBounds must be [min, max]")
            bounds = (_count(bounds[0], "localBszBounds[0]"), _count(bounds[1], "localBszBounds[1]"))
        init = _count(data.get("initBatchSize"), "initBatchSize")
        maximum = _count(data.get("maxBatchSize") or init, "maxBatchSize")
        if maximum < init:
            raise HintsError(f"maxBatchSize {maximum} is below initBatchSize {init}")
        return cls(
            perf=tuple(values),
            grad_sqr=_finite(grad["norm"], "gradParams.norm"),
            grad_var=_finite(grad["var"], "gradParams.var"),
            init_batch_size=init,
            max_batch_size=maximum,
            local_bsz_bounds=bounds,
            accumulation=bool(data.get("gradientAccumulation")),
            max_profiled_replicas=max(1, _count(data.get("maxProfiledReplicas") or 1, "maxProfiledReplicas")),
        )


def _finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise HintsError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HintsError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


class Speedup:
    """speedup(nodes, workers): goodput on that shape over goodput on one worker, by AdaptDL's model."""

    def __init__(self, hints: Hints):
        import numpy

        # adaptdl 0.2.11's optimize() still names numpy.int, removed in numpy 1.24.
        if not hasattr(numpy, "int"):
            numpy.int = int
        from adaptdl.goodput import GoodputFunction, GradParams, PerfParams

        self.hints = hints
        self._fn = GoodputFunction(PerfParams(*hints.perf), GradParams(hints.grad_sqr, hints.grad_var),
                                   hints.init_batch_size)
        self._memo: Dict[Tuple[int, int], float] = {}
        self._base = self._goodput(1, 1)

    def _goodput(self, nodes: int, workers: int) -> float:
        goodput, _, _ = self._fn.optimize(nodes, workers, max_batch_size=self.hints.max_batch_size,
                                          atomic_bsz_range=self.hints.local_bsz_bounds,
                                          accumulation=self.hints.accumulation)
        return float(goodput)

    def __call__(self, nodes: int, workers: int) -> float:
        if workers == 0:
            return 0.0
        key = (nodes, workers)
        if key not in self._memo:
            self._memo[key] = self._goodput(nodes, workers) / self._base if self._base > 0 else 1.0
        return self._memo[key]

    def limit(self) -> int:
        """The most workers the model is trusted for (twice what it was profiled on)."""
        return EXPLORATION_FACTOR * self.hints.max_profiled_replicas


@dataclass
class Demand:
    """One job as the planner sees it."""

    name: str
    speedup: Optional[Speedup]  # None: no hints yet
    min_workers: int = 1
    max_workers: int = 1_000_000
    current: int = 0  # workers it runs on now (0: not running)
    pinned: Optional[int] = None  # a fixed count the user asked for

    def ceiling(self) -> int:
        if self.pinned is not None:
            return self.pinned
        if self.speedup is None:
            return max(1, self.min_workers)  # no hints yet: one worker, as AdaptDL starts
        return max(self.min_workers, min(self.max_workers, self.speedup.limit()))


@dataclass(frozen=True)
class Hysteresis:
    """When a running job's size changes. Growing must repay the restart it costs:
    the relative speedup gain, held over the horizon, must exceed the restart time.
    Shrinking gives back workers that barely help: their average gain must sit
    clearly below the gain that earns a worker (a band of `band`), so that hints
    that drift a little do not make a job flap between two sizes."""

    restart_seconds: float = 30.0
    horizon_seconds: float = 600.0
    band: float = 0.8

    @property
    def threshold(self) -> float:
        return self.restart_seconds / self.horizon_seconds

    def worth(self, speedup: Optional[Speedup], nodes: Tuple[int, int], now: int, new: int) -> bool:
        """Whether going from `now` workers (on nodes[0] nodes) to `new` (nodes[1]) pays."""
        if now == 0 or new == now or speedup is None:
            return new != now
        before, after = speedup(nodes[0], now), speedup(nodes[1], new)
        if new < now:
            return (before - after) / (now - new) < MIN_MARGINAL_GAIN * self.band
        return after / max(before, 1e-9) - 1.0 > self.threshold


def nodes_for(workers: int, free: Sequence[int]) -> int:
    """How many nodes `workers` span when packed into the fullest-fitting nodes first."""
    count, left = 0, workers
    for slots in sorted(free, reverse=True):
        if left <= 0:
            break
        if slots > 0:
            count += 1
            left -= slots
    return max(count, 1 if workers else 0)


@dataclass
class Plan:
    workers: Dict[str, int] = field(default_factory=dict)
    predicted: Dict[str, Dict[int, float]] = field(default_factory=dict)  # job -> {workers: speedup}
    reasons: Dict[str, str] = field(default_factory=dict)


def plan(jobs: Sequence[Demand], node_slots: Sequence[int], hysteresis: Hysteresis = Hysteresis()) -> Plan:
    """Workers per job for a cluster whose nodes have `node_slots` slots each; `jobs` in arrival order."""
    ideal = _greedy(jobs, node_slots)
    out = Plan(workers=dict(ideal))
    kept_from_shrinking = []
    for job in jobs:
        now, new = job.current, ideal[job.name]
        shape = (nodes_for(now, node_slots), nodes_for(new, node_slots))
        if now and new and new != now and not hysteresis.worth(job.speedup, shape, now, new):
            out.workers[job.name] = now
            out.reasons[job.name] = f"stays at {now}: {new} would not repay a restart"
            if new < now:
                kept_from_shrinking.append(job)
    if sum(out.workers.values()) > sum(node_slots):
        # Keeping a job large only holds while nobody needs its workers.
        for job in kept_from_shrinking:
            out.workers[job.name] = ideal[job.name]
            out.reasons.pop(job.name)
    for job in jobs:
        count = out.workers[job.name]
        if job.speedup is not None:
            out.predicted[job.name] = {n: round(job.speedup(nodes_for(n, node_slots), n), 3)
                                       for n in range(1, job.ceiling() + 1)}
        out.reasons.setdefault(job.name, _why(job, count, node_slots))
    return out


def _greedy(jobs: Sequence[Demand], node_slots: Sequence[int]) -> Dict[str, int]:
    """Each job at its minimum (latest jobs wait when even that does not fit), then
    one worker at a time to the job it speeds up most, while a worker is worth it."""
    total = sum(node_slots)
    workers: Dict[str, int] = {}
    for job in jobs:
        want = job.pinned if job.pinned is not None else min(max(job.min_workers, 1), job.ceiling())
        workers[job.name] = want if sum(workers.values()) + want <= total else 0
    while sum(workers.values()) < total:
        best, best_gain = None, MIN_MARGINAL_GAIN
        for job in jobs:
            have = workers[job.name]
            if job.speedup is None or job.pinned is not None or have == 0 or have >= job.ceiling():
                continue
            gain = job.speedup(nodes_for(have + 1, node_slots), have + 1) - job.speedup(nodes_for(have, node_slots), have)
            if gain > best_gain:
                best, best_gain = job, gain
        if best is None:
            break
        workers[best.name] += 1
    return workers


def _why(job: Demand, count: int, node_slots: Sequence[int]) -> str:
    if count == 0:
        return "waits: the cluster is full"
    if job.pinned is not None:
        return f"{count}: pinned"
    if job.speedup is None:
        return f"{count}: no hints yet"
    speedup = job.speedup(nodes_for(count, node_slots), count)
    return f"{count}: the goodput model's choice (predicted speedup {speedup:.2f}x over one worker)"
