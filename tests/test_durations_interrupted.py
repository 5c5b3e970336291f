"""The durations of an interrupted experiment's trials stop (issue 40.3's second half).

A real `trialkit run` whose control plane is SIGKILLed: its keepers run on, unwatched (their own
sessions), and their durations count on while they do. Then one trial ends by itself (its keeper writes
its end in status.json, and its final records stay in its spool), and another's keeper is SIGKILLed (its
process gone, no end anywhere). Until `experiment resume` collects them, the store has no end for either;
every face (`trial list` and `trial show` in the CLI, the page's queries) must show the time each ran, the
same on every read: store.RAN bounded by control/results.run_bounds; and the resume that collects the
unwatched end keeps it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest

from experiment_util import experiment, experiment_id, reported, start_cli
from harness import wait_until
from trialkit import layout, process
from trialkit.control.progress import duration
from trialkit.control.results import trial_rows
from trialkit.keeper.status import StatusFile
from trialkit.manager.store import Store
from trialkit.statuses import SUCCEEDED
from trialkit.web import queries
from trialkit.web.catalog import Database

UNWATCHED_SECONDS = 2.0  # how long the trials run on after the control plane died, before either ends


def keeper(trial_dir: Path) -> Tuple[int, int]:
    """(pid, start ticks) of the trial's keeper."""
    found = layout.read_pidfile(trial_dir)
    assert found is not None, f"no keeper pidfile in {trial_dir}"
    return found[0], found[1]


def page_durations(exp_dir: Path, exp: str) -> Dict[str, float]:
    """The page's Trials table, as its route reads it."""
    database = Database(exp_dir / "trialkit.db")
    try:
        with database.reading() as db:
            rows = queries.trials_page(db, exp, queries.TrialQuery())["rows"]
    finally:
        database.close()
    return {row["id"]: row["duration"] for row in rows}


def cli_durations(exp_dir: Path, exp: str) -> Dict[str, float]:
    """`trial list`'s and `trial show`'s rows (results.trial_rows)."""
    store = Store.reader(exp_dir / "trialkit.db")
    try:
        return {row["trial_id"]: row["duration"] for row in trial_rows(store, exp)}
    finally:
        store.close()


def page_summary(exp_dir: Path, exp: str) -> Dict[str, Any]:
    """The page's line of the experiment (the Overview's and the experiments list's): elapsed, counts, ..."""
    database = Database(exp_dir / "trialkit.db")
    try:
        with database.reading() as db:
            return queries.summary(db, exp)
    finally:
        database.close()


def why_cell(listed: str, trial: str) -> str:
    """`trial list`'s status cell of the trial and its why cell, in parentheses."""
    header, _, *lines = listed.splitlines()
    line = next(line for line in lines if line.startswith(trial))
    return f"{line[header.index('status'):header.index('final')].strip()} ({line[header.index(' why') + 1:].strip()})"


def cli(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "trialkit.cli", *args], capture_output=True, text=True,
                          check=True, timeout=60).stdout


def test_an_interrupted_runs_trial_durations_stop_where_their_runs_did(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    go = tmp_path / "go"
    script = (f"import os, time, trialkit\np = trialkit.get_next_parameter()\ntrialkit.report_intermediate_result(1)\n"
              f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\ntrialkit.report_final_result(p['x'])\n")
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2]}}, script, maxTrialNumber=2,
                        trialConcurrency=2, tuner={"name": "GridSearch"})
    proc = start_cli("run", config)
    keepers = []
    try:
        exp = experiment_id(proc.stdout.readline())
        exp_dir = home / "experiments" / exp
        ended, killed = f"{exp}-00000", f"{exp}-00001"
        wait_until(lambda: reported(home, ended) and reported(home, killed), 90, "both trials to report")
        keepers = [keeper(exp_dir / "trials" / trial) for trial in (ended, killed)]
        proc.kill()  # the control plane dies outright: no end is recorded for either trial
        proc.wait(timeout=30)
        died = time.time()
        running = page_durations(exp_dir, exp)
        time.sleep(UNWATCHED_SECONDS)
        # While their keepers run, the trials run: unwatched, they count on.
        assert all(ran > running[trial] + UNWATCHED_SECONDS / 2 for trial, ran in cli_durations(exp_dir, exp).items())
        os.kill(keepers[1][0], signal.SIGKILL)  # its keeper gone too: no end anywhere (its trial dies with it)
        go.write_text("")  # the other ends by itself, unwatched: its end is in its status.json
        status_file = layout.status_path(exp_dir / "trials" / ended)
        wait_until(lambda: (StatusFile.previous(status_file) or {}).get("status") == SUCCEEDED, 60, "its end")
        wait_until(lambda: not any(process.is_running(*found) for found in keepers), 60, "both keepers to be gone")
        finished = time.time()

        first = cli_durations(exp_dir, exp), page_durations(exp_dir, exp), cli("trial", "list", exp), \
            cli("trial", "show", ended), cli("experiment", "show", exp), page_summary(exp_dir, exp)["elapsed"]
        time.sleep(2.5)
        second = cli_durations(exp_dir, exp), page_durations(exp_dir, exp), cli("trial", "list", exp), \
            cli("trial", "show", ended), cli("experiment", "show", exp), page_summary(exp_dir, exp)["elapsed"]
        assert first == second, (first, second)  # nothing counts on
        rows, page = first[0], first[1]
        assert rows == page  # one duration on every face
        # Each says what is known of it, beside the status the store last heard (issue 40 polish7).
        assert why_cell(first[2], ended) == "RUNNING (experiment INTERRUPTED: it ended SUCCEEDED unwatched)", first[2]
        assert why_cell(first[2], killed) == "RUNNING (experiment INTERRUPTED: its keeper is gone)", first[2]
        listed = next(line for line in cli("experiment", "list").splitlines() if line.startswith(exp))
        assert "INTERRUPTED  2 (1 lost, 1 ended unwatched)" in listed, listed  # not "2 (2 running)"
        assert page_summary(exp_dir, exp)["counts"] == {"ended unwatched": 1, "lost": 1}  # the page's counts alike
        # The experiment's own elapsed runs to the last moment anything was known of it (the unwatched end), on
        # the CLI and the page alike: not the 0 s manager.json said when the control plane died.
        elapsed = next(line.split()[1] for line in first[4].splitlines() if line.startswith("elapsed"))
        assert elapsed == duration(first[5]), (first[4], first[5])
        assert rows[ended] - 1 <= first[5] < finished - died + rows[ended] + 60, (first[5], rows)
        # The trial that ended unwatched ran past the control plane's death, to the end its keeper wrote.
        history = StatusFile.previous(status_file)["history"]
        end = next(entry["time"] for entry in history if entry["status"] == SUCCEEDED)
        assert rows[ended] > UNWATCHED_SECONDS and rows[ended] < finished - died + 60
        began = end - rows[ended]
        assert began < died  # counted from its run's start, as the store has it
        # The killed one ran until the store last heard of it, before the other's end.
        assert 0 < rows[killed] < rows[ended]
        # The resume collects the ended one's records from its spool, its end among them: the same duration. The
        # lost one's run ends where it was last known to run, then it runs again: the time down counts in neither.
        down = time.time() - died
        start = time.monotonic()
        cli("experiment", "resume", exp)
        resumed = time.monotonic() - start
        after = cli_durations(exp_dir, exp)
        assert after[ended] == pytest.approx(rows[ended], abs=0.05)
        assert rows[killed] < after[killed] < rows[killed] + resumed, (rows, after, down, resumed)
        # The experiment goes on from the elapsed the faces showed, the time down counted not.
        assert first[5] < page_summary(exp_dir, exp)["elapsed"] < first[5] + resumed, (first[5], resumed)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid, ticks in keepers:
            if process.is_running(pid, ticks):
                os.kill(pid, signal.SIGKILL)
        proc.stdout.close()
        proc.stderr.close()
