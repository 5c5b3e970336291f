"""One run, one duration: the end of `trialkit run` ("DONE after [mm:ss]"), `experiment show`'s elapsed and the
page's give the time the run ran as its end wrote it in manager.json (results.experiment_ran), also while the
process that ran it lives on (its manager's pid alive: a notebook that ran it, a run still ending), when they
counted on to now. A real run, through the CLI's main in a Python process that then waits to be told to exit.
"""
from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from experiment_util import cli, experiment, experiment_id
from trialkit.control.progress import duration
from trialkit.web import queries

pytestmark = pytest.mark.usefixtures("home")

X = {"x": {"_type": "choice", "_value": [1]}}
HELD_SECONDS = 2.5  # how long the run's process lives on after its run: past any rounding


def page_elapsed(home: Path, exp: str) -> float:
    with closing(sqlite3.connect(f"file:{home / 'experiments' / exp / 'trialkit.db'}?mode=ro", uri=True)) as db:
        db.row_factory = sqlite3.Row
        queries.register(db)
        return queries.summary(db, exp)["elapsed"]


def test_the_end_line_experiment_show_and_the_page_give_one_duration(tmp_path, home):
    config = experiment(tmp_path, X, "import time, trialkit\ntrialkit.get_next_parameter()\ntime.sleep(1)\n"
                        "trialkit.report_final_result(1)\n", maxTrialNumber=1, trialConcurrency=1)
    lives_on = (f"import sys\nfrom trialkit.cli import main\ncode = main(['run', {str(config)!r}])\n"
                "print('returned', code, flush=True)\nsys.stdin.readline()\n")
    proc = subprocess.Popen([sys.executable, "-c", lives_on], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        exp = experiment_id(proc.stdout.readline())
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("returned"):
                break
        assert lines[-1] == "returned 0\n", lines
        end = next(line for line in lines if line.startswith(f"experiment {exp} DONE after"))
        time.sleep(HELD_SECONDS)  # its run over, its process (the manager's pid in manager.json) alive
        shown = cli("experiment", "show", exp).stdout
        page = page_elapsed(home, exp)
        said = re.search(r"after \[(\S+?)\]", end).group(1)
        elapsed = next(line.split()[1] for line in shown.splitlines() if line.startswith("elapsed"))
        assert said == elapsed == duration(page), (end, shown, page)
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=60)
        assert page_elapsed(home, exp) == page  # the same once its process is gone
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()
