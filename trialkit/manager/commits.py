"""Group commit: the keepers' batches that reach the server's loop together share one transaction.

Each batch the loop takes waits here; the flush is queued behind the
handlers that the same turn of the loop started, so it finds every batch
that came in with the first one, stores them all in one transaction
(Store.add_batches) and hands each request its own outcome. A request gets
its outcome only after the commit that holds its records: an ack never runs
ahead of the store. The more keepers send at once, the more one commit
carries.

A manager that cannot keep up says so instead of letting every answer wait
longer: `behind()` is true while the loop runs more than LAG_LIMIT late, on
the average (a timer of its own, due every TICK, tells how late it wakes; a
single pause of the process, as a busy machine makes now and then, does not
count), and the server then answers new batches 503: the keepers keep them
and send them again after a back-off (trialkit/keeper/shipper.py).
"""
from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Tuple

from trialkit.manager.store import Store, Stored

TICK = 0.01  # seconds between the lag timer's wakes
IDLE = 1.0  # the timer stops after this long without a batch, once on time (an idle manager sleeps)
# How late the loop may run before new batches are refused: well above a busy machine's scheduling
# jitter (tens of milliseconds), well below the seconds a queue that only grows would reach.
LAG_LIMIT = 0.2
SMOOTHING = 0.3  # the weight of the newest lateness in the average

Batch = Tuple[str, List[Dict[str, Any]], List[Tuple[Dict[str, Any], str]]]


class GroupCommit:
    def __init__(self, store: Store):
        self._store = store
        self._pending: List[Tuple[Batch, "asyncio.Future[Stored]"]] = []
        self._due: Optional[float] = None  # when the lag timer should wake next (the loop's clock)
        self.lag = 0.0  # how late it wakes, on the (exponentially weighted) average, in seconds
        self._last_batch = 0.0

    async def add(self, trial_id: str, batch: List[Dict[str, Any]],
                  rejected: List[Tuple[Dict[str, Any], str]]) -> Stored:
        """Store a batch with the others of this turn of the loop; raises what storing it raised."""
        loop = asyncio.get_running_loop()
        self._last_batch = loop.time()
        if self._due is None:
            self._tick()
        future = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append(((trial_id, batch, rejected), future))
        return await future

    def behind(self) -> bool:
        """Whether the loop runs over LAG_LIMIT late, on the average."""
        return self.lag > LAG_LIMIT

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._due is not None:
            self.lag += SMOOTHING * (max(0.0, now - self._due) - self.lag)
        if now - self._last_batch > IDLE and self.lag < TICK:  # idle, and not for being behind
            self._due, self.lag = None, 0.0
            return
        self._due = now + TICK
        loop.call_at(self._due, self._tick)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        try:
            outcomes: List[Any] = self._store.add_batches([batch for batch, _ in pending])
        except Exception as err:  # noqa: BLE001 - the commit failed: no batch of the group is stored
            outcomes = [err] * len(pending)
        for (_, future), outcome in zip(pending, outcomes):
            if future.done():
                continue  # its request was given up (the client left): stored all the same, acked on a resend
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
