"""trialkit's `nni` says it stands in for nni to a user who runs an NNI script by hand, not in every trial's log:
under a keeper the note is left out. A real `trialkit run` of two NNI-style trials (this Python has no nni), their
logs read back with `trial logs`; the same script run by hand.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from experiment_util import cli, experiment, experiment_id

pytestmark = pytest.mark.usefixtures("home")  # conftest's: TRIALKIT_HOME in the test's tmp_path

NOTE = "trialkit: nni is not installed in this Python; trialkit's nni serves the trial API"
NNI_TRIAL = ("import sys, nni\nprint('to stderr', file=sys.stderr, flush=True)\n"
             "nni.report_final_result(nni.get_next_parameter().get('x', 0))\n")


def test_the_stand_in_note_is_in_no_trials_log_and_said_to_a_user_by_hand(tmp_path):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2]}}, NNI_TRIAL, maxTrialNumber=2,
                        trialConcurrency=2, tuner={"name": "GridSearch"})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    for trial in (f"{exp}-00000", f"{exp}-00001"):
        logs = cli("trial", "logs", trial)
        assert logs.returncode == 0, logs.stderr
        assert "to stderr" in logs.stdout, logs.stdout  # its stderr is what `trial logs` shows
        assert NOTE not in logs.stdout, logs.stdout

    no_nni = "import importlib.metadata as m\ntry: m.distribution('nni')\nexcept m.PackageNotFoundError: print('none')"
    assert subprocess.run([sys.executable, "-c", no_nni], capture_output=True, text=True).stdout == "none\n"
    script = config.parent / "trial.py"  # by hand it has no parameters: x is 0
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TRIALKIT_KEEPER")}
    by_hand = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                             cwd=tmp_path, env=environ)
    assert by_hand.returncode == 0, by_hand.stderr
    assert by_hand.stderr.count(NOTE) == 1, by_hand.stderr
