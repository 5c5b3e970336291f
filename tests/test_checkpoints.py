"""The store's checkpoints off the manager's loop (trialkit/manager/checkpoints.py): the pages reach the
database file from the checkpoint thread, not from a commit; the log starts again while a writer keeps
committing; a checkpoint that fails is said once; the manager leaves no thread behind."""
from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import requests

from trialkit.manager import checkpoints
from trialkit.manager.checkpoints import Checkpointer
from trialkit.manager.disk import DiskWatch
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import WAL_BOUND_PAGES, Store


def metrics(first, count):
    return [{"seq": seq, "type": "PERIODICAL", "sequence": seq - 1, "value": 0.5, "time": 1.0}
            for seq in range(first, first + count)]


@pytest.fixture
def store(tmp_path):
    store = Store.in_dir(tmp_path / "exp")
    store.create_experiment("exp")
    store.add_trial("exp", "t1", sequence=1, parameters={}, token="token-1")
    yield store
    store.close()


def in_file_alone(store: Store, tmp_path: Path) -> int:
    """The records the database file holds by itself, without its WAL: what checkpoints copied there."""
    copy = tmp_path / "copy.db"
    shutil.copyfile(store.path, copy)
    with sqlite3.connect(copy) as db:
        try:
            return db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        except sqlite3.OperationalError:  # no records table yet: the schema itself is still in the WAL
            return 0


def wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def checkpoint_threads():
    return [t for t in threading.enumerate() if t.name == "trialkit-checkpoints"]


@pytest.fixture
def closing():
    """Checkpointers closed after the test, passed or not: no thread outlives it."""
    made = []
    yield lambda checkpointer: made.append(checkpointer) or checkpointer
    for checkpointer in made:
        checkpointer.close()
    assert not checkpoint_threads()


def test_the_records_reach_the_database_file_from_the_thread_not_from_a_commit(store, tmp_path, closing):
    checkpointer = closing(Checkpointer(store.path, store.writers_held, DiskWatch(tmp_path)))
    for n in range(10):
        store.add_batches([("t1", metrics(1 + 50 * n, 50), [])])
        assert in_file_alone(store, tmp_path) == 0  # a commit this short of WAL_BOUND_PAGES copies nothing
    assert store.count_records() == 500 and WAL_BOUND_PAGES > 1_000
    checkpointer.committed()
    wait_for(lambda: in_file_alone(store, tmp_path) == 500)


def test_the_log_starts_again_while_a_writer_keeps_committing(store, monkeypatch, closing, tmp_path):
    # A short log mark and little spacing: many passes, each racing the writer's next commits.
    monkeypatch.setattr(checkpoints, "CHECKPOINT_PAGES", 32)
    monkeypatch.setattr(checkpoints, "SPACING", 0.002)
    held = []
    checkpointer = closing(Checkpointer(store.path, lambda: held.append(1) or store.writers_held(), DiskWatch(tmp_path)))
    wal = Path(f"{store.path}-wal")
    seq, starts = 1, set()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        store.add_batches([("t1", metrics(seq, 50), [])])
        checkpointer.committed()
        seq += 50
        with wal.open("rb") as header:
            starts.add(header.read(16)[12:16])  # the WAL header's checkpoint sequence: one more at each new start
    assert held  # the log reached the mark while commits went on: its last pages copied with the writers held
    print(f"the log started {len(starts)} times in {seq // 50} commits; {len(held)} passes with the writers held")
    assert len(starts) >= 20
    assert store.count_records() == seq - 1 and store.acked_seq("t1") == seq - 1


def test_a_checkpoint_that_fails_is_said_once_and_the_thread_goes_on(tmp_path, capsys, closing):
    not_a_store = tmp_path / "trialkit.db"
    not_a_store.write_text("not a database " * 100)
    checkpointer = closing(Checkpointer(not_a_store, threading.RLock, DiskWatch(tmp_path)))
    said = ""
    for _ in range(3):
        checkpointer.committed()
        wait_for(lambda: not checkpointer._due.is_set())  # taken by the thread
        time.sleep(checkpoints.SPACING * 2)
        said += capsys.readouterr().err
    assert said.count("a checkpoint of the store failed (file is not a database)") == 1, said
    assert checkpoint_threads()  # still there for the next commit
    checkpointer.close()
    assert not checkpoint_threads()


def test_the_manager_stops_its_checkpoint_thread(store):
    server = ManagerServer(store).start()
    try:
        answer = requests.post(f"{server.url}/api/v1/trials/t1/records", json={"records": metrics(1, 3)},
                               headers={"Authorization": "Bearer token-1"}, timeout=30)
        assert answer.status_code == 200 and answer.json()["acked"] == 3
        wait_for(checkpoint_threads)
    finally:
        server.stop()
    assert not checkpoint_threads()


def test_a_checkpoint_the_disk_refuses_is_said_by_the_disk_watch_until_one_passes(store, tmp_path, monkeypatch,
                                                                                   closing):
    monkeypatch.setattr(checkpoints, "CHECKPOINT_PAGES", 0)  # every pass holds the writers: the fault comes there
    lines = []
    disk = DiskWatch(tmp_path, log=lines.append, probe_seconds=3600)
    full = [True]

    def writers_held():
        if full:
            err = sqlite3.OperationalError("database or disk is full")
            err.sqlite_errorcode = 13  # SQLITE_FULL
            raise err
        return store.writers_held()

    checkpointer = closing(Checkpointer(store.path, writers_held, disk))
    try:
        checkpointer.committed()
        wait_for(lambda: disk.problem is not None)
        assert disk.problem == f"cannot write the store's checkpoints in {tmp_path}: the disk is full"
        full.clear()
        checkpointer.committed()
        wait_for(lambda: disk.problem is None)
        assert len(lines) == 2 and lines[1] == f"the disk of {tmp_path} takes writes again; going on", lines
    finally:
        disk.close()
