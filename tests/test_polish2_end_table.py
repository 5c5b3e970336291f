"""The end of `trialkit run` prints a screenful of trials, not every one (a Hyperband run printed 260 rows
before its "best:" line): the last SUMMARY_ROWS, a line saying so and naming `trialkit trial list ID` for the
rest. A real run of 22 trials (a grid of 22 points), two past the screenful; and one Ctrl-C'd at its last trial.
"""
from __future__ import annotations

import re

import pytest

from experiment_util import cli, experiment, experiment_id, interrupted_after
from trialkit.control.run import SUMMARY_ROWS

POINTS = SUMMARY_ROWS + 2
REPORT = "import trialkit\ntrialkit.report_final_result(trialkit.get_next_parameter()['x'])\n"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))


def test_the_end_of_a_run_prints_the_last_screenful_of_trials_and_names_trial_list(tmp_path):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": list(range(POINTS))}}, REPORT,
                        trialConcurrency=4, maxTrialNumber=POINTS, tuner={"name": "GridSearch"})
    done = cli("run", config, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    exp = experiment_id(done.stdout.splitlines()[0])
    end = done.stdout.split(f"\nexperiment {exp} DONE after ")[1]
    rows = re.findall(rf"^({exp}-\d+) +SUCCEEDED", end, re.MULTILINE)
    assert rows == [f"{exp}-{n:05d}" for n in range(2, POINTS)], end  # the last SUMMARY_ROWS, in order
    assert f"(the last {SUMMARY_ROWS} of {POINTS} trials; `trialkit trial list {exp}` lists them all)" in end
    assert end.index("lists them all") < end.index("\nbest: ")
    listed = cli("trial", "list", exp)
    assert len(re.findall(rf"^{exp}-\d+ ", listed.stdout, re.MULTILINE)) == POINTS  # the rest are where it says


# The grid's last point waits for the Ctrl-C; the others report at once.
LAST_WAITS = REPORT.replace("import trialkit\n", "import time, trialkit\nif trialkit.get_next_parameter()['x'] == LAST:\n"
                                                  "    time.sleep(120)\n").replace("LAST", str(POINTS - 1))


def test_the_end_of_a_ctrl_c_run_prints_the_same_screenful(tmp_path):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": list(range(POINTS))}}, LAST_WAITS,
                        trialConcurrency=4, maxTrialNumber=POINTS, tuner={"name": "GridSearch"}, trialGraceSeconds=3)
    said = []
    exp = interrupted_after(config, POINTS - 1, out=said)
    end = "\n".join(said)
    rows = re.findall(rf"^({exp}-\d+) +[A-Z]", end, re.MULTILINE)
    assert rows == [f"{exp}-{n:05d}" for n in range(2, POINTS)], end
    assert f"(the last {SUMMARY_ROWS} of {POINTS} trials; `trialkit trial list {exp}` lists them all)" in end
