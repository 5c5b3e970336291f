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

HTTP goes through the standard library's http.client on one keep-alive
connection: importing `requests` cost a keeper about 0.2 s of CPU, as much as
the rest of its start, and every trial pays it.
"""
from __future__ import annotations

import http.client
import json
import random
import sys
import threading
import time
from typing import Any, List, Optional, Tuple
from urllib.parse import quote, urlsplit

from trialkit.keeper.spool import Spool

BATCH_RECORDS = 1000
BATCH_BYTES = 1 << 20  # well under the manager's body limit
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 2.0  # a manager that comes back is found within about this long
CONNECT_TIMEOUT = 3.0
READ_TIMEOUT = 30.0


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
        parts = urlsplit(self.url)
        self._connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._netloc, self._path = parts.netloc, parts.path
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
        connection: Optional[http.client.HTTPConnection] = None
        attempt = 0
        limit = BATCH_RECORDS
        while self._wait_for_work():
            batch = self.spool.read(self.spool.acked, limit, BATCH_BYTES)
            if not batch:
                continue
            reused = connection is not None
            try:
                connection = connection or self._connection_class(self._netloc)
                status, answer = self._post(connection, batch)
            except (OSError, http.client.HTTPException) as err:
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

    def _post(self, connection: http.client.HTTPConnection, batch: List[Tuple[int, bytes]]):
        body = self._head + b",".join(line for _, line in batch) + b"]}"
        connect_timeout, read_timeout = self._timeout()
        if connection.sock is None:
            connection.timeout = connect_timeout
            connection.connect()
        connection.sock.settimeout(read_timeout)
        connection.request("POST", self._path, body=body, headers=self.headers)
        response = connection.getresponse()
        data = response.read()
        try:
            answer = json.loads(data)
        except ValueError:
            answer = data[:200].decode(errors="replace")
        return response.status, answer

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
