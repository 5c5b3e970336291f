"""AdaptDL's supervisor protocol, served by adaptdl-ray for the jobs it runs.

AdaptDL's unchanged trainer, when ADAPTDL_SUPERVISOR_URL is set, calls:
  GET {url}/discover/{job_key}/{group}  -> the replicas' addresses, rank 0's first
      (a long poll: 408 means "not yet, ask again")
  PUT {url}/hints/{job_key}              <- its scheduling hints (JSON, SCHED_HINTS)
where job_key is its ADAPTDL_JOB_ID and group its restart count. It sends no
header of ours, so the secret that keeps other clients out travels in the
URL's path: `http://HOST:PORT/<secret>`. A wrong secret is refused before any
body is read; malformed hints are refused with one log line and never reach
the planner.
"""
from __future__ import annotations

import json
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

from trialkit.ray.sizing import Hints, HintsError

MAX_BODY = 64 * 1024  # hints are a few hundred bytes
DISCOVER_TIMEOUT = 30.0  # a discover long poll answers 408 after this long (AdaptDL's supervisor's default)


def log(line: str) -> None:
    print(f"adaptdl-ray: {line}", file=sys.stderr, flush=True)


class Supervisor:
    """The two routes, on a port of its own; `on_hints(job_key, hints)` hears every accepted report."""

    def __init__(self, host: str, on_hints: Callable[[str, Hints], None]):
        self.secret = secrets.token_urlsafe(18)
        self._on_hints = on_hints
        self._cond = threading.Condition()
        self._addresses: Dict[Tuple[str, int], List[str]] = {}
        self._server = ThreadingHTTPServer((host, 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="adaptdl-supervisor", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/{self.secret}"

    def start(self) -> "Supervisor":
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def publish(self, job_key: str, group: int, addresses: List[str]) -> None:
        """The addresses of generation `group`'s replicas, rank 0 first: answers its discover polls."""
        with self._cond:
            self._addresses[(job_key, group)] = list(addresses)
            self._cond.notify_all()

    def _discover(self, job_key: str, group: int, timeout: float) -> Optional[List[str]]:
        with self._cond:
            self._cond.wait_for(lambda: (job_key, group) in self._addresses, timeout)
            return self._addresses.get((job_key, group))

    def _handler(self):
        supervisor = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # the log lines that matter are ours
                pass

            def _answer(self, code: int, body: object = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if code >= 400:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(data)

            def _route(self) -> Optional[Tuple[str, List[str], Dict[str, List[str]]]]:
                """(action, the path's rest, query) when the secret is right; else answers 403."""
                parts = urlsplit(self.path)
                pieces = [unquote(p) for p in parts.path.split("/") if p]
                if len(pieces) < 3 or not secrets.compare_digest(pieces[0], supervisor.secret):
                    self._answer(403, {"error": "wrong supervisor URL"})
                    return None
                return pieces[1], pieces[2:], parse_qs(parts.query)

            def do_GET(self) -> None:
                route = self._route()
                if route is None:
                    return
                action, rest, query = route
                if action != "discover" or len(rest) < 2 or not rest[-1].isdigit():
                    self._answer(404, {"error": "GET /discover/<job key>/<group>"})
                    return
                try:
                    timeout = min(float(query.get("timeout", [DISCOVER_TIMEOUT])[0]), DISCOVER_TIMEOUT)
                except ValueError:
                    timeout = DISCOVER_TIMEOUT
                found = supervisor._discover("/".join(rest[:-1]), int(rest[-1]), timeout)
                self._answer(200, found) if found else self._answer(408)

            def do_PUT(self) -> None:
                route = self._route()
                if route is None:
                    return
                action, rest, _ = route
                if action != "hints" or not rest:
                    self._answer(404, {"error": "PUT /hints/<job key>"})
                    return
                job_key = "/".join(rest)
                try:
                    length = int(self.headers.get("Content-Length", ""))
                except ValueError:
                    self._answer(411, {"error": "Content-Length required"})
                    return
                if not 0 <= length <= MAX_BODY:
                    self._answer(413, {"error": f"hints are at most {MAX_BODY} bytes"})
                    return
                try:
                    hints = Hints.parse(json.loads(self.rfile.read(length)))
                except (ValueError, HintsError) as err:  # JSONDecodeError is a ValueError
                    log(f"refused hints for {job_key}: {err}")
                    self._answer(400, {"error": str(err)})
                    return
                supervisor._on_hints(job_key, hints)
                self._answer(200)

        return Handler
