"""An experiment's results as rows: what `export`, `show`, `plot`, the summary and the Python API return.

    rows = trial_rows(store, experiment_id)   # one dict per trial, in sequence order
    trial_rows(store, experiment_id, all_runs=True)  # one per run of each trial (export --all-runs)
    best_row(rows, "maximize")                # rank(metric, sequence, mode): the order "best" means
    to_json(rows) / to_csv(rows)

A row holds the trial's id, sequence, parameter id, parameters, status, exit
code, reason, restart count, start and end times, duration (the time its runs
ran, summed: store.RAN, a run with no end counted to its bound: run_bounds), and its metrics: `run` (the
latest run that reported anything), `intermediate` (every PERIODICAL value, in
order), `steps` (the last step reported where the reports name steps, as
Determined's `steps_completed`; else how many there are) and `final` (the
first FINAL value of the latest run that has one, or None), each as reported,
whatever JSON allowed; and `rejected`, the records the manager refused
(`{"seq", "reason", "record"}`).

A trial restarted (paused and activated, preempted, retried) reports in
runs; its row holds them all as one series (`series`): a report that names
its step (Determined's) replaces an earlier run's report of the same group at
that step, as Determined forgets what came after the checkpoint it restarted
from; reports that name no step (NNI's) go on from where the earlier run's
stopped, in the order they came, as NNI's page shows them. A run that started
over (the stop before it found no checkpoint: the control plane's end said
NO_CHECKPOINT, as `trial show` does) replaces every intermediate report of
the runs before it: their progress was lost, and its own steps count from
the beginning again. With all_runs a
row is one run's reports as they came, with that run's own status, exit
code, reason, start and end (a paused run is PREEMPTED though the trial later
succeeded).
`metric_value` (records.metric_number) gives the number tuners compare: None
for a value that is not a finite number a float holds.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from trialkit import gpus, layout, process, records
from trialkit.control.queue import NO_CHECKPOINT
from trialkit.keeper.status import StatusFile
from trialkit.manager.store import OpenRun, Store
from trialkit.statuses import FINAL_STATUSES, PAUSED, RUNNING, SUCCEEDED

_ROW_FIELDS = ("trial_id", "sequence", "parameter_id", "status", "exit_code", "reason", "restart_count", "run",
               "started", "ended", "duration", "steps", "final")


metric_value = records.metric_number  # the one rule, under the name the control plane's faces use


def metric_cell(value: Any) -> Any:
    """A metric as a table or CSV shows it: its number, else (10**400, NaN, text) its JSON text; None for none."""
    number = metric_value(value)
    if number is not None or value is None:
        return number
    return records.dumps(value)


def run_bounds(runs: Sequence[OpenRun], experiment_dir: Optional[Path], now: Optional[float] = None) -> str:
    """What store.RAN counts each run with no end in the store to (its `?`), for every face alike: now, but
    for the runs known_ends bounds."""
    now = time.time() if now is None else now
    return json.dumps({"now": now, "trials": known_ends(runs, experiment_dir, now)})


def known_ends(runs: Sequence[OpenRun], experiment_dir: Optional[Path], now: Optional[float] = None
               ) -> Dict[str, float]:
    """Where each run with no end in the store (store.open_runs) is known to have ended, by trial id; none
    while the experiment's manager runs (see unwatched)."""
    return {trial_id: seen.end for trial_id, seen in unwatched(runs, experiment_dir, now).items()}


class Unwatched(NamedTuple):
    """What is known of a run that no manager watches (see unwatched)."""

    end: float  # when it is known to have ended: now while its keeper runs
    state: str  # RUNS_UNWATCHED, KEEPER_GONE, the final status its keeper wrote in its status.json, "": not known


RUNS_UNWATCHED = "runs unwatched"
KEEPER_GONE = "keeper gone"
# An INTERRUPTED experiment's unfinished trial, counted by what is known of it (a state of unwatched's): the CLI's
# experiment list and show, and the page's counts, say it in these words.
UNWATCHED_WORDS = {RUNS_UNWATCHED: "running unwatched", KEEPER_GONE: "lost"}
ENDED_UNWATCHED = "ended unwatched"  # its keeper wrote its end


def unwatched_word(state: str) -> str:
    return UNWATCHED_WORDS.get(state, ENDED_UNWATCHED)


def unwatched(runs: Sequence[OpenRun], experiment_dir: Optional[Path], now: Optional[float] = None
              ) -> Dict[str, Unwatched]:
    """What is known of each run with no end in the store (store.open_runs), by trial id; none while the
    experiment's manager runs.

    While it runs (or no manager.json says it ran: another program's store), the store hears of each end,
    and a run with none is going. Once the manager is gone (killed, or ended with trials it never saw end),
    nothing records their ends, and each such run is counted to what is known: the end its keeper wrote in
    its status.json, now while its keeper still runs, else the last the store heard (its last status or
    record, manager.json's last save): its keeper is gone. A resume ends a lost run there (control/resume.py)."""
    return _unwatched(runs, _info(experiment_dir) if runs else None, now)


def _info(experiment_dir: Optional[Path]) -> Any:
    """manager.json's ManagerInfo; None where there is none."""
    if experiment_dir is None:
        return None
    from trialkit.control import admin  # here: `trial list` loads it only for a store with runs to bound

    return admin.read_info(experiment_dir)


def _unwatched(runs: Sequence[OpenRun], info: Any, now: Optional[float]) -> Dict[str, Unwatched]:
    now = time.time() if now is None else now
    if info is None or info.running():
        return {}
    heard = max([info.saved or 0.0] + [run[3] for run in runs])
    return {trial_id: _known_end(trial_dir, began, now, heard) for trial_id, trial_dir, began, _ in runs}


def _known_end(trial_dir: Optional[str], began: float, now: float, heard: float) -> Unwatched:
    """When an unwatched run ended, or now while its keeper runs (see unwatched)."""
    if trial_dir is None:  # nothing of it on this machine to ask
        return Unwatched(max(began, heard), "")
    left = StatusFile.previous(layout.status_path(Path(trial_dir))) or {}
    ends = [(entry["time"], entry["status"]) for entry in left.get("history", []) if isinstance(entry, dict)
            and entry.get("status") in FINAL_STATUSES and isinstance(entry.get("time"), (int, float))
            and entry["time"] >= began]  # an end before it began is an earlier run's (a keeper that never started)
    if ends:
        return Unwatched(*min(ends))
    keeper = layout.read_pidfile(Path(trial_dir))
    if keeper is not None and process.is_running(keeper[0], keeper[1]):
        return Unwatched(now, RUNS_UNWATCHED)
    return Unwatched(max(began, heard), KEEPER_GONE)


def experiment_ran(experiment_dir: Optional[Path], stored_status: str, runs: Sequence[OpenRun],
                   now: Optional[float] = None) -> Optional[float]:
    """Seconds the experiment ran, its runs summed (what `experiment show`, the end of `trialkit run`, the page,
    NNI's execDuration and a resume go on from), as manager.json tells it; None where there is none. One that
    ended ran what the end of its run wrote there; one that runs, to now; an INTERRUPTED one (stored as running
    or paused, its manager gone) to the last moment anything was known of it: its unwatched trials' known ends
    (now while a keeper runs), the last the store heard, manager.json's last save."""
    info = _info(experiment_dir)
    if info is None:
        return None
    if stored_status not in (RUNNING, PAUSED):
        return info.elapsed  # its run is over (its process may still be ending): its last write says how long it ran
    if info.saved is None or info.running():
        return info.ran(now)
    known = [seen.end for seen in _unwatched(runs, info, now).values()]
    return info.elapsed + max([0.0] + [when - info.saved for when in known + [run[3] for run in runs]])


def trial_rows(store: Store, experiment_id: str, all_runs: bool = False) -> List[Dict[str, Any]]:
    rows = []
    durations = store.durations(experiment_id, run_bounds(store.open_runs(experiment_id), store.path.parent))
    for trial in store.trials(experiment_id):
        reported = store.records_for(trial["id"])  # every type but LOG, in seq order
        started, ended = trial["started"], trial["ended"]
        row = {
            "trial_id": trial["id"],
            "sequence": trial["sequence"],
            "parameter_id": trial["parameter_id"],
            "parameters": trial["parameters"],
            "status": trial["status"],
            "exit_code": trial["exit_code"],
            "reason": trial["reason"] or "",
            "restart_count": trial["restart_count"],
            "started": started,
            "ended": ended,
            "duration": durations.get(trial["id"]),  # its runs' time, summed (store.RAN)
            "rejected": [{"seq": rec["seq"], "reason": rec["reason"], "record": rec["value"]}
                         for rec in reported if rec["type"] == records.REJECTED],
            "trial_dir": trial["trial_dir"],
            "gpus": gpus.read_assignment(trial["trial_dir"]),  # None: the platform scheduled no GPU for it
        }
        mine = [rec for rec in reported if rec["type"] in _RUN_TYPES]
        runs = sorted({rec["run"] for rec in mine})
        history = store.status_history(trial["id"])
        if not all_runs:
            rows.append({**row, **_metrics(series(mine, history), runs[-1] if runs else None)})
            continue
        ends = _run_ends(trial, mine, history) if runs else {None: {}}
        for run, end in ends.items():
            rows.append({**row, **end, **_metrics([rec for rec in mine if rec["run"] == run], run)})
    return rows


_RUN_TYPES = (records.PERIODICAL, records.FINAL, records.STATUS)  # what a run of the trial reported


def _duration(started: Optional[float], ended: Optional[float]) -> Optional[float]:
    return ended - started if started is not None and ended is not None else None


def series(reported: List[Dict[str, Any]], history: Iterable[Dict[str, Any]] = ()) -> List[Dict[str, Any]]:
    """The trial's records over all its runs as one series (see the module's doc), given its status history:
    every record but the PERIODICAL ones a later run reported again at the same group and step, and those of the
    runs before the last one that started over, in the order the runs reported them."""
    over = started_over(reported, history)
    ordered = sorted((rec for rec in reported if over is None or rec["run"] >= over or rec["type"] != records.PERIODICAL),
                     key=lambda rec: (rec["run"], rec["seq"]))
    kept: List[Optional[Dict[str, Any]]] = []
    at: Dict[Any, int] = {}  # (group, step) -> its latest report's place in `kept`
    for rec in ordered:
        named = records.report_step(rec["value"]) if rec["type"] == records.PERIODICAL else None
        if named is not None:
            earlier = at.get(named)
            if earlier is not None and kept[earlier]["run"] < rec["run"]:
                kept[earlier] = None
            at[named] = len(kept)
        kept.append(rec)
    return [rec for rec in kept if rec is not None]


def started_over(reported: List[Dict[str, Any]], history: Iterable[Dict[str, Any]]) -> Optional[int]:
    """The latest run that started from the beginning: the first to start after an end whose reason says the
    trial held no checkpoint (NO_CHECKPOINT: a pause or a preemption that found none); None when every run went
    on from the one before it."""
    lost = [h["time"] for h in history if h["status"] in FINAL_STATUSES and (h["reason"] or "").endswith(NO_CHECKPOINT)]
    if not lost:
        return None  # nearly every trial: its records' runs are not looked at
    starts = run_starts(reported)
    after = [min((run for run, begin in starts.items() if begin > when), default=None) for when in lost]
    return max((run for run in after if run is not None), default=None)


def run_starts(reported: List[Dict[str, Any]]) -> Dict[int, float]:
    """When each run began, by run: its first record's time (the keeper's, else when the manager received it)."""
    starts: Dict[int, float] = {}
    for rec in reported:
        when = rec["time"] if rec["time"] is not None else rec["received"]
        starts[rec["run"]] = min(when, starts.get(rec["run"], when))
    return starts


def _metrics(reported: List[Dict[str, Any]], run: Optional[int]) -> Dict[str, Any]:
    """A row's metrics from its records: its run, its intermediate values in order, its steps and its final value
    (the first of the latest run that reported one)."""
    intermediate = [rec["value"] for rec in reported if rec["type"] == records.PERIODICAL]
    finals = [rec for rec in reported if rec["type"] == records.FINAL]
    final = next((rec["value"] for rec in finals if rec["run"] == finals[-1]["run"]), None) if finals else None
    return {"run": run, "intermediate": intermediate, "steps": last_step(intermediate), "final": final}


def step_numbers(values: List[Any]) -> List[int]:
    """The step each intermediate value stands at: the step it names (Determined's steps_completed), else its
    place among the values that name none (1, 2, ...: NNI's reports carry no step)."""
    out, count = [], 0
    for value in values:
        named = records.report_step(value)
        if named is None:
            count += 1
        out.append(count if named is None else named[1])
    return out


def last_step(values: List[Any]) -> int:
    """`steps`: the last step reported where the reports name steps, else how many reports there are."""
    named = [step for step in (records.report_step(value) for value in values) if step is not None]
    return max(step for _, step in named) if named else len(values)


class Metric(NamedTuple):
    """A metric the trials report, by the names a user knows it by."""

    shown: str  # what a user sees and types: the name they wrote ("loss"), GROUP.NAME where two groups share it
    name: str  # records.scalars' name: "default", a dict's key, a Determined report's GROUP.NAME ("training.loss")
    group: Optional[str]  # a Determined report's group (training, validation); None for NNI's metrics


def metrics_of(values: Iterable[Any]) -> List[Metric]:
    """Every metric these values hold, each once, the one a user looks at first first (`ordered_names`).

    A Determined metric is shown by the name its user wrote (`report_training_metrics(metrics={"loss": ...})`:
    "loss"), as Determined's own UI lists it, unless another group or an NNI key has that name too: then
    by GROUP.NAME, which tells them apart.
    """
    key_of: Dict[str, Tuple[Optional[str], str]] = {}
    for value in values:
        if not isinstance(value, dict) and "default" in key_of:
            continue  # a plain number names only "default", known already (a curve's hundred reports)
        for group, key, _ in records.grouped_scalars(value):
            key_of.setdefault(key if group is None else f"{group}.{key}", (group, key))
    taken: Dict[str, int] = {}
    for _, key in key_of.values():
        taken[key] = taken.get(key, 0) + 1
    return [Metric(key_of[name][1] if taken[key_of[name][1]] == 1 else name, name, key_of[name][0])
            for name in ordered_names(key_of)]


def shown_parameters(space: Iterable[str], params: Dict[str, Any]) -> List[str]:
    """The parameters the faces show and draw: the search space's, then those the tuner added that are numbers
    (Hyperband's and BOHB's TRIAL_BUDGET, the results per budget NNI users look for), not the paths it hands the
    trial (PBT's checkpoint dirs)."""
    names = list(space)
    return names + [key for key, value in params.items() if key not in names and isinstance(value, (int, float))
                    and not isinstance(value, bool)]


def shown_names(space: Any, params: Dict[str, Any]) -> List[str]:
    """shown_parameters where there is a search space (a dict of its parameters, by name), else every parameter's
    name: a store another program wrote, a Determined config's single searcher."""
    return shown_parameters(space, params) if isinstance(space, dict) and space else list(params)


def shown_values(space: Any, params: Dict[str, Any]) -> Dict[str, Any]:
    """The parameters as the faces show them (shown_names'), with their values."""
    return {name: params[name] for name in shown_names(space, params) if name in params}


# NNI's PBT parameters (tuners/pbt.py's LOAD and SAVE): the checkpoint a trial starts from and the dir it saves
# into, each all_checkpoint_dir/<member>/<step>; a member's first step has its own dir as both.
LOAD_DIR, SAVE_DIR = "load_checkpoint_dir", "save_checkpoint_dir"
# In the reason of a PBT step that ended leaving nothing in either dir (the loop's check): the steps that go on
# from it load nothing, and went_on_from says so.
LEFT_NO_CHECKPOINT = "its step left no checkpoint"


def left_no_checkpoint(params: Any) -> Optional[str]:
    """A PBT trial's save_checkpoint_dir when nothing is in it on this machine (empty or missing); None for any
    other trial and where it holds files."""
    save = params.get(SAVE_DIR) if isinstance(params, dict) else None
    return save if isinstance(save, str) and not _holds_files(Path(save)) else None


def saves_into(params: Any) -> Optional[str]:
    """A PBT trial's save_checkpoint_dir (NNI's PBT), where its code saved what no checkpoint store lists; None
    for any other trial, and where nothing is saved there on this machine (code written for trialkit or
    Determined saves into its own checkpoint dir: pointing at an empty place misled). Said by trial show and the
    trial page."""
    save = params.get(SAVE_DIR) if isinstance(params, dict) else None
    return save if isinstance(save, str) and _holds_files(Path(save)) else None


def _holds_files(folder: Path) -> bool:
    try:
        return any(folder.iterdir())
    except OSError:
        return False


# NNI's Hyperband and BOHB (tuners/hyperband.py's BUDGET): each trial's budget among its parameters.
BUDGET, BUDGETED_TUNERS = "TRIAL_BUDGET", ("Hyperband", "BOHB")


WENT_ON, STARTED_AFRESH = "went on from", "started afresh"


def went_on_from(params: Dict[str, Any], others: Iterable[Tuple[str, Dict[str, Any], str]],
                 tuner: Optional[str] = None) -> Optional[Tuple[str, str]]:
    """Where a trial went on from, as trial show and the page say it, of `others` ((id, parameters, reason) of
    its experiment's trials), as (WENT_ON, what): PBT's "TRIAL_ID (member M, step S)", the trial that saved into
    its load_checkpoint_dir (that dir itself where none did); under `tuner` Hyperband or BOHB, "TRIAL_ID (its
    round before, TRIAL_BUDGET B)", the trial of its configuration on the largest budget below its own, whose
    checkpoint dir its own got a copy of. (STARTED_AFRESH, what) where that PBT trial's step left no checkpoint
    (LEFT_NO_CHECKPOINT in its reason): nothing was loaded. None for a first step or round and any other trial."""
    others = list(others)
    if tuner in BUDGETED_TUNERS:
        before = _round_before(params, others)
        return None if before is None else (WENT_ON, before)
    load, save = (params.get(LOAD_DIR), params.get(SAVE_DIR)) if isinstance(params, dict) else (None, None)
    if not isinstance(load, str) or not isinstance(save, str) or load == save:
        return None
    member, step = Path(load).parts[-2:] if len(Path(load).parts) > 1 else ("?", "?")
    source, why = next(((trial_id, reason) for trial_id, other, reason in others
                        if isinstance(other, dict) and other.get(SAVE_DIR) == load), (load, ""))
    if LEFT_NO_CHECKPOINT in (why or ""):
        return STARTED_AFRESH, (f"with the parameters of {source} (member {member}, step {step}), which left no "
                                f"checkpoint to load")
    return WENT_ON, f"{source} (member {member}, step {step})"


def _round_before(params: Dict[str, Any], others: List[Tuple[str, Dict[str, Any], str]]) -> Optional[str]:
    budget = params.get(BUDGET) if isinstance(params, dict) else None
    if not isinstance(budget, (int, float)):
        return None
    configuration = {key: value for key, value in params.items() if key != BUDGET}
    before = [(other[BUDGET], trial_id) for trial_id, other, _ in others
              if isinstance(other, dict) and isinstance(other.get(BUDGET), (int, float)) and other[BUDGET] < budget
              and {key: value for key, value in other.items() if key != BUDGET} == configuration]
    if not before:
        return None
    smaller, trial_id = max(before, key=lambda found: found[0])
    return f"{trial_id} (its round before, {BUDGET} {smaller})"


def ordered_names(names: Iterable[str]) -> List[str]:
    """Metric names (records.scalars') as first seen, but the one a user looks at first first ("default", else
    the first validation metric: the searcher's) and Determined's validation metrics before the other groups'."""
    names = list(names)
    first = next((name for name in names if name == "default"), None) or next(
        (name for name in names if name.startswith("validation.")), None)
    return sorted(names, key=lambda name: (name != first, not name.startswith("validation.")))


def find_metric(metrics: Iterable[Metric], asked: str) -> Optional[Metric]:
    """The metric a user names, by the name shown or by its full GROUP.NAME; None when there is no such one."""
    metrics = list(metrics)
    return next((m for m in metrics if m.shown == asked), None) or next((m for m in metrics if m.name == asked), None)


def metric_points(values: List[Any], name: str) -> List[Tuple[int, float]]:
    """(step, number) of metric `name` (records.scalars') in each value that holds it as a number."""
    points = []
    for step, value in zip(step_numbers(values), values):
        number = records.scalar(value, name)
        if number is not None:
            points.append((step, number))
    return points


def _run_ends(trial: Dict[str, Any], reported: List[Dict[str, Any]],
              history: List[Dict[str, Any]]) -> Dict[int, Dict[str, Any]]:
    """Each run's own status, exit code, reason, start and end, by run.

    A run spans the time from its first record to the next run's first; the
    status history's last end within it is its end (the control plane's
    verdict, which takes the keeper's row, or its own where the keeper sent
    none), else the keeper's own last status of that run. The latest run's end
    is the trial's.
    """
    starts = run_starts(reported)
    runs = sorted(starts)
    out = {}
    for run, later in zip(runs, runs[1:] + [None]):
        begin = starts[run]
        if later is None:
            status = {"status": trial["status"], "exit_code": trial["exit_code"], "reason": trial["reason"] or "",
                      "ended": trial["ended"]}
        else:
            status = _run_end(run, [h for h in history if begin <= h["time"] < starts[later]], reported)
        out[run] = {**status, "started": begin, "duration": _duration(begin, status["ended"])}
    return out


def _run_end(run: int, history: List[Dict[str, Any]], reported: List[Dict[str, Any]]) -> Dict[str, Any]:
    ends = [h for h in history if h["status"] in FINAL_STATUSES]
    if ends:
        end = ends[-1]
        return {"status": end["status"], "exit_code": end["exit_code"], "reason": end["reason"] or "",
                "ended": end["time"]}
    told = [rec["value"] for rec in reported if rec["run"] == run and rec["type"] == records.STATUS
            and isinstance(rec["value"], dict)]
    last = told[-1] if told else {}
    return {"status": last.get("status"), "exit_code": last.get("exit_code"), "reason": last.get("reason") or "",
            "ended": last.get("ended")}


MAXIMIZE = "maximize"


def setting(config: Dict[str, Any], *keys: str) -> Any:
    """A stored config's setting (`setting(config, "tuner", "name")`); None where the store holds none: a store
    another program or an older trialkit wrote, read by `experiment show` and the page alike."""
    for key in keys:
        config = config.get(key) if isinstance(config, dict) else None
    return config


def optimize_mode(config: Dict[str, Any]) -> str:
    """The stored config's optimize mode, maximize where it says none."""
    return str(setting(config, "tuner", "classArgs", "optimize_mode") or MAXIMIZE)


def rank(metric: Optional[float], sequence: int, optimize_mode: str) -> Tuple[int, float, int]:
    """A trial's sort key by its final metric (a finite number or None), the best first. Of trials tied on the
    metric the earliest (smallest sequence) comes first: the one rule for "best" in every view (best_row for the
    CLI and the run's summary, the page's Overview and its curves' "(best)"). Trials without one come last, the
    newest first (the page shows what is running)."""
    if metric is None:
        return (1, 0.0, -sequence)
    return (0, -metric if optimize_mode == MAXIMIZE else metric, sequence)


def best_row(rows: Iterable[Dict[str, Any]], optimize_mode: str) -> Optional[Dict[str, Any]]:
    """The row with the best finite final metric (rank's rule for ties), None when no trial has one."""
    ranked = [(rank(metric_value(row["final"]), row["sequence"], optimize_mode), row) for row in rows]
    first = min(ranked, key=lambda pair: pair[0], default=None)
    return first[1] if first is not None and first[0][0] == 0 else None


def flat_parameters(parameters: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Nested choices as dotted keys: {"opt": {"_name": "sgd", "lr": 0.1}} -> opt=sgd, opt.lr=0.1."""
    out: Dict[str, Any] = {}
    for key, value in parameters.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            if "_name" in value:
                out[name] = value["_name"]
            out.update(flat_parameters({k: v for k, v in value.items() if k != "_name"}, name + "."))
        else:
            out[name] = value
    return out


def to_json(rows: List[Dict[str, Any]]) -> str:
    return json.dumps(rows, indent=2, allow_nan=True) + "\n"


def to_csv(rows: List[Dict[str, Any]]) -> str:
    """One line per trial, laid out as nnictl's export, flat: the fields, with `steps` and `final` the final
    metric's number (a dict's "default") and a `final.KEY` column for each other key of a dict metric; the latest
    value of each intermediate metric (records.scalars' names) as `latest` (the "default") and `latest.NAME`
    (`latest.loss`, `latest.validation.accuracy`); a `param.NAME` column per parameter."""
    params = _columns(flat_parameters(row["parameters"]) for row in rows)
    final_keys = _columns(_extra_keys(row["final"]) for row in rows)
    latest = [_latest_cells(row["intermediate"]) for row in rows]
    latest_names = ordered_names(dict.fromkeys(name for cells in latest for name in cells))
    import csv  # here, not at the top: the store's readers (`trialkit trial list`) start without it
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(list(_ROW_FIELDS) + [f"final.{key}" for key in final_keys]
                    + ["latest" if name == "default" else f"latest.{name}" for name in latest_names]
                    + [f"param.{key}" for key in params])
    for row, cells_of in zip(rows, latest):
        flat = flat_parameters(row["parameters"])
        cells = [_csv_cell(key, row[key]) for key in _ROW_FIELDS]
        cells += _key_cells(row["final"], final_keys)
        cells += [cells_of.get(name) for name in latest_names]
        writer.writerow(["" if cell is None else cell for cell in cells] + [flat.get(key, "") for key in params])
    return buffer.getvalue()


def _latest_cells(values: List[Any]) -> Dict[str, Any]:
    """The latest number of each metric the values hold, by name; a last value that is a lone non-number (a
    string, 10**400) as its JSON text under "default", as reported."""
    cells: Dict[str, Any] = {}
    for value in values:
        cells.update(records.scalars(value))
    if values and not isinstance(values[-1], (dict, list)) and metric_value(values[-1]) is None:
        cells["default"] = metric_cell(values[-1])
    return cells


def _csv_cell(key: str, value: Any) -> Any:
    """A field as the CSV holds it: times as ISO 8601 with their UTC offset (a spreadsheet reads them; the
    JSON export keeps the epoch seconds), the duration in seconds to the millisecond, the final's number."""
    if key == "final":
        return metric_cell(value)
    if value is None:
        return None
    if key in ("started", "ended"):
        from datetime import datetime

        return datetime.fromtimestamp(value).astimezone().isoformat(timespec="milliseconds")
    if key == "duration":
        return round(value, 3)
    return value


def _columns(key_lists: Iterable[Iterable[str]]) -> List[str]:
    """Every key once, in the order first seen."""
    return list(dict.fromkeys(key for keys in key_lists for key in keys))


def _extra_keys(metric: Any) -> List[str]:
    """A dict metric's keys besides "default" (the main value, which has its own column)."""
    return [key for key in metric if key != "default"] if isinstance(metric, dict) else []


def _key_cells(metric: Any, keys: List[str]) -> List[Any]:
    """A dict metric's values under `keys`: numbers and text as they are, other JSON as its text; None where absent."""
    values = metric if isinstance(metric, dict) else {}
    return [None if key not in values else values[key] if isinstance(values[key], (int, float, str))
            and not isinstance(values[key], bool) else records.dumps(values[key]) for key in keys]


class ExperimentResult(NamedTuple):
    """What `run_experiment` (and so `Experiment.run`) returns."""

    experiment_id: str
    status: str
    optimize_mode: str
    trials: List[Dict[str, Any]]

    @property
    def best(self) -> Optional[Dict[str, Any]]:
        return best_row(self.trials, self.optimize_mode)

    @property
    def succeeded(self) -> int:
        return sum(row["status"] == SUCCEEDED for row in self.trials)

    @property
    def exit_code(self) -> int:
        """0 when at least one trial succeeded, else 1."""
        return 0 if self.succeeded else 1
