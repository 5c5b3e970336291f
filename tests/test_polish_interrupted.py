"""After the control plane is SIGKILLed, the read-only views stop saying RUNNING as if it were so: beside each
trial the store last heard running, `trial list`, `trial show` and `experiment show` say the experiment is
INTERRUPTED (`experiment list`'s word for it) and how to go on, and none of them writes the store. Real
`trialkit run` with a local trial, killed outright; the page's data through its queries.
"""
from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import psutil
import pytest

from conftest import tagged_processes
from experiment_util import cli, experiment, sigkilled_while_running, stored
from harness import wait_until
from test_faces import SLOW
from trialkit.web import queries

X = {"x": {"_type": "choice", "_value": [1]}}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def stored_state(home: Path, exp: str) -> tuple:
    """The experiment's and its trials' rows and their records, read-only."""
    return tuple(stored(home, exp, f"SELECT * FROM {table}") for table in ("experiments", "trials", "records"))


def status_cell(listed: str, trial: str) -> str:
    """The trial's status cell, and its why cell in parentheses when the table has one."""
    header, *lines = listed.splitlines()
    line = next(line for line in lines if line.startswith(trial))
    status = line[header.index("status"):header.index("final")].strip()
    return f"{status} ({line[header.index('why'):].strip()})" if " why" in header else status


def test_trials_of_a_killed_run_are_said_interrupted_without_writing_the_store(tmp_path, home, no_process_left):
    config = experiment(tmp_path, X, SLOW, maxTrialNumber=1, trialConcurrency=1)
    def still_running(exp: str, trial: str) -> None:
        assert status_cell(cli("trial", "list", exp).stdout, trial) == "RUNNING"  # its manager runs: so it is
        assert job_status(exp, trial) == "RUNNING"  # `job list` says it as `trial list` does
    exp, trial = sigkilled_while_running(config, home, before_kill=still_running)
    try:
        views_of_a_killed_run(home, exp, trial)
    finally:  # its keeper outlives it (a resume takes its trial up): end it as a resume's stop would
        for proc in tagged_processes(no_process_left):
            try:
                proc.terminate()
            except psutil.NoSuchProcess:  # the trial, ended by its keeper meanwhile
                pass
        wait_until(lambda: not tagged_processes(no_process_left), 60, "the keeper and its trial to end")


def views_of_a_killed_run(home: Path, exp: str, trial: str) -> None:
    before = stored_state(home, exp)

    assert "INTERRUPTED  1 (1 running unwatched)" in cli("experiment", "list").stdout  # its keeper runs on
    listed = cli("trial", "list", exp)
    assert listed.returncode == 0, listed.stderr
    unwatched = "experiment INTERRUPTED: it runs unwatched"  # its keeper outlived the control plane
    assert status_cell(listed.stdout, trial) == f"RUNNING ({unwatched})"
    assert ("experiment INTERRUPTED: its manager is gone, so what the store says of its unfinished trials is what "
            "it last heard" in listed.stdout), listed.stdout
    assert f"`trialkit experiment resume {exp}` takes them up" in listed.stdout, listed.stdout
    # `job list --experiment` says it as `trial list` does, and the same note under its table.
    assert job_status(exp, trial) == "RUNNING"
    jobs = cli("job", "list", "--experiment", exp).stdout
    assert "experiment INTERRUPTED: its manager is gone" in jobs and f"resume {exp}` takes them up" in jobs, jobs
    shown = cli("trial", "show", trial).stdout
    assert f"status         RUNNING ({unwatched}; its manager is gone" in shown, shown
    table = cli("experiment", "show", exp).stdout.split("\n\n", 1)[1]
    assert status_cell(table, trial) == f"RUNNING ({unwatched})", table
    page = page_data(home, exp)  # the page (`trialkit ui`) says it alike: its status badge and the trial's reason
    assert page["summary"]["status"] == "INTERRUPTED" and page["summary"]["elapsed"] > 0
    assert (page["row"]["status"], page["row"]["reason"]) == ("RUNNING", unwatched)
    assert page["trial"]["reason"] == unwatched and page["queue"]["reason"] == unwatched
    assert stored_state(home, exp) == before  # read, never written


def job_status(exp: str, trial: str) -> str:
    """`job list --experiment EXP --json`'s status of the trial."""
    import json

    listed = cli("job", "list", "--experiment", exp, "--json")
    assert listed.returncode == 0, listed.stderr
    return next(job["status"] for job in json.loads(listed.stdout) if job["id"] == trial)


def page_data(home: Path, exp: str) -> dict:
    with closing(sqlite3.connect(f"file:{home / 'experiments' / exp / 'trialkit.db'}?mode=ro", uri=True)) as db:
        db.row_factory = sqlite3.Row
        queries.register(db)
        return {"summary": queries.summary(db, exp),
                "row": queries.trials_page(db, exp, queries.TrialQuery())["rows"][0],
                "trial": queries.trial(db, exp, f"{exp}-00000"), "queue": queries.queue(db, exp, None)[0]}


def test_delete_refuses_an_interrupted_experiment_whose_trials_run_unwatched(tmp_path, home, no_process_left):
    """Its keepers outlive its manager: deleting would leave them running, holding their pool's slots under a
    deleted job. Refused in one line, as a running experiment is, saying how to end them; nothing deleted."""
    config = experiment(tmp_path, X, SLOW, maxTrialNumber=1, trialConcurrency=1)
    exp, trial = sigkilled_while_running(config, home)
    try:
        deleted = cli("experiment", "delete", exp, "--yes")
        assert deleted.returncode == 2 and len(deleted.stderr.strip().splitlines()) == 1, deleted.stderr
        assert f"1 of its trials run unwatched ({trial})" in deleted.stderr, deleted.stderr
        assert f"`trialkit experiment resume {exp} --detach`" in deleted.stderr
        assert f"`trialkit experiment stop {exp}`" in deleted.stderr
        assert (home / "experiments" / exp).is_dir() and tagged_processes(no_process_left)  # all left as it was
        # `experiment stop`, the other half of that advice, says on its own that a resume must come first
        stopped = cli("experiment", "stop", exp)
        assert stopped.returncode == 2 and len(stopped.stderr.strip().splitlines()) == 1, stopped.stderr
        assert "its manager is gone (INTERRUPTED)" in stopped.stderr, stopped.stderr
        assert f"`trialkit experiment resume {exp} --detach`, then run this again" in stopped.stderr
    finally:
        for proc in tagged_processes(no_process_left):
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass
        wait_until(lambda: not tagged_processes(no_process_left), 60, "the keeper and its trial to end")
