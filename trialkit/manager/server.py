"""The manager's HTTP side: where keepers deliver their trials' records.

Routes (JSON in and out, errors as `{"error": reason}`):
    POST /api/v1/trials/<trial_id>/records   {"records": [{"seq": 1, "type": ..., "value": ...}, ...]}
        -> 200 {"acked": N, "inserted": K}: N is the highest seq up to which the
           trial's records are all stored; a record sent again is stored once.
    GET  /api/v1/trials/<trial_id>/parameters
        -> 200 {"parameter_id": ..., "parameters": {...}}
Every trial route needs `Authorization: Bearer <the trial's token>`: 401 when
there is none or it is no trial's, 403 when it is another trial's. Bodies
over `max_body` get 413 (unread), a POST without Content-Length 411, bodies
that are not JSON or hold a bad record 400 with the reason; a rejected batch
stores nothing. NaN and infinities in values are accepted and kept.

The control plane registers a trial and its token in the store
(`Store.add_trial(..., token=...)`): the server looks tokens up there, so a
restarted manager knows every trial at once. It hears of new records through
`add_listener(fn)`: fn(trial_id, records) runs in the request's thread after
they are committed, once per record ever (duplicates never reach it); keep it
quick (put them on a queue.Queue for a tuner or assessor thread). More routes:
`server.router.add(method, "/api/v1/things/<name>", handler)`, where handler
takes a Request and returns (status, JSON-able body) or raises HttpError.
A handler may answer other than JSON (the web page, trialkit/web): `Raw`
(bytes in a content type of their own) or `Stream` (chunks written as they
come, for server-sent events); `request.query` holds the query string.

    python -m trialkit.manager.server --experiment-dir DIR [--host H] [--port P]
serves a store on its own (tests, benchmarks, a manager run by hand).
"""
from __future__ import annotations

import json
import re
import socket
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import parse_qsl, unquote, urlsplit

from trialkit import records
from trialkit.manager.store import Store
from trialkit.errors import ArgumentParser, UserError, report_and_exit

MAX_BODY = 8 << 20  # a keeper's batch is at most 1 MiB; this leaves room and bounds memory
SOCKET_TIMEOUT = 30.0  # a client that stops sending mid-body does not hold a thread forever

Listener = Callable[[str, List[Dict[str, Any]]], None]


class HttpError(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass
class Request:
    method: str
    path: str
    params: Dict[str, str]
    headers: Mapping[str, str]
    body: bytes
    query: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        try:
            return json.loads(self.body)  # NaN and Infinity are read, as keepers send them
        except (ValueError, RecursionError) as err:
            raise HttpError(400, f"the body is not JSON: {err}") from None

    def bearer(self) -> Optional[str]:
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None


Handler = Callable[[Request], Tuple[int, Any]]


# -- answers other than JSON (added for the web page, trialkit/web) ------------------
@dataclass
class Raw:
    """An answer of bytes in a content type of their own (a page, a script)."""

    body: bytes
    content_type: str
    headers: Dict[str, str] = field(default_factory=dict)


@dataclass
class Stream:
    """An answer written chunk by chunk as `chunks` yields them (server-sent events).

    It ends when the iterator does, the client leaves or the server stops; the
    iterator should yield now and then (b"" is fine) so that a stop is noticed.
    """

    chunks: Iterable[bytes]
    content_type: str
    headers: Dict[str, str] = field(default_factory=dict)


class Router:
    """Paths with `<name>` parts (one path segment each) mapped to handlers, per method."""

    def __init__(self):
        self._routes: List[Tuple[str, "re.Pattern[str]", Handler]] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        regex = re.sub(r"<(\w+)>", r"(?P<\1>[^/]+)", re.escape(pattern))
        self._routes.append((method.upper(), re.compile(f"^{regex}$"), handler))

    def resolve(self, method: str, path: str) -> Tuple[Handler, Dict[str, str]]:
        allowed = []
        for route_method, regex, handler in self._routes:
            match = regex.match(path)
            if match:
                if route_method == method:
                    return handler, {k: unquote(v) for k, v in match.groupdict().items()}
                allowed.append(route_method)
        if allowed:
            raise HttpError(405, f"{method} is not allowed here (allowed: {', '.join(allowed)})")
        raise HttpError(404, f"no such route: {path}")


class ManagerServer:
    def __init__(self, store: Store, host: str = "127.0.0.1", port: int = 0, max_body: int = MAX_BODY):
        self.store = store
        self.max_body = max_body
        self.router = Router()
        self._listeners: List[Listener] = []
        self.router.add("POST", "/api/v1/trials/<trial_id>/records", self._post_records)
        self.router.add("GET", "/api/v1/trials/<trial_id>/parameters", self._get_parameters)
        self._httpd = ThreadingHTTPServer((host, port), _RequestHandler)
        self._httpd.daemon_threads = True
        self._httpd.manager = self  # type: ignore[attr-defined]
        self._thread: Optional[threading.Thread] = None
        self.stopping = threading.Event()  # ends Stream answers

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def authenticate(self, request: Request, trial_id: str) -> None:
        token = request.bearer()
        if token is None:
            raise HttpError(401, "no bearer token (Authorization: Bearer <the trial's token>)")
        owner = self.store.trial_for_token(token)
        if owner is None:
            raise HttpError(401, "the token is not known")
        if owner != trial_id:
            raise HttpError(403, f"the token is not trial {trial_id}'s")

    # -- routes ----------------------------------------------------------------------
    def _post_records(self, request: Request) -> Tuple[int, Any]:
        trial_id = request.params["trial_id"]
        self.authenticate(request, trial_id)
        body = request.json()
        if not isinstance(body, dict) or not isinstance(body.get("records"), list):
            raise HttpError(400, 'expected {"records": [...]}')
        batch = body["records"]
        for rec in batch:
            problem = records.wire_problem(rec)
            if problem:
                raise HttpError(400, problem)
        fresh = self.store.add_records(trial_id, batch)
        if fresh:
            self._notify(trial_id, fresh)
        return 200, {"acked": self.store.acked_seq(trial_id), "inserted": len(fresh)}

    def _get_parameters(self, request: Request) -> Tuple[int, Any]:
        trial_id = request.params["trial_id"]
        self.authenticate(request, trial_id)
        trial = self.store.trial(trial_id)
        return 200, {"parameter_id": trial["parameter_id"], "parameters": trial["parameters"]}

    def _notify(self, trial_id: str, fresh: List[Dict[str, Any]]) -> None:
        for listener in self._listeners:
            try:
                listener(trial_id, fresh)
            except Exception as err:  # noqa: BLE001 - the records are stored: a listener's bug must not undo the ack
                print(f"trialkit-manager: listener {listener!r} failed: {err!r}", file=sys.stderr, flush=True)

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes,
               query: Optional[Mapping[str, str]] = None) -> Tuple[int, Any]:
        try:
            handler, params = self.router.resolve(method, path)
            return handler(Request(method, path, params, headers, body, dict(query or {})))
        except HttpError as err:
            return err.status, {"error": err.reason}
        except Exception as err:  # noqa: BLE001 - a bug answers 500 (the keeper retries) instead of a dropped connection
            print(f"trialkit-manager: {method} {path} failed: {err!r}", file=sys.stderr, flush=True)
            return 500, {"error": "internal error"}

    # -- running -----------------------------------------------------------------------
    def start(self) -> "ManagerServer":
        """Serve from a background thread."""
        # A short poll interval: stop() waits for it.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="trialkit-manager",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a keeper sends batch after batch on one connection
    timeout = SOCKET_TIMEOUT

    def _serve(self, has_body: bool) -> None:
        manager: ManagerServer = self.server.manager  # type: ignore[attr-defined]
        target = urlsplit(self.path)
        body = b""
        if has_body:
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                return self._reply(411, {"error": "a Content-Length header is needed"}, close=True)
            if int(length) > manager.max_body:
                return self._reply(413, {"error": f"the body is over {manager.max_body} bytes"}, close=True)
            body = self.rfile.read(int(length))
        status, answer = manager.handle(self.command, target.path, self.headers, body, dict(parse_qsl(target.query)))
        if isinstance(answer, Raw):
            self._reply_raw(status, answer)
        elif isinstance(answer, Stream):
            self._reply_stream(status, answer, manager.stopping)
        else:
            self._reply(status, answer)

    def _reply(self, status: int, answer: Any, close: bool = False) -> None:
        data = records.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            # The body was not read: the connection cannot carry another request.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _send_at_once(self) -> None:
        # Headers and body leave in two writes: with Nagle's algorithm on, the body would wait
        # for the client's delayed ACK of the headers (40 ms an answer on Linux).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _reply_raw(self, status: int, answer: Raw) -> None:
        self._send_at_once()
        self.send_response(status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(answer.body)

    def _reply_stream(self, status: int, answer: Stream, stopping: threading.Event) -> None:
        # No length: the body ends when the connection closes.
        self._send_at_once()
        self.send_response(status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Connection", "close")
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.close_connection = True
        try:
            for chunk in answer.chunks:
                if stopping.is_set():
                    break
                if chunk:
                    self.wfile.write(chunk)
                    self.wfile.flush()
        except OSError:
            pass  # the client left
        finally:
            close = getattr(answer.chunks, "close", None)
            if close is not None:
                close()  # a generator's cleanup runs now, not at garbage collection

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._serve(has_body=False)

    def do_POST(self) -> None:  # noqa: N802
        self._serve(has_body=True)

    def do_PUT(self) -> None:  # noqa: N802
        self._serve(has_body=True)

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve(has_body=False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per batch would drown the manager's own output


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = ArgumentParser(prog="trialkit-manager-server", description="Serve an experiment's store to keepers.")
    parser.add_argument("--experiment-dir", required=True, help="the experiment dir (holds trialkit.db)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    try:
        opts = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except UserError as err:
        report_and_exit(parser.prog, err)
    server = ManagerServer(Store.in_dir(opts.experiment_dir), opts.host, opts.port)
    print(f"listening on {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
