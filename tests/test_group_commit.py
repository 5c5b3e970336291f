"""Group commit in the manager (trialkit/manager/commits.py): batches that arrive together share a
transaction, an ack never runs ahead of the commit that holds its records, one failing batch fails
alone, and a batch sent again after its answer was lost is stored once."""
from __future__ import annotations

import asyncio
import http.client
import json
import socket
import sqlite3
import threading
import time

import pytest
import requests

from trialkit import records
from trialkit.keeper.shipper import Shipper
from trialkit.keeper.spool import Spool
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


async def stored(commits: GroupCommit, trial_id: str, batch: list):
    """commits.submit's outcome, awaited: Stored, or what storing the batch raised, raised here."""
    outcome = asyncio.get_running_loop().create_future()
    commits.submit(trial_id, "", batch, [], outcome.set_result)
    result = await outcome
    if isinstance(result, Exception):
        raise result
    return result


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
        return await asyncio.gather(*(stored(commits, f"t{n}", [metric(1), metric(2)]) for n in range(3)))

    outcomes = asyncio.run(together())
    assert groups == [3]
    assert [o.acked for o in outcomes] == [2, 2, 2] and store.count_records() == 6
    store.close()


def test_an_answer_that_fails_keeps_none_of_its_groups_others_waiting(tmp_path, capfd):
    store = Store.in_dir(tmp_path)
    store.create_experiment("exp")
    for n in range(3):
        store.add_trial("exp", f"t{n}", sequence=n, parameters={}, token=None)
    commits = GroupCommit(store)
    answered = []

    def broken(outcome):
        raise RuntimeError("a bug in one answer")

    async def together():
        commits.submit("t0", "", [metric(1)], [], broken)
        for n in (1, 2):
            commits.submit(f"t{n}", "", [metric(1)], [], answered.append)
        await asyncio.sleep(0.1)

    asyncio.run(together())
    assert [outcome.acked for outcome in answered] == [1, 1] and store.count_records() == 3
    assert "answering a batch failed: RuntimeError('a bug in one answer')" in capfd.readouterr().err
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
        return await asyncio.gather(*(stored(commits, f"t{n}", [metric(s) for s in range(1, 51)]) for n in range(3)),
                                    return_exceptions=True)

    first, failed, last = asyncio.run(together())
    assert isinstance(failed, sqlite3.IntegrityError) and "poisoned" in str(failed)
    assert first.acked == last.acked == 50 and len(first.fresh) == len(last.fresh) == 50
    assert [store.count_records(f"t{n}") for n in range(3)] == [50, 0, 50] and store.acked_seq("t1") == 0
    store.close()



class AnswerLosingProxy:
    """Between a keeper and the manager: forwards each request, and loses the manager's first answer
    (the batch is stored, the keeper never hears so): the keeper must send it again."""

    def __init__(self, target: str):
        self.target = target.split("//")[1]
        self.requests: list = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            with client, client.makefile("rb") as incoming:
                while True:
                    head = []
                    while (line := incoming.readline()) not in (b"\r\n", b""):
                        head.append(line)
                    if not head:
                        break
                    headers = dict(line.decode().rstrip("\r\n").split(": ", 1) for line in head[1:])
                    body = incoming.read(int(headers.get("Content-Length", 0)))
                    self.requests.append(json.loads(body))
                    upstream = http.client.HTTPConnection(self.target, timeout=30)
                    upstream.request(head[0].split()[0].decode(), head[0].split()[1].decode(), body=body,
                                     headers={k: v for k, v in headers.items() if k.lower() != "host"})
                    answer = upstream.getresponse()
                    data = answer.read()
                    upstream.close()
                    if len(self.requests) == 1:
                        break  # stored by the manager; the answer is lost with the connection
                    client.sendall(b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                   % (answer.status, len(data), data))

    def close(self) -> None:
        self.listener.close()
        self.thread.join(10)


def test_a_batch_sent_again_after_a_lost_answer_is_stored_once(manager, tmp_path):
    proxy = AnswerLosingProxy(manager.url)
    spool = Spool(tmp_path / "spool")
    recs = [records.normalize({"type": "PERIODICAL", "sequence": n, "value": n / 2, "time": 1.0}, "channel")
            for n in range(3)]
    spool.append(recs, {"offset": 3})
    shipper = Shipper(spool, proxy.url, "t1", "token-1", log=lambda message: None).start()
    try:
        assert shipper.close(time.monotonic() + 30) == 0  # everything acknowledged in the end
    finally:
        spool.close()
        proxy.close()
    first, again = ([rec["seq"] for rec in request["records"]] for request in proxy.requests[:2])
    assert first == again == [1, 2, 3]  # the same batch reached the manager twice
    assert [rec["sequence"] for rec in manager.store.records_for("t1")] == [0, 1, 2]  # and was stored once
    assert manager.store.acked_seq("t1") == 3
