"""A resumed search never proposes a point it already tried, for every tuner.

The user's day: `trialkit run` of a 10-trial search at concurrency 2, Ctrl-C
once four trials ended, `trialkit experiment resume`; every one of the ten
trials has parameters of its own. On the tuner's side: a tuner rebuilt from
the store (replay) proposes what the uninterrupted tuner proposes next, and a
space with fewer points than maxTrialNumber ends when each point was tried.
"""
from __future__ import annotations

import json

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


def test_a_search_of_a_small_space_ends_when_each_point_was_tried(tmp_path):
    space = {"x": {"_type": "choice", "_value": [1, 2]}, "y": {"_type": "choice", "_value": [-2, 0]}}
    config = experiment(tmp_path, space, TRIAL.replace("time.sleep(0.4)", ""), maxTrialNumber=10,
                        tuner={"name": "TPE", "classArgs": {"optimize_mode": "minimize"}})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "search space exhausted: each of its 4 points was tried; no new trial starts" in done.stdout
    rows = export(experiment_id(done.stdout.splitlines()[0]))
    assert sorted((row["parameters"]["x"], row["parameters"]["y"]) for row in rows) == [(1, -2), (1, 0), (2, -2), (2, 0)]
