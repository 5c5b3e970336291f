"""Follows the files a trial writes its records to, and prepares what NNI's SDK reads.

Two files are followed, both appended to by the trial: trialkit's channel
(RFC 7464 frames) and NNI local mode's `$NNI_SYS_DIR/.nni/metrics` (`ME%06d`
frames). The keeper's loop learns of new bytes from inotify (watch.py) and, on
its next turn, reads what was appended, decodes it and hands the records with
the files' read positions (the cursor) to the sink, which spools both in one
write. What a burst appends while a batch is being spooled (its fdatasync)
comes as the next batch, so a burst still makes few batches, and a lone record
waits for none: a read 20 ms after the first change made each record reach the
manager ~29 ms after its report (median), and an assessor's stop came an epoch
late for one trial in five of a short-epoch ASHA search. A keeper restarted on
the same trial dir starts from the spooled cursor.
"""
from __future__ import annotations

import os
from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: 2 of the 5.6 ms the reporting side imports beside the trial's start
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple, Type, Union

from trialkit import records
from trialkit.keeper.watch import DirWatch
from trialkit.process import EventLoop

READ_CHUNK = 1 << 20  # bytes read (and spooled as one batch) at a time: bounds memory
RETRY_SECONDS = 1.0  # after the spool could not be written

if TYPE_CHECKING:
    Decoder = Union[records.SeqDecoder, records.NniFrameDecoder]
    Sink = Callable[[List[Dict[str, Any]], Dict[str, Any]], None]
    OnBad = Callable[[str, str], None]  # (where, reason)


class FileSource:
    """One followed file: the frames appended since the last read."""

    def __init__(self, name: str, path: Path, decoder: Type[Decoder], cursor: Optional[List[int]], on_bad: OnBad,
                 warn: Callable[[str], None]):
        self.name = name
        self.path = path
        self._decoder_class = decoder
        self._on_bad = on_bad
        self._warn = warn
        self._unreadable = False
        inode, offset = cursor if cursor else (None, 0)
        self.inode: Optional[int] = inode
        self._seek(offset)

    def _seek(self, offset: int) -> None:
        self.decoder = self._decoder_class(lambda at, why: self._on_bad(f"{self.path} at byte {at}", why), offset)
        self.read_pos = offset

    @property
    def cursor(self) -> List[int]:
        return [self.inode, self.decoder.offset]

    def rewind(self, cursor: List[int]) -> None:
        """Forget what was read after `cursor` (it could not be spooled): read it again later."""
        self.inode = cursor[0]
        self._seek(cursor[1])

    def read(self, end: Optional[int] = None) -> Tuple[Optional[List[Tuple[bytes, int]]], bool]:
        """Frames from at most READ_CHUNK new bytes, none past byte `end` when given (None when nothing was new),
        and whether more may wait."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if self.inode != st.st_ino or st.st_size < self.read_pos:
                    if self.inode is not None:
                        self._warn(f"{self.path} was replaced or truncated; reading it from the start")
                    self.inode = st.st_ino
                    self._seek(0)
                want = min(READ_CHUNK, (st.st_size if end is None else min(end, st.st_size)) - self.read_pos)
                if want <= 0:
                    return None, False
                f.seek(self.read_pos)
                data = f.read(want)
        except FileNotFoundError:
            return None, False  # not written yet
        except OSError as err:
            if not self._unreadable:
                self._warn(f"cannot read {self.path} ({err.strerror}); trying again at its next change")
            self._unreadable = True
            return None, False
        self._unreadable = False
        self.read_pos += len(data)
        return self.decoder.feed(data), len(data) == READ_CHUNK and (end is None or self.read_pos < end)

    def finish(self) -> None:
        self.decoder.finish()


class Collector:
    def __init__(self, loop: EventLoop, sources: List[FileSource], sink: Sink, on_bad: OnBad,
                 warn: Callable[[str], None], run: Optional[int] = None):
        self.loop = loop
        self.run = run  # for records that carry no run number (NNI's)
        self.sources = sources
        self.sink = sink
        self.on_bad = on_bad
        self.warn = warn
        self._scheduled = False
        self._closed = False
        self._spool_failing = False
        self.watch = DirWatch(loop, sorted({s.path.parent for s in sources}), self._schedule)

    def _schedule(self, delay: float = 0.0) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_later(delay, self.collect)

    def cursor(self) -> Dict[str, Any]:
        return {s.name: s.cursor for s in self.sources}

    def collect(self, drain: bool = False, ends: Optional[Dict[str, int]] = None) -> None:
        """Spool what was appended: a chunk per file, then back to the loop unless `drain`; with `ends` (source
        name -> byte), only what lies before those bytes.

        A trial writing faster than we read must not keep the loop from its
        signals and pipes: after one chunk the rest waits for the next turn.
        """
        self._scheduled = False
        if self._closed:
            return
        for source in self.sources:
            while True:
                before = source.cursor
                frames, more = source.read(ends.get(source.name) if ends is not None else None)
                if frames is None:
                    break
                recs = [rec for rec in (self._decode(source, payload, end) for payload, end in frames) if rec]
                try:
                    self.sink(recs, self.cursor())
                except OSError as err:
                    if not self._spool_failing:
                        self.warn(f"cannot write the spool ({err.strerror}); trying again every {RETRY_SECONDS:g}s")
                    self._spool_failing = True
                    source.rewind(before)
                    self._schedule(RETRY_SECONDS)
                    return
                self._spool_failing = False
                if more and not drain:
                    self._schedule(0.0)
                if not (more and drain):
                    break

    def _decode(self, source: FileSource, payload: bytes, end: int) -> Optional[Dict[str, Any]]:
        try:
            return records.normalize(records.loads(payload), source.name, self.run)
        except records.BadRecord as err:
            self.on_bad(f"{source.path} before byte {end}", str(err))
            return None

    @property
    def spool_failing(self) -> bool:
        """Whether the last collect could not spool what it read (it is read again next time)."""
        return self._spool_failing

    def stop_watching(self) -> None:
        """Nothing appends to the files any more; finish() still reads what is left."""
        self.watch.stop()

    def finish(self) -> None:
        """The trial is over: read what is left; a partial frame at the end is a torn one."""
        self.watch.close()
        self.collect(drain=True)
        before = self.cursor()
        for source in self.sources:
            source.finish()
        # Only a torn last frame moves the cursor here; otherwise what was
        # read is spooled already, and another fsync would only slow the exit.
        if self.cursor() != before:
            try:
                self.sink([], self.cursor())
            except OSError as err:
                self.warn(f"cannot write the spool ({err.strerror})")
        self._closed = True
