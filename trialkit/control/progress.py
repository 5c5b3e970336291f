"""What a running experiment shows: a live line on a terminal, plain lines elsewhere, a table at the end.

On a TTY one line is rewritten in place (done / running / failed /
early-stopped, elapsed time, the best metric and its parameters); piped or
logged output gets one line per trial end instead, which reads well in a file.
Hand-written rather than tqdm or rich: it is one line of text with a
carriage return, and the control plane's core then needs neither.
"""
from __future__ import annotations

import shutil
import sys
import time
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, TextIO, Tuple

from trialkit import records
from trialkit.control.queue import label
from trialkit.control.results import KEEPER_GONE, RUNS_UNWATCHED, flat_parameters, metric_value, shown_values
from trialkit.statuses import EXPLAINED, FINAL_STATUSES

_CLEAR_LINE = "\r\x1b[K"
TICK_SECONDS = 1.0  # how often a TTY's line is refreshed when nothing happens


class Snapshot(NamedTuple):
    done: int
    running: int
    failed: int
    early_stopped: int
    canceled: int
    elapsed: float
    best_value: Optional[float] = None
    best_trial: Optional[str] = None
    best_parameters: Optional[Dict[str, Any]] = None
    disk: Optional[str] = None  # what is wrong with the experiment's disk, while it takes no writes
    max_trials: Optional[int] = None  # maxTrialNumber
    time_left: Optional[float] = None  # of maxExperimentDuration, while the experiment runs
    waiting: int = 0  # submitted and held back by the platform (their resource pool is full), or queued for the
    # end of the trial they go on from (a PBT heir of a paused trial)
    waiting_for: str = ""  # why the first of them waits ("waiting for 1 slot of ...", "waits for ID's end: ...")
    paused: int = 0  # stopped with their checkpoint (PREEMPTED): not ended, they go on when activated or resumed

    def line(self, width: Optional[int] = None) -> str:
        """The line. Within `width` columns (a terminal's), counts of 0 are left out and the best trial's
        parameters shorten; when even that is too long the best comes first, so a cut takes the counts."""
        ended = self.done + self.failed + self.early_stopped + self.canceled
        left = "" if self.time_left is None else f", {duration(self.time_left)} left"
        of = "" if self.max_trials is None else f" of {self.max_trials}"
        head = f"DISK: {self.disk} | " if self.disk else ""
        head += f"[{duration(self.elapsed)}{left}]"
        held = [(self.waiting, f"waiting ({self.waiting_for.removeprefix('waiting ')})")] if self.waiting else []
        counts = [(self.done, "done"), (self.running, "running")] + held + [
            (self.failed, "failed"), (self.early_stopped, "early-stopped")] + (
            [(self.canceled, "canceled")] if self.canceled else []) + ([(self.paused, "paused")] if self.paused else [])
        shown = counts if width is None else [c for c in counts if c[0] or c[1] == "done"]
        tally = f"{ended}{of} ended: " + ", ".join(f"{n} {what}" for n, what in shown)
        if self.best_value is None:
            return f"{head} {tally}"
        best = f"best {number(self.best_value)} ({self.best_trial}"
        if not self.best_parameters:  # a trial of no parameters (Determined's single searcher): no empty ": "
            line = f"{head} {tally} | {best})"
            return line if width is None or len(line) < width else f"{head} {best}) | {tally}"
        if width is None:
            return f"{head} {tally} | {best}: {parameters_text(self.best_parameters)})"
        room = width - len(head) - len(tally) - len(best) - 7  # " ", " | ", ": ", ")" and the cursor
        if room >= 12:
            return f"{head} {tally} | {best}: {parameters_text(self.best_parameters, limit=room)})"
        return f"{head} {best}) | {tally}"


class Progress:
    def __init__(self, out: Optional[TextIO] = None, tty: Optional[bool] = None):
        self.out: Optional[TextIO] = out or sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self._live = ""
        # Piped: the lines of trials that ended, each with its snapshot, shown at the next update(), once the loop
        # has acted on the ends (started their replacements): a replaced trial is no dip in the running count.
        self._ended: List[Tuple[str, Snapshot]] = []

    def say(self, text: str) -> None:
        """A line that stays (the live line, if any, is redrawn below it)."""
        live = self._live
        self._clear()
        self._write(text + "\n")
        if live:
            self._draw(live)
        self._flush()

    def trial_ended(self, trial_id: str, status: str, final: Any, reason: str, snapshot: Snapshot) -> None:
        if self.tty:
            if status != "SUCCEEDED":
                self.say(f"trial {trial_id} {status}" + (f": {reason}" if reason else ""))
            return
        value = metric_value(final)
        text = f"trial {trial_id} {status}"
        if value is not None:
            text += f" final={number(value)}"
        if reason:
            text += f" ({reason})"
        self._ended.append((text, snapshot))

    def update(self, snapshot: Snapshot) -> None:
        """The loop's figures once it has taken its decisions on the events it had: the live line on a TTY; the
        lines of the trials that ended since the last update elsewhere, each with its own counts of ended trials
        and the trials running now."""
        self._say_ended(snapshot)
        if self.tty:
            text = snapshot.line(self.width())
            if self._fit(text) == self._live:
                return  # drawn already: the loop updates on every batch of events, most of which change nothing seen
            self._draw(text)
            self._flush()

    @staticmethod
    def width() -> int:
        return shutil.get_terminal_size().columns

    def close(self) -> None:
        self._say_ended(None)
        self._clear()
        self._flush()

    def _say_ended(self, now: Optional[Snapshot]) -> None:
        """The ended trials' lines, their running and waiting counts those of `now` (None: as they ended)."""
        ended, self._ended = self._ended, []
        for text, snapshot in ended:
            if now is not None:
                snapshot = snapshot._replace(running=now.running, waiting=now.waiting, waiting_for=now.waiting_for)
            self.say(f"{text} | {snapshot.line()}")

    def _fit(self, text: str) -> str:
        width = self.width()
        return text if len(text) < width else text[: max(0, width - 2)] + "…"

    def _draw(self, text: str) -> None:
        self._live = self._fit(text)
        self._write(_CLEAR_LINE + self._live)

    def _clear(self) -> None:
        if self._live:
            self._write(_CLEAR_LINE)
            self._live = ""

    # Output is for people: when it goes away (a closed pipe, `| head`), the
    # experiment and its trials go on without it.
    def _write(self, text: str) -> None:
        if self.out is not None:
            try:
                self.out.write(text)
            except (OSError, ValueError):
                self.out = None

    def _flush(self) -> None:
        if self.out is not None:
            try:
                self.out.flush()
            except (OSError, ValueError):
                self.out = None


# -- text helpers, shared with the CLI -----------------------------------------------


def duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))  # as the page rounds it: one trial, one duration on every face
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"


def number(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.6g}"


def parameters_text(parameters: Dict[str, Any], limit: Optional[int] = 80) -> str:
    """KEY=VALUE, ...; cut to `limit` characters (None: whole)."""
    text = ", ".join(f"{key}={_short(value)}" for key, value in flat_parameters(parameters).items())
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return records.dumps(value)
    return str(value)


def when(timestamp: Optional[float]) -> str:
    return "-" if timestamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, columns padded to their widest cell."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def trials_table(rows: List[Dict[str, Any]], interrupted: Interrupted = None, space: Any = None) -> str:
    """The trials of an experiment, one line each (the summary, `experiment show`, `trial list`): the status
    word in its column, why (trial_why) in a last one, cut to the terminal's width on a TTY (piped output keeps
    it whole); a gpus column when GPUs were scheduled (the ones each trial's latest start was given).
    `interrupted`: the experiment's manager is gone (trial_why). The parameters are those the faces show
    (results.shown_values of `space`, the search space: not PBT's checkpoint paths), whole: a cut one
    (Hyperband's TRIAL_BUDGET, last) would say nothing."""
    with_gpus = any(row.get("gpus") is not None for row in rows)
    whys = [trial_why(row, interrupted) for row in rows]
    headers = (("trial", "status") + (("gpus",) if with_gpus else ()) + ("final", "steps", "duration", "parameters")
               + (("why",) if any(whys) else ()))
    cells = [[row["trial_id"], label(row["status"])] + ([gpu_list(row.get("gpus"))] if with_gpus else [])
             + [number(metric_value(row["final"])), row["steps"], duration(row["duration"]),
                parameters_text(shown_values(space, row["parameters"]), limit=None)] for row in rows]
    if any(whys):
        room = _room_left(headers, cells, shutil.get_terminal_size().columns if sys.stdout.isatty() else 0)
        for row, why in zip(cells, whys):
            row.append(why if room is None or len(why) <= room else why[:room - 1] + "…")
    return table(headers, cells)


# The least a cut `why` keeps, however wide the columns before it: its start says what kind of reason it is.
WHY_MIN_WIDTH = 24


def _room_left(headers: Sequence[str], cells: List[List[Any]], columns: int) -> Optional[int]:
    """How wide the last column may be for each line to fit `columns` (0: no width known, no cut: None)."""
    if not columns:
        return None
    before = sum(max(len(str(cell)) for cell in column) + 2 for column in zip(headers, *cells))
    return max(WHY_MIN_WIDTH, columns - before)


# Beside a trial the store says runs or waits when its experiment's manager is gone (SIGKILLed, its machine
# down): what the store says is no longer so, in `experiment list`'s word for such an experiment.
def page_again(experiment_id: str) -> str:
    """What becomes of the page an experiment's run served, once the run is gone: the run's last line and
    `experiment show` (where a detached run's user looks) say it alike."""
    return f"ended with the run; `trialkit ui {experiment_id}` serves it again, read-only"


INTERRUPTED_NOTE = "experiment INTERRUPTED"
Interrupted = Optional[Mapping[str, str]]  # None, or its manager is gone: trial id -> results.unwatched's state


def interrupted_note(state: Optional[str]) -> str:
    """What is known of an unfinished trial of an interrupted experiment, as every face says it beside its
    status: `state` is results.unwatched's (None for one whose run never began, "" where nothing is known)."""
    if not state:
        return INTERRUPTED_NOTE
    if state == RUNS_UNWATCHED:
        return f"{INTERRUPTED_NOTE}: it runs unwatched"
    if state == KEEPER_GONE:
        return f"{INTERRUPTED_NOTE}: its keeper is gone"
    return f"{INTERRUPTED_NOTE}: it ended {label(state)} unwatched"  # in its status.json: a resume records it


def trial_why(row: Dict[str, Any], interrupted: Interrupted = None) -> str:
    """Why a trial is as it is, as tables show it beside its status: what a waiting trial waits for, why a
    failed one failed (a reason that only repeats the status, a paused trial's "paused", is left out); ""
    when nothing needs saying. `interrupted`: its experiment's manager is gone, so an unfinished trial is
    stopped or unknown (interrupted_note)."""
    if interrupted is not None and row["status"] not in FINAL_STATUSES:
        return interrupted_note(interrupted.get(row["trial_id"]))
    reason = (row.get("reason") or "").strip()
    if row["status"] not in EXPLAINED or reason.lower() in ("", label(row["status"]).lower()):
        return ""
    return reason


def gpu_use(sample: Dict[str, Any]) -> str:
    """One sample of a trial's GPUs (trialkit.gpus.read_samples): `0: 87% busy, 900 of 16384 MiB`, and when."""
    def shown(value: Any, unit: str = "") -> str:
        return "?" if value is None else f"{value}{unit}"

    each = [f"{g['index']}: {shown(g['utilization'], '%')} busy, {shown(g['memory_used'])} of "
            f"{shown(g['memory_total'])} MiB" for g in sample["gpus"]]
    return "; ".join(each) + f" at {when(sample['time'])}"


def gpu_list(indices: Optional[Sequence[int]]) -> str:
    if indices is None:
        return "-"
    return ",".join(map(str, indices)) if indices else "none"
