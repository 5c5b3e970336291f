"""The keeper's start warnings reach the experiment's console, once each: a user reads `trialkit run`'s output (or a
detached run's manager.log), not each trial's log. A trial command with a pipe (`python3 train.py | tee train.log`)
warned only in the trial's stderr.log, and a Ctrl-C then lost the checkpoint with nothing on the console but
USER_CANCELED. The warning travels in the keeper's RUNNING record, through the manager, as on every platform.

And what the warning tells the user to write instead works: without the pipe's reader, a stop leaves the trainer's
handler time to save.
"""
from __future__ import annotations

import signal
import time

import pytest

from experiment_util import cli, experiment, experiment_id, start_cli
from keeper_util import PYTHON, keeper

PIPED = "the command pipes its output (... | cat)"
SCRIPT = """
import trialkit
trialkit.report_final_result(trialkit.get_next_parameter()["x"])
"""


def console_warnings(out: str) -> list:
    return [line for line in out.splitlines() if PIPED in line]


@pytest.mark.usefixtures("home")
def test_a_pipe_in_the_trial_command_is_said_once_on_the_console_for_two_trials(tmp_path):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2]}}, SCRIPT, trialConcurrency=2,
                        maxTrialNumber=2, trialCommand="python3 trial.py | cat",
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    proc = start_cli("run", config)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    exp = experiment_id(out.splitlines()[0])
    [line] = console_warnings(out)
    assert line.startswith(f"trial {exp}-0000") and f": warning: {PIPED}: a stop signals" in line, line
    assert "leave the pipe out" in line and "> train.log 2>&1" in line, line
    for trial in (f"{exp}-00000", f"{exp}-00001"):  # both keepers said it; the console said it once
        logs = cli("trial", "logs", trial)
        assert PIPED in logs.stdout, logs.stdout + logs.stderr


def test_a_detached_run_says_it_once_in_its_log(tmp_path, home):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2]}}, SCRIPT, trialConcurrency=2,
                        maxTrialNumber=2, trialCommand="python3 trial.py | cat",
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    started = cli("run", config, "--detach")
    assert started.returncode == 0, started.stderr
    exp = experiment_id(started.stdout.splitlines()[0])
    deadline = time.monotonic() + 120
    while "DONE" not in cli("experiment", "show", exp).stdout:
        assert time.monotonic() < deadline, cli("experiment", "show", exp).stdout
        time.sleep(0.3)
    log = (home / "experiments" / exp / "manager.log").read_text()
    assert len(console_warnings(log)) == 1, log


# A trainer that saves on SIGTERM, as AdaptDL's does, and says so on its output first.
SAVER = """
import signal, sys, time
def save(signum, frame):
    time.sleep(1)  # the pipe's reader, stopped with it, is gone by now (a loaded machine: a second)
    print("saving", flush=True)
    open(sys.argv[1], "w").write("saved")
    sys.exit(143)
signal.signal(signal.SIGTERM, save)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("output, saves", [("| tee {log}", False), ("> {log} 2>&1", True)])
def test_a_redirect_saves_where_a_pipe_does_not(trial_env, tmp_path, output, saves):
    (tmp_path / "saver.py").write_text(SAVER)
    saved, log = tmp_path / "saved", tmp_path / "train.log"
    k = keeper(["/bin/sh", "-c", f"{PYTHON} {tmp_path / 'saver.py'} {saved} {output.format(log=log)}"],
               {**trial_env, "TRIALKIT_GRACE_SECONDS": "10"})
    deadline = time.monotonic() + 60
    while "ready" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and k.proc.poll() is None, k.stderr.decode()
        time.sleep(0.05)
    k.signal(signal.SIGTERM)
    k.wait()
    assert saved.exists() == saves, k.stderr.decode()[-2000:]
    assert ("saving" in log.read_text()) == saves


@pytest.mark.parametrize("said, refused", [(["a line"], False), ([], False), ("a line", True), ([1], True),
                                           (["\ud800"], True), (["a line"] * 9, True)])
def test_the_manager_takes_warnings_only_as_a_few_lines_of_text(said, refused):
    from trialkit import records

    rec = records.status_record("RUNNING", {"warnings": said}, "t1", 0)
    assert (records.record_problem(rec) is not None) == refused


NO_FINAL_SCRIPT = """
import trialkit
trialkit.report_intermediate_result(trialkit.get_next_parameter()["x"])
"""


@pytest.mark.usefixtures("home")
def test_trials_without_a_final_result_are_said_once_on_the_console(tmp_path):
    """Code that reports no final result (Determined code under an NNI config, a forgotten call) leaves the tuner
    ranking nothing: the console says so once, with what to call, however many trials do it."""
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2, 3]}}, NO_FINAL_SCRIPT,
                        trialConcurrency=2, maxTrialNumber=3,
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    proc = start_cli("run", config)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    said = [line for line in out.splitlines() if "ended without a final result" in line]
    assert len(said) == 1 and ": warning: " in said[0] and "report_final_result" in said[0], out
