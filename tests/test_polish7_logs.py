"""`trial logs` of a trial whose command sends its output to a file (`python3 train.py > train.log 2>&1`, as the
keeper's warning about a pipe tells to write) says where it went, in one line, beside "printed nothing": the
file and the directory it is in (the trial's copy of the code). Real runs; the file is read where it says.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from experiment_util import cli, experiment, experiment_id

pytestmark = pytest.mark.usefixtures("home")

X = {"x": {"_type": "choice", "_value": [1]}}
TALKS = "print('epoch 1: loss 0.5', flush=True)\n"


def test_trial_logs_points_to_the_file_a_redirect_sent_the_output_to(tmp_path):
    config = experiment(tmp_path, X, TALKS, maxTrialNumber=1, trialCommand="python3 trial.py > train.log 2>&1")
    exp = experiment_id(cli("run", config).stdout.splitlines()[0])
    done = cli("trial", "logs", f"{exp}-00000")
    assert (done.returncode, done.stdout) == (0, "")
    said = re.fullmatch(r"trial \S+ printed nothing \(its stdout and stderr are empty\): its command sent its output "
                        r"to train\.log in (\S+)\n", done.stderr)
    assert said, done.stderr
    assert (Path(said.group(1)) / "train.log").read_text() == "epoch 1: loss 0.5\n"  # it is there
    # Where no copy of the code is on this machine (a pod's trial, a copy removed), it names the trial's own.
    shutil.rmtree(said.group(1))
    assert cli("trial", "logs", f"{exp}-00000").stderr.endswith(
        ": its command sent its output to train.log in its code directory where it ran ($TRIALKIT_CODE_DIR)\n")


def test_an_absolute_target_and_errors_alone_are_said_as_they_are(tmp_path):
    log = tmp_path / "elsewhere.log"
    config = experiment(tmp_path, X, TALKS, maxTrialNumber=1, trialCommand=f"python3 trial.py >> {log}")
    exp = experiment_id(cli("run", config).stdout.splitlines()[0])
    assert cli("trial", "logs", f"{exp}-00000").stderr.endswith(f": its command sent its output to {log}\n")
    assert log.read_text() == "epoch 1: loss 0.5\n"
    # Only its errors to a file: its output is in the log, and nothing more is said.
    config = experiment(tmp_path, X, TALKS, name="errors", maxTrialNumber=1, trialCommand="python3 trial.py 2> e.log")
    exp = experiment_id(cli("run", config).stdout.splitlines()[0])
    done = cli("trial", "logs", f"{exp}-00000")
    assert (done.stdout, done.stderr) == ("epoch 1: loss 0.5\n", "")
