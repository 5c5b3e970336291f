"""The manager's connections: HTTP/1.1 served on one asyncio loop, the keepers' batches by a quick way of
its own (_Connection), everything else by aiohttp's server.

One loop, not a thread per connection: under a thousand keepers the threads
fought for the GIL, and the store's lock went to whichever won it, so that a
batch waited up to a second for a lock held 0.2 ms (p99 acknowledgement
42-674 ms, under 100 ms in 2 runs of 11; on one loop 13-62 ms,
bench/bench_manager.py). Handlers that are
quick (the keepers' routes) run on the loop; the rest, and the chunks of a
stream, run in a pool of threads (`blocking`).

The bounds are kept here: at most `max_connections` connections (one more is
closed at once; keepers retry), a request's line and headers within
`header_seconds` of its first byte (slowloris; aiohttp bounds their size,
not their time), the TLS handshake within the same, and an idle keep-alive
connection dropped after `idle_seconds`. A request aiohttp refuses before
any handler (a bad line, a head past its bounds) is counted by `BadRequests`
and said in one line at most once a minute, not as a traceback per request.
"""
from __future__ import annotations

import asyncio
import email.utils
import functools
import http
import re
import socket
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Dict, Optional, Set, Tuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from aiohttp import web

Serve = Callable[["web.BaseRequest"], Awaitable["web.StreamResponse"]]
# The quick way's answer: status, body, headers (Content-Length, Date and Server are added).
Reply = Callable[[int, bytes, Dict[str, str]], None]
# A request the quick way serves: take(body, reply), with reply called once, later or at once.
Take = Callable[[bytes, Reply], None]
# Whether the quick way serves a request: quick(method, target, headers by lowercase name) -> Take, or None
# to hand it to aiohttp (which also gives every refusal).
Quick = Callable[[str, str, Dict[str, str]], Optional[Take]]
BACKLOG = 1024  # the kernel's queue of connections not yet accepted: a burst of keepers is not dropped
_HEAD_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"^content-length:[ \t]*(\d+)[ \t]*\r$", re.I | re.M)
# After an answer given before its body was read (a refusal, a 408), what the client still sends is
# read and dropped this long before the connection closes: closed at once, with bytes unread, it would
# be reset, and the client could lose the answer.
LINGER_SECONDS = 2.0
_HEAD_LIMIT = 1 << 20  # past this, aiohttp has refused the head already (its line and header bounds)
_QUICK_HEAD_LIMIT = 16 << 10  # a keeper's head is about 200 bytes: one longer goes to aiohttp and its bounds
_QUICK_BUFFER_LIMIT = 1 << 20  # read ahead of the request being answered, at most (then reading pauses)
READ_SIZE = 256 << 10  # the most one read takes, as asyncio's own reads
REPORT_SECONDS = 60.0  # bad requests are said at most once in this long (BadRequests)


class Transport:
    def __init__(self, host: str, port: int, serve: Serve, *, quick: Quick, tls: Optional[ssl.SSLContext],
                 max_connections: int, header_seconds: float, body_seconds: float, idle_seconds: float,
                 load_aiohttp_after: Optional[float] = None):
        self._serve = serve
        self.quick = quick
        self._tls = tls
        self.max_connections = max_connections
        self.header_seconds = header_seconds
        self.body_seconds = body_seconds
        self.idle_seconds = idle_seconds
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.socket.listen(BACKLOG)
        self.socket.setblocking(False)
        self.address: Tuple[Any, ...] = self.socket.getsockname()
        self._pool = ThreadPoolExecutor(max_workers=max_connections, thread_name_prefix="trialkit-manager")
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self._web: Optional["web.Server"] = None
        # aiohttp (~0.1 s of imports) serves all but the keepers' batches, which the quick way serves from the
        # start. It loads `load_aiohttp_after` seconds on, off the start's path: a control plane starts its first
        # trials meanwhile (a thread loading it at once only shared the GIL with that start, and saved nothing).
        # A request for it before then loads it at once. None: it loads here.
        self._closing = threading.Event()
        self._aiohttp = threading.Thread(target=self._load_aiohttp, args=(load_aiohttp_after or 0.0,),
                                         name="trialkit-manager-aiohttp", daemon=True)
        if load_aiohttp_after is None:
            self._closing.set()
            from aiohttp import web  # noqa: F401
        self._aiohttp.start()
        self.open: Set[_Connection] = set()
        # Every connection reads into this one buffer, copied out at once. asyncio's own reads made a
        # 256 KiB bytes object for each, which glibc maps and unmaps: three system calls and fresh
        # pages a read, a tenth of the manager's time under 1,000 keepers (strace -c, py-spy).
        self.read_buffer = memoryview(bytearray(READ_SIZE))
        self.ready = threading.Event()
        self.bad_requests = BadRequests()

    @property
    def connections(self) -> int:
        return len(self.open)

    async def blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) in the pool, for what may wait (a store query, an action, a stream's next chunk)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def run(self) -> None:
        """Serve in this thread until stop()."""
        loop = asyncio.new_event_loop()
        self.loop = loop
        server = None
        try:
            server = loop.run_until_complete(self._listen())
            self.ready.set()
            loop.run_forever()
        finally:
            self.ready.set()  # a start() that waits must not wait for a server that failed
            if server is not None:
                server.close()
            for connection in list(self.open):
                connection.close()
            if self._web is not None:
                loop.run_until_complete(self._web.shutdown(1.0))
            # What is left (a connection lingering to read an unread body, 2 s at most) is cancelled and let end,
            # as asyncio.run ends its tasks: a task dropped pending is a warning at the interpreter's exit.
            left = asyncio.all_tasks(loop)
            if left:
                for task in left:
                    task.cancel()
                loop.run_until_complete(_ended(left))
            loop.close()

    async def _listen(self) -> asyncio.AbstractServer:
        return await asyncio.get_running_loop().create_server(
            self._connection, sock=self.socket, ssl=self._tls,
            ssl_handshake_timeout=self.header_seconds if self._tls is not None else None)

    def _connection(self) -> asyncio.Protocol:
        if self.connections >= self.max_connections:
            return _Refused()
        return _Connection(self)

    def _load_aiohttp(self, after: float) -> None:
        if not self._closing.wait(after):
            from aiohttp import web  # noqa: F401

    def web(self) -> asyncio.Protocol:
        """aiohttp's protocol for a connection handed to it (on the loop; the first may wait for aiohttp to load)."""
        if self._web is None:
            from aiohttp import web

            self._web = web.Server(self._serve, access_log=None, keepalive_timeout=self.idle_seconds,
                                   lingering_time=LINGER_SECONDS, logger=self.bad_requests)
        return self._web()

    def stop(self) -> None:
        """From another thread: end run()."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:
                pass  # closed meanwhile

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.socket.close()
        self._closing.set()
        self._aiohttp.join()  # a process does not end mid-import


async def _ended(tasks: Set["asyncio.Task[Any]"]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


class BadRequests:
    """aiohttp's server logger. Each request it refuses unparsed (a bad request line, a head past its bounds,
    bytes that are not HTTP) or whose serving failed is counted, and said in one line at most once every
    REPORT_SECONDS, never as a traceback: any local process could otherwise flood the experiment's terminal."""

    def __init__(self) -> None:
        self.count = 0
        self._said_at: Optional[float] = None

    def debug(self, *args: Any, **options: Any) -> None:
        pass  # aiohttp's notes on clients that left early

    def exception(self, message: str, *args: Any, exc_info: Any = None, **options: Any) -> None:
        self.count += 1
        now = time.monotonic()
        if self._said_at is not None and now - self._said_at < REPORT_SECONDS:
            return
        self._said_at = now
        last = " ".join(str(exc_info if isinstance(exc_info, BaseException) else message % args).split())
        print(f"trialkit-manager: {self.count} bad request(s) refused so far, said at most once a minute "
              f"(the last: {last[:160]})", file=sys.stderr, flush=True)

    error = warning = exception


class _Refused(asyncio.Protocol):
    """A connection over the bound: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Connection(asyncio.BufferedProtocol):
    """One client's connection: the keepers' requests served here, the rest handed to aiohttp's protocol.

    A connection starts quick: each request that comes whole (head and body)
    and that `quick` takes is answered here, one at a time, in order, with a
    head written in one piece. The first request it does not take (another
    route, a refused token, a head past the plain form: see _quick_head) and
    every request after it go to aiohttp with every byte not yet served, so
    whatever is unusual gets aiohttp's full handling. A keeper's connection
    carries only its batches and never leaves the quick way: aiohttp's
    request objects, task and response writer were about a seventh of what
    a batch cost the manager (bench/bench_manager.py, py-spy).

    The deadlines hold on both ways: a head must be in within `header_seconds`
    of its first bytes, a quick body within `body_seconds` of its head (then
    the request goes to aiohttp, which answers 408 when the rest does not
    come), and a quick connection idle for `idle_seconds` is closed (aiohttp
    keeps its own connections' idle time).
    """

    def __init__(self, owner: "Transport"):
        self._owner = owner
        self._loop = owner.loop
        self._transport: Optional[asyncio.Transport] = None
        self._inner: Optional[asyncio.Protocol] = None  # aiohttp's protocol, once the connection went to it
        self._buffer = bytearray()  # quick: bytes not yet served
        self._searched = 0  # quick: how far the buffer holds no head's end
        self._busy = False  # quick: a request is being answered
        self._serving = False  # quick: _serve_buffer is running (an answer given at once must not call it again)
        self._taken: Optional[Tuple[int, Take]] = None  # quick: the buffered head's request size and taker
        self._paused = False  # writing: the client does not read its answers
        self._held = False  # quick: reading paused, while a request is answered and the buffer holds plenty more
        self._deadline: Optional[asyncio.TimerHandle] = None  # a head's or a body's
        self._idle: Optional[asyncio.TimerHandle] = None
        self._last = 0.0  # quick: when the connection last did something
        self._head = b""  # aiohttp's: the head being followed, for its deadline
        self._body_left = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._owner.open.add(self)
        self._last = self._loop.time()
        self._idle = self._loop.call_later(self._owner.idle_seconds, self._idle_check)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._owner.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self._owner.read_buffer[:nbytes]))

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._follow(data)
            self._inner.data_received(data)
            return
        self._buffer += data  # a bytearray: a body in many reads is not copied again at each
        self._last = self._loop.time()
        if not self._busy:
            self._serve_buffer()
        elif len(self._buffer) > _QUICK_BUFFER_LIMIT and self._transport is not None:
            # One request is answered at a time: a client that sends faster waits in TCP, not in our memory.
            self._transport.pause_reading()
            self._held = True

    # -- the quick way ------------------------------------------------------------------
    def _serve_buffer(self) -> None:
        """Answer the whole requests in the buffer that `quick` takes, one at a time; hand over at the first other."""
        self._serving = True
        try:
            self._serve_requests()
        finally:
            self._serving = False

    def _serve_requests(self) -> None:
        while self._buffer and not self._busy and self._inner is None:
            end = self._buffer.find(_HEAD_END, self._searched)
            if end < 0:  # a head in many reads: each byte searched once
                self._searched = max(0, len(self._buffer) - len(_HEAD_END) + 1)
                if len(self._buffer) > _QUICK_HEAD_LIMIT:
                    self._hand_over()
                elif self._deadline is None:
                    self._deadline = self._loop.call_later(self._owner.header_seconds, self._close)
                return
            if self._taken is None:
                head = _quick_head(bytes(self._buffer[:end]))
                take = self._owner.quick(*head[:3]) if head is not None else None
                if head is None or take is None:
                    self._hand_over()
                    return
                self._taken = (end + len(_HEAD_END) + head[3], take)
            size, take = self._taken
            if len(self._buffer) < size:  # the body comes in later reads
                if self._deadline is None:
                    self._deadline = self._loop.call_later(self._owner.body_seconds, self._hand_over)
                return
            self._cancel_deadline()
            body = bytes(self._buffer[end + len(_HEAD_END):size])
            del self._buffer[:size]
            self._searched = 0
            self._taken = None
            self._busy = True
            take(body, self._reply)

    def _reply(self, status: int, body: bytes, headers: Dict[str, str]) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return  # the client left; what it sent is stored all the same, and acked on a resend
        transport.write(_response_head(status, len(body), headers) + body)
        self._busy = False
        self._last = self._loop.time()
        if self._buffer and not self._serving:  # an answer given inside _serve_buffer: its loop goes on
            self._serve_buffer()
        if self._held and not (self._busy and len(self._buffer) > _QUICK_BUFFER_LIMIT):
            self._held = False
            transport.resume_reading()

    def _hand_over(self) -> None:
        """From now on aiohttp serves the connection, from the first byte not yet served."""
        self._cancel_deadline()
        self._cancel_idle()
        self._taken = None
        if self._transport is None or self._transport.is_closing():
            return
        if self._held:  # aiohttp keeps its own bounds on what it reads ahead
            self._held = False
            self._transport.resume_reading()
        self._inner = self._owner.web()
        self._inner.connection_made(self._transport)
        if self._paused:
            self._inner.pause_writing()
        data = bytes(self._buffer)
        self._buffer.clear()
        if data:
            self.data_received(data)

    def _idle_check(self) -> None:
        """One timer a connection, set again for what is left (not one a request): closes it when idle too long."""
        self._idle = None
        if self._inner is not None:
            return
        left = self._last + self._owner.idle_seconds - self._loop.time()
        if left <= 0 and not self._busy and not self._buffer:
            self._close()
        else:
            self._idle = self._loop.call_later(max(left, 1.0), self._idle_check)

    # -- aiohttp's way: its head deadline -------------------------------------------------------
    def _follow(self, data: bytes) -> None:
        """Follow the requests' framing as far as the head deadline needs: where a head ends, how long its body is."""
        while data:
            if self._body_left:
                used = min(self._body_left, len(data))
                self._body_left -= used
                data = data[used:]
                continue
            if len(self._head) > _HEAD_LIMIT:
                return
            searched = max(0, len(self._head) - len(_HEAD_END) + 1)
            self._head += data
            end = self._head.find(_HEAD_END, searched)
            if end < 0:
                # The clock starts with the head's first bytes; a head that came whole in one read (a
                # keeper's, nearly always) needs none, and a timer per request was 2% of the manager's CPU.
                if self._deadline is None:
                    self._deadline = self._loop.call_later(self._owner.header_seconds, self._close)
                return
            self._cancel_deadline()
            head, data = self._head[:end + len(_HEAD_END)], self._head[end + len(_HEAD_END):]
            self._head = b""
            length = _CONTENT_LENGTH.search(head)
            self._body_left = int(length.group(1)) if length else 0

    # -- both ------------------------------------------------------------------------------
    def _close(self) -> None:
        self._deadline = None
        if self._transport is not None:
            self._transport.close()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def eof_received(self) -> Optional[bool]:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._cancel_deadline()
        self._cancel_idle()
        self._owner.open.discard(self)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._paused = True
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._paused = False  # writing: the client does not read its answers
        self._held = False  # quick: reading paused, while a request is answered and the buffer holds plenty more
        if self._inner is not None:
            self._inner.resume_writing()

    def close(self) -> None:
        """At the server's stop: a quick connection is closed here (aiohttp shuts its own down)."""
        if self._inner is None:
            self._close()


_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a method or a header's name (RFC 9110's token)
_FRAMING = ("transfer-encoding", "expect", "upgrade")  # heads with these go to aiohttp


def _quick_head(head: bytes) -> Optional[Tuple[str, str, Dict[str, str], int]]:
    """(method, target, headers by lowercase name, body length) of a request head in the plain form the quick way
    serves (HTTP/1.1, one Content-Length, each header once, no framing but Content-Length, keep-alive); None for
    any other, which aiohttp then serves or refuses as it always did."""
    if head.count(b"\r") != head.count(b"\n") or head.count(b"\r\n") != head.count(b"\n") or b"\0" in head:
        return None  # a lone CR or LF, or a NUL: not for a hand-made parser to judge
    line, *fields = head.split(b"\r\n")
    parts = line.split(b" ")
    if (len(parts) != 3 or parts[2] != b"HTTP/1.1" or not _TOKEN.fullmatch(parts[0]) or not parts[1].startswith(b"/")
            or not parts[1].isascii()):
        return None
    headers: Dict[str, str] = {}
    for field in fields:
        name, colon, value = field.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            return None
        key = name.decode("ascii").lower()
        if key in headers:
            return None
        headers[key] = value.strip(b" \t").decode("latin-1")
    length = headers.get("content-length", "")
    if (not (length.isascii() and length.isdigit()) or any(key in headers for key in _FRAMING)
            or headers.get("connection", "keep-alive").lower() != "keep-alive"):
        return None
    return parts[0].decode("ascii"), parts[1].decode("ascii"), headers, int(length)


def _response_head(status: int, length: int, headers: Dict[str, str]) -> bytes:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (f"HTTP/1.1 {status} {_phrase(status)}\r\n{lines}Content-Length: {length}\r\n"
            f"Date: {_date()}\r\nServer: trialkit\r\n\r\n").encode("latin-1")


@functools.lru_cache(maxsize=None)
def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


_dates: Dict[int, str] = {}


def _date() -> str:
    """The Date header's text, made once a second."""
    now = int(time.time())
    text = _dates.get(now)
    if text is None:
        _dates.clear()
        text = _dates[now] = email.utils.formatdate(now, usegmt=True)
    return text
