"""How many workers an elastic job gets, and on which nodes: alone on the
cluster, or sharing it with its experiment's other elastic jobs.

`Alone` plans the job by itself (sizing.plan over the whole cluster; the head
first, then the other nodes). `Shared` asks the experiment's `Allocator`, one
Ray actor for all of the experiment's adaptdl-ray controllers:

    a controller joins -> tells it the job's hints and size -> the allocator
    plans every job at once (sizing.plan: Pollux's policy, goodput-weighted)
    -> each controller whose share changed is woken (its pending next_share
    call returns) and rescales through its checkpoint path

It re-plans when a job joins or leaves or sends new hints, and when a job's
size changes. It also places workers: a job reserves its slots before it
starts a generation, so two jobs never take the same slots, and a job whose
share grew waits while the slots it needs are still held by a job that is
shrinking to make room.

The allocator is a detached actor named after the experiment (it outlives
any one controller); it leaves once its last job has left, after IDLE_SECONDS
in which no new job joined. The classes are plain Python: importing this
module does not import ray.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Collection, Dict, List, Optional, Tuple

from trialkit.ray import cluster, sizing

IDLE_SECONDS = 5.0  # an allocator with no job left waits this long for another before it leaves
JOIN_ATTEMPTS = 5  # a controller that meets an allocator just leaving tries again with a fresh one
CALL_TIMEOUT = 30.0


def allocator_name(experiment_id: str) -> str:
    return f"trialkit-allocator-{experiment_id}"


@dataclass(frozen=True)
class JobShape:
    """What the allocator needs to know of a job that does not change while it runs."""

    job_id: str
    label: str  # how the log names it: the trial's id, or the job's
    cpus: float
    gpus: float
    min_workers: int
    max_workers: int
    pinned: Optional[int]


@dataclass(frozen=True)
class Share:
    """A job's share of the cluster, as last planned."""

    workers: int  # 0: it waits, the cluster is full
    reason: str  # sizing's reason for this count
    predicted: Dict[int, float]  # {workers: predicted speedup}; empty without hints
    cause: str = ""  # what made the allocator plan again ("trial X joined", ...)
    version: int = 0


@dataclass
class _Entry:
    shape: JobShape
    speedup: Optional[sizing.Speedup] = None
    current: int = 0  # workers it runs on now
    reserved: List[str] = field(default_factory=list)  # the node of each worker it placed


class Allocator:
    """The experiment's planner (a Ray async actor: next_share waits while the others are served)."""

    def __init__(self, experiment_id: str):
        self.experiment_id = experiment_id
        self.jobs: Dict[str, _Entry] = {}  # in arrival order: the planner seats earlier jobs first
        self.shares: Dict[str, Share] = {}
        self._changed: Optional[asyncio.Condition] = None
        self._idle: Optional[asyncio.Task] = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # made on the actor's event loop
            self._changed = asyncio.Condition()
        return self._changed

    async def join(self, shape: JobShape, controller: Any) -> Share:
        """A job comes; `controller` is its controller's actor, whose death means the job left."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self.jobs[shape.job_id] = _Entry(shape)
        asyncio.get_running_loop().create_task(self._leave_with(shape.job_id, controller))
        await self._replan(f"{shape.label} joined")
        return self.shares[shape.job_id]

    async def _leave_with(self, job_id: str, controller: Any) -> None:
        # A controller ends by leaving; one whose driver was killed dies without a word,
        # and its share must not stay held for ever.
        try:
            await controller.wait_ended.remote()
        except Exception:  # noqa: BLE001 - any way the call fails, the controller is gone
            pass
        await self.leave(job_id)

    async def update(self, job_id: str, hints: Optional[sizing.Hints], current: int, cause: str) -> Share:
        """The job's new hints (None: unchanged) and the workers it runs on; its share after a new plan."""
        entry = self.jobs[job_id]
        if hints is not None:
            entry.speedup = sizing.Speedup(hints)
        entry.current = current
        await self._replan(cause)
        return self.shares[job_id]

    async def leave(self, job_id: str) -> None:
        entry = self.jobs.pop(job_id, None)
        self.shares.pop(job_id, None)
        if entry is not None:
            await self._replan(f"{entry.shape.label} ended")
        if not self.jobs and self._idle is None:
            self._idle = asyncio.get_running_loop().create_task(self._leave_when_idle())

    async def next_share(self, job_id: str, version: int) -> Optional[Share]:
        """Returns once the job's share is no longer `version` (None: the job is not known here)."""
        async with self._condition():
            await self._condition().wait_for(
                lambda: job_id not in self.shares or self.shares[job_id].version != version)
        return self.shares.get(job_id)

    async def place(self, job_id: str, count: int, exclude: List[str], reserve: bool) -> Tuple[List[str], bool]:
        """Nodes for up to `count` of the job's workers on slots no other job holds (the head first);
        with `reserve`, they become the job's. Also whether more slots are on their way: other
        jobs still hold more than their shares."""
        entry = self.jobs[job_id]
        held: Dict[str, Tuple[float, float]] = {}
        coming = False
        for other_id, other in self.jobs.items():
            if other_id == job_id:
                continue
            for node_id in other.reserved:
                cpus, gpus = held.get(node_id, (0.0, 0.0))
                held[node_id] = (cpus + other.shape.cpus, gpus + other.shape.gpus)
            coming = coming or len(other.reserved) > self.shares[other_id].workers
        free = [cluster.Node(n.node_id, n.address, n.cpus - held.get(n.node_id, (0, 0))[0],
                             n.gpus - held.get(n.node_id, (0, 0))[1], n.is_head)
                for n in cluster.alive_nodes()]
        nodes = [n.node_id for n in cluster.plan(free, entry.shape.cpus, entry.shape.gpus, count,
                                                 set(exclude).union(cluster.draining_nodes()))]
        if reserve:
            entry.reserved = nodes
        return nodes, coming

    async def _replan(self, cause: str) -> None:
        jobs = list(self.jobs.values())
        if jobs:
            # The jobs of one experiment are planned in units of the largest worker among them.
            cpus = max(e.shape.cpus for e in jobs)
            gpus = max(e.shape.gpus for e in jobs)
            draining = cluster.draining_nodes()
            node_slots = [cluster.slots(n, cpus, gpus) for n in cluster.alive_nodes() if n.node_id not in draining]
            decided = sizing.plan([_demand(e) for e in jobs], node_slots or [0])
            for entry in jobs:
                job_id = entry.shape.job_id
                old = self.shares.get(job_id)
                workers = decided.workers[job_id]
                changed = old is None or old.workers != workers
                # A new version (which wakes the job's controller) only when its count changed.
                self.shares[job_id] = Share(workers, decided.reasons[job_id], decided.predicted.get(job_id, {}),
                                            cause if changed else old.cause, (old.version if old else 0) + changed)
            _ask_autoscaler([(e.shape, self.shares[e.shape.job_id].workers) for e in jobs])
        async with self._condition():
            self._condition().notify_all()

    async def _leave_when_idle(self) -> None:
        import ray

        await asyncio.sleep(IDLE_SECONDS)
        if not self.jobs:
            _ask_autoscaler([])
            ray.actor.exit_actor()


def _ask_autoscaler(workers: List[Tuple[JobShape, int]]) -> None:
    """Where an autoscaler runs, this brings the cluster to what the jobs were given (no-op elsewhere)."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[_bundle(shape) for shape, count in workers for _ in range(count)])


def _bundle(shape: JobShape) -> Dict[str, float]:
    return {name: amount for name, amount in (("CPU", shape.cpus), ("GPU", shape.gpus)) if amount}


def _demand(entry: _Entry) -> sizing.Demand:
    shape = entry.shape
    return sizing.Demand(shape.job_id, entry.speedup, min_workers=shape.min_workers, max_workers=shape.max_workers,
                         current=entry.current, pinned=shape.pinned)


class Alone:
    """The job plans by itself, over every node of the cluster."""

    def __init__(self, shape: JobShape, workers: int):
        self.shape = shape
        self._speedup: Optional[sizing.Speedup] = None
        self._asked = workers
        _ask_autoscaler([(shape, workers)])

    def update(self, hints: Optional[sizing.Hints], current: int, nodes: List[cluster.Node], cause: str) -> Share:
        if hints is not None:
            self._speedup = sizing.Speedup(hints)
        shape = self.shape
        node_slots = [cluster.slots(n, shape.cpus, shape.gpus) for n in nodes] or [0]
        decided = sizing.plan([_demand(_Entry(shape, self._speedup, current))], node_slots)
        # Alone, a job never waits for itself: below its minimum it runs on what fits.
        workers = decided.workers[shape.job_id] or self._asked
        if workers != self._asked:
            self._asked = workers
            _ask_autoscaler([(shape, workers)])
        return Share(workers, decided.reasons[shape.job_id], decided.predicted.get(shape.job_id, {}), cause)

    def started(self, nodes: List[cluster.Node]) -> None:
        pass  # nobody else plans around it

    def place(self, nodes: List[cluster.Node], count: int, exclude: Collection[str],
              reserve: bool = True) -> Tuple[List[cluster.Node], bool]:
        return cluster.plan(nodes, self.shape.cpus, self.shape.gpus, count, exclude), False

    def next_change(self) -> Any:
        return None  # nothing else re-plans it

    def leave(self) -> None:
        _ask_autoscaler([])


class Shared:
    """The job's share comes from its experiment's allocator."""

    def __init__(self, shape: JobShape, experiment_id: str, controller: Any):
        import ray

        self.shape = shape
        for attempt in range(JOIN_ATTEMPTS):
            self._allocator = ray.remote(Allocator).options(
                name=allocator_name(experiment_id), namespace=cluster.NAMESPACE, lifetime="detached", get_if_exists=True,
                num_cpus=0, resources={cluster.HEAD_RESOURCE: 0.001}).remote(experiment_id)
            try:
                self.share: Share = ray.get(self._allocator.join.remote(shape, controller), timeout=CALL_TIMEOUT)
                break
            except ray.exceptions.RayActorError:  # it was leaving, idle: the next one is fresh
                if attempt == JOIN_ATTEMPTS - 1:
                    raise
                time.sleep(0.5)
        self._pending = None

    def update(self, hints: Optional[sizing.Hints], current: int, nodes: List[cluster.Node], cause: str) -> Share:
        import ray

        # self.share moves on only through changed(): a new count this call brings about
        # also wakes next_change(), where the controller rescales for it.
        return ray.get(self._allocator.update.remote(self.shape.job_id, hints, current, cause),
                       timeout=CALL_TIMEOUT)

    def started(self, nodes: List[cluster.Node]) -> None:
        """The job runs on `nodes` now: the others are planned around that size."""
        self.update(None, len(nodes), nodes, f"{self.shape.label} runs on {len(nodes)}")

    def place(self, nodes: List[cluster.Node], count: int, exclude: Collection[str],
              reserve: bool = True) -> Tuple[List[cluster.Node], bool]:
        import ray

        ids, coming = ray.get(self._allocator.place.remote(self.shape.job_id, count, list(exclude), reserve),
                              timeout=CALL_TIMEOUT)
        by_id = {n.node_id: n for n in nodes}
        return [by_id[i] for i in ids if i in by_id], coming

    def next_change(self) -> Any:
        """A pending call that returns when this job's share changes (one at a time)."""
        if self._pending is None:
            self._pending = self._allocator.next_share.remote(self.shape.job_id, self.share.version)
        return self._pending

    def changed(self) -> Optional[Share]:
        """The new share, once next_change() returned; None when the job is no longer known."""
        import ray

        share = ray.get(self._pending)
        self._pending = None
        if share is not None:
            self.share = share
        return share

    def leave(self) -> None:
        import ray

        try:
            ray.get(self._allocator.leave.remote(self.shape.job_id), timeout=CALL_TIMEOUT)
        except ray.exceptions.RayError:
            pass  # gone already: nothing of this job is left to plan around
