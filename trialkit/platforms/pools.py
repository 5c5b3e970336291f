"""Resource pools that every local experiment of one TRIALKIT_HOME shares, and the leases they give.

    pool = open_pool()                               # "default": $TRIALKIT_HOME/pools.yml, or the machine's
    pool.take("abcd1234-00003", "abcd1234", 2)       # True: its 2 slots are leased to it
    pool.hand_over("abcd1234-00003", keeper_pid)     # the trial's keeper holds them from now on
    pool.release("abcd1234-00003")                   # it ended

pools.yml names pools of slots, and the machine's GPUs (nvidia-smi's indices) a pool's trials may take:

    pools:
      default: {slots: 4}
      gpu: {gpus: [0, 1]}          # slots: 2 (one per GPU) unless given; `gpus: all` (the default): any GPU

(A pool may instead be a cluster's: `kubernetes: {namespace, slots}`, `ray: {address, slots}`, or Kueue's
LocalQueue, `kueue: {namespace, localQueue, priorityClass}`, whose quota Kueue holds: kubernetes/kueue.py.)

With no file (or no `default` in it) the default pool has no limit of slots: each experiment runs its
trialConcurrency trials at once, as NNI does, and a cap comes only from what is declared (a pool's slots,
the GPUs trialGpuNumber schedules).

A GPU trial's lease names its GPU indices and its share of each (1, or 1/maxTrialNumberPerGpu), and a
GPU's shares never sum past 1 across every pool and experiment of this home: two experiments never get
the same GPU, except as trials of experiments whose maxTrialNumberPerGpu shares it (two at 1/2 each).

The leases are rows of $TRIALKIT_HOME/pools.db (SQLite, WAL). Each grant is
one transaction that first drops the leases whose holder process is gone (a
pid with its start time: the control plane until the trial's keeper starts,
then the keeper, which outlives a control plane that crashed), then counts
what the others hold. So there is no daemon, and a pool never gives more
than it has across every experiment and process that uses this home.

Each experiment is a job of its pool (the jobs table: `join`), ordered by
the pool's scheduler (`scheduler:` in pools.yml):
  priority             Determined's priority scheduler (the default): smaller priority first (default 42),
                       then the earlier place (the time it was submitted, unless `job update --ahead-of` or
                       `--behind-of` moved it: its place then, its Submitted time kept);
  priority_descending  the Kubernetes scheduler's order: bigger priority first, then the earlier place;
  fair_share           Determined's fair share: the job holding the fewest slots for its weight (default 1)
                       first, so the pool's slots are divided among the jobs that want them in proportion
                       to their weights (3:1 on 4 slots: 3 and 1).
A trial's grant is refused while a live job ahead of its experiment waits for slots (`waiting`, set by
that job's refusal), so free slots go to the first job in that order that asks. Nothing running is
stopped for the order: a share is reached as trials end. `jobs()` is `trialkit job list --pool`;
`update` is `job update`'s and `job update-batch`'s (a job moved to another pool takes its next
trials' slots there; the leases its running trials hold stay until they end).
"""
from __future__ import annotations

import math
import os
import re
import sqlite3
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from trialkit import process, schema
from trialkit.errors import UserError
from trialkit.manager import disk, paths
from trialkit.manager.store import Store, StoreUnwritable
from trialkit.platforms import pool_events

CONFIG_NAME = "pools.yml"
DB_NAME = "pools.db"
DEFAULT = "default"
BUSY_SECONDS = 30.0  # how long a grant waits for another process's transaction
ROUNDING = 1e-9  # slots are counted in shares (three trials a GPU take a third each): their sums round

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    holder TEXT PRIMARY KEY,   -- a trial id
    pool TEXT NOT NULL,
    experiment TEXT NOT NULL,
    slots REAL NOT NULL,       -- a GPU trial sharing its GPUs takes a share of a slot
    pid INTEGER NOT NULL,      -- the process that holds it: while it runs, the lease stands
    ticks INTEGER NOT NULL,    -- its start time: a reused pid is not the holder
    granted REAL NOT NULL DEFAULT (julianday('now')),
    gpus TEXT NOT NULL DEFAULT '',     -- its GPU indices, "0,2"; '' none
    gpu_share REAL NOT NULL DEFAULT 0  -- what it takes of each of them (1/maxTrialNumberPerGpu)
);
CREATE TABLE IF NOT EXISTS jobs (
    experiment TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 42,  -- Determined's priority scheduler: smaller first
    submitted REAL NOT NULL,               -- unix time
    pid INTEGER NOT NULL,                  -- its control plane: a job whose control plane is gone waits for none
    ticks INTEGER NOT NULL,
    waiting REAL NOT NULL DEFAULT 0,       -- slots its next trial was refused; 0: none waits for slots
    queued REAL NOT NULL DEFAULT 0         -- slots all its waiting trials need (what `job list --pool` shows)
)
"""
DEFAULT_PRIORITY = 42
DEFAULT_WEIGHT = 1.0
PRIORITY, PRIORITY_DESCENDING, FAIR_SHARE = "priority", "priority_descending", "fair_share"
SCHEDULERS = (PRIORITY, PRIORITY_DESCENDING, FAIR_SHARE)
# Columns added after pools.db files were first written: (table, column, its declaration), added where missing.
_ADDED_COLUMNS = (("leases", "gpus", "TEXT NOT NULL DEFAULT ''"), ("leases", "gpu_share", "REAL NOT NULL DEFAULT 0"),
                  # 0: its trials are not paused for a job of higher priority (trainingService.preemptible)
                  ("jobs", "preemptible", "INTEGER NOT NULL DEFAULT 1"),
                  ("jobs", "weight", "REAL NOT NULL DEFAULT 1"),  # its fair share weight
                  ("jobs", "trial_slots", "REAL NOT NULL DEFAULT 0"),  # what each of its trials takes
                  ("jobs", "place", "REAL"))  # its place in the order among equal priorities; NULL: submitted
# A job's place among equal priorities: where a move put it, else its submission time.
_PLACE = "COALESCE(place, submitted)"


UNLIMITED = math.inf  # the slots of a pool pools.yml does not declare (the default one without the file)


class PoolSpec(NamedTuple):
    """A pool as pools.yml declares it: its slots (None: no limit, the undeclared default pool's) and the
    GPU indices its trials may take (None: any of the machine's)."""

    slots: Optional[int] = None
    gpus: Optional[Tuple[int, ...]] = None
    scheduler: str = PRIORITY  # one of SCHEDULERS: the order its jobs get free slots in
    namespace: Optional[str] = None  # a Kubernetes namespace's pool: its leases live there (kubernetes/pool_leases.py)
    ray_address: Optional[str] = None  # a Ray cluster's pool: its leases live there (ray/pool_ledger.py)
    # A namespace's pool that is Kueue's LocalQueue (kubernetes/kueue.py): no slots, no leases of trialkit's.
    local_queue: Optional[str] = None
    priority_class: Optional[str] = None  # its jobs' WorkloadPriorityClass; None: the ClusterQueue's default


def read_config(home: Path) -> Dict[str, PoolSpec]:
    """Pool name -> its spec, from pools.yml; every mistake one UserError naming the file."""
    path = home / CONFIG_NAME
    if not os.path.exists(path):  # a link to nothing too: no file, the machine's default pool
        return {}
    # The one reader of trialkit's YAML: a key or a pool given twice, a number longer than Python reads, a FIFO,
    # a file that is no text: each one line naming the file (and the line).
    data = schema.read_data_file(path, str(path)) or {}
    try:
        pools = schema.normalize_keys(data, ("pools",), "").get("pools") or {}
    except UserError as err:  # a key of the top level: named by the file alone ("pools.yml: unknown key 'pool'")
        raise UserError(err.what, str(path), err.fix) from None
    if not isinstance(pools, Mapping):
        raise UserError(f"pools in {path} is not a mapping", str(path), "write pools: {NAME: {slots: N}}")
    out = {}
    for name, section in pools.items():
        where = schema.path(f"{path}: pools", name)
        sec = schema.normalize_keys(section, ("slots", "gpus", "scheduler", KUEUE) + tuple(_CLUSTERS), where)
        if sec.get(KUEUE) is not None:
            out[str(name)] = _kueue_pool(sec, where)
            continue
        cluster = next((kind for kind in _CLUSTERS if sec.get(kind) is not None), None)
        if cluster is not None:
            out[str(name)] = _cluster_pool(sec, where, cluster)
            continue
        gpus = _gpu_list(sec.get("gpus"), schema.path(where, "gpus"))
        if sec.get("slots") is None and gpus is None:
            raise UserError(f"pool {name!r} has no slots", where, "give it slots: N, a whole number from 1, "
                            "or gpus: [0, 1], the indices of its GPUs, a slot each")
        slots = None if sec.get("slots") is None else schema.as_int(sec["slots"], schema.path(where, "slots"),
                                                                      minimum=1)
        scheduler = schema.as_choice(sec.get("scheduler") or PRIORITY, SCHEDULERS, schema.path(where, "scheduler"))
        out[str(name)] = PoolSpec(slots if slots is not None or gpus is None else len(gpus), gpus, scheduler)
    return out


# A cluster's pool: its key in pools.yml -> (the key that names the cluster, its PoolSpec field, its name in words)
_CLUSTERS = {"kubernetes": ("namespace", "namespace", "Kubernetes"), "ray": ("address", "ray_address", "Ray")}


def _cluster_pool(sec: Mapping[str, Any], where: str, kind: str) -> PoolSpec:
    """`kubernetes: {namespace: NS, slots: N}`: the Kubernetes experiments of namespace NS share N slots;
    `ray: {address: ADDRESS, slots: N}`: the Ray experiments of the cluster at ADDRESS (as they write it) do."""
    key, field, words = _CLUSTERS[kind]
    form = f"{kind}: {{{key}: {key.upper()}, slots: N}}"
    beside = [name for name in ("slots", "gpus", "scheduler") + tuple(_CLUSTERS)
              if name != kind and sec.get(name) is not None]
    if beside:
        raise UserError(f"{beside[0]} is set beside {kind}", schema.path(where, beside[0]),
                        f"a {words} pool's slots go inside it: {form}")
    inside = schema.path(where, kind)
    given = schema.normalize_keys(sec[kind], (key, "slots"), inside)
    missing = [name for name in (key, "slots") if given.get(name) is None]
    if missing:
        raise UserError(f"the {words} pool has no {missing[0]}", inside, f"write {form}")
    return PoolSpec(schema.as_int(given["slots"], schema.path(inside, "slots"), minimum=1),
                    **{field: schema.as_str(given[key], schema.path(inside, key))})


KUEUE = "kueue"


def _kueue_pool(sec: Mapping[str, Any], where: str) -> PoolSpec:
    """`kueue: {namespace: NS, localQueue: LQ, priorityClass: WPC}`: the Kubernetes experiments of namespace NS
    queue in Kueue's LocalQueue LQ (priorityClass, a WorkloadPriorityClass, optional); Kueue holds the slots."""
    form = "kueue: {namespace: NS, localQueue: LQ, priorityClass: WPC}"
    beside = [name for name in ("slots", "gpus", "scheduler") + tuple(_CLUSTERS) if sec.get(name) is not None]
    if beside:
        raise UserError(f"{beside[0]} is set beside kueue", schema.path(where, beside[0]),
                        f"Kueue's ClusterQueue holds the quota: write only {form}")
    inside = schema.path(where, KUEUE)
    given = schema.normalize_keys(sec[KUEUE], ("namespace", "localQueue", "priorityClass"), inside)
    missing = [name for name in ("namespace", "localQueue") if given.get(name) is None]
    if missing:
        raise UserError(f"the Kueue pool has no {missing[0]}", inside, f"write {form}")
    names = {key: _object_name(given[key], schema.path(inside, key)) for key in given if given[key] is not None}
    return PoolSpec(namespace=names["namespace"], local_queue=names["localQueue"],
                    priority_class=names.get("priorityClass"))


_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _object_name(value: Any, where: str) -> str:
    """A Kubernetes object's name (a namespace, a LocalQueue, a class), as the label values that carry it allow."""
    text = schema.as_str(value, where)
    if len(text) > 63 or not _OBJECT_NAME.match(text):
        raise UserError(f"{schema.show(text)} is not a Kubernetes name", where,
                        "use at most 63 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit")
    return text


def _gpu_list(value: Any, where: str) -> Optional[Tuple[int, ...]]:
    """`gpus:` of a pool: a list of nvidia-smi's indices, or `all` (None, as when left out)."""
    if value is None or value == "all":
        return None
    if not isinstance(value, list) or not value:
        raise UserError(f"cannot read gpus {schema.show(value)}", where,
                        "list the pool's GPUs by nvidia-smi's index, like [0, 1], or write all")
    indices = tuple(schema.as_int(item, where, minimum=0) for item in value)
    if len(set(indices)) != len(indices):
        raise UserError(f"GPU indices repeat: {schema.show(value)}", where, "list each GPU once")
    return indices


class Holder(NamedTuple):
    """A process, named for good by its pid and start time."""

    pid: int
    ticks: int

    @classmethod
    def of(cls, pid: int) -> "Holder":
        return cls(pid, process.start_ticks(pid))

    def alive(self) -> bool:
        return process.is_running(self.pid, self.ticks)


class GpuAsk(NamedTuple):
    """A GPU trial's ask: `count` GPUs, taking `share` of each (1/maxTrialNumberPerGpu), among `candidates`
    (the GPUs its experiment may use now: gpuIndices, none busy with processes not its own)."""

    count: int
    share: float
    candidates: Tuple[int, ...]


class Claim(NamedTuple):
    """A job of a pool whose control plane runs: what it holds and what its refused trials wait for."""

    experiment: str
    priority: int
    submitted: float
    holds: float  # slots its live trials hold
    waits: float  # slots its waiting trials need while the pool refuses them; 0: none waits
    preemptible: bool  # its trials give their slots back to a job of higher priority
    place: Optional[float] = None  # where a move put it among equal priorities; None: where it was submitted

    @property
    def order(self) -> float:
        """Its place among the jobs of its priority: earlier first."""
        return self.submitted if self.place is None else self.place


class Pool:
    """One named pool of this home: its size, the GPUs it may lease (None: any), and the lease table's view."""

    def __init__(self, name: str, slots: float, db_path: Path, gpus: Optional[Sequence[int]] = None,
                 scheduler: str = PRIORITY):
        self.name = name
        self.slots = slots  # UNLIMITED: none declared
        self.gpus = None if gpus is None else tuple(gpus)
        self.scheduler = scheduler
        self.db_path = db_path
        self._lock = threading.Lock()  # one connection, shared by the platform's threads
        try:
            db_path.parent.mkdir(parents=True, exist_ok=True)
            (db_path.parent / pool_events.DIR_NAME).mkdir(exist_ok=True)  # where its waiters are told of changes
            self._db = sqlite3.connect(str(db_path), timeout=BUSY_SECONDS, isolation_level=None,
                                       check_same_thread=False, factory=_Db)
            self._db.path = db_path
            self._db.execute("PRAGMA journal_mode=WAL")
            # Every lease names a live process: a commit lost with the machine (WAL + NORMAL loses none to a
            # process's crash, and is never corrupt) named processes that died with it. FULL's fsync cost each
            # grant, hand-over and release ~2 ms on the trial's way in and out. (update(), a user's change to
            # a job, keeps FULL on its own connection.)
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._add_columns()
        except FileExistsError as err:  # a mkdir above met a plain file (pools.events, say): pools.db is not at fault
            raise UserError("it is not a directory, as the resource pools need", str(err.filename),
                            "move it aside: the directory is made anew") from None
        except (OSError, sqlite3.DatabaseError) as err:
            raise _fault(db_path, err) from None

    def check(self, slots: float) -> None:
        """Refuse trials that this pool could never run."""
        if slots > self.slots + ROUNDING:
            raise UserError(f"each trial asks for {slots:g} slots but pool {self.name!r} has {self.slots}",
                            "slotsPerTrial", f"ask for {self.slots} or fewer, or give the pool more slots in "
                            f"{self.db_path.parent / CONFIG_NAME}")

    def join(self, experiment: str, priority: Optional[int] = None, preemptible: bool = True,
             weight: Optional[float] = None, trial_slots: float = 0) -> None:
        """This process (the experiment's control plane) submits the experiment's trials, of `trial_slots` each,
        to the pool from now on, at `priority` (default 42) or, in a fair share pool, `weight` (default 1); a job
        that joined before (a resumed experiment) keeps its priority, weight and place.
        `preemptible`: its running trials give their slots back to a job of higher priority that waits."""
        if priority is not None:
            _check_counts(self.scheduler, self.name, "priority", "trainingService.poolPriority")
        if weight is not None:
            _check_counts(self.scheduler, self.name, "weight", "trainingService.poolWeight")
        me = Holder.of(os.getpid())
        with self._lock:
            self._db.execute("INSERT INTO jobs (experiment, pool, priority, submitted, pid, ticks, preemptible, "
                             "weight, trial_slots) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                             "ON CONFLICT (experiment) DO UPDATE SET pool = excluded.pool, pid = excluded.pid, "
                             "ticks = excluded.ticks, waiting = 0, queued = 0, preemptible = excluded.preemptible, "
                             "trial_slots = excluded.trial_slots",
                             (experiment, self.name, DEFAULT_PRIORITY if priority is None else priority, time.time(),
                              me.pid, me.ticks, int(preemptible), DEFAULT_WEIGHT if weight is None else weight,
                              trial_slots))

    def take(self, holder: str, experiment: str, slots: float) -> bool:
        """Lease `slots` to `holder` (held by this process until `hand_over`) if the pool has them free now and
        no job ahead of `experiment` (smaller priority, or the same and submitted earlier) waits for slots."""
        return self.grant(holder, experiment, slots) is not None

    def grant(self, holder: str, experiment: str, slots: float, gpus: Optional[GpuAsk] = None
              ) -> Optional[Tuple[int, ...]]:
        """`take`, and with `gpus` the GPU indices leased with the slots (the least shared first) in the same
        transaction; None: refused (the slots, the GPUs or a job ahead), () granted without GPUs."""
        me = Holder.of(os.getpid())
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")  # one writer at a time across processes: count, then insert
            try:
                self._follow(experiment)
                self._drop_dead()
                chosen = () if gpus is None else self._choose(gpus, excluding=holder)
                if chosen is None or self._used(excluding=holder) + slots > self.slots + ROUNDING \
                        or self._waiting_ahead(experiment) is not None:
                    started = self._db.execute("UPDATE jobs SET waiting = ? WHERE experiment = ? AND waiting = 0",
                                               (slots, experiment)).rowcount
                    self._db.execute("UPDATE jobs SET waiting = ? WHERE experiment = ?", (slots, experiment))
                    self._db.execute("COMMIT")
                    if started:  # a job that starts to wait: those running behind it may owe it slots (preemption)
                        pool_events.tell(self.db_path.parent)
                    return None
                self._db.execute("INSERT OR REPLACE INTO leases (holder, pool, experiment, slots, pid, ticks, gpus, "
                                 "gpu_share) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                 (holder, self.name, experiment, slots, me.pid, me.ticks, _indices(chosen),
                                  gpus.share if gpus else 0))
                # What its waiting trials need shrinks with the lease, in the same transaction: a job below,
                # seeing the slots taken, must not see them still wanted too (it would preempt for nothing).
                self._db.execute("UPDATE jobs SET queued = MAX(queued - ?, 0), waiting = CASE WHEN queued - ? > ? "
                                 "THEN waiting ELSE 0 END WHERE experiment = ?", (slots, slots, ROUNDING, experiment))
                self._db.execute("COMMIT")
                return chosen
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def hold(self, holder: str, experiment: str, slots: float, pid: int, gpus: Sequence[int] = (),
             gpu_share: float = 0) -> None:
        """Count slots (and GPUs) a running trial already holds (its keeper outlived the control plane that
        started it)."""
        owner = Holder.of(pid)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO leases (holder, pool, experiment, slots, pid, ticks, gpus, "
                             "gpu_share) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             (holder, self.name, experiment, slots, owner.pid, owner.ticks, _indices(gpus),
                              gpu_share))

    def set_queued(self, experiment: str, slots: float) -> None:
        """The slots the experiment's waiting trials need now; 0: none waits any more (they started, or were
        stopped while they waited), so no job behind it waits for it."""
        with self._lock:
            stopped = self._db.execute("UPDATE jobs SET waiting = 0 WHERE experiment = ? AND waiting > 0 AND ? <= 0",
                                       (experiment, slots)).rowcount
            self._db.execute("UPDATE jobs SET queued = ? WHERE experiment = ?", (slots, experiment))
        if stopped:  # the jobs behind it wait for it no more
            pool_events.tell(self.db_path.parent)

    def hand_over(self, holder: str, pid: int) -> None:
        """The process `pid` holds the lease from now on (the trial's keeper: it outlives a crashed control plane)."""
        new = Holder.of(pid)
        with self._lock:
            self._db.execute("UPDATE leases SET pid = ?, ticks = ? WHERE holder = ?", (new.pid, new.ticks, holder))

    def leave(self, experiment: str) -> None:
        """The experiment's job leaves the pools for good (`experiment delete`): no resume keeps its priority,
        weight and place, and no row names an experiment that is gone."""
        with self._lock:
            self._db.execute("DELETE FROM jobs WHERE experiment = ?", (experiment,))

    def release(self, holder: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM leases WHERE holder = ?", (holder,))
        pool_events.tell(self.db_path.parent)

    def holders(self) -> List[Tuple[int, int]]:
        """(pid, start ticks) of the live processes that hold this pool's leases: one that ends without a
        release (SIGKILLed) frees its slots all the same (platforms/pool_events.py watches them)."""
        with self._lock:
            rows = self._db.execute("SELECT DISTINCT pid, ticks FROM leases WHERE pool = ?", (self.name,)).fetchall()
        return [(pid, ticks) for pid, ticks in rows if Holder(pid, ticks).alive()]

    def free(self) -> float:
        """Slots no live holder has, now."""
        with self._lock:
            rows = self._db.execute("SELECT slots, pid, ticks FROM leases WHERE pool = ?", (self.name,)).fetchall()
        return self.slots - sum(slots for slots, pid, ticks in rows if Holder(pid, ticks).alive())

    def could_take(self, experiment: str, slots: float) -> bool:
        """Whether `take` would grant `slots` to the experiment now (read only: a look before asking for more)."""
        with self._lock:
            self._follow(experiment)
        if self.free() + ROUNDING < slots:
            return False
        with self._lock:
            return self._waiting_ahead(experiment) is None

    def claims(self) -> List["Claim"]:
        """The pool's jobs whose control plane runs, as preemption weighs them (platforms/preempt.py)."""
        with self._lock:
            leases = self._db.execute("SELECT experiment, slots, pid, ticks FROM leases WHERE pool = ?",
                                      (self.name,)).fetchall()
            rows = self._db.execute("SELECT experiment, priority, submitted, pid, ticks, waiting, queued, preemptible, "
                                    "place FROM jobs WHERE pool = ?", (self.name,)).fetchall()
        held: Dict[str, float] = {}
        for experiment, slots, pid, ticks in leases:
            if Holder(pid, ticks).alive():
                held[experiment] = held.get(experiment, 0.0) + slots
        return [Claim(experiment, priority, submitted, held.get(experiment, 0.0), queued if waiting > 0 else 0.0,
                      bool(preemptible), place)
                for experiment, priority, submitted, pid, ticks, waiting, queued, preemptible, place in rows
                if Holder(pid, ticks).alive()]

    def waiting_reason(self, experiment: str, slots: float, gpus: Optional[GpuAsk] = None) -> str:
        """Why a refused trial of `experiment` waits: its GPUs when other trials of this home hold them, else the
        job ahead of it that waits (the pool's order gives that job the free slots first), else its slots."""
        if gpus is not None:
            with self._lock:
                free = self._free_gpus(gpus, excluding="")
            if len(free) < gpus.count:
                taken = [index for index in gpus.candidates if index not in free]
                return f"waiting for {gpus.count} GPU{'s' if gpus.count != 1 else ''}: GPU " \
                       f"{','.join(map(str, taken))} leased to other trials of this home ({len(free)} of " \
                       f"{len(gpus.candidates)} free)"
        with self._lock:
            ahead = self._waiting_ahead(experiment)
        free = "" if self.slots == UNLIMITED else f": {self.free():g} of {self.slots} slots free"
        if ahead is not None:
            job, priority = ahead
            return f"waiting behind experiment {job}, priority {priority}, in pool {self.name}{free}"
        if self.slots == UNLIMITED:  # refused only for a job ahead of it, which has just stopped waiting
            return f"waiting for a job ahead of it in pool {self.name}"
        return f"waiting for {slots:g} slot{'s' if slots != 1 else ''} of pool {self.name}: {self.free():g} of " \
               f"{self.slots} free"

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _choose(self, ask: GpuAsk, excluding: str) -> Optional[Tuple[int, ...]]:
        """The ask's GPUs, the least shared first; None when too few have its share free."""
        free = self._free_gpus(ask, excluding)
        if len(free) < ask.count:
            return None
        load = self._gpu_load(excluding)
        return tuple(sorted(sorted(free, key=lambda index: (load.get(index, 0.0), index))[:ask.count]))

    def _free_gpus(self, ask: GpuAsk, excluding: str) -> List[int]:
        load = self._gpu_load(excluding)
        return [index for index in ask.candidates if (self.gpus is None or index in self.gpus)
                and load.get(index, 0.0) + ask.share <= 1 + ROUNDING]

    def _gpu_load(self, excluding: str) -> Dict[int, float]:
        """GPU index -> the shares live leases hold of it, in every pool of this home (a GPU is the machine's)."""
        rows = self._db.execute("SELECT gpus, gpu_share, pid, ticks FROM leases WHERE gpus != '' AND holder != ?",
                                (excluding,)).fetchall()
        load: Dict[int, float] = {}
        for indices, share, pid, ticks in rows:
            if Holder(pid, ticks).alive():
                for index in indices.split(","):
                    load[int(index)] = load.get(int(index), 0.0) + share
        return load

    def _add_columns(self) -> None:
        """Bring a pools.db an older trialkit wrote up to this schema (one process at a time)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for table, column, declaration in _ADDED_COLUMNS:
                have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _used(self, excluding: str) -> float:
        (used,) = self._db.execute("SELECT COALESCE(SUM(slots), 0) FROM leases WHERE pool = ? AND holder != ?",
                                   (self.name, excluding)).fetchone()
        return used

    def _waiting_ahead(self, experiment: str) -> Optional[Tuple[str, int]]:
        """(experiment, priority) of the first live job ahead of `experiment` in its pool's order (the scheduler's)
        that waits for slots; None when none does."""
        rows = self._db.execute(f"SELECT experiment, priority, weight, {_PLACE}, pid, ticks, waiting FROM jobs "
                                "WHERE pool = ?", (self.name,)).fetchall()
        held = _acquired(self._db, self.name) if self.scheduler == FAIR_SHARE else {}
        mine = next((_order(self.scheduler, priority, weight, place, held.get(job, 0.0))
                     for job, priority, weight, place, *_ in rows if job == experiment),
                    _order(self.scheduler, DEFAULT_PRIORITY, DEFAULT_WEIGHT, float("inf"), held.get(experiment, 0.0)))
        ahead = sorted((_order(self.scheduler, priority, weight, place, held.get(job, 0.0)), job, priority)
                       for job, priority, weight, place, pid, ticks, waiting in rows
                       if job != experiment and waiting > 0 and Holder(pid, ticks).alive())
        return next(((job, priority) for order, job, priority in ahead if order < mine), None)

    def _follow(self, experiment: str) -> None:
        """Take the pool the experiment's job is in now (`job update --resource-pool` moved it), under the lock."""
        row = self._db.execute("SELECT pool FROM jobs WHERE experiment = ?", (experiment,)).fetchone()
        if row is None or row[0] == self.name:
            return
        spec = pool_spec(row[0], read_config(self.db_path.parent))
        self.name, self.slots, self.gpus, self.scheduler = row[0], spec.slots or UNLIMITED, spec.gpus, spec.scheduler

    def _drop_dead(self) -> None:
        rows = self._db.execute("SELECT holder, pid, ticks FROM leases WHERE pool = ?", (self.name,)).fetchall()
        dead = [(holder,) for holder, pid, ticks in rows if not Holder(pid, ticks).alive()]
        self._db.executemany("DELETE FROM leases WHERE holder = ?", dead)


def _order(scheduler: str, priority: int, weight: float, place: float, held: float) -> Tuple[float, float]:
    """A job's place in its pool's order (smaller first): by priority, bigger priority, or the slots it holds
    for its weight (fair share); then the earlier place (_PLACE)."""
    if scheduler == FAIR_SHARE:
        return held / weight, place
    return (-priority if scheduler == PRIORITY_DESCENDING else priority), place


def _check_counts(scheduler: str, pool: str, what: str, where: str) -> None:
    """Refuse what the pool's scheduler would not use: Determined's priority (and place) and fair share weight
    are never both active."""
    if what == "weight" and scheduler != FAIR_SHARE:
        raise UserError(f"pool {pool!r} schedules by {scheduler}: a job's weight counts only in a fair_share pool",
                        where, "set its priority instead, or give the pool scheduler: fair_share in pools.yml")
    if what != "weight" and scheduler == FAIR_SHARE:
        raise UserError(f"pool {pool!r} schedules by fair share: a job's "
                        f"{'priority' if what == 'priority' else 'place in the order'} counts for nothing there", where,
                        "set its weight instead with --weight, or give the pool another scheduler in pools.yml")


def _acquired(db: sqlite3.Connection, pool: str) -> Dict[str, float]:
    """Experiment -> the slots its live leases hold in the pool."""
    acquired: Dict[str, float] = {}
    for experiment, slots, pid, ticks in db.execute("SELECT experiment, slots, pid, ticks FROM leases WHERE pool = ?",
                                                    (pool,)):
        if Holder(pid, ticks).alive():
            acquired[experiment] = acquired.get(experiment, 0.0) + slots
    return acquired


QUEUED = "QUEUED"  # Determined's job states: waiting for slots
SCHEDULED = "SCHEDULED"  # holding slots, none waiting


def jobs(name: str = DEFAULT) -> List[Dict[str, Any]]:
    """The pool's jobs (experiments) in its scheduler's order: those whose control plane runs or whose trials
    hold slots, with their priority and weight, their slots acquired and needed (acquired + what their waiting
    trials need). A job moved to another pool (`job update --resource-pool`) is listed in both while its
    running trials hold leases here: here with what they hold, there with what waits."""
    scheduler = pool_spec(name, read_config(paths.home())).scheduler
    db_path = paths.home() / DB_NAME
    if not db_path.exists():
        return []
    try:
        with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=BUSY_SECONDS)) as db:
            acquired = _acquired(db, name)
            rows = [row for row in db.execute(
                f"SELECT experiment, priority, weight, {_PLACE}, submitted, pid, ticks, queued, pool FROM jobs")
                if row[8] == name or row[0] in acquired]
    except sqlite3.Error as err:
        raise _unreadable(db_path, err) from None
    rows.sort(key=lambda row: _order(scheduler, row[1], row[2], row[3], acquired.get(row[0], 0.0)))
    out = []
    for experiment, priority, weight, _, submitted, pid, ticks, queued, pool in rows:
        live = Holder(pid, ticks).alive()
        held = acquired.get(experiment, 0)
        if not live and not held:
            continue
        queued = queued if live and pool == name else 0  # its waiting trials wait in its own pool
        out.append({"position": len(out), "id": experiment, "type": EXPERIMENT_JOB, "experiment": experiment,
                    "name": experiment_name(experiment),
                    # a weight under 1e-6 as it is: rounded it would read 0, which no weight is
                    "priority": priority, "weight": _number(weight) if weight >= 1e-6 else weight,
                    "submitted": submitted,
                    "slots_acquired": _number(held), "slots_needed": _number(held + queued),
                    "status": QUEUED if queued > 0 else SCHEDULED, "user": user_of(experiment)})
    return out


class _Db(sqlite3.Connection):
    """pools.db as a control plane holds it open (`path` set after connecting). A lock that another process
    holds past BUSY_SECONDS (a long transaction, a copy being taken) is waited out, said once in one line;
    any other fault is the file's (a table dropped, a damaged file) or its disk's, as one UserError naming
    it: never a traceback in a running control plane. A statement inside our own transaction is not
    retried (the transaction holds the lock once it began)."""

    path: Path

    def execute(self, sql: str, parameters: Any = ()) -> sqlite3.Cursor:
        return self._waiting(super().execute, sql, parameters)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        return self._waiting(super().executemany, sql, rows)

    def executescript(self, script: str) -> sqlite3.Cursor:
        return self._waiting(lambda text, _: super(_Db, self).executescript(text), script, None)

    def _waiting(self, call: Callable[[str, Any], sqlite3.Cursor], sql: str, parameters: Any) -> sqlite3.Cursor:
        waited = 0.0
        while True:
            try:
                return call(sql, parameters)
            except sqlite3.OperationalError as err:
                if not _busy(err) or (self.in_transaction and not sql.lstrip().upper().startswith("BEGIN")):
                    raise _fault(self.path, err) from None
                waited += BUSY_SECONDS
                if waited == BUSY_SECONDS:
                    print(f"trialkit: {self.path} is held locked by another process past {BUSY_SECONDS:g} s; "
                          "waiting for it (a pool's grants and releases wait meanwhile)", file=sys.stderr,
                          flush=True)
            except sqlite3.DatabaseError as err:
                raise _fault(self.path, err) from None


def _busy(err: sqlite3.OperationalError) -> bool:
    """SQLite's BUSY: another connection holds the lock (the busy timeout has run out)."""
    code = getattr(err, "sqlite_errorcode", None)  # Python 3.11+
    return code & 0xFF == sqlite3.SQLITE_BUSY if code is not None else str(err) == "database is locked"


def _fault(db_path: Path, err: BaseException) -> UserError:
    """What an error of the lease table is: the home's disk refusing writes, or the file's own fault."""
    reason = disk.fault_reason(err)
    if reason is not None:
        return StoreUnwritable(db_path, reason)  # the home's disk, not a damaged lease table
    return _unreadable(db_path, err)


EXPERIMENT_JOB = "TYPE_EXPERIMENT"  # Determined's job type, as `det job list` prints it


def experiment_name(experiment: str) -> str:
    """Its experimentName (Determined's Job Name); "" when it has none, or no store of it is here to read."""
    try:
        with closing(Store(paths.experiment_dir(experiment) / paths.DB_NAME, read_only=True)) as store:
            row = store.experiment(experiment)
    except (UserError, sqlite3.Error):
        return ""
    return ((row or {}).get("config") or {}).get("experimentName") or ""


def user_of(experiment: str) -> str:
    """Who runs the experiment: the owner of its dir ("" when it has none here)."""
    import pwd

    try:
        uid = paths.experiment_dir(experiment).stat().st_uid
    except (UserError, OSError):
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no name (a container's)
        return str(uid)


def order_keys() -> Dict[str, Tuple[str, Tuple[float, float]]]:
    """Experiment -> (its pool, its key in that pool's order: smaller first), for every job of this home's pools:
    what sorts experiments as their pools will give them slots."""
    db_path = paths.home() / DB_NAME
    if not db_path.exists():
        return {}
    try:
        with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=BUSY_SECONDS)) as db:
            rows = db.execute(f"SELECT experiment, pool, priority, weight, {_PLACE} FROM jobs").fetchall()
            held = {pool: _acquired(db, pool) for pool in {row[1] for row in rows}}
    except sqlite3.Error as err:
        raise _unreadable(db_path, err) from None
    config = read_config(paths.home())
    return {experiment: (pool, _order(config[pool].scheduler if pool in config else PRIORITY, priority, weight,
                                      place, held[pool].get(experiment, 0.0)))
            for experiment, pool, priority, weight, place in rows}


def _unreadable(db_path: Path, err: Exception) -> UserError:
    """The lease table SQLite cannot open or read (damaged, a directory, a read-only home, locked past
    BUSY_SECONDS): one line naming it, not the CLI's line about an experiment's store."""
    return UserError(f"cannot use the resource pools' lease table: {err}", str(db_path),
                     "make $TRIALKIT_HOME writable; if the file is damaged, stop this home's experiments and move it "
                     "aside: a new one is made")


def _indices(gpus: Sequence[int]) -> str:
    return ",".join(str(index) for index in gpus)


def _number(slots: float) -> float:
    """Whole slots as ints (a GPU trial's share stays a fraction)."""
    return int(slots) if float(slots).is_integer() else round(slots, 6)


CHANGES = ("priority", "weight", "resource_pool", "ahead_of", "behind_of")
# update-batch's names (Determined's `det job update-batch ID.priority=1 ID.resource-pool=compute`) -> CHANGES
BATCH_NAMES = {what.replace("_", "-"): what for what in CHANGES}


def update(changes: Sequence[Tuple[str, str, Any]]) -> None:
    """Change experiments' jobs, in order and in one transaction (all or none): each (experiment, what, value)
    is ("priority", N), a new priority (smaller starts first), or ("ahead_of"/"behind_of", EXPERIMENT), a place
    just before/after another job of its pool, as Determined's `--ahead-of`/`--behind-of`: it takes the other's
    priority and a place next to the other's (its Submitted time stays), or ("top", None), the page's Move to Top: ahead of the
    pool's first job (none when it is first). Their next trials wait or pass by it. In a fair share pool, only
    ("weight", W), its share against the others' (W > 0). ("resource_pool", NAME) moves the job to another pool
    of this home: its next trials take their slots there."""
    db_path = paths.home() / DB_NAME
    if not db_path.exists():
        raise UserError(f"experiment {changes[0][0]} has no job in this home's resource pool", changes[0][0],
                        "only local experiments run with this TRIALKIT_HOME have one; see `trialkit experiment list`")
    config = read_config(paths.home())
    try:
        db = sqlite3.connect(str(db_path), timeout=BUSY_SECONDS, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as err:
        raise _unreadable(db_path, err) from None
    with closing(db):
        try:
            for experiment, what, value in changes:
                pool = _job(db, experiment, experiment)[0]
                if what != "resource_pool":
                    _check_counts(pool_spec(pool, config).scheduler, pool, what, what.replace("_", "-"))
                if what == "priority":
                    db.execute("UPDATE jobs SET priority = ? WHERE experiment = ?",
                               (schema.as_int(value, "priority"), experiment))  # SQLite's 64 bits
                elif what == "weight":
                    db.execute("UPDATE jobs SET weight = ? WHERE experiment = ?",
                               (schema.as_number(value, "weight", positive=True), experiment))
                elif what == "resource_pool":
                    _move_to(db, experiment, value, config)
                elif what == "top":
                    _to_top(db, experiment, pool_spec(pool, config).scheduler)
                else:
                    _place(db, experiment, value, ahead=what == "ahead_of")
            db.execute("COMMIT")
        except BaseException as err:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if isinstance(err, sqlite3.Error):  # a table dropped, the file damaged since it opened
                raise _unreadable(db_path, err) from None
            raise
    pool_events.tell(db_path.parent)  # the waiting control planes look at the new order


def _place(db: sqlite3.Connection, experiment: str, other: str, ahead: bool) -> None:
    where = "ahead-of" if ahead else "behind-of"
    if other == experiment:
        raise UserError(f"experiment {experiment} cannot move {where.replace('-', ' ')} itself", where,
                        "name another experiment of its pool: `trialkit job list --pool` lists them")
    pool, priority, at = _job(db, other, where)
    pid, ticks = db.execute("SELECT pid, ticks FROM jobs WHERE experiment = ?", (other,)).fetchone()
    if not Holder(pid, ticks).alive():
        raise UserError(f"experiment {other} is not running: its job has left the queue", where,
                        "name a running experiment of its pool: `trialkit job list --pool` lists them")
    if _job(db, experiment, experiment)[0] != pool:
        raise UserError(f"experiment {other} is in pool {pool}, not {experiment}'s", other,
                        "move a job among the jobs of its own pool")
    # Between the other and its neighbour on that side (of the same priority), so no third job is passed; the
    # job's Submitted time stays what it was.
    neighbour = db.execute(
        f"SELECT MAX({_PLACE}) FROM jobs WHERE pool = ? AND priority = ? AND {_PLACE} < ? AND experiment != ?"
        if ahead else
        f"SELECT MIN({_PLACE}) FROM jobs WHERE pool = ? AND priority = ? AND {_PLACE} > ? AND experiment != ?",
        (pool, priority, at, experiment)).fetchone()[0]
    if neighbour is None:
        neighbour = at - 1.0 if ahead else at + 1.0
    place = (at + neighbour) / 2
    if not min(at, neighbour) < place < max(at, neighbour):  # moved back and forth ~20 times
        raise UserError(f"no room is left between experiment {other} and the job {where.replace('-', ' ')} it at "
                        f"priority {priority}: the move would tie them", where,
                        f"give experiment {experiment} a priority of its own with --priority instead")
    db.execute("UPDATE jobs SET priority = ?, place = ? WHERE experiment = ?", (priority, place, experiment))


def _to_top(db: sqlite3.Connection, experiment: str, scheduler: str) -> None:
    """Ahead of the first job `jobs()` shows (a live control plane, or trials holding slots), at its priority."""
    pool = _job(db, experiment, experiment)[0]
    holding = _acquired(db, pool)
    rows = db.execute(f"SELECT experiment, priority, {_PLACE}, pid, ticks FROM jobs WHERE pool = ?",
                      (pool,)).fetchall()
    rows.sort(key=lambda row: _order(scheduler, row[1], DEFAULT_WEIGHT, row[2], 0.0))
    first = next((row for row in rows if row[0] in holding or Holder(row[3], row[4]).alive()), None)
    if first is not None and first[0] != experiment:
        db.execute("UPDATE jobs SET priority = ?, place = ? WHERE experiment = ?", (first[1], first[2] - 1.0, experiment))


def pool_of(experiment: str) -> Optional[str]:
    """The pool the experiment's job is in; None when it has none in this home (not a local experiment)."""
    db_path = paths.home() / DB_NAME
    if not db_path.exists():
        return None
    try:
        with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=BUSY_SECONDS)) as db:
            row = db.execute("SELECT pool FROM jobs WHERE experiment = ?", (experiment,)).fetchone()
    except sqlite3.Error as err:  # the page's pool route: a 400 naming the file, not a 500
        raise _unreadable(db_path, err) from None
    return row[0] if row else None


def _job(db: sqlite3.Connection, experiment: str, where: str) -> Any:
    row = db.execute(f"SELECT pool, priority, {_PLACE} FROM jobs WHERE experiment = ?",
                     (schema.as_str(experiment, where),)).fetchone()  # a lone surrogate: SQLite cannot take it
    if row is None:
        raise UserError(f"experiment {experiment} has no job in this home's resource pool", where,
                        "only local experiments run with this TRIALKIT_HOME have one; see `trialkit job list --pool`")
    return row


def _move_to(db: sqlite3.Connection, experiment: str, pool: str, config: Mapping[str, PoolSpec]) -> None:
    """The job into another pool: its next trials take their slots there (its control plane follows at its next
    grant); its running trials' leases stay in the pool they were granted in until they end."""
    spec = _local_spec(pool, config)
    slots = spec.slots or UNLIMITED
    (trial_slots,) = db.execute("SELECT trial_slots FROM jobs WHERE experiment = ?", (experiment,)).fetchone()
    if trial_slots > slots + ROUNDING:
        raise UserError(f"each trial of experiment {experiment} takes {trial_slots:g} slots but pool {pool!r} has "
                        f"{slots}", "resource-pool", "name a pool with as many slots, or give it more in pools.yml")
    db.execute("UPDATE jobs SET pool = ?, waiting = 0 WHERE experiment = ?", (pool, experiment))


def parse_change(text: str) -> Tuple[str, str, Any]:
    """One of `job update-batch`'s updates of an experiment's job, in Determined's syntax: ID.priority=N,
    ID.weight=W, ID.resource-pool=NAME, ID.ahead-of=ID2 or ID.behind-of=ID2."""
    target, _, value = text.partition("=")
    experiment, _, name = target.rpartition(".")
    if not experiment or name not in BATCH_NAMES or not value:
        raise UserError(f"cannot read {text!r}", "update-batch",
                        f"write ID.{'=..., ID.'.join(BATCH_NAMES)}=..., as `job update`'s options")
    what = BATCH_NAMES[name]
    if what in ("priority", "weight"):
        try:
            number: float = int(value) if what == "priority" else float(value)
        except ValueError:
            raise UserError(f"{value!r} is not a {'whole ' if what == 'priority' else ''}number", text,
                            f"write {target}=2") from None
        return experiment, what, (schema.as_int(number, text) if what == "priority"
                                  else schema.as_number(number, text, positive=True))
    return experiment, what, value


def pool_spec(name: str, config: Mapping[str, PoolSpec]) -> PoolSpec:
    """The named pool of pools.yml (`default` is there without being named, with no limit of slots)."""
    if name not in config and name != DEFAULT:
        raise UserError(f"there is no resource pool {name!r}", str(paths.home() / CONFIG_NAME),
                        f"name one of {sorted(set(config) | {DEFAULT})}, or add it under pools:")
    return config.get(name) or PoolSpec()


def declared_for(matches: Callable[[PoolSpec], bool], what: str) -> Optional[Tuple[str, PoolSpec]]:
    """(name, spec) of the one pool pools.yml declares for `what` (a namespace, a Ray cluster: the specs that
    `matches`); None when none does. Two pools for one place are one UserError naming the file."""
    home = paths.home()
    named = [(name, spec) for name, spec in read_config(home).items() if matches(spec)]
    if len(named) > 1:
        raise UserError(f"pools {', '.join(name for name, _ in named)} all name {what}", str(home / CONFIG_NAME),
                        f"declare one pool for {what}")
    return named[0] if named else None


def open_pool(name: str = DEFAULT) -> Pool:
    """The named pool of this TRIALKIT_HOME; only `default` exists without a pools.yml that names it."""
    home = paths.home()
    spec = _local_spec(name, read_config(home))
    return Pool(name, spec.slots or UNLIMITED, home / DB_NAME, spec.gpus, spec.scheduler)


def _local_spec(name: str, config: Mapping[str, PoolSpec]) -> PoolSpec:
    """pool_spec, refusing a cluster's pool: a local experiment's trials (and its job, moved) take this machine's
    slots only."""
    spec = pool_spec(name, config)
    if spec.namespace is not None or spec.ray_address is not None:
        cluster = f"Kubernetes namespace {spec.namespace}" if spec.namespace else f"the Ray cluster at {spec.ray_address}"
        raise UserError(f"resource pool {name!r} is {cluster}'s", str(paths.home() / CONFIG_NAME),
                        "name a pool of this machine's slots; an experiment on that cluster takes its slots "
                        "without naming it")
    return spec
