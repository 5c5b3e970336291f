"""The trial's progress and latest metrics, posted to Kubeflow Trainer's status endpoint (Trainer 2.2+).

Where Trainer gives the pod KUBEFLOW_TRAINER_SERVER_URL (with files holding its CA certificate and a
bearer token, KUBEFLOW_TRAINER_SERVER_CA_CERT and _TOKEN), the reporting keeper POSTs
`{"trainerStatus": {"progressPercentage", "metrics": [{"name", "value"}], "lastUpdatedTime"}}` there, and
`kubectl get trainjob` shows them. progressPercentage is said when it is known: 100 once the trial reported
its final result; metrics are the latest intermediate result's numbers (NNI's `default` and dict keys,
Determined's GROUP.NAME), the final result's once there is one, and `intermediateResults`, how many came.

It never holds the trial or the keeper up: `note` keeps the latest state and wakes a thread of its own,
which posts at most once every MIN_INTERVAL seconds (Trainer asks clients to rate-limit themselves), each
post within TIMEOUT; a failure is said once and the next state tried later. At the keeper's end `close`
posts the last state within what is left of the flush. The token file is read at each post (Trainer
rotates it). http.client and ssl are imported by the thread, not at the keeper's start.
"""
from __future__ import annotations

import json
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional

from trialkit import records

MIN_INTERVAL = 5.0
TIMEOUT = 5.0


class TrainerStatus:
    def __init__(self, url: str, ca_file: Optional[str], token_file: Optional[str], log: Callable[[str], None]):
        self.url, self.ca_file, self.token_file, self.log = url, ca_file, token_file, log
        self._metrics: Dict[str, str] = {}
        self._intermediate = 0
        self._final = False
        self._changed = threading.Event()
        self._closing = threading.Event()
        self._last_post = 0.0
        self._failing = False
        self._lock = threading.Lock()  # the state, between the reporter and the thread
        self._thread = threading.Thread(target=self._run, name="trainer-status", daemon=True)
        self._thread.start()

    def note(self, rec: Dict[str, Any]) -> None:
        """A record spooled: the state it changes (metrics only), then a wake for the thread."""
        kind = rec.get("type")
        if kind not in (records.PERIODICAL, records.FINAL):
            return
        numbers = {name: repr(value) for name, value in records.scalars(rec.get("value"))}
        with self._lock:
            if kind == records.FINAL:
                self._final = True
                self._metrics = {**self._metrics, **numbers}
            elif not self._final:
                self._intermediate += 1
                self._metrics = numbers
        self._changed.set()

    def payload(self) -> Dict[str, Any]:
        with self._lock:
            metrics = [{"name": name, "value": value} for name, value in self._metrics.items()]
            metrics.append({"name": "intermediateResults", "value": str(self._intermediate)})
            status: Dict[str, Any] = {"metrics": metrics,
                                      "lastUpdatedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            if self._final:
                status["progressPercentage"] = 100
        return {"trainerStatus": status}

    def close(self, deadline: float) -> None:
        """The last state, posted within the flush's deadline (monotonic seconds)."""
        self._closing.set()
        self._changed.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            self._changed.wait()
            pause = self._last_post + MIN_INTERVAL - time.monotonic()
            if pause > 0:
                self._closing.wait(pause)  # rate-limited while the trial runs; the last state goes at once
            self._changed.clear()
            self._last_post = time.monotonic()
            self._post(self.payload())
            if self._closing.is_set() and not self._changed.is_set():
                return

    def _post(self, body: Dict[str, Any]) -> None:
        import http.client
        import ssl
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        try:
            headers = {"Content-Type": "application/json"}
            if self.token_file:
                with open(self.token_file, encoding="utf-8") as handle:
                    headers["Authorization"] = f"Bearer {handle.read().strip()}"
            if parts.scheme == "https":
                context = ssl.create_default_context(cafile=self.ca_file or None)
                connection: Any = http.client.HTTPSConnection(parts.netloc, timeout=TIMEOUT, context=context)
            else:
                connection = http.client.HTTPConnection(parts.netloc, timeout=TIMEOUT)
            try:
                connection.request("POST", parts.path or "/", json.dumps(body), headers)
                answer = connection.getresponse()
                answer.read()
            finally:
                connection.close()
            if answer.status >= 300:
                raise OSError(f"HTTP {answer.status} {answer.reason}")
        except (OSError, ssl.SSLError, http.client.HTTPException) as err:
            if not self._failing:
                self.log(f"cannot post the trial's progress to Kubeflow Trainer at {self.url}: {err}; trying again "
                         "with the next results")
            self._failing = True
            return
        if self._failing:
            self.log(f"posting the trial's progress to Kubeflow Trainer at {self.url} again")
        self._failing = False
