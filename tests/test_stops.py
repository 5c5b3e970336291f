"""Stops mean what they say, through the `trialkit` command as a user runs it.

- A trial that saves a checkpoint on SIGTERM and exits 143 when the experiment
  is stopped (Ctrl-C of `trialkit run`, `trialkit experiment stop`) is
  PREEMPTED, and `trialkit experiment resume` continues it from its checkpoint.
- A trial paused without saving a checkpoint says so (`trial show`, `trial
  list`, the run's output), and `trial activate` says it starts again.
- An assessor never stops a trial that has reported its final result.
- A Hyperband or PBT trial that `experiment stop` cut short without a checkpoint
  is PAUSED in `trial list`, as `experiment stop --help` says, its reason naming
  its tuner's round (PBT: generation, NNI's word).
"""
from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from experiment_util import (by_sequence, cli, experiment, experiment_id, export, paused_and_activated, reported,
                             start_cli, trial_status)
from harness import wait_until
from trialkit.web import queries

WAIT = 60.0  # an upper bound for a loaded machine; never waited for on success
X = {"x": {"_type": "choice", "_value": [1]}}

# Eight steps; on SIGTERM it finishes the step, saves it and exits 143. Its first run waits at step 3 for the
# stop (so that no load on the machine lets it finish first); a restart runs through.
CHECKPOINTING = """
import json, os, signal, sys, time, trialkit
from pathlib import Path
signal.signal(signal.SIGTERM, lambda signum, frame: None)
trialkit.get_next_parameter()
first_run = os.environ["TRIALKIT_RESTART_COUNT"] == "0"
state = Path(trialkit.checkpoint_dir()) / "state.json"
step = json.loads(state.read_text())["step"] if state.exists() else 0
while step < 8:
    trialkit.report_intermediate_result(step)
    step += 1
    while first_run and step == 3 and not trialkit.should_preempt():
        time.sleep(0.02)
    if trialkit.should_preempt():
        state.write_text(json.dumps({"step": step}))
        sys.exit(143)
trialkit.report_final_result(step)
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def ok(*args) -> str:
    done = cli(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("how", ["ctrl-c", "experiment stop"])
def test_a_trial_that_checkpoints_when_the_experiment_stops_is_preempted_and_resume_continues_it(
        tmp_path, home, how):
    config = experiment(tmp_path, X, CHECKPOINTING, trialConcurrency=1, maxTrialNumber=1, trialGraceSeconds=10)
    if how == "ctrl-c":
        proc = start_cli("run", config)
        exp = experiment_id(proc.stdout.readline())
    else:
        exp = experiment_id(ok("run", config, "--detach").splitlines()[0])
    trial = f"{exp}-00000"
    wait_until(lambda: reported(home, trial) >= 3, WAIT, "the trial to train three steps")
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT)
        assert f"trial {trial} PAUSED" in out, out + err
    else:
        ok("experiment", "stop", exp)
    row = export(exp)[0]
    assert row["status"] == "PREEMPTED" and row["exit_code"] == 143
    assert row["reason"].endswith("it saved a checkpoint: `trialkit experiment resume` continues it"), row
    listed = ok("trial", "list", exp).splitlines()[2]  # the one trial's row: its status word, then why
    assert re.search(r"\bPAUSED\b.*it saved a checkpoint: `trialkit experiment resume` continues it$", listed), listed
    assert json.loads((Path(row["trial_dir"]) / "checkpoint" / "state.json").read_text())["step"] == 3

    resumed = ok("experiment", "resume", exp)
    row = export(exp)[0]
    assert row["status"] == "SUCCEEDED" and row["final"] == 8 and row["restart_count"] == 1, resumed
    runs = [r["intermediate"] for r in json.loads(ok("experiment", "export", exp, "--all-runs"))]
    assert runs == [[0, 1, 2], [3, 4, 5, 6, 7]]  # from its checkpoint, nothing again


@pytest.mark.parametrize("gap, killed", [(0.05, False), (0.6, True)], ids=["delivered-twice", "again"])
def test_a_sigterm_delivered_twice_at_once_is_one_stop_and_one_sent_again_kills(tmp_path, home, gap, killed):
    # GNU timeout(1) passes a signal to its command and then to the command's process group: two SIGTERMs a
    # moment apart (50 ms here, so that the kernel does not merge them), which must not read as "again: kill".
    # A user's second one, later, does kill.
    slow_save = CHECKPOINTING.replace("state.write_text(", "time.sleep(2); state.write_text(")  # a big checkpoint
    config = experiment(tmp_path, X, slow_save, trialConcurrency=1, maxTrialNumber=1, trialGraceSeconds=10)
    proc = start_cli("run", config)
    exp = experiment_id(proc.stdout.readline())
    wait_until(lambda: reported(home, f"{exp}-00000") >= 3, WAIT, "the trial to train three steps")
    proc.send_signal(signal.SIGTERM)
    time.sleep(gap)  # the gap is the case under test
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=WAIT)
    assert "SIGTERM: stopping the trials gracefully" in out, out + err
    assert ("SIGTERM: killing the trials" in out) == killed, out + err
    # The first had its grace and saved its checkpoint; killed, it saved none and runs again from the start.
    row = export(exp)[0]
    resumable = row["reason"].endswith("`trialkit experiment resume` continues it")
    assert row["status"] == "PREEMPTED" and resumable != killed


def test_a_ctrl_c_delivered_twice_after_a_quick_stop_ends_the_run_as_one_does(tmp_path, home):
    # A trial that saves at once ends the loop before the stop's second copy, 0.2 s later, comes: it must be
    # dropped as it is while the loop runs, not end the summary with a KeyboardInterrupt (a newcomer's run exited
    # 130, once with no summary at all).
    config = experiment(tmp_path, X, CHECKPOINTING, trialConcurrency=1, maxTrialNumber=1)
    proc = start_cli("run", config)
    exp = experiment_id(proc.stdout.readline())
    wait_until(lambda: reported(home, f"{exp}-00000") >= 3, WAIT, "the trial to train three steps")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=WAIT)
    assert (proc.returncode, "killing" in out, "Traceback" in err) == (1, False, False), out + err  # 1: none succeeded
    assert f"trialkit ui {exp}" in out.splitlines()[-1], out  # the summary, to its last line
    assert export(exp)[0]["status"] == "PREEMPTED"


# `trialkit run CONFIG` with a Ctrl-C delivered as its loop is made or as its manager starts (argv[2]): the
# window in which a newcomer's Ctrl-C, a tenth of a second after the start, found Python's own handler (exit 130,
# nothing said, the experiment left RUNNING in its store and listed INTERRUPTED with no trial).
CTRL_C_AT_THE_START = """
import os, signal, sys
from trialkit.control import loop, manager_http
if sys.argv[2] == "loop":
    made = loop.Loop.__init__
    def interrupted(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        made(self, *args, **kwargs)
    loop.Loop.__init__ = interrupted
else:
    start = manager_http.Manager.start.__func__
    def interrupted(cls, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return start(cls, *args, **kwargs)
    manager_http.Manager.start = classmethod(interrupted)
from trialkit.cli import main
sys.exit(main(["run", sys.argv[1]]))
"""


def test_a_ctrl_c_as_the_run_starts_stops_the_experiment_as_one_later_does(tmp_path, home):
    config = experiment(tmp_path, X, CHECKPOINTING, trialConcurrency=1, maxTrialNumber=1)
    done = subprocess.run([sys.executable, "-c", CTRL_C_AT_THE_START, str(config), "manager"], capture_output=True,
                          text=True, timeout=WAIT)
    assert (done.returncode, "Traceback" in done.stderr) == (1, False), done.stdout + done.stderr
    assert "SIGINT: stopping the trials gracefully" in done.stdout, done.stdout
    exp = experiment_id(done.stdout.splitlines()[0])
    listed = cli("experiment", "list").stdout
    assert re.search(rf"^{exp}\b.*\bSTOPPED\b", listed, re.M), listed  # not INTERRUPTED


def test_a_ctrl_c_before_the_loop_can_take_it_leaves_no_experiment(tmp_path, home):
    config = experiment(tmp_path, X, CHECKPOINTING, trialConcurrency=1, maxTrialNumber=1)
    done = subprocess.run([sys.executable, "-c", CTRL_C_AT_THE_START, str(config), "loop"], capture_output=True,
                          text=True, timeout=WAIT)
    assert (done.returncode, done.stdout, "Traceback" in done.stderr) == (130, "", False), done.stderr
    assert list((home / "experiments").iterdir()) == [], "a half-made experiment is left to list"


def test_a_trial_killed_by_the_stop_without_a_checkpoint_is_paused_and_runs_again_from_the_start(tmp_path, home):
    """It reported no final result: cut short by the experiment's own stop, it runs again on resume (every
    tuner), so the search gets the results it asked for."""
    config = experiment(tmp_path, X, CHECKPOINTING.replace("signal.signal(signal.SIGTERM, lambda signum, frame: None)",
                                                           ""), trialConcurrency=1, maxTrialNumber=1)
    proc = start_cli("run", config)
    exp = experiment_id(proc.stdout.readline())
    wait_until(lambda: reported(home, f"{exp}-00000") >= 2, WAIT, "the trial to train")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=WAIT)
    assert export(exp)[0]["status"] == "PREEMPTED"
    assert export(exp)[0]["reason"].endswith("it was cut short before its final result: `trialkit experiment "
                                             "resume` runs it again; it saved no checkpoint: its progress restarts "
                                             "from the beginning when it runs again")
    assert cli("experiment", "resume", exp).returncode == 0
    row = export(exp)[0]
    assert (row["status"], row["final"], row["restart_count"]) == ("SUCCEEDED", 8, 1)
    assert row["intermediate"][-8:] == list(range(8))  # from the beginning


def test_a_paused_trial_without_a_checkpoint_says_its_progress_restarts(tmp_path, home):
    # It dies of the SIGTERM (no handler) and never writes to its checkpoint dir.
    script = """
    import time, trialkit
    trialkit.get_next_parameter()
    for step in range(100):
        trialkit.report_intermediate_result(step)
        time.sleep(0.1)
    trialkit.report_final_result(1.0)
    """
    config = experiment(tmp_path, X, script, trialConcurrency=1, maxTrialNumber=1)
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        trial = f"{exp}-00000"
        wait_until(lambda: reported(home, trial) >= 2, WAIT, "the trial to train")
        ok("trial", "pause", trial)
        wait_until(lambda: trial_status(home, trial) == "PREEMPTED", WAIT, "the trial to pause")
        restarts = "it saved no checkpoint: its progress restarts from the beginning when it runs again"
        assert f"status         PAUSED: paused; {restarts}" in ok("trial", "show", trial)
        listed = ok("trial", "list", exp).splitlines()[2]
        assert re.search(r"\bPAUSED\b.* paused; it saved no checkpoint", listed), listed
        activated = ok("trial", "activate", trial)
        assert "queued to start from the beginning (it holds no checkpoint)" in activated
        ok("experiment", "stop", exp)
        out, _ = proc.communicate(timeout=WAIT)
        assert f"trial {trial} PAUSED (paused; {restarts})" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# NNI's usual trial: twenty steps, no checkpoint. Its first run holds at step 6 (reported 0..5) until the pause's
# SIGTERM ends it; run again, it starts over at 0.
STARTS_OVER = """
import os, time, trialkit
trialkit.get_next_parameter()
for step in range(20):
    trialkit.report_intermediate_result(step)
    while step == 5 and os.environ["TRIALKIT_RESTART_COUNT"] == "0":
        time.sleep(0.05)
trialkit.report_final_result(1.0)
"""


def test_a_run_that_started_over_replaces_the_earlier_runs_reports(tmp_path, home):
    """Paused without a checkpoint and activated, the trial trained 20 steps, once: every view shows 0..19 and 20
    steps (not 26 steps, 0..5 then 0..19 as one sawtooth); --all-runs keeps both runs' reports as they came."""
    config = experiment(tmp_path, X, STARTS_OVER, trialConcurrency=1, maxTrialNumber=1)
    exp, _ = paused_and_activated(home, [config], reports=6)
    trial = f"{exp}-00000"
    row = export(exp)[0]
    assert (row["status"], row["restart_count"]) == ("SUCCEEDED", 1)
    assert row["intermediate"] == list(range(20)) and row["steps"] == 20
    assert f"intermediate   {json.dumps(list(range(20)), separators=(',', ':'))}" in ok("trial", "show", trial)
    listed = ok("trial", "list", exp).splitlines()[2].split()
    assert listed[:4] == [trial, "SUCCEEDED", "1", "20"]  # trial, status, final, steps
    runs = [(r["run"], r["intermediate"]) for r in json.loads(ok("experiment", "export", exp, "--all-runs"))]
    assert runs == [(0, list(range(6))), (1, list(range(20)))]
    # The page: the trial's facts and its curve.
    with closing(sqlite3.connect(home / "experiments" / exp / "trialkit.db")) as db:
        db.row_factory = sqlite3.Row
        queries.register(db)
        assert (queries.trial(db, exp, trial)["intermediate"], queries.trial(db, exp, trial)["steps"]) == (20, 20)
        (curve,) = queries.curves(db, exp, [trial])["series"]
        assert (curve["steps"], curve["values"]) == (list(range(1, 21)), list(range(20)))


# The bad trial (x=0.1) reports every step below the good ones' median, and its final result either with them
# (then takes its time to exit: cleaning up, saving a model) or a second later, after the assessor's stop came
# (it finishes its epoch on SIGTERM, reports, and exits 143).
WITH_THE_STEPS = """
import time, trialkit
x = trialkit.get_next_parameter()["x"]
for step in range(6):
    trialkit.report_intermediate_result(x)
trialkit.report_final_result(x)
time.sleep(0 if x > 0.5 else 3)
"""
AFTER_THE_STOP = """
import signal, sys, time, trialkit
signal.signal(signal.SIGTERM, lambda signum, frame: None)
x = trialkit.get_next_parameter()["x"]
for step in range(6):
    trialkit.report_intermediate_result(x)
if x < 0.5:
    time.sleep(1.5)
trialkit.report_final_result(x)
sys.exit(143 if trialkit.should_preempt() else 0)
"""


@pytest.mark.parametrize("script, exit_code", [(WITH_THE_STEPS, 0), (AFTER_THE_STOP, 143)],
                         ids=["final with the steps", "final after the stop"])
def test_an_assessor_never_stops_a_trial_that_reported_its_final_result(tmp_path, script, exit_code):
    space = {"x": {"_type": "choice", "_value": [0.9, 0.1]}, "again": {"_type": "choice", "_value": [0, 1]}}
    config = experiment(tmp_path, space, script, maxTrialNumber=3, trialConcurrency=1,
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}},
                        assessor={"name": "Medianstop", "classArgs": {"start_step": 2}}, trialGraceSeconds=5)
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = by_sequence(export(experiment_id(done.stdout.splitlines()[0])))
    assert [rows[i]["status"] for i in range(3)] == ["SUCCEEDED"] * 3, rows
    bad = rows[2]
    assert bad["final"] == 0.1 and bad["intermediate"] == [0.1] * 6
    # With the steps: no stop was sent (it slept its 3 s and exited 0); after: the stop came first.
    assert bad["exit_code"] == exit_code, bad


# Each trial reports once, then waits for the stop (which kills it: it has no SIGTERM handler).
WAITS = """
import time, trialkit
p = trialkit.get_next_parameter()
trialkit.report_intermediate_result(1.0)
time.sleep(120)
trialkit.report_final_result(1.0)
"""


@pytest.mark.parametrize("tuner, unit", [
    ({"name": "Hyperband", "classArgs": {"R": 3, "eta": 3, "exec_mode": "serial"}}, "round"),
    ({"name": "PBTTuner", "classArgs": {"population_size": 2}}, "generation"),
])
def test_a_trial_cut_short_by_experiment_stop_is_paused_as_the_help_says(tmp_path, home, tuner, unit):
    space = {"x": {"_type": "uniform", "_value": [0, 1]}}
    config = experiment(tmp_path, space, WAITS, maxTrialNumber=4, trialConcurrency=1, tuner=tuner)
    exp = experiment_id(ok("run", config, "--detach").splitlines()[0])
    trial = f"{exp}-00000"
    wait_until(lambda: reported(home, trial) >= 1, WAIT, "the trial to report")
    ok("experiment", "stop", exp)
    row = next(line for line in ok("trial", "list", exp).splitlines() if line.startswith(trial))
    assert " PAUSED " in row and f"its {unit} waits for its result" in row, row
    assert "PAUSED" in " ".join(ok("experiment", "stop", "--help").split())


def test_a_trial_killed_after_the_grace_says_who_stopped_it_and_that_it_was_killed(tmp_path, home):
    # Each of three trials ignores the stop; one is paused, one killed, the last stopped with the experiment.
    script = """
    import signal, time, trialkit
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    trialkit.get_next_parameter()
    trialkit.report_intermediate_result(1)
    time.sleep(300)
    """
    space = {"x": {"_type": "choice", "_value": [1, 2, 3]}}
    config = experiment(tmp_path, space, script, trialConcurrency=3, maxTrialNumber=3, trialGraceSeconds=1,
                        tuner={"name": "GridSearch"})
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        paused, killed, stopped = (f"{exp}-0000{i}" for i in range(3))
        for trial in (paused, killed, stopped):
            wait_until(lambda: reported(home, trial) >= 1, WAIT, f"{trial} to train")
        ok("trial", "pause", paused)
        ok("trial", "kill", killed)
        wait_until(lambda: trial_status(home, paused) == "PREEMPTED" and trial_status(home, killed) == "USER_CANCELED",
                   WAIT, "the pause and the kill to end")
        ok("experiment", "stop", exp)
        proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    grace = "killed: it was still running 1 s after SIGTERM (trialGraceSeconds)"  # the config's key, not the keeper's variable
    restarts = "it saved no checkpoint: its progress restarts from the beginning when it runs again"
    for trial, status in ((paused, f"PAUSED: paused; {grace}; {restarts}"),
                          (killed, f"USER_CANCELED: killed by `trialkit trial kill`; {grace}"),
                          (stopped, f"PAUSED: stopped by `trialkit experiment stop`; {grace}; it was cut "
                                    "short before its final result: `trialkit experiment resume` runs it again; "
                                    f"{restarts}")):
        shown = ok("trial", "show", trial)
        assert f"status         {status}\n" in shown, shown
        history = shown.split("history:\n")[1].splitlines()
        # The keeper's own record of the kill stays in the history, in its words (the variable it got), a pause's
        # verdict after it.
        keepers = grace.replace("(trialGraceSeconds)", "(TRIALKIT_GRACE_SECONDS)")
        assert any(line.split()[2:4] == ["USER_CANCELED", "keeper"] and line.endswith(keepers) for line in history), \
            history
    assert ok("trial", "show", paused).split("history:\n")[1].splitlines()[-1].split()[2:4] == ["PAUSED", "control"]


# PBT on trialkit's checkpoint dir: generation 0 saves its own and reports; generation 1 starts with a copy of a
# member's (the loop's seed), reports its final result and, on its first run, runs on until it is stopped,
# saving nothing of its own; run again, it ends.
SEEDED = """
import os, pathlib, time, trialkit
p = trialkit.get_next_parameter()
state = pathlib.Path(trialkit.checkpoint_dir()) / "state"
if not state.exists():
    state.write_text("0")
    trialkit.report_final_result(p["x"])
else:
    trialkit.report_final_result(p["x"])
    while os.environ["TRIALKIT_RESTART_COUNT"] == "0":
        time.sleep(0.05)
"""
STARTED_FROM = ("it saved no checkpoint of its own: `trialkit experiment resume` runs it again from the one it "
                "started from")
OLD_RESUMABLE = "it saved a checkpoint: `trialkit experiment resume` continues it"  # stores before session 12


@pytest.mark.parametrize("stored", ["as said now", "as older versions said"])
def test_a_trial_stopped_with_only_the_checkpoint_it_started_from_says_so_and_resume_runs_it_again(
        tmp_path, home, stored):
    space = {"x": {"_type": "uniform", "_value": [0, 1]}}
    config = experiment(tmp_path, space, SEEDED, maxTrialNumber=4, trialConcurrency=2,
                        tuner={"name": "PBTTuner", "classArgs": {"population_size": 2}})
    exp = experiment_id(ok("run", config, "--detach").splitlines()[0])
    heirs = [f"{exp}-00002", f"{exp}-00003"]

    def finals() -> int:
        with closing(sqlite3.connect(home / "experiments" / exp / "trialkit.db")) as db:
            return db.execute("SELECT COUNT(*) FROM records WHERE type = 'FINAL'").fetchone()[0]

    wait_until(lambda: finals() == 4, WAIT, "generation 1's final results")
    ok("experiment", "stop", exp)
    rows = by_sequence(export(exp))
    for heir in (rows[2], rows[3]):
        assert heir["status"] == "PREEMPTED" and heir["reason"].endswith(f"; {STARTED_FROM}"), heir
    if stored != "as said now":
        with closing(sqlite3.connect(home / "experiments" / exp / "trialkit.db")) as db, db:
            db.execute("UPDATE trials SET reason = replace(reason, ?, ?)", (STARTED_FROM, OLD_RESUMABLE))
        assert all(by_sequence(export(exp))[i]["reason"].endswith(OLD_RESUMABLE) for i in (2, 3))
    assert cli("experiment", "resume", exp, timeout=WAIT).returncode == 0
    assert [row["status"] for row in by_sequence(export(exp)).values()] == ["SUCCEEDED"] * 4
    resumed = "resumed: it runs again from the checkpoint it started from" if stored == "as said now" else \
        "resumed: it goes on from its checkpoint"
    for heir in heirs:
        history = ok("trial", "show", heir).split("history:")[1]
        assert resumed in history, history
