"""`trial logs` shows what the trial's log files hold, to their last byte, after a second Ctrl-C killed its keeper
with output it had written there but not shipped to the manager (a user missed the last lines).

A real `trialkit run`: the trial ignores SIGTERM and, at it, writes a last line without its newline, which the
keeper writes to stdout.log at once but ships only as whole lines, or whole at its end. Ctrl-C, then Ctrl-C
again once the file holds it (the trial's group and then its keeper are SIGKILLed); `trialkit trial logs` then
prints the file as it is. The keeper is stopped (SIGSTOP) before the second Ctrl-C: between the two SIGKILLs a
keeper that gets the CPU ships its last words at the trial's end, and the case is one whose keeper did not.
"""
from __future__ import annotations

import json
import os
import signal
import time

import psutil

import pytest

from experiment_util import cli, experiment, experiment_id, start_cli, stored
from harness import wait_until
from trialkit import layout
from trialkit.control.loop import SAME_SIGNAL_SECONDS

pytestmark = pytest.mark.usefixtures("home")
WAIT = 60.0  # an upper bound for a loaded machine; never waited for on success

SCRIPT = """
import signal, sys, time
def stopped(signum, frame):
    sys.stdout.write("stopped at last, no newline yet")
    sys.stdout.flush()
signal.signal(signal.SIGTERM, stopped)
for i in range(3):
    print(f"line {i}", flush=True)
while True:
    time.sleep(1)
"""


def shipped(home, trial: str) -> str:
    """The output the trial's keeper shipped to the manager, as the store holds it."""
    return "".join(text for (text,) in stored(home, trial.rpartition("-")[0], "SELECT json_extract(value, '$.text') "
                                              "FROM records WHERE trial=? AND type='LOG' ORDER BY seq", trial))


def test_trial_logs_after_a_double_ctrl_c_prints_what_the_keeper_wrote_and_never_shipped(tmp_path, home):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, SCRIPT, maxTrialNumber=1,
                        trialConcurrency=1, trialGraceSeconds=60)
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        trial = f"{exp}-00000"
        log = home / "experiments" / exp / "trials" / trial / "stdout.log"
        wait_until(lambda: shipped(home, trial) == "line 0\nline 1\nline 2\n", WAIT, "the trial's first lines")
        proc.send_signal(signal.SIGINT)
        first = time.monotonic()
        wait_until(lambda: log.read_text().endswith("no newline yet"), WAIT, "the trial's last words in its file")
        time.sleep(max(0.0, first + SAME_SIGNAL_SECONDS - time.monotonic()))  # a second Ctrl-C, not the first twice
        trial_pid = json.loads(layout.status_path(log.parent).read_text())["pid"]
        os.kill(psutil.Process(trial_pid).ppid(), signal.SIGSTOP)  # the keeper: SIGKILL still ends it
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert shipped(home, trial) == "line 0\nline 1\nline 2\n"  # the last words went down with the keeper
    done = cli("trial", "logs", trial)
    assert done.returncode == 0, done.stderr
    assert done.stdout == log.read_text() == "line 0\nline 1\nline 2\nstopped at last, no newline yet"
