"""The elastic AdaptDL controller: a Ray actor that keeps one job training on
what the cluster has, at the size AdaptDL's goodput model says pays.

    size the job (trialkit.ray.sizing: one worker until the trainer's hints arrive,
    then the goodput model's choice, up to -m; or the user's fixed count; in an
    experiment, its share of the cluster from the experiment's allocator: trialkit.ray.share)
    -> plan N workers -> start a generation -> watch it and the cluster
    -> on an event: stop it gracefully, keep rank 0's checkpoint (the one it saves when
       stopped, else its newest periodic one, else the previous one)
    -> restart count + 1, plan again ... until the script ends

The controller serves AdaptDL's supervisor protocol (trialkit.ray.supervisor):
the trainer's hints reach it over HTTP, and its rank 0's address is found
there. Ray's autoscaler is asked for the workers chosen, not for -m.

Events: new hints make the model choose another size (past the hysteresis:
a rescale must repay its restart), the experiment's plan gives the job another
share (another of its jobs started or ended, or sent hints), the cluster holds more of the chosen
workers than run (after waiting up to the rescale timeout), a node with replicas is gone, a
node is going (a spot notice, or Ray draining it), a replica failed or was
killed. A replica that exits by itself with a code of its own while its peers
are alive is the script's verdict: the job ends with that code.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Collection, Dict, List, Optional, Set, Tuple

from trialkit.adaptdl import CHECKPOINTED_EXIT
from trialkit.process import describe_exit
from trialkit.ray import cluster, share, sizing
from trialkit.ray.generation import Generation, Member, job_key
from trialkit.ray.replica import Checkpoint
from trialkit.ray.supervisor import Supervisor

POLL_SECONDS = 0.5  # how often the cluster's nodes are looked at
SETTLE_SECONDS = 3.0  # after a replica failed: how long its peers have to show they are alive
# A node whose replica died or stopped answering may itself have died before
# Ray noticed (its health checks take ~15-30 s): no worker goes there for this long.
SUSPECT_SECONDS = 60.0
MAX_FAILED_RESTARTS = 3  # failures in a row with no checkpoint in between, before the job gives up
STOPPED_EXIT = 130  # the user interrupted adaptdl-ray


@dataclass(frozen=True)
class Job:
    job_id: str
    command: Tuple[str, ...]  # the script, relative to the working dir, and its arguments
    max_workers: int
    cpus: float
    gpus: float
    checkpoint_timeout: float
    rescale_timeout: float
    shared_dir: Optional[str] = None
    checkpoint_every: float = 0.0  # seconds of training between checkpoints; 0: on a stop only
    min_workers: int = 1
    fixed_workers: Optional[int] = None  # the user's count: the goodput model is not asked
    experiment_id: Optional[str] = None  # set: the job shares the cluster with the experiment's other jobs
    label: str = ""  # how the experiment's log names the job (its trial's id)

    def shape(self) -> share.JobShape:
        return share.JobShape(self.job_id, self.label or self.job_id, self.cpus, self.gpus, self.min_workers,
                              self.max_workers, self.fixed_workers)


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    error: Optional[str] = None  # why the job stopped short of its script's end, if it did


@dataclass(frozen=True)
class Event:
    why: str
    exit_code: Optional[int] = None  # set: the job ends with this code
    failure: bool = False  # a replica failed or was lost (counts toward MAX_FAILED_RESTARTS)
    exclude: Optional[str] = None  # a node to leave out from now on (it has a spot notice)
    suspect: Tuple[str, ...] = ()  # nodes to leave out for SUSPECT_SECONDS (their replicas were lost)


def say(line: str) -> None:
    print(line, flush=True)  # Ray forwards it to adaptdl-ray's terminal


class Controller:
    def __init__(self, job: Job):
        self.job = job
        self.restarts = 0
        self.checkpoint: Optional[Checkpoint] = None
        self.excluded: Set[str] = set()
        self.suspects: Dict[str, float] = {}  # node -> until when (monotonic) it gets no worker
        self.failures = 0
        self._stop = threading.Event()
        self.target = job.fixed_workers or job.min_workers  # the size chosen; one worker until hints come
        self._new_hints: Optional[sizing.Hints] = None
        self._hints_changed = threading.Event()
        self.supervisor: Optional[Supervisor] = None
        self.share: "share.Alone | share.Shared"
        self.last_decision = ""
        self.predicted: Dict[int, float] = {}
        self.running: Tuple[int, str] = (0, "")  # workers of the generation now, and why it started
        # What adaptdl-ray shows in the trial (sdk.report_elastic): one decision per restart or new sizing.
        self.decisions: List[Dict[str, object]] = []
        self._decided = threading.Condition()
        self._ended = False

    def __repr__(self) -> str:
        return "adaptdl-ray"  # the prefix of its lines on the user's terminal

    def stop(self) -> None:
        """Stop the job: the replicas get their grace to checkpoint, then the job ends."""
        self._stop.set()

    def run(self) -> Outcome:
        import ray

        self.supervisor = Supervisor(ray.util.get_node_ip_address(), self._on_hints).start()
        if self.job.experiment_id:
            self.share = share.Shared(self.job.shape(), self.job.experiment_id,
                                      ray.get_runtime_context().current_actor)
            self._sized(self.share.share, "joined the experiment's plan")
        else:
            self.share = share.Alone(self.job.shape(), self.target)
        try:
            return self._run()
        finally:
            self.share.leave()
            self.supervisor.close()
            with self._decided:
                self._ended = True
                self._decided.notify_all()

    def next_decision(self, seen: int, timeout: float) -> Tuple[int, Optional[Dict[str, object]], bool]:
        """(how many decisions, the newest if that is more than `seen`, whether the job ended),
        once there is news or after `timeout` seconds."""
        with self._decided:
            self._decided.wait_for(lambda: len(self.decisions) > seen or self._ended, timeout)
            count = len(self.decisions)
            return count, self.decisions[-1] if count > seen else None, self._ended

    def wait_ended(self) -> None:
        """Returns when the job has ended (the allocator's way to hear of a controller's death)."""
        with self._decided:
            self._decided.wait_for(lambda: self._ended)

    def _decide(self) -> None:
        """The job as it runs now: its workers, the model's predictions, why it last rescaled."""
        workers, why = self.running
        with self._decided:
            self.decisions.append({"workers": workers, "predicted": dict(self.predicted), "reason": why})
            self._decided.notify_all()

    def _on_hints(self, key: str, hints: sizing.Hints) -> None:
        """The trainer's hints (from the supervisor's thread): the next look at the job re-sizes it."""
        if key != job_key(self.job.job_id):
            say(f"ignored hints for another job ({key})")
            return
        self._new_hints = hints
        self._hints_changed.set()

    def _resize(self, nodes: List[cluster.Node], running: int, why: str) -> int:
        """The goodput model's size for the job now (alone, or in the experiment's plan)."""
        hints, self._new_hints = self._new_hints, None
        usable = [n for n in nodes if n.node_id not in self._left_out()]
        return self._sized(self.share.update(hints, running, usable, why), why)

    def _sized(self, decided: share.Share, why: str) -> int:
        """Take a share as the job's target, said in the log when it is news."""
        self.predicted = decided.predicted
        line = (f"sizing ({why}): {decided.reason}"
                + (("; predicted speedup by workers: " + ", ".join(f"{n}: {s:.2f}x" for n, s in self.predicted.items()))
                   if self.predicted else ""))
        if line != self.last_decision:
            say(line)
            self.last_decision = line
            if self.running[0]:
                self._decide()
        self.target = decided.workers
        return decided.workers

    def _run(self) -> Outcome:
        nodes = self._wait_for_nodes(first=True)
        why = "started"
        while nodes and not self._stop.is_set():
            generation = Generation(self.job, nodes, self.restarts, self.checkpoint, self.supervisor)
            self.share.started(nodes)
            resume = f"from {self.checkpoint.describe()}" if self.checkpoint else "afresh: no checkpoint yet"
            say(f"restart {self.restarts}: {cluster.describe(nodes)}, starting {resume}")
            self.running = (len(nodes), why)
            self._decide()
            event = self._watch(generation)
            say(event.why)
            why, self.running = event.why, (0, "")
            timed_out = generation.stop(self.job.checkpoint_timeout, event.suspect)
            if event.exit_code is not None:
                generation.close(last=True, lost_nodes=event.suspect)
                return Outcome(event.exit_code)
            fresh = self._keep_checkpoint(generation, timed_out, event.suspect)
            generation.close(lost_nodes=event.suspect)
            self.failures = 0 if fresh else self.failures + event.failure
            if self.failures > MAX_FAILED_RESTARTS:
                return Outcome(1, f"gave up after {self.failures} failed restarts in a row with no checkpoint")
            if event.exclude:
                self.excluded.add(event.exclude)
            self.suspects.update({node: time.monotonic() + SUSPECT_SECONDS for node in event.suspect})
            self.restarts += 1
            nodes = self._wait_for_nodes(first=False)
        if self._stop.is_set():
            return Outcome(STOPPED_EXIT, "stopped")
        return Outcome(1, f"no node of the cluster can hold a worker of {_size(self.job)} "
                          f"(waited {self.job.rescale_timeout:g} s)")

    def _wait_for_nodes(self, first: bool) -> List[cluster.Node]:
        """The next generation's nodes. At the first start, wait up to the rescale timeout
        for the maximum; after a loss, start at once on what is left. [] if nothing fits.
        Sharing the cluster, wait as long as the experiment's plan gives the job nothing,
        or the slots it was given are still held by a job shrinking to make room."""
        deadline = time.monotonic() + self.job.rescale_timeout
        said = ""
        while True:
            nodes, coming = self._place(cluster.alive_nodes(), cluster.draining_nodes())
            if self.target and (len(nodes) >= self.target or (nodes and not first and not coming)):
                return nodes
            if not self.target or coming:
                deadline = time.monotonic() + self.job.rescale_timeout
            waiting = self._waiting_for(len(nodes), coming)
            if waiting != said:  # once, and again when what it waits for changes
                say(waiting)
                said = waiting
            # Ray offers no public event for a node joining: look again shortly,
            # but wake at once when the job is told to stop or its share changes.
            if time.monotonic() >= deadline or self._pause():
                return nodes

    def _waiting_for(self, fit: int, coming: bool) -> str:
        if not self.target:
            return "waiting for the experiment's plan to give this job a worker (its other jobs hold the cluster)"
        if coming:
            return "waiting for the experiment's other jobs to give back the slots its plan gave this one"
        workers = f"{self.target} worker{'s' * (self.target != 1)}"
        return (f"waiting up to {self.job.rescale_timeout:g} s (--cluster-rescale-timeout) for the cluster to hold "
                f"{workers} of {_size(self.job)}: it holds {fit} now")

    def _pause(self) -> bool:
        """Wait up to POLL_SECONDS, taking a new share when one comes; True when the job is to stop."""
        import ray

        change = self.share.next_change()
        if change is None:
            return self._stop.wait(POLL_SECONDS)
        if ray.wait([change], timeout=POLL_SECONDS)[0]:
            self._take_change()
        return self._stop.is_set()

    def _take_change(self) -> Optional[share.Share]:
        changed = self.share.changed()
        if changed is not None:
            self._sized(changed, f"the experiment's plan changed: {changed.cause}")
        return changed

    def _place(self, nodes: List[cluster.Node], draining: Collection[str] = (),
               reserve: bool = True) -> Tuple[List[cluster.Node], bool]:
        return self.share.place(nodes, self.target, self._left_out(draining), reserve)

    def _left_out(self, draining: Collection[str] = ()) -> Set[str]:
        now = time.monotonic()
        suspects = {node for node, until in self.suspects.items() if until > now}
        return self.excluded.union(draining, suspects)

    def _watch(self, generation: Generation) -> Event:
        import ray

        grow_since: Optional[float] = None
        running = len(generation.members)
        while True:
            change = self.share.next_change()
            refs = [m.done for m in generation.members] + list(generation.notices) + [change] * (change is not None)
            ready, _ = ray.wait(refs, num_returns=1, timeout=POLL_SECONDS)
            if self._stop.is_set():
                return Event("stopped by the user: the replicas checkpoint and the job ends", exit_code=STOPPED_EXIT)
            for ref in ready:
                if change is not None and ref == change:
                    changed = self._take_change()
                    if changed is not None and changed.workers != running:
                        return Event(f"the experiment's plan changed ({changed.cause}): {changed.workers} "
                                     f"workers (now {running}): rescaling")
                elif ref in generation.notices:
                    node = generation.notices.pop(ref)
                    try:
                        notice = ray.get(ref)
                    except ray.exceptions.RayError:  # its replica is gone: its end says so
                        continue
                    if notice is not None:
                        return Event(f"spot notice for node {_name(node)} ({_notice(notice)}): "
                                     "checkpointing, then going on without it", exclude=node.node_id)
                else:
                    return self._finished(generation, generation.member_of(ref))
            nodes = cluster.alive_nodes()
            alive = {n.node_id for n in nodes}
            gone = [m for m in generation.members if m.node.node_id not in alive]
            if gone:
                return Event(f"node {_name(gone[0].node)} is gone (rank {_ranks(gone)})", failure=True,
                             suspect=tuple({m.node.node_id for m in gone}))
            if self._hints_changed.is_set():
                self._hints_changed.clear()
                chosen = self._resize(nodes, running, "new hints")
                if chosen != running:
                    return Event(f"the goodput model chose {chosen} workers (now {running}): rescaling")
            draining = cluster.draining_nodes()
            leaving = [m for m in generation.members if m.node.node_id in draining]
            if leaving:
                # Like a spot notice, from Ray: the node goes once idle or at the deadline.
                return Event(f"node {_name(leaving[0].node)} is being drained by Ray: "
                             "checkpointing, then going on without it", exclude=leaving[0].node.node_id)
            fit = len(self._place(nodes, draining, reserve=False)[0])
            if fit <= running:
                grow_since = None
                continue
            grow_since = grow_since or time.monotonic()
            if fit >= self.target or time.monotonic() - grow_since >= self.job.rescale_timeout:
                return Event(f"the cluster now holds {fit} workers: rescaling")

    def _finished(self, generation: Generation, member: Member) -> Event:
        result = generation.outcome(member)
        rank = f"rank {member.rank}"
        if result is None:
            return Event(f"{rank}'s worker on node {_name(member.node)} was lost", failure=True,
                         suspect=(member.node.node_id,))
        code = result.exit_code
        if code == 0:
            codes = [r.exit_code for r in generation.wait_all(self.job.checkpoint_timeout) if r is not None]
            return Event("the script ended", exit_code=next((c for c in codes if c), 0))
        if code == CHECKPOINTED_EXIT:
            return Event(f"{rank} saved a checkpoint and exited: restarting")
        if code is None or code > 128:
            return Event(f"{rank} ended by {describe_exit(code or 137)}", failure=True)
        lost = generation.unresponsive(SETTLE_SECONDS)
        if lost:
            return Event(f"{rank} exited with code {code} after rank {_ranks(lost)} was lost", failure=True,
                         suspect=tuple({m.node.node_id for m in lost}))
        return Event(f"{rank} exited with code {code}", exit_code=code)

    def _keep_checkpoint(self, generation: Generation, timed_out: bool, lost_nodes: Collection[str]) -> bool:
        """Keep rank 0's new checkpoint; True if there was one."""
        taken = generation.take_checkpoint(self.job.checkpoint_timeout, lost_nodes)
        if taken is not None:
            self.checkpoint = taken
            say(f"took rank 0's checkpoint of restart {taken.restart}" +
                (f" (step {taken.step})" if taken.step is not None else ""))
            return True
        fallback = f"resuming from {self.checkpoint.describe()}" if self.checkpoint else "starting afresh"
        late = f" within the {self.job.checkpoint_timeout:g} s checkpoint timeout" if timed_out else ""
        say(f"rank 0 left no checkpoint{late}: {fallback}")
        return False


def _name(node: cluster.Node) -> str:
    return "head" if node.is_head else node.node_id[:8]


def _ranks(members: List[Member]) -> str:
    return ", ".join(str(m.rank) for m in members)


def _notice(notice: Dict[str, str]) -> str:
    return " ".join(str(notice[key]) for key in ("action", "time") if key in notice) or "notice"


def _size(job: Job) -> str:
    return f"{job.cpus:g} CPUs and {job.gpus:g} GPUs"
