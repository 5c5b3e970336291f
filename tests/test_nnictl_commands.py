"""nnictl's everyday commands, trialkit's spelling: update, import, trial ls, against running experiments.

Experiments run for real (started through the Python API); trials wait for a
gate file, so the test decides when they end.
"""
from __future__ import annotations

import json

import pytest

from experiment_util import cli, experiment, experiment_id, export
from test_experiment_api import free_port, gated_experiment, statuses, until


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_update_changes_a_running_experiment_and_keeps_it_for_a_resume(tmp_path):
    exp = gated_experiment(tmp_path)
    exp.start(free_port())
    try:
        until("the first trial", lambda: statuses(exp) == ["RUNNING"])
        done = cli("experiment", "update", exp.id, "--trial-concurrency", 2)
        assert (done.returncode, done.stdout) == (0, f"updated experiment {exp.id}: trialConcurrency\n"), done.stderr
        until("a second trial", lambda: statuses(exp) == ["RUNNING", "RUNNING"])
        lowered = cli("experiment", "update", exp.id, "--max-trial-number", 1)  # below the trials made: said
        assert lowered.returncode == 0 and lowered.stdout.splitlines()[1] == (
            "note: 2 trials are made already, more than maxTrialNumber 1: no more start, and the experiment ends "
            "once those running end"), lowered.stdout
        space = tmp_path / "space.json"
        space.write_text(json.dumps({"x": {"_type": "choice", "_value": [7]}}))
        done = cli("experiment", "update", exp.id, "--max-trial-number", 3, "--max-experiment-duration", "2h",
                   "--search-space", space)
        assert done.returncode == 0, done.stderr
        refused = cli("experiment", "update", exp.id, "--trial-concurrency", 0)
        assert refused.returncode == 2 and "trialConcurrency" in refused.stderr
        assert cli("experiment", "update", exp.id).returncode == 2  # nothing to update
        listed = cli("trial", "ls", exp.id)  # nnictl trial ls
        assert listed.returncode == 0 and listed.stdout.count("RUNNING") == 2
        (tmp_path / "gate").touch()
        until("the end", lambda: exp.get_status() == "DONE")
    finally:
        exp.stop()
    jobs = exp.list_trial_jobs()
    assert [job.hyperParameters[0].parameters["x"] for job in jobs][2] == 7  # the new space's
    stored = exp.get_experiment_profile()["params"]
    assert (stored["trialConcurrency"], stored["maxTrialNumber"], stored["maxExperimentDuration"]) == (2, 3, 7200)


def test_import_teaches_the_tuner_results_from_an_earlier_export(tmp_path):
    # A grid of two points: the second, imported as already tried, is never run.
    exp = gated_experiment(tmp_path, max_trial_number=2)
    exp.config.tuner.name = "GridSearch"
    exp.config.search_space = {"x": {"_type": "choice", "_value": [1, 2]}}
    exp.start(free_port())
    try:
        until("the first trial", lambda: statuses(exp) == ["RUNNING"])
        first = exp.list_trial_jobs()[0].hyperParameters[0].parameters["x"]
        other = 3 - first
        exported = tmp_path / "nni_export.json"  # nnictl experiment export's shape: value as JSON text
        exported.write_text(json.dumps([{"parameter": {"x": other}, "value": json.dumps({"default": 0.5}),
                                         "trialJobId": "Ab1cD"}, {"parameter": {"x": other}, "value": None}]))
        done = cli("experiment", "import", exp.id, "-f", exported)
        assert (done.returncode, done.stdout) == (0, f"imported 1 results into experiment {exp.id}'s tuner\n"), \
            done.stderr
        empty = tmp_path / "empty.json"
        empty.write_text("[]")
        assert cli("experiment", "import", exp.id, "-f", empty).returncode == 2
        (tmp_path / "gate").touch()
        until("the end", lambda: exp.get_status() == "DONE")
    finally:
        exp.stop()
    assert [job.hyperParameters[0].parameters["x"] for job in exp.list_trial_jobs()] == [first]


def test_an_ended_experiment_gets_more_trials_by_update_then_resume(tmp_path):
    # nnictl's `update trialnum` on an experiment that reached its limit: here the update is kept for the resume
    # (it was refused: "has ended (DONE)", and the resume had "nothing left to run").
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2, 3, 4]}},
                        "import trialkit\ntrialkit.report_final_result(trialkit.get_next_parameter()['x'])\n",
                        maxTrialNumber=1, tuner={"name": "GridSearch"})
    exp = experiment_id(cli("run", config).stdout.splitlines()[0])
    assert "is DONE: it has nothing left to run" in cli("experiment", "resume", exp).stdout
    updated = cli("experiment", "update", exp, "--max-trial-number", 3)
    assert updated.returncode == 0 and updated.stdout == (
        f"updated experiment {exp}: maxTrialNumber 1 -> 3; its resume goes on with it (`trialkit experiment resume "
        f"{exp}`)\n"), updated.stdout + updated.stderr
    assert "trials      1 of 3" in cli("experiment", "show", exp).stdout
    resumed = cli("experiment", "resume", exp)
    assert resumed.returncode == 0 and f"resumed experiment {exp}" in resumed.stdout, resumed.stdout
    assert [row["parameters"]["x"] for row in export(exp)] == [1, 2, 3]  # the grid went on, no point again
    assert "why: maxTrialNumber (3) reached" in resumed.stdout
    refused = cli("experiment", "update", exp, "--max-trial-number", -1)  # checked as the config is
    assert refused.returncode == 2 and "maxTrialNumber" in refused.stderr
