"""Kubeflow Trainer v2's controller, played for tests: what a TrainJob becomes.

    pods = trainer_play.node_pods(trainjob)          # [NodePod]: name, pod template, env, labels, annotations
    trainer_play.status(trainjob, phases)           # the status Trainer writes, from its pods' phases

Trainer resolves the TrainJob's runtimeRef (the ClusterTrainingRuntimes it ships, copied into
tests/fixtures/crds), builds the runtime's JobSet and merges into it (pkg/runtime/framework/plugins):
- the trainer (image, command, args, env, resourcesPerNode) into the container `node` of the replicated
  job labelled `trainer.kubeflow.org/trainjob-ancestor-step: trainer`, numNodes as its pods;
- each runtimePatches entry into the replicated job it names: pod labels and annotations, volumes,
  containers' env, volumeMounts and securityContext (by container name), serviceAccountName,
  imagePullSecrets, nodeSelector, tolerations, terminationGracePeriodSeconds;
- the torch plugin's PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the pod's completion index),
  PET_MASTER_ADDR (<job>-node-0-0.<job>) and PET_MASTER_PORT (29500), and no MASTER_ADDR.
JobSet names each pod's host <jobset>-<replicated job>-<job index>-<pod index> in the subdomain <jobset>,
and labels it jobset.sigs.k8s.io/jobset-name and /replicatedjob-name; the Job controller annotates its
completion index; JobSet's webhook defaults the pods' restartPolicy to OnFailure. The status is Trainer's: Suspended while spec.suspend, Complete once every pod of the
trainer's job succeeded, Failed (reason FailedJobs) once one failed; jobsStatus counts the child Jobs.
Not played: initializers, MPI (deepspeed-distributed renders but does not run here), elastic torch.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

import yaml

CRDS = Path(__file__).parent / "fixtures" / "crds"
RUNTIME_FILES = {"torch-distributed": "runtime_torch_distributed.yaml",
                 "deepspeed-distributed": "runtime_deepspeed_distributed.yaml"}
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
MASTER_PORT = "29500"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


@functools.lru_cache(maxsize=None)
def runtime(name: str) -> dict:
    return yaml.safe_load((CRDS / RUNTIME_FILES[name]).read_text())


@dataclass
class NodePod:
    name: str  # the pod's host name, as JobSet gives it
    replicated_job: str
    index: int
    template: dict  # the pod template, everything merged
    env: Dict[str, str]  # what the torch plugin adds to the trainer's container
    labels: Dict[str, str]
    annotations: Dict[str, str]


def _by_name(items: Sequence[dict]) -> Dict[str, dict]:
    return {item["name"]: item for item in items}


def _merge_named(base: List[dict], extra: Sequence[dict]) -> List[dict]:
    taken = {item["name"] for item in extra}
    return [item for item in base if item["name"] not in taken] + [copy.deepcopy(item) for item in extra]


def templates(job: dict) -> Dict[str, tuple]:
    """Replicated job name -> (its pod template with the trainer and the patches merged, its pod count)."""
    spec = job["spec"]
    ref = spec["runtimeRef"]
    jobs = runtime(ref["name"])["spec"]["template"]["spec"]["replicatedJobs"]
    trainer = spec.get("trainer") or {}
    out = {}
    for rjob in jobs:
        trains = (rjob["template"].get("metadata") or {}).get("labels", {}).get(ANCESTOR) == "trainer"
        pod = copy.deepcopy(rjob["template"]["spec"]["template"])
        pod_spec = pod["spec"]
        pod_spec.setdefault("restartPolicy", "OnFailure")  # JobSet's webhook defaults a Job's pods so
        container = _by_name(pod_spec["containers"])["node"]
        if trains:
            for key in ("image", "command", "args"):
                if key in trainer:
                    container[key] = copy.deepcopy(trainer[key])
            container["env"] = _merge_named(container.get("env", []), trainer.get("env", []))
            if trainer.get("resourcesPerNode"):
                container["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
        for patch in spec.get("runtimePatches") or []:
            for entry in patch["trainingRuntimeSpec"]["template"]["spec"].get("replicatedJobs") or []:
                if entry["name"] != rjob["name"]:
                    continue
                _patch(pod, entry["template"]["spec"]["template"])
        count = trainer.get("numNodes", 1) if rjob["name"] == "node" else 1  # the MPI launcher: one pod
        out[rjob["name"]] = (pod, count)
    return out


def _patch(pod: dict, patch: dict) -> None:
    meta = pod.setdefault("metadata", {})
    for key in ("labels", "annotations"):
        if (patch.get("metadata") or {}).get(key):
            meta[key] = {**meta.get(key, {}), **patch["metadata"][key]}
    spec, given = pod["spec"], patch.get("spec") or {}
    if given.get("volumes"):
        spec["volumes"] = _merge_named(spec.get("volumes", []), given["volumes"])
    for key in ("serviceAccountName", "terminationGracePeriodSeconds", "nodeSelector", "imagePullSecrets",
                "tolerations", "securityContext", "affinity", "schedulingGates"):
        if key in given:
            spec[key] = copy.deepcopy(given[key])
    for kind in ("containers", "initContainers"):
        present = _by_name(spec.get(kind, []))
        for container in given.get(kind) or []:
            target = present[container["name"]]  # Trainer refuses a patch of a container the runtime lacks
            for key in ("env", "volumeMounts"):
                if container.get(key):
                    target[key] = _merge_named(target.get(key, []), container[key])
            if "securityContext" in container:
                target["securityContext"] = copy.deepcopy(container["securityContext"])


def node_pods(job: dict) -> List[NodePod]:
    """Every pod of the TrainJob's JobSet, by replicated job and index."""
    name = job["metadata"]["name"]
    trainer = job["spec"].get("trainer") or {}
    torch = "torch" in (runtime(job["spec"]["runtimeRef"]["name"])["spec"].get("mlPolicy") or {})
    pods = []
    for rjob, (template, count) in templates(job).items():
        for index in range(count):
            labels = {**(template.get("metadata") or {}).get("labels", {}),
                      "jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                      "jobset.sigs.k8s.io/job-index": "0", COMPLETION_INDEX: str(index)}
            env = {}
            if torch:
                env = {"PET_NNODES": str(count), "PET_NPROC_PER_NODE": str(trainer.get("numProcPerNode", "auto")),
                       "PET_NODE_RANK": str(index), "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
                       "PET_MASTER_PORT": MASTER_PORT}
            pods.append(NodePod(f"{name}-{rjob}-0-{index}", rjob, index, template, env, labels,
                                {**(template.get("metadata") or {}).get("annotations", {}), COMPLETION_INDEX: str(index)}))
    return pods


def status(job: dict, phases: Sequence[str]) -> dict:
    """Trainer's status of the TrainJob from its pods' phases (those of its current pods)."""
    when = "2026-01-01T00:00:00Z"
    name = job["metadata"]["name"]
    if job["spec"].get("suspend"):
        return {"conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended", "lastTransitionTime": when,
                                "message": "TrainJob is suspended"}],
                "jobsStatus": [{"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 1}]}
    failed = "Failed" in phases
    done = bool(phases) and all(phase == "Succeeded" for phase in phases)
    ready = bool(phases) and all(phase in ("Running", "Succeeded") for phase in phases)
    out = {"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed", "lastTransitionTime": when,
                           "message": "TrainJob is resumed"}],
           "jobsStatus": [{"name": "node", "ready": int(ready and not done), "succeeded": int(done),
                           "failed": int(failed), "active": int(not done and not failed), "suspended": 0}]}
    if failed:
        out["conditions"].append({"type": "Failed", "status": "True", "reason": "FailedJobs", "lastTransitionTime": when,
                                  "message": f"jobset {name} failed: a node pod failed"})
    elif done:
        out["conditions"].append({"type": "Complete", "status": "True", "reason": "JobsCompleted",
                                  "lastTransitionTime": when, "message": "TrainJob is completed"})
    return out
