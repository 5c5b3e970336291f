"""Trial statuses from the status objects each operator writes (shapes as in FACTS.md).

Table-driven: a job's status as Kubeflow's training-operator, FrameworkController
or AdaptDL's controller writes it, and the pods as the kubelet reports them,
go in; the trial status, its reason and its exit code come out.
"""
from __future__ import annotations

import pytest

from trialkit.platforms.kubernetes import adaptdljob as adaptdl, frameworkcontroller, kubeflow
from trialkit.platforms.kubernetes import render as k8s
from trialkit.statuses import FAILED, RUNNING, SUCCEEDED, USER_CANCELED, WAITING
from trialkit.platforms.base import PlatformStatus
from trialkit.platforms.kubernetes.platform import trial_status

T0 = "2025-01-01T00:00:00Z"


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    """One entry of status.conditions, as training-operator writes it."""
    return {"type": kind, "status": status, "reason": reason or f"PyTorchJob{kind}", "message": message,
            "lastUpdateTime": T0, "lastTransitionTime": T0}


def pytorchjob(*conditions) -> dict:
    status = {"conditions": list(conditions), "replicaStatuses": {"Master": {"active": 1}}, "startTime": T0} if conditions else None
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "tk-e-t", "namespace": "default"}}
    return dict(job, status=status) if status else job


KUBEFLOW = [
    ("just created, no status yet", pytorchjob(), WAITING, ""),
    ("created", pytorchjob(condition("Created")), WAITING, ""),
    ("running", pytorchjob(condition("Created"), condition("Running")), RUNNING, ""),
    ("restarting", pytorchjob(condition("Created"), condition("Running", "False"), condition("Restarting")), RUNNING, ""),
    ("suspended", pytorchjob(condition("Created"), condition("Running", "False"), condition("Suspended")), WAITING, ""),
    ("succeeded", pytorchjob(condition("Created"), condition("Running", "False"), condition("Succeeded", message="PyTorchJob default/tk-e-t successfully completed.")), SUCCEEDED, ""),
    (
        "failed",
        pytorchjob(condition("Created"), condition("Running", "False"),
                   condition("Failed", reason="PyTorchJobFailed", message="PyTorchJob default/tk-e-t is failed because 1 Master replica(s) failed.")),
        FAILED,
        "PyTorchJobFailed: PyTorchJob default/tk-e-t is failed because 1 Master replica(s) failed.",
    ),
    # Conditions are appended as they change; the decisive one wins wherever it is.
    ("failed, listed first", pytorchjob(condition("Failed", reason="TFJobFailed"), condition("Created")), FAILED, "TFJobFailed"),
]


@pytest.mark.parametrize("job, status, reason", [row[1:] for row in KUBEFLOW], ids=[row[0] for row in KUBEFLOW])
def test_kubeflow_conditions(job, status, reason):
    assert kubeflow.job_status(job) == PlatformStatus(status, reason)


def framework(state: str, completion: dict = None) -> dict:
    """A Framework's status as FrameworkController writes it."""
    attempt = {"id": 0, "startTime": T0, "runTime": T0, "completionTime": T0 if completion else None,
               "instanceUID": "0_0b5e", "configMapName": "tke-attempt", "configMapUID": "0b5e",
               "completionStatus": completion, "taskRoleStatuses": []}
    status = {"startTime": T0, "completionTime": T0 if state == "Completed" else None, "state": state, "transitionTime": T0,
              "retryPolicyStatus": {"totalRetriedCount": 0, "accountableRetriedCount": 0, "retryDelaySec": None},
              "attemptStatus": attempt}
    return {"apiVersion": "frameworkcontroller.microsoft.com/v1", "kind": "Framework", "metadata": {"name": "tke"}, "status": status}


def completion(code: int, phrase: str, kind: str, attributes=(), diagnostics: str = "") -> dict:
    return {"code": code, "phrase": phrase, "type": {"name": kind, "attributes": list(attributes)}, "diagnostics": diagnostics,
            "trigger": {"message": "MinFailedTaskCount 1 has been reached", "taskRoleName": "worker", "taskIndex": 0}}


FRAMEWORK = [
    ("no status yet", {"apiVersion": "frameworkcontroller.microsoft.com/v1", "kind": "Framework", "metadata": {}}, PlatformStatus(WAITING)),
    *[(state, framework(state), PlatformStatus(WAITING)) for state in ("AttemptCreationPending", "AttemptCreationRequested", "AttemptPreparing")],
    ("AttemptRunning", framework("AttemptRunning"), PlatformStatus(RUNNING)),
    *[(state, framework(state), PlatformStatus(RUNNING)) for state in ("AttemptDeletionPending", "AttemptDeletionRequested", "AttemptDeleting", "AttemptCompleted")],
    ("succeeded", framework("Completed", completion(0, "Succeeded", "Succeeded")), PlatformStatus(SUCCEEDED, "", 0)),
    (
        "container exited 1",
        framework("Completed", completion(1, "ContainerUnrecognizedFailed", "Failed", diagnostics="Exited with 1")),
        PlatformStatus(FAILED, "ContainerUnrecognizedFailed: Exited with 1", 1),
    ),
    (
        "container killed",
        framework("Completed", completion(137, "ContainerSigKillReceived", "Failed", ["Transient", "Platform"])),
        PlatformStatus(FAILED, "ContainerSigKillReceived", 137),
    ),
    (
        "a code of FrameworkController's own is no exit code",
        framework("Completed", completion(210, "ContainerPermanentFailed", "Failed", ["Permanent"])),
        PlatformStatus(FAILED, "ContainerPermanentFailed", None),
    ),
    (
        "pod spec invalid",
        framework("Completed", completion(-200, "PodSpecInvalid", "Failed", ["Permanent", "Platform"], "spec.containers[0].image: Required value")),
        PlatformStatus(FAILED, "PodSpecInvalid: spec.containers[0].image: Required value", None),
    ),
    ("stopped by a user", framework("Completed", completion(-210, "StopFrameworkRequested", "Failed", ["Permanent"])), PlatformStatus(USER_CANCELED, "StopFrameworkRequested", None)),
]


@pytest.mark.parametrize("job, expected", [row[1:] for row in FRAMEWORK], ids=[row[0] for row in FRAMEWORK])
def test_frameworkcontroller_states(job, expected):
    assert frameworkcontroller.job_status(job) == expected


def adaptdljob(phase=None, **extra) -> dict:
    """An AdaptDLJob's status as AdaptDL's controller patches it."""
    status = {"phase": phase, "replicas": 2, "readyReplicas": 2, "group": 3, "allocation": ["node-a", "node-b"], **extra}
    job = {"apiVersion": "adaptdl.petuum.com/v1", "kind": "AdaptDLJob", "metadata": {"name": "tk-e-t"}}
    return dict(job, status=status) if phase else job


ADAPTDL = [
    ("no status yet", adaptdljob(), PlatformStatus(WAITING)),
    ("pending", adaptdljob("Pending"), PlatformStatus(WAITING)),
    ("starting", adaptdljob("Starting"), PlatformStatus(WAITING)),
    ("running", adaptdljob("Running"), PlatformStatus(RUNNING)),
    ("stopping to rescale", adaptdljob("Stopping"), PlatformStatus(RUNNING)),
    ("succeeded", adaptdljob("Succeeded", completionTimestamp=T0), PlatformStatus(SUCCEEDED)),
    ("failed", adaptdljob("Failed", reason="PodFailure", message="tk-e-t-uid-3-0 Failed", completionTimestamp=T0),
     PlatformStatus(FAILED, "PodFailure: tk-e-t-uid-3-0 Failed")),
    ("invalid", adaptdljob("Failed", reason="Invalid", message="inconsistent pods in group"), PlatformStatus(FAILED, "Invalid: inconsistent pods in group")),
]


@pytest.mark.parametrize("job, expected", [row[1:] for row in ADAPTDL], ids=[row[0] for row in ADAPTDL])
def test_adaptdl_phases(job, expected):
    assert adaptdl.job_status(job) == expected


# --- what only the pods tell -------------------------------------------------


def pod(name: str, *container_states, sidecar_state=None, init_state=None) -> dict:
    """A pod as the kubelet reports it: trialkit's container (run.sh) and maybe a sidecar."""
    containers = [{"name": "main", "image": "img:1", "command": list(k8s.RUN_COMMAND)}]
    statuses = [{"name": "main", "state": state, "ready": False, "restartCount": 0, "image": "img:1", "imageID": ""} for state in container_states]
    if sidecar_state is not None:
        containers.append({"name": "log-shipper", "image": "fluent-bit:3.1", "command": ["fluent-bit"]})
        statuses.append({"name": "log-shipper", "state": sidecar_state, "ready": False, "restartCount": 0})
    status = {"phase": "Pending", "containerStatuses": statuses}
    if init_state is not None:
        status["initContainerStatuses"] = [{"name": "fetch", "state": init_state, "ready": False, "restartCount": 0}]
    return {"metadata": {"name": name, "labels": {k8s.LABEL_TRIAL: "t"}}, "spec": {"containers": containers}, "status": status}


PULL_BACKOFF = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "registry.example.com/nope:1"'}}
ERR_PULL = {"waiting": {"reason": "ErrImagePull", "message": "rpc error: code = NotFound"}}
CREATING = {"waiting": {"reason": "ContainerCreating"}}
RUN = {"running": {"startedAt": T0}}


def running_pod(name: str) -> dict:
    """A pod whose trial container the kubelet has started (phase Running)."""
    out = pod(name, RUN)
    out["status"]["phase"] = "Running"
    return out


def ended(code: int) -> dict:
    return {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": T0, "finishedAt": T0}}


PODS = [
    ("waiting, pods being created", PlatformStatus(WAITING), [pod("p0", CREATING)], PlatformStatus(WAITING)),
    ("image pull back-off fails the trial", PlatformStatus(WAITING), [pod("p0", RUN), pod("p1", PULL_BACKOFF)],
     PlatformStatus(FAILED, 'p1: ImagePullBackOff: Back-off pulling image "registry.example.com/nope:1"')),
    ("err image pull, job already running", PlatformStatus(RUNNING), [pod("p0", ERR_PULL)],
     PlatformStatus(FAILED, "p0: ErrImagePull: rpc error: code = NotFound")),
    ("an init container's image too", PlatformStatus(WAITING), [pod("p0", CREATING, init_state=PULL_BACKOFF)],
     PlatformStatus(FAILED, 'p0: ImagePullBackOff: Back-off pulling image "registry.example.com/nope:1"')),
    ("running", PlatformStatus(RUNNING), [pod("p0", RUN)], PlatformStatus(RUNNING)),
    # The operator says Running only once all its pods run (training-operator) or not at all (its pods still
    # come up): one running pod is a running trial, whether or not its keeper has reached the manager.
    ("one pod runs, the job not yet", PlatformStatus(WAITING), [running_pod("p0"), pod("p1", CREATING)],
     PlatformStatus(RUNNING)),
    ("failed: the trial's exit code", PlatformStatus(FAILED, "PodFailure"), [pod("p0", ended(0)), pod("p1", ended(3))], PlatformStatus(FAILED, "PodFailure", 3)),
    ("succeeded: exit code 0", PlatformStatus(SUCCEEDED), [pod("p0", ended(0))], PlatformStatus(SUCCEEDED, "", 0)),
    ("a sidecar's exit code is not the trial's", PlatformStatus(SUCCEEDED), [pod("p0", ended(0), sidecar_state=ended(2))], PlatformStatus(SUCCEEDED, "", 0)),
    ("pods gone", PlatformStatus(FAILED, "x"), [], PlatformStatus(FAILED, "x", None)),
    ("the operator's exit code stands", PlatformStatus(FAILED, "x", 137), [pod("p0", ended(1))], PlatformStatus(FAILED, "x", 137)),
]


@pytest.mark.parametrize("job_status, pods, expected", [row[1:] for row in PODS], ids=[row[0] for row in PODS])
def test_pods_complete_the_job_status(job_status, pods, expected):
    assert trial_status(job_status, pods) == expected
