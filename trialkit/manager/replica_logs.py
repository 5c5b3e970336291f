"""The output of a multi-pod trial's other replicas, by rank, kept beside the trial.

Only one keeper of a trial ships its records to the store (the reporting
replica: env.is_reporting_replica); the others' spools number their records
from 1 too, so they ship to a route of their own rank instead:

    POST /api/v1/trials/<trial_id>/replicas/<rank>/records   (a keeper's batch, as for /records)
        -> 200 {"acked": N, "inserted": K}

with the trial's token. The text of their LOG records is appended, in seq
order and each seq once, to trials/<trial_id>/replicas/rank-<rank>.log in the
experiment dir, which outlives the trial's job and pods (`trialkit trial logs
--rank N` reads it); their other records (metrics, status changes) are
acknowledged and dropped: the reporting replica's count. The highest seq
taken from each spool (a replica restarted in a new pod numbers a fresh one)
is kept beside the log, written after the log's bytes are on disk, so a
manager killed between the two may repeat a chunk, never lose one.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from trialkit import records
from trialkit.manager.routes import Check, HttpError, Request, Router

if TYPE_CHECKING:
    from trialkit.manager.store import Store

ROUTE = "/api/v1/trials/<trial_id>/replicas/<rank>/records"
REPLICAS_DIR = "replicas"


def log_path(experiment_dir: Path, trial_id: str, rank: int) -> Path:
    return Path(experiment_dir) / "trials" / trial_id / REPLICAS_DIR / f"rank-{rank}.log"


def read(experiment_dir: Path, trial_id: str, rank: int) -> Optional[str]:
    """What replica `rank` of the trial shipped; None when it shipped nothing."""
    try:
        return log_path(experiment_dir, trial_id, rank).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None


def ranks(experiment_dir: Path, trial_id: str) -> List[int]:
    """The ranks that shipped here: every pod of the trial but the reporting one (each ships a status at least)."""
    folder = Path(experiment_dir) / "trials" / trial_id / REPLICAS_DIR
    found = [path.stem[len("rank-"):] for path in folder.glob("rank-*.log")] if folder.is_dir() else []
    return sorted(int(rank) for rank in found if rank.isdigit())


def reporting_rank(experiment_dir: Path, trial_id: str) -> Optional[int]:
    """The reporting pod's rank: the one of 0..len(ranks) that did not ship here; None for a one-pod trial."""
    shipped = ranks(experiment_dir, trial_id)
    missing = sorted(set(range(len(shipped) + 1)) - set(shipped))
    return missing[0] if shipped and missing else None


def add_route(router: Router, store: "Store", trial_check: Check) -> None:
    lock = threading.Lock()  # one writer at a time: a replica's batches are few and small

    def post(request: Request) -> Tuple[int, Any]:
        rank = request.params["rank"]
        if not rank.isdigit():
            raise HttpError(400, f"{rank!r} is not a replica's rank")
        try:
            spool, batch, rejected = records.split_batch(records.loads(request.body))
        except records.BadRecord as err:
            raise HttpError(400, str(err)) from None
        path = log_path(store.path.parent, request.params["trial_id"], int(rank))
        with lock:
            return 200, _take(path, spool, sorted(batch + [rec for rec, _ in rejected], key=lambda rec: rec["seq"]))

    router.add("POST", ROUTE, post, trial_check)


def _take(path: Path, spool: str, batch: list) -> dict:
    # The spool that names none keeps the name it had before spools had ids.
    acked_path = path.with_name(f"{path.stem}.{spool}.acked" if spool else f"{path.stem}.acked")
    acked = int(acked_path.read_text()) if acked_path.exists() else 0
    text, taken = [], 0
    for rec in batch:
        if rec["seq"] != acked + 1:
            continue  # seen already, or after a gap the keeper fills first
        acked += 1
        if rec.get("type") == records.LOG and isinstance(rec.get("value"), dict):
            text.append(str(rec["value"].get("text", "")))
            taken += 1
    if acked:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as out:
            out.write("".join(text))
            out.flush()
            os.fsync(out.fileno())
        partial = acked_path.with_name(acked_path.name + ".part")
        partial.write_text(str(acked))
        os.replace(partial, acked_path)
    return {"acked": acked, "inserted": taken}
