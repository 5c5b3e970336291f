"""The manager's HTTP side: where keepers deliver their trials' records.

Routes (JSON in and out, errors as `{"error": reason}`):
    POST /api/v1/trials/<trial_id>/records
         {"spool": ID, "records": [{"seq": 1, "type": ..., "value": ...}, ...]}
        -> 200 {"acked": N, "inserted": K[, "rejected": [{"seq": S, "reason": R}, ...]]}:
           seqs are the spool's (ID, the keeper's spool: keeper/spool.py;
           a batch without one is of the trial's spool that names none);
           N is the highest seq up to which that spool's records are all
           stored or refused; a record sent again is stored once. A record with a
           usable seq that cannot be stored (records.record_problem: a wrong
           type, a number out of SQLite's range, ...) is refused alone: kept
           as a REJECTED row with its reason, named once in "rejected", and
           counted in N, so the keeper logs it and moves on.
    GET  /api/v1/trials/<trial_id>/parameters
        -> 200 {"parameter_id": ..., "parameters": {...}}
    GET  /api/v1/trials/<trial_id>/archives/<sha256>
        -> 200 a tar.gz the control plane packed for the trial's pods (trialkit/manager/archives.py)
    POST /api/v1/trials/<trial_id>/replicas/<rank>/records
        -> 200 {"acked": N, ...}: another replica's output, kept by rank (trialkit/manager/replica_logs.py)
Every trial route needs `Authorization: Bearer <the trial's token>`: 401 when
there is none or it is no trial's (the control plane revokes a trial's token when it
ends), 403 when it is another trial's. The token is checked on the headers,
before a byte of the body is read. Bodies over `max_body` get 413 (unread), a
POST without Content-Length 411, bodies that are not JSON, not
`{"records": [...]}` or hold a record without a usable seq 400 with the
reason; such a batch stores nothing. Any value JSON allows is accepted and
kept (records.loads). When the disk takes no writes (full, read-only,
failing: trialkit.manager.disk) a batch gets 503 and stays in the keeper's
spool, to be sent again; `server.disk` says what is wrong.

Connections are served on one asyncio loop (trialkit/manager/transport.py):
a keeper's batch that comes whole in HTTP's plain form is answered by the
transport's quick way (`_quick`), every other request by aiohttp's server,
which a manager with keepers loads LOAD_AIOHTTP_AFTER seconds after its
start, or at the first request that needs it: its ~0.1 s of imports come
after the control plane's first trials start, not before.
The keepers' routes run on the loop, and those added by `on_loop` (the
page's files); every other route in a pool of threads. Bounds: at most `max_connections` connections are served at
once (one more is closed at once; keepers retry), a request's line and
headers must arrive within `header_seconds` of its first byte (slowloris),
its body within `body_seconds` of its headers (408 then), and an idle
keep-alive connection is dropped after SOCKET_TIMEOUT. With
`tls=(cert, key)` the server speaks HTTPS only; the TLS handshake must end
within `header_seconds`.

The control plane registers a trial and its token in the store
(`Store.add_trial(..., token=...)`): the server looks tokens up there, so a
restarted manager knows every trial at once. It hears of new records through
`add_listener(fn)`: fn(trial_id, records) runs on the server's loop after
they are committed, once per record ever (duplicates never reach it); keep it
quick (put them on a queue.Queue for a tuner or assessor thread): every
keeper waits while it runs. More routes:
`server.router.add(method, "/api/v1/things/<name>", handler)`, where handler
takes a Request and returns (status, JSON-able body) or raises HttpError
(their vocabulary is trialkit/manager/routes.py's, which a module adding
routes imports instead of this one).
A route may check the request's headers before its body is read:
`router.add(..., check=fn)`, where fn(request) raises HttpError (the
request's body is then still empty). A handler may answer other than JSON (the web page, trialkit/web): `Raw`
(bytes in a content type of their own) or `Stream` (chunks written as they
come, for server-sent events); `request.query` holds the query string.
At `stop(note)` a stream's iterator ends with its last chunks (the page's events: its last change and a
`closing` event with the note, trialkit/web/events.py), and the stream is held open until its client
closes it, having read what it shows last, or CLOSING_SECONDS pass: a tab open when a run ends shows the
run's end, and a stalled one does not hold the run's exit.

    python -m trialkit.manager.server --experiment-dir DIR [--host H] [--port P] [--tls-cert C --tls-key K]
serves a store on its own (tests, benchmarks, a manager run by hand).
`ManagerServer(None, ...)` serves no keeper route at all (`trialkit ui`).
"""
from __future__ import annotations

import asyncio
import ssl
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import parse_qsl, unquote, urlsplit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from aiohttp import web

try:
    import orjson  # the control extra installs it (setup.py); without it the manager decodes as records.loads does
except ImportError:  # pragma: no cover - depends on the install
    orjson = None

from trialkit import records
from trialkit.manager import archives, replica_logs
from trialkit.manager.commits import GroupCommit
from trialkit.manager.disk import DiskWatch
from trialkit.manager.routes import Handler, HttpError, Raw, Request, Router, Stream
from trialkit.manager.store import Store, Stored
from trialkit.manager.transport import Take, Transport
from trialkit.errors import ArgumentParser, UserError, report_and_exit

MAX_BODY = 8 << 20  # a keeper's batch is at most 1 MiB; this leaves room and bounds memory
SOCKET_TIMEOUT = 30.0  # an idle keep-alive connection is dropped after this
BODY_SECONDS = 30.0  # from a request's headers to the end of its body (a keeper's batch is at most 1 MiB)
HEADER_SECONDS = 10.0  # from a request's first byte to the end of its headers (slowloris)
MAX_CONNECTIONS = 2048  # served at once: above any keeper count tried (bench/bench_manager.py: 1,000)
RETRY_AFTER_SECONDS = 2  # what a 503 for a disk that takes no writes suggests
LOAD_AIOHTTP_AFTER = 1.0  # a manager with keepers: its control plane's first trials start meanwhile (transport.py)
CLOSING_SECONDS = 5.0  # at stop: how long open streams may take to say goodbye (a page reads its last state)
_LET_GO_POLL = 0.05  # at stop: how often a stream held open looks whether its client has closed it
STOPPED_NOTE = "its server stopped; `trialkit ui` serves this page again"
_TRIALS, _RECORDS = "/api/v1/trials/", "/records"  # the keepers' route, as the quick way matches it

Listener = Callable[[str, List[Dict[str, Any]]], None]


class ManagerServer:
    def __init__(self, store: Optional[Store], host: str = "127.0.0.1", port: int = 0, max_body: int = MAX_BODY, *,
                 tls: Optional[Tuple[str, str]] = None, max_connections: int = MAX_CONNECTIONS,
                 header_seconds: float = HEADER_SECONDS, body_seconds: float = BODY_SECONDS):
        self.store = store
        self.max_body = max_body
        self.header_seconds = header_seconds
        self.body_seconds = body_seconds
        self.router = Router()
        self._listeners: List[Listener] = []
        if store is not None:
            self.router.add("POST", "/api/v1/trials/<trial_id>/records", self._post_records, self._trial_check)
            self.router.add("GET", "/api/v1/trials/<trial_id>/parameters", self._get_parameters, self._trial_check)
            archives.add_route(self.router, store, self._trial_check)  # code and trial side for pods
            replica_logs.add_route(self.router, store, self._trial_check)  # other replicas' output, by rank
        # The keepers' routes answer in well under a millisecond: they run on the server's loop.
        self._on_loop = {self._post_records, self._get_parameters} if store is not None else set()
        self.disk = DiskWatch(store.path.parent if store is not None else Path("."))
        self._commits = GroupCommit(store) if store is not None else None
        self._transport = Transport(host, port, self._serve, quick=self._quick,
                                    tls=tls_context(*tls) if tls is not None else None,
                                    max_connections=max_connections, header_seconds=header_seconds,
                                    body_seconds=body_seconds, idle_seconds=SOCKET_TIMEOUT,
                                    # A control plane's manager starts trials first; `trialkit ui` serves the page.
                                    load_aiohttp_after=LOAD_AIOHTTP_AFTER if store is not None else None)
        self.scheme = "https" if tls is not None else "http"
        self._thread: Optional[threading.Thread] = None
        self.stopping = Stopping()  # ends Stream answers
        self._streams = threading.Condition()
        self._streaming = 0  # Stream answers open now
        self.meter: Any = None  # trialkit.manager.metrics.Meter once /metrics is installed: told of each batch

    @property
    def url(self) -> str:
        host, port = self._transport.address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{host}:{port}"

    @property
    def connections(self) -> int:
        """Connections open now."""
        return self._transport.connections

    def on_loop(self, handler: Handler) -> None:
        """Have a route's handler answer on the server's loop rather than in the pool: one that only hands out what
        it holds (the page's files), whose answer takes less than a thread's turn (bench/bench_web.py)."""
        self._on_loop.add(handler)

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def authenticate(self, request: Request, trial_id: str) -> None:
        token = request.bearer()
        if token is None:
            raise HttpError(401, "no bearer token (Authorization: Bearer <the trial's token>)")
        owner = self.store.trial_for_token(token) if self.store is not None else None
        if owner is None:
            raise HttpError(401, "the token is not known, or its trial has ended")
        if owner != trial_id:
            raise HttpError(403, f"the token is not trial {trial_id}'s")

    def _trial_check(self, request: Request) -> None:
        self.authenticate(request, request.params["trial_id"])

    # -- routes ----------------------------------------------------------------------
    def _post_records(self, request: Request) -> Tuple[int, Any]:
        """The records route served alone (handle()); on the loop, _grouped_records serves it."""
        trial_id = request.params["trial_id"]
        outcome = self.store.add_batches([(trial_id, *_split(request.body))])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return self._stored(trial_id, outcome)

    async def _grouped_records(self, request: Request) -> Tuple[int, Any]:
        """The records route on the loop, reached through aiohttp: as the quick way serves it (_take_records)."""
        answered: "asyncio.Future[Tuple[int, Any]]" = asyncio.get_running_loop().create_future()

        def answer(status: int, body: Any) -> None:
            if not answered.done():  # given up when its client left: stored all the same, acked on a resend
                answered.set_result((status, body))

        self._take_records(request.params["trial_id"], request.body, answer)
        return await answered

    def _quick(self, method: str, target: str, headers: Dict[str, str]) -> Optional[Take]:
        """The transport's quick way (transport.Quick): a keeper's batch within max_body, with its trial's token;
        None for every other request, which _serve then answers (a refusal too) as it answers any."""
        if method != "POST" or not target.startswith(_TRIALS) or not target.endswith(_RECORDS):
            return None
        trial_id = target[len(_TRIALS):-len(_RECORDS)]
        if not trial_id or "/" in trial_id or self.store is None or int(headers["content-length"]) > self.max_body:
            return None
        trial_id = unquote(trial_id)
        try:
            self.authenticate(Request(method, target, {}, {"Authorization": headers.get("authorization", "")}, b""),
                              trial_id)
        except Exception:  # noqa: BLE001 - refused, or the store failed: _serve answers it as it answers any
            return None
        return lambda body, reply: self._take_records(trial_id, body, lambda status, answer: reply(
            status, *_json_parts(status, answer)))

    def _take_records(self, trial_id: str, body: bytes, answer: Callable[[int, Any], None]) -> None:
        """A batch stored with the others of this turn of the loop (commits.py); `answer(status, body)` is called
        once the commit that holds it is done (or at once, for a body that is no batch)."""
        started = time.monotonic() if self.meter is not None else 0.0
        parts: Tuple[str, List[Any], List[Any]] = ("", [], [])

        def done(outcome: Union[Stored, Exception]) -> None:
            if isinstance(outcome, Exception):
                answer(*self._failed("POST", f"{_TRIALS}{trial_id}{_RECORDS}", outcome))
            else:
                answer(*self._stored(trial_id, outcome))
                if self.meter is not None:
                    self.meter.batch(trial_id, len(parts[1]) + len(parts[2]), len(outcome.fresh), started)

        try:
            parts = _split(body)
            self._commits.submit(trial_id, *parts, done)
        except Exception as err:  # noqa: BLE001 - a body that is no batch (400), or a bug (500): answered either way
            done(err)

    def _stored(self, trial_id: str, outcome: Stored) -> Tuple[int, Any]:
        self.disk.passed()
        if outcome.fresh:
            self._notify(trial_id, outcome.fresh)
        answer = {"acked": outcome.acked, "inserted": len(outcome.fresh)}
        if outcome.refused:
            answer["rejected"] = outcome.refused
        return 200, answer

    def _get_parameters(self, request: Request) -> Tuple[int, Any]:
        trial = self.store.trial(request.params["trial_id"])
        return 200, {"parameter_id": trial["parameter_id"], "parameters": trial["parameters"]}

    def _notify(self, trial_id: str, fresh: List[Dict[str, Any]]) -> None:
        for listener in self._listeners:
            try:
                listener(trial_id, fresh)
            except Exception as err:  # noqa: BLE001 - the records are stored: a listener's bug must not undo the ack
                print(f"trialkit-manager: listener {listener!r} failed: {err!r}", file=sys.stderr, flush=True)

    def admit(self, request: Request) -> Handler:
        """The request's handler, once its route's check passed on the headers alone; raises HttpError."""
        handler, check, request.params = self.router.resolve(request.method, request.path)
        if check is not None:
            check(request)
        return handler

    def answer(self, handler: Handler, request: Request) -> Tuple[int, Any]:
        """Run an admitted request's handler; errors become answers (a bug 500, a disk that refuses 503)."""
        try:
            return handler(request)
        except Exception as err:  # noqa: BLE001 - every failure becomes an answer
            return self._failed(request.method, request.path, err)

    def _failed(self, method: str, path: str, err: Exception) -> Tuple[int, Any]:
        """The answer for a request that raised: its HttpError; 400 with its line for a UserError; 503 when the disk
        refuses; else 500 (a bug: the keeper retries, instead of a dropped connection)."""
        if isinstance(err, HttpError):
            return err.status, {"error": err.reason}
        if isinstance(err, UserError):  # what the request asked is refused as a config would be (out of range, ...)
            return 400, {"error": err.line()}
        if self.disk.failed(err, "the store"):
            return 503, {"error": f"{self.disk.problem or 'the disk takes no writes'}: "
                                  "keep the records and send them again later"}
        print(f"trialkit-manager: {method} {path} failed: {err!r}", file=sys.stderr, flush=True)
        return 500, {"error": "internal error"}

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes,
               query: Optional[Mapping[str, str]] = None) -> Tuple[int, Any]:
        """One request served in-process, body given: admit, then answer."""
        request = Request(method, path, {}, headers, body, dict(query or {}))
        try:
            handler = self.admit(request)
        except HttpError as err:
            return err.status, {"error": err.reason}
        return self.answer(handler, request)

    # -- running -----------------------------------------------------------------------
    def start(self) -> "ManagerServer":
        """Serve from a background thread."""
        self._thread = threading.Thread(target=self._transport.run, name="trialkit-manager", daemon=True)
        self._thread.start()
        self._transport.ready.wait()
        return self

    def serve_until_signalled(self, ready: Callable[[], None] = lambda: None) -> int:
        """Serve until Ctrl-C or SIGTERM, calling `ready` once serving; the signal that ended it.

        The signals are waited for (sigwait), never raised into the server: a KeyboardInterrupt lands at any
        bytecode, and one that landed inside the loop's machinery once left `trialkit ui` running for ever.
        They are blocked before the server's threads start, which inherit the mask: only sigwait takes them."""
        stops = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        try:
            self.start()
            ready()
            return signal.sigwait(stops)
        finally:
            self.stop()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)

    def stop(self, note: str = STOPPED_NOTE) -> None:
        """Stop serving; open streams end with `note` (the page's events say it) and get CLOSING_SECONDS to close."""
        self.stopping.note = note
        self.stopping.set()
        with self._streams:
            self._streams.wait_for(lambda: self._streaming == 0, CLOSING_SECONDS)
        self._transport.stop()
        if self._thread is not None:
            self._thread.join()
        self._transport.close()
        self.disk.close()

    # -- one request, from the server's loop -------------------------------------------
    async def _serve(self, incoming: web.BaseRequest) -> web.StreamResponse:
        from aiohttp import web  # loaded by the time aiohttp serves (transport.py)

        target = urlsplit(incoming.raw_path)
        request = Request(incoming.method, target.path, {}, incoming.headers, b"", dict(parse_qsl(target.query)))
        has_body = incoming.method in ("POST", "PUT")
        try:
            handler = self.admit(request)  # refused here, the body is never read
        except HttpError as err:
            return _json(err.status, {"error": err.reason}, close=has_body)
        if has_body:
            length = incoming.headers.get("Content-Length")
            if length is None or not length.isdigit():
                return _json(411, {"error": "a Content-Length header is needed"}, close=True)
            if int(length) > self.max_body:
                return _json(413, {"error": f"the body is over {self.max_body} bytes"}, close=True)
            try:
                request.body = await self._body(incoming, int(length))
            except (asyncio.IncompleteReadError, ConnectionError):  # the client left mid-body (a keeper stopped)
                return _json(400, {"error": f"the body ended before its {length} bytes"}, close=True)
            except asyncio.TimeoutError:
                return _json(408, {"error": f"the body took over {self.body_seconds:g} s"}, close=True)
        if handler == self._post_records:
            status, answer = await self._grouped_records(request)
        elif handler in self._on_loop:
            status, answer = self.answer(handler, request)
        else:
            status, answer = await self._transport.blocking(self.answer, handler, request)
        if isinstance(answer, Raw):
            return web.Response(body=answer.body, status=status,
                                headers={"Content-Type": answer.content_type, **answer.headers})
        if isinstance(answer, Stream):
            return await self._stream(incoming, status, answer)
        return _json(status, answer)

    async def _body(self, incoming: web.BaseRequest, length: int) -> bytes:
        """The request's body: what came in with its head (a keeper's whole batch, nearly always) is taken at once,
        the rest awaited within body_seconds (awaiting all of it cost a task and a timer per request)."""
        body = incoming.content.read_nowait(length) if length else b""
        if len(body) < length:
            body += await asyncio.wait_for(incoming.content.readexactly(length - len(body)), self.body_seconds)
        return body

    async def _stream(self, incoming: web.BaseRequest, status: int, answer: Stream) -> web.StreamResponse:
        from aiohttp import web

        response = web.StreamResponse(status=status, headers={"Content-Type": answer.content_type, **answer.headers})
        response.force_close()
        await response.prepare(incoming)
        chunks = iter(answer.chunks)
        self._streamed(+1)
        try:
            while True:  # to the iterator's end, after a stop too: its last chunks are what the page shows last
                chunk = await self._transport.blocking(next, chunks, None)
                if chunk is None:
                    break
                if chunk:
                    await response.write(chunk)
            # Held open at a stop until the client, having read its last state, closes it (stop() bounds the wait):
            # ended by us, the page would find nothing to read its last state from.
            while self.stopping.is_set() and incoming.transport is not None and not incoming.transport.is_closing():
                await asyncio.sleep(_LET_GO_POLL)
        except (ConnectionError, RuntimeError):
            pass  # the client left
        finally:
            self._streamed(-1)
            close = getattr(chunks, "close", None)
            if close is not None:
                try:
                    await self._transport.blocking(close)  # a generator's cleanup runs now, not at collection
                except ValueError:
                    pass  # still running in the pool (the server stops): it ends at its next chunk
        return response

    def _streamed(self, change: int) -> None:
        with self._streams:
            self._streaming += change
            self._streams.notify_all()


class Stopping(threading.Event):
    """Set when the server stops; `note` says why, to the clients of its streams."""

    note = ""


def _split(body: bytes) -> Tuple[str, List[Dict[str, Any]], List[Tuple[Dict[str, Any], str]]]:
    """A keeper's batch as (its spool id, records to store, [(record, why refused)]); HttpError 400 when it is
    unusable."""
    try:
        return records.split_batch(decode(body))
    except records.BadRecord as err:
        raise HttpError(400, str(err)) from None


_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))  # "0" a digit, " " the rest
_PAST_64_BITS = b"0" * 19  # a whole number of 19 digits or more may not fit 64 bits; one of 18 always does


def decode(body: bytes) -> Any:
    """A request's JSON body as records.loads reads it, with orjson where orjson reads it the same.

    orjson decodes a keeper's batch about 6x sooner than records.loads (whose
    number hooks run in Python for each number). It refuses what records.loads
    reads its own way (NaN, Infinity, 1e400, a lone surrogate, deep nesting):
    those bodies go to records.loads. It would read a whole number past 64
    bits as a float, where records.loads keeps it whole: a body with such a
    number goes to records.loads too (_may_pass_64_bits).
    """
    if orjson is None or _may_pass_64_bits(body):
        return records.loads(body)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return records.loads(body)


def _may_pass_64_bits(body: bytes) -> bool:
    """Whether the body may hold a whole number of 19 digits or more: a run of 19 digits not after a ".".

    A float's fraction often runs that long (0.0012345678901234567: one batch in
    seven of a keeper's random metrics), and both decoders read a fraction alike.
    """
    digits = body.translate(_DIGITS_AS_ZERO)
    start = digits.find(_PAST_64_BITS)
    while start >= 0:
        if start == 0 or body[start - 1] != 0x2E:  # not a fraction (an exponent too: kept whole by records.loads)
            return True
        end = digits.find(b" ", start)
        if end < 0:
            return False
        start = digits.find(_PAST_64_BITS, end)
    return False


def _json_parts(status: int, answer: Any) -> Tuple[bytes, Dict[str, str]]:
    """A JSON answer's body and headers, for aiohttp's response and the quick way's alike."""
    headers = {"Content-Type": "application/json"}
    if status == 503:
        headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return records.dumps(answer).encode(), headers


def _json(status: int, answer: Any, close: bool = False) -> web.Response:
    from aiohttp import web

    body, headers = _json_parts(status, answer)
    response = web.Response(body=body, status=status, headers=headers)
    if close:
        response.force_close()  # the body was not read: the connection cannot carry another request
    return response


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context for the certificate chain and key in these PEM files; UserError when they do not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise UserError(f"cannot load the TLS certificate {cert} with key {key}: {err}", "--tls-cert/--tls-key",
                        "give PEM files of a certificate or its chain, and its private key") from None
    return context


def tls_pair(cert: Optional[str], key: Optional[str]) -> Optional[Tuple[str, str]]:
    """(cert, key) from the two options, None when neither is given; UserError when only one is."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise UserError("TLS needs both a certificate and its key", "--tls-cert/--tls-key",
                        "give both, or neither for plain HTTP")
    return cert, key


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = ArgumentParser(prog="trialkit-manager-server", description="Serve an experiment's store to keepers.")
    parser.add_argument("--experiment-dir", required=True, help="the experiment dir (holds trialkit.db)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    parser.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (chain); needs --tls-key")
    parser.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    try:
        opts = parser.parse_args(sys.argv[1:] if argv is None else argv)
        server = ManagerServer(Store.in_dir(opts.experiment_dir), opts.host, opts.port,
                               tls=tls_pair(opts.tls_cert, opts.tls_key))
    except UserError as err:
        report_and_exit(parser.prog, err)
    server.serve_until_signalled(lambda: print(f"listening on {server.url}", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

