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
import socket
import time
from typing import List, Tuple

import pytest

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
