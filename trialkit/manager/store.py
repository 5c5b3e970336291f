"""The experiment's store: one SQLite database per experiment dir, the manager its only writer.

    store = Store.in_dir(experiment_dir)            # <dir>/trialkit.db, WAL mode
    store.create_experiment("exp1", config={...})
    token = new_token()
    store.add_trial("exp1", "trial-1", sequence=0, parameters={"lr": 0.1}, token=token)
    ...  # the platform starts the trial with TRIALKIT_TOKEN=token
    new = store.add_records("trial-1", batch)       # newly stored records (len = inserted count)
    new, refused = store.add_batch("trial-1", batch, rejected, spool=spool_id)  # the manager's route
    store.acked_seq("trial-1", spool_id)            # the spool's highest seq up to which all are stored
    store.records_for("trial-1", type="PERIODICAL") # [{seq, type, sequence, value, time, ...}]
    store.set_status("trial-1", "EARLY_STOPPED", reason="assessor")
    store.trials("exp1", status="RUNNING")

Tables:
- experiments(id, config JSON, status, created, updated, reason): reason says why
  it ended, in the words the run's end printed (its error, what stopped it).
- trials(id, experiment, sequence, parameter_id, parameters JSON, status,
  exit_code, reason, token_hash, restart_count, priority, trial_dir,
  stdout_path, stderr_path, created, started, ended, updated, acked_seq,
  position): position is the trial's place in the job queue, NULL when it is
  not queued (trialkit.control.queue).
- records(trial, seq, type, sequence, parameter_id, value JSON, time,
  received, source, reason, run), unique on (trial, seq): a batch sent twice is
  stored once. A keeper's seq is its spool's (see spools); stored, it is
  the spool's base plus that seq, so the trial's records read in the order
  of its spools, each spool's in its own order. NaN and infinities are kept (as JSON's NaN/Infinity, which
  json.loads reads); so is any number JSON allows (records.loads). A record
  the manager refused is kept as type REJECTED, its value the whole record
  as sent and `reason` why: it counts for the ack (the keeper moves on) and
  shows in the export, but no reader takes it for a metric. `run` is the
  trial's run (restart count) the record was reported in; NULL in records
  from before runs were counted, which read as run 0.
- statuses(trial, status, exit_code, reason, time, source): every change.
- spools(trial, id, base, acked): each spool that delivered records of the
  trial, by the id its batches name (records.split_batch), with the base its
  seqs are stored above and its ack (as stored: base + the spool's seq). A
  trial's first spool gets base 0, so that a trial run once stores seqs 1..N;
  each later one the next multiple of records.SPOOL_SEQS above every seq the
  trial holds. Batches that name no spool (keepers from before spools had
  ids; the control plane's own add_records) are one spool of base 0 whose ack
  is trials.acked_seq.

Tokens are stored as SHA-256 hashes; `trial_for_token` finds a trial by its
token, until the control plane records the trial's end (`set_status` to a
final status, source "control"), which revokes it. STATUS records a keeper sends (`add_records`) update the trial's
status, exit code, restart count and times like `set_status`, with source
"keeper". Each method is one transaction; an RLock makes the one connection
safe to share between the manager's threads. Readers in other processes
(the CLI) may open the same file: WAL lets them read while the manager writes.
"""
from __future__ import annotations

import functools
import json
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
from itertools import chain, groupby
from pathlib import Path
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from trialkit import records
from trialkit.errors import UserError
from trialkit.statuses import FINAL_STATUSES, RUNNING, WAITING, is_grace_killed

DB_NAME = "trialkit.db"
CACHE_KIB = 64 << 10  # the writer's page cache, at most (SQLite takes it as pages are used)
CHECKPOINT_PAGES = 10_000  # WAL pages (40 MB) between automatic checkpoints; SQLite's default is 1,000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS experiments (
    id TEXT PRIMARY KEY,
    config TEXT,
    status TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS trials (
    id TEXT PRIMARY KEY,
    experiment TEXT NOT NULL REFERENCES experiments(id),
    sequence INTEGER NOT NULL,
    parameter_id INTEGER,
    parameters TEXT NOT NULL,
    status TEXT NOT NULL,
    exit_code INTEGER,
    reason TEXT,
    token_hash TEXT UNIQUE,
    restart_count INTEGER NOT NULL DEFAULT 0,
    priority INTEGER NOT NULL DEFAULT 0,
    trial_dir TEXT,
    stdout_path TEXT,
    stderr_path TEXT,
    created REAL NOT NULL,
    started REAL,
    ended REAL,
    updated REAL NOT NULL,
    acked_seq INTEGER NOT NULL DEFAULT 0,
    position INTEGER
);
CREATE INDEX IF NOT EXISTS trials_by_experiment ON trials(experiment, sequence);
CREATE TABLE IF NOT EXISTS records (
    trial TEXT NOT NULL REFERENCES trials(id),
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    sequence INTEGER,
    parameter_id,
    value TEXT NOT NULL,
    time REAL,
    received REAL NOT NULL,
    source TEXT,
    reason TEXT,
    run INTEGER,
    PRIMARY KEY (trial, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS statuses (
    id INTEGER PRIMARY KEY,
    trial TEXT NOT NULL REFERENCES trials(id),
    status TEXT NOT NULL,
    exit_code INTEGER,
    reason TEXT,
    time REAL NOT NULL,
    source TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS statuses_by_trial ON statuses(trial, id);
CREATE TABLE IF NOT EXISTS spools (
    trial TEXT NOT NULL REFERENCES trials(id),
    id TEXT NOT NULL,
    base INTEGER NOT NULL,
    acked INTEGER NOT NULL,
    PRIMARY KEY (trial, id)
) WITHOUT ROWID;
"""

# Columns added after a store's first version: (table, column, type), added where missing.
_ADDED_COLUMNS = (("trials", "position", "INTEGER"), ("records", "reason", "TEXT"), ("records", "run", "INTEGER"),
                  ("experiments", "reason", "TEXT"))

_TRIAL_JSON = ("parameters",)

_ENDS = "(" + ", ".join(f"'{status}'" for status in sorted(FINAL_STATUSES)) + ")"
# A trial's duration, as every face shows it (`trial list/show`, the export, the page): the time its runs ran,
# summed, so the time its experiment stood stopped between a pause and a resume counts not. A run is the
# statuses between two ends (its first RUNNING to its end); the rows are numbered by the ends before them. A
# run with no end in the store is counted to its bound, from `?`, JSON made by control/results.run_bounds:
# {"now": T, "trials": {id: T}}, the trial's own bound where the store no longer hears of its end (its
# experiment's manager is gone), else now. SQL, so that the page sorts 10,000 trials by it in SQLite; NULL
# for a trial that never ran. Reads the trial as `t`.
# (The bound is read only for a run with no end: read for every run, it cost the page's sort by duration 13%.)
RAN = ("(SELECT SUM(MAX(0.0, COALESCE(ended, (SELECT COALESCE(json_extract(bound, '$.trials.' || json_quote(t.id)), "
       "json_extract(bound, '$.now')) FROM (SELECT ? AS bound))) - began)) FROM ("
       f"SELECT MIN(CASE WHEN status = '{RUNNING}' THEN time END) AS began, "
       f"MAX(CASE WHEN status IN {_ENDS} THEN time END) AS ended FROM ("
       f"SELECT status, time, COUNT(CASE WHEN status IN {_ENDS} THEN 1 END) "
       "OVER (ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS ends "
       "FROM statuses WHERE trial = t.id) GROUP BY ends) WHERE began IS NOT NULL)")
# The trials whose latest run began and has no end in the store: (id, trial dir, when that run began, when the
# store last heard of the trial: its last status or record). What run_bounds needs of a store.
_OPEN_RUNS = (
    "SELECT t.id, t.trial_dir, "
    f"(SELECT MIN(time) FROM statuses s WHERE s.trial = t.id AND s.status = '{RUNNING}' AND s.id > "
    f"COALESCE((SELECT MAX(id) FROM statuses e WHERE e.trial = t.id AND e.status IN {_ENDS}), 0)) AS began, "
    "MAX(COALESCE((SELECT MAX(time) FROM statuses s WHERE s.trial = t.id), 0), "
    "COALESCE((SELECT MAX(received) FROM records r WHERE r.trial = t.id), 0)) AS heard "
    "FROM trials t WHERE t.experiment = ? AND t.ended IS NULL AND t.started IS NOT NULL")
OpenRun = Tuple[str, Optional[str], float, float]


def open_runs(db: sqlite3.Connection, experiment_id: str) -> List[OpenRun]:
    """(trial id, trial dir, when its run began, when the store last heard of it) of each trial whose latest run
    began and has no end in the store."""
    return [tuple(row) for row in db.execute(_OPEN_RUNS, (experiment_id,)) if row[2] is not None]


def new_token() -> str:
    """A per-trial secret for TRIALKIT_TOKEN."""
    import secrets  # here, not at the top: the store's readers (`trialkit trial list`) start without it

    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    import hashlib  # here, not at the top: the store's readers (`trialkit trial list`) start without it

    return hashlib.sha256(token.encode()).hexdigest()


class StoreUnwritable(UserError):
    """The store's disk takes no writes (full, read-only, no permission): the store itself may be intact."""

    def __init__(self, path: Path, reason: str):
        self.reason = reason
        super().__init__(f"cannot open the store {path} for writing: {reason}", "the experiment's disk",
                         "free space on that disk or make it writable, then run the command again")


def _refuse_odd_files(path: Path) -> None:
    """SQLite opens the store and its journals whatever they are: a FIFO would block it for ever, a device
    never end a read. What is there must be a regular file (a link to one is)."""
    for name in (path.name, path.name + "-wal", path.name + "-shm", path.name + "-journal"):
        try:
            mode = os.stat(path.with_name(name)).st_mode
        except OSError:
            continue  # none yet (SQLite makes it), or unreadable: SQLite says so in its own words
        if not stat.S_ISREG(mode):
            raise sqlite3.DatabaseError(f"{path.with_name(name)} is not a regular file")


def _open_read_only(path: Path) -> sqlite3.Connection:
    """A connection that writes nothing: mode=ro; where even WAL's shared-memory file cannot be made (a read-only
    or full disk, on which no writer can commit either), as an immutable file."""
    uri = "file:" + urllib.parse.quote(str(path.absolute())) + "?mode=ro"
    try:
        return _connect_read_only(uri)
    except sqlite3.OperationalError:
        return _connect_read_only(uri + "&immutable=1")


def _connect_read_only(uri: str) -> sqlite3.Connection:
    db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    try:
        db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # opening is lazy: read once here
    except sqlite3.DatabaseError:
        db.close()
        raise
    db.row_factory = sqlite3.Row
    return db


class Store:
    def __init__(self, path: Path, read_only: bool = False):
        """Open (and make, unless read_only) the store. A disk that takes no writes (full, read-only) is
        StoreUnwritable, not a traceback; a file that is no intact store stays sqlite3.DatabaseError."""
        self.path = Path(path)
        self._lock = threading.RLock()
        _refuse_odd_files(self.path)
        if read_only:
            self._db = _open_read_only(self.path)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable at checkpoints, never corrupt
            self._db.execute("PRAGMA foreign_keys=ON")
            # A thousand keepers' trials each add to a leaf page of their own: SQLite's default 2 MB cache held
            # half of them, and each commit read the others back. A longer WAL between checkpoints copies a page
            # rewritten by many commits once (the store alone, timed in-process with 1,000 trials
            # interleaved: 5.7 -> 5.0 us a record).
            self._db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            self._db.execute(f"PRAGMA wal_autocheckpoint={CHECKPOINT_PAGES}")
            self._db.executescript(_SCHEMA)
            self._add_missing_columns()
        except (OSError, sqlite3.DatabaseError) as err:
            from trialkit.manager.disk import fault_reason

            reason = fault_reason(err)
            if reason is None:
                raise
            raise StoreUnwritable(self.path, reason) from None
        # A store already made opens without a write: on a read-only disk the first write would fail later,
        # mid-command (SQLite takes even its write lock there).
        if os.statvfs(self.path.parent).f_flag & os.ST_RDONLY:
            self._db.close()
            raise StoreUnwritable(self.path, "the disk is read-only")

    def refusing(self, err: BaseException) -> BaseException:
        """A write's error as the caller should raise it: StoreUnwritable when the disk refused it."""
        from trialkit.manager.disk import fault_reason

        reason = fault_reason(err)
        return err if reason is None else StoreUnwritable(self.path, reason)

    @classmethod
    def reader(cls, path: Path) -> "Store":
        """The store as the CLI's readers open it: for writing as usual (an older store gets its new columns), read
        only when its disk takes no writes. Raises StoreUnwritable when it cannot be read either, and
        sqlite3.DatabaseError when the file is no intact store."""
        try:
            return cls(path)
        except StoreUnwritable as err:
            try:
                return cls(path, read_only=True)
            except sqlite3.OperationalError:
                raise err from None

    @classmethod
    def in_dir(cls, experiment_dir: Path) -> "Store":
        return cls(Path(experiment_dir) / DB_NAME)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _add_missing_columns(self) -> None:
        # CREATE TABLE IF NOT EXISTS leaves an older store's tables as they were. Looked at
        # first, so that opening a current store (the CLI reading beside the manager) writes nothing.
        if all(self._has_column(self._db, table, column) for table, column, _ in _ADDED_COLUMNS):
            return
        with self._tx() as db:
            for table, column, kind in _ADDED_COLUMNS:
                if not self._has_column(db, table, column):  # again: another process may have added it
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    @staticmethod
    def _has_column(db: sqlite3.Connection, table: str, column: str) -> bool:
        return any(row["name"] == column for row in db.execute(f"PRAGMA table_info({table})"))

    def _tx(self):
        return _Transaction(self._db, self._lock)

    # -- experiments ------------------------------------------------------------------
    def create_experiment(self, experiment_id: str, config: Optional[Dict[str, Any]] = None,
                          status: str = RUNNING) -> None:
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT INTO experiments(id, config, status, created, updated) VALUES (?,?,?,?,?)",
                       (experiment_id, json.dumps(config or {}), status, now, now))

    def experiment(self, experiment_id: str) -> Optional[Dict[str, Any]]:
        with self._lock:
            row = self._db.execute("SELECT * FROM experiments WHERE id=?", (experiment_id,)).fetchone()
        if row is None:
            return None
        out = dict(row)
        out["config"] = _json_column(out["config"], f"experiment {experiment_id}'s config")
        if not isinstance(out["config"], dict):  # every reader takes it for the config's mapping
            raise sqlite3.DatabaseError(f"experiment {experiment_id}'s config is not a JSON object")
        return out

    def set_experiment_status(self, experiment_id: str, status: str, reason: Optional[str] = None) -> None:
        """The experiment's status, and why it ended (its error, what stopped it) or None."""
        with self._tx() as db:
            db.execute("UPDATE experiments SET status=?, reason=?, updated=? WHERE id=?",
                       (status, reason, time.time(), experiment_id))

    def set_experiment_config(self, experiment_id: str, config: Dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("UPDATE experiments SET config=?, updated=? WHERE id=?",
                       (json.dumps(config), time.time(), experiment_id))

    # -- trials -----------------------------------------------------------------------
    def add_trial(self, experiment_id: str, trial_id: str, *, sequence: int, parameters: Dict[str, Any],
                  token: Optional[str], parameter_id: Optional[int] = None, priority: int = 0,
                  trial_dir: Optional[str] = None, stdout_path: Optional[str] = None,
                  stderr_path: Optional[str] = None, status: str = WAITING) -> None:
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO trials(id, experiment, sequence, parameter_id, parameters, status, token_hash, "
                "priority, trial_dir, stdout_path, stderr_path, created, updated) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (trial_id, experiment_id, sequence, sequence if parameter_id is None else parameter_id,
                 records.dumps(parameters), status, token_hash(token) if token else None, priority,
                 trial_dir, stdout_path, stderr_path, now, now))
            _history(db, trial_id, status, None, None, now, "control")

    def trial(self, trial_id: str) -> Optional[Dict[str, Any]]:
        with self._lock:
            row = self._db.execute("SELECT * FROM trials WHERE id=?", (trial_id,)).fetchone()
        return _trial(row) if row else None

    def trials(self, experiment_id: str, status: Optional[str] = None) -> List[Dict[str, Any]]:
        sql, args = "SELECT * FROM trials WHERE experiment=?", [experiment_id]
        if status is not None:
            sql, args = sql + " AND status=?", args + [status]
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY sequence", args).fetchall()
        return [_trial(row) for row in rows]

    def counts(self) -> Tuple[Dict[str, int], int]:
        """(trials by status, trials queued for a slot: those with a place in the job queue), for /metrics."""
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*), SUM(position IS NOT NULL) FROM trials "
                                    "GROUP BY status").fetchall()
        return {status: count for status, count, _ in rows}, sum(queued or 0 for _, _, queued in rows)

    def trial_for_token(self, token: str) -> Optional[str]:
        """The trial that holds this token; None once the control plane ended it (its token is revoked)."""
        with self._lock:
            row = self._db.execute("SELECT id FROM trials WHERE token_hash=?", (token_hash(token),)).fetchone()
        return row["id"] if row else None

    def set_status(self, trial_id: str, status: str, *, exit_code: Optional[int] = None, reason: str = "",
                   restart_count: Optional[int] = None, source: str = "control", when: Optional[float] = None) -> None:
        """`when`: the time of the change, if not now (a run lost while no manager watched ended before)."""
        with self._tx() as db:
            _set_status(db, trial_id, status, exit_code, reason, restart_count, time.time() if when is None else when,
                        source)

    def set_restart_count(self, trial_id: str, restart_count: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE trials SET restart_count=?, updated=? WHERE id=?", (restart_count, time.time(), trial_id))

    def set_places(self, places: Dict[str, Tuple[int, Optional[int]]]) -> None:
        """Trials' (priority, queue position) in one transaction; position None: not queued."""
        now = time.time()
        with self._tx() as db:
            db.executemany("UPDATE trials SET priority=?, position=?, updated=? WHERE id=?",
                           [(priority, position, now, trial_id) for trial_id, (priority, position) in places.items()])

    def replace_token(self, trial_id: str, token: str) -> None:
        """A new token for a trial as it starts (again; only the hash of the old one was kept). The reason it
        waited in its experiment's queue ("activated; waiting for a free slot ...") goes: it has its slot."""
        with self._tx() as db:
            db.execute("UPDATE trials SET token_hash=?, reason='', updated=? WHERE id=?",
                       (token_hash(token), time.time(), trial_id))

    def open_runs(self, experiment_id: str) -> List[OpenRun]:
        with self._lock:
            return open_runs(self._db, experiment_id)

    def durations(self, experiment_id: str, bounds: str) -> Dict[str, Optional[float]]:
        """Each trial's duration (RAN: its runs' time, summed, a run with no end counted to its bound), by trial id."""
        with self._lock:
            rows = self._db.execute(f"SELECT t.id, {RAN} FROM trials t WHERE t.experiment=?",
                                    (bounds, experiment_id)).fetchall()
        return {trial_id: ran for trial_id, ran in rows}

    def status_history(self, trial_id: str) -> List[Dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT status, exit_code, reason, time, source FROM statuses "
                                    "WHERE trial=? ORDER BY id", (trial_id,)).fetchall()
        return [dict(row) for row in rows]

    # -- records ---------------------------------------------------------------------
    def add_records(self, trial_id: str, batch: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Store records not stored before (by spool and seq); return those newly stored, in order.

        Records must be valid (records.wire_problem is None). A record's `spool` names the spool that numbered
        it (keeper/leftover.py gives it); a record without one is of the spool that names none. Applies STATUS
        records to the trial.
        """
        fresh: List[Dict[str, Any]] = []
        for spool, recs in groupby(batch, key=lambda rec: rec.get("spool", "")):
            fresh += self.add_batch(trial_id, recs, (), spool)[0]
        return fresh

    def add_batch(self, trial_id: str, batch: Iterable[Dict[str, Any]],
                  rejected: Iterable[Tuple[Dict[str, Any], str]],
                  spool: str = "") -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
        """add_records for one spool's batch, and records refused with their reason (each with a usable seq) as
        REJECTED rows.

        Returns the newly stored records and the newly refused ones as `{"seq", "reason"}` (the spool's seq), in
        seq order.
        """
        outcome = self.add_batches([(trial_id, spool, batch, rejected)])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome.fresh, outcome.refused

    def add_batches(self, batches: Sequence[Tuple[str, str, Iterable[Dict[str, Any]],
                                                  Iterable[Tuple[Dict[str, Any], str]]]]
                    ) -> List[Union["Stored", Exception]]:
        """Several batches (trial, spool id, records, refused records) in one transaction: a group commit.

        One commit for all of them is most of what a batch costs the store
        (bench/bench_manager.py). Each batch is its own savepoint: one that
        fails is undone alone, and its outcome is the exception; the others'
        are Stored. The method returns once the commit that holds them is
        done, so an ack built from an outcome never runs ahead of the disk; a
        commit that fails raises, and no batch of the group is stored.
        """
        now = time.time()
        # Each row as stored, made before the lock is taken: the store is held for SQL only. The seqs are the
        # spool's: where its base is not 0, _add_rows moves them up.
        prepared = [(trial_id, spool, sorted([(rec["seq"], rec, None, _record_row(trial_id, rec, now)) for rec in batch]
                                             + [(rec["seq"], rec, why, _refused_row(trial_id, rec, why, now))
                                                for rec, why in rejected], key=lambda row: row[0]))
                    for trial_id, spool, batch, rejected in batches]
        outcomes: List[Union[Stored, Exception]] = []
        with self._tx() as db:
            for trial_id, spool, rows in prepared:
                db.execute("SAVEPOINT batch")
                try:
                    outcomes.append(_add_rows(db, trial_id, spool, rows, now))
                except Exception as err:  # noqa: BLE001 - this batch's answer; the rest of the group goes on
                    if not db.in_transaction:
                        raise  # SQLite undid the whole transaction (a full disk, an I/O error): the group fails
                    db.execute("ROLLBACK TO batch")
                    outcomes.append(err)
                db.execute("RELEASE batch")
        return outcomes

    def acked_seq(self, trial_id: str, spool: Optional[str] = None) -> int:
        """The highest seq such that every record 1..seq of the trial's spool is stored, in the spool's numbers.
        Spool None: the trial's latest (the one given the highest base), else the one that names none."""
        with self._lock:
            if spool is None:
                row = self._db.execute("SELECT base, acked FROM spools WHERE trial=? ORDER BY base DESC LIMIT 1",
                                       (trial_id,)).fetchone()
                if row is not None:
                    return row["acked"] - row["base"]
                spool = ""
            return _spool_ack(self._db, trial_id, spool, make=False)[2]

    def records_for(self, trial_id: str, type: Optional[str] = None, after_seq: int = 0) -> List[Dict[str, Any]]:
        """The trial's records after `after_seq`, in order: of one type, or every type but the
        trial's output (LOG records, read apart: they are most of the bytes)."""
        sql = ("SELECT seq, type, sequence, parameter_id, value, time, received, source, reason, COALESCE(run, 0) "
               "AS run FROM records "
               "WHERE trial=? AND seq>?")
        args: List[Any] = [trial_id, after_seq]
        if type is not None:
            sql, args = sql + " AND type=?", args + [type]
        else:
            sql, args = sql + " AND type!=?", args + [records.LOG]
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY seq", args).fetchall()
        out = []
        for row in rows:
            rec = dict(row)
            rec["value"] = records.loads(rec["value"])
            out.append(rec)
        return out

    def count_records(self, trial_id: Optional[str] = None) -> int:
        with self._lock:
            if trial_id is None:
                return self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
            return self._db.execute("SELECT COUNT(*) FROM records WHERE trial=?", (trial_id,)).fetchone()[0]


class _Transaction:
    """`with store._tx() as db:` one IMMEDIATE transaction under the store's lock."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock):
        self.db = db
        self.lock = lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind, value, tb) -> None:
        try:
            if kind is None:
                try:
                    self.db.execute("COMMIT")
                except sqlite3.Error:
                    if self.db.in_transaction:  # a COMMIT refused (a deferred constraint, a busy file) leaves it open
                        self.db.execute("ROLLBACK")
                    raise
            elif self.db.in_transaction:  # some errors (a full disk) end the transaction themselves
                self.db.execute("ROLLBACK")
        finally:
            self.lock.release()


def _trial(row: sqlite3.Row) -> Dict[str, Any]:
    out = dict(row)
    for key in _TRIAL_JSON:
        out[key] = _json_column(out[key], f"trial {out['id']}'s {key}")
    del out["token_hash"]  # a secret's hash stays in the store
    return out


def _json_column(text: Any, what: str) -> Any:
    """A JSON column's value; one that is not JSON (written by hand or another program) is a damaged store."""
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):
        raise sqlite3.DatabaseError(f"{what} is not JSON") from None


def _history(db: sqlite3.Connection, trial_id: str, status: str, exit_code: Optional[int], reason: Optional[str],
             when: float, source: str) -> None:
    if status in FINAL_STATUSES:
        last = db.execute("SELECT id, status, source, reason FROM statuses WHERE trial=? ORDER BY id DESC LIMIT 1",
                          (trial_id,)).fetchone()
        if last is not None and last["status"] in FINAL_STATUSES:
            # One end: the keeper reports it, then the control plane records its verdict on the same
            # end; the keeper's word after the control plane's changes nothing.
            if source != "control":
                return
            if status == last["status"]:  # the same end: the row stays, with the reason if it had none
                db.execute("UPDATE statuses SET reason=COALESCE(NULLIF(reason, ''), ?) WHERE id=?", (reason, last["id"]))
                return
            if last["source"] != "keeper" or not is_grace_killed(last["reason"] or ""):
                # A verdict of another status (a pause the keeper saw as a stop: PREEMPTED, not USER_CANCELED)
                # takes the keeper's row: the history says PAUSED, as the status line does.
                db.execute("UPDATE statuses SET status=?, exit_code=COALESCE(?, exit_code), "
                           "reason=COALESCE(NULLIF(?, ''), reason), source=? WHERE id=?",
                           (status, exit_code, reason, source, last["id"]))
                return
            # Unless the keeper killed it when its grace ran out: that row stays, and the verdict follows it.
    db.execute("INSERT INTO statuses(trial, status, exit_code, reason, time, source) VALUES (?,?,?,?,?,?)",
               (trial_id, status, exit_code, reason, when, source))


def _set_status(db: sqlite3.Connection, trial_id: str, status: str, exit_code: Optional[int], reason: str,
                restart_count: Optional[int], when: float, source: str) -> None:
    sets = ["status=?", "exit_code=?", "reason=?", "updated=?"]
    args: List[Any] = [status, exit_code, reason, time.time()]
    if restart_count is not None:
        sets.append("restart_count=?")
        args.append(restart_count)
    if status == RUNNING:
        sets.append("started=COALESCE(started, ?)")
        args.append(when)
    if status in FINAL_STATUSES:
        # One end, one time (as _history keeps one row): a verdict on an end already reported (the keeper's,
        # collected at a resume long after) keeps when it ended. Only a final status leaves `ended` set.
        sets.append("ended=COALESCE(ended, ?)")
        args.append(when)
        if source == "control":
            # The control plane saw the trial end: its token is revoked, so no keeper (or anyone holding
            # the old token) can change what it reported; a restart gets a new one (replace_token). A
            # keeper's own word keeps it: a container restarted in place reports again with it.
            sets.append("token_hash=NULL")
    else:
        sets.append("ended=NULL")  # started again (an activated trial): not ended now
    db.execute(f"UPDATE trials SET {', '.join(sets)} WHERE id=?", args + [trial_id])
    _history(db, trial_id, status, exit_code, reason, when, source)


def _as_sent(rec: Any) -> str:
    """A refused record's JSON text, to keep beside its reason."""
    try:
        return records.dumps(rec)
    except (ValueError, RecursionError) as err:  # nothing the manager parsed should get here; keep the row anyway
        return records.dumps(f"(not kept: {err})")


class Stored(NamedTuple):
    """One batch's outcome: the records newly stored, those newly refused ({"seq", "reason"}), the spool's ack (the
    seqs in the spool's numbers)."""

    fresh: List[Dict[str, Any]]
    refused: List[Dict[str, Any]]
    acked: int


def _add_rows(db: sqlite3.Connection, trial_id: str, spool: str, rows: List[Tuple[Any, ...]], now: float) -> Stored:
    """add_batch's work inside a transaction: rows are (the spool's seq, record, why refused or None, the row as
    stored)."""
    base, acked, _ = _spool_ack(db, trial_id, spool, make=bool(rows))
    if not rows:
        return Stored([], [], acked - base)
    if base:
        rows = [(seq + base, rec, why, (row[0], row[1] + base) + row[2:]) for seq, rec, why, row in rows]
    if rows[0][0] == acked + 1 and rows[-1][0] - rows[0][0] + 1 == len(rows):
        # The usual batch: the next seqs after the ack, each once (sorted, so no gap means no repeat).
        # None of them is stored unless a batch with a gap came before: then the insert finds one
        # (the primary key) and the general way below sorts them out.
        db.execute("SAVEPOINT next")
        try:
            _insert_records(db, [row for _, _, _, row in rows])
        except sqlite3.IntegrityError:
            db.execute("ROLLBACK TO next")
        else:
            db.execute("RELEASE next")
            return _stored(db, trial_id, spool, base, rows, rows[-1][0], now)  # stored to the last: the ack moves on
        db.execute("RELEASE next")
    stored = _seqs(db, "SELECT group_concat(seq) FROM records WHERE trial=? AND seq BETWEEN ? AND ?",
                   (trial_id, rows[0][0], rows[-1][0]))
    new = []
    for item in rows:
        if item[0] not in stored:
            stored.add(item[0])  # a seq twice in one batch is stored once too
            new.append(item)
    _insert_records(db, [row for _, _, _, row in new])
    return _stored(db, trial_id, spool, base, new, acked, now)


def _stored(db: sqlite3.Connection, trial_id: str, spool: str, base: int, new: List[Tuple[Any, ...]], acked: int,
            now: float) -> Stored:
    """What follows the insert of `new` rows: keepers' statuses applied, the spool's ack moved on from `acked`."""
    fresh, refused = [], []
    for _, rec, why, _ in new:
        if why is not None:
            refused.append({"seq": rec["seq"], "reason": why})
            continue
        fresh.append(rec)
        if rec["type"] == records.STATUS:
            value = rec["value"]
            _set_status(db, trial_id, value["status"], value.get("exit_code"), value.get("reason") or "",
                        value.get("restart_count"), rec.get("time") or now, "keeper")
    if new:
        acked = _advance_ack(db, trial_id, spool, acked)
    return Stored(fresh, refused, acked - base)


def _record_row(trial_id: str, rec: Dict[str, Any], now: float) -> Tuple[Any, ...]:
    return (trial_id, rec["seq"], rec["type"], rec.get("sequence"), rec.get("parameter_id"),
            records.dumps(rec["value"]), rec.get("time"), now, rec.get("source"), None, rec.get("run"))


def _refused_row(trial_id: str, rec: Dict[str, Any], why: str, now: float) -> Tuple[Any, ...]:
    return (trial_id, rec["seq"], records.REJECTED, None, None, _as_sent(rec), None, now, None, why, None)


# A keeper's batch costs the store a few statements whatever its size, not a step per row
# (a 50-record batch: about 110 SQLite steps before, 6 now). Each step is a call out of
# Python that lets the GIL go; fewer of them shortened the store's hold on a batch (median
# 0.25 -> 0.21 ms under 1,000 keepers, bench/bench_manager.py).
# Rows go in by INSERTs of a power of two rows each (50 rows: 32 + 16 + 2), so that only nine
# statement texts exist and each is compiled once (SQLite's statement cache keeps 128): one
# text per batch length, as a manager that falls behind gets them, cost a compile per batch,
# ~150 us for 50 rows, more than storing them.
_RECORD_COLUMNS = "trial, seq, type, sequence, parameter_id, value, time, received, source, reason, run"
_MAX_ROWS_PER_INSERT = 256  # 11 values a row: well within the 32,766 a statement may bind
_ACK_WINDOW = 10_000  # seqs looked at per step when the ack moves


def _seqs(db: sqlite3.Connection, sql: str, args: Tuple[Any, ...]) -> set:
    """The seqs a `SELECT group_concat(seq) ...` finds, read in one step."""
    (found,) = db.execute(sql, args).fetchone()
    return {int(seq) for seq in found.split(",")} if found else set()


def _insert_records(db: sqlite3.Connection, values: List[Tuple[Any, ...]]) -> None:
    start = 0
    while start < len(values):
        size = min(_MAX_ROWS_PER_INSERT, 1 << (len(values) - start).bit_length() - 1)  # the largest power of two left
        db.execute(_insert_sql(size), list(chain.from_iterable(values[start:start + size])))
        start += size


@functools.lru_cache(maxsize=None)
def _insert_sql(rows: int) -> str:
    return f"INSERT INTO records({_RECORD_COLUMNS}) VALUES {','.join(['(?,?,?,?,?,?,?,?,?,?,?)'] * rows)}"


def _spool_ack(db: sqlite3.Connection, trial_id: str, spool: str, make: bool) -> Tuple[int, int, int]:
    """(base, ack as stored, ack in the spool's numbers) of the trial's spool. A spool not seen before is given its
    base when `make` (see the module's doc), else is (0, 0, 0)."""
    if not spool:
        row = db.execute("SELECT acked_seq FROM trials WHERE id=?", (trial_id,)).fetchone()
        return (0, row[0], row[0]) if row else (0, 0, 0)
    row = db.execute("SELECT base, acked FROM spools WHERE trial=? AND id=?", (trial_id, spool)).fetchone()
    if row is not None:
        return row[0], row[1], row[1] - row[0]
    if not make:
        return 0, 0, 0
    # Above every seq the trial holds (those of the spool that names none too), and above every base given: the
    # spools read in the order the manager first heard of them. One statement: the hot path's first batch of a run.
    (base,) = db.execute(
        "SELECT CASE WHEN m IS NULL THEN 0 ELSE (m / ? + 1) * ? END FROM (SELECT MAX(top) AS m FROM ("
        "SELECT MAX(seq) AS top FROM records WHERE trial=? UNION ALL SELECT MAX(base) FROM spools WHERE trial=?))",
        (records.SPOOL_SEQS, records.SPOOL_SEQS, trial_id, trial_id)).fetchone()
    db.execute("INSERT INTO spools(trial, id, base, acked) VALUES (?,?,?,?)", (trial_id, spool, base, base))
    return base, base, 0


def _advance_ack(db: sqlite3.Connection, trial_id: str, spool: str, acked: int) -> int:
    """Move the spool's ack (now `acked`, as stored) to the end of the run of stored seqs that follows it; return
    it."""
    while True:  # a window at a time: behind a gap that stays, the records above it are not all read again
        start = acked
        above = _seqs(db, "SELECT group_concat(seq) FROM records WHERE trial=? AND seq>? AND seq<=?",
                      (trial_id, start, start + _ACK_WINDOW))
        while acked + 1 in above:
            acked += 1
        if acked < start + _ACK_WINDOW:
            break
    if spool:
        db.execute("UPDATE spools SET acked=? WHERE trial=? AND id=?", (acked, trial_id, spool))
    else:
        db.execute("UPDATE trials SET acked_seq=? WHERE id=?", (acked, trial_id))
    return acked
