"""The keeper's durable spool: every record is on disk before it is sent.

Layout, in `<trial dir>/.trialkit/spool/`:
- segment files `<first seq>.log`, RFC 7464 JSON text sequences of
  `{"seq": N, ...record}` lines; each batch of records ends with a line
  `{"cursor": {...}, "next": N, "spool": ID}` saying how far the collectors
  had read their files, which seq comes next and the spool's id. A batch is
  one write and one fsync; it counts only once its cursor line is there, so a
  keeper killed mid-write leaves a torn batch that the next keeper cuts off,
  and its records are read again from the channel they came from: nothing
  lost, nothing twice.
- `acked`: the highest seq the manager acknowledged. It may lag (a crash
  right after an ack): then a few records are sent again and the manager,
  which dedupes on seq, stores them once.

Seqs start at 1 in every spool, so they say nothing of the trial's other
runs: a trial restarted where this spool is not (a new pod, another node)
numbers a fresh one from 1 too. The id, random, made as the spool is and
kept in its cursor lines, tells the spools apart: the manager stores each
(trial, spool, seq) once (manager/store.py). A keeper started again on the
same dir goes on with the same spool, id and numbering. A spool written
before spools had ids has the id "" (its batches name none) and keeps it.

Segments entirely acknowledged are deleted, except the newest, which always
holds the latest cursor (and the one before it while the newest holds no
whole batch yet). Memory stays bounded: records are read back from disk
batch by batch, never held all at once.

Threads: the keeper's loop appends; the shipper thread reads and acks. They
share `cond` (a Condition) for the few fields both touch.
"""
from __future__ import annotations

import bisect
import json
import os
import threading
from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: 2 of the 5.6 ms the reporting side imports beside the trial's start
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

from trialkit import records

SEGMENT_RECORDS = 10_000
DRAIN_BATCH = 1000  # records read at a time by read_unacknowledged()
RESERVE_BYTES = 64 << 10  # a final status, the held statuses, the followed files' last page, the status file
_RECORD = records.RS + b'{"seq":'  # the seq first: read back without decoding the record
_CURSOR = records.RS + b'{"cursor":'
_SUFFIX = ".log"
ID_BYTES = 8  # random bytes of a spool's id: two spools of one trial never meet


class Spool:
    def __init__(self, directory: Path, segment_records: int = SEGMENT_RECORDS):
        self.dir = directory
        self.segment_records = segment_records
        self.cond = threading.Condition()
        directory.mkdir(parents=True, exist_ok=True)
        self.acked = self._read_acked()
        self._segments: List[int] = sorted(int(p.stem) for p in directory.glob("*" + _SUFFIX) if p.stem.isdigit())
        self.next_seq = 1
        self.cursor: Dict[str, Any] = {}
        self.id = os.urandom(ID_BYTES).hex()  # a fresh spool's; _recover reads an older one's
        self._active_records = 0
        self._committed = 0  # bytes of the newest segment that hold whole batches
        self._recover()
        self._fd: Optional[int] = None
        self._read_pos: Optional[Tuple[int, int, int]] = None  # (after seq, segment, offset): the reader's place

    @property
    def last_seq(self) -> int:
        return self.next_seq - 1

    @property
    def unsent(self) -> int:
        return max(0, self.last_seq - self.acked)

    # -- recovery ---------------------------------------------------------------
    def _recover(self) -> None:
        """Find the last whole batch of the newest segment; cut off what follows it."""
        while self._segments:
            first = self._segments[-1]
            path = self._path(first)
            data = path.read_bytes()
            end, count, last_cursor = 0, 0, None
            pos = 0
            while pos < len(data):
                nl = data.find(b"\n", pos)
                if nl < 0:
                    break  # torn last line
                line = data[pos:nl + 1]
                if line.startswith(_RECORD):
                    count += 1
                elif line.startswith(_CURSOR):
                    try:
                        last_cursor = json.loads(line[1:])
                    except ValueError:
                        break
                    end = nl + 1
                    self._active_records = count
                pos = nl + 1
            if last_cursor is None:
                # Not one whole batch: none of it was sent (sending follows the fsync).
                path.unlink()
                self._segments.pop()
                continue
            if end < len(data):
                os.truncate(path, end)
            self.cursor = last_cursor["cursor"]
            self.next_seq = last_cursor["next"]
            self.id = last_cursor.get("spool", "")
            self._committed = end
            return

    def _read_acked(self) -> int:
        try:
            return int((self.dir / "acked").read_text())
        except (OSError, ValueError):
            return 0

    # -- writing (the keeper's loop) ---------------------------------------------
    def append(self, recs: List[Dict[str, Any]], cursor: Dict[str, Any]) -> None:
        """Give each record the next seq, write the batch and its cursor, fsync. Raises OSError."""
        if not recs and cursor == self.cursor:
            return
        self._write(recs, cursor)

    def claim(self) -> None:
        """Put a fresh spool's id on disk (a batch of no records), for a reader that numbers records as this
        spool's next ones (keeper/leftover.py): the next keeper on the dir then goes on with the same id.
        Raises OSError."""
        if not self._segments:
            self._write([], self.cursor)

    def _write(self, recs: List[Dict[str, Any]], cursor: Dict[str, Any]) -> None:
        rotate = bool(recs) and self._active_records >= self.segment_records
        if self._fd is None or rotate:
            self._open_segment(new=rotate or not self._segments)
        seq = self.next_seq
        lines = []
        for rec in recs:
            lines.append(records.frame('{"seq":%d,%s' % (seq, records.dumps(rec)[1:])))
            seq += 1
        spool = ',"spool":"%s"' % self.id if self.id else ""
        lines.append(records.frame('{"cursor":%s,"next":%d%s}' % (records.dumps(cursor), seq, spool)))
        data = b"".join(lines)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fdatasync(self._fd)
        except OSError:
            os.ftruncate(self._fd, self._committed)  # leave no torn batch behind a later good one
            raise
        with self.cond:
            self.next_seq = seq
            self.cursor = cursor
            self._committed += len(data)
            self._active_records += len(recs)
            self.cond.notify_all()

    def _open_segment(self, new: bool) -> None:
        if self._fd is not None:
            os.close(self._fd)
        if new:
            with self.cond:
                self._segments.append(self.next_seq)
                self._committed = 0
                self._active_records = 0
        path = self._path(self._segments[-1])
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if new:
            # The new file's name must survive a crash too.
            dir_fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- reading and acknowledging (the shipper's thread) ----------------------------
    def read(self, after: int, limit: int, max_bytes: int) -> List[Tuple[int, bytes]]:
        """Up to `limit` records (or about max_bytes) with seq > after, as (seq, JSON bytes)."""
        with self.cond:
            segments = list(self._segments)
            committed = self._committed
            last = self.last_seq
        if after >= last or not segments:
            return []
        if self._read_pos and self._read_pos[0] == after and self._read_pos[1] in segments:
            index, offset = segments.index(self._read_pos[1]), self._read_pos[2]
        else:
            index, offset = max(0, bisect.bisect_right(segments, after + 1) - 1), 0
        out: List[Tuple[int, bytes]] = []
        size = 0
        while index < len(segments):
            end = committed if index == len(segments) - 1 else None
            with open(self._path(segments[index]), "rb") as f:
                f.seek(offset)
                for line in f:
                    if end is not None and offset + len(line) > end:
                        break  # a batch still being written
                    offset += len(line)
                    if not line.startswith(_RECORD):
                        continue
                    seq = int(line[8:line.index(b",", 8)])
                    if seq <= after:
                        continue
                    out.append((seq, line[1:-1]))
                    size += len(line)
                    if len(out) >= limit or size >= max_bytes:
                        self._read_pos = (seq, segments[index], offset)
                        return out
            if index == len(segments) - 1:
                break
            index, offset = index + 1, 0
        if out:
            self._read_pos = (out[-1][0], segments[index], offset)
        return out

    def ack(self, seq: int) -> None:
        """The manager holds every record up to seq: remember it, drop segments it covers."""
        with self.cond:
            if seq <= self.acked:
                return
            self.acked = seq
            try:
                tmp = self.dir / "acked.tmp"
                tmp.write_text(str(seq))
                os.replace(tmp, self.dir / "acked")
                # The newest segment holds the latest cursor and id; while it holds no whole batch (its first
                # write failed), the one before it does.
                keep = 1 if self._committed else 2
                while len(self._segments) > keep and self._segments[1] - 1 <= seq:
                    self._path(self._segments[0]).unlink(missing_ok=True)
                    self._segments.pop(0)
            except OSError:
                # A disk that takes no writes (full, read-only): the ack on disk may lag (see above), so a
                # later keeper sends a few records again and the manager stores them once.
                pass
            self.cond.notify_all()

    def _path(self, first: int) -> Path:
        return self.dir / f"{first:012d}{_SUFFIX}"


class Reserve:
    """Room kept on the trial's disk for the keeper's last word: a file of RESERVE_BYTES, allocated as the trial
    starts and removed when the trial ends on a disk that is still full, so that its final status (with the
    count of what was lost) can still be spooled, shipped and written to the status file. The file stays
    otherwise: a keeper started again on the dir allocates the same one."""

    def __init__(self, path: Path):
        self.path = path
        self.held = False
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError:
            return  # a disk full or read-only from the start: no room to keep
        self.held = True

    def release(self) -> bool:
        """Give the room back to the disk; False when there was none to give."""
        if not self.held:
            return False
        self.held = False
        try:
            os.unlink(self.path)
        except OSError:
            return False
        return True


def read_unacknowledged(spool: Spool) -> List[Dict[str, Any]]:
    """What an ended keeper spooled and never had acknowledged (no manager listened), for the caller to
    store (keeper/leftover.py). Read only: the store keeps each (trial, seq) once, so reading the same again
    later duplicates nothing, and a store that fails to take them loses nothing."""
    out: List[Dict[str, Any]] = []
    after = spool.acked
    while True:
        batch = spool.read(after, DRAIN_BATCH, 1 << 20)
        if not batch:
            return out
        out.extend(json.loads(line) for _, line in batch)
        after = batch[-1][0]
