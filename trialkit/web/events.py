"""Server-sent events: one `change` event whenever any store the page reads was written."""
from __future__ import annotations

import threading
import time
from typing import Iterator

from trialkit.web.catalog import Catalog

POLL_SECONDS = 0.5  # how stale the page may be; a store's version costs one PRAGMA to read
HEARTBEAT_SECONDS = 15.0  # a comment line now and then finds clients that went away


def changes(catalog: Catalog, stopping: threading.Event, poll: float = POLL_SECONDS,
            heartbeat: float = HEARTBEAT_SECONDS) -> Iterator[bytes]:
    seen = catalog.version()
    yield b"event: hello\ndata: {}\n\n"
    beat = time.monotonic()
    while not stopping.wait(poll):
        now = catalog.version()
        if now != seen:
            seen = now
            yield b"event: change\ndata: {}\n\n"
        elif time.monotonic() - beat > heartbeat:
            beat = time.monotonic()
            yield b": ping\n\n"
        else:
            yield b""  # lets the server see a stop between polls
