"""Ray trials outlive their control plane and carry the same context as local trials (issue 19).

On the session's real two-raylet cluster:
- the control plane is killed with SIGKILL while four trials run; `experiment
  resume` finds them again by their actors' names: each ends SUCCEEDED with
  restart count 0 and every record stored once, including the trial that ended
  while nobody listened (its result and its undelivered records are collected);
- a Ray trial's code is the experiment's context: a `.trialignore`d file is not
  there, startup-hook.sh ran, the code dir on this machine is not where it runs.
"""
from __future__ import annotations

import json
import time

import pytest

from experiment_util import cli, experiment, experiment_id, export, start_cli, stored
from harness import wait_until
from trialkit import layout

pytestmark = pytest.mark.slow

STEPPING = """
import time, trialkit
p = trialkit.get_next_parameter()
for step in range(p["steps"]):
    trialkit.report_intermediate_result(step)
    time.sleep(0.25)
trialkit.report_final_result(p["x"])
"""


def statuses(trials_dir) -> list:
    out = []
    for path in sorted(trials_dir.glob(f"*/{layout.HOME}/{layout.STATUS}")):
        try:
            out.append(json.loads(path.read_text()).get("status"))
        except ValueError:
            out.append(None)  # being replaced
    return out


def test_sigkill_of_the_control_plane_then_resume_restarts_no_ray_trial(ray_cluster, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    # Two trials end within 2 s (while the control plane is away), two run ~12 s.
    space = {"steps": {"_type": "choice", "_value": [8, 48]}, "x": {"_type": "choice", "_value": [0.1, 0.9]}}
    config = experiment(tmp_path, space, STEPPING, maxTrialNumber=4, trialConcurrency=4, nniManagerIp="127.0.0.1",
                        tuner={"name": "GridSearch"},
                        trainingService={"platform": "ray", "address": ray_cluster.address, "cpusPerTrial": 0.5})
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        trials_dir = home / "experiments" / exp / "trials"
        deadline = time.monotonic() + 120
        while statuses(trials_dir).count("RUNNING") < 4:
            assert time.monotonic() < deadline, f"four trials never ran: {statuses(trials_dir)}"
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
    finally:
        proc.kill()  # SIGKILL: no cleanup at all
        proc.wait()
    # The short trials end with no manager to hear them; the long ones run on.
    wait_until(lambda: statuses(trials_dir).count("SUCCEEDED") == 2, 60, "the short trials to end")
    assert statuses(trials_dir).count("RUNNING") == 2
    done = cli("experiment", "resume", exp, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "restarting it" not in done.stdout
    rows = export(exp)
    assert len(rows) == 4
    for row in rows:
        assert (row["status"], row["restart_count"]) == ("SUCCEEDED", 0), row
        assert row["final"] == row["parameters"]["x"]
        assert row["intermediate"] == list(range(row["parameters"]["steps"])), "every step once, in order"
    finals = stored(home, exp, "SELECT COUNT(*) FROM records WHERE type='FINAL'")[0][0]
    periodical = stored(home, exp, "SELECT COUNT(*) FROM records WHERE type='PERIODICAL'")[0][0]
    assert (finals, periodical) == (4, 2 * 8 + 2 * 48)
    ray_cluster.wait_clean()  # every actor released after the resumed run


def test_a_ray_trial_gets_the_experiments_context(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    script = """
import os, trialkit
trialkit.get_next_parameter()
here = sorted(os.listdir("."))
print("HERE", " ".join(here), "CWD", os.getcwd(), "HOOK", os.environ.get("FROM_HOOK"), flush=True)
trialkit.report_final_result(1.0 if "secret.txt" not in here and "helper.py" in here else 0.0)
"""
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, script, maxTrialNumber=1,
                        nniManagerIp="127.0.0.1", trialCodeDirectory=".",
                        trainingService={"platform": "ray", "address": ray_cluster.address})
    code = config.parent
    (code / "helper.py").write_text("ANSWER = 42\n")
    (code / "secret.txt").write_text("not for the cluster\n")
    (code / "data").mkdir()
    (code / "data" / "big.bin").write_bytes(b"0" * 1024)
    (code / ".trialignore").write_text("secret.txt\ndata/\n")
    (code / "startup-hook.sh").write_text("export FROM_HOOK=yes\n")
    done = cli("run", config, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    (row,) = export(exp)
    assert (row["status"], row["final"]) == ("SUCCEEDED", 1.0)
    log = (tmp_path / "home" / "experiments" / exp / "trials" / row["trial_id"] / "stdout.log").read_text()
    line = next(text for text in log.splitlines() if text.startswith("HERE"))
    assert "helper.py" in line and "trial.py" in line and "secret.txt" not in line and " data " not in line
    assert "HOOK yes" in line
    assert f"CWD {code}" not in line, "it runs in Ray's copy of the context, not in the code dir here"
    ray_cluster.wait_clean()


CHECKPOINTED = """
import pathlib, time, trialkit
p = trialkit.get_next_parameter()
mark = pathlib.Path(trialkit.checkpoint_dir()) / "step"
if mark.exists():
    print("resumed from", mark.read_text(), flush=True)
else:
    trialkit.report_intermediate_result(0.5)
    mark.write_text("7")
    print("saved", flush=True)
    time.sleep(p["sleep"])
trialkit.report_final_result(p["x"])
"""


def test_a_trial_whose_node_dies_restarts_from_its_checkpoint(ray_cluster, tmp_path, monkeypatch):
    if "node2" not in ray_cluster.nodes:
        ray_cluster.start_node("node2")
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    # One trial a node (1.5 of each node's 2 CPUs); the trial on node2 dies with it.
    space = {"x": {"_type": "choice", "_value": [1, 2]}, "sleep": {"_type": "choice", "_value": [25]}}
    config = experiment(tmp_path, space, CHECKPOINTED, maxTrialNumber=2, trialConcurrency=2, nniManagerIp="127.0.0.1",
                        tuner={"name": "GridSearch"}, maxTrialRestarts=1,
                        trainingService={"platform": "ray", "address": ray_cluster.address, "cpusPerTrial": 1.5})
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        trials_dir = home / "experiments" / exp / "trials"
        deadline = time.monotonic() + 120
        while sum("saved" in (d / "stdout.log").read_text() for d in trials_dir.glob("*") if (d / "stdout.log").exists()) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        ray_cluster.crash_node("node2")
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ray_cluster.start_node("node2")
    assert proc.returncode == 0, out + err
    assert "restart 1 of 1 after: its Ray worker is gone" in out, out
    rows = {row["parameters"]["x"]: row for row in export(exp)}
    assert all(row["status"] == "SUCCEEDED" and row["final"] == x for x, row in rows.items()), rows
    restarted = [row for row in rows.values() if row["restart_count"] == 1]
    assert len(restarted) == 1 and [row["restart_count"] for row in rows.values()].count(0) == 1
    log = (trials_dir / restarted[0]["trial_id"] / "stdout.log").read_text()
    assert "resumed from 7" in log
    runs = [row for row in json.loads(cli("experiment", "export", exp, "--all-runs").stdout)
            if row["trial_id"] == restarted[0]["trial_id"]]
    assert len(runs) == 2, "each run kept apart"
    ray_cluster.wait_clean()
