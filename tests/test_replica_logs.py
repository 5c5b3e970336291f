"""Every pod of a multi-pod trial ships its output, by rank, and it stays readable after the pods are gone.

Two real keepers play the two pods of a FrameworkController trial (task
roles ps then worker, the worker reporting) against a real manager on
loopback: the worker's records go to the store as always, the ps's output to
its rank's route, kept in the experiment dir; `trialkit trial logs --rank 0`
prints it once both keepers (the pods) are gone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from keeper_util import keeper, py
from trialkit.manager import paths, replica_logs
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
from trialkit.platforms.kubernetes import frameworkcontroller


@pytest.fixture
def trial(tmp_path, monkeypatch):
    """(manager, experiment dir, trial id) with the trial's token `tok`."""
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    experiment = paths.new_experiment_id()
    experiment_dir = paths.create_experiment_dir(experiment, None)
    store = Store.in_dir(experiment_dir)
    store.create_experiment(experiment)
    trial_id = paths.trial_id(experiment, 0)
    store.add_trial(experiment, trial_id, sequence=0, parameters={"x": 3}, token="tok")
    store.add_trial(experiment, paths.trial_id(experiment, 1), sequence=1, parameters={}, token="other")
    server = ManagerServer(store).start()
    yield server, experiment_dir, trial_id
    server.stop()
    store.close()


def pod(trial_env, tmp_path, manager, trial_id, role: str, offset: int) -> dict:
    """A pod's environment as the FrameworkController renderer and operator give it."""
    return {**trial_env, "TRIALKIT_TRIAL_DIR": str(tmp_path / role), "TRIALKIT_MANAGER_URL": manager.url,
            "TRIALKIT_TOKEN": "tok", "TRIALKIT_TRIAL_ID": trial_id, "TRIALKIT_CHIEF_ROLE": "worker",
            "TRIALKIT_RANK_OFFSET": str(offset), "FC_TASKROLE_NAME": role, "FC_TASK_INDEX": "0"}


SAY = "import sys, trialkit; print(sys.argv[1], 'says hi', flush=True); trialkit.report_final_result(float(sys.argv[2]))"


def test_the_other_replicas_output_is_kept_by_rank_and_read_after_the_pods(trial, trial_env, tmp_path):
    manager, experiment_dir, trial_id = trial
    ps = keeper(py(SAY, "ps", "1"), pod(trial_env, tmp_path, manager, trial_id, "ps", 0))
    worker = keeper(py(SAY, "worker", "2"), pod(trial_env, tmp_path, manager, trial_id, "worker", 1))
    assert ps.wait() == 0 and worker.wait() == 0
    assert replica_logs.read(experiment_dir, trial_id, 0) == "ps says hi\n"
    stored = manager.store.records_for(trial_id, "LOG")
    assert "".join(r["value"]["text"] for r in stored) == "worker says hi\n"
    assert [r["value"] for r in manager.store.records_for(trial_id, "FINAL")] == [2.0]  # the reporting one's only
    env = {**os.environ, paths.HOME_ENV: os.environ[paths.HOME_ENV]}
    shown = subprocess.run([sys.executable, "-m", "trialkit.cli", "trial", "logs", trial_id, "--rank", "0"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert (shown.returncode, shown.stdout) == (0, "ps says hi\n"), shown.stderr
    reporting = subprocess.run([sys.executable, "-m", "trialkit.cli", "trial", "logs", trial_id, "--rank", "1"],
                               capture_output=True, text=True, env=env, timeout=60)
    assert (reporting.returncode, reporting.stdout) == (0, "worker says hi\n"), reporting.stderr


def post(manager, trial_id: str, token: str, batch: list, **spool: str) -> tuple:
    request = urllib.request.Request(f"{manager.url}/api/v1/trials/{trial_id}/replicas/2/records",
                                     data=json.dumps({**spool, "records": batch}).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def log(seq: int, text: str) -> dict:
    return {"seq": seq, "type": "LOG", "trial_job_id": "t", "value": {"stream": "stdout", "text": text}}


def test_a_batch_sent_again_is_kept_once_and_only_with_the_trials_token(trial):
    manager, experiment_dir, trial_id = trial
    batch = [log(1, "a\n"), {"seq": 2, "type": "FINAL", "value": 1.0}, log(3, "b\n")]
    assert post(manager, trial_id, "tok", batch) == (200, {"acked": 3, "inserted": 2})
    assert post(manager, trial_id, "tok", batch + [log(4, "c\n")]) == (200, {"acked": 4, "inserted": 1})
    assert post(manager, trial_id, "tok", [log(6, "after a gap\n")])[1]["acked"] == 4
    assert replica_logs.read(experiment_dir, trial_id, 2) == "a\nb\nc\n"
    assert post(manager, trial_id, "other", [log(5, "x\n")])[0] == 403
    assert post(manager, trial_id, "nope", [log(5, "x\n")])[0] == 401
    assert replica_logs.read(experiment_dir, trial_id, 2) == "a\nb\nc\n"


def test_a_replica_restarted_on_a_fresh_spool_keeps_its_output_after_the_earlier_runs(trial):
    """A replica's pod started again (a new pod: its spool numbers from 1 again) is not taken for a resend."""
    manager, experiment_dir, trial_id = trial
    assert post(manager, trial_id, "tok", [log(1, "run 0\n"), log(2, "ends\n")], spool="a1") == (
        200, {"acked": 2, "inserted": 2})
    assert post(manager, trial_id, "tok", [log(1, "run 1\n")], spool="b2") == (200, {"acked": 1, "inserted": 1})
    assert post(manager, trial_id, "tok", [log(1, "run 1\n"), log(2, "goes on\n")], spool="b2") == (
        200, {"acked": 2, "inserted": 1})
    assert post(manager, trial_id, "tok", [log(2, "ends\n")], spool="a1")[1] == {"acked": 2, "inserted": 0}
    assert replica_logs.read(experiment_dir, trial_id, 2) == "run 0\nends\nrun 1\ngoes on\n"
    assert post(manager, trial_id, "tok", [log(3, "x\n")], spool="../x")[0] == 400


def test_the_renderers_give_each_pod_its_rank(tmp_path):
    section = {"platform": "frameworkcontroller", "managerAddress": "10.0.0.2", "dockerImage": "img",
               "taskRoles": [{"name": "ps", "taskNumber": 2}, {"name": "worker", "taskNumber": 3}]}
    from test_k8s_code import spec_of

    config = frameworkcontroller.parse_section(section, "trainingService")
    job = frameworkcontroller.render(config, spec_of())[-1]
    offsets = {role["name"]: {e["name"]: e.get("value") for e in role["task"]["pod"]["spec"]["containers"][0]["env"]}
               ["TRIALKIT_RANK_OFFSET"] for role in job["spec"]["taskRoles"]}
    assert offsets == {"ps": "0", "worker": "2"}
