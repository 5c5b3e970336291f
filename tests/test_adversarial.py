"""Adversarial inputs from outside (issue 29): what a local process, a user's typo or a hostile request
can send, and what must come back. A bad request to the manager is counted and said in one line at most,
never a traceback; the server goes on serving.
"""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from harness import wait_until
from trialkit.manager.store import Store

PYTHON = sys.executable

# Requests aiohttp refuses before any handler runs: each printed a traceback into the experiment's terminal.
BAD_HEADS = [
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # a request line past aiohttp's bound
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"b" * 9000 + b"\r\n\r\n",  # a header past it
    b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
]


@pytest.fixture
def manager(tmp_path):
    """`python -m trialkit.manager.server` on a fresh store: (its port, its process)."""
    Store.in_dir(tmp_path).close()
    proc = subprocess.Popen([PYTHON, "-m", "trialkit.manager.server", "--experiment-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline().rsplit(":", 1)[1])
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


def send(port: int, data: bytes) -> bytes:
    """`data` on a connection of its own; what comes back before the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return answer
            answer += chunk


def test_a_flood_of_malformed_requests_is_one_counted_line_not_tracebacks(manager):
    port, proc = manager
    for _ in range(5):
        for head in BAD_HEADS:
            assert send(port, head).split(b" ", 2)[1] == b"400", head[:40]
    answer = send(port, b"GET /api/v1/trials/t/parameters HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401"), answer[:100]  # still serving
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    err = proc.stderr.read()
    assert "Traceback" not in err, err[:3000]
    said = [line for line in err.splitlines() if "bad request" in line]
    assert len(said) == 1 and "1 bad request(s) refused so far" in said[0], err[:3000]
    assert err.count("\n") == 1, err[:3000]
