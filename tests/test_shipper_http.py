"""The keeper's own HTTP connection (keeper/shipper.py: Connection), against a real socket server on loopback.

The manager answers by Content-Length on a kept-alive connection; what else may answer (a proxy, another
server at the address) by chunks or by closing; a manager closes an idle connection, which the shipper
meets as a reset and sends again on a new one. The end to end paths (the real manager, TLS) are in
test_delivery.py and test_manager_guard.py.
"""
from __future__ import annotations

import socket
import threading
from typing import List
from urllib.parse import urlsplit

import pytest

from trialkit.keeper.shipper import AnswerError, Connection

BODY = b'{"acked": 3}'


class Closing(bytes):
    """An answer after which the server closes the connection."""


class Server:
    """Accepts connections; reads each request whole (head and Content-Length body) and writes the next of
    `answers` (None: closes the connection instead; a Closing answer: closes it after). Counts the
    connections and keeps the requests."""

    def __init__(self, answers: List[object]):
        self.answers = list(answers)
        self.requests: List[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = urlsplit(f"http://127.0.0.1:{self.sock.getsockname()[1]}/api/v1/trials/t1/records")
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.answers:
            conn, _ = self.sock.accept()
            self.connections += 1
            with conn, conn.makefile("rb") as reading:
                while self.answers:
                    head = b""
                    while not head.endswith(b"\r\n\r\n"):
                        line = reading.readline()
                        if not line:
                            break
                        head += line
                    if not head:
                        break
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    self.requests.append(head + reading.read(length))
                    answer = self.answers.pop(0)
                    if answer is not None:
                        conn.sendall(answer)
                    if answer is None or isinstance(answer, Closing):
                        break

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve():
    servers: List[Server] = []

    def make(*answers: object) -> Server:
        servers.append(Server(list(answers)))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def post(connection: Connection, body: bytes = b'{"records": []}'):
    return connection.post("/api/v1/trials/t1/records", body, {"Authorization": "Bearer t"}, 5, 5)


def by_length(status: bytes = b"200 OK", body: bytes = BODY, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n" % len(body) + extra + b"\r\n" + body


def test_answers_by_content_length_keep_one_connection_and_the_request_is_the_plain_form(serve):
    server = serve(by_length(), by_length(b"413 Payload Too Large", b"too big"))
    connection = Connection(server.url)
    assert post(connection) == (200, BODY)
    assert post(connection, b"x" * 100) == (413, b"too big")
    assert server.connections == 1
    head, body = server.requests[1].split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /api/v1/trials/t1/records HTTP/1.1" and body == b"x" * 100
    assert sorted(lines[1:]) == sorted([f"Host: {server.url.netloc}".encode(), b"Authorization: Bearer t",
                                        b"Content-Length: 100"])
    connection.close()


def test_a_chunked_answer_and_one_framed_by_its_close_are_read_whole(serve):
    server = serve(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\n{\"ack\r\n7\r\ned\": 3}\r\n0\r\n\r\n",
                   Closing(b"HTTP/1.1 503 Service Unavailable\r\n\r\nbusy"))
    connection = Connection(server.url)
    assert post(connection) == (200, BODY)
    assert post(connection) == (503, b"busy")
    assert connection.sock is None  # read to its close: the next request opens a new connection
    connection.close()


def test_an_answer_that_says_close_closes_the_connection_and_the_next_request_opens_another(serve):
    server = serve(by_length(extra=b"Connection: close\r\n"), by_length())
    connection = Connection(server.url)
    assert post(connection) == (200, BODY)
    assert connection.sock is None
    assert post(connection) == (200, BODY)
    assert server.connections == 2
    connection.close()


def test_a_connection_the_server_closed_is_a_reset_and_what_is_not_http_or_cut_short_is_refused(serve):
    server = serve(None, Closing(b"SSH-2.0-OpenSSH_9.2\r\n"),
                   Closing(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"),
                   Closing(b"HTTP/1.1 200 OK\r\nContent-Le"))
    with pytest.raises(ConnectionResetError):
        post(Connection(server.url))
    with pytest.raises(AnswerError, match="not an HTTP answer"):
        post(Connection(server.url))
    for _ in range(2):
        with pytest.raises(AnswerError, match="cut short"):
            post(Connection(server.url))
