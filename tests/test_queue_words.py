"""A trial put back in its experiment's queue says what it waits for there, whatever put it back (one function,
queue.requeued): a restart after a failure not its own ("restart 1 of 1 after: ...") and a preemption by
someone else ("preempted: queued to resume") read "...; waiting for a free slot: 1 of 1 in use by this
experiment's trials (trialConcurrency: ...)" while the slots are full, as an activated one does
(tests/test_waiting_words.py); an experiment resumed with one slot says it of its second resumed trial.

Real runs: two trials on two slots, the experiment's trialConcurrency lowered to 1 while both run, then one
trial's keeper is killed (SIGKILL: a restart) or stopped from outside (SIGTERM: a preemption); the other holds
the one slot until a gate file exists.
"""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from experiment_util import experiment, experiment_id, reported, start_cli, trial_status
from harness import wait_until
from test_waiting_words import WAIT, end_failed_run, ok
from trialkit import layout

pytestmark = pytest.mark.usefixtures("home")

# A stop (SIGTERM) ends it as a trial that saved its checkpoint ends: exit 143 (PREEMPTED).
SCRIPT = """
import pathlib, signal, sys, time, trialkit
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
p = trialkit.get_next_parameter()
trialkit.report_intermediate_result(p["x"])
while not pathlib.Path({gate!r}).exists():
    time.sleep(0.05)
trialkit.report_final_result(p["x"])
"""


def slot_words(exp: str) -> str:
    return (f"waiting for a free slot: 1 of 1 in use by this experiment's trials (trialConcurrency: `trialkit "
            f"experiment update {exp} --trial-concurrency N` changes it)")


def ended(proc: subprocess.Popen, gate) -> int:
    """The run's exit status once its trials may end (the gate); a run left going is Ctrl-C'd, never left."""
    gate.touch()
    try:
        return proc.wait(timeout=WAIT * 2)
    finally:
        end_failed_run(proc, gate)


def two_running(tmp_path, home, gate):
    """`trialkit run` of two trials on two slots, both reporting, its trialConcurrency then lowered to 1: (the run,
    the experiment's id)."""
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2]}}, SCRIPT.format(gate=str(gate)),
                        trialConcurrency=2, maxTrialNumber=2, maxTrialRestarts=1, trialGraceSeconds=5,
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        wait_until(lambda: reported(home, f"{exp}-00000") and reported(home, f"{exp}-00001"), WAIT,
                   "both trials to report")
        ok("experiment", "update", exp, "--trial-concurrency", "1")
    except BaseException:
        ended(proc, gate)
        raise
    return proc, exp


def status_line(trial: str) -> str:
    return next(line for line in ok("trial", "show", trial).splitlines() if line.startswith("status "))


@pytest.mark.parametrize("signum, says", [
    (signal.SIGKILL, "restart 1 of 1 after: the keeper ended (signal SIGKILL"),
    (signal.SIGTERM, "preempted: queued to resume"),
])
def test_a_trial_put_back_while_the_slots_are_full_says_it_waits_for_one(tmp_path, home, signum, says):
    gate = tmp_path / "gate"
    proc, exp = two_running(tmp_path, home, gate)
    first = f"{exp}-00000"
    try:
        pidfile = layout.pidfile_path(home / "experiments" / exp / "trials" / first)
        os.kill(int(pidfile.read_text().split()[0]), signum)
        wait_until(lambda: trial_status(home, first) == "WAITING", WAIT, "the trial to be queued again")
        line = status_line(first)
        assert line.startswith(f"status         WAITING: {says}") and line.endswith(f"; {slot_words(exp)}"), line
    finally:
        code = ended(proc, gate)
    assert code == 0
    assert trial_status(home, first) == trial_status(home, f"{exp}-00001") == "SUCCEEDED"


def test_a_resume_with_one_slot_says_its_second_trial_waits_for_it(tmp_path, home):
    gate = tmp_path / "gate"
    proc, exp = two_running(tmp_path, home, gate)
    first, second = f"{exp}-00000", f"{exp}-00001"
    proc.send_signal(signal.SIGINT)  # both stop with their checkpoints: PREEMPTED, for `experiment resume`
    proc.communicate(timeout=WAIT)
    assert trial_status(home, first) == trial_status(home, second) == "PREEMPTED"
    resumed = start_cli("experiment", "resume", exp)
    try:
        wait_until(lambda: trial_status(home, first) == "RUNNING", WAIT, "the first trial to take the slot")
        assert status_line(second) == f"status         WAITING: resumed: it goes on from its checkpoint; {slot_words(exp)}"
    finally:
        code = ended(resumed, gate)
    assert code == 0
    assert trial_status(home, first) == trial_status(home, second) == "SUCCEEDED"
