"""The progress line's best is one of the trials its counts say ended: a trial that reported the best final
result and still runs is counted running, so it is not yet the best the line names. Real `trialkit run`, two
trials at once: x=5 reports its final result first and runs on until x=1 has ended.
"""
from __future__ import annotations

import re

import pytest

from experiment_util import cli, experiment

pytestmark = pytest.mark.usefixtures("home")

X = {"x": {"_type": "choice", "_value": [5, 1]}}
# x=5: its final result, then it runs on until x=1 ended (and a little more). x=1: ends once x=5's result had
# time to reach the manager.
LINGERS = """
import os, time, trialkit
marks = {marks!r}
x = trialkit.get_next_parameter()["x"]
def wait_for(name):
    while not os.path.exists(os.path.join(marks, name)):
        time.sleep(0.05)
if x == 5:
    trialkit.report_final_result(x)
    open(os.path.join(marks, "five-reported"), "w").close()
    wait_for("one-ended")
    time.sleep(2)
else:
    wait_for("five-reported")
    time.sleep(1.5)
    trialkit.report_final_result(x)
    open(os.path.join(marks, "one-ended"), "w").close()
"""


def test_the_line_names_as_best_only_a_trial_it_counts_as_ended(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    config = experiment(tmp_path, X, LINGERS.format(marks=str(marks)), maxTrialNumber=2, trialConcurrency=2,
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    ends = [line for line in done.stdout.splitlines() if line.startswith("trial ") and " ended: " in line]
    assert len(ends) == 2, done.stdout
    said = [re.match(r"trial (\S+) SUCCEEDED final=(\d) \| .* (\d) done, (\d) running.* \| best (\d) \((\S+): x=\d\)$",
                     line) for line in ends]
    assert all(said), ends
    (first, one, *counts, best, trial), last = said[0].groups(), said[1].groups()
    # x=1 ended first, x=5 still ran: the best of what ended is x=1, though x=5 had reported more.
    assert (one, counts, best, trial) == ("1", ["1", "1"], "1", first), ends
    assert last[1:] == ("5", "2", "0", "5", last[0]), ends
