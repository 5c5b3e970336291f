"""The experiments the page shows: their stores, opened read-only.

The page never writes: it reads each store through a connection of its own
(`mode=ro`), so it cannot disturb the manager's writes, and WAL lets it read
while the manager commits. `version()` changes when anything was committed
(SQLite's data_version), which is what the page's live updates follow.
"""
from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

from trialkit.manager.server import HttpError
from trialkit.web import queries


class Database:
    """One store file, one read-only connection shared by the server's threads under a lock."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=ro", uri=True, check_same_thread=False,
                                   isolation_level=None)
        self._db.row_factory = sqlite3.Row
        queries.register(self._db)

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        # One transaction: the queries of one answer see one state of the store.
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                self._db.execute("COMMIT")

    def version(self) -> int:
        with self._lock:
            try:
                return self._db.execute("PRAGMA data_version").fetchone()[0]
            except sqlite3.DatabaseError:  # no store (its routes say why): nothing that changes
                return -1

    def experiment_ids(self) -> List[str]:
        with self.reading() as db:
            return [row[0] for row in db.execute("SELECT id FROM experiments ORDER BY created")]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class Catalog:
    """Experiment id -> its Database, over the store files `discover()` names (looked at again when asked)."""

    def __init__(self, discover: Callable[[], Sequence[Path]]):
        self._discover = discover
        self._lock = threading.Lock()
        self._dbs: Dict[Path, Database] = {}
        self._owner: Dict[str, Database] = {}

    def refresh(self) -> None:
        """Open stores that appeared and learn the experiments they hold."""
        with self._lock:
            for path in self._discover():
                path = Path(path)
                if path not in self._dbs and path.exists():
                    self._dbs[path] = Database(path)
            for db in self._dbs.values():
                try:
                    ids = db.experiment_ids()
                except sqlite3.DatabaseError:  # listed by its dir's name, as `experiment list` does; its routes say why
                    ids = [db.path.parent.name]
                for experiment_id in ids:
                    self._owner.setdefault(experiment_id, db)

    def experiment_ids(self) -> List[str]:
        self.refresh()
        return list(self._owner)

    def database(self, experiment_id: str) -> Database:
        """The store holding the experiment; HttpError 404 when none does."""
        if experiment_id not in self._owner:
            self.refresh()
        db = self._owner.get(experiment_id)
        if db is None:
            raise HttpError(404, f"no experiment {experiment_id!r}")
        return db

    def version(self) -> Tuple[int, ...]:
        """Changes when anything was committed to any of the stores (or a store appeared)."""
        with self._lock:
            dbs = list(self._dbs.values())
        return tuple(db.version() for db in dbs)

    def close(self) -> None:
        with self._lock:
            for db in self._dbs.values():
                db.close()
            self._dbs.clear()
            self._owner.clear()

