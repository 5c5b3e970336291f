"""A trial's duration is the time its runs ran, summed (a run still going counted to now), not the span from its
first start to its last end: the hour its experiment stood stopped between a pause and a resume counts on no
face (`trial list`, `trial show`, the export, the page's rows, its sort, its trial view and queue). A real store
on disk written through the calls the control loop makes (set_status), the hour made by moving the first run's
times back one, read by real `trialkit` commands and the page's queries.
"""
from __future__ import annotations

import csv
import io
import json
import sqlite3
import time
from contextlib import closing

import pytest

from experiment_util import cli
from trialkit.manager.store import Store
from trialkit.statuses import PREEMPTED, RUNNING, SUCCEEDED
from trialkit.web import queries

pytestmark = pytest.mark.usefixtures("home")  # conftest's: TRIALKIT_HOME in the test's tmp_path

EXP = "d0a7e4c1"
HOUR = 3600.0
PAUSED, STEADY, GOING = f"{EXP}-00000", f"{EXP}-00001", f"{EXP}-00002"


def _shift(db: sqlite3.Connection, trial: str, seconds: float, up_to_id: int = 1 << 62) -> None:
    """Move a trial's status rows (up to row `up_to_id`) and its start `seconds` into the past."""
    db.execute("UPDATE statuses SET time=time-? WHERE trial=? AND id<=?", (seconds, trial, up_to_id))
    db.execute("UPDATE trials SET started=started-?, created=created-? WHERE id=?", (seconds, seconds, trial))


@pytest.fixture
def stored(home):
    """PAUSED ran about 0.2 s, stood paused an hour, ran again briefly and succeeded; STEADY ran 30 s once;
    GOING has run 100 s and runs still."""
    folder = home / "experiments" / EXP
    folder.mkdir(parents=True)
    store = Store.in_dir(folder)
    try:
        store.create_experiment(EXP, config={"searchSpace": {"x": {"_type": "choice", "_value": [1]}}},
                                status="STOPPED")
        for sequence, trial in enumerate((PAUSED, STEADY, GOING)):
            store.add_trial(EXP, trial, sequence=sequence, parameters={"x": 1}, token=None)
        store.set_status(PAUSED, RUNNING)
        time.sleep(0.2)
        store.set_status(PAUSED, PREEMPTED, reason="paused")
        store.set_status(STEADY, RUNNING)
        store.set_status(STEADY, SUCCEEDED, exit_code=0)
        store.set_status(GOING, RUNNING)
    finally:
        store.close()
    with closing(sqlite3.connect(folder / "trialkit.db")) as db, db:
        first_end = db.execute("SELECT MAX(id) FROM statuses WHERE trial=?", (PAUSED,)).fetchone()[0]
        _shift(db, PAUSED, HOUR, first_end)
        db.execute("UPDATE statuses SET time=time+30 WHERE trial=? AND status=?", (STEADY, SUCCEEDED))
        db.execute("UPDATE trials SET ended=ended+30 WHERE id=?", (STEADY,))
        _shift(db, GOING, 100)
    store = Store.in_dir(folder)
    try:  # the resume: PAUSED runs again and succeeds
        store.set_status(PAUSED, RUNNING)
        store.set_status(PAUSED, SUCCEEDED, exit_code=0)
    finally:
        store.close()
    return folder


def _seconds(cell: str) -> float:
    seconds = 0
    for part in cell.split(":"):
        seconds = seconds * 60 + int(part)
    return float(seconds)


def _expected(duration: float, trial: str, rounded: bool = False) -> None:
    """`rounded`: as the CLI shows it, to the second."""
    if trial == PAUSED:
        # Was an hour: the time from its first start to its last end.
        assert (0 if rounded else 0.2) <= duration < 5, duration
    elif trial == STEADY:
        assert duration == pytest.approx(30, abs=1)
    else:
        assert 100 <= duration < 200, duration  # running: counted to now (the CLI showed none)


def test_a_trials_duration_leaves_out_the_time_it_stood_paused_on_every_face(stored):
    listed = cli("trial", "list", EXP)
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    at = header.index("duration")
    cells = {line.split()[0]: line[at:].split()[0] for line in lines if line.startswith(EXP)}
    for trial in (PAUSED, STEADY, GOING):
        _expected(_seconds(cells[trial]), trial, rounded=True)
        shown = cli("trial", "show", trial)
        assert shown.returncode == 0, shown.stderr
        line = next(line for line in shown.stdout.splitlines() if line.startswith("duration"))
        _expected(_seconds(line.split()[1]), trial, rounded=True)

    exported = cli("experiment", "export", EXP)
    assert exported.returncode == 0, exported.stderr
    for row in json.loads(exported.stdout):
        _expected(row["duration"], row["trial_id"])
    as_csv = cli("experiment", "export", EXP, "--format", "csv")
    for row in csv.DictReader(io.StringIO(as_csv.stdout)):
        _expected(float(row["duration"]), row["trial_id"])

    with closing(sqlite3.connect(stored / "trialkit.db")) as db:
        db.row_factory = sqlite3.Row
        queries.register(db)
        page = queries.trials_page(db, EXP, queries.TrialQuery(sort="duration"))
        assert [row["id"] for row in page["rows"]] == [PAUSED, STEADY, GOING]  # by the time they ran
        for row in page["rows"]:
            _expected(row["duration"], row["id"])
            _expected(queries.trial(db, EXP, row["id"])["duration"], row["id"])
        queued = queries.queue(db, EXP, None)
        assert [row["id"] for row in queued] == [GOING]
        _expected(queued[0]["duration"], GOING)
