"""Kueue's admission, played over the stand-in API server (tests/k8s_fake_api.py).

    kueue = KueuePlay(api, namespace="team", local_queue="team-queue", pods=2, classes={"low": 10, "high": 100})
    kueue.turn()                 # one look: Workloads made and updated, admissions, preemptions (the pod runner
                                 # calls it first in each of its own looks when given one)
    kueue.evict("job-name")      # as Kueue evicts: the job suspended again, its Workload Evicted

What it plays of Kueue (v0.19, kubernetes-sigs/kueue ff69552e), for jobs of the kinds it manages
(TrainJob, PyTorchJob, TFJob) labelled `kueue.x-k8s.io/queue-name` with its LocalQueue:
- the webhook: a job created unsuspended is suspended;
- the Workload it makes for each job: named <kind>-<job>, labelled `kueue.x-k8s.io/job-uid`, owned by the
  job, spec.queueName, spec.priority from the job's `kueue.x-k8s.io/priority-class` label (a
  WorkloadPriorityClass, kept as objects of the API server: changed while the job waits, the priority
  follows), podSets with the job's pod count, conditions QuotaReserved/Admitted/Evicted/Finished with
  Kueue's reasons;
- one ClusterQueue of `pods` pods (its only resource), BestEffortFIFO: waiting workloads by priority, then
  the time they joined (creation, or their last eviction); admitted while they fit, their jobs unsuspended;
- preemption within the ClusterQueue (LowerPriority): a waiting workload that does not fit evicts the
  admitted ones of lower priority, the lowest and latest first, until it would fit;
- a finished job (its status Complete/Succeeded/Failed) or a deleted one gives its quota back.
Not played: flavors, cohorts, fair sharing, pod groups (FrameworkController's and AdaptDL's pods).
"""
from __future__ import annotations

import itertools
import threading
from typing import Dict, List, Optional

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
GROUP = "/apis/kueue.x-k8s.io/v1beta2"
KINDS = {"TrainJob": "trainjob", "PyTorchJob": "pytorchjob", "TFJob": "tfjob"}
FINAL = ("Complete", "Succeeded", "Failed")


def _stamp(second: int) -> str:
    """An API server's time: the play's own clock, one second a step, so orders are exact."""
    return f"2026-01-01T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}Z"


def _pods(job: dict) -> int:
    spec = job["spec"]
    if job["kind"] == "TrainJob":
        return (spec.get("trainer") or {}).get("numNodes", 1)
    replicas = spec.get("pytorchReplicaSpecs") or spec.get("tfReplicaSpecs") or {}
    return sum(entry.get("replicas", 1) for entry in replicas.values())


def _suspend(job: dict, value: bool) -> None:
    spec = job["spec"]
    (spec if job["kind"] == "TrainJob" else spec.setdefault("runPolicy", {}))["suspend"] = value


def _conditions(**held: tuple) -> List[dict]:
    return [{"type": kind, "status": "True" if holds else "False", "reason": reason, "message": message,
             "lastTransitionTime": when} for kind, (holds, reason, message, when) in held.items()]


class KueuePlay:
    def __init__(self, api, namespace: str = "default", local_queue: str = "lq", cluster_queue: str = "cq",
                 pods: int = 1, classes: Optional[Dict[str, int]] = None):
        self.api = api
        self.namespace, self.local_queue, self.cluster_queue, self.pods = namespace, local_queue, cluster_queue, pods
        self._clock = itertools.count(1)
        self._lock = threading.Lock()
        self.evictions: List[str] = []  # the jobs it evicted, in order
        with api._lock:
            api.objects[f"{GROUP}/namespaces/{namespace}/localqueues/{local_queue}"] = {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": local_queue, "namespace": namespace, "uid": "lq", "resourceVersion": "1"},
                "spec": {"clusterQueue": cluster_queue}}
            for name, value in (classes or {}).items():
                api.objects[f"{GROUP}/workloadpriorityclasses/{name}"] = {
                    "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                    "metadata": {"name": name, "uid": name, "resourceVersion": "1"}, "value": value}

    # --- one look ---------------------------------------------------------------------------------

    def turn(self) -> None:
        with self._lock, self.api._lock:
            jobs = {obj["metadata"]["uid"]: obj for obj in self.api.objects.values()
                    if obj.get("kind") in KINDS and obj["metadata"].get("namespace") == self.namespace
                    and (obj["metadata"].get("labels") or {}).get(QUEUE_LABEL) == self.local_queue}
            workloads = self._workloads()
            for uid, workload in list(workloads.items()):
                if uid not in jobs:  # its job was deleted: so is its Workload (owner reference)
                    self.api.objects.pop(self._path(workload["metadata"]["name"]))
                    del workloads[uid]
            for uid, job in jobs.items():
                workload = workloads.get(uid) or self._make(job)
                workloads[uid] = workload
                if self._finished(job):
                    self._set(workload, Finished=(True, "JobFinished", "Job finished", self._now()))
                elif not self._admitted(workload):
                    _suspend(job, True)  # the webhook's, and an eviction's
                    self._prioritize(workload, job)
            self._admit(jobs, workloads)

    def evict(self, job_name: str, reason: str = "Preempted", message: str = "") -> None:
        with self._lock, self.api._lock:
            for uid, workload in self._workloads().items():
                job = next(obj for obj in self.api.objects.values() if obj["metadata"].get("uid") == uid)
                if job["metadata"]["name"] == job_name:
                    self._evict(job, workload, reason, message or "Evicted by the test")
                    return
        raise AssertionError(f"no admitted job {job_name}")

    # --- Kueue's parts ----------------------------------------------------------------------------

    def _admit(self, jobs: Dict[str, dict], workloads: Dict[str, dict]) -> None:
        live = {uid: w for uid, w in workloads.items() if not self._condition(w, "Finished")}
        used = sum(self._count(w) for w in live.values() if self._admitted(w))
        waiting = sorted((w for w in live.values() if not self._admitted(w)),
                         key=lambda w: (-w["spec"]["priority"], self._queued_at(w)))
        for workload in waiting:
            uid = workload["metadata"]["labels"][JOB_UID_LABEL]
            need = self._count(workload)
            if used + need > self.pods:
                used -= self._preempt(jobs, live, workload, used + need - self.pods)
            if used + need <= self.pods:
                used += need
                _suspend(jobs[uid], False)
                workload["status"] = {"admission": {"clusterQueue": self.cluster_queue, "podSetAssignments": [
                    {"name": "main", "count": need}]}, "conditions": _conditions(
                        QuotaReserved=(True, "QuotaReserved", f"Quota reserved in ClusterQueue {self.cluster_queue}",
                                       self._now()),
                        Admitted=(True, "Admitted", "The workload is admitted", self._now()))}
            else:
                free = self.pods - used
                self._set(workload, QuotaReserved=(False, "Pending", f"couldn't assign flavors to pod set main: "
                                                   f"insufficient quota for pods in flavor default, {need} requested, "
                                                   f"{free} free of {self.pods}", self._now()))

    def _preempt(self, jobs: Dict[str, dict], live: Dict[str, dict], waiting: dict, short: int) -> int:
        """Evict admitted workloads of lower priority, the lowest and latest first, until `short` pods are free;
        the pods it freed (none unless it frees enough)."""
        lower = sorted((w for w in live.values() if self._admitted(w)
                        and w["spec"]["priority"] < waiting["spec"]["priority"]), key=self._queued_at, reverse=True)
        lower.sort(key=lambda w: w["spec"]["priority"])  # stable: the latest first within a priority
        chosen, freed = [], 0
        for workload in lower:
            if freed >= short:
                break
            chosen.append(workload)
            freed += self._count(workload)
        if freed < short:
            return 0
        for workload in chosen:
            job = jobs[workload["metadata"]["labels"][JOB_UID_LABEL]]
            self._evict(job, workload, "Preempted",
                        f"Preempted to accommodate a workload (UID: {waiting['metadata']['labels'][JOB_UID_LABEL]}) "
                        "due to prioritization in the ClusterQueue")
        return freed

    def _evict(self, job: dict, workload: dict, reason: str, message: str) -> None:
        _suspend(job, True)
        now = self._now()
        workload["status"] = {"conditions": _conditions(
            Evicted=(True, reason, message, now), QuotaReserved=(False, "Pending", message, now),
            Admitted=(False, "NoReservation", "The workload has no reservation", now)),
            "schedulingStats": {"evictions": [{"reason": reason, "underlyingCause": "", "count": 1}]}}
        self.evictions.append(job["metadata"]["name"])

    def _make(self, job: dict) -> dict:
        name = f"{KINDS[job['kind']]}-{job['metadata']['name']}"
        uid = job["metadata"]["uid"]
        workload = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                    "metadata": {"name": name, "namespace": self.namespace, "uid": f"w-{uid}", "resourceVersion": "1",
                                 "creationTimestamp": self._now(), "labels": {JOB_UID_LABEL: uid},
                                 "ownerReferences": [{"apiVersion": job["apiVersion"], "kind": job["kind"],
                                                      "name": job["metadata"]["name"], "uid": uid}]},
                    "spec": {"queueName": self.local_queue, "podSets": [{"name": "main", "count": _pods(job)}]}}
        self._prioritize(workload, job)
        self.api.objects[self._path(name)] = workload
        return workload

    def _prioritize(self, workload: dict, job: dict) -> None:
        """The workload's priority from its job's class label (a class that does not exist: 0)."""
        label = (job["metadata"].get("labels") or {}).get(PRIORITY_LABEL)
        found = self.api.objects.get(f"{GROUP}/workloadpriorityclasses/{label}") if label else None
        workload["spec"]["priority"] = found["value"] if found else 0
        workload["spec"].pop("priorityClassRef", None)
        if label:
            workload["spec"]["priorityClassRef"] = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                                    "name": label}

    def _workloads(self) -> Dict[str, dict]:
        prefix = f"{GROUP}/namespaces/{self.namespace}/workloads/"
        return {obj["metadata"]["labels"][JOB_UID_LABEL]: obj for path, obj in self.api.objects.items()
                if path.startswith(prefix)}

    def _path(self, name: str) -> str:
        return f"{GROUP}/namespaces/{self.namespace}/workloads/{name}"

    def _now(self) -> str:
        return _stamp(next(self._clock))

    @staticmethod
    def _finished(job: dict) -> bool:
        held = {c["type"] for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
        return bool(held & set(FINAL))

    @staticmethod
    def _condition(workload: dict, kind: str) -> Optional[dict]:
        return next((c for c in (workload.get("status") or {}).get("conditions") or []
                     if c["type"] == kind and c["status"] == "True"), None)

    def _admitted(self, workload: dict) -> bool:
        return self._condition(workload, "QuotaReserved") is not None

    @staticmethod
    def _count(workload: dict) -> int:
        return sum(item["count"] for item in workload["spec"]["podSets"])

    def _queued_at(self, workload: dict) -> str:
        evicted = self._condition(workload, "Evicted")
        return max(workload["metadata"]["creationTimestamp"], (evicted or {}).get("lastTransitionTime", ""))

    def _set(self, workload: dict, **held: tuple) -> None:
        kept = [c for c in (workload.get("status") or {}).get("conditions") or [] if c["type"] not in held]
        workload["status"] = {**(workload.get("status") or {}), "conditions": kept + _conditions(**held)}
