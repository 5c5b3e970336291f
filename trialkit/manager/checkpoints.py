"""The store's checkpoints, made by a thread of their own beside the manager's loop.

In WAL mode SQLite copies the log's pages back into the database file at a
checkpoint, and left to itself the commit that takes the log past its mark
makes it: it copies the pages and syncs the file before it returns. The
manager commits on the server's loop, so every keeper waited for that
commit: 40-99 ms every 1.3 s or so under 1,000 keepers (15-35 ms of it CPU,
the rest the sync), and acknowledgements queued behind it.

Here a thread with its own connection runs a PASSIVE checkpoint after
commits, at most one every SPACING seconds. WAL lets a checkpoint copy pages
while the writer commits, and SQLite's calls let the GIL go, so the loop
goes on meanwhile. The log starts again from its beginning only after a
checkpoint that no commit followed, which a busy writer seldom leaves: once
the log is CHECKPOINT_PAGES long, what was committed during the pass is
copied with the store's writers held (a few hundred pages). The writer's own
automatic checkpoint stays, further out (store.WAL_BOUND_PAGES), as the
bound on the log's length should this thread fall behind or fail.
"""
from __future__ import annotations

import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional

from trialkit.manager.disk import CHECKPOINTS, STORE, DiskWatch
from trialkit.manager.store import CHECKPOINT_PAGES

SPACING = 0.25  # seconds between checkpoints at most: a page rewritten meanwhile is copied once


class Checkpointer:
    def __init__(self, path: Path, writers_held: Callable[[], ContextManager[Any]], disk: DiskWatch):
        """`path`: the store's file; `writers_held()`: a context in which no write transaction of the store
        starts (Store.writers_held); `disk`: told when a checkpoint fails for the disk, and when one passes."""
        self._path = path
        self._writers_held = writers_held
        self._disk = disk
        self._due = threading.Event()
        self._closed = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._failed = ""  # the last failure that was no disk's, said once

    def committed(self) -> None:
        """From the writer, after a commit: a checkpoint is due. The thread starts with the first."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trialkit-checkpoints", daemon=True)
            self._thread.start()
        if not self._due.is_set():
            self._due.set()

    def close(self) -> None:
        """End the thread, once the checkpoint it may be making is done."""
        self._closed.set()
        self._due.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        db: Optional[sqlite3.Connection] = None
        try:
            while not self._closed.is_set():
                self._due.wait()
                self._due.clear()
                if self._closed.is_set():
                    return
                try:
                    db = db or sqlite3.connect(str(self._path), check_same_thread=False, isolation_level=None)
                    self._checkpoint(db)
                except sqlite3.Error as err:  # the log keeps every page meanwhile
                    if not self._disk.failed(err, CHECKPOINTS) and str(err) != self._failed:
                        print(f"trialkit-manager: a checkpoint of the store failed ({err}); its log keeps every "
                              "record", file=sys.stderr, flush=True)
                    self._failed = str(err)
                else:
                    self._failed = ""
                    self._disk.passed()
                    self._disk.check_room(STORE)  # full, though this pass and the commits found room
                self._closed.wait(SPACING)
        finally:
            if db is not None:
                db.close()

    def _checkpoint(self, db: sqlite3.Connection) -> None:
        _, log, _ = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if log >= CHECKPOINT_PAGES:
            with self._writers_held():
                db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
