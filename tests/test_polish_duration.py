"""An experiment's duration is the time its runs ran, summed (NNI's execDuration), not the time since it was
created: the hour it stood stopped between a Ctrl-C and its resume counts on no face (`experiment show`, the
page's data, the Python API's NNI profile) and takes nothing of maxExperimentDuration's budget. Real `trialkit`
commands over a real local experiment; the hour is made by moving the store's creation time back one.
"""
from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from contextlib import closing

import pytest

from experiment_util import cli, experiment, experiment_id, reported, start_cli
from harness import wait_until
from test_faces import SLOW, page_data
from trialkit.control import admin

HOUR = 3600.0
X = {"x": {"_type": "uniform", "_value": [0, 1]}}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def shown_elapsed(exp: str) -> float:
    """`experiment show`'s elapsed line, in seconds ("mm:ss" or "h:mm:ss")."""
    done = cli("experiment", "show", exp)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("elapsed"))
    seconds = 0
    for part in line.split()[1].split(":"):
        seconds = seconds * 60 + int(part)
    return float(seconds)


def profile_duration(exp: str) -> int:
    from trialkit.experiment import Experiment

    return Experiment(None, id=exp).get_experiment_profile()["execDuration"]


def test_the_hour_an_experiment_stood_stopped_counts_on_no_face(tmp_path, home):
    config = experiment(tmp_path, X, SLOW, maxTrialNumber=2, trialConcurrency=1, maxExperimentDuration="30m")
    run = start_cli("run", config)
    try:
        exp = experiment_id(run.stdout.readline())
        wait_until(lambda: reported(home, f"{exp}-00000") >= 1, 120, "the trial's first result")
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    first_run = admin.read_info(home / "experiments" / exp).elapsed
    before = reported(home, f"{exp}-00000")
    with closing(sqlite3.connect(home / "experiments" / exp / "trialkit.db")) as db, db:  # it stood an hour
        db.execute("UPDATE experiments SET created=created-?, updated=updated-?", (HOUR, HOUR))

    resumed = start_cli("experiment", "resume", exp)
    try:
        # Its first trial, cut short by the Ctrl-C, runs again in the resumed run, its budget of 30m untouched
        # by the hour (a budget counted from the creation would have stopped it at once).
        wait_until(lambda: reported(home, f"{exp}-00000") > before, 120, "the first trial's rerun's first result")
        started = time.monotonic()
        time.sleep(2.0)
        waited = time.monotonic() - started
        shown = shown_elapsed(exp)
        # Running: the first run and this one so far, read as it goes (not as of manager.json's last write).
        assert first_run + waited - 1 <= shown < HOUR, (first_run, waited, shown)
        page = page_data(home, exp)
        assert first_run + waited - 1 <= page["elapsed"] < HOUR, page
        assert page["remaining_duration"] > 30 * 60 - 300, page  # the hour stopped took none of it
        assert profile_duration(exp) < HOUR
        assert cli("experiment", "stop", exp).returncode == 0
        resumed.communicate(timeout=60)
    finally:
        if resumed.poll() is None:  # a failed assertion: Ctrl-C, so that its keeper and trial end with it
            resumed.send_signal(signal.SIGINT)
            try:
                resumed.wait(60)
            except subprocess.TimeoutExpired:
                resumed.kill()
                resumed.wait()

    ran = admin.read_info(home / "experiments" / exp).elapsed
    assert ran < HOUR
    assert abs(shown_elapsed(exp) - ran) <= 1 and abs(page_data(home, exp)["elapsed"] - ran) <= 1
    assert profile_duration(exp) == int(ran)
