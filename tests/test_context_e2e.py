"""The trial context end to end: each local trial runs in its own copy of the code dir.

What `.trialignore` leaves out does not reach the trial, what a trial writes
stays in its copy, a context over the limit or one holding the experiment is
refused before anything starts, and a failing startup-hook.sh fails the trial
with its output in the trial's log.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from experiment_util import cli, experiment, experiment_id, export

ONE = {"x": {"_type": "choice", "_value": [1]}}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_trial_runs_in_its_own_copy_without_what_is_ignored(tmp_path, home):
    script = """
    import os, trialkit
    assert os.path.isfile("notes.txt") and not os.path.exists("data"), sorted(os.listdir("."))
    open("written.txt", "w").write("by the trial")
    trialkit.report_final_result(1)
    """
    config = experiment(tmp_path, ONE, script, maxTrialNumber=1)
    code = config.parent
    (code / "notes.txt").write_text("kept")
    (code / "data").mkdir()
    (code / "data" / "set.bin").write_bytes(b"\0" * 1024)
    (code / ".trialignore").write_text("data/\n")
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = export(experiment_id(done.stdout.splitlines()[0]))
    assert row["status"] == "SUCCEEDED"
    copy = Path(row["trial_dir"]) / "code"
    assert (copy / "written.txt").read_text() == "by the trial" and not (code / "written.txt").exists()
    assert (copy / "trial.py").read_text() == (code / "trial.py").read_text() and not (copy / "data").exists()


# `run --detach` refuses before it prints "started experiment ID" (an id that would not exist): one line alone.
DETACHED = pytest.mark.parametrize("detach", [[], ["--detach"]], ids=["foreground", "detached"])


@DETACHED
def test_a_context_over_the_limit_is_refused_before_anything_starts(tmp_path, home, detach):
    config = experiment(tmp_path, ONE, "pass\n", maxTrialNumber=1)
    with open(config.parent / "weights.bin", "wb") as f:
        f.truncate(96 * 1024 * 1024)  # sparse: its size counts, no disk is spent
    done = cli("run", config, *detach)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and not done.stdout, done.stdout + done.stderr
    assert "weights.bin" in done.stderr and ".trialignore" in done.stderr
    assert not (home / "experiments").exists()


@DETACHED
def test_an_experiment_inside_the_code_dir_is_refused(tmp_path, detach):
    config = experiment(tmp_path, ONE, "pass\n", maxTrialNumber=1, experimentWorkingDirectory="runs")
    done = cli("run", config, *detach)
    assert done.returncode == 2 and "inside the trial code directory" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and not done.stdout, done.stdout + done.stderr
    assert not any((config.parent / "runs").glob("*")), list((config.parent / "runs").glob("**/*"))  # no id left


def test_a_failing_startup_hook_fails_the_trial_with_its_output_in_the_log(tmp_path):
    config = experiment(tmp_path, ONE, "import trialkit\ntrialkit.report_final_result(1)\n", maxTrialNumber=1)
    (config.parent / "startup-hook.sh").write_text("echo fetching the data set\nexit 3\n")
    done = cli("run", config)
    assert done.returncode == 1, done.stdout + done.stderr  # no trial succeeded
    (row,) = export(experiment_id(done.stdout.splitlines()[0]))
    assert row["status"] == "FAILED" and row["exit_code"] == 3 and "startup-hook.sh failed" in row["reason"]
    logs = cli("trial", "logs", row["trial_id"])
    assert "fetching the data set" in logs.stdout and "startup-hook.sh failed with exit code 3" in logs.stdout
