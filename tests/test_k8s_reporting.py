"""Which pod of a multi-pod trial ships its records (issue 23: the reporting role).

Every pod runs a keeper with the trial's token; only task 0 of the reporting
role may ship. The test renders the trial, then evaluates each pod's keeper
decision on the environment that pod would really have: the rendered env with
the downward-API fields resolved from the labels the operator puts on its pods,
plus the variables the operator itself sets (FrameworkController's FC_*,
training-operator's RANK).
"""
from __future__ import annotations

import pytest

import k8s_schemas
from test_k8s_render import containers, job_of, parse, spec_for
from trialkit.env import is_reporting_replica
from trialkit.errors import UserError
from trialkit.platforms.kubernetes import kubeflow

COMMON = {"managerAddress": "10.0.0.5", "dockerImage": "trainer:1"}


def pod_environ(container: dict, labels: dict, operator_env: dict) -> dict:
    """The keeper's environment in one pod: values as rendered, fields from the pod's labels."""
    out = dict(operator_env)
    for item in container["env"]:
        if "value" in item:
            out[item["name"]] = item["value"]
        elif "fieldRef" in item.get("valueFrom", {}):
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            key = path[len("metadata.labels['"):-2]
            out[item["name"]] = labels[key]
    return out


def framework_reporters(section: dict) -> list:
    """(role, task index) of every FrameworkController task whose keeper would ship."""
    objects = load_render(section)
    job = job_of(objects)
    k8s_schemas.validate_objects(objects)
    found = []
    for role in job["spec"]["taskRoles"]:
        container = role["task"]["pod"]["spec"]["containers"][0]
        for index in range(role["taskNumber"]):
            fc = {"FC_TASKROLE_NAME": role["name"], "FC_TASK_INDEX": str(index)}
            if is_reporting_replica(pod_environ(container, {}, fc)):
                found.append((role["name"], index))
    return found


def load_render(section: dict) -> list:
    config = parse(section)
    from trialkit.platforms import load

    return load(section["platform"]).render(config, spec_for())


def fc_section(roles, **extra) -> dict:
    return {
        "platform": "frameworkcontroller",
        **COMMON,
        "taskRoles": [{"name": name, "taskNumber": count, "command": "python3 train.py"} for name, count in roles],
        **extra,
    }


def test_framework_ps_then_worker_reports_from_the_worker():
    # The case of the issue: with ps first, the worker's metrics never arrived.
    assert framework_reporters(fc_section([("ps", 2), ("worker", 3)])) == [("worker", 0)]


def test_framework_without_a_known_role_name_reports_from_the_first():
    assert framework_reporters(fc_section([("alpha", 2), ("beta", 2)])) == [("alpha", 0)]


def test_framework_reporting_role_chooses():
    section = fc_section([("ps", 1), ("worker", 2), ("evaluator", 1)], reportingRole="evaluator")
    assert framework_reporters(section) == [("evaluator", 0)]


def kubeflow_reporters(section: dict) -> list:
    objects = load_render(section)
    k8s_schemas.validate_objects(objects)
    job = job_of(objects)
    specs = job["spec"]["pytorchReplicaSpecs"]
    found = []
    rank = 0
    for replica_type in ("Master", "Worker"):
        if replica_type not in specs:
            continue
        replica = specs[replica_type]
        container = replica["template"]["spec"]["containers"][0]
        for index in range(replica["replicas"]):
            labels = {kubeflow.REPLICA_INDEX_LABEL: str(index)}
            if is_reporting_replica(pod_environ(container, labels, {"RANK": str(rank)})):
                found.append((replica_type, index))
            rank += 1
    return found


def pytorch_section(**extra) -> dict:
    return {
        "platform": "kubeflow",
        "operator": "pytorch-operator",
        **COMMON,
        "master": {"replicas": 1, "command": "python3 train.py"},
        "worker": {"replicas": 3, "command": "python3 train.py"},
        **extra,
    }


def test_pytorchjob_reports_from_the_master_by_default():
    assert kubeflow_reporters(pytorch_section()) == [("Master", 0)]


def test_pytorchjob_reporting_role_worker_reports_from_worker_0_only():
    assert kubeflow_reporters(pytorch_section(reportingRole="worker")) == [("Worker", 0)]


def test_every_pod_still_gets_the_token_by_reference():
    for _template, container in containers(load_render(pytorch_section(reportingRole="worker"))):
        names = [item["name"] for item in container["env"]]
        assert "TRIALKIT_TOKEN" in names


@pytest.mark.parametrize("section", [
    fc_section([("ps", 1), ("worker", 1)], reportingRole="chief"),
    pytorch_section(reportingRole="ps"),
])
def test_a_reporting_role_that_is_not_a_role_is_refused(section):
    with pytest.raises(UserError) as err:
        parse(section)
    assert "reportingRole" in str(err.value) and "is not one of this trial's roles" in str(err.value)
