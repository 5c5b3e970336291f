"""What the page asks of a store: read-only SQL, answered as plain JSON-ready dicts.

A trial's metric is the default value of its last FINAL record (a number, or
a dict's "default"), taken in SQL so that sorting and filtering 10,000 trials
stays in SQLite and only one page of rows reaches Python. The SQL calls
records.metric_number itself, as the SQL function `metric_number(value)` that
`register` adds to a connection: SQLite's own JSON functions read NaN and
infinities nowhere in a value and numbers beyond a float as infinities, so
they would disagree with the tuners about which trials have a metric.
"""
from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trialkit import gpus
from trialkit.control import background, results
from trialkit.control.plot import parameter_scale, parameter_span, step_title
from trialkit.control.progress import Interrupted, interrupted_note
from trialkit.manager.paths import MANAGER_FILE, TRIAL_LOG
from trialkit.manager.server import HttpError, decode
from trialkit.manager.store import RAN, open_runs
from trialkit.records import INT64_MAX, PERIODICAL, BadRecord, metric_number
from trialkit.statuses import EXPLAINED, FINAL_STATUSES, PREEMPTED, RUNNING, WAITING

# Experiment statuses (NNI's names) whose clock still runs; any other ended at its last update.
LIVE_EXPERIMENT = frozenset({"INITIALIZED", "RUNNING", "PAUSED", "NO_MORE_TRIAL", "TUNER_NO_MORE_TRIAL", "STOPPING"})
PAGE_LIMIT = 500
CURVE_TRIALS = 50
CURVE_TOP = 10  # trials drawn when none is chosen: the best
CURVE_POINTS = 2000  # per trial: longer curves are thinned evenly


def register(db: sqlite3.Connection) -> None:
    """Give a connection the SQL function these queries use: metric_number(JSON text) -> REAL or NULL."""
    db.create_function("metric_number", 1, _metric_of_json, deterministic=True)


def _metric_of_json(text: Optional[str]) -> Optional[float]:
    try:
        return metric_number(decode(text.encode())) if text is not None else None
    except BadRecord:
        return None


# The trial's last FINAL record: the primary key (trial, seq) walked backwards stops at it.
FINAL = ("(SELECT metric_number(r.value) FROM records r WHERE r.trial = t.id AND r.type = 'FINAL' "
         "ORDER BY r.seq DESC LIMIT 1)")


def _experiment_row(db: sqlite3.Connection, experiment_id: str) -> Dict[str, Any]:
    row = db.execute("SELECT * FROM experiments WHERE id=?", (experiment_id,)).fetchone()
    if row is None:
        raise HttpError(404, f"no experiment {experiment_id!r}")
    out = dict(row)
    try:
        out["config"] = json.loads(out["config"] or "{}")
    except ValueError:  # written by hand or by another program: the store is damaged, the request is fine
        raise HttpError(409, f"experiment {experiment_id}'s store is damaged: its config is not JSON") from None
    return out


def experiment_name(path: Path, experiment_id: str) -> Optional[str]:
    """experimentName from the store file at `path` (another experiment's: the pool's jobs); None when it has
    none, or the file is no store this page can read."""
    try:
        with closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT config FROM experiments WHERE id=?", (experiment_id,)).fetchone()
        name = json.loads(row[0] or "{}").get("experimentName") if row else None
    except (sqlite3.Error, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def parameter_names(db: sqlite3.Connection, experiment_id: str, config: Mapping[str, Any]) -> List[str]:
    """The search space's keys and the numbers the tuner added (results.shown_parameters), else the first
    trial's parameters' keys."""
    row = db.execute("SELECT parameters FROM trials WHERE experiment=? ORDER BY sequence LIMIT 1",
                     (experiment_id,)).fetchone()
    try:
        params = json.loads(row[0]) if row else {}
    except ValueError:
        params = {}
    params = params if isinstance(params, dict) else {}
    return results.shown_names(config.get("searchSpace"), params)


# Each experiment's ranking, kept per connection until its store changes: PRAGMA data_version changes when another
# connection writes, total_changes when this one does. Ranking decodes every trial's final record in Python
# (~5 ms of 1,000 trials): the curves of chosen trials near the best paid it on each answer (bench/bench_web.py),
# a page of a store that has not changed since pays it once. The connection itself is kept beside its ranking so
# that another one given the same id() never finds it.
_RANKINGS: "OrderedDict[Tuple[int, str, str], Tuple[sqlite3.Connection, Tuple[int, int], List[sqlite3.Row]]]" = \
    OrderedDict()
RANKINGS_KEPT = 16
_RANKINGS_LOCK = threading.Lock()


def _store_version(db: sqlite3.Connection) -> Tuple[int, int]:
    return db.execute("PRAGMA data_version").fetchone()[0], db.total_changes


def _kept_ranking(db: sqlite3.Connection, experiment_id: str, mode: str,
                  version: Tuple[int, int]) -> Optional[List[sqlite3.Row]]:
    kept = _RANKINGS.get((id(db), experiment_id, mode))
    return kept[2] if kept is not None and kept[0] is db and kept[1] == version else None


def _ranked(db: sqlite3.Connection, experiment_id: str, mode: str) -> List[sqlite3.Row]:
    """The experiment's trials with their final metrics, the best first by results.rank (the CLI's rule for ties)."""
    version = _store_version(db)  # before the query: a write between them makes the next answer rank anew
    ranked = _kept_ranking(db, experiment_id, mode, version)
    if ranked is None:
        rows = db.execute(f"SELECT t.id, t.sequence, t.parameters, {FINAL} AS metric FROM trials t "
                          "WHERE t.experiment=?", (experiment_id,)).fetchall()
        ranked = sorted(rows, key=lambda row: results.rank(row["metric"], row["sequence"], mode))
        with _RANKINGS_LOCK:
            _RANKINGS[(id(db), experiment_id, mode)] = (db, version, ranked)
            _RANKINGS.move_to_end((id(db), experiment_id, mode))
            while len(_RANKINGS) > RANKINGS_KEPT:
                _RANKINGS.popitem(last=False)
    return ranked


def _best(db: sqlite3.Connection, experiment_id: str, mode: str) -> Optional[sqlite3.Row]:
    ranked = _ranked(db, experiment_id, mode)
    return ranked[0] if ranked and ranked[0]["metric"] is not None else None


def _outranked(db: sqlite3.Connection, experiment_id: str, row: Mapping[str, Any], mode: str) -> bool:
    """Whether a trial of the experiment ranks before `row` (one with a metric): the kept ranking's first where
    it is current, else results.rank's rule as SQL's row values, which stops at the first such trial rather
    than ranking them all."""
    ranked = _kept_ranking(db, experiment_id, mode, _store_version(db))
    if ranked is not None:
        return ranked[0]["id"] != row["id"]
    beyond = "(metric, -sequence) > (?, ?)" if mode == results.MAXIMIZE else "(metric, sequence) < (?, ?)"
    return db.execute(f"SELECT 1 FROM (SELECT t.sequence, {FINAL} AS metric FROM trials t WHERE t.experiment=?) "
                      f"WHERE {beyond} LIMIT 1",
                      (experiment_id, row["metric"], -row["sequence"] if mode == results.MAXIMIZE else row["sequence"])
                      ).fetchone() is not None


def _folder(db: sqlite3.Connection) -> Optional[Path]:
    """The experiment dir the store file is in (its manager.json beside it); None for one in memory."""
    path = db.execute("PRAGMA database_list").fetchone()[2]
    return Path(path).parent if path else None


def _duration(db: sqlite3.Connection, exp: Mapping[str, Any], now: float) -> float:
    """The time its runs ran, summed, as manager.json beside the store tells it (the CLI's figure); a store
    without one (another program wrote it) from its creation to its last update, or to now while it runs."""
    ran = results.experiment_ran(_folder(db), exp["status"], open_runs(db, exp["id"]), now)
    if ran is not None:
        return ran
    return max(0.0, (now if exp["status"] in LIVE_EXPERIMENT else exp["updated"]) - exp["created"])


def _bounds(db: sqlite3.Connection, experiment_id: str, now: Optional[float] = None) -> str:
    """RAN's bounds: what each run with no end counts to, as `trial list` counts it (results.run_bounds)."""
    return results.run_bounds(open_runs(db, experiment_id), _folder(db), now)


def _status(db: sqlite3.Connection, exp: Mapping[str, Any]) -> str:
    """The stored status, or INTERRUPTED as `experiment list` says it: stored as running, its manager gone (a
    store with no manager.json beside it, another program's, as it is stored)."""
    folder = _folder(db)
    if folder is None or not (folder / MANAGER_FILE).exists():
        return exp["status"]
    return background.status(folder, exp)


def heading(db: sqlite3.Connection, experiment_id: str, exp: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The experiment's name and status, which every view's title shows (one opened by its address has no
    overview to take them from)."""
    exp = _experiment_row(db, experiment_id) if exp is None else exp
    return {"name": exp["config"].get("experimentName"), "status": _status(db, exp)}


def _interrupted(db: sqlite3.Connection, experiment_id: str) -> Interrupted:
    """None but in an INTERRUPTED experiment; there, what is known of each unwatched run (the CLI's)."""
    if _status(db, _experiment_row(db, experiment_id)) != background.INTERRUPTED:
        return None
    return {trial_id: seen.state for trial_id, seen in
            results.unwatched(open_runs(db, experiment_id), _folder(db)).items()}


def _unwatched(row: Mapping[str, Any], interrupted: Interrupted) -> bool:
    """A trial the store says runs or waits, in an INTERRUPTED experiment: no manager watches it any more."""
    return interrupted is not None and row["status"] not in FINAL_STATUSES


def summary(db: sqlite3.Connection, experiment_id: str, now: Optional[float] = None) -> Dict[str, Any]:
    """A line of the experiments list: status, trial counts, best trial, time run."""
    now = time.time() if now is None else now
    exp = _experiment_row(db, experiment_id)
    counts = _counts(db, experiment_id, _interrupted(db, experiment_id))
    mode = results.optimize_mode(exp["config"])
    best = _best(db, experiment_id, mode)
    return {
        "id": experiment_id,
        "name": exp["config"].get("experimentName"),
        "status": _status(db, exp),
        "created": exp["created"],
        "updated": exp["updated"],
        "elapsed": _duration(db, exp, now),
        "trials": sum(counts.values()),
        "counts": counts,
        "optimize_mode": mode,
        "best": {"id": best["id"], "metric": best["metric"], "parameters": _json(best["parameters"])}
        if best else None,
    }


def _counts(db: sqlite3.Connection, experiment_id: str, interrupted: Interrupted) -> Dict[str, int]:
    """Trials by status; in an INTERRUPTED experiment, an unfinished one by what is known of it (the CLI's words:
    "ended unwatched", "running unwatched", "lost"), not as the store last heard it."""
    counts: Dict[str, int] = {}
    for trial_id, status in db.execute("SELECT id, status FROM trials WHERE experiment=?", (experiment_id,)):
        state = interrupted.get(trial_id) if interrupted is not None and status not in FINAL_STATUSES else None
        key = results.unwatched_word(state) if state else status
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def experiment(db: sqlite3.Connection, experiment_id: str, now: Optional[float] = None) -> Dict[str, Any]:
    """The overview: the summary, the budget left, the search space and the config."""
    out = summary(db, experiment_id, now)
    stored = _experiment_row(db, experiment_id)
    config = stored["config"]
    max_duration = _number(config.get("maxExperimentDuration"))
    max_trials = _number(config.get("maxTrialNumber"))
    live = out["status"] in LIVE_EXPERIMENT  # an ended experiment has no time nor trials left: it runs no more
    out.update({
        "reason": stored.get("reason"),  # why it ended, as the run's end said it (None in an older store)
        "live": live,
        "max_duration": max_duration,
        "remaining_duration": None if max_duration is None or not live else max(0.0, max_duration - out["elapsed"]),
        "max_trials": max_trials,
        "remaining_trials": None if max_trials is None or not live else max(0, int(max_trials) - out["trials"]),
        "parameters": parameter_names(db, experiment_id, config),
        "search_space": config.get("searchSpace"),
        "config": config,
    })
    return out


def _number(value: Any) -> Optional[float]:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _json(text: Optional[str]) -> Any:
    try:
        return decode(text.encode()) if text is not None else None
    except ValueError:
        return None


def _json_values(texts: List[Optional[str]]) -> List[Any]:
    """_json of each text, decoded as one JSON array: one call to the decoder, not one a value (a curve's hundred
    values: ~6x sooner). A store's values are each JSON (records.dumps wrote them); where they do not make an
    array of as many values (one is damaged), each is decoded alone."""
    if None not in texts:
        try:
            values = decode(f"[{','.join(texts)}]".encode())  # type: ignore[arg-type]
        except (ValueError, RecursionError):
            values = None
        if isinstance(values, list) and len(values) == len(texts):
            return values
    return [_json(text) for text in texts]


# ---------------------------------------------------------------- the trials table

_COMPARISON = re.compile(r"^\s*(>=|<=|!=|>|<|=)\s*(\S+)\s*$")
_RANGE = re.compile(r"^\s*(\S+?)\s*\.\.\s*(\S+)\s*$")


@dataclass
class TrialQuery:
    """One page of the trials table: filters, an order, a window."""

    statuses: List[str] = field(default_factory=list)
    metric: str = ""  # a filter expression (see `_condition`)
    params: Dict[str, str] = field(default_factory=dict)  # parameter name -> filter expression
    sort: str = "sequence"  # sequence, id, status, metric, restarts, duration, or p:<parameter>
    descending: bool = False
    offset: int = 0
    limit: int = 50

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> "TrialQuery":
        """From the page's query string: status=A,B metric=EXPR p:NAME=EXPR sort= order=asc|desc offset= limit=."""
        try:
            offset, limit = int(query.get("offset", 0)), int(query.get("limit", 50))
        except ValueError:
            raise HttpError(400, "offset and limit are whole numbers") from None
        if offset > INT64_MAX:  # SQLite's OFFSET is a 64-bit integer; a limit is clamped below
            raise HttpError(400, f"offset is out of range (at most {INT64_MAX})")
        return cls(
            statuses=[s for s in query.get("status", "").split(",") if s],
            metric=query.get("metric", ""),
            params={k[2:]: v for k, v in query.items() if k.startswith("p:") and v.strip()},
            sort=query.get("sort", "sequence"),
            descending=query.get("order", "asc") == "desc",
            offset=max(0, offset),
            limit=min(PAGE_LIMIT, max(1, limit)),
        )


def _param_path(name: str, names: Sequence[str]) -> str:
    if name not in names or '"' in name:
        raise HttpError(400, f"no parameter {name!r} to sort or filter by")
    return f'$."{name}"'


_PARAM = "CASE WHEN json_valid(t.parameters) THEN json_extract(t.parameters, ?) END"
_SORTS = {
    "sequence": "t.sequence",
    "id": "t.id",
    "status": "t.status",
    "metric": "metric",
    "restarts": "t.restart_count",
    "duration": "ran",
}


def _condition(column: str, expression: str, args: List[Any]) -> str:
    """SQL for one filter: `a..b`, `>=x`, `<x`, `=x`, `!=x` compare numbers (`=`, `!=` also text);
    anything else is a case-insensitive part of the value's text."""
    ranged, compared = _RANGE.match(expression), _COMPARISON.match(expression)
    if ranged and _is_number(ranged.group(1)) and _is_number(ranged.group(2)):
        args.extend([float(ranged.group(1)), float(ranged.group(2))])
        return f"{column} BETWEEN ? AND ?"
    if compared and _is_number(compared.group(2)):
        args.append(float(compared.group(2)))
        return f"{column} {compared.group(1)} ?"
    if compared and compared.group(1) in ("=", "!="):
        args.append(compared.group(2))
        return f"CAST({column} AS TEXT) {compared.group(1)} ?"
    args.append("%" + expression.strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
    return f"CAST({column} AS TEXT) LIKE ? ESCAPE '\\'"


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def trials_page(db: sqlite3.Connection, experiment_id: str, q: TrialQuery,
                now: Optional[float] = None) -> Dict[str, Any]:
    now = time.time() if now is None else now
    exp = _experiment_row(db, experiment_id)
    names = parameter_names(db, experiment_id, exp["config"])
    where, args = ["t.experiment = ?"], [experiment_id]
    if q.statuses:
        where.append(f"t.status IN ({','.join('?' * len(q.statuses))})")
        args.extend(q.statuses)
    for name, expression in q.params.items():
        condition_args: List[Any] = [_param_path(name, names)]  # the column's own placeholder comes first
        where.append(_condition(_PARAM, expression, condition_args))
        args.extend(condition_args)
    inner = f"SELECT t.*, {FINAL} AS metric FROM trials t WHERE {' AND '.join(where)}"
    outer_where, outer_args = "", []
    if q.metric.strip():
        outer_where = "WHERE " + _condition("metric", q.metric, outer_args)
    if q.sort.startswith("p:"):
        sort, sort_args = _PARAM, [_param_path(q.sort[2:], names)]
    elif q.sort in _SORTS:
        sort, sort_args = _SORTS[q.sort], []
    else:
        raise HttpError(400, f"cannot sort by {q.sort!r}")
    direction = "DESC" if q.descending else "ASC"
    total = db.execute(f"SELECT COUNT(*) FROM ({inner}) {outer_where}", args + outer_args).fetchone()[0]
    rows = db.execute(
        f"SELECT t.*, {RAN} AS ran FROM ({inner}) t {outer_where} ORDER BY {sort} {direction} NULLS LAST, sequence "
        "LIMIT ? OFFSET ?", [_bounds(db, experiment_id, now)] + args + outer_args + sort_args + [q.limit, q.offset]
    ).fetchall()
    interrupted = _interrupted(db, experiment_id)
    return {"total": total, "offset": q.offset, "limit": q.limit, "parameters": names,
            "rows": [_trial_row(row, interrupted) for row in rows], "experiment": heading(db, experiment_id, exp)}


def _trial_row(row: sqlite3.Row, interrupted: Interrupted) -> Dict[str, Any]:
    return {
        "id": row["id"],
        "sequence": row["sequence"],
        "status": row["status"],
        # why it waits (its GPUs, a queue), why it failed; beside one no manager watches any more, that
        "reason": interrupted_note(interrupted.get(row["id"])) if _unwatched(row, interrupted)  # type: ignore[union-attr]
        else row["reason"] if row["status"] in EXPLAINED else None,
        "metric": row["metric"],
        "parameters": _json(row["parameters"]),
        "restarts": row["restart_count"],
        "exit_code": row["exit_code"],
        "priority": row["priority"],
        "created": row["created"],
        "duration": row["ran"],  # its runs' time, summed (store.RAN)
    }


# ---------------------------------------------------------------- charts

def curves(db: sqlite3.Connection, experiment_id: str, trial_ids: Sequence[str], top: int = CURVE_TOP,
           metric: str = "") -> Dict[str, Any]:
    """One metric of the given trials (else the `top` best) over their steps, every run of a trial as one series
    (results.series), with final metrics: `metric` by either of its names (results.metrics_of), else the one a
    user looks at first; `metrics` lists every metric these trials report, by the name shown; `best` the
    experiment's best trial where it is one of these (its curve is labelled so), else None."""
    exp = _experiment_row(db, experiment_id)
    mode = results.optimize_mode(exp["config"])
    if trial_ids:
        chosen = list(trial_ids[:CURVE_TRIALS])
        rows = db.execute(f"SELECT t.id, t.sequence, {FINAL} AS metric FROM trials t WHERE t.experiment=? "
                          f"AND t.id IN ({','.join('?' * len(chosen))}) ORDER BY t.sequence",
                          [experiment_id, *chosen]).fetchall()
    else:
        rows = _ranked(db, experiment_id, mode)[:top]  # the best first; while nothing has finished, the newest
    has_runs = _has_runs(db)
    reports = {row["id"]: _reports(db, row["id"], has_runs) for row in rows}
    known = results.metrics_of(value for values in reports.values() for value in values)
    shown = results.find_metric(known, metric) or (known[0] if known else results.Metric("default", "default", None))
    series = []
    for row in rows:
        points = results.metric_points(reports[row["id"]], shown.name)
        stride = max(1, -(-len(points) // CURVE_POINTS))
        series.append({"id": row["id"], "metric": row["metric"], "steps": [step for step, _ in points[::stride]],
                       "values": [value for _, value in points[::stride]],
                       "reports": len(reports[row["id"]])})
    # The best of these trials (drawn bold), by the same rule; the experiment's best unless another trial ranks
    # before it (the chosen trials' leader is seldom the best of all: the first trial that outranks it ends the
    # search, where ranking every trial took most of this answer's time: bench/bench_web.py).
    leader = min(rows, key=lambda row: results.rank(row["metric"], row["sequence"], mode), default=None)
    bold = leader["id"] if leader is not None and leader["metric"] is not None else None
    best = bold if bold is not None and (not trial_ids or not _outranked(db, experiment_id, leader, mode)) else None
    return {"optimize_mode": mode, "best": best, "series": series, "top": bold,
            "metrics": [m.shown for m in known], "metric": shown.shown,
            # Whether any trial of the experiment has an intermediate result (asked only when none of these has):
            # with none, the page says there are no curves rather than "the 3 best".
            "reported": any(reports.values()) or _any_reported(db, experiment_id),
            # The group of a Determined metric shown by its own name ("loss": training), for its mark.
            "groups": {m.shown: m.group for m in known if m.group and m.shown != m.name},
            "x": step_title((value for values in reports.values() for value in values), shown.name)}


def _any_reported(db: sqlite3.Connection, experiment_id: str) -> bool:
    return db.execute("SELECT 1 FROM trials t WHERE t.experiment=? AND EXISTS (SELECT 1 FROM records r "
                      "WHERE r.trial = t.id AND r.type = 'PERIODICAL') LIMIT 1", (experiment_id,)).fetchone() is not None


def _has_runs(db: sqlite3.Connection) -> bool:
    """Whether the store has its records' runs: the page reads older stores read-only, as they are."""
    return any(row[1] == "run" for row in db.execute("PRAGMA table_info(records)"))


def hyperparameters(db: sqlite3.Connection, experiment_id: str) -> Dict[str, Any]:
    """Column-wise parameters and final metric of every trial that has one (parallel coordinates, scatter)."""
    exp = _experiment_row(db, experiment_id)
    names = parameter_names(db, experiment_id, exp["config"])
    rows = db.execute(f"SELECT * FROM (SELECT t.id, t.parameters, {FINAL} AS metric FROM trials t "
                      f"WHERE t.experiment=? ORDER BY t.sequence) WHERE metric IS NOT NULL",
                      (experiment_id,)).fetchall()
    columns: Dict[str, List[Any]] = {name: [] for name in names}
    for row in rows:
        params = _json(row["parameters"])
        params = params if isinstance(params, dict) else {}
        for name in names:
            value = params.get(name)
            if isinstance(value, dict) and "_name" in value:
                value = value["_name"]  # a nested choice: the option chosen, as the search space names it
            # Numbers and strings plot as they are; anything nested as its JSON text.
            columns[name].append(value if isinstance(value, (int, float, str)) or value is None else json.dumps(value))
    space = exp["config"].get("searchSpace")
    space = space if isinstance(space, dict) else {}
    scales = {}
    for name in names:  # each axis spans the space as declared, not only what the trials drew
        kind, options = parameter_scale(space, name)
        scales[name] = {"kind": kind, "options": options, "span": parameter_span(space, name)}
    return {"optimize_mode": results.optimize_mode(exp["config"]), "parameters": names, "ids": [r["id"] for r in rows],
            "metric": [r["metric"] for r in rows], "columns": columns, "scales": scales,
            "experiment": heading(db, experiment_id, exp)}


# ---------------------------------------------------------------- one trial, the queue

def trial(db: sqlite3.Connection, experiment_id: str, trial_id: str, now: Optional[float] = None) -> Dict[str, Any]:
    now = time.time() if now is None else now
    row = db.execute(f"SELECT t.*, {FINAL} AS metric, {RAN} AS ran FROM trials t WHERE t.id=? AND t.experiment=?",
                     (_bounds(db, experiment_id, now), trial_id, experiment_id)).fetchone()
    if row is None:
        raise HttpError(404, f"no trial {trial_id!r} in experiment {experiment_id!r}")
    interrupted = _interrupted(db, experiment_id)
    out = _trial_row(row, interrupted)
    final = db.execute("SELECT value FROM records WHERE trial=? AND type='FINAL' ORDER BY seq DESC LIMIT 1",
                       (trial_id,)).fetchone()
    elastic = db.execute("SELECT value, time FROM records WHERE trial=? AND type='ELASTIC' ORDER BY seq DESC LIMIT 1",
                         (trial_id,)).fetchone()
    trial_dir = row["trial_dir"]
    out.update({
        "reason": out["reason"] if _unwatched(row, interrupted) else row["reason"],
        "started": row["started"],
        "ended": row["ended"],
        "trial_dir": trial_dir,
        # The keeper's default (trialkit.env): <trial dir>/checkpoint.
        "checkpoint_dir": str(Path(trial_dir) / "checkpoint") if trial_dir else None,
        # PBT's, Hyperband's and BOHB's: the trial whose checkpoint it went on from; where NNI's PBT code saves.
        **_went_on_from(db, experiment_id, out["parameters"]),
        "save_checkpoint_dir": results.saves_into(out["parameters"]),
        "final": _json(final["value"]) if final else None,
        **_steps(db, trial_id),
        "history": [dict(r) for r in db.execute(
            "SELECT status, exit_code, reason, time, source FROM statuses WHERE trial=? ORDER BY id", (trial_id,))],
        "logs": {name: path for name, path in log_paths(row).items() if path},
        "gpus": gpus.read_assignment(trial_dir),  # None: no GPU was scheduled for it
        "gpu_samples": gpus.read_samples(trial_dir),
        # An elastic job's last sizing decision (adaptdl-ray): workers, predicted speedups, reason; and when.
        "elastic": {**_json(elastic["value"]), "time": elastic["time"]} if elastic else None,
    })
    return out


def _reports(db: sqlite3.Connection, trial_id: str, has_runs: Optional[bool] = None) -> List[Any]:
    """The trial's intermediate values over all its runs, as one series (results.series: its STATUS records and
    status history tell when each run began and which started over). `has_runs`: _has_runs(db), where the
    caller knows it."""
    run = "COALESCE(run, 0)" if (_has_runs(db) if has_runs is None else has_runs) else "0"
    rows = db.execute(f"SELECT seq, {run}, type, value, time, received FROM records WHERE trial=? "
                      f"AND type IN ('PERIODICAL', 'STATUS') ORDER BY seq", (trial_id,)).fetchall()
    values = iter(_json_values([value for _, _, kind, value, _, _ in rows if kind == PERIODICAL]))
    found = [{"seq": seq, "run": run_of, "type": kind, "value": next(values) if kind == PERIODICAL else None,
              "time": at, "received": received} for seq, run_of, kind, value, at, received in rows]
    history = [dict(row) for row in db.execute("SELECT status, reason, time FROM statuses WHERE trial=?", (trial_id,))]
    return [rec["value"] for rec in results.series(found, history) if rec["type"] == PERIODICAL]


def _went_on_from(db: sqlite3.Connection, experiment_id: str, params: Any) -> Dict[str, Any]:
    """went_on_from: the trial (PBT's, Hyperband's, BOHB's) whose checkpoint it went on from, as trial show says
    it; started_afresh when that PBT step left none, so nothing was loaded."""
    source = results.went_on_from(params, (
        (other["id"], _json(other["parameters"]), other["reason"] or "") for other in
        db.execute("SELECT id, parameters, reason FROM trials WHERE experiment=? ORDER BY sequence", (experiment_id,))),
        results.setting(_experiment_row(db, experiment_id)["config"], "tuner", "name"))
    return {"went_on_from": source and source[1],
            "started_afresh": source is not None and source[0] == results.STARTED_AFRESH}


def _steps(db: sqlite3.Connection, trial_id: str) -> Dict[str, int]:
    """How many intermediate results the trial's series holds, and its steps (results.last_step)."""
    values = _reports(db, trial_id)
    return {"intermediate": len(values), "steps": results.last_step(values)}


def log_paths(row: Mapping[str, Any]) -> Dict[str, Optional[str]]:
    """The trial's captured output: the paths the store holds, else the keeper's names in the trial dir; and
    the local keeper's own log ("trial": what `trialkit trial logs` prints where the keeper shipped nothing,
    such as its "command not found" for a command that never started)."""
    trial_dir = row["trial_dir"]
    return {
        "stdout": row["stdout_path"] or (str(Path(trial_dir) / "stdout.log") if trial_dir else None),
        "stderr": row["stderr_path"] or (str(Path(trial_dir) / "stderr.log") if trial_dir else None),
        "trial": str(Path(trial_dir) / TRIAL_LOG) if trial_dir else None,
    }


def trial_log_path(db: sqlite3.Connection, experiment_id: str, trial_id: str, name: str) -> Optional[str]:
    row = db.execute("SELECT trial_dir, stdout_path, stderr_path FROM trials WHERE id=? AND experiment=?",
                     (trial_id, experiment_id)).fetchone()
    if row is None:
        raise HttpError(404, f"no trial {trial_id!r} in experiment {experiment_id!r}")
    paths = log_paths(row)
    if name not in paths:
        raise HttpError(400, f"no log {name!r} (stdout, stderr or trial)")
    return paths[name]


def shipped_log(db: sqlite3.Connection, experiment_id: str, trial_id: str, name: str,
                after_seq: int) -> List[Tuple[int, str]]:
    """(seq, text) of what the trial's keeper shipped of stream `name`, after `after_seq`."""
    rows = db.execute("SELECT seq, value FROM records WHERE trial=? AND type='LOG' AND seq>? ORDER BY seq",
                      (trial_id, after_seq)).fetchall()
    out = []
    for seq, value in rows:
        chunk = json.loads(value)
        if chunk.get("stream") == name:
            out.append((seq, chunk.get("text", "")))
    return out


QUEUED = (RUNNING, WAITING, PREEMPTED)


def queue(db: sqlite3.Connection, experiment_id: str, order: Optional[Sequence[str]]) -> List[Dict[str, Any]]:
    """Running trials, then waiting ones in scheduling order, then paused ones.

    `order` is the scheduler's order of waiting trials when it gives one; else
    smaller priority first (trialkit.control.queue's order), then submission order.
    """
    marks = ",".join("?" * len(QUEUED))
    rows = db.execute(f"SELECT t.*, {FINAL} AS metric, {RAN} AS ran FROM trials t WHERE t.experiment=? "
                      f"AND t.status IN ({marks}) ORDER BY t.priority, t.sequence",
                      (_bounds(db, experiment_id), experiment_id, *QUEUED)).fetchall()
    running = [r for r in rows if r["status"] == RUNNING]
    waiting = [r for r in rows if r["status"] == WAITING]
    paused = [r for r in rows if r["status"] not in (RUNNING, WAITING)]
    if order is not None:
        rank = {trial_id: i for i, trial_id in enumerate(order)}
        waiting.sort(key=lambda r: rank.get(r["id"], len(rank)))
    out = []
    interrupted = _interrupted(db, experiment_id)
    for position, row in enumerate(running + waiting + paused):
        item = _trial_row(row, interrupted)
        item["position"] = position + 1
        out.append(item)
    return out

