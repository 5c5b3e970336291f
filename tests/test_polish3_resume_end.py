"""A run SIGKILLed while its trial runs; the trial's keeper outlives it and the trial ends while nobody listens;
`experiment resume` collects what it left. `trial show` then tells the trial's true story: ended when its
keeper said it ended (not when the resume read it), one WAITING, one RUNNING, one end. Real `trialkit run`.
"""
from __future__ import annotations

import time

import pytest

from conftest import tagged_processes
from experiment_util import cli, experiment, sigkilled_while_running
from harness import wait_until

pytestmark = pytest.mark.usefixtures("home")

X = {"x": {"_type": "choice", "_value": [1]}}
# Reports 30 steps over about 6 s, then its final result: it outlives a kill of the run by a few seconds.
STEADY = "import time, trialkit\np = trialkit.get_next_parameter()\nfor i in range(30):\n" \
         "    trialkit.report_intermediate_result(i)\n    time.sleep(0.2)\ntrialkit.report_final_result(p['x'])\n"


def shown(trial: str) -> dict:
    """`trial show`'s fields (name -> value) and its history as (status, source) pairs."""
    done = cli("trial", "show", trial)
    assert done.returncode == 0, done.stderr
    head, _, history = done.stdout.partition("history:\n")
    fields = dict(line.split(None, 1) if " " in line.strip() else (line, "") for line in head.splitlines())
    fields["history"] = [tuple(line.split()[2:4]) for line in history.splitlines()]
    return fields


def test_a_trial_that_ended_while_its_run_was_killed_keeps_its_end_time_and_one_of_each_status(tmp_path,
                                                                                               no_process_left):
    config = experiment(tmp_path, X, STEADY, maxTrialNumber=1, trialConcurrency=1)
    exp, trial = sigkilled_while_running(config, tmp_path / "home", reports=3)
    wait_until(lambda: not tagged_processes(no_process_left), 120, "the keeper to see its trial end")
    gone = time.time()
    time.sleep(3)  # the resume comes well after the end: an end time taken from it shows

    resumed = cli("experiment", "resume", exp)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    fields = shown(trial)
    assert fields["status"] == "SUCCEEDED"
    assert fields["history"] == [("WAITING", "control"), ("RUNNING", "keeper"), ("SUCCEEDED", "keeper")]
    ended = time.mktime(time.strptime(fields["ended"], "%Y-%m-%d %H:%M:%S"))
    assert ended <= gone, (fields["ended"], time.strftime("%H:%M:%S", time.localtime(gone)))
