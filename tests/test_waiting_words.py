"""A trial that waits says what for: an activated trial queued behind its experiment's own trials reads
"waiting for a free slot: 1 of 1 in use by this experiment's trials (trialConcurrency: ...)" in `trial list`'s
why column and `trial show`, not "activated" (a newcomer read that and waited for something to happen).

A real `trialkit run` with one slot: trial 0 is paused, trial 1 takes the slot and holds it (a gate file), trial 0
is activated and waits; the gate opens and the run ends.
"""
from __future__ import annotations

import re
import signal
import subprocess
from typing import Tuple

import pytest

from experiment_util import cli, experiment, experiment_id, reported, start_cli, trial_status
from harness import wait_until

pytestmark = pytest.mark.usefixtures("home")
WAIT = 60.0  # an upper bound for a loaded machine; never waited for on success

# Trial 0 (hold=1) reports until it is paused (SIGTERM: exit 143), then, activated, ends; trial 1 holds its slot
# till the gate file exists.
SCRIPT = """
import pathlib, time, trialkit
if trialkit.get_next_parameter()["hold"] and not int(__import__("os").environ["TRIALKIT_RESTART_COUNT"]):
    while True:
        trialkit.report_intermediate_result(1)
        time.sleep(0.2)
while not pathlib.Path({gate!r}).exists():
    time.sleep(0.05)
trialkit.report_final_result(1)
"""


def end_failed_run(proc: subprocess.Popen, gate) -> None:
    """A run the test left going (it failed): its trials end as a user's Ctrl-C ends them, none left running."""
    if proc.poll() is None:
        gate.touch()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def started(config, home, gate) -> Tuple[subprocess.Popen, str]:
    """`trialkit run CONFIG` in the background, once its trial 0 has reported: (the run, the experiment's id)."""
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        wait_until(lambda: reported(home, f"{exp}-00000") >= 1, WAIT, "trial 0 to report")
    except BaseException:
        end_failed_run(proc, gate)
        raise
    return proc, exp


def ok(*args) -> str:
    done = cli(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def trial_0_paused_and_activated_behind_trial_1(tmp_path, home):
    """Two trials, one at a time: trial 0 paused as it trains, trial 1 takes the slot, trial 0 activated behind
    it. (the run, the experiment, trial 0, trial 1, the gate that lets them end)."""
    gate = tmp_path / "gate"
    config = experiment(tmp_path, {"hold": {"_type": "choice", "_value": [1, 0]}}, SCRIPT.format(gate=str(gate)),
                        trialConcurrency=1, maxTrialNumber=2, trialGraceSeconds=10,
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    proc, exp = started(config, home, gate)
    held, other = f"{exp}-00000", f"{exp}-00001"
    try:
        ok("trial", "pause", held)
        wait_until(lambda: trial_status(home, other) == "RUNNING", WAIT, "trial 1 to take the freed slot")
        ok("trial", "activate", held)
    except BaseException:
        end_failed_run(proc, gate)
        raise
    return proc, exp, held, other, gate


def test_an_activated_trial_behind_its_experiments_own_trials_says_it_waits_for_a_slot(tmp_path, home):
    proc, exp, held, other, gate = trial_0_paused_and_activated_behind_trial_1(tmp_path, home)
    try:
        words = (f"activated; waiting for a free slot: 1 of 1 in use by this experiment's trials (trialConcurrency: "
                 f"`trialkit experiment update {exp} --trial-concurrency N` changes it)")
        assert f"status         WAITING: {words}" in ok("trial", "show", held)
        row = next(line for line in ok("trial", "list", exp).splitlines() if line.startswith(held))
        assert re.search(r"\bWAITING\b", row) and row.rstrip().endswith(words), row
        gate.touch()
        assert proc.wait(timeout=WAIT) == 0, proc.stderr.read()
    finally:
        end_failed_run(proc, gate)
    assert trial_status(home, held) == trial_status(home, other) == "SUCCEEDED"


def test_pausing_a_waiting_trial_says_it_was_not_running_and_starts_only_when_activated(tmp_path, home):
    """`trial pause` of a trial that waits in the queue said it was asked to save a checkpoint as it stopped, as
    if it ran (a newcomer's, session 11)."""
    proc, exp, held, other, gate = trial_0_paused_and_activated_behind_trial_1(tmp_path, home)
    try:
        assert trial_status(home, held) == "WAITING"
        said = ok("trial", "pause", held)
        assert said.startswith(f"paused trial {held}: it was waiting, not running: it does not start until "
                               f"`trialkit trial activate {held}`"), said
        assert trial_status(home, held) == "PREEMPTED"
        gate.touch()
        wait_until(lambda: trial_status(home, other) == "SUCCEEDED", WAIT, "trial 1 to end")
        assert trial_status(home, held) == "PREEMPTED"  # the freed slot did not start it
        # It holds no checkpoint (its script saves none): activate says it starts from the beginning, not that it
        # resumes from one (newcomer21 read "queued to resume from its checkpoint" of a trial that held none).
        assert ok("trial", "activate", held).endswith(f"activated trial {held}: queued to start from the beginning "
                                                      "(it holds no checkpoint)\n")
        assert proc.wait(timeout=WAIT) == 0, proc.stderr.read()
    finally:
        end_failed_run(proc, gate)
    assert trial_status(home, held) == "SUCCEEDED"


def one_trial_paused_and_activated(tmp_path, home, concurrency: int, pause: str):
    """A run of one trial (of `concurrency` at once), paused (`pause`: "trial" or "experiment") and the trial
    activated: (the run, the experiment's id, the trial's, the gate that lets the trial end)."""
    gate = tmp_path / "gate"
    config = experiment(tmp_path, {"hold": {"_type": "choice", "_value": [1]}}, SCRIPT.format(gate=str(gate)),
                        trialConcurrency=concurrency, maxTrialNumber=1, trialGraceSeconds=10)
    proc, exp = started(config, home, gate)
    trial = f"{exp}-00000"
    try:
        ok(pause, "pause", exp if pause == "experiment" else trial)
        wait_until(lambda: trial_status(home, trial) == "PREEMPTED", WAIT, "the trial to be paused")
        ok("trial", "activate", trial)
    except BaseException:
        end_failed_run(proc, gate)
        raise
    return proc, exp, trial, gate


def test_a_trial_activated_in_a_paused_experiment_says_it_waits_for_the_experiment(tmp_path, home):
    proc, exp, trial, gate = one_trial_paused_and_activated(tmp_path, home, 1, "experiment")
    try:
        assert (f"status         WAITING: activated; waiting for its experiment, paused, to be activated (`trialkit "
                f"experiment activate {exp}`)") in ok("trial", "show", trial)
        gate.touch()
        ok("experiment", "activate", exp)
        assert proc.wait(timeout=WAIT) == 0, proc.stderr.read()
    finally:
        end_failed_run(proc, gate)
    assert trial_status(home, trial) == "SUCCEEDED"


def test_a_trial_activated_with_a_slot_free_starts_at_once_and_its_history_says_only_activated(tmp_path, home):
    proc, _, trial, gate = one_trial_paused_and_activated(tmp_path, home, 2, "trial")
    try:
        gate.touch()
        assert proc.wait(timeout=WAIT) == 0, proc.stderr.read()
    finally:
        end_failed_run(proc, gate)
    history = ok("trial", "show", trial).split("history:")[1]
    assert [line.split(None, 4)[-1] for line in history.splitlines() if " WAITING " in line][-1] == "activated"


# The same run from a Determined config: its user wrote searcher.max_concurrent_trials, not trialConcurrency.
DETERMINED_CONFIG = """
name: waits
entrypoint: python3 trial.py
hyperparameters: {hold: {type: categorical, vals: [1, 0]}}
searcher: {name: grid, metric: x, max_length: 1, max_concurrent_trials: 1}
max_restarts: 0
"""


def test_a_determined_configs_waiting_trial_names_the_key_its_user_wrote(tmp_path, home):
    gate = tmp_path / "gate"
    context = tmp_path / "context"
    context.mkdir()
    (context / "trial.py").write_text(SCRIPT.format(gate=str(gate)))
    (context / "exp.yaml").write_text(DETERMINED_CONFIG)
    proc = start_cli("run", context / "exp.yaml", context)
    try:
        exp = experiment_id(proc.stdout.readline())
        held, other = f"{exp}-00000", f"{exp}-00001"
        wait_until(lambda: reported(home, held) >= 1, WAIT, "trial 0 to report")
        ok("trial", "pause", held)
        wait_until(lambda: trial_status(home, other) == "RUNNING", WAIT, "trial 1 to take the freed slot")
        ok("trial", "activate", held)
        words = (f"activated; waiting for a free slot: 1 of 1 in use by this experiment's trials "
                 f"(searcher.max_concurrent_trials: `trialkit experiment update {exp} --trial-concurrency N` "
                 f"changes it)")
        assert f"status         WAITING: {words}" in ok("trial", "show", held)
        gate.touch()
        assert proc.wait(timeout=WAIT) == 0, proc.stderr.read()
    finally:
        end_failed_run(proc, gate)
