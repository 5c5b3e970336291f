"""A resumed search never proposes a point it already tried, for every tuner.

The user's day: `trialkit run` of a 10-trial search at concurrency 2, Ctrl-C
once four trials ended, `trialkit experiment resume`; every one of the ten
trials has parameters of its own. On the tuner's side: a tuner rebuilt from
the store (replay) proposes what the uninterrupted tuner proposes next, and a
space with fewer points than maxTrialNumber ends when each point was tried.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from experiment_util import cli, experiment, experiment_id, export, interrupted_after

PLANE = {"x": {"_type": "uniform", "_value": [-5, 5]}, "y": {"_type": "uniform", "_value": [-5, 5]}}
# GridSearch enumerates only what is discrete: the plane quantized (9 x 9 points).
GRID = {"x": {"_type": "quniform", "_value": [-4, 4, 1]}, "y": {"_type": "quniform", "_value": [-4, 4, 1]}}
# Long enough that Ctrl-C finds two running; the metric is the bowl TPE and Anneal model.
TRIAL = """
import time, trialkit
p = trialkit.get_next_parameter()
time.sleep(0.4)
trialkit.report_final_result((p["x"] - 1.5) ** 2 + (p["y"] + 2) ** 2)
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("tuner, space", [("TPE", PLANE), ("Anneal", PLANE), ("Evolution", PLANE),
                                          ("Random", PLANE), ("GridSearch", GRID)])
def test_a_search_interrupted_and_resumed_tries_nothing_twice(tmp_path, tuner, space):
    args = {"optimize_mode": "minimize"}
    if tuner == "Evolution":
        args["population_size"] = 4  # tournaments start before the interruption
    config = experiment(tmp_path, space, TRIAL, maxTrialNumber=10, trialConcurrency=2,
                        tuner={"name": tuner, "classArgs": args})
    exp = interrupted_after(config, 4)
    before = export(exp)
    assert 4 <= len(before) < 10, before
    done = cli("experiment", "resume", exp)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = export(exp)
    assert len(rows) == 10
    points = [json.dumps(row["parameters"], sort_keys=True) for row in rows]
    assert len(set(points)) == 10, sorted(points)


# A script that dies of the stop without saving (as one Ctrl-C reaches in a terminal): no checkpoint, no result.
DIES_OF_THE_STOP = """
import signal, sys, time, trialkit
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
p = trialkit.get_next_parameter()
for step in range(4):
    time.sleep(0.3)
    trialkit.report_intermediate_result(step)
    if trialkit.get_sequence_id() >= 2:
        open(MARKER, "a").close()
trialkit.report_final_result((p["x"] - 1.5) ** 2 + (p["y"] + 2) ** 2)
"""


def test_trials_ctrl_c_cut_short_run_again_on_resume_so_the_search_gets_every_result_it_asked_for(tmp_path):
    """TPE, 6 trials, 2 at once, Ctrl-C once 2 ended and a third trains: those it cut short before their results
    are PAUSED, each saying `experiment resume` runs it again, and the resume runs them as they were (same ids,
    same parameters) and the rest: 6 results, as maxTrialNumber asked (newcomer23: USER_CANCELED, counted, never
    run: 4)."""
    marker = tmp_path / "training"
    config = experiment(tmp_path, PLANE, DIES_OF_THE_STOP.replace("MARKER", repr(str(marker))), maxTrialNumber=6,
                        trialConcurrency=2, tuner={"name": "TPE", "classArgs": {"optimize_mode": "minimize"}})
    exp = interrupted_after(config, 2, marker=marker)  # once a third trial trains
    cut = {row["trial_id"]: row for row in export(exp) if row["status"] not in ("SUCCEEDED", "WAITING")}
    assert cut and all(row["status"] == "PREEMPTED" and row["final"] is None and row["reason"].endswith(
        "it was cut short before its final result: `trialkit experiment resume` runs it again; it saved no "
        "checkpoint: its progress restarts from the beginning when it runs again") for row in cut.values()), cut
    done = cli("experiment", "resume", exp)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = export(exp)
    assert [row["status"] for row in rows] == ["SUCCEEDED"] * 6, rows
    assert {row["trial_id"]: row["parameters"] for row in rows if row["trial_id"] in cut} == \
        {trial_id: row["parameters"] for trial_id, row in cut.items()}


def test_a_search_of_a_small_space_ends_when_each_point_was_tried(tmp_path):
    space = {"x": {"_type": "choice", "_value": [1, 2]}, "y": {"_type": "choice", "_value": [-2, 0]}}
    config = experiment(tmp_path, space, TRIAL.replace("time.sleep(0.4)", ""), maxTrialNumber=10,
                        tuner={"name": "TPE", "classArgs": {"optimize_mode": "minimize"}})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "search space exhausted: each of its 4 points was tried; no new trial starts" in done.stdout
    rows = export(experiment_id(done.stdout.splitlines()[0]))
    assert sorted((row["parameters"]["x"], row["parameters"]["y"]) for row in rows) == [(1, -2), (1, 0), (2, -2), (2, 0)]


# run.sh's interpreter for the keeper (TRIALKIT_PYTHON): the first FREE keepers start at once; the later ones
# never get to their command (a keeper slow to start on a busy machine, as Ctrl-C finds it).
SLOW_KEEPER = """#!{python}
import os, sys, time
index = 0
while True:
    try:
        os.close(os.open(os.path.join({folder!r}, f"keeper-{{index}}"), os.O_CREAT | os.O_EXCL))
        break
    except FileExistsError:
        index += 1
while index >= {free}:
    time.sleep(1)
os.execv(sys.executable, [sys.executable] + sys.argv[1:])
"""


def test_trials_that_had_not_started_at_ctrl_c_run_on_resume_with_their_parameters(tmp_path):
    """TPE, 2 at once, 8 trials, Ctrl-C after 4 ended while the next two keepers had not started their commands:
    those two did nothing, so they end neither USER_CANCELED nor with an exit code: they wait, with the
    parameters the tuner gave them, and `experiment resume` runs them and the rest: all 8 run."""
    slow = tmp_path / "slow-python"
    slow.write_text(SLOW_KEEPER.format(python=sys.executable, folder=str(tmp_path), free=4))
    slow.chmod(0o755)
    config = experiment(tmp_path, PLANE, TRIAL, maxTrialNumber=8, trialConcurrency=2,
                        tuner={"name": "TPE", "classArgs": {"optimize_mode": "minimize"}})
    said: list = []
    # Ctrl-C once 4 ended and the fifth trial's keeper started (it is held before its command: SLOW_KEEPER): two
    # trials that end together could bring the Ctrl-C before the loop submitted the fifth.
    exp = interrupted_after(config, 4, env={**os.environ, "TRIALKIT_PYTHON": str(slow)}, out=said,
                            marker=tmp_path / "keeper-4")
    before = {row["sequence"]: row for row in export(exp)}
    waiting = [row for row in before.values() if row["status"] != "SUCCEEDED"]
    # The fifth trial was submitted when the third ended, the sixth when the fourth did unless Ctrl-C came first.
    assert [(row["sequence"], row["status"], row["exit_code"]) for row in waiting] in \
        ([(4, "WAITING", None)], [(4, "WAITING", None), (5, "WAITING", None)]), before
    ids = ", ".join(row["trial_id"] for row in waiting)
    assert any(line.startswith(f"{len(waiting)} trial") and f"({ids}): `trialkit experiment resume {exp}` runs"
               in line for line in said), said
    shown = cli("trial", "show", f"{exp}-00004").stdout
    assert "WAITING: the experiment stopped before it started: `trialkit experiment resume` starts it" in shown, shown
    done = cli("experiment", "resume", exp)
    assert done.returncode == 0, done.stdout + done.stderr
    after = {row["sequence"]: row for row in export(exp)}
    assert [row["status"] for row in after.values()] == ["SUCCEEDED"] * 8, after
    assert [after[row["sequence"]]["parameters"] for row in waiting] == [row["parameters"] for row in waiting]
    assert [after[row["sequence"]]["restart_count"] for row in waiting] == [0] * len(waiting), after
