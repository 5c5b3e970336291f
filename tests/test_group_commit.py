"""Group commit in the manager (trialkit/manager/commits.py): batches that arrive together share a
transaction, an ack never runs ahead of the commit that holds its records, and one failing batch fails
alone."""
from __future__ import annotations

import asyncio
import sqlite3

import pytest
import requests

from trialkit.manager.commits import GroupCommit
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store


def metric(seq):
    return {"seq": seq, "type": "PERIODICAL", "sequence": seq - 1, "value": 0.5, "time": 1.0}


@pytest.fixture
def manager(tmp_path):
    store = Store.in_dir(tmp_path / "exp")
    store.create_experiment("exp")
    for n in (1, 2):
        store.add_trial("exp", f"t{n}", sequence=n, parameters={}, token=f"token-{n}")
    server = ManagerServer(store).start()
    yield server
    server.stop()
    store.close()


def post(server, trial, seqs):
    return requests.post(f"{server.url}/api/v1/trials/{trial}/records", json={"records": [metric(s) for s in seqs]},
                         headers={"Authorization": f"Bearer token-{trial[1:]}"}, timeout=30)


def poison(store: Store, sql: str) -> None:
    """A trigger added from another connection (as another process could): the store's own code is untouched."""
    with sqlite3.connect(store.path) as db:
        db.executescript(sql)


def test_batches_that_arrive_together_share_one_commit(tmp_path):
    store = Store.in_dir(tmp_path)
    store.create_experiment("exp")
    for n in range(3):
        store.add_trial("exp", f"t{n}", sequence=n, parameters={}, token=None)
    groups = []
    add_batches = store.add_batches
    store.add_batches = lambda batches: groups.append(len(batches)) or add_batches(batches)  # counts, stores as is
    commits = GroupCommit(store)

    async def together():
        return await asyncio.gather(*(commits.add(f"t{n}", [metric(1), metric(2)], []) for n in range(3)))

    outcomes = asyncio.run(together())
    assert groups == [3]
    assert [o.acked for o in outcomes] == [2, 2, 2] and store.count_records() == 6
    store.close()


def test_a_batch_whose_commit_fails_is_never_acked(manager):
    # A deferred foreign key is checked at COMMIT: seq 3 makes the commit itself fail.
    poison(manager.store, "CREATE TABLE poison (trial TEXT REFERENCES trials(id) DEFERRABLE INITIALLY DEFERRED);"
                          "CREATE TRIGGER poisoned AFTER INSERT ON records WHEN NEW.seq = 3 "
                          "BEGIN INSERT INTO poison VALUES ('no such trial'); END;")
    answer = post(manager, "t1", [1, 2, 3])
    assert answer.status_code == 500 and "acked" not in answer.json()
    assert manager.store.count_records() == 0 and manager.store.acked_seq("t1") == 0
    poison(manager.store, "DROP TRIGGER poisoned;")
    answer = post(manager, "t1", [1, 2, 3])  # the keeper sends it again: the store took the failure cleanly
    assert answer.status_code == 200 and answer.json() == {"acked": 3, "inserted": 3}


def test_a_failing_batch_fails_alone_and_the_others_of_its_group_are_stored(tmp_path):
    store = Store.in_dir(tmp_path)
    store.create_experiment("exp")
    for n in range(3):
        store.add_trial("exp", f"t{n}", sequence=n, parameters={}, token=None)
    poison(store, "CREATE TRIGGER poisoned BEFORE INSERT ON records WHEN NEW.trial = 't1' "
                  "BEGIN SELECT RAISE(ABORT, 'poisoned'); END;")
    commits = GroupCommit(store)

    async def together():
        return await asyncio.gather(*(commits.add(f"t{n}", [metric(s) for s in range(1, 51)], []) for n in range(3)),
                                    return_exceptions=True)

    first, failed, last = asyncio.run(together())
    assert isinstance(failed, sqlite3.IntegrityError) and "poisoned" in str(failed)
    assert first.acked == last.acked == 50 and len(first.fresh) == len(last.fresh) == 50
    assert [store.count_records(f"t{n}") for n in range(3)] == [50, 0, 50] and store.acked_seq("t1") == 0
    store.close()

