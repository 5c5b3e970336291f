"""An experiment's results as rows: what `export`, `show`, `plot`, the summary and the Python API return.

    rows = trial_rows(store, experiment_id)   # one dict per trial, in sequence order
    trial_rows(store, experiment_id, all_runs=True)  # one per run of each trial (export --all-runs)
    best_row(rows, "maximize")
    to_json(rows) / to_csv(rows)

A row holds the trial's id, sequence, parameter id, parameters, status, exit
code, reason, restart count, start and end times, and the metrics of one run
(a restarted trial's runs are kept apart; by default its latest run that
reported any): `run`, `intermediate` (every PERIODICAL value, in order) and
`final` (the first FINAL value, or None), each as reported, whatever JSON
allowed; and `rejected`, the records the manager refused (`{"seq", "reason",
"record"}`).
`metric_value` (records.metric_number) gives the number tuners compare: None
for a value that is not a finite number a float holds.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, NamedTuple, Optional

from trialkit import gpus, records
from trialkit.manager.store import Store
from trialkit.statuses import SUCCEEDED

_ROW_FIELDS = ("trial_id", "sequence", "parameter_id", "status", "exit_code", "reason", "restart_count", "run",
               "started", "ended", "duration", "final")


metric_value = records.metric_number  # the one rule, under the name the control plane's faces use


def metric_cell(value: Any) -> Any:
    """A metric as a table or CSV shows it: its number, else (10**400, NaN, text) its JSON text; None for none."""
    number = metric_value(value)
    if number is not None or value is None:
        return number
    return records.dumps(value)


def trial_rows(store: Store, experiment_id: str, all_runs: bool = False) -> List[Dict[str, Any]]:
    rows = []
    for trial in store.trials(experiment_id):
        metrics = store.records_for(trial["id"])
        runs = sorted({rec["run"] for rec in metrics if rec["type"] in records.METRIC_TYPES}) or [None]
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
            "duration": ended - started if started is not None and ended is not None else None,
            "rejected": [{"seq": rec["seq"], "reason": rec["reason"], "record": rec["value"]}
                         for rec in metrics if rec["type"] == records.REJECTED],
            "trial_dir": trial["trial_dir"],
            "gpus": gpus.read_assignment(trial["trial_dir"]),  # None: the platform scheduled no GPU for it
        }
        for run in runs if all_runs else runs[-1:]:
            rows.append({**row, **_run_metrics(metrics, run)})
    return rows


def _run_metrics(metrics: List[Dict[str, Any]], run: Optional[int]) -> Dict[str, Any]:
    """One run's metrics: its number, its intermediate values in order and its first final value."""
    mine = [rec for rec in metrics if rec["run"] == run]
    finals = [rec["value"] for rec in mine if rec["type"] == records.FINAL]
    return {"run": run, "intermediate": [rec["value"] for rec in mine if rec["type"] == records.PERIODICAL],
            "final": finals[0] if finals else None}


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


def best_row(rows: Iterable[Dict[str, Any]], optimize_mode: str) -> Optional[Dict[str, Any]]:
    """The row with the best finite final metric, None when no trial has one."""
    scored = [(metric_value(row["final"]), row) for row in rows]
    scored = [(value, row) for value, row in scored if value is not None]
    if not scored:
        return None
    pick = max if optimize_mode == "maximize" else min
    return pick(scored, key=lambda pair: pair[0])[1]


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
    """One line per trial, laid out as nnictl's export: the fields, with `final` the final metric's number (a
    dict's "default") and a `final.KEY` column for each other key of a dict metric; the intermediate numbers as
    a JSON list; the latest intermediate metric as `latest` and `latest.KEY`; a `param.NAME` column per parameter."""
    params = _columns(flat_parameters(row["parameters"]) for row in rows)
    final_keys = _columns(_extra_keys(row["final"]) for row in rows)
    latest_keys = _columns(_extra_keys(_latest(row)) for row in rows)
    import csv  # here, not at the top: the store's readers (`trialkit trial list`) start without it
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(list(_ROW_FIELDS) + [f"final.{key}" for key in final_keys] + ["intermediate", "latest"]
                    + [f"latest.{key}" for key in latest_keys] + [f"param.{key}" for key in params])
    for row in rows:
        flat = flat_parameters(row["parameters"])
        cells = [_csv_cell(key, row[key]) for key in _ROW_FIELDS]
        cells += _key_cells(row["final"], final_keys)
        cells.append(records.dumps([metric_cell(value) for value in row["intermediate"]]))
        cells.append(metric_cell(_latest(row)))
        cells += _key_cells(_latest(row), latest_keys)
        writer.writerow(["" if cell is None else cell for cell in cells] + [flat.get(key, "") for key in params])
    return buffer.getvalue()


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


def _latest(row: Dict[str, Any]) -> Any:
    return row["intermediate"][-1] if row["intermediate"] else None


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
