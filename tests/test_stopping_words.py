"""A trial stopped by a user whose script ignores SIGTERM runs on for its grace: meanwhile `trial list` and
`trial show` say RUNNING with why (queue.stopping: who asked, since when, when its grace ends), not RUNNING as if
nothing happened. NNI's statuses have no STOPPING: the reason says it.

Real runs: one trial whose script ignores SIGTERM and ends once a gate file exists (so the test need not wait the
grace out); `trial kill`, `trial pause`, `experiment stop`.
"""
from __future__ import annotations

import re

import pytest

from experiment_util import experiment, experiment_id, reported, start_cli, trial_status
from harness import wait_until
from test_waiting_words import WAIT, end_failed_run, ok

pytestmark = pytest.mark.usefixtures("home")

SCRIPT = """
import pathlib, signal, time, trialkit
signal.signal(signal.SIGTERM, signal.SIG_IGN)
p = trialkit.get_next_parameter()
trialkit.report_intermediate_result(p["x"])
while not pathlib.Path({gate!r}).exists():
    time.sleep(0.05)
"""
GRACE = 60  # longer than the test looks: it sees the trial within its grace


def stopping(who: str) -> str:
    return (rf"stopping since (\d\d:\d\d:\d\d): {re.escape(who)}; its grace of {GRACE} s ends at (\d\d:\d\d:\d\d), "
            r"then what still runs is killed")


def seconds(clock: str) -> int:
    hours, minutes, secs = map(int, clock.split(":"))
    return hours * 3600 + minutes * 60 + secs


@pytest.mark.parametrize("command, who", [
    (("trial", "kill", "{trial}"), "killed by `trialkit trial kill`"),
    (("trial", "pause", "{trial}"), "paused"),
    (("experiment", "stop", "{exp}"), "stopped by `trialkit experiment stop`"),
])
def test_a_trial_in_its_grace_says_it_is_stopping_who_asked_and_when_the_grace_ends(tmp_path, home, command, who):
    gate = tmp_path / "gate"
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, SCRIPT.format(gate=str(gate)),
                        trialConcurrency=1, maxTrialNumber=1, trialGraceSeconds=GRACE)
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        trial = f"{exp}-00000"
        wait_until(lambda: reported(home, trial), WAIT, "the trial to report")
        stop = start_cli(*(word.format(trial=trial, exp=exp) for word in command))  # `experiment stop` waits
        try:
            wait_until(lambda: "stopping" in ok("trial", "list", exp), WAIT, "the list to say it is stopping")
            row = ok("trial", "list", exp).splitlines()[2]
            assert row.split()[1] == "RUNNING", row
            sent, ends = re.search(stopping(who) + "$", row).groups()
            assert (seconds(ends) - seconds(sent)) % 86400 == GRACE, row
            status = next(line for line in ok("trial", "show", trial).splitlines() if line.startswith("status "))
            assert re.fullmatch(r"status\s+RUNNING: " + stopping(who), status), status
            # A kill during the grace restarts no clock, and says so: the same grace, ending when it did.
            again = ok("trial", "kill", trial).strip()
            assert re.fullmatch(rf"trial {trial} is " + stopping("killed by `trialkit trial kill`"), again), again
            assert again.endswith(f"ends at {ends}, then what still runs is killed"), again
            if command[1] == "kill":  # the same stop again: its history gains no row
                history = ok("trial", "show", trial).split("history:\n")[1]
                assert history.count("stopping since") == 1, history
        finally:
            gate.touch()
            stop.communicate(timeout=WAIT)
    finally:
        end_failed_run(proc, gate)
    assert trial_status(home, trial) != "RUNNING"
