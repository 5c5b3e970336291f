"""A folder named `trialkit` beside the user's work (the clone itself, seen from the directory it was cloned
into; a project's own folder of notes) is no package of trialkit's. A Python started there with the current
directory on its path (`python -m`, as the detached run, the keeper and the trial's helpers start) found it
first, took it for a namespace package and lost trialkit: `run --detach` died with a traceback and every
trial of a code dir holding one FAILED before its command started. The project's environment installs trialkit
so that a real package on the path wins over such a folder, as a pip-installed wheel always did."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiment_util import cli, experiment, experiment_id

SCRIPT = """
import trialkit
trialkit.report_final_result(trialkit.get_next_parameter()["x"])
"""
TRIALKIT = str(Path(sys.executable).parent / "trialkit")  # the command the README puts on PATH


def config_in(tmp_path: Path) -> Path:
    return experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2]}}, SCRIPT, maxTrialNumber=2,
                      tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})


@pytest.mark.usefixtures("home")
def test_run_detach_from_a_directory_holding_a_trialkit_folder(tmp_path):
    beside = tmp_path / "work"
    (beside / "trialkit").mkdir(parents=True)  # as the clone is, seen from where it was cloned
    started = subprocess.run([TRIALKIT, "run", str(config_in(tmp_path)), "--detach"], cwd=beside,
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0 and "Traceback" not in started.stderr, started.stdout + started.stderr
    exp = experiment_id(started.stdout.splitlines()[0])
    deadline = time.monotonic() + 120
    while "DONE" not in (shown := cli("experiment", "show", exp)).stdout:
        assert time.monotonic() < deadline and shown.returncode == 0, shown.stdout + shown.stderr
        time.sleep(0.3)
    assert shown.stdout.count("SUCCEEDED") == 2, shown.stdout


@pytest.mark.usefixtures("home")
def test_trials_of_a_code_dir_holding_a_trialkit_folder_run(tmp_path):
    config = config_in(tmp_path)
    (config.parent / "trialkit").mkdir()
    (config.parent / "trialkit" / "notes.txt").write_text("the project's own notes\n")
    done = subprocess.run([TRIALKIT, "run", str(config)], cwd=config.parent, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DONE" in done.stdout and "FAILED" not in done.stdout, done.stdout
