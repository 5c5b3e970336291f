"""Kubeflow Trainer v2's TrainJob as a platform (trialkit/platforms/kubernetes/trainjob.py).

Rendered objects are validated strictly against Trainer's TrainJob CRD (tests/fixtures/crds) and, for the
pods, against Kubernetes' own schemas after Trainer's merge of the runtime, the trainer and the patches
(trainer_play). The cluster-facing part runs against the stand-in API server through the official client:
`operator` left unset follows what the cluster serves (API discovery).
"""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import yaml

import k8s_schemas
import trainer_play
from k8s_fake_api import FakeApiServer
from test_kube_client import TOKEN, api, client, spec  # noqa: F401 (fixtures)
from trialkit.control.config import load_config
from trialkit.errors import UserError
from trialkit.platforms.base import TrialSpec
from trialkit.platforms.kubernetes import kubeflow, trainjob
from trialkit.platforms.kubernetes import render as k8s
from trialkit.statuses import FAILED, RUNNING, SUCCEEDED, WAITING

SECTION = {"platform": "kubeflow", "operator": "trainjob", "namespace": "team", "managerAddress": "10.0.0.2",
           "dockerImage": "trainer:1", "master": {"replicas": 1, "cpuNumber": 2, "memorySize": "4g"},
           "worker": {"replicas": 2, "cpuNumber": 2, "memorySize": "4g"},
           "checkpoint": {"storageClass": "local", "storageSize": "1Gi"}, "serviceAccountName": "trials",
           "imagePullSecrets": [{"name": "registry"}], "keeperGraceSeconds": 40}


def trial(command: str = "python3 -m trialkit.launch.torch_distributed train.py") -> TrialSpec:
    return TrialSpec("Exp1aB", "Exp1aB-00007", 7, command,
                     env={"TRIALKIT_TOKEN": TOKEN, "TRIALKIT_MANAGER_URL": "http://127.0.0.1:8081/api/v1",
                          "TRIALKIT_PARAMETERS": '{"lr": 0.1}', "TRIALKIT_RESTART_COUNT": "2"})


def rendered(section: dict = SECTION, command: str = "python3 -m trialkit.launch.torch_distributed train.py"):
    config = kubeflow.parse_section(copy.deepcopy(section), "trainingService")
    objects = k8s.render_trial(config, trial(command))
    k8s_schemas.validate_objects(objects)
    assert TOKEN not in json.dumps(objects)
    return config, objects


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_a_trainjob_carries_code_keeper_token_volumes_and_grace():
    config, objects = rendered()
    assert [o["kind"] for o in objects] == ["Secret", "ConfigMap", "PersistentVolumeClaim", "TrainJob"]
    job = objects[-1]
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                         "name": "torch-distributed"}
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 3 and trainer["image"] == "trainer:1"
    assert trainer["command"] == k8s.RUN_COMMAND and "args" not in trainer
    assert trainer["resourcesPerNode"]["limits"] == {"cpu": "2", "memory": "4096Mi"}
    # What Trainer makes of it: every node pod runs run.sh with the contract, the token from the Secret.
    [node] = trainer_play.templates(job).values()
    template, count = node
    assert count == 3
    container = next(c for c in template["spec"]["containers"] if c["name"] == "node")
    env = env_of(container)
    assert env["TRIALKIT_TOKEN"] == {"secretKeyRef": {"name": job["metadata"]["name"], "key": "TRIALKIT_TOKEN"}}
    assert env["TRIALKIT_COMMAND"] == "python3 -m trialkit.launch.torch_distributed train.py"
    assert env["TRIALKIT_RESTART_COUNT"] == "2" and env["TRIALKIT_GRACE_SECONDS"] == "40"
    assert env["TRIALKIT_TASK_INDEX"] == {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert (env["TRIALKIT_CHIEF_ROLE"], env["TRIALKIT_ROLE"], env["TRIALKIT_RANK_OFFSET"]) == ("node", "node", "0")
    assert "MASTER_ADDR" not in env and not any(name.startswith("PET_") for name in env)  # Trainer's to set
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {k8s.SCRIPTS_DIR, k8s.POD_TRIAL_DIR, k8s.POD_CHECKPOINT_DIR} <= mounts
    spec = template["spec"]
    assert spec["terminationGracePeriodSeconds"] > 40 and spec["serviceAccountName"] == "trials"
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert template["metadata"]["labels"][k8s.LABEL_TRIAL] == "Exp1aB-00007"  # the platform's pod selector
    assert "lifecycle" not in container  # no preStop: the keeper is PID 1 and gets the kubelet's SIGTERM itself
    assert len(job["metadata"]["name"]) <= trainjob.NAME_BUDGET


def test_a_prestop_hook_cannot_ride_a_runtime_patch():
    """Why trialkit ships no preStop with a TrainJob: the CRD refuses a container patch that carries one."""
    _, objects = rendered()
    job = copy.deepcopy(objects[-1])
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    patch["template"]["spec"]["template"]["spec"]["containers"][0]["lifecycle"] = {
        "preStop": {"exec": {"command": k8s.CLEANUP_COMMAND}}}
    with pytest.raises(AssertionError, match="lifecycle"):
        k8s_schemas.validate_job(job)


@pytest.mark.parametrize("command, runtime, jobs", [
    ("python3 -m trialkit.launch.deepspeed train.py --deepspeed_config ds.json", "deepspeed-distributed",
     ["launcher", "node"]),
    ("python3 -m determined.launch.deepspeed --trial model_def:Trial", "deepspeed-distributed", ["launcher", "node"]),
    ("python3 train.py", "torch-distributed", ["node"]),
])
def test_the_runtime_follows_the_launcher(command, runtime, jobs):
    _, objects = rendered({**SECTION, "master": {"replicas": 1}, "worker": {"replicas": 1}}, command)
    job = objects[-1]
    assert job["spec"]["runtimeRef"]["name"] == runtime
    patched = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert [entry["name"] for entry in patched] == jobs


def test_the_runtime_key_names_the_runtime():
    _, objects = rendered({**SECTION, "runtime": "torch-distributed", "master": {"replicas": 1},
                           "worker": {"replicas": 1}}, "python3 -m trialkit.launch.deepspeed t.py")
    assert objects[-1]["spec"]["runtimeRef"]["name"] == "torch-distributed"


def test_the_nodes_account_is_the_configs_else_the_templates_patch_else_one_with_no_rights(tmp_path):
    def accounts(section):
        _, objects = rendered(section)
        pods = {template["spec"].get("serviceAccountName") for template, _ in trainer_play.templates(objects[-1]).values()}
        return pods, [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]

    own = k8s.trial_service_account_name(k8s.trial_names(trial()))
    unnamed = {key: value for key, value in SECTION.items() if key != "serviceAccountName"}
    assert accounts(unnamed) == ({own}, [own])
    assert accounts(SECTION) == ({"trials"}, [])
    # A trialTemplate's own patch that names one keeps it (as a PyTorchJob template's pod does).
    template = {"apiVersion": trainjob.API_VERSION, "kind": "TrainJob", "metadata": {"name": "t"},
                "spec": {"runtimeRef": {"name": "torch-distributed"}, "runtimePatches": [
                    {"manager": "example.com/team", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                        {"name": "node", "template": {"spec": {"template": {
                            "spec": {"serviceAccountName": "team-reader"}}}}}]}}}}]}}
    path = tmp_path / "trainjob.yaml"
    path.write_text(yaml.safe_dump(template))
    assert accounts({**unnamed, "trialTemplate": str(path)})[0] == {"team-reader"}


@pytest.mark.parametrize("command", ["python3 -m trialkit.launch.torch_distributed t.py",
                                     "python3 -m trialkit.launch.deepspeed t.py"])
def test_every_node_container_gets_the_checkpoint_stores_secret_for_run_sh_to_export(command):
    """A TrainJob takes no envFrom: each pod that runs run.sh (the trainer's container) mounts the Secret named by
    checkpointStorage.secretName read-only under TRIALKIT_ENV_FROM_DIR, whose keys run.sh exports; a pod that runs
    the runtime's own command (deepspeed-distributed's nodes: sshd, whose ssh sessions see none of the container's
    environment) would hold the keys and export none: it does not mount it."""
    config = kubeflow.parse_section(copy.deepcopy(SECTION), "trainingService")
    objects = k8s.render_trial(config, dataclasses.replace(trial(command), env_from_secrets=("s3-creds",)))
    k8s_schemas.validate_objects(objects)
    pods = trainer_play.templates(objects[-1])
    containers = [(template, container) for template, _ in pods.values()
                  for container in template["spec"]["containers"] if container.get("command") == k8s.RUN_COMMAND]
    assert containers
    for template, container in containers:
        volume = next(v for v in template["spec"]["volumes"] if v.get("secret") == {"secretName": "s3-creds"})
        [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] and mount["mountPath"].rsplit("/", 1)[0] == env_of(container)["TRIALKIT_ENV_FROM_DIR"]
    holders = {job for job, (template, _) in pods.items()
               if any(v.get("secret") == {"secretName": "s3-creds"} for v in template["spec"].get("volumes", []))}
    exporters = {job for job, (template, _) in pods.items()
                 if any(c.get("command") == k8s.RUN_COMMAND for c in template["spec"]["containers"])}
    assert holders == exporters == ({"launcher"} if "deepspeed" in command else {"node"}), (holders, exporters)
    assert "TRIALKIT_ENV_FROM_DIR" not in {e["name"] for e in rendered()[1][-1]["spec"]["trainer"]["env"]}


def test_code_in_the_image_is_run_from_there():
    _, objects = rendered({**SECTION, "workingDir": "/workspace"})
    assert {"name": "TRIALKIT_CODE_DIR", "value": "/workspace"} in objects[-1]["spec"]["trainer"]["env"]


def test_an_nni_v1_config_with_operator_trainjob(tmp_path):
    (tmp_path / "space.json").write_text('{"lr": {"_type": "choice", "_value": [0.1]}}')
    (tmp_path / "config.yml").write_text(yaml.safe_dump({
        "authorName": "me", "experimentName": "v1", "trialConcurrency": 1, "maxTrialNum": 1,
        "searchSpacePath": "space.json", "trainingServicePlatform": "kubeflow", "nniManagerIp": "10.0.0.2",
        "tuner": {"builtinTunerName": "Random"},
        "trial": {"worker": {"replicas": 2, "command": "python3 train.py", "gpuNum": 1, "cpuNum": 1, "memoryMB": 2048,
                             "image": "trainer:1"}},
        "kubeflowConfig": {"operator": "trainjob", "apiVersion": "v1alpha1"}}))
    config = load_config(tmp_path / "config.yml")
    objects = k8s.render_trial(config.training_service, trial("python3 train.py"))
    k8s_schemas.validate_objects(objects)
    trainer = objects[-1]["spec"]["trainer"]
    assert trainer["numNodes"] == 2
    assert trainer["resourcesPerNode"]["limits"] == {"cpu": "1", "memory": "2048Mi", "nvidia.com/gpu": "1"}


@pytest.mark.parametrize("change, says", [
    ({"master": {"replicas": 1, "command": "a"}, "worker": {"replicas": 1, "command": "b"}},
     "trainingService.worker: master and worker differ in command"),
    ({"ps": {"replicas": 1}}, "trainingService.ps: trainjob has no ps role"),
    ({"priorityClasses": {1: "high"}}, "trainingService.priorityClasses: a TrainJob's pods take no PriorityClass"),
    ({"operator": "pytorch-operator", "runtime": "torch-distributed"},
     "trainingService.runtime: runtime names a Kubeflow Trainer v2 runtime"),
    ({"operator": "mpi"}, "use pytorch-operator, tf-operator or trainjob"),
])
def test_config_mistakes_are_one_line(change, says):
    with pytest.raises(UserError) as caught:
        kubeflow.parse_section({**SECTION, **change}, "trainingService")
    assert says in caught.value.line()


# --- the status Trainer reports ------------------------------------------------------------------


def condition(kind: str, reason: str, message: str = "") -> dict:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


@pytest.mark.parametrize("job_spec, status, expected", [
    ({"suspend": True}, {"conditions": [condition("Suspended", "Suspended", "TrainJob is suspended")]},
     (WAITING, "suspended (Suspended: TrainJob is suspended)")),
    ({}, {"conditions": [condition("Complete", "JobsCompleted")]}, (SUCCEEDED, "")),
    ({}, {"conditions": [condition("Failed", "DeadlineExceeded", "the TrainJob ran past activeDeadlineSeconds")]},
     (FAILED, "DeadlineExceeded: the TrainJob ran past activeDeadlineSeconds")),
    ({}, {"jobsStatus": [{"name": "node", "ready": 1, "active": 1, "succeeded": 0, "failed": 0, "suspended": 0}]},
     (RUNNING, "")),
    ({}, {"jobsStatus": [{"name": "node", "ready": 0, "active": 1, "succeeded": 0, "failed": 0, "suspended": 0}]},
     (WAITING, "")),
])
def test_trainjob_statuses(job_spec, status, expected):
    job = {"kind": "TrainJob", "spec": job_spec, "status": status}
    got = kubeflow.job_status(job)
    assert (got.status, got.reason) == expected


# --- operator unset: the cluster's kinds decide ---------------------------------------------------


UNSET = {key: value for key, value in SECTION.items() if key not in ("operator", "checkpoint")}


def submitted_kinds(api) -> list:
    return [obj["kind"] for path, obj in api.objects.items() if obj["kind"] in ("TrainJob", "PyTorchJob")]


@pytest.mark.parametrize("served, kind", [
    ({"trainer.kubeflow.org/v1alpha1"}, "TrainJob"),
    ({"kubeflow.org/v1"}, "PyTorchJob"),
    ({"kubeflow.org/v1", "trainer.kubeflow.org/v1alpha1"}, "PyTorchJob"),
])
def test_operator_unset_follows_what_the_cluster_serves(api, client, tmp_path, served, kind):
    api.served = served
    platform = kubeflow.Platform(kubeflow.parse_section(dict(UNSET), "trainingService"), tmp_path, client=client)
    platform.check_ready()
    handle = platform.submit(spec())
    assert handle.startswith(f"{kind}/team/") and submitted_kinds(api) == [kind]
    assert ("GET", "/apis/trainer.kubeflow.org/v1alpha1") in api.calls()


def test_a_cluster_with_neither_operator_is_one_line(api, client, tmp_path):
    api.served = {"kueue.x-k8s.io/v1beta2"}
    platform = kubeflow.Platform(kubeflow.parse_section(dict(UNSET), "trainingService"), tmp_path, client=client)
    with pytest.raises(UserError, match="serves neither PyTorchJob .* nor TrainJob"):
        platform.check_ready()


def test_a_section_that_cannot_be_a_trainjob_says_why_on_a_trainer_only_cluster(api, client, tmp_path):
    api.served = {"trainer.kubeflow.org/v1alpha1"}
    section = {**UNSET, "master": {"replicas": 1, "command": "a"}, "worker": {"replicas": 1, "command": "b"}}
    platform = kubeflow.Platform(kubeflow.parse_section(section, "trainingService"), tmp_path, client=client)
    with pytest.raises(UserError) as caught:
        platform.submit(spec())
    assert "serves Kubeflow Trainer v2 (TrainJob), not PyTorchJob" in caught.value.line()
    assert "master and worker differ in command" in caught.value.line()
    assert submitted_kinds(api) == []


def test_an_explicit_operator_asks_the_cluster_nothing(api, client, tmp_path):
    api.served = set()
    platform = kubeflow.Platform(kubeflow.parse_section(dict(SECTION), "trainingService"), tmp_path, client=client)
    assert platform.submit(spec()).startswith("TrainJob/team/")
    assert not any(path.count("/") == 3 and path.startswith("/apis/") for _, path in api.calls())


def test_a_trainjobs_status_is_read_through_the_client(api, client, tmp_path):
    platform = kubeflow.Platform(kubeflow.parse_section(dict(SECTION), "trainingService"), tmp_path, client=client)
    handle = platform.submit(spec())
    path = next(path for path, obj in api.objects.items() if obj["kind"] == "TrainJob")
    api.objects[path]["status"] = {"conditions": [condition("Complete", "JobsCompleted")]}
    assert platform.status(handle).status == SUCCEEDED
