"""Submitting, watching and deleting trials on Kubernetes: the half that talks to a cluster.

Each Kubernetes platform module subclasses KubePlatform with its pure
`renderer` (config, spec -> objects) and `mapper` (job -> PlatformStatus).
What all of them share lives here: the order of creation, ownership, the
pod-level failures a job's status does not show, and deletion.

Lifetimes: a trial's ConfigMap and Secret are owned by its job and go with it;
its checkpoint claims are owned by nobody, so a pause (which deletes the job)
keeps the checkpoint and activate mounts the same claim again. A finished job
is deleted once its retention has passed (keepFinishedJobs); everything else
of the experiment goes with `remove_experiment` (the experiment stopped or
deleted).
"""
from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

import yaml

from trialkit import env as envnames
from trialkit.platforms.kubernetes import render as k8s
from trialkit.platforms.kubernetes import kueue, pool_leases, shipping
from trialkit.statuses import FAILED, FINAL_STATUSES, RUNNING, SUCCEEDED, SYS_CANCELED, USER_CANCELED, WAITING
from trialkit.errors import UserError
from trialkit.platforms.base import PlatformBase, PlatformStatus, TrialSpec

log = logging.getLogger(__name__)

# A pod waiting for these never starts: NNI left such trials WAITING forever.
IMAGE_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})


def image_failure(pods: Sequence[dict]) -> Optional[str]:
    """Why the trial's image cannot start, from its pods' container statuses; None if it can."""
    for pod in pods:
        status = pod.get("status") or {}
        for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in IMAGE_FAILURES:
                detail = f": {waiting['message']}" if waiting.get("message") else ""
                return f"{pod['metadata']['name']}: {waiting['reason']}{detail}"
    return None


# Why a pod ended that is the cluster's doing, not the trial's: a restart may succeed.
POD_INFRASTRUCTURE_REASONS = frozenset({"Evicted", "NodeLost", "Shutdown", "Terminated", "NodeShutdown",
                                        "Preempting", "UnexpectedAdmissionError"})
CONTAINER_INFRASTRUCTURE_REASONS = frozenset({"OOMKilled", "ContainerStatusUnknown"})


def infrastructure_failure(pods: Sequence[dict]) -> Optional[str]:
    """Why the trial's pods failed when the cluster, not the trial, failed them; None otherwise."""
    for pod in pods:
        status = pod.get("status") or {}
        name = pod["metadata"]["name"]
        if status.get("reason") in POD_INFRASTRUCTURE_REASONS:
            detail = f": {status['message']}" if status.get("message") else ""
            return f"{name}: {status['reason']}{detail}"
        for container in status.get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated.get("reason") in CONTAINER_INFRASTRUCTURE_REASONS:
                return f"{name}: {terminated['reason']}"
    return None


def trial_exit_code(pods: Sequence[dict]) -> Optional[int]:
    """The trial containers' exit code: the first non-zero one, else 0; None if none ended."""
    codes = []
    for pod in pods:
        specs = (pod.get("spec") or {}).get("containers", [])
        trial_containers = {c["name"] for c in specs if c.get("command") == k8s.RUN_COMMAND}
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated")
            if container.get("name") in trial_containers and terminated:
                codes.append(terminated.get("exitCode"))
    failed = [code for code in codes if code]
    return failed[0] if failed else (0 if codes else None)


def termination_message(pods: Sequence[dict]) -> Optional[str]:
    """What a trial container that failed said as it ended (run.sh: why the trial could not start,
    such as an image without a usable Python); None if none did."""
    for pod in pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated.get("exitCode") and (terminated.get("message") or "").strip():
                return f"{pod['metadata']['name']}: {terminated['message'].strip()}"
    return None


def trial_status(job_status: PlatformStatus, pods: Sequence[dict]) -> PlatformStatus:
    """The job's status, with what only its pods tell: image failures, exit codes, run.sh's reasons, and
    that the trial runs once a pod of it does (an operator says Running only when all of them do)."""
    if job_status.status not in FINAL_STATUSES:
        failure = image_failure(pods)
        if failure:
            return PlatformStatus(FAILED, failure)
        if job_status.status == WAITING and any((pod.get("status") or {}).get("phase") == "Running" for pod in pods):
            return PlatformStatus(RUNNING)
        return job_status
    if job_status.exit_code is None:
        job_status = dataclasses.replace(job_status, exit_code=trial_exit_code(pods))
    said = termination_message(pods) if job_status.status == FAILED else None
    if said:
        job_status = dataclasses.replace(job_status, reason=f"{said}; {job_status.reason}" if job_status.reason else said)
    cause = infrastructure_failure(pods) if job_status.status == FAILED else None
    if cause:
        reason = f"{cause}; {job_status.reason}" if job_status.reason else cause
        return dataclasses.replace(job_status, reason=reason, retryable=True)
    return job_status


KEPT_KINDS = frozenset({"PersistentVolumeClaim", "ServiceAccount"})  # created once, never overwritten


class KubePlatform(PlatformBase):
    """One trial = the objects `renderer` makes; its handle is the job's ObjectRef as text."""

    renderer: Callable[[Any, TrialSpec], List[dict]]
    mapper: Callable[[dict], PlatformStatus]

    def __init__(self, config: Any, experiment_dir: Any, client: Any = None):
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self._client = client
        self._expiring: dict = {}  # handle -> the timer that deletes its finished job
        self._azure_key: Optional[str] = None  # the Azure File share's account key, read once from Key Vault
        self._pool: Any = _UNREAD  # the namespace's resource pool (pools.yml, kubernetes/pool_leases.py) or None
        self._held: dict = {}  # handle -> (spec, objects, slots): waiting for the pool's slots, in submission order
        self._leased: dict = {}  # handle -> trial id: its slots are leased from the pool
        self._unstarted: dict = {}  # handle -> PlatformStatus: stopped while it waited
        self._admissions: Any = _UNREAD  # the namespace's Kueue pool (pools.yml, kubernetes/kueue.py) or None
        self._told: dict = {}  # handle -> the manager's URL as its pods were told it

    @property
    def checkpoint_survives_stop(self) -> bool:
        """Whether the trial's checkpoint is on a claim that outlives its job (else pausing loses it)."""
        return getattr(self.config, "storage", None) is not None

    @property
    def client(self):
        if self._client is None:
            from trialkit.platforms.kubernetes.client import KubeClient

            self._client = KubeClient.from_environment()
        return self._client

    def submit(self, spec: TrialSpec) -> str:
        """Create the trial's objects, the job last, once the namespace's pool (if any) leases its slots;
        until then the trial waits, in submission order."""
        from trialkit.platforms.kubernetes.client import ObjectRef

        # In a Kueue pool the job joins its LocalQueue: Kueue, not a lease, starts it.
        objects = kueue.into_queue(self.renderer(self.config, spec), self.admissions and self.admissions.queue)
        self._record(spec, objects)
        shipping.keep(objects, self.experiment_dir, spec.experiment_id)  # what the pods fetch, served by the manager
        handle = str(ObjectRef.of(objects[-1]))
        if self.admissions is not None:
            self.admissions.submitted(handle, spec.trial_id)
        told = spec.env.get(envnames.MANAGER_URL)
        self._told[handle] = told and k8s.pod_manager_url(told, self.config.common.manager_address)
        pool = self.pool
        if pool is None:
            self._create(spec, objects)
            return handle
        slots = pool_leases.job_slots(objects[-1])
        pool.check(slots)
        self._unstarted.pop(handle, None)
        self._held[handle] = (spec, objects, slots)
        self._start_held()
        return handle

    @property
    def pool(self) -> Optional[pool_leases.NamespacePool]:
        if self._pool is _UNREAD:
            self._pool = pool_leases.for_namespace(self.config.common.namespace, self.client)
        return self._pool

    @property
    def admissions(self) -> Optional[kueue.Admissions]:
        if self._admissions is _UNREAD:
            queue = kueue.for_namespace(self.config.common.namespace)
            # on_waiting is the loop's, set after the platform is made: looked up at each call.
            self._admissions = queue and kueue.Admissions(queue, lambda trial, why: self.on_waiting(trial, why))
        return self._admissions

    def _workloads(self, job: dict) -> List[dict]:
        """The Kueue Workloads of `job`, as Kueue names or labels them."""
        from trialkit.platforms.kubernetes.client import ObjectRef

        ref, namespace = kueue.workload_ref(job), job["metadata"]["namespace"]
        if "name" in ref:
            return [found for found in [self.client.get(ObjectRef("Workload", namespace, ref["name"]))] if found]
        return self.client.list("Workload", namespace, ref["selector"])

    def _start_held(self) -> None:
        """Create the waiting trials the pool leases slots to now, first submitted first."""
        for handle, (spec, objects, slots) in list(self._held.items()):
            if not self.pool.take(spec.trial_id, spec.experiment_id, slots, objects[-1]):
                return
            del self._held[handle]
            self._leased[handle] = spec.trial_id
            try:
                self._create(spec, objects)
            except Exception:
                self._release(handle)
                raise

    def _release(self, handle: str) -> None:
        trial = self._leased.pop(handle, None)
        if trial is not None:
            self.pool.release(trial)

    def _create(self, spec: TrialSpec, objects: List[dict]) -> None:
        """Create the trial's objects, the job last; the job then owns the per-trial ones."""
        from trialkit.platforms.kubernetes.client import ObjectRef

        *needs, job = k8s.with_secrets(objects, spec, self._storage_secret())
        # A ConfigMap or Secret left by an earlier attempt holds stale scripts or
        # an old token: replace it. A claim keeps its data (a checkpoint to resume);
        # the experiment's ServiceAccount is made once for all its trials.
        created = []
        try:
            for obj in needs:
                on_conflict = "keep" if obj["kind"] in KEPT_KINDS else "replace"
                self.client.create(obj, on_conflict=on_conflict)
                created.append(obj)
            submitted = self.client.create(job, on_conflict="keep")
        except Exception:
            self._remove_trial_objects(created)
            raise
        for obj in needs:
            # A claim is nobody's: it holds the checkpoint that activate resumes from.
            if k8s.LABEL_TRIAL in obj["metadata"]["labels"] and obj["kind"] != "PersistentVolumeClaim":
                self.client.set_owner(ObjectRef.of(obj), submitted)

    def _storage_secret(self) -> Optional[dict]:
        """What the experiment's Azure File Secret holds; None without one."""
        azure = self.config.common.azure
        if azure is None:
            return None
        if self._azure_key is None:
            from trialkit.platforms.kubernetes.azure import account_key

            self._azure_key = account_key(azure)
        return k8s.azure_values(azure, self._azure_key)

    def _remove_trial_objects(self, objects: Sequence[dict]) -> None:
        """Undo a submission that failed half-way; the error that stopped it is the one raised."""
        from trialkit.platforms.kubernetes.client import ClusterError, ObjectRef

        for obj in objects:
            if k8s.LABEL_TRIAL not in obj["metadata"]["labels"]:
                continue  # the experiment's, not this trial's
            try:
                self.client.delete(ObjectRef.of(obj))
            except ClusterError as err:
                log.warning("could not remove %s after a failed submission: %s", ObjectRef.of(obj), err)

    def _record(self, spec: TrialSpec, objects: List[dict]) -> None:
        """What was submitted, secrets left out, for whoever debugs the trial."""
        path = self.experiment_dir / "trials" / spec.trial_id / "kubernetes.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump_all(objects, sort_keys=False), encoding="utf-8")

    def status(self, handle: str) -> PlatformStatus:
        from trialkit.platforms.kubernetes.client import ObjectRef

        if handle in self._unstarted:
            return self._unstarted[handle]
        if handle in self._held:
            self._start_held()  # slots another experiment's trial gave back: nobody tells us
            if handle in self._held:
                return PlatformStatus(WAITING, self.pool.waiting_reason(self._held[handle][2]))
        ref = ObjectRef.parse(handle)
        job = self.client.get(ref)
        if job is None:
            self._release(handle)
            gone = self.admissions.gone(handle) if self.admissions is not None else None
            return gone or PlatformStatus(SYS_CANCELED, f"{ref} no longer exists")
        pods = self.client.list_pods(ref.namespace, _selector(job))
        status = trial_status(self.mapper(job), pods)
        if self.admissions is not None:
            status = self.admissions.status(handle, job, pods, status, lambda: self._workloads(job))
            if self.admissions.evicted(handle):  # its pods are gone: a new job resumes it, queued anew
                self.client.delete(ref)
                if self.client.get(ref) is None:  # gone at once (no finalizer held it): say so now
                    return self.admissions.gone(handle)
        if status.status in FINAL_STATUSES:
            self._release(handle)
            self._expire(handle, status.status)
        return status

    def _expire(self, handle: str, status: str) -> None:
        """Delete the finished job (its pods, ConfigMap and Secret with it) after its retention."""
        if handle in self._expiring:
            return
        retention = self.config.common.retention
        delay = retention.succeeded_seconds if status == SUCCEEDED else retention.failed_seconds
        timer = threading.Timer(delay, self._delete_expired, (handle,))
        timer.daemon = True  # what outlives the control plane goes with remove_experiment
        self._expiring[handle] = timer
        timer.start()

    def _delete_expired(self, handle: str) -> None:
        """The retention timer's deletion: an API server out of reach then is one line, not a thread's traceback."""
        from trialkit.platforms.kubernetes.client import ClusterError

        try:
            self._delete(handle, None)
        except ClusterError as err:
            print(f"trialkit: the finished job is left in the cluster: {err}", file=sys.stderr, flush=True)

    def remove_experiment(self, experiment_id: str, trial_ids: Sequence[str]) -> List[str]:
        """Delete every object the experiment's trials were made of, claims included; what was deleted."""
        for timer in self._expiring.values():
            timer.cancel()
        return self._delete_all(self._objects(experiment_id, trial_ids))

    def experiment_ended(self, experiment_id: str, trial_ids: Sequence[str]) -> None:
        """Done or stopped: the checkpoint claims go, and what serves the experiment (an AdaptDL experiment's
        TensorBoard); what it keeps for later (kept_objects) stays until `trialkit experiment delete`;
        finished jobs go with their retention."""
        from trialkit.platforms.kubernetes.client import ObjectRef

        kept = {ObjectRef.of(obj) for obj in self.kept_objects(experiment_id)}
        claims = [ref for ref in self._objects(experiment_id, trial_ids) if ref.kind == "PersistentVolumeClaim"]
        served = [ObjectRef.of(obj) for obj in self.experiment_objects(experiment_id)]
        removed = self._delete_all([ref for ref in dict.fromkeys(served + claims) if ref not in kept])
        if removed:
            log.info("removed %d objects of experiment %s", len(removed), experiment_id)

    def experiment_objects(self, experiment_id: str) -> List[dict]:
        """Objects of the experiment rather than of a trial, made on request; deleted when it ends, but for
        kept_objects."""
        return []

    def kept_objects(self, experiment_id: str) -> List[dict]:
        """The experiment's objects that outlive its end, until `trialkit experiment delete`: data it can
        still serve (AdaptDL's TensorBoard claim)."""
        return []

    def _objects(self, experiment_id: str, trial_ids: Sequence[str]) -> list:
        """The refs of every object of the experiment and its trials, each once: the renderer names them all
        (a placeholder command and token render the same names)."""
        from trialkit.platforms.kubernetes.client import ObjectRef

        refs: dict = {ObjectRef.of(obj): None for obj in self.experiment_objects(experiment_id)}
        for trial_id in trial_ids:
            placeholder = TrialSpec(experiment_id, trial_id, 0, "true", env={envnames.TOKEN: ""})
            for obj in self.renderer(self.config, placeholder):
                refs.setdefault(ObjectRef.of(obj), None)
        return list(refs)

    def _delete_all(self, refs: Sequence[Any]) -> List[str]:
        return [str(ref) for ref in refs if self.client.delete(ref)]

    def manager_url_told(self, handle: str) -> Optional[str]:
        return self._told.get(handle)

    def check_ready(self) -> None:
        """Before the manager starts: a kubeconfig that cannot be read, or an API server that does not
        answer, is one line now rather than three failed trials later."""
        from trialkit.platforms.kubernetes.client import ClusterError, KubeClient, ObjectRef

        client = self._client or KubeClient.from_environment(attempts=2, backoff=0.2)
        namespace = self.config.common.namespace
        try:
            client.get(ObjectRef("ConfigMap", namespace, "trialkit-ready-check"))
        except ClusterError as err:
            raise UserError(f"the Kubernetes API server does not answer: {err}", "KUBECONFIG",
                            "check the cluster in your kubeconfig, and that it is up") from None
        self._client = client
        self._storage_secret()  # an Azure key that cannot be read is one line now, before any trial
        self.pool  # read now: so is a mistake in pools.yml
        self.admissions

    def stop(self, handle: str, grace: Optional[float] = None) -> None:
        """Delete the job: its pods run cleanup.sh (the keeper checkpoints) within their
        terminationGracePeriodSeconds, or within `grace` seconds when given."""
        self._delete(handle, None if grace is None else int(grace))

    def kill(self, handle: str) -> None:
        """Delete the job and its pods at once."""
        self._delete(handle, 0)

    def _delete(self, handle: str, pod_grace: Optional[int]) -> None:
        from trialkit.platforms.kubernetes.client import ObjectRef

        if self._held.pop(handle, None) is not None:  # it never started: nothing in the cluster to delete
            self._unstarted[handle] = PlatformStatus(USER_CANCELED, "stopped while it waited for its pool's slots", started=False)
            return
        ref = ObjectRef.parse(handle)
        job = self.client.get(ref)
        if job is None:
            return
        self.client.delete(ref)
        if pod_grace is not None:
            self.client.delete_pods(ref.namespace, _selector(job), pod_grace)


_UNREAD = object()  # the pool not looked up yet


def _selector(job: dict) -> str:
    labels = job["metadata"].get("labels") or {}
    return ",".join(f"{key}={labels[key]}" for key in (k8s.LABEL_EXPERIMENT, k8s.LABEL_TRIAL))
