"""A Ray cluster's resource pool, as it lives in the cluster: the ledger actor and the holders it asks.

The ledger is one named, detached actor of the cluster (`trialkit-pool-<name>`, in trialkit's Ray
namespace), made by the first control plane that asks (get_if_exists) and found by the others
(platforms/ray_pool.py). An actor runs one call at a time, so a grant (count, then add) is never
interleaved with another. Each lease names its holder, a small actor of the control plane that took it
(not detached: it dies with its control plane, its driver), and the trial's placement group (detached:
it outlives its control plane while the trial runs; the platform removes it when the trial ends). A
lease stands while its group does; before the control plane says the group is made (`placed`), while its
holder lives (PLACE_SECONDS at most). So a trial's end gives its slots back without a word to the ledger, a crashed control plane's
running trials keep theirs, and its unstarted ones do not.
"""
from __future__ import annotations

import time
from typing import Any, Dict

PING_TIMEOUT = 10.0  # for a holder to answer: one that cannot is gone
PLACE_SECONDS = 60.0  # a lease's life without its placement group: between the grant and the group's making


def ledger_name(pool: str) -> str:
    return f"trialkit-pool-{pool}"


class Holder:
    """A control plane, as the ledger sees it: alive while this actor answers."""

    def ping(self) -> bool:
        return True


class Ledger:
    """The pool's leases: trial -> [experiment, slots, holder actor, placement group name, granted at, placed]."""

    def __init__(self, slots: int):
        self.slots = slots
        self.leases: Dict[str, tuple] = {}

    def take(self, trial: str, experiment: str, slots: int, holder: Any, group: str) -> bool:
        """Lease `slots` to the trial if the pool has them free now (its placement group: `group`)."""
        self._drop_gone()
        used = sum(lease[1] for other, lease in self.leases.items() if other != trial)
        if used + slots > self.slots:
            return False
        self.leases[trial] = [experiment, slots, holder, group, time.time(), False]
        return True

    def placed(self, trial: str) -> None:
        """The trial's placement group is made: the lease goes with it from now on."""
        if trial in self.leases:
            self.leases[trial][5] = True

    def held(self) -> Dict[str, int]:
        """trial -> its slots, of the leases that stand."""
        self._drop_gone()
        return {trial: lease[1] for trial, lease in self.leases.items()}

    def _drop_gone(self) -> None:
        for trial, (_, _, holder, group, granted, placed) in list(self.leases.items()):
            if not _group_exists(group) and (placed or time.time() - granted > PLACE_SECONDS or not _alive(holder)):
                del self.leases[trial]


def _alive(holder: Any) -> bool:
    import ray

    try:
        return ray.get(holder.ping.remote(), timeout=PING_TIMEOUT)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False


def _group_exists(name: str) -> bool:
    from ray.util.placement_group import get_placement_group

    try:
        get_placement_group(name)
    except ValueError:
        return False
    return True
