"""One run, one duration: the end of `trialkit run` ("DONE after [mm:ss]"), `experiment show`'s elapsed and the
page's give the time the run ran as its end wrote it in manager.json (results.experiment_ran), also while the
run's process is still ending (its manager's pid alive: the page, `experiment show` from another terminal),
when they counted on to now. A real run, held (SIGSTOP) just after it printed its end line.
"""
from __future__ import annotations

import os
import re
import signal
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from experiment_util import cli, experiment, experiment_id, start_cli
from trialkit.control.progress import duration
from trialkit.web import queries

pytestmark = pytest.mark.usefixtures("home")

X = {"x": {"_type": "choice", "_value": [1]}}
HELD_SECONDS = 2.5  # how long the run's process stays stopped after its end line: past any rounding


def page_elapsed(home: Path, exp: str) -> float:
    with closing(sqlite3.connect(f"file:{home / 'experiments' / exp / 'trialkit.db'}?mode=ro", uri=True)) as db:
        db.row_factory = sqlite3.Row
        queries.register(db)
        return queries.summary(db, exp)["elapsed"]


def test_the_end_line_experiment_show_and_the_page_give_one_duration(tmp_path, home):
    config = experiment(tmp_path, X, "import time, trialkit\ntrialkit.get_next_parameter()\ntime.sleep(1)\n"
                        "trialkit.report_final_result(1)\n", maxTrialNumber=1, trialConcurrency=1)
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        end = next(line for line in proc.stdout if line.startswith(f"experiment {exp} DONE after"))
        proc.send_signal(signal.SIGSTOP)  # its manager's pid still alive, its run over
        try:
            time.sleep(HELD_SECONDS)
            shown = cli("experiment", "show", exp).stdout
            page = page_elapsed(home, exp)
        finally:
            proc.send_signal(signal.SIGCONT)
        said = re.search(r"after \[(\S+?)\]", end).group(1)
        elapsed = next(line.split()[1] for line in shown.splitlines() if line.startswith("elapsed"))
        assert said == elapsed == duration(page), (end, shown, page)
        proc.wait(timeout=60)
        assert page_elapsed(home, exp) == page  # the same once its process is gone
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
