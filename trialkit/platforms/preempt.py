"""Preemption in a resource pool: which running trials give their slots back to a job of higher priority.

There is no daemon. A job whose trial the pool refuses records what its waiting trials need (the jobs
table's `waiting`/`queued`, platforms/pools.py); every other job's control plane looks at the table while
its trials run (local.Platform's pool watcher) and, when a job of a strictly smaller priority number waits,
pauses just enough of its own running trials, the newest first, through their checkpoint: the pause path
(SIGTERM to the keeper, the trial checkpoints and exits 143, PREEMPTED). They queue again in their
experiment and resume from their checkpoint when the pool gives slots back; the waiting job's place in
the priority order keeps them from taking those slots first.

Jobs give back in the reverse of the scheduler's order: the largest priority number first (the smallest
in a `priority_descending` pool), then the latest place. So each job, knowing the table, can tell alone
how much is its to give, and no two give the same slots. Of equal priorities, only a job a user moved
ahead (`job update --ahead-of`, `--behind-of`, Move to Top: its place before one submitted earlier)
preempts, as the seed's job queue shows the moved job taking the slot; peers in the order they were
submitted never preempt each other (no thrash between them). A `fair_share` pool preempts nothing.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from trialkit.platforms.pools import FAIR_SHARE, PRIORITY, PRIORITY_DESCENDING, ROUNDING, Claim


def owed(experiment: str, free: float, claims: Sequence[Claim], scheduler: str = PRIORITY
         ) -> Tuple[float, Optional[Claim]]:
    """(slots the experiment's running trials must give back now, the first job they go to): what the jobs
    of strictly higher priority wait for, less the free slots and what the jobs that give back before it
    hold. (0, None) when nothing is owed, or when its job is not preemptible or not in `claims`."""
    me = next((claim for claim in claims if claim.experiment == experiment), None)
    if me is None or not me.preemptible or scheduler == FAIR_SHARE:
        return 0.0, None
    sign = -1 if scheduler == PRIORITY_DESCENDING else 1

    def rank(claim: Claim) -> int:  # smaller goes first
        return sign * claim.priority

    def preempts(claim: Claim) -> bool:  # a strictly higher priority, or moved ahead of `me` at an equal one
        return rank(claim) < rank(me) or (claim.priority == me.priority and claim.order < me.order
                                          and claim.submitted > me.submitted)

    ahead = sorted((claim for claim in claims if claim.waits > 0 and claim is not me and preempts(claim)),
                   key=lambda claim: (rank(claim), claim.order))
    if not ahead:
        return 0.0, None
    before_me = sum(claim.holds for claim in claims if claim.preemptible and claim is not me and (
        (rank(claim), claim.order) > (rank(me), me.order)))
    due = sum(claim.waits for claim in ahead) - max(free, 0.0) - before_me
    return (due, ahead[0]) if due > ROUNDING else (0.0, None)


def choose(running: Sequence[str], slots_each: float, due: float) -> List[str]:
    """The trials to pause for `due` slots: the newest first (`running` in the order they started), as few as
    give that many."""
    chosen: List[str] = []
    for trial_id in reversed(running):
        if due <= ROUNDING:
            break
        chosen.append(trial_id)
        due -= slots_each
    return chosen
