"""Server-sent events: one `change` event whenever any store the page reads was written, and a `closing` event
when the server stops (`{"note": why}`: the run ended), after the last change, so that a tab open then shows the
end, then what it is left with."""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Iterator

from trialkit.web.catalog import Catalog

if TYPE_CHECKING:
    from trialkit.manager.server import Stopping

POLL_SECONDS = 0.5  # how stale the page may be; a store's version costs one PRAGMA to read
HEARTBEAT_SECONDS = 15.0  # a comment line now and then finds clients that went away
CHANGE = b"event: change\ndata: {}\n\n"


def changes(catalog: Catalog, stopping: "Stopping", poll: float = POLL_SECONDS,
            heartbeat: float = HEARTBEAT_SECONDS) -> Iterator[bytes]:
    seen = catalog.version()
    yield b"event: hello\ndata: {}\n\n"
    beat = time.monotonic()
    while not stopping.wait(poll):
        now = catalog.version()
        if now != seen:
            seen = now
            yield CHANGE
        elif time.monotonic() - beat > heartbeat:
            beat = time.monotonic()
            yield b": ping\n\n"
        else:
            yield b""  # lets the server see a stop between polls
    if catalog.version() != seen:  # what the stop wrote last (the run's end status)
        yield CHANGE
    yield b"event: closing\ndata: " + json.dumps({"note": stopping.note}).encode() + b"\n\n"
