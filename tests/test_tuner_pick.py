"""A tuner that thinks long holds up nothing: Ctrl-C and trial ends are seen while it computes a proposal.

A real `trialkit run` of NNI's GPTuner whose pick is made slow by its own classArgs (many L-BFGS-B starts, as
a user may set them): the loop asks it on a thread of its own (trialkit.control.pick).
"""
from __future__ import annotations

import queue
import signal
import threading
import time
from typing import List

import pytest

from experiment_util import experiment, experiment_id, export, start_cli

pytest.importorskip("sklearn", reason="GPTuner needs trialkit's search extra (scikit-learn)")

SPACE = {"lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]}, "momentum": {"_type": "uniform", "_value": [0, 1]},
         "batch": {"_type": "choice", "_value": [16, 32, 64]}}
# The first trial to start ends at once (its result makes the GP's pick begin: cold_start_num 1); the other
# runs `{other}`, while the pick runs: about a minute at low load with this many starts.
TRIAL = """
import os, signal, time, trialkit
p = trialkit.get_next_parameter()
try:
    os.close(os.open({first!r}, os.O_CREAT | os.O_EXCL))
except FileExistsError:
    {other}
trialkit.report_final_result(p["momentum"])
"""
SLOW_GP = {"optimize_mode": "maximize", "cold_start_num": 1, "selection_num_starting_points": 100000}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


class Lines:
    """The run's output lines as they come (read on a thread of their own until the run closes its stdout)."""

    def __init__(self, proc):
        self.queue: "queue.SimpleQueue[str]" = queue.SimpleQueue()
        self.seen: List[str] = []
        self.reader = threading.Thread(target=lambda: [self.queue.put(line.rstrip("\n")) for line in proc.stdout])
        self.reader.start()

    def until(self, wanted: str, within: float) -> bool:
        """Whether a line holding `wanted` came within `within` seconds."""
        deadline = time.monotonic() + within
        while True:
            try:
                line = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return False
            self.seen.append(line)
            if wanted in line:
                return True


def test_ctrl_c_and_a_trial_end_are_seen_while_the_gp_thinks(tmp_path):
    config = experiment(tmp_path, SPACE, TRIAL.format(first=str(tmp_path / "first"), other="time.sleep(3)"),
                        trialConcurrency=2, maxTrialNumber=6, tuner={"name": "GPTuner", "classArgs": SLOW_GP})
    proc = start_cli("run", config)
    exp = experiment_id(proc.stdout.readline())
    lines = Lines(proc)
    try:
        assert lines.until(" SUCCEEDED ", 60), lines.seen  # the first trial: the pick begins
        # The other trial ends 3 s later, while the GP thinks: said then, not once the pick is done.
        assert lines.until(" SUCCEEDED ", 20), lines.seen
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        assert lines.until("SIGINT: stopping the trials gracefully", 5), lines.seen
        acknowledged = time.monotonic() - sent
        proc.wait(timeout=20)  # nothing runs: the run ends, the pick abandoned
        ended = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lines.reader.join()
        err = proc.stderr.read()
        proc.stdout.close(), proc.stderr.close()
    assert acknowledged < 2.0, (acknowledged, lines.seen)  # a fraction of a second when the machine is idle
    assert ended < 10.0 and proc.returncode == 0, (ended, proc.returncode, lines.seen, err)
    # The pick was still running at the Ctrl-C (no third trial), and its proposal was recorded nowhere.
    assert [row["status"] for row in export(exp)] == ["SUCCEEDED", "SUCCEEDED"], lines.seen
    assert "Traceback" not in err, err


def test_a_second_ctrl_c_while_the_gp_thinks_kills_the_running_trial_at_once(tmp_path):
    stubborn = "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"  # deaf to the graceful stop
    config = experiment(tmp_path, SPACE, TRIAL.format(first=str(tmp_path / "first"), other=stubborn),
                        trialConcurrency=2, maxTrialNumber=6, trialGraceSeconds=60,
                        tuner={"name": "GPTuner", "classArgs": SLOW_GP})
    proc = start_cli("run", config)
    exp = experiment_id(proc.stdout.readline())
    lines = Lines(proc)
    try:
        assert lines.until(" SUCCEEDED ", 60), lines.seen  # the first trial: the pick begins, the other runs
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        assert lines.until("SIGINT: stopping the trials gracefully", 5), lines.seen
        time.sleep(0.5)  # a user's second Ctrl-C, not the first one delivered twice (loop.SAME_SIGNAL_SECONDS)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        assert lines.until("SIGINT: killing the trials", 5), lines.seen
        acknowledged = time.monotonic() - sent
        proc.wait(timeout=30)
        ended = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lines.reader.join()
        err = proc.stderr.read()
        proc.stdout.close(), proc.stderr.close()
    assert acknowledged < 2.0 and ended < 10.0 and proc.returncode == 0, (acknowledged, ended, lines.seen, err)
    assert [(row["status"], row["reason"]) for row in export(exp)] == [
        ("SUCCEEDED", ""), ("USER_CANCELED", "experiment stopped (SIGINT)")]  # killed, as documented; no third
    assert "Traceback" not in err, err
