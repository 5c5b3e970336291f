"""The manager's connections: HTTP/1.1 served on one asyncio loop by aiohttp's server.

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
import re
import socket
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Optional, Tuple

from aiohttp import web

Serve = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
BACKLOG = 1024  # the kernel's queue of connections not yet accepted: a burst of keepers is not dropped
_HEAD_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"^content-length:[ \t]*(\d+)[ \t]*\r$", re.I | re.M)
# After an answer given before its body was read (a refusal, a 408), what the client still sends is
# read and dropped this long before the connection closes: closed at once, with bytes unread, it would
# be reset, and the client could lose the answer.
LINGER_SECONDS = 2.0
_HEAD_LIMIT = 1 << 20  # past this, aiohttp has refused the head already (its line and header bounds)
REPORT_SECONDS = 60.0  # bad requests are said at most once in this long (BadRequests)


class Transport:
    def __init__(self, host: str, port: int, serve: Serve, *, tls: Optional[ssl.SSLContext], max_connections: int,
                 header_seconds: float, idle_seconds: float):
        self._serve = serve
        self._tls = tls
        self.max_connections = max_connections
        self.header_seconds = header_seconds
        self._idle_seconds = idle_seconds
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.socket.listen(BACKLOG)
        self.socket.setblocking(False)
        self.address: Tuple[Any, ...] = self.socket.getsockname()
        self._pool = ThreadPoolExecutor(max_workers=max_connections, thread_name_prefix="trialkit-manager")
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._web: Optional[web.Server] = None
        self.ready = threading.Event()
        self.bad_requests = BadRequests()

    @property
    def connections(self) -> int:
        return len(self._web.connections) if self._web is not None else 0

    async def blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) in the pool, for what may wait (a store query, an action, a stream's next chunk)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def run(self) -> None:
        """Serve in this thread until stop(); a KeyboardInterrupt (Ctrl-C) ends it too and goes on up."""
        loop = asyncio.new_event_loop()
        self._loop = loop
        server = None
        try:
            server = loop.run_until_complete(self._listen())
            self.ready.set()
            loop.run_forever()
        finally:
            self.ready.set()  # a start() that waits must not wait for a server that failed
            if server is not None:
                server.close()
            if self._web is not None:
                loop.run_until_complete(self._web.shutdown(1.0))
            loop.close()

    async def _listen(self) -> asyncio.AbstractServer:
        self._web = web.Server(self._serve, access_log=None, keepalive_timeout=self._idle_seconds,
                               lingering_time=LINGER_SECONDS, logger=self.bad_requests)
        return await asyncio.get_running_loop().create_server(
            self._connection, sock=self.socket, ssl=self._tls,
            ssl_handshake_timeout=self.header_seconds if self._tls is not None else None)

    def _connection(self) -> asyncio.Protocol:
        if self.connections >= self.max_connections:
            return _Refused()
        assert self._web is not None and self._loop is not None
        return _HeadDeadline(self._web(), self._loop, self.header_seconds)

    def stop(self) -> None:
        """From another thread: end run()."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:
                pass  # closed meanwhile

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.socket.close()


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


class _HeadDeadline(asyncio.Protocol):
    """aiohttp's protocol for one connection, cut off when a request's head is not in within its time.

    It follows the requests' framing only as far as the deadline needs: where a
    head ends, and how long the body after it is (Content-Length; a body
    without one is refused with 411 and its connection closed).
    """

    def __init__(self, inner: asyncio.Protocol, loop: asyncio.AbstractEventLoop, seconds: float):
        self._inner = inner
        self._loop = loop
        self._seconds = seconds
        self._transport: Optional[asyncio.BaseTransport] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._head = b""
        self._body_left = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._follow(data)
        self._inner.data_received(data)

    def _follow(self, data: bytes) -> None:
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
                if self._timer is None and self._transport is not None:
                    self._timer = self._loop.call_later(self._seconds, self._transport.close)
                return
            self._cancel()
            head, data = self._head[:end + len(_HEAD_END)], self._head[end + len(_HEAD_END):]
            self._head = b""
            length = _CONTENT_LENGTH.search(head)
            self._body_left = int(length.group(1)) if length else 0

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def eof_received(self) -> Optional[bool]:
        return self._inner.eof_received()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._cancel()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
