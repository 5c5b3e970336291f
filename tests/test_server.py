"""The manager's receiving side over real HTTP on loopback, and the store under it."""
from __future__ import annotations

import http.client
import json
import math
import queue

import pytest
import requests

from trialkit import records
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store, new_token


@pytest.fixture
def manager(tmp_path):
    store = Store.in_dir(tmp_path / "exp")
    store.create_experiment("exp")
    store.add_trial("exp", "t1", sequence=0, parameters={"lr": 0.1}, token="token-1")
    store.add_trial("exp", "t2", sequence=1, parameters={}, token="token-2", parameter_id=11)
    server = ManagerServer(store, max_body=4096).start()
    yield server
    server.stop()
    store.close()


def post(server, trial, body, token="token-1"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(f"{server.url}/api/v1/trials/{trial}/records", data=data, headers=headers, timeout=10)


def metric(seq, value=0.5, sequence=None):
    return {"seq": seq, "type": "PERIODICAL", "sequence": seq - 1 if sequence is None else sequence,
            "value": value, "parameter_id": 0, "trial_job_id": "t1", "time": 1.0}


def test_records_are_stored_once_and_acked_up_to_the_highest_contiguous_seq(manager):
    answer = post(manager, "t1", {"records": [metric(1), metric(2), metric(4)]})
    assert answer.status_code == 200 and answer.json() == {"acked": 2, "inserted": 3}
    assert post(manager, "t1", {"records": [metric(1), metric(2)]}).json() == {"acked": 2, "inserted": 0}
    assert post(manager, "t1", {"records": [metric(3), metric(4)]}).json() == {"acked": 4, "inserted": 1}
    assert [r["seq"] for r in manager.store.records_for("t1")] == [1, 2, 3, 4]


def test_nan_and_infinity_are_accepted_and_kept(manager):
    body = b'{"records": [{"seq": 1, "type": "FINAL", "value": {"default": NaN, "hi": Infinity}}]}'
    assert post(manager, "t1", body).status_code == 200
    value = manager.store.records_for("t1")[0]["value"]
    assert math.isnan(value["default"]) and value["hi"] == math.inf


@pytest.mark.parametrize("token, status", [(None, 401), ("wrong", 401), ("token-2", 403)])
def test_tokens_are_checked_and_nothing_is_stored_when_refused(manager, token, status):
    answer = post(manager, "t1", {"records": [metric(1)]}, token=token)
    assert answer.status_code == status and answer.json()["error"]
    assert manager.store.count_records() == 0


def test_oversize_body_is_refused_unread(manager):
    answer = post(manager, "t1", {"records": [metric(i + 1, value="x" * 100) for i in range(50)]})
    assert answer.status_code == 413 and "over 4096 bytes" in answer.json()["error"]
    assert manager.store.count_records() == 0


@pytest.mark.parametrize("body, reason", [
    (b"{not json", "not JSON"),
    (b"[" * 3000, "not JSON"),
    (b'{"records": 5}', 'expected {"records": [...]}'),
    (b'[1, 2]', 'expected {"records": [...]}'),
    (json.dumps({"records": [metric(1), {"seq": "two", "type": "FINAL", "value": 1}]}).encode(), "seq 'two'"),
])
def test_malformed_bodies_get_400_with_a_reason_and_nothing_is_stored(manager, body, reason):
    answer = post(manager, "t1", body)
    assert answer.status_code == 400 and reason in answer.json()["error"]
    assert manager.store.count_records() == 0


def test_a_body_without_length_gets_411(manager):
    host, port = manager.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/api/v1/trials/t1/records", body=iter([b'{"records": []}']),
                 headers={"Authorization": "Bearer token-1"}, encode_chunked=True)
    assert conn.getresponse().status == 411
    conn.close()


def test_unknown_routes_and_methods(manager):
    assert requests.get(f"{manager.url}/api/v1/nothing", timeout=10).status_code == 404
    assert requests.get(f"{manager.url}/api/v1/trials/t1/records", timeout=10).status_code == 405


def test_parameters_route_answers_the_trials_own(manager):
    answer = requests.get(f"{manager.url}/api/v1/trials/t2/parameters", timeout=10,
                          headers={"Authorization": "Bearer token-2"})
    assert answer.json() == {"parameter_id": 11, "parameters": {}}
    answer = requests.get(f"{manager.url}/api/v1/trials/t1/parameters", timeout=10,
                          headers={"Authorization": "Bearer token-2"})
    assert answer.status_code == 403


def test_listeners_hear_each_new_record_once(manager):
    heard = queue.Queue()
    manager.add_listener(lambda trial, recs: heard.put((trial, [r["seq"] for r in recs])))
    post(manager, "t1", {"records": [metric(1), metric(2)]})
    post(manager, "t1", {"records": [metric(2), metric(3)]})
    assert heard.get(timeout=5) == ("t1", [1, 2])
    assert heard.get(timeout=5) == ("t1", [3])
    assert heard.empty()


def test_a_failing_listener_does_not_undo_the_ack(manager):
    manager.add_listener(lambda trial, recs: 1 / 0)
    assert post(manager, "t1", {"records": [metric(1)]}).json() == {"acked": 1, "inserted": 1}


def test_status_records_update_the_trial_and_its_history(manager):
    post(manager, "t1", {"records": [
        {"seq": 1, "type": "STATUS", "time": 10.0, "value": {"status": "RUNNING", "restart_count": 2}},
        metric(2),
        {"seq": 3, "type": "STATUS", "time": 20.0, "value": {"status": "PREEMPTED", "exit_code": 143}},
    ]})
    trial = manager.store.trial("t1")
    assert (trial["status"], trial["exit_code"], trial["restart_count"]) == ("PREEMPTED", 143, 2)
    assert (trial["started"], trial["ended"]) == (10.0, 20.0)
    assert [(h["status"], h["source"]) for h in manager.store.status_history("t1")] == [
        ("WAITING", "control"), ("RUNNING", "keeper"), ("PREEMPTED", "keeper")]


def test_the_control_plane_can_add_routes(manager):
    def hello(request):
        manager.authenticate(request, request.params["trial_id"])
        return 200, {"hello": request.params["trial_id"]}

    manager.router.add("GET", "/api/v1/trials/<trial_id>/hello", hello)
    answer = requests.get(f"{manager.url}/api/v1/trials/t%201/hello", timeout=10)
    assert answer.status_code == 401
    answer = requests.get(f"{manager.url}/api/v1/trials/t1/hello", headers={"Authorization": "Bearer token-1"},
                          timeout=10)
    assert answer.json() == {"hello": "t1"}


def test_store_api_for_the_control_plane(tmp_path):
    store = Store.in_dir(tmp_path)
    store.create_experiment("e", config={"trialConcurrency": 2})
    token = new_token()
    store.add_trial("e", "a", sequence=0, parameters={"x": 1}, token=token, trial_dir="/tmp/a")
    store.add_trial("e", "b", sequence=1, parameters={"x": 2}, token=None)
    assert store.experiment("e")["config"] == {"trialConcurrency": 2}
    assert store.trial_for_token(token) == "a" and store.trial_for_token("nope") is None
    store.set_status("b", "RUNNING")
    assert [t["id"] for t in store.trials("e", status="RUNNING")] == ["b"]
    assert "token_hash" not in store.trial("a") and store.trial("a")["parameters"] == {"x": 1}
    store.set_status("a", "SUCCEEDED", exit_code=0)
    assert store.trial("a")["exit_code"] == 0 and store.trial("a")["ended"]
    assert len(store.add_records("a", [metric(1), metric(2)])) == 2
    assert store.acked_seq("a") == 2 and store.count_records("a") == 2
    assert [r["seq"] for r in store.records_for("a", type="PERIODICAL", after_seq=1)] == [2]
    store.close()
    again = Store.in_dir(tmp_path)  # a restarted manager finds everything
    assert again.acked_seq("a") == 2 and again.trial("b")["status"] == "RUNNING"
    again.close()


def test_the_ack_moves_over_every_record_stored_ahead_of_a_gap(tmp_path):
    # Records after a gap wait unacknowledged; the one that fills it acks them all at once,
    # however many there are (the store looks at them a window at a time).
    store = Store.in_dir(tmp_path)
    store.create_experiment("e")
    store.add_trial("e", "a", sequence=0, parameters={}, token=None)
    ahead = 25_001
    for first in range(2, ahead + 1, 2_000):
        store.add_records("a", [metric(seq) for seq in range(first, min(first + 2_000, ahead + 1))])
    store.add_records("a", [metric(ahead + 2)])  # behind a second gap: stays out of the ack
    assert store.acked_seq("a") == 0
    assert [r["seq"] for r in store.add_records("a", [metric(1), metric(3)])] == [1]  # 3 was stored: once
    assert store.acked_seq("a") == ahead and store.count_records("a") == ahead + 1
    store.close()


def test_each_spool_of_a_trial_is_kept_apart_and_acknowledged_in_its_own_seqs(tmp_path):
    """A trial restarted where its spool is not numbers a fresh spool from 1: the store keeps each spool's seqs
    in a range of their own, above the trial's earlier ones, and answers in the spool's seqs."""
    span = records.SPOOL_SEQS
    store = Store.in_dir(tmp_path)
    store.create_experiment("e")
    store.add_trial("e", "a", sequence=0, parameters={}, token=None)
    assert len(store.add_batch("a", [metric(1), metric(2)], (), "first")[0]) == 2
    fresh, refused = store.add_batch("a", [metric(1, 10.0), metric(3, 30.0)], [(metric(2, 20.0), "refused")], "second")
    assert (len(fresh), refused) == (2, [{"seq": 2, "reason": "refused"}])  # in the spool's seqs
    assert store.add_batch("a", [metric(1, 10.0)], (), "second") == ([], [])  # sent again: stored once
    assert (store.acked_seq("a", "first"), store.acked_seq("a", "second"), store.acked_seq("a")) == (2, 3, 3)
    # The control plane's reader of what a dead keeper left: each record names its spool.
    left = [{**metric(4, 40.0), "spool": "second"}, {**metric(1, 50.0), "spool": "third"}]
    assert store.add_records("a", left) == left and store.add_records("a", left) == []
    assert (store.acked_seq("a", "second"), store.acked_seq("a", "third"), store.acked_seq("a")) == (4, 1, 1)
    assert [(r["seq"], r["value"]) for r in store.records_for("a") if r["type"] != "REJECTED"] == [
        (1, 0.5), (2, 0.5), (span + 1, 10.0), (span + 3, 30.0), (span + 4, 40.0), (2 * span + 1, 50.0)]
    store.close()


def test_an_older_store_gets_spools_and_its_trials_go_on_where_they_were(tmp_path):
    import sqlite3

    store = Store.in_dir(tmp_path)
    store.create_experiment("e")
    store.add_trial("e", "a", sequence=0, parameters={}, token=None)
    store.add_records("a", [metric(1), metric(2)])  # as a keeper from before spools had ids sent them
    store.close()
    with sqlite3.connect(tmp_path / "trialkit.db") as db:
        db.execute("DROP TABLE spools")  # the store as that version made it
    again = Store.in_dir(tmp_path)
    assert again.acked_seq("a") == 2
    assert again.add_batch("a", [metric(2), metric(3)], ())[0] == [metric(3)]  # that keeper goes on: once each
    assert len(again.add_batch("a", [metric(1)], (), "new")[0]) == 1  # a new keeper's spool: above them
    assert [r["seq"] for r in again.records_for("a")] == [1, 2, 3, records.SPOOL_SEQS + 1]
    assert (again.acked_seq("a", ""), again.acked_seq("a")) == (3, 1)
    again.close()
