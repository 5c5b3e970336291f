"""The vocabulary of the manager's routes: a request, its answers, its refusals and the router that maps paths.

    router = Router()
    router.add("GET", "/api/v1/trials/<trial_id>/parameters", handler, check)
    handler, check, params = router.resolve("GET", path)       # HttpError 404/405 when none fits

A handler takes a Request and returns (status, JSON-able body), a Raw answer
or a Stream, or raises HttpError(status, reason). The server
(trialkit/manager/server.py) serves routes; the modules that add routes of
their own (archives.py, replica_logs.py, the control plane's admin routes,
the page) and the action table import these names from here, not from the
server: nothing below it needs aiohttp, and no module imports the server
that imports it back.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple
from urllib.parse import unquote


class HttpError(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _whole(text: str) -> int:
    """A JSON body's whole number; one past Python's digits for int() said for a user (int()'s own message
    advises sys.set_int_max_str_digits)."""
    digits = len(text.lstrip("-"))
    if digits > sys.get_int_max_str_digits():
        raise ValueError(f"a number in it has {digits:,} digits, more than the {sys.get_int_max_str_digits():,} "
                         "a request may hold")
    return int(text)


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
            return json.loads(self.body, parse_int=_whole)  # NaN and Infinity are read, as keepers send them
        except (ValueError, RecursionError) as err:
            raise HttpError(400, f"the body is not JSON: {err}") from None

    def bearer(self) -> Optional[str]:
        """The bearer token; None without one, or for one no token is (tokens are ASCII: a byte past it
        reaches here as a surrogate, which no hash or comparison takes)."""
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        token = token.strip()
        return token if scheme.lower() == "bearer" and token and token.isascii() else None


Handler = Callable[[Request], Tuple[int, Any]]
Check = Callable[[Request], None]


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
        self._routes: List[Tuple[str, "re.Pattern[str]", Handler, Optional[Check]]] = []

    def add(self, method: str, pattern: str, handler: Handler, check: Optional[Check] = None) -> None:
        """`check`, if given, sees the request before its body is read and refuses it by raising HttpError."""
        regex = re.sub(r"<(\w+)>", r"(?P<\1>[^/]+)", re.escape(pattern))
        self._routes.append((method.upper(), re.compile(f"^{regex}$"), handler, check))

    def resolve(self, method: str, path: str) -> Tuple[Handler, Optional[Check], Dict[str, str]]:
        allowed = []
        for route_method, regex, handler, check in self._routes:
            match = regex.match(path)
            if match:
                if route_method == method:
                    return handler, check, {k: unquote(v) for k, v in match.groupdict().items()}
                allowed.append(route_method)
        if allowed:
            raise HttpError(405, f"{method} is not allowed here (allowed: {', '.join(allowed)})")
        raise HttpError(404, f"no such route: {path}")
