"""The job queue: an experiment's trials that wait for a slot, in the order they will start.

    queue = JobQueue(store)
    queue.track("abcd1234-00003", priority=42)     # a trial the store holds
    queue.push("abcd1234-00003")                   # queued behind every queued trial
    queue.apply(Move("abcd1234-00003", ahead_of="abcd1234-00001"))
    queue.head()                                   # the next to start
    queue.remove("abcd1234-00003")                 # it got a slot

Order: smaller priority first (Determined's priority scheduler; the config's
`priority`, default 42, as a job's in the resource pool), then lower position,
whatever the pool's scheduler (`priority_descending` orders experiments in a
pool, not an experiment's trials). A trial joins behind every
queued one (the largest position + 1); a priority change keeps its position;
`ahead_of`/`behind_of` take the other trial's priority and the place just
before/after it. Every change is written to the store (trials.priority and
trials.position, NULL when not queued), so `trialkit job list` reads the same
order and a resumed experiment finds its queue as it was.

Who queues: trials put back by `activate` or after a preemption. The tuner's
next trial is not asked for ahead of its slot (the runner asks when a slot
frees, as NNI does, so each proposal knows every result there is); it counts
as waiting at the back of the experiment's priority.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from trialkit import gpus
from trialkit.manager.store import Store
from trialkit.errors import UserError
from trialkit.records import INT64_MAX, INT64_MIN, in_int64
from trialkit.schema import show
from trialkit.statuses import PREEMPTED, RUNNING, WAITING

# What users see for a status: a trial stopped with a checkpoint waits to be activated.
LABELS = {PREEMPTED: "PAUSED"}
# The end of a PREEMPTED trial's reason when a user's stop of the whole experiment (Ctrl-C, SIGTERM,
# `experiment stop`) found it holding a checkpoint: `experiment resume` queues it again (control.resume); one
# paused by a user waits for `activate`.
RESUMABLE = "it saved a checkpoint: `trialkit experiment resume` continues it"
# RESUMABLE's kin, for a trial whose checkpoint dir holds just the copy of another's it started from (PBT, a
# configuration Hyperband sends on: loop._seed_checkpoint): it saved none of its own, and `experiment resume`
# queues it again (control.resume), to run from that copy. Stores written before it say RESUMABLE of such a trial.
STARTED_FROM = ("it saved no checkpoint of its own: `trialkit experiment resume` runs it again from the one it "
                "started from")
# The end of the reason of a trial paused or preempted without a checkpoint.
NO_CHECKPOINT = "it saved no checkpoint: its progress restarts from the beginning when it runs again"
# The end of the reason of a PREEMPTED trial that `experiment resume` queues again, to run from the start
# (control.resume): a user's stop of the whole experiment found it without a checkpoint, and its tuner needs its
# run whole. The tail alone tells it, whatever the tuner calls its round.
RUNS_AGAIN = f"`trialkit experiment resume` runs it again; {NO_CHECKPOINT}"
# A stop of the experiment cut it short before its final result (Tuner.ROUND names what waits for it, if anything).
RERUN = f"waits for its result: {RUNS_AGAIN}"
CUT_SHORT = f"it was cut short before its final result: {RUNS_AGAIN}"
# Its final result came, but not its end: other trials go on from the checkpoint it may still have been
# saving (Tuner.HANDS_ON_CHECKPOINTS; NNI's mnist-pbt example saves after its final result).
RESAVE = f"its final result came before its end, and the trials after it load the checkpoint it saves: {RUNS_AGAIN}"


def rerun(round_name: Optional[str]) -> str:
    """The end of such a trial's reason, naming what waits for it as its tuner says it (Tuner.ROUND)."""
    return f"its {round_name} {RERUN}" if round_name else CUT_SHORT


def requeued(why: str, experiment_id: str, concurrency: int, taken: int, paused: bool, key: str) -> str:
    """The reason of a trial put back in its experiment's queue (`why`: "activated", "resumed: ...", "preempted:
    queued to resume", "restart N of M after: ...") with what it waits for there: its experiment, paused, to be
    activated; else one of the slots its trialConcurrency gives, while `taken` (its trials running or queued
    ahead of it) fill them, and how to change that (`key`: the config's name for trialConcurrency as its user
    wrote it, a Determined config's searcher.max_concurrent_trials); else nothing: it starts at once (`why` stays
    in its history)."""
    if paused:
        return (f"{why}; waiting for its experiment, paused, to be activated (`trialkit experiment activate "
                f"{experiment_id}`)")
    if taken < concurrency:
        return why
    return (f"{why}; waiting for a free slot: {concurrency} of {concurrency} in use by this experiment's trials "
            f"({key}: `trialkit experiment update {experiment_id} --trial-concurrency N` changes it)")


def stopping(why: str, since: float, grace: float) -> str:
    """The reason of a trial that still runs after the loop sent its stop (`why`: who asked, the reason it ends
    with), until it ends: when the stop was sent and when its grace runs out (its keeper kills what is left then).
    NNI has no stopping status: the trial stays RUNNING, and its reason says this."""
    return (f"stopping since {_clock(since)}: {why}; its grace of {grace:g} s ends at {_clock(since + grace)}, "
            "then what still runs is killed")


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))  # local time, as `trial show`'s times


_FIELDS = {"priority": "priority", "ahead-of": "ahead_of", "behind-of": "behind_of"}
PRIORITY_RANGE = f"a priority is a whole number from {INT64_MIN} to {INT64_MAX}"


def label(status: str) -> str:
    return LABELS.get(status, status)


def sort_key(priority: int, position: Optional[int], sequence: int = 0) -> Tuple[int, float, int]:
    """Scheduling order of queued trials: smaller priority, then lower position."""
    return (priority, float("inf") if position is None else position, sequence)


def goes_before(priority: int, other: int) -> bool:
    """Whether a trial of `priority` starts before a queued one of `other` at any position: sort_key's
    order (a strictly smaller number), so the loop's tuner-or-queue choice cannot drift from it."""
    return sort_key(priority, None) < sort_key(other, None)


class _MoveFields(NamedTuple):
    trial_id: str
    priority: Optional[int] = None
    ahead_of: Optional[str] = None
    behind_of: Optional[str] = None


class Move(_MoveFields):
    """One change to the queue: a new priority, or a place ahead of / behind another trial."""

    __slots__ = ()

    def __new__(cls, trial_id: str, priority: Optional[int] = None, ahead_of: Optional[str] = None,
                behind_of: Optional[str] = None) -> "Move":
        if priority is not None and not in_int64(priority):
            raise UserError(f"priority {show(priority)} is out of range", trial_id, PRIORITY_RANGE)
        return super().__new__(cls, trial_id, priority, ahead_of, behind_of)

    @property
    def other(self) -> Optional[str]:
        return self.ahead_of or self.behind_of

    @classmethod
    def parse(cls, text: str) -> "Move":
        """`ID.priority=N`, `ID.ahead-of=ID2` or `ID.behind-of=ID2` (`trialkit job update-batch`)."""
        target, _, value = text.partition("=")
        trial_id, _, name = target.rpartition(".")
        if not trial_id or name not in _FIELDS or not value:
            raise UserError(f"cannot read {text!r}", "update-batch",
                            "write ID.priority=N, ID.ahead-of=ID2 or ID.behind-of=ID2")
        if name == "priority":
            return cls(trial_id, priority=_whole(value, text))
        return cls(trial_id, **{_FIELDS[name]: value})

    def to_json(self) -> Dict[str, Any]:
        return {key: value for key, value in self._asdict().items() if value is not None}

    @classmethod
    def from_json(cls, data: Any) -> "Move":
        """A move from an admin request; ValueError names what is wrong with it."""
        if not isinstance(data, Mapping) or not isinstance(data.get("trial_id"), str):
            raise ValueError('each move is {"trial_id": ID, and one of "priority", "ahead_of", "behind_of"}')
        given = [key for key in ("priority", "ahead_of", "behind_of") if data.get(key) is not None]
        if len(given) != 1 or set(data) - {"trial_id", *given}:
            raise ValueError(f"a move changes one thing: priority, ahead_of or behind_of (got {sorted(data)})")
        value = data[given[0]]
        if given[0] == "priority" and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError("priority is a whole number")
        if given[0] == "priority" and not in_int64(value):
            raise ValueError(f"priority is out of range ({PRIORITY_RANGE})")
        if given[0] != "priority" and not isinstance(value, str):
            raise ValueError(f"{given[0]} is a trial id")
        return cls(data["trial_id"], **{given[0]: value})


def _whole(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{text!r} is not a whole number", where,
                        "priorities are integers; smaller runs first") from None


class JobQueue:
    """Every trial's priority and the queued trials' positions, for one experiment, mirrored in its store."""

    def __init__(self, store: Store):
        self.store = store
        self._priority: Dict[str, int] = {}  # every trial's
        self._position: Dict[str, int] = {}  # queued trials'

    def track(self, trial_id: str, priority: int, position: Optional[int] = None) -> None:
        """A trial as the store already holds it: new (not queued) or restored (queued when it has a position)."""
        self._priority[trial_id] = priority
        if position is not None:
            self._position[trial_id] = position

    def priority(self, trial_id: str) -> int:
        return self._priority[trial_id]

    def __len__(self) -> int:
        return len(self._position)

    def __contains__(self, trial_id: str) -> bool:
        return trial_id in self._position

    def order(self) -> List[str]:
        """The queued trials, the next to start first."""
        return sorted(self._position, key=lambda t: sort_key(self._priority[t], self._position[t]))

    def head(self) -> Optional[str]:
        order = self.order()
        return order[0] if order else None

    def push(self, trial_id: str) -> None:
        """Queue a trial behind every queued one."""
        self._write({trial_id: self._back()})

    def remove(self, trial_id: str) -> None:
        del self._position[trial_id]
        self.store.set_places({trial_id: (self._priority[trial_id], None)})

    def apply(self, move: Move) -> None:
        """Carry out a checked move: a new priority for any trial, a new place for a queued one."""
        if move.priority is not None:
            self._priority[move.trial_id] = move.priority
            self.store.set_places({move.trial_id: (move.priority, self._position.get(move.trial_id))})
            return
        # Renumber the whole queue in its new order: positions stay small and distinct.
        order = [t for t in self.order() if t != move.trial_id]
        order.insert(order.index(move.other) + (1 if move.behind_of else 0), move.trial_id)
        self._priority[move.trial_id] = self._priority[move.other]
        self._write({t: i + 1 for i, t in enumerate(order)})

    def _back(self) -> int:
        return max(self._position.values(), default=0) + 1

    def _write(self, positions: Dict[str, int]) -> None:
        self.store.set_places({t: (self._priority[t], position) for t, position in positions.items()})
        self._position.update(positions)


# ---------------------------------------------------------------- the job list
# `trialkit job list`, from the store (no manager needed): Determined's states.
SCHEDULED = "SCHEDULED"  # started, or being started: it holds its slot
QUEUED = "QUEUED"  # waiting for a slot
PAUSED = LABELS[PREEMPTED]


def jobs(store: Store, experiment_id: str) -> List[Dict[str, Any]]:
    """An experiment's live trials in scheduling order: scheduled, then queued (next first), then paused."""
    config = store.experiment(experiment_id)["config"]
    needed = _slots(config)
    groups: Dict[str, List[Dict[str, Any]]] = {SCHEDULED: [], QUEUED: [], PAUSED: []}
    for trial in store.trials(experiment_id):  # by sequence
        status = job_status(trial)
        if status is not None:
            groups[SCHEDULED if status == RUNNING else status].append(trial)  # what holds its slots first
    groups[QUEUED].sort(key=lambda t: sort_key(t["priority"], t["position"], t["sequence"]))
    from trialkit.platforms.pools import user_of

    user = user_of(experiment_id)
    return [{"position": position, "id": trial["id"], "type": TRIAL_JOB, "experiment": experiment_id,
             "name": config.get("experimentName") or "", "priority": trial["priority"], "submitted": trial["created"],
             "slots_acquired": needed if state == SCHEDULED else 0, "slots_needed": needed,
             "status": job_status(trial), "user": user}
            for position, (state, trial) in enumerate((state, t) for state, rows in groups.items() for t in rows)]


def job_status(trial: Mapping[str, Any]) -> Optional[str]:
    """A trial's state as a job, from its store row (None: it ended, no job): the word `trial list` says for it
    (label: RUNNING, PAUSED) where there is one, so that the two never disagree; for one that waits,
    Determined's: QUEUED while it waits for slots (in the queue, or held by its platform), SCHEDULED while it
    is being started (it holds them; `trial list` says WAITING)."""
    if trial["status"] in (PREEMPTED, RUNNING):
        return label(trial["status"])
    if trial["status"] != WAITING:
        return None
    return QUEUED if _waits(trial) else SCHEDULED


TRIAL_JOB = "TYPE_TRIAL"  # a trial as a job of its experiment's queue (an experiment's job: TYPE_EXPERIMENT)


def _waits(trial: Mapping[str, Any]) -> bool:
    """Whether a live trial waits for its slots: in the experiment's queue (a position), or submitted and held by
    its platform until its resource pool has them (WAITING with the platform's reason, `on_waiting`)."""
    return trial["position"] is not None or (trial["status"] == WAITING and bool(trial["reason"]))


def _slots(config: Mapping[str, Any]) -> int:
    """Slots a trial holds, counted as the local platform counts them: slotsPerTrial, else its GPUs, else one."""
    return gpus.trial_slots(config.get("trainingService", {}).get("slotsPerTrial"), config.get("trialGpuNumber"))
