"""A Kubernetes namespace's resource pool: slot leases that every control plane sees, kept in the cluster.

    pool = for_namespace("team", client)              # None unless pools.yml declares the namespace's pool
    pool.take("abcd1234-00003", "abcd1234", 2, job)   # True: leased to this control plane, renewed while it runs
    pool.release("abcd1234-00003")                    # it ended

pools.yml (under TRIALKIT_HOME, the same on every machine that submits there):

    pools:
      team: {kubernetes: {namespace: team, slots: 8}}

The ledger is one ConfigMap of the namespace, `trialkit-pool-<name>`: its `leases` entry is a JSON map,
trial -> {experiment, slots, holder, expires, job, selector}. Every change reads the ConfigMap, changes
the map and writes it back naming the resourceVersion it read; the API server refuses the write (409)
when another control plane wrote in between, and the change is made again on what that one wrote. So two
control planes never grant the same slot, and no daemon runs.

A control plane renews its leases every LEASE_SECONDS/3. A lease that was not renewed in time (its
control plane crashed or lost the cluster) is dropped at the next change once its job is gone or all its
job's pods have ended; a job that still runs keeps its slots, whoever submitted it.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional

from trialkit import process
from trialkit.errors import UserError
from trialkit.platforms import pools
from trialkit.platforms.kubernetes import render as k8s
from trialkit.platforms.kubernetes.client import ClusterError, ObjectRef

log = logging.getLogger(__name__)

LEASE_SECONDS = 60.0  # a lease's life without renewal: a crashed control plane's leases expire after this
CONFLICT_ATTEMPTS = 50  # writes refused because another control plane wrote first, before giving up
ENDED_PHASES = ("Succeeded", "Failed")
Leases = Dict[str, Dict[str, Any]]


def for_namespace(namespace: str, client: Any) -> Optional["NamespacePool"]:
    """The pool pools.yml declares for `namespace`; None when it declares none (the namespace is not pooled) or
    its pool is Kueue's (kubernetes/kueue.py: Kueue holds the slots)."""
    found = pools.declared_for(lambda spec: spec.namespace == namespace, f"namespace {namespace!r}")
    return NamespacePool(client, found[0], namespace, found[1].slots) if found and not found[1].local_queue else None


def job_slots(job: dict) -> int:
    """The slots a trial's job takes: its pods (a PyTorchJob's or TFJob's replicas, a Framework's task
    numbers); an elastic AdaptDLJob, whose pods come and go, one."""
    spec = job.get("spec") or {}
    replicas = [role.get("replicas", 1) for key, roles in spec.items() if key.endswith("ReplicaSpecs")
                for role in (roles or {}).values()]
    tasks = [role.get("taskNumber", 1) for role in spec.get("taskRoles") or []]
    return max(1, sum(replicas) + sum(tasks))


def this_control_plane() -> str:
    """A name for this process that no other (on any machine) has: host, pid, start time."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{process.start_ticks(pid)}"


class NamespacePool:
    """The namespace's ledger of leases, as this control plane changes it."""

    def __init__(self, client: Any, name: str, namespace: str, slots: int, lease_seconds: float = LEASE_SECONDS,
                 holder: Optional[str] = None):
        self.client = client
        self.name = name
        self.namespace = namespace
        self.slots = slots
        self.lease_seconds = lease_seconds
        self.holder = holder or this_control_plane()
        self._ref = ObjectRef("ConfigMap", namespace, f"trialkit-pool-{name}")
        self._mine: set = set()  # the trials whose leases this control plane renews
        self._lock = threading.Lock()
        self._renewer: Optional[threading.Thread] = None
        self._closed = threading.Event()

    def check(self, slots: int) -> None:
        """Refuse trials that this pool could never run."""
        if slots > self.slots:
            raise UserError(f"each trial asks for {slots} slots (its pods) but pool {self.name!r} of namespace "
                            f"{self.namespace} has {self.slots}", "trainingService",
                            f"start {self.slots} pods a trial or fewer, or give the pool more slots in pools.yml")

    def take(self, trial: str, experiment: str, slots: int, job: dict) -> bool:
        """Lease `slots` to the trial whose job (not created yet) is `job`, if the pool has them free now."""
        ref = ObjectRef.of(job)
        labels = job["metadata"].get("labels") or {}
        selector = ",".join(f"{key}={labels[key]}" for key in (k8s.LABEL_EXPERIMENT, k8s.LABEL_TRIAL))

        def change(leases: Leases) -> bool:
            self._drop_expired(leases)
            used = sum(lease["slots"] for other, lease in leases.items() if other != trial)
            if used + slots > self.slots:
                return False
            leases[trial] = {"experiment": experiment, "slots": slots, "holder": self.holder,
                             "expires": time.time() + self.lease_seconds, "job": str(ref), "selector": selector}
            return True

        granted = self._update(change)
        if granted:
            with self._lock:
                self._mine.add(trial)
                self._watch()
        return granted

    def release(self, trial: str) -> None:
        with self._lock:
            self._mine.discard(trial)
        self._update(lambda leases: leases.pop(trial, None) is not None)

    def renew(self) -> None:
        """Push the expiry of this control plane's leases on by a lease's life."""
        with self._lock:
            mine = set(self._mine)

        def change(leases: Leases) -> None:
            for trial in mine & set(leases):
                leases[trial].update(holder=self.holder, expires=time.time() + self.lease_seconds)

        self._update(change)

    def free(self) -> int:
        return self.slots - sum(lease["slots"] for lease in self.leases().values())

    def leases(self) -> Leases:
        return _leases(self.client.get(self._ref))

    def waiting_reason(self, slots: int) -> str:
        return f"waiting for {slots} slot{'s' if slots != 1 else ''} of pool {self.name} (namespace " \
               f"{self.namespace}): {self.free()} of {self.slots} free"

    def close(self) -> None:
        """Stop renewing (the leases expire unless released)."""
        self._closed.set()

    # -- the ledger -----------------------------------------------------------------------------
    def _update(self, change: Callable[[Leases], Any]) -> Any:
        """Apply `change` to the ledger and write it back over the version read; again on a conflict."""
        for _ in range(CONFLICT_ATTEMPTS):
            found = self.client.get(self._ref) or self.client.create(self._empty(), on_conflict="keep")
            leases = _leases(found)
            before = json.dumps(leases, sort_keys=True)
            result = change(leases)
            after = json.dumps(leases, sort_keys=True)
            if after == before:
                return result
            try:
                self.client.replace({**found, "data": {**(found.get("data") or {}), "leases": after}})
                return result
            except ClusterError as err:
                if err.status != 409:
                    raise
        raise ClusterError("update", str(self._ref), 409, f"{CONFLICT_ATTEMPTS} writes in a row came second to "
                                                          "another control plane's")

    def _empty(self) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self._ref.name, "namespace": self.namespace,
                             "labels": {"trialkit.io/pool": self.name}},
                "data": {"leases": "{}"}}

    def _drop_expired(self, leases: Leases) -> None:
        now = time.time()
        for trial, lease in list(leases.items()):
            if lease["expires"] < now and not self._job_runs(lease):
                log.info("lease of %s (%s) expired with its job gone or ended: its slots are free", trial,
                         lease["holder"])
                del leases[trial]

    def _job_runs(self, lease: Dict[str, Any]) -> bool:
        """Whether the lease's job still exists with a pod that has not ended (or none started yet)."""
        ref = ObjectRef.parse(lease["job"])
        if self.client.get(ref) is None:
            return False
        pods = self.client.list_pods(ref.namespace, lease["selector"])
        return not pods or any((pod.get("status") or {}).get("phase") not in ENDED_PHASES for pod in pods)

    def _watch(self) -> None:
        """Start the renewer unless it runs (called under the lock)."""
        if self._renewer is None:
            self._renewer = threading.Thread(target=self._renew_while_held, name=f"pool-{self.name}", daemon=True)
            self._renewer.start()

    def _renew_while_held(self) -> None:
        while not self._closed.wait(self.lease_seconds / 3):
            with self._lock:
                if not self._mine:
                    self._renewer = None
                    return
            try:
                self.renew()
            except ClusterError as err:  # the next round tries again; a lease lives LEASE_SECONDS
                log.warning("could not renew the leases of pool %s: %s", self.name, err)


def _leases(config_map: Optional[dict]) -> Leases:
    return json.loads(((config_map or {}).get("data") or {}).get("leases") or "{}")
