"""Sends the spool's records to the manager from a thread of its own.

POST /api/v1/trials/<trial id>/records with `{"spool": ID, "records": [...]}`
(each record carries its spool seq; ID tells this spool from the trial's
others) and the trial's bearer token; the manager answers `{"acked": N}`, the
highest seq up to which it holds every record of this spool, and the spool
forgets them. One batch is in flight at a time, always starting just
after the last ack, so a lost answer or a keeper restart only resends what
the manager then stores once. Failures (manager down, 5xx, refused token)
are retried with exponential backoff and jitter; nothing is ever dropped.
A record the manager cannot store is refused alone: the answer names it in
`"rejected": [{"seq", "reason"}]` and acks past it (the manager keeps it as a
rejected row), so the keeper says why in the trial's log, once, and the rest
of the batch and every later record go on as usual.
Each change between reachable and unreachable is said once, not every try.

HTTP goes over one keep-alive connection of this module's own (Connection):
importing `requests` cost a keeper about 0.2 s of CPU, as much as the rest of
its start, and the standard library's http.client (with email and ssl) 11.5
of the 17.9 ms its whole reporting side took to import (min of 8, load 6),
CPU taken from the trial that starts beside it. Every trial pays it.
"""
from __future__ import annotations

import json
import random
import socket
import sys
import threading
import time

TYPE_CHECKING = False  # no typing at run time: 2 of the 5.6 ms the reporting side imports beside the trial's start
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import SplitResult, quote, urlsplit

from trialkit.keeper.spool import Spool

BATCH_RECORDS = 1000
BATCH_BYTES = 1 << 20  # well under the manager's body limit
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 2.0  # a manager that comes back is found within about this long
CONNECT_TIMEOUT = 3.0
READ_TIMEOUT = 30.0


LINE_LIMIT = 65536  # an answer's status line or header line longer than this is no manager's


class AnswerError(Exception):
    """What answered is not HTTP, or its answer was cut short."""


class Connection:
    """One keep-alive HTTP/1.1 connection to the manager, opened by the first request (TLS for https, with the
    default context: the system's CAs, or SSL_CERT_FILE's). A request goes in one write, in the plain form the
    manager's keepers' route serves (one Content-Length, keep-alive); an answer is read by its Content-Length, as
    that route and aiohttp's answers give it, else by its chunks or to the connection's close."""

    def __init__(self, url: SplitResult):
        self.tls = url.scheme == "https"
        self.host = url.hostname or ""
        self.port = url.port or (443 if self.tls else 80)
        self.netloc = url.netloc
        self.sock: Optional[socket.socket] = None
        self._file: Any = None

    def post(self, path: str, body: bytes, headers: Dict[str, str], connect_timeout: float,
             read_timeout: float) -> Tuple[int, bytes]:
        """(status, body) of the answer. Raises OSError or AnswerError; the connection is then unusable."""
        if self.sock is None:
            self._connect(connect_timeout)
        assert self.sock is not None
        self.sock.settimeout(read_timeout)
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self.sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {self.netloc}\r\n{lines}Content-Length: {len(body)}\r\n"
                          "\r\n".encode("latin-1") + body)
        return self._answer()

    def close(self) -> None:
        for part in (self._file, self.sock):
            if part is not None:
                part.close()
        self.sock = self._file = None

    def _connect(self, timeout: float) -> None:
        sock = socket.create_connection((self.host, self.port), timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the head and body go in one write anyway
            if self.tls:
                import ssl  # only a manager behind TLS costs its import

                context = ssl.create_default_context()
                context.set_alpn_protocols(["http/1.1"])
                sock = context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock, self._file = sock, sock.makefile("rb")

    def _line(self) -> bytes:
        line = self._file.readline(LINE_LIMIT)
        if not line.endswith(b"\n"):
            raise AnswerError("its answer was cut short" if len(line) < LINE_LIMIT else "an answer's line is too long")
        return line

    def _answer(self) -> Tuple[int, bytes]:
        first = self._file.readline(LINE_LIMIT)
        if not first:  # an idle keep-alive connection the manager closed, as http.client's RemoteDisconnected
            raise ConnectionResetError("the manager closed the connection without an answer")
        parts = first.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise AnswerError(f"not an HTTP answer: {first[:80]!r}")
        headers: Dict[bytes, bytes] = {}
        while True:
            line = self._line()
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        length = headers.get(b"content-length")
        if length is not None and length.isdigit():
            body = self._exactly(int(length))
        elif headers.get(b"transfer-encoding", b"").lower().endswith(b"chunked"):
            body = self._chunks()
        else:
            body, headers[b"connection"] = self._file.read(), b"close"  # framed by its close
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return int(parts[1]), body

    def _exactly(self, size: int) -> bytes:
        data = self._file.read(size)
        if len(data) < size:
            raise AnswerError("its answer was cut short")
        return data

    def _chunks(self) -> bytes:
        out = []
        while True:
            size = self._line().split(b";", 1)[0].strip()
            try:
                left = int(size, 16)
            except ValueError:
                raise AnswerError(f"a chunk of its answer has no size: {size[:20]!r}") from None
            if left == 0:
                while self._line() not in (b"\r\n", b"\n"):  # its trailer
                    pass
                return b"".join(out)
            out.append(self._exactly(left))
            self._line()  # the chunk's CRLF


def backoff(attempt: int) -> float:
    """Exponential, capped, with jitter: half fixed, half random (so keepers do not retry in step)."""
    delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** attempt)
    return delay / 2 + random.uniform(0, delay / 2)


class Shipper:
    def __init__(self, spool: Spool, manager_url: str, trial_id: str, token: Optional[str], log=None,
                 route: str = "records"):
        """`route`: under the trial's path; another replica of a multi-pod trial ships to replicas/<rank>/records."""
        self.spool = spool
        self.url = f"{manager_url.rstrip('/')}/api/v1/trials/{quote(trial_id, safe='')}/{route}"
        self._parts = urlsplit(self.url)
        self._path = self._parts.path
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.log = log or (lambda message: print(f"[trialkit-keeper] {message}", file=sys.stderr, flush=True))
        self._deadline: Optional[float] = None  # set by close(): give up at this monotonic time
        self._stopped = False
        self._failing: Optional[str] = None
        self._head = b'{"spool":"%s","records":[' % spool.id.encode() if spool.id else b'{"records":['
        self._thread = threading.Thread(target=self._run, name="trialkit-shipper", daemon=True)

    def start(self) -> "Shipper":
        self._thread.start()
        return self

    def close(self, deadline: float) -> int:
        """Deliver until everything is acknowledged or the deadline passes; return what is left."""
        cond = self.spool.cond
        with cond:
            self._deadline = deadline
            cond.notify_all()
            while self.spool.unsent and time.monotonic() < deadline and self._thread.is_alive():
                cond.wait(deadline - time.monotonic())
            self._stopped = True
            cond.notify_all()
        # A request in flight is bounded by the deadline (see _timeout).
        self._thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
        return self.spool.unsent

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        connection: Optional[Connection] = None
        attempt = 0
        limit = BATCH_RECORDS
        while self._wait_for_work():
            batch = self.spool.read(self.spool.acked, limit, BATCH_BYTES)
            if not batch:
                continue
            reused = connection is not None and connection.sock is not None
            try:
                connection = connection or Connection(self._parts)
                status, answer = self._post(connection, batch)
            except (OSError, AnswerError) as err:
                if connection is not None:
                    connection.close()
                connection = None
                if reused:
                    continue  # the manager closed an idle keep-alive connection: send again on a new one
                status, answer = None, type(err).__name__  # the full text differs every try
            if status == 200 and isinstance(answer, dict) and isinstance(answer.get("acked"), int):
                self._note_rejected(answer.get("rejected"))
                self.spool.ack(answer["acked"])
                if self._failing:
                    self.log(f"the manager answers again; delivering {self.spool.unsent} spooled records")
                self._failing = None
                attempt = 0
                limit = min(BATCH_RECORDS, limit * 2)
                continue
            if status == 413 and len(batch) > 1:
                limit = max(1, len(batch) // 2)  # smaller batches fit
                continue
            self._note_failure(status, answer)
            self._sleep(backoff(attempt))
            attempt += 1

    def _wait_for_work(self) -> bool:
        with self.spool.cond:
            while not self._stopped and not self.spool.unsent:
                self.spool.cond.wait()
            return not self._stopped and not self._past_deadline()

    def _post(self, connection: Connection, batch: List[Tuple[int, bytes]]):
        body = self._head + b",".join(line for _, line in batch) + b"]}"
        status, data = connection.post(self._path, body, self.headers, *self._timeout())
        try:
            answer = json.loads(data)
        except ValueError:
            answer = data[:200].decode(errors="replace")
        return status, answer

    def _timeout(self) -> Tuple[float, float]:
        if self._deadline is None:
            return CONNECT_TIMEOUT, READ_TIMEOUT
        left = max(0.05, self._deadline - time.monotonic())
        return min(CONNECT_TIMEOUT, left), min(READ_TIMEOUT, left)

    def _note_rejected(self, rejected: Any) -> None:
        """The manager names each record it refused once (a resent one is no longer new to it)."""
        for item in rejected if isinstance(rejected, list) else ():
            if isinstance(item, dict):
                self.log(f"the manager refused record {item.get('seq')} ({item.get('reason')}); "
                         f"it is kept there as rejected, and the other records go on")

    def _note_failure(self, status: Optional[int], answer) -> None:
        if status is None:
            what = f"cannot reach the manager at {self.url} ({answer})"
        else:
            reason = answer.get("error", answer) if isinstance(answer, dict) else answer
            what = f"the manager answered {status} ({reason})"
        if what != self._failing:
            self.log(f"{what}; retrying with backoff, records stay in the spool")
        self._failing = what

    def _sleep(self, seconds: float) -> None:
        with self.spool.cond:
            end = time.monotonic() + seconds
            if self._deadline is not None:
                end = min(end, self._deadline)
            while not self._stopped and time.monotonic() < end:
                self.spool.cond.wait(end - time.monotonic())

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline
