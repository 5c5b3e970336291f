"""A tuner that thinks long holds up nothing: Ctrl-C and trial ends are seen while it computes a proposal.

A real `trialkit run` of NNI's GPTuner whose pick is made slow by its own classArgs (many L-BFGS-B starts, as
a user may set them): the loop asks it on a thread of its own (trialkit.control.pick).
"""
from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from experiment_util import experiment, experiment_id, export, start_cli
from trialkit.control.pick import THINKING, Picker
from trialkit.control.searchspace import parse_space
from trialkit.control.tuners import build_tuner

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


def answer(picker: Picker, woken: threading.Event):
    """The picker's proposal, waiting for its wake-up while it thinks."""
    while (asked := picker.ask()) is THINKING:
        assert woken.wait(120), "the proposal never woke the loop"
        woken.clear()
    return asked


def test_what_the_loop_tells_the_tuner_during_a_proposal_is_told_after_it_and_the_proposals_stay_the_tuners():
    args = {"optimize_mode": "maximize", "cold_start_num": 2, "selection_num_starting_points": 1000}
    plain, tuner = (build_tuner("GPTuner", args, parse_space(SPACE), 7) for _ in range(2))
    woken = threading.Event()
    picker = Picker(tuner, woken.set)
    for _ in range(2):  # the random start, told at once
        expected, got = plain.ask(), answer(picker, woken)
        assert got == expected
        plain.tell(expected[0], expected[1]["momentum"])
        picker.tell(got[0], got[1]["momentum"])
    imported = [({"lr": 0.01, "momentum": 0.3, "batch": 32}, 0.3)]
    assert picker.ask() is THINKING  # the GP's pick: 1000 L-BFGS-B starts
    picker.import_results(imported)  # the page's import, meanwhile: held, the tuner untouched
    assert (tuner._next_id, len(tuner._results)) == (2, 2)
    got, expected = answer(picker, woken), plain.ask()
    plain.import_results(imported)
    assert got == expected and (tuner._next_id, len(tuner._results)) == (4, 3)  # told after the proposal
    assert answer(picker, woken) == plain.ask()  # and learnt from as the tuner asked alone learns
    picker.close()


@contextmanager
def running(config: Path) -> Iterator[Tuple[subprocess.Popen, str, Lines]]:
    """`trialkit run CONFIG`: its process, the experiment's id and its lines; after, nothing of it left running
    (its stderr in lines.err)."""
    proc = start_cli("run", config)
    exp = experiment_id(proc.stdout.readline())
    lines = Lines(proc)
    try:
        yield proc, exp, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lines.reader.join()
        lines.err = proc.stderr.read()
        proc.stdout.close(), proc.stderr.close()


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


class Lines:
    """The run's output lines as they come (read on a thread of their own until the run closes its stdout)."""

    def __init__(self, proc):
        self.queue: "queue.SimpleQueue[str]" = queue.SimpleQueue()
        self.seen: List[str] = []
        self.err = ""  # the run's stderr, once it ended
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
    with running(config) as (proc, exp, lines):
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
    err = lines.err
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
    with running(config) as (proc, exp, lines):
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
    err = lines.err
    assert acknowledged < 2.0 and ended < 10.0 and proc.returncode == 0, (acknowledged, ended, lines.seen, err)
    # killed, as documented, to run again on resume (no result); no third trial (either of the two may have been
    # the first to start)
    assert sorted((row["status"], row["reason"]) for row in export(exp)) == [
        ("PREEMPTED", "experiment stopped (SIGINT); it was cut short before its final result: `trialkit experiment "
                      "resume` runs it again; it saved no checkpoint: its progress restarts from the beginning when "
                      "it runs again"), ("SUCCEEDED", "")]
    assert "Traceback" not in err, err
