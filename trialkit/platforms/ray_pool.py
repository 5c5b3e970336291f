"""A Ray cluster's resource pool, as a control plane uses it (the ledger itself: trialkit/ray/pool_ledger.py).

    pool = for_address("HEAD:6379")        # None unless pools.yml declares a pool for that address
    queue = Queue(pool, slots=1, place=platform_places_it, group_name=lambda trial: ...)
    queue.submit(spec)                     # placed now if the pool leases its slots, else waits
    queue.status(trial)                    # WAITING (with the free count) while it waits; None once placed

pools.yml (under TRIALKIT_HOME, the same on every machine that submits there):

    pools:
      shared: {ray: {address: "HEAD:6379", slots: 4}}

Every Ray experiment whose trainingService.address is that text takes its trials' slots from it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from trialkit.errors import UserError
from trialkit.platforms import pools
from trialkit.platforms.base import PlatformStatus, TrialSpec
from trialkit.ray import cluster, pool_ledger
from trialkit.statuses import USER_CANCELED, WAITING


def for_address(address: str) -> Optional["RayPool"]:
    """The pool pools.yml declares for the Ray cluster at `address` (as the experiment writes it); None: none."""
    found = pools.declared_for(lambda spec: spec.ray_address == address, f"Ray cluster {address}")
    return RayPool(found[0], found[1].slots) if found else None


class RayPool:
    """This control plane's view of the cluster's pool (used once connected: after ray.init)."""

    def __init__(self, name: str, slots: int):
        self.name = name
        self.slots = slots
        self._ledger: Any = None
        self._holder: Any = None

    def check(self, slots: int) -> None:
        """Refuse trials that this pool could never run."""
        if slots > self.slots:
            raise UserError(f"each trial asks for {slots} slots but pool {self.name!r} of the Ray cluster has "
                            f"{self.slots}", "trialGpuNumber", f"ask for {self.slots} or fewer, or give the pool "
                            "more slots in pools.yml")

    def take(self, trial: str, experiment: str, slots: int, group: str) -> bool:
        """Lease `slots` to the trial whose placement group will be named `group`, if they are free now; the
        lease stands while that group does."""
        import ray

        return ray.get(self._connect().take.remote(trial, experiment, slots, self._holder, group))

    def placed(self, trial: str) -> None:
        """The trial's placement group is made: its lease ends with it."""
        import ray

        ray.get(self._connect().placed.remote(trial))

    def held(self) -> Dict[str, int]:
        import ray

        return ray.get(self._connect().held.remote())

    def waiting_reason(self, slots: int) -> str:
        free = self.slots - sum(self.held().values())
        return f"waiting for {slots} slot{'s' if slots != 1 else ''} of pool {self.name} (Ray cluster): " \
               f"{free} of {self.slots} free"

    def _connect(self) -> Any:
        import ray

        if self._ledger is None:
            self._ledger = ray.remote(pool_ledger.Ledger).options(
                name=pool_ledger.ledger_name(self.name), namespace=cluster.NAMESPACE, lifetime="detached",
                get_if_exists=True, num_cpus=0).remote(self.slots)
            # Not detached: it dies with this driver, and the ledger then lets go of our unplaced trials.
            self._holder = ray.remote(pool_ledger.Holder).options(num_cpus=0).remote()
        return self._ledger


class Queue:
    """An experiment's trials that wait for the pool's slots, first submitted first; each is handed to
    `place` once leased (the platform then makes its placement group, named `group_name(trial)`)."""

    def __init__(self, pool: RayPool, slots: int, place: Callable[[TrialSpec], None],
                 group_name: Callable[[str], str]):
        pool.check(slots)
        self.pool = pool
        self.slots = slots
        self._place = place
        self._group_name = group_name
        self._waiting: Dict[str, TrialSpec] = {}
        self._stopped: Dict[str, PlatformStatus] = {}

    def submit(self, spec: TrialSpec) -> None:
        self._stopped.pop(spec.trial_id, None)
        self._waiting[spec.trial_id] = spec
        self.start()

    def start(self) -> None:
        """Place the waiting trials the pool leases slots to now (another experiment's trial that ended, or
        one of ours, frees them without a word to us: the loop's status calls look)."""
        for trial, spec in list(self._waiting.items()):
            if not self.pool.take(trial, spec.experiment_id, self.slots, self._group_name(trial)):
                return
            del self._waiting[trial]
            self._place(spec)
            self.pool.placed(trial)

    def status(self, trial: str) -> Optional[PlatformStatus]:
        """WAITING while it waits, USER_CANCELED once stopped while it did; None: the platform's to say."""
        if trial in self._stopped:
            return self._stopped[trial]
        if trial in self._waiting:
            self.start()
        if trial in self._waiting:
            return PlatformStatus(WAITING, self.pool.waiting_reason(self.slots))
        return None

    def stop(self, trial: str) -> bool:
        """A stop for a trial that still waits: it ends without starting (False: not one of those)."""
        if self._waiting.pop(trial, None) is None:
            return False
        self._stopped[trial] = PlatformStatus(USER_CANCELED, "stopped while it waited for its pool's slots", started=False)
        return True
