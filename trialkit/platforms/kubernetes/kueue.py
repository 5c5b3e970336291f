"""Kueue as the queue: a pool of pools.yml that is one of Kueue's LocalQueues.

    pools:
      team: {kueue: {namespace: team, localQueue: team-queue, priorityClass: research}}

    queue = for_namespace("team")          # that pool, or None: the namespace is not queued by Kueue
    objects = into_queue(objects, queue)   # the job (the last) labelled into the queue (pure; submit and render)
    admissions = Admissions(queue)         # what a platform learns of its jobs' admission
    admissions.status(handle, job, pods, status, workloads)   # QUEUED with Kueue's words; an eviction

trialkit takes no lease of its own: Kueue holds the ClusterQueue's quota, admits each job (its
Workload) in its order, and suspends it again to evict it. So every job an experiment of the pool
creates carries `kueue.x-k8s.io/queue-name` (and `kueue.x-k8s.io/priority-class`, a
WorkloadPriorityClass) and is created suspended: a cluster whose Kueue does not manage its kind leaves
it suspended, never running past the queue (its status says so). Pods of FrameworkController's
Framework and of an AdaptDLJob join as a plain pod group (`kueue.x-k8s.io/pod-group-name`, the job's
name, and the annotation `kueue.x-k8s.io/pod-group-total-count`); Kueue gates them until admitted.

An eviction (Kueue suspends an admitted job: a job of higher priority preempts it, its queue is
stopped) deletes its pods: each keeper gets SIGTERM, the trial checkpoints and its keeper reports
PREEMPTED. Once its pods are gone the platform deletes the evicted job and, the job gone, reports the
trial PREEMPTED: the experiment queues it to resume, and its next job (restart count one higher, the
same checkpoint claim) waits in the LocalQueue again, from the time of the eviction, as Kueue's default
requeuing timestamp orders an evicted workload.
"""
from __future__ import annotations

import calendar
import copy
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from trialkit.errors import UserError
from trialkit.platforms import pools
from trialkit.platforms.base import PlatformStatus
from trialkit.platforms.kubernetes import render as k8s
from trialkit.statuses import FINAL_STATUSES, WAITING

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # on the Workload Kueue makes for a job
ADMISSION_GATE = "kueue.x-k8s.io/admission"  # a pod group's pods wait behind it
POD_KINDS = ("Framework", "AdaptDLJob")  # their pods join Kueue as a pod group, not the job itself
ADMITTED, QUEUED, EVICTED = "ADMITTED", "QUEUED", "EVICTED"


@dataclass(frozen=True)
class Queue:
    """A Kueue pool of pools.yml."""

    pool: str
    namespace: str
    local_queue: str
    priority_class: Optional[str] = None


def for_namespace(namespace: str) -> Optional[Queue]:
    """The Kueue pool pools.yml declares for `namespace`; None when its pool (if any) is not Kueue's."""
    found = pools.declared_for(lambda spec: spec.namespace == namespace, f"namespace {namespace!r}")
    if not found or not found[1].local_queue:
        return None
    name, spec = found
    return Queue(name, namespace, spec.local_queue, spec.priority_class)


def named(name: str) -> Queue:
    """The Kueue pool `name` of pools.yml (`job list --pool NAME`)."""
    from trialkit.manager import paths

    spec = pools.pool_spec(name, pools.read_config(paths.home()))
    if not spec.local_queue:
        raise UserError(f"pool {name!r} is not a Kueue pool", name, "name a pool of kueue: {namespace, localQueue}")
    return Queue(name, spec.namespace, spec.local_queue, spec.priority_class)


# --- joining the queue (pure) ---------------------------------------------------------------------


def queued(job: dict, queue: Queue) -> dict:
    """`job` labelled into the queue: suspended until Kueue admits it, or its pods a pod group."""
    job = copy.deepcopy(job)
    labels = {QUEUE_LABEL: queue.local_queue}
    if queue.priority_class:
        labels[PRIORITY_LABEL] = queue.priority_class
    if job["kind"] in POD_KINDS:
        templates = _pod_templates(job)
        count = _pod_count(job)
        for template in templates:
            meta = template.setdefault("metadata", {})
            meta["labels"] = {**meta.get("labels", {}), **labels, POD_GROUP_LABEL: job["metadata"]["name"]}
            meta["annotations"] = {**meta.get("annotations", {}), POD_GROUP_COUNT: str(count)}
        return job
    job["metadata"]["labels"] = {**job["metadata"].get("labels", {}), **labels}
    _suspension(job)["suspend"] = True
    return job


def into_queue(objects: List[dict], queue: Optional[Queue]) -> List[dict]:
    """A trial's objects as they are submitted: the job (the last) labelled into `queue`, where there is one
    (submission and `trialkit render` alike)."""
    return objects if queue is None else [*objects[:-1], queued(objects[-1], queue)]


def note(queue: Queue) -> str:
    """The line `trialkit render` says of the pool its jobs join."""
    priority = f", priority class {queue.priority_class}" if queue.priority_class else ""
    return (f"namespace {queue.namespace} is pool {queue.pool} of pools.yml: the job joins Kueue's LocalQueue "
            f"{queue.local_queue}{priority}, held (suspended, or its pods gated) until Kueue admits it")


def _suspension(job: dict) -> dict:
    """The mapping whose `suspend` holds the job: a TrainJob's spec, a PyTorchJob's or TFJob's runPolicy."""
    spec = job.setdefault("spec", {})
    return spec if job["kind"] == "TrainJob" else spec.setdefault("runPolicy", {})


def _pod_templates(job: dict) -> List[dict]:
    spec = job["spec"]
    if job["kind"] == "Framework":
        return [role["task"]["pod"] for role in spec["taskRoles"]]
    return [spec["template"]]


def _pod_count(job: dict) -> int:
    """The pods of the group, all of which Kueue admits at once: a Framework's tasks; an AdaptDLJob's replicas,
    which must be fixed (AdaptDL's scheduler would otherwise change them under Kueue's admission)."""
    spec = job["spec"]
    if job["kind"] == "Framework":
        return sum(role.get("taskNumber", 1) for role in spec["taskRoles"])
    low, high = spec.get("minReplicas"), spec.get("maxReplicas")
    if high is None or low != high:
        raise UserError("Kueue admits a fixed number of pods, but this AdaptDL job's replicas range "
                        f"{low if low is not None else 0}..{high if high is not None else 'unbounded'}",
                        "trainingService.maxReplicas", "give minReplicas and maxReplicas the same number, or queue "
                        "the namespace with a kubernetes pool of pools.yml instead")
    return high


def held(job: dict, pods: Sequence[dict]) -> bool:
    """Whether Kueue holds the job back: suspended, or its pod group gated (or not made yet)."""
    if job["kind"] in POD_KINDS:
        return not pods or all(_gated(pod) for pod in pods)
    spec = job.get("spec") or {}
    return bool((spec if job["kind"] == "TrainJob" else spec.get("runPolicy") or {}).get("suspend"))


def _gated(pod: dict) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(gate.get("name") == ADMISSION_GATE for gate in gates)


# --- a Workload's words ---------------------------------------------------------------------------


def condition(workload: dict, kind: str) -> Optional[dict]:
    for item in (workload.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind and item.get("status") == "True":
            return item
    return None


def pending_condition(workload: dict) -> Optional[dict]:
    """Why it is not admitted: its QuotaReserved condition that does not hold (Kueue's words for the wait)."""
    for item in (workload.get("status") or {}).get("conditions") or []:
        if item.get("type") == "QuotaReserved" and item.get("status") != "True":
            return item
    return None


def _words(item: Optional[dict]) -> str:
    if not item:
        return ""
    return ": ".join(part for part in (item.get("reason"), item.get("message")) if part)


def state(workload: dict) -> str:
    if condition(workload, "QuotaReserved") or condition(workload, "Admitted"):
        return ADMITTED
    return EVICTED if condition(workload, "Evicted") else QUEUED


def cluster_queue(workload: dict) -> str:
    return ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue") or ""


def workload_ref(job: dict) -> Dict[str, str]:
    """How to find the job's Workload: by the job-uid label Kueue gives it, or (a pod group) by its name."""
    if job["kind"] in POD_KINDS:
        return {"name": job["metadata"]["name"]}
    return {"selector": f"{JOB_UID_LABEL}={job['metadata']['uid']}"}


class Admissions:
    """What a platform of a Kueue pool learns of its jobs' admission, and says of it."""

    def __init__(self, queue: Queue, say: Any):
        self.queue = queue
        self._say = say  # the platform's on_waiting(trial id, why): the store keeps the trial's wait and why
        self._trials: Dict[str, str] = {}  # handle -> trial id
        self._said: Dict[str, str] = {}  # handle -> the reason said last (said again only when it changes)
        self._evicted: Dict[str, str] = {}  # handle -> why its job was evicted, once its job is deleted for it

    def submitted(self, handle: str, trial_id: str) -> None:
        self._trials[handle] = trial_id
        self._said.pop(handle, None)
        self._evicted.pop(handle, None)

    def status(self, handle: str, job: dict, pods: Sequence[dict], status: PlatformStatus,
               workloads: Callable[[], Sequence[dict]]) -> PlatformStatus:
        """The job's status as its admission makes it (`workloads()`: its Workloads, asked only while Kueue holds
        it). An evicted job whose pods are gone is noted: the caller deletes it (`evicted(handle)` is then True)
        and, once it is gone, `gone` says PREEMPTED."""
        if status.status in FINAL_STATUSES or not held(job, pods):
            return status
        found = workloads()
        workload = found[-1] if found else None
        if workload is not None and condition(workload, "Evicted") and not any(_runs(pod) for pod in pods):
            self._evicted[handle] = f"evicted by Kueue ({_words(condition(workload, 'Evicted'))}): queued to resume"
            return PlatformStatus(WAITING, self._evicted[handle])
        if workload is None:
            why = (f"queued in Kueue's LocalQueue {self.queue.local_queue}, which has made no Workload for it yet "
                   f"(if none comes, Kueue does not manage {job['kind']} here: add it to Kueue's integrations)")
        elif state(workload) == ADMITTED:
            why = f"admitted by Kueue to ClusterQueue {cluster_queue(workload)}: starting"
        else:
            words = _words(pending_condition(workload)) or "waiting for admission"
            why = f"queued in Kueue's LocalQueue {self.queue.local_queue}: {words}"
        if self._said.get(handle) != why and handle in self._trials:
            self._said[handle] = why
            self._say(self._trials[handle], why)
        return PlatformStatus(WAITING, why)

    def evicted(self, handle: str) -> bool:
        return handle in self._evicted

    def gone(self, handle: str) -> Optional[PlatformStatus]:
        """The status of a job that no longer exists: PREEMPTED when it was deleted for its eviction."""
        from trialkit.statuses import PREEMPTED

        return PlatformStatus(PREEMPTED, self._evicted[handle]) if handle in self._evicted else None


def _runs(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Pending", "Running") and not _gated(pod)


# --- the queue as `trialkit job list --pool NAME` shows it ---------------------------------------


def _time(stamp: Optional[str]) -> float:
    """An RFC 3339 time of the API server (UTC, whole seconds) as a Unix time; 0 when absent."""
    if not stamp:
        return 0.0
    return float(calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")))


def queue_time(workload: dict) -> float:
    """When the workload joined the queue as Kueue orders it: its creation, or its last eviction (Kueue's
    default requeuing timestamp)."""
    evicted = condition(workload, "Evicted")
    return max(_time(workload["metadata"].get("creationTimestamp")), _time((evicted or {}).get("lastTransitionTime")))


def order(workloads: Sequence[dict]) -> List[dict]:
    """The LocalQueue's live workloads in Kueue's order: the admitted (by the time they got their quota), then
    the waiting ones by priority (higher first), then the time they joined the queue (BestEffortFIFO)."""
    live = [w for w in workloads if not condition(w, "Finished")]
    admitted = [w for w in live if state(w) == ADMITTED]
    admitted.sort(key=lambda w: _time((condition(w, "QuotaReserved") or {}).get("lastTransitionTime")))
    waiting = [w for w in live if state(w) != ADMITTED]
    waiting.sort(key=lambda w: (-((w.get("spec") or {}).get("priority") or 0), queue_time(w)))
    return admitted + waiting


def jobs(queue: Queue, client: Any) -> List[Dict[str, Any]]:
    """The pool's workloads in Kueue's order with their admission: `job list --pool NAME`."""
    from trialkit.platforms.kubernetes.client import CUSTOM_KINDS, ObjectRef

    found = [w for w in client.list("Workload", queue.namespace)
             if (w.get("spec") or {}).get("queueName") == queue.local_queue]
    rows = []
    for position, workload in enumerate(order(found)):
        owner = next(iter(workload["metadata"].get("ownerReferences") or []), {})
        labels: Dict[str, str] = {}
        if owner.get("kind") in CUSTOM_KINDS:
            labels = ((client.get(ObjectRef(owner["kind"], queue.namespace, owner["name"])) or {}).get("metadata")
                      or {}).get("labels") or {}
        spec = workload.get("spec") or {}
        pods = sum(item.get("count", 1) for item in spec.get("podSets") or [])
        now = state(workload)
        rows.append({
            "position": position, "id": labels.get(k8s.LABEL_TRIAL) or workload["metadata"]["name"],
            "experiment": labels.get(k8s.LABEL_EXPERIMENT, ""), "name": workload["metadata"]["name"],
            "priority": spec.get("priority") or 0,
            "priority_class": (spec.get("priorityClassRef") or {}).get("name", ""),
            "submitted": _time(workload["metadata"].get("creationTimestamp")),
            "slots_acquired": pods if now == ADMITTED else 0, "slots_needed": pods, "status": now,
            "admission": (f"ClusterQueue {cluster_queue(workload)}" if now == ADMITTED
                          else _words(condition(workload, "Evicted") if now == EVICTED else pending_condition(workload))),
        })
    return rows


# --- a waiting job's priority ------------------------------------------------------------------------


def set_priority(job_ref: Any, class_name: str, client: Any) -> None:
    """`job update TRIAL --priority CLASS`: the job's WorkloadPriorityClass label, while Kueue holds it suspended
    (Kueue takes the change then and only then)."""
    job = client.get(job_ref)
    if job is None:
        raise UserError(f"{job_ref} no longer exists", str(job_ref), "update a job that waits: `trialkit job list "
                        "--pool NAME` lists them")
    if QUEUE_LABEL not in (job["metadata"].get("labels") or {}) or job["kind"] in POD_KINDS:
        raise UserError(f"{job_ref} is not in a Kueue LocalQueue", str(job_ref),
                        "a job's priority class is Kueue's: only jobs of a Kueue pool's experiments have one")
    if not held(job, ()):
        raise UserError(f"{job_ref} is admitted by Kueue: a WorkloadPriorityClass changes only while the job waits",
                        str(job_ref),
                        "change it while the job is queued: `trialkit job list --pool NAME` says which are")
    if client.get_cluster("WorkloadPriorityClass", class_name) is None:
        known = sorted(item["metadata"]["name"] for item in client.list_cluster("WorkloadPriorityClass"))
        raise UserError(f"the cluster has no WorkloadPriorityClass {class_name!r}", "--priority",
                        f"name one of: {', '.join(known)}" if known
                        else "create one first, a kueue.x-k8s.io WorkloadPriorityClass")
    client.patch(job_ref, {"metadata": {"labels": {PRIORITY_LABEL: class_name}}})
