"""maxTrialRestarts (issue 23): a trial that fails for a cause not its own starts again
from its checkpoint; one that fails by its own exit code does not.

Local trials, real keepers: the cause that is not the trial's own is its keeper
killed with SIGKILL (as when its machine's OOM killer picks it). Kubernetes:
the pods' own account of an eviction or an OOM kill, through the status mapping.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from experiment_util import cli, experiment, experiment_id, export, start_cli
from trialkit import layout
from trialkit.platforms.base import PlatformStatus
from trialkit.platforms.kubernetes.platform import trial_status
from trialkit.statuses import FAILED, SUCCEEDED

# Resumes from its checkpoint if there is one; else saves one, says so, and waits to be killed.
RESUMING = """
import os, pathlib, time, trialkit
p = trialkit.get_next_parameter()
mark = pathlib.Path(trialkit.checkpoint_dir()) / "step"
if p["x"] == 3:
    raise SystemExit(3)  # its own failure: never retried
if mark.exists():
    print("resumed from", mark.read_text(), flush=True)
    trialkit.report_final_result(p["x"])
else:
    mark.write_text("7")
    print("saved; waiting", flush=True)
    time.sleep(120)
"""


def keeper_pid(trial_dir) -> int:
    return int(layout.pidfile_path(trial_dir).read_text().split()[0])


def saved(trial_dir) -> bool:
    log = trial_dir / "stdout.log"
    return log.exists() and "saved; waiting" in log.read_text()


@pytest.mark.parametrize("restarts", [1, 0])
def test_a_trial_whose_keeper_was_killed_restarts_from_its_checkpoint(tmp_path, monkeypatch, restarts):
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 3]}}, RESUMING, maxTrialNumber=2,
                        trialConcurrency=2, tuner={"name": "GridSearch"}, maxTrialRestarts=restarts)
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        trials = home / "experiments" / exp / "trials"
        deadline = time.monotonic() + 60
        while not any(saved(d) for d in trials.glob("*")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        waiting = next(d for d in trials.glob("*") if saved(d))
        os.kill(keeper_pid(waiting), signal.SIGKILL)  # not the trial's doing
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rows = {row["parameters"]["x"]: row for row in export(exp)}
    assert (rows[3]["status"], rows[3]["exit_code"], rows[3]["restart_count"]) == (FAILED, 3, 0)
    if restarts:
        assert (rows[1]["status"], rows[1]["restart_count"], rows[1]["final"]) == (SUCCEEDED, 1, 1)
        assert "restart 1 of 1 after: the keeper ended (signal SIGKILL" in out, out
        assert "resumed from 7" in (waiting / "stdout.log").read_text()
    else:
        assert (rows[1]["status"], rows[1]["restart_count"]) == (FAILED, 0)
        assert "the keeper ended" in rows[1]["reason"]


def test_a_config_refuses_a_negative_restart_count(tmp_path):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, "pass\n", maxTrialRestarts=-1)
    done = cli("run", config)
    assert done.returncode == 2 and "maxTrialRestarts" in done.stderr and len(done.stderr.splitlines()) == 1


def pod(name: str, status: dict) -> dict:
    return {"metadata": {"name": name}, "spec": {"containers": []}, "status": status}


@pytest.mark.parametrize("pods, retryable, says", [
    ([pod("p0", {"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."})], True,
     "p0: Evicted: The node was low on memory."),
    ([pod("p0", {"containerStatuses": [{"name": "trial", "state": {"terminated": {"reason": "OOMKilled",
                                                                                  "exitCode": 137}}}]})],
     True, "p0: OOMKilled"),
    ([pod("p0", {"containerStatuses": [{"name": "trial", "state": {"terminated": {"reason": "Error",
                                                                                  "exitCode": 3}}}]})],
     False, "BackoffLimitExceeded"),
])
def test_kubernetes_failures_the_cluster_caused_are_retryable(pods, retryable, says):
    status = trial_status(PlatformStatus(FAILED, "BackoffLimitExceeded"), pods)
    assert status.status == FAILED and status.retryable is retryable
    assert says in status.reason
    assert not trial_status(PlatformStatus(SUCCEEDED), pods).retryable
