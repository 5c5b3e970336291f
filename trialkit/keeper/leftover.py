"""What an ended keeper leaves undelivered, for the control plane to store: one reader for every path.

A keeper that ended without a manager to answer (or was SIGKILLed) leaves two
kinds of records behind: those it spooled and never had acknowledged, and
those the trial wrote to its followed files (the channel, NNI's metrics file)
past the spool's cursor, which it had not read yet. `undelivered` gives both,
each with its spool's id (`spool`), the second numbered on from the spool's
next seq exactly as the next keeper on the same trial dir would number them
(same files, same cursor, same decoders, same order, same spool). So whoever
delivers a record, this reader or a restarted keeper, it carries the same
spool and seq, and the store, which keeps each (trial, spool, seq) once,
stores it once. Nothing is written to the trial dir but what the spool's own
recovery does (cutting a torn batch, as the next keeper would), and, where the
followed files hold records and no spool holds an id yet (the keeper died
before it spooled anything), a batch of no records that puts the id on disk
for the next keeper (Spool.claim).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from trialkit import layout, records
from trialkit.keeper.collector import FileSource
from trialkit.keeper.spool import Spool, read_unacknowledged
from trialkit.keeper.status import StatusFile


def undelivered(trial_dir: Path) -> List[Dict[str, Any]]:
    """Every record an ended keeper on `trial_dir` was given and the manager may not hold, each with its seq."""
    trial_dir = Path(trial_dir)
    spool_dir = layout.spool_dir(trial_dir)
    # None when the keeper died before its reporting side started; made below only if there is something to number.
    spool = Spool(spool_dir) if spool_dir.is_dir() else None
    try:
        out = read_unacknowledged(spool) if spool else []
        previous = StatusFile.previous(layout.status_path(trial_dir)) or {}
        run = previous.get("restart_count") if type(previous.get("restart_count")) is int else None
        unread = _unread(trial_dir, spool.cursor if spool else {}, run)
        if unread:
            spool = spool or Spool(spool_dir)
            spool.claim()
            seq = spool.next_seq
            for rec in unread:
                out.append({"seq": seq, **rec})
                seq += 1
        ident = spool.id if spool else ""
        for rec in out:
            rec["spool"] = ident
        return out
    finally:
        if spool:
            spool.close()


def _unread(trial_dir: Path, cursor: Dict[str, Any], run: Optional[int]) -> List[Dict[str, Any]]:
    """The records the followed files hold past `cursor`, in the order a keeper reads them."""
    ignore = lambda *_: None  # noqa: E731 - a malformed frame is skipped here as the keeper skips it
    out: List[Dict[str, Any]] = []
    sources = [
        FileSource("channel", layout.home(trial_dir) / layout.CHANNEL, records.SeqDecoder, cursor.get("channel"),
                   ignore, ignore),
        FileSource("nni", layout.nni_metrics_path(trial_dir), records.NniFrameDecoder, cursor.get("nni"), ignore, ignore),
    ]
    for source in sources:
        while True:
            frames, _ = source.read()
            if frames is None:
                break
            for payload, _ in frames:
                try:
                    rec = records.normalize(records.loads(payload), source.name, run)
                except records.BadRecord:
                    continue
                if rec:
                    out.append(rec)
        source.finish()  # a frame cut short at the end was torn: a keeper skips it too
    return out
