"""The manager's quick way for the keepers' batches (trialkit/manager/transport.py, _Connection).

A keeper's batch that comes whole in the plain form is answered by the
transport itself (its answers say `Server: trialkit`); every other request,
and every request after it on the same connection, goes to aiohttp (whose
answers name aiohttp) with no byte lost or served twice. Raw sockets on
loopback against the real server, so that the bytes on the wire are what
is checked.
"""
from __future__ import annotations

import json
import logging
import socket
import time
from typing import List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import wait_until

from test_manager_guard import server, store  # noqa: F401 - fixtures: trial t1 (token-1) and its manager
from trialkit.manager import server as server_module
from trialkit.manager.server import ManagerServer

QUICK = b"Server: trialkit\r\n"


def batch(first: int, count: int = 2) -> bytes:
    return json.dumps({"records": [{"seq": s, "type": "PERIODICAL", "sequence": s - 1, "value": s / 10, "time": 1.0}
                                   for s in range(first, first + count)]}).encode()


def post(body: bytes, *, token: str = "token-1", extra: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    return (b"POST /api/v1/trials/t1/records " + version + b"\r\nHost: x\r\nAuthorization: Bearer " + token.encode()
            + b"\r\nContent-Type: application/json\r\n" + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body)


GET_PARAMETERS = b"GET /api/v1/trials/t1/parameters HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer token-1\r\n\r\n"


def connect(server: ManagerServer) -> socket.socket:
    host, port = server.url.rsplit("/", 1)[1].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def answers(sock: socket.socket, count: int) -> List[Tuple[int, bytes, object]]:
    """`count` answers read off the socket: (status, head, body) each, by their Content-Length; a JSON body read."""
    data, out = b"", []
    while len(out) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            head = data[:end + 4]
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            if len(data) >= end + 4 + length:
                body, data = data[end + 4:end + 4 + length], data[end + 4 + length:]
                out.append((int(head.split(b" ")[1]), head,
                            json.loads(body) if b"application/json" in head else body))
                continue
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {len(out)} of {count} answers"
        data += chunk
    assert data == b"", f"bytes past the answers: {data!r}"
    return out


def test_a_keepers_batches_are_answered_by_the_quick_way_and_stored_once(server, store):
    with connect(server) as sock:
        sock.sendall(post(batch(1)))
        [(status, head, body)] = answers(sock, 1)
        assert status == 200 and QUICK in head and body == {"acked": 2, "inserted": 2}
        assert b"Content-Type: application/json\r\n" in head and b"\r\nDate: " in head
        sock.sendall(post(batch(1)) + post(batch(3)))  # the first again (its answer lost), and the next, pipelined
        assert [(s, b) for s, _, b in answers(sock, 2)] == [(200, {"acked": 2, "inserted": 0}),
                                                           (200, {"acked": 4, "inserted": 2})]
    assert [r["seq"] for r in store.records_for("t1")] == [1, 2, 3, 4]


def test_a_connection_goes_to_aiohttp_at_its_first_other_request_and_stays_there(server, store):
    with connect(server) as sock:
        # A batch, then a parameters request and a batch in one send: the batch is served quick, the rest
        # in order by aiohttp, from the first byte the quick way did not serve.
        sock.sendall(post(batch(1)))
        [first] = answers(sock, 1)
        sock.sendall(GET_PARAMETERS + post(batch(3)))
        second, third = answers(sock, 2)
    assert first[0] == 200 and QUICK in first[1]
    assert second[0] == 200 and second[2]["parameters"] == {"lr": 0.1} and QUICK not in second[1]
    assert third[0] == 200 and third[2] == {"acked": 4, "inserted": 2} and QUICK not in third[1]
    assert store.count_records("t1") == 4


@pytest.mark.parametrize("request_bytes, status", [
    (post(batch(1), token="token-2"), 401),  # not the trial's token: aiohttp's refusal, body unread
    (post(batch(1), extra=b"Content-Length: 7\r\n"), 400),  # two lengths: aiohttp's parser refuses them
    (post(batch(1), extra=b"Transfer-Encoding: chunked\r\n"), 400),  # and a length beside chunks
    (post(batch(1), version=b"HTTP/1.0"), 200),
    (post(batch(1), extra=b"Connection: close\r\n"), 200),
    (post(b'{"records": 5}'), 400),  # quick, and refused as the route refuses it
])
def test_a_request_past_the_plain_form_gets_aiohttps_answer(server, store, request_bytes, status):
    with connect(server) as sock:
        sock.sendall(request_bytes)
        [(got, head, body)] = answers(sock, 1)
    assert got == status, body
    assert (QUICK in head) == (request_bytes.endswith(b'{"records": 5}')), head
    assert store.count_records("t1") == (2 if status == 200 else 0)


def test_a_body_in_several_reads_is_served_quick(server, store):
    data = post(batch(1, 50))
    with connect(server) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start in range(0, len(data), 1000):  # the head's end falls in one read, the body's in later ones
            sock.sendall(data[start:start + 1000])
            time.sleep(0.02)
        [(status, head, body)] = answers(sock, 1)
    assert status == 200 and QUICK in head and body == {"acked": 50, "inserted": 50}


def test_an_idle_quick_connection_is_closed_and_a_busy_one_is_not(monkeypatch, store):
    monkeypatch.setattr(server_module, "SOCKET_TIMEOUT", 1.0)
    server = ManagerServer(store).start()
    try:
        with connect(server) as idle, connect(server) as busy:
            idle.sendall(post(batch(1)))
            answers(idle, 1)
            started = time.monotonic()
            for first in range(3, 23, 2):  # a batch every 0.25 s keeps the other open past the idle time
                busy.sendall(post(batch(first)))
                assert answers(busy, 1)[0][0] == 200
                time.sleep(0.25)
            assert idle.recv(100) == b"" and time.monotonic() - started < 5
            assert server.connections == 1
    finally:
        server.stop()


def test_thousands_of_pipelined_requests_answered_at_once_are_served_in_order(server, store):
    # Each of these is answered at once (a body that is no batch: 400), inside the read that brought it.
    bad = post(b'{"records": 5}')
    with connect(server) as sock:
        sock.sendall(bad * 3000 + post(batch(1)))
        got = answers(sock, 3001)
    assert [status for status, _, _ in got] == [400] * 3000 + [200]
    assert got[-1][2] == {"acked": 2, "inserted": 2} and store.count_records("t1") == 2


def test_a_head_past_a_keepers_size_goes_to_aiohttp(server, store):
    padding = b"".join(b"X-Pad-%d: %s\r\n" % (n, b"p" * 1000) for n in range(20))  # 20 KB of head
    data = post(batch(1), extra=padding)
    with connect(server) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start in range(0, len(data), 2000):
            sock.sendall(data[start:start + 2000])
            time.sleep(0.005)
        [(status, head, body)] = answers(sock, 1)
    assert status == 200 and QUICK not in head and body == {"acked": 2, "inserted": 2}


def test_a_client_that_sends_far_ahead_of_its_answers_waits_in_tcp(server, store):
    # 20 MB of pipelined batches, no answer read: the manager reads about a megabyte ahead of the request it
    # answers, so the sending blocks (read whole, they would sit in the manager's memory).
    data = b"".join(post(batch(first, 1)) for first in range(1, 80_001))
    with connect(server) as sock:
        sock.settimeout(3)
        with pytest.raises(socket.timeout):
            sock.sendall(data)
    wait_until(lambda: server.connections == 0, 30, "the connection to close")
    assert 0 < store.count_records("t1") < 80_000


# Byte-level damage to a keeper's request: what a broken client, a proxy or an attacker may send.
MUTATIONS = st.lists(st.tuples(st.sampled_from(["replace", "insert", "delete", "duplicate line", "length", "path"]),
                               st.integers(min_value=0, max_value=400), st.integers(min_value=0, max_value=40),
                               st.one_of(st.binary(max_size=12), st.sampled_from(
                                   [b"\r", b"\n", b"\r\n", b":", b"\0", b" ", b"\t", b"\xf9", b"\xff\xfe", b"%2F",
                                    b"%ff", b"?x=1", b"Transfer-Encoding: chunked\r\n", b"Content-Length: 9\r\n"]))),
                     max_size=4)


def damaged(data: bytes, mutations) -> bytes:
    for kind, at, size, junk in mutations:
        at %= len(data) + 1
        if kind == "replace":
            data = data[:at] + junk + data[at + size:]
        elif kind == "insert":
            data = data[:at] + junk + data[at:]
        elif kind == "path":  # into the request's target, after "POST /"
            data = data[:6] + junk + data[6:]
        elif kind == "delete":
            data = data[:at] + data[at + size:]
        elif kind == "duplicate line":
            start = data.rfind(b"\r\n", 0, at) + 2
            end = data.find(b"\r\n", at)
            data = data[:start] + data[start:end + 2] * 2 + data[end + 2:] if end > 0 else data
        else:
            data = data.replace(b"Content-Length: ", b"Content-Length: %d" % size, 1)
    return data


def plain(line: bytes = b"POST /api/v1/trials/t1/records HTTP/1.1", *fields: bytes, body: bytes = batch(1_000_000),
          length: bytes = b"") -> bytes:
    return (line + b"\r\n" + b"".join(field + b"\r\n" for field in fields) + b"Authorization: Bearer token-1\r\n"
            + b"Content-Length: " + (length or b"%d" % len(body)) + b"\r\n\r\n" + body)


# Each in a place the quick way reads itself: answered or closed, never a failure inside the manager.
KNOWN_DAMAGE = [
    plain(b"POST /api/v1/trials/t\xf9/records HTTP/1.1"), plain(b"POST /api/v1/trials/%ff/records HTTP/1.1"),
    plain(b"POST /api/v1/trials/t1%2Fx/records HTTP/1.1"), plain(b"post /api/v1/trials/t1/records HTTP/1.1"),
    plain(b"POST http://x/api/v1/trials/t1/records HTTP/1.1"), plain(b"POST * HTTP/1.1"),
    plain(b"PO\xffST /api/v1/trials/t1/records HTTP/1.1"), plain(b"POST /api/v1/trials/t1/records HTTP/1.1 x"), plain(b"POST /api/v1/trials/t1/records HTTP/2"),
    plain(b"POST /api/v1/trials/t1/records HTTP/1.1", b"X-\xf9: 1"), plain(b"POST /api/v1/trials/t1/records HTTP/1.1", b"X: \xf9\xff"),
    plain(b"POST /api/v1/trials/t1/records HTTP/1.1", b"X : 1"), plain(b"POST /api/v1/trials/t1/records HTTP/1.1", b": 1"),
    plain(b"POST /api/v1/trials/t1/records HTTP/1.1", b" folded"), plain(b"POST /api/v1/trials/t1/records HTTP/1.1", b"X: a\x00b"),
    plain(b"POST /api/v1/trials/t1/records HTTP/1.1", b"X: a\rb"), plain(length=b"-5"), plain(length=b"+5"),
    plain(length=b"5 5"), plain(length=b"\xd9\xa5"), plain(length=b"99999999999999999999999"), plain(length=b"0"),
    plain(b"POST /api/v1/trials/t1/records HTTP/1.1", b"Authorization: Bearer token-1"),
    plain(b"POST /api/v1/trials/t1/records HTTP/1.1", b"Connection: \xf9"),
    plain(body=b"\xff\xfe"), plain(body=b'{"records": [{"seq": 1, "type": "PERIODICAL", "value": NaN}]}'),
    plain().replace(b"\r\n", b"\n"),
]


def test_damaged_heads_and_reads_never_break_the_manager(store, capfd, caplog):
    server = ManagerServer(store, header_seconds=0.5, body_seconds=0.5).start()
    statuses: dict = {}
    sent = [0]

    def send(data: bytes, cuts) -> None:
        got = b""
        with connect(server) as sock:
            sock.settimeout(5)
            try:
                start = 0
                for cut in cuts:  # the request in several reads
                    sock.sendall(data[start:start + cut])
                    start += cut
                sock.sendall(data[start:])
                sock.shutdown(socket.SHUT_WR)
                while chunk := sock.recv(65536):
                    got += chunk
            except OSError:
                pass  # a request refused unread: its connection is closed (or reset) under the rest
        if got.startswith(b"HTTP/1.1 "):  # one request a connection: one answer at most (its body may quote the line)
            status = int(got[9:12])
            statuses[status] = statuses.get(status, 0) + 1
            assert status != 500, got
        with connect(server) as sock:  # a keeper's next batch is served as ever, the quick way
            sent[0] += 2
            sock.sendall(post(batch(sent[0] - 1)))
            [(status, head, body)] = answers(sock, 1)
            assert status == 200 and QUICK in head and body["acked"] == sent[0], body

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(MUTATIONS, st.lists(st.integers(min_value=1, max_value=300), max_size=4))
    def check(mutations, cuts):
        send(damaged(post(batch(1_000_000)), mutations), cuts)

    try:
        for data in KNOWN_DAMAGE:
            send(data, [])
        check()
    finally:
        server.stop()
    err = capfd.readouterr().err
    with capfd.disabled():
        print(f"\ndamaged requests: {sent[0] // 2} sent ({len(KNOWN_DAMAGE)} of them known kinds), answers by status {statuses} (the rest closed unanswered: "
              "a head that never ended, a body cut short)")
    assert "Traceback" not in err, err
    # asyncio says a protocol's failure through logging (pytest's handler holds it, not stderr)
    assert not [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert statuses.get(200, 0) + statuses.get(400, 0) > 0, statuses


# In a fresh interpreter: a control plane's manager (keepers' routes) or `trialkit ui`'s (none, argv[2] "ui"), started;
# whether aiohttp is loaded after each step.
AIOHTTP_LATER = r"""
import json, socket, sys
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
import test_manager_quick as q

if sys.argv[2] == "ui":
    ui = ManagerServer(None).start()
    print(json.dumps({"started": "aiohttp" in sys.modules}))
    ui.stop()
    sys.exit(0)
store = Store.in_dir(sys.argv[1])
store.create_experiment("exp")
store.add_trial("exp", "t1", sequence=0, parameters={"lr": 0.1}, token="token-1")
steps = {}
server = ManagerServer(store)
from trialkit.manager import metrics
metrics.install(server, store, ["scrape-token"])  # as a control plane's manager has /metrics
server.start()
steps["started"] = "aiohttp" in sys.modules
steps["prometheus_client"] = "prometheus_client" in sys.modules  # loaded at the first scrape
with q.connect(server) as sock:
    sock.sendall(q.post(q.batch(1)))
    [(status, head, _)] = q.answers(sock, 1)
    assert status == 200 and q.QUICK in head, head
    steps["batch"] = "aiohttp" in sys.modules
    sock.sendall(q.GET_PARAMETERS)
    [(status, head, body)] = q.answers(sock, 1)
    assert status == 200 and body["parameters"] == {"lr": 0.1} and q.QUICK not in head, (status, head, body)
    steps["parameters"] = "aiohttp" in sys.modules
server.stop()
print(json.dumps(steps))
"""


def test_aiohttp_loads_off_a_control_planes_start_and_at_once_for_trialkit_ui(tmp_path):
    """A control plane's manager serves the keepers' batches by the quick way before aiohttp is loaded (~0.1 s of
    its start, which its first trials no longer wait for; prometheus_client, ~20 ms more, waits for a scrape); the
    first request that needs aiohttp loads it and is served. `trialkit ui`'s manager, which serves the page alone, has it loaded once started."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    env = {"PYTHONPATH": f"{tests.parent}:{tests}", "PATH": "/usr/bin:/bin"}
    said = {}
    for which in ("control", "ui"):
        done = subprocess.run([sys.executable, "-c", AIOHTTP_LATER, str(tmp_path / "exp"), which], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        said[which] = json.loads(done.stdout)
    assert said == {"control": {"started": False, "prometheus_client": False, "batch": False, "parameters": True},
                    "ui": {"started": True}}
