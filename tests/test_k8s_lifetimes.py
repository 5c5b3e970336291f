"""How long a cluster trial's objects live (issue 23), against the stand-in API server.

- Pause deletes the job; the checkpoint claim stays (owned by nobody) and
  activate mounts the same claim again, on every kind with checkpoint storage.
- A finished job goes after its retention: a succeeded one sooner than a failed one.
- Removing the experiment leaves no object of it behind.
"""
from __future__ import annotations

import pytest

from harness import wait_until
from test_kube_client import TOKEN, api, client, spec  # noqa: F401 (fixtures)
from trialkit.platforms.kubernetes import adaptdljob, frameworkcontroller, kubeflow
from trialkit.platforms.kubernetes import render as k8s
from trialkit.platforms.kubernetes.client import ObjectRef
from trialkit.statuses import FAILED, SUCCEEDED

STORAGE = {"checkpoint": {"storageClass": "dfs", "storageSize": "2Gi"}}
COMMON = {"namespace": "team", "managerAddress": "10.0.0.2"}
KINDS = [
    (kubeflow, {"platform": "kubeflow", **COMMON, "dockerImage": "i:1", "master": {"replicas": 1},
                "worker": {"replicas": 2}}),
    (frameworkcontroller, {"platform": "frameworkcontroller", **COMMON, "dockerImage": "i:1",
                           "taskRoles": [{"name": "worker", "taskNumber": 2}]}),
    (adaptdljob, {"platform": "adaptdl", **COMMON, "image": "i:1"}),
]
IDS = ["kubeflow", "frameworkcontroller", "adaptdl"]


def platform_of(module, section, tmp_path, client):
    return module.Platform(module.parse_section(section, "trainingService"), tmp_path / "experiment", client=client)


def claims(api) -> dict:
    return {path.rsplit("/", 1)[-1]: obj for path, obj in api.objects.items() if "/persistentvolumeclaims/" in path}


def job_paths(api) -> list:
    return [path for path in api.objects if path.startswith("/apis/")]


def mounted_claims(job: dict) -> set:
    import k8s_schemas

    found = set()
    for template in k8s_schemas.pod_templates(job):
        for volume in template["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                found.add(volume["persistentVolumeClaim"]["claimName"])
    return found


@pytest.mark.parametrize("module, section", KINDS, ids=IDS)
def test_pause_then_activate_keeps_the_checkpoint_claim_and_mounts_it_again(api, client, tmp_path, module, section):
    platform = platform_of(module, {**section, **STORAGE}, tmp_path, client)
    assert platform.checkpoint_survives_stop
    handle = platform.submit(spec())
    checkpoint = k8s.checkpoint_claim_name(k8s.trial_names(spec(), getattr(module, "NAME_BUDGET", k8s.MAX_NAME),
                                                           "" if module is frameworkcontroller else "-"))
    before = claims(api)
    assert checkpoint in before and "ownerReferences" not in before[checkpoint]["metadata"]
    platform.stop(handle, grace=30)  # pause: the job goes, its pods checkpoint first
    assert job_paths(api) == [] and checkpoint in claims(api)
    uid = claims(api)[checkpoint]["metadata"]["uid"]
    platform.submit(spec())  # activate
    assert claims(api)[checkpoint]["metadata"]["uid"] == uid, "the same claim, data and all"
    job = api.objects[job_paths(api)[0]]
    assert checkpoint in mounted_claims(job)


@pytest.mark.parametrize("module, section", KINDS[:2], ids=IDS[:2])
def test_without_storage_the_platform_says_a_pause_loses_progress(api, client, tmp_path, module, section):
    platform = platform_of(module, section, tmp_path, client)
    assert not platform.checkpoint_survives_stop
    platform.submit(spec())
    assert claims(api) == {}


def finish(api, module, status: str) -> None:
    path = job_paths(api)[0]
    if module is adaptdljob:
        api.objects[path]["status"] = {"phase": "Succeeded" if status == SUCCEEDED else "Failed"}
    elif module is kubeflow:
        kind = "Succeeded" if status == SUCCEEDED else "Failed"
        api.objects[path]["status"] = {"conditions": [{"type": kind, "status": "True"}]}
    else:
        name = "Succeeded" if status == SUCCEEDED else "Failed"
        api.objects[path]["status"] = {"state": "Completed",
                                       "attemptStatus": {"completionStatus": {"code": 0 if name == "Succeeded" else 1,
                                                                              "type": {"name": name}}}}


@pytest.mark.parametrize("module, section", KINDS, ids=IDS)
def test_a_finished_job_goes_after_its_retention_a_failed_one_later(api, client, tmp_path, module, section):
    keep = {"keepFinishedJobs": {"succeeded": 0.3, "failed": "1h"}}
    platform = platform_of(module, {**section, **STORAGE, **keep}, tmp_path, client)
    succeeded = platform.submit(spec("t1"))
    finish(api, module, SUCCEEDED)
    assert platform.status(succeeded).status == SUCCEEDED
    assert job_paths(api), "kept for its retention"
    wait_until(lambda: not job_paths(api), 10, "the succeeded job to be deleted")
    assert claims(api), "claims go with the experiment, not with the job"
    failed = platform.submit(spec("t2"))
    finish(api, module, FAILED)
    assert platform.status(failed).status == FAILED
    for _ in range(3):
        assert platform.status(failed).status == FAILED  # asked again: one timer, not one per call
    assert len(platform._expiring) == 2
    assert job_paths(api), "a failed job stays for `kubectl describe`"
    platform.remove_experiment("exp1", ["t1", "t2"])


@pytest.mark.parametrize("module, section", KINDS, ids=IDS)
def test_removing_the_experiment_leaves_no_object_behind(api, client, tmp_path, module, section):
    platform = platform_of(module, {**section, **STORAGE}, tmp_path, client)
    for trial in ("t1", "t2"):
        platform.submit(spec(trial))
    platform.stop(ObjectRef.of(api.objects[job_paths(api)[0]]).__str__(), grace=30)  # one paused, one running
    assert api.objects
    removed = platform.remove_experiment("exp1", ["t1", "t2"])
    assert api.objects == {}, sorted(api.objects)
    assert removed and all(TOKEN not in ref for ref in removed)
    assert platform.remove_experiment("exp1", ["t1", "t2"]) == []  # twice: nothing left, no error


def test_the_end_of_the_experiment_gives_back_the_checkpoint_claims_but_keeps_the_jobs_and_tensorboard(
        api, client, tmp_path):
    platform = platform_of(adaptdljob, {**KINDS[2][1], **STORAGE}, tmp_path, client)
    platform.submit(spec("t1"))
    assert len(claims(api)) == 3
    platform.experiment_ended("exp1", ["t1"])
    # The TensorBoard data stays until `experiment delete`: it can be served after the experiment.
    assert list(claims(api)) == [adaptdljob.tensorboard_name("exp1")]
    assert len(job_paths(api)) == 1, "a finished job goes with its retention"


# --- through the command line, against the stand-in API server -----------------


def kubeflow_config(tmp_path, storage: bool = True):
    import yaml

    folder = tmp_path / "project"
    folder.mkdir()
    config = {"searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}}, "trialCommand": "python3 train.py",
              "trialConcurrency": 2, "maxTrialNumber": 2, "tuner": {"name": "GridSearch"},
              "trainingService": {"platform": "kubeflow", "namespace": "team", "managerAddress": "10.0.0.2",
                                  "dockerImage": "i:1", "master": {"replicas": 1}, **(STORAGE if storage else {})}}
    path = folder / "config.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("kubeconfig, says", [
    ("missing", "cannot use the Kubernetes configuration"),
    ("unreachable", "the Kubernetes API server does not answer"),
])
def test_no_cluster_stops_run_before_the_manager_starts(tmp_path, monkeypatch, kubeconfig, says):
    from k8s_fake_api import FakeApiServer
    from experiment_util import cli

    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    if kubeconfig == "missing":
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-file"))
    else:
        with FakeApiServer() as gone:
            path = gone.kubeconfig(tmp_path)
        monkeypatch.setenv("KUBECONFIG", str(path))  # a server that was there and is not any more
    done = cli("run", kubeflow_config(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr
    assert not (home / "experiments").exists() or not any((home / "experiments").iterdir())


def test_run_stop_then_delete_leaves_nothing_on_the_cluster(api, tmp_path, monkeypatch):
    import json as json_module

    from experiment_util import cli, experiment_id, start_cli

    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    proc = start_cli("run", kubeflow_config(tmp_path))
    try:
        exp = experiment_id(proc.stdout.readline())
        wait_until(lambda: len(job_paths(api)) == 2, 60, "two trials submitted")
        assert len(claims(api)) == 2
        stopped = cli("experiment", "stop", exp)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert job_paths(api) == [] and claims(api) == {}, "stopped: jobs stopped, claims given back"
    # The ConfigMaps and Secrets the jobs owned (no garbage collector here), the pods' account until the delete.
    left = sorted(api.objects)
    assert left and all(any(kind in path for kind in ("/configmaps/", "/secrets/", "/serviceaccounts/")) for path in left)
    refused = cli("experiment", "delete", exp)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    deleted = cli("experiment", "delete", exp, "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert api.objects == {}, sorted(api.objects)
    assert not (home / "experiments" / exp).exists()
    assert json_module.loads(cli("experiment", "list", "--json").stdout or "[]") == [] or exp not in cli(
        "experiment", "list").stdout


@pytest.mark.parametrize("storage", [True, False])
def test_pause_says_when_progress_will_be_lost(api, tmp_path, monkeypatch, storage):
    from experiment_util import cli, experiment_id, start_cli

    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    proc = start_cli("run", kubeflow_config(tmp_path, storage))
    try:
        exp = experiment_id(proc.stdout.readline())
        wait_until(lambda: len(job_paths(api)) == 2, 60, "two trials submitted")
        paused = cli("trial", "pause", f"{exp}-00000")
        assert paused.returncode == 0, paused.stderr
        lost = "warning: this platform keeps no checkpoint over a pause"
        assert (lost in paused.stdout) is not storage, paused.stdout
        assert cli("experiment", "stop", exp).returncode == 0
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_retention_deletion_the_api_server_refuses_is_one_line_not_a_threads_traceback(api, client, tmp_path,
                                                                                         capfd):
    module, section = KINDS[0]
    platform = platform_of(module, {**section, "keepFinishedJobs": {"succeeded": 0.2}}, tmp_path, client)
    handle = platform.submit(spec("t1"))
    finish(api, module, SUCCEEDED)
    assert platform.status(handle).status == SUCCEEDED
    api.faults.extend(["503"] * 8)  # more than the client's attempts: the timer's deletion fails
    platform._expiring[handle].join(10)
    err = capfd.readouterr().err
    assert [line for line in err.splitlines() if line] == [
        f"trialkit: the finished job is left in the cluster: get {handle}: 503 injected 503"], err
    assert job_paths(api), "left, and said so"
