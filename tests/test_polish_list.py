"""`experiment list`'s trials cell says what it counts (a newcomer read "succeeded 1/4" and could not tell what
4 was): the trials the experiment made and how many of them succeeded or failed (polish4: the non-zero counts), as
the page's Trials and By status columns count them. A real experiment: a grid of 3 points under maxTrialNumber 5,
one trial failing.
"""
from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from experiment_util import cli, experiment, experiment_id
from trialkit.web import queries

pytestmark = pytest.mark.usefixtures("home")  # conftest's: TRIALKIT_HOME in the test's tmp_path

GRID = {"x": {"_type": "choice", "_value": [0, 1, 2]}}
# x == 0 fails (exit 1); the others report x.
SOME_FAIL = "import sys, trialkit\nx = trialkit.get_next_parameter()['x']\nif x == 0:\n    sys.exit(1)\n" \
            "trialkit.report_final_result(x)\n"


def test_the_list_says_how_many_trials_were_made_and_how_many_succeeded_as_the_page_counts(tmp_path, home):
    config = experiment(tmp_path, GRID, SOME_FAIL, maxTrialNumber=5, tuner={"name": "GridSearch"})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])

    listed = cli("experiment", "list")
    assert listed.returncode == 0, listed.stderr
    header, _, line = listed.stdout.splitlines()[:3]
    assert header.split() == ["id", "name", "status", "trials", "created"]
    # 3 made (the grid's points, not maxTrialNumber's 5), 2 of them succeeded, 1 failed; the column no
    # wider than that.
    cell = line[header.index("trials"):header.index("created")].rstrip()
    assert cell == "3 (2 succeeded, 1 failed)", line

    with closing(sqlite3.connect(home / "experiments" / exp / "trialkit.db")) as db:
        db.row_factory = sqlite3.Row
        queries.register(db)
        page = queries.summary(db, exp)
    # The page's Trials and By status.
    assert (page["trials"], page["counts"]["SUCCEEDED"], page["counts"]["FAILED"]) == (3, 2, 1)
