"""Group commit: the keepers' batches that reach the server's loop together share one transaction.

Each batch the loop takes waits here; the flush is queued behind the
handlers that the same turn of the loop started, so it finds every batch
that came in with the first one, stores them all in one transaction
(Store.add_batches) and hands each request its own outcome. A request gets
its outcome only after the commit that holds its records: an ack never runs
ahead of the store. The more keepers send at once, the more one commit
carries.

No batch is refused for load: a manager that falls behind answers later, and
each keeper, with one batch in flight, sends what piled up meanwhile in its
next batch, whose fixed cost is shared by more records. Refusing batches
(503 while the loop ran 0.2 s late) was tried and measured worse: a refused
batch costs its reading and an answer and is sent again, bigger; on a
2-core machine at load 13 the manager then took 1,558 records/s from
1,000 keepers, where the manager from before group commit took 16,167 in
the same race (bench/bench_manager.py --burners 1 --baseline).
"""
from __future__ import annotations

import asyncio
import sys
from typing import Any, Callable, Dict, List, Tuple, Union

from trialkit.manager.store import Store, Stored

Batch = Tuple[str, str, List[Dict[str, Any]], List[Tuple[Dict[str, Any], str]]]  # (trial, spool id, records, refused)
Done = Callable[[Union[Stored, Exception]], None]


class GroupCommit:
    def __init__(self, store: Store):
        self._store = store
        self._pending: List[Tuple[Batch, Done]] = []

    def submit(self, trial_id: str, spool: str, batch: List[Dict[str, Any]],
               rejected: List[Tuple[Dict[str, Any], str]], done: Done) -> None:
        """From the server's loop: store a batch with the others of this turn; `done` gets its outcome (Stored,
        or what storing it raised) once the commit is over. A callback, not a future: the keepers' route
        answers from it without a task per request."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(((trial_id, spool, batch, rejected), done))

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        try:
            outcomes: List[Any] = self._store.add_batches([batch for batch, _ in pending])
        except Exception as err:  # noqa: BLE001 - the commit failed: no batch of the group is stored
            outcomes = [err] * len(pending)
        for (_, done), outcome in zip(pending, outcomes):
            try:
                done(outcome)  # a request whose client left is stored all the same, acked on a resend
            except Exception as err:  # noqa: BLE001 - a bug in one answer must not keep the group's others waiting
                print(f"trialkit-manager: answering a batch failed: {err!r}", file=sys.stderr, flush=True)
