"""Resource pools that every local experiment of one TRIALKIT_HOME shares, and the leases they give.

    pool = open_pool()                               # "default": $TRIALKIT_HOME/pools.yml, or the machine's
    pool.take("abcd1234-00003", "abcd1234", 2)       # True: its 2 slots are leased to it
    pool.hand_over("abcd1234-00003", keeper_pid)     # the trial's keeper holds them from now on
    pool.release("abcd1234-00003")                   # it ended

pools.yml names pools of slots:

    pools:
      default: {slots: 4}

With no file (or no `default` in it) the default pool has one slot per CPU
this process may run on, or per GPU when the machine has more GPUs than CPUs.

The leases are rows of $TRIALKIT_HOME/pools.db (SQLite, WAL). Each grant is
one transaction that first drops the leases whose holder process is gone (a
pid with its start time: the control plane until the trial's keeper starts,
then the keeper, which outlives a control plane that crashed), then counts
what the others hold. So there is no daemon, and a pool never gives more
than it has across every experiment and process that uses this home.

Each experiment is a job of its pool (the jobs table: `join`), ordered by
Determined's priority scheduler: smaller priority first (default 42), then
the earlier submitted. A trial's grant is refused while a live job ahead of
its experiment waits for slots (`waiting`, set by that job's refusal), so
free slots go to the first job in that order that asks. `jobs()` is
`trialkit job list --pool`; `update` is `job update`'s and `job update-batch`'s.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trialkit import process, schema
from trialkit.errors import UserError
from trialkit.manager import disk, paths
from trialkit.manager.store import StoreUnwritable

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
    granted REAL NOT NULL DEFAULT (julianday('now'))
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


def machine_slots() -> int:
    """The default pool's size: the CPUs this process may use, or the GPUs when there are more of them."""
    from trialkit import gpus

    try:
        gpu_count = len(gpus.inventory())
    except UserError:
        gpu_count = 0
    return max(len(os.sched_getaffinity(0)), gpu_count)


def read_config(home: Path) -> Dict[str, int]:
    """Pool name -> slots, from pools.yml; every mistake one UserError naming the file."""
    path = home / CONFIG_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise UserError(f"cannot read {path}: {str(err).splitlines()[0]}", str(path), "write it as YAML") from None
    pools = schema.normalize_keys(data, ("pools",), str(path)).get("pools") or {}
    if not isinstance(pools, Mapping):
        raise UserError(f"pools in {path} is not a mapping", str(path), "write pools: {NAME: {slots: N}}")
    out = {}
    for name, section in pools.items():
        where = schema.path(f"{path}: pools", name)
        sec = schema.normalize_keys(section, ("slots",), where)
        if sec.get("slots") is None:
            raise UserError(f"pool {name!r} has no slots", where, "give it slots: N (a whole number, 1 or more)")
        out[str(name)] = schema.as_int(sec["slots"], schema.path(where, "slots"), minimum=1)
    return out


@dataclass(frozen=True)
class Holder:
    """A process, named for good by its pid and start time."""

    pid: int
    ticks: int

    @classmethod
    def of(cls, pid: int) -> "Holder":
        return cls(pid, process.start_ticks(pid))

    def alive(self) -> bool:
        return process.is_running(self.pid, self.ticks)


class Pool:
    """One named pool of this home: its size and the lease table's view of it."""

    def __init__(self, name: str, slots: int, db_path: Path):
        self.name = name
        self.slots = slots
        self.db_path = db_path
        self._lock = threading.Lock()  # one connection, shared by the platform's threads
        try:
            db_path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(db_path), timeout=BUSY_SECONDS, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.OperationalError) as err:
            reason = disk.fault_reason(err)
            if reason is None:
                raise
            raise StoreUnwritable(db_path, reason) from None  # the home's disk, not a damaged lease table

    def check(self, slots: float) -> None:
        """Refuse trials that this pool could never run."""
        if slots > self.slots + ROUNDING:
            raise UserError(f"each trial asks for {slots:g} slots but pool {self.name!r} has {self.slots}",
                            "slotsPerTrial", f"ask for {self.slots} or fewer, or give the pool more slots in "
                            f"{self.db_path.parent / CONFIG_NAME}")

    def join(self, experiment: str, priority: Optional[int] = None) -> None:
        """This process (the experiment's control plane) submits the experiment's trials to the pool from now on,
        at `priority` (default 42); a job that joined before (a resumed experiment) keeps its priority and place."""
        me = Holder.of(os.getpid())
        with self._lock:
            self._db.execute("INSERT INTO jobs (experiment, pool, priority, submitted, pid, ticks) "
                             "VALUES (?, ?, ?, ?, ?, ?) "
                             "ON CONFLICT (experiment) DO UPDATE SET pool = excluded.pool, pid = excluded.pid, "
                             "ticks = excluded.ticks, waiting = 0, queued = 0",
                             (experiment, self.name, DEFAULT_PRIORITY if priority is None else priority, time.time(),
                              me.pid, me.ticks))

    def take(self, holder: str, experiment: str, slots: float) -> bool:
        """Lease `slots` to `holder` (held by this process until `hand_over`) if the pool has them free now and
        no job ahead of `experiment` (smaller priority, or the same and submitted earlier) waits for slots."""
        me = Holder.of(os.getpid())
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")  # one writer at a time across processes: count, then insert
            try:
                self._drop_dead()
                if self._used(excluding=holder) + slots > self.slots + ROUNDING or self._waits_behind(experiment):
                    self._db.execute("UPDATE jobs SET waiting = ? WHERE experiment = ?", (slots, experiment))
                    self._db.execute("COMMIT")
                    return False
                self._db.execute("INSERT OR REPLACE INTO leases (holder, pool, experiment, slots, pid, ticks) "
                                 "VALUES (?, ?, ?, ?, ?, ?)", (holder, self.name, experiment, slots, me.pid, me.ticks))
                self._db.execute("COMMIT")
                return True
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def hold(self, holder: str, experiment: str, slots: float, pid: int) -> None:
        """Count slots a running trial already holds (its keeper outlived the control plane that started it)."""
        owner = Holder.of(pid)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO leases (holder, pool, experiment, slots, pid, ticks) "
                             "VALUES (?, ?, ?, ?, ?, ?)",
                             (holder, self.name, experiment, slots, owner.pid, owner.ticks))

    def set_queued(self, experiment: str, slots: float) -> None:
        """The slots the experiment's waiting trials need now; 0: none waits any more (they started, or were
        stopped while they waited), so no job behind it waits for it."""
        with self._lock:
            self._db.execute("UPDATE jobs SET queued = ?, waiting = CASE WHEN ? > 0 THEN waiting ELSE 0 END "
                             "WHERE experiment = ?", (slots, slots, experiment))

    def hand_over(self, holder: str, pid: int) -> None:
        """The process `pid` holds the lease from now on (the trial's keeper: it outlives a crashed control plane)."""
        new = Holder.of(pid)
        with self._lock:
            self._db.execute("UPDATE leases SET pid = ?, ticks = ? WHERE holder = ?", (new.pid, new.ticks, holder))

    def release(self, holder: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM leases WHERE holder = ?", (holder,))

    def free(self) -> float:
        """Slots no live holder has, now."""
        with self._lock:
            rows = self._db.execute("SELECT slots, pid, ticks FROM leases WHERE pool = ?", (self.name,)).fetchall()
        return self.slots - sum(slots for slots, pid, ticks in rows if Holder(pid, ticks).alive())

    def could_take(self, experiment: str, slots: float) -> bool:
        """Whether `take` would grant `slots` to the experiment now (read only: a look before asking for more)."""
        if self.free() + ROUNDING < slots:
            return False
        with self._lock:
            return not self._waits_behind(experiment)

    def waiting_reason(self, slots: float) -> str:
        return f"waiting for {slots:g} slot{'s' if slots != 1 else ''} of pool {self.name}: {self.free():g} of " \
               f"{self.slots} free"

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _used(self, excluding: str) -> float:
        (used,) = self._db.execute("SELECT COALESCE(SUM(slots), 0) FROM leases WHERE pool = ? AND holder != ?",
                                   (self.name, excluding)).fetchone()
        return used

    def _waits_behind(self, experiment: str) -> bool:
        """Whether a live job ahead of `experiment` in the priority scheduler's order waits for slots."""
        mine = self._db.execute("SELECT priority, submitted FROM jobs WHERE experiment = ?", (experiment,)).fetchone()
        priority, submitted = mine or (DEFAULT_PRIORITY, float("inf"))
        ahead = self._db.execute("SELECT pid, ticks FROM jobs WHERE pool = ? AND experiment != ? AND waiting > 0 "
                                 "AND (priority < ? OR (priority = ? AND submitted < ?))",
                                 (self.name, experiment, priority, priority, submitted)).fetchall()
        return any(Holder(pid, ticks).alive() for pid, ticks in ahead)

    def _drop_dead(self) -> None:
        rows = self._db.execute("SELECT holder, pid, ticks FROM leases WHERE pool = ?", (self.name,)).fetchall()
        dead = [(holder,) for holder, pid, ticks in rows if not Holder(pid, ticks).alive()]
        self._db.executemany("DELETE FROM leases WHERE holder = ?", dead)


QUEUED = "QUEUED"  # Determined's job states: waiting for slots
SCHEDULED = "SCHEDULED"  # holding slots, none waiting


def jobs(name: str = DEFAULT) -> List[Dict[str, Any]]:
    """The pool's jobs (experiments) in the priority scheduler's order: those whose control plane runs or whose
    trials hold slots, with their slots acquired and needed (acquired + what their waiting trials need)."""
    db_path = paths.home() / DB_NAME
    if not db_path.exists():
        return []
    with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=BUSY_SECONDS)) as db:
        leases = db.execute("SELECT experiment, slots, pid, ticks FROM leases WHERE pool = ?", (name,)).fetchall()
        rows = db.execute("SELECT experiment, priority, submitted, pid, ticks, queued FROM jobs WHERE pool = ? "
                          "ORDER BY priority, submitted", (name,)).fetchall()
    acquired: Dict[str, float] = {}
    for experiment, slots, pid, ticks in leases:
        if Holder(pid, ticks).alive():
            acquired[experiment] = acquired.get(experiment, 0) + slots
    out = []
    for experiment, priority, submitted, pid, ticks, queued in rows:
        live = Holder(pid, ticks).alive()
        held = acquired.get(experiment, 0)
        if not live and not held:
            continue
        queued = queued if live else 0
        out.append({"position": len(out), "id": experiment, "experiment": experiment, "name": name,
                    "priority": priority, "submitted": submitted, "slots_acquired": _number(held),
                    "slots_needed": _number(held + queued), "status": QUEUED if queued > 0 else SCHEDULED})
    return out


def _number(slots: float) -> float:
    """Whole slots as ints (a GPU trial's share stays a fraction)."""
    return int(slots) if float(slots).is_integer() else round(slots, 6)


CHANGES = ("priority", "ahead_of", "behind_of")


def update(changes: Sequence[Tuple[str, str, Any]]) -> None:
    """Change experiments' jobs, in order and in one transaction (all or none): each (experiment, what, value)
    is ("priority", N), a new priority (smaller starts first), or ("ahead_of"/"behind_of", EXPERIMENT), a place
    just before/after another job of its pool, as Determined's `--ahead-of`/`--behind-of`: it takes the other's
    priority and a submission time next to the other's. Their next trials wait or pass by it."""
    db_path = paths.home() / DB_NAME
    if not db_path.exists():
        raise UserError(f"experiment {changes[0][0]} has no job in this home's resource pool", changes[0][0],
                        "only local experiments run with this TRIALKIT_HOME have one; see `trialkit experiment list`")
    with closing(sqlite3.connect(str(db_path), timeout=BUSY_SECONDS, isolation_level=None)) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            for experiment, what, value in changes:
                _job(db, experiment, experiment)
                if what == "priority":
                    db.execute("UPDATE jobs SET priority = ? WHERE experiment = ?", (value, experiment))
                else:
                    _place(db, experiment, value, ahead=what == "ahead_of")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


def _place(db: sqlite3.Connection, experiment: str, other: str, ahead: bool) -> None:
    where = "ahead-of" if ahead else "behind-of"
    if other == experiment:
        raise UserError(f"experiment {experiment} cannot move {where.replace('-', ' ')} itself", where,
                        "name another experiment of its pool (`trialkit job list --pool`)")
    pool, priority, submitted = _job(db, other, where)
    pid, ticks = db.execute("SELECT pid, ticks FROM jobs WHERE experiment = ?", (other,)).fetchone()
    if not Holder(pid, ticks).alive():
        raise UserError(f"experiment {other} is not running: its job has left the queue", where,
                        "name a running experiment of its pool (`trialkit job list --pool`)")
    if _job(db, experiment, experiment)[0] != pool:
        raise UserError(f"experiment {other} is in pool {pool}, not {experiment}'s", other,
                        "move a job among the jobs of its own pool")
    # Between the other and its neighbour on that side (of the same priority), so no third job is passed.
    neighbour = db.execute(
        "SELECT MAX(submitted) FROM jobs WHERE pool = ? AND priority = ? AND submitted < ? AND experiment != ?"
        if ahead else
        "SELECT MIN(submitted) FROM jobs WHERE pool = ? AND priority = ? AND submitted > ? AND experiment != ?",
        (pool, priority, submitted, experiment)).fetchone()[0]
    if neighbour is None:
        neighbour = submitted - 1.0 if ahead else submitted + 1.0
    db.execute("UPDATE jobs SET priority = ?, submitted = ? WHERE experiment = ?",
               (priority, (submitted + neighbour) / 2, experiment))


def _job(db: sqlite3.Connection, experiment: str, where: str) -> Any:
    row = db.execute("SELECT pool, priority, submitted FROM jobs WHERE experiment = ?", (experiment,)).fetchone()
    if row is None:
        raise UserError(f"experiment {experiment} has no job in this home's resource pool", where,
                        "only local experiments run with this TRIALKIT_HOME have one; see `trialkit job list --pool`")
    return row


def open_pool(name: str = DEFAULT) -> Pool:
    """The named pool of this TRIALKIT_HOME; only `default` exists without a pools.yml that names it."""
    home = paths.home()
    config = read_config(home)
    if name not in config and name != DEFAULT:
        raise UserError(f"there is no resource pool {name!r}", str(home / CONFIG_NAME),
                        f"name one of {sorted(config) or [DEFAULT]}, or add it under pools:")
    return Pool(name, config.get(name) or machine_slots(), home / DB_NAME)
