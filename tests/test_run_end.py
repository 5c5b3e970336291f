"""The run's end, as a tab open on its page sees it (issue 40.3).

When `trialkit run` ends, its manager records the experiment's end while it still serves, its events stream
sends the last change and a `closing` event with why the server goes, and holds the stream until the page
has read its last state (trialkit/manager/server.py, trialkit/web/events.py): a real headless Chromium on a
real run shows the end without a reload. The stream's side is also tested over plain HTTP, with a client that
reads and leaves and one that stalls (the run's exit must not wait on it past CLOSING_SECONDS).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from typing import Iterator, List, Tuple
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from experiment_util import gated_run
from harness import signal_and_wait, wait_until
from trialkit.manager import server as server_module
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
from trialkit.web import install, page_url
from web_util import CHROMEDRIVER, CHROMIUM, Browser, fill, open_the_run_and_end_it

ADMIN = "end-admin-token"


def page_token(admin_token: str) -> str:
    """The page's token, from the URL a run prints."""
    return parse_qs(urlsplit(page_url("http://x", admin_token)).query)["token"][0]


@pytest.fixture
def served(tmp_path) -> Iterator[Tuple[ManagerServer, Store, str]]:
    """A manager with the page, on a store of two trials: (server, store, the events route's URL)."""
    store = Store.in_dir(tmp_path / "exp")
    fill(store, "endexp", trials=2, steps=2)
    server = ManagerServer(store).start()
    install(server, store, admin_token=ADMIN, read_only=False)
    try:
        yield server, store, f"{server.url}/api/ui/events"
    finally:
        server.stop()
        store.close()


def _events(response: requests.Response) -> Iterator[Tuple[str, str]]:
    """(event, data) of a server-sent events answer, as they come."""
    event, data = "", ""
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: "):
            data = line[len("data: "):]
        elif line == "" and event:
            yield event, data
            event, data = "", ""


def test_the_stream_ends_with_the_last_change_and_why_and_is_held_until_its_client_leaves(served, monkeypatch):
    server, store, url = served
    monkeypatch.setattr(server_module, "CLOSING_SECONDS", 60.0)  # a stop that returns sooner was let go
    stopped: List[float] = []
    stopper = threading.Thread(target=lambda: (server.stop("the run ended; see you"), stopped.append(time.monotonic())))
    token = {"Authorization": f"Bearer {page_token(ADMIN)}"}
    assert requests.get(url.replace("/events", "/experiments"), headers=token, timeout=30).ok  # as the page reads first
    with requests.get(url, headers=token, stream=True, timeout=30) as answer:
        assert answer.status_code == 200
        events = _events(answer)
        assert next(events)[0] == "hello"
        store.set_experiment_status("endexp", "DONE")  # as the run's end records it, then stops its manager
        stopper.start()
        seen = []
        for event, data in events:
            seen.append(event)
            if event == "closing":
                assert json.loads(data) == {"note": "the run ended; see you"}
                break
        assert seen == ["change", "closing"]  # the end status first, then why the server goes
        time.sleep(0.5)
        assert stopper.is_alive() and not stopped  # held open: the page reads its last state meanwhile
        left = time.monotonic()
    stopper.join(30)
    assert stopped and stopped[0] - left < 20, "stop() waited for CLOSING_SECONDS though the client had left"
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=5)


def test_a_stalled_client_holds_the_stop_no_longer_than_closing_seconds(served):
    server, _, url = served
    host, port = server.url.rsplit("/", 1)[1].rsplit(":", 1)
    stalled = socket.create_connection((host, int(port)))  # asks for the stream and never reads or closes
    try:
        stalled.sendall(f"GET /api/ui/events HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {page_token(ADMIN)}"
                        "\r\n\r\n".encode())
        wait_until(lambda: server._streaming == 1, 30, "the stream to open")
        stopper = threading.Thread(target=server.stop)
        began = time.monotonic()
        stopper.start()
        stopper.join(server_module.CLOSING_SECONDS + 20)
        assert not stopper.is_alive(), "stop() hung on a client that does not read"
        assert time.monotonic() - began >= server_module.CLOSING_SECONDS - 0.5  # it did wait for the client
    finally:
        stalled.close()


needs_chromium = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                                    reason="needs Debian's chromium and chromium-driver (bootstrap.sh installs them)")


@needs_chromium
def test_a_tab_open_when_the_run_ends_shows_the_end_without_a_reload(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    browser = Browser()
    driver = browser.driver
    go, proc = gated_run(tmp_path)
    try:
        exp, url = open_the_run_and_end_it(driver, go, proc)
        # Read at once: all of it was shown before the run's server went (nothing answers now).
        assert driver.execute_script("return window.sameDocument === true")  # no reload
        assert driver.execute_script("return document.querySelector('h1 .badge').textContent") == "DONE"
        counts = driver.execute_script(
            "return [...document.querySelectorAll('#counts .card h3, #counts .card .big')].map(e => e.textContent)")
        assert counts == ["SUCCEEDED", "2"], counts
        best = driver.execute_script(
            "return [...document.querySelectorAll('.cards .card .big')].map(e => e.textContent)")
        assert best[3] == "0.75", best
        mode = driver.execute_script(
            "const m = document.getElementById('mode'); return m.hidden ? null : m.textContent")
        assert mode == f"read-only: the run ended; `trialkit ui {exp}` serves this page again", mode
        assert driver.execute_script("return document.getElementById('live').hidden") is True
        assert not re.search(r"\blive\b", driver.execute_script("return document.body.innerText"), re.I)
        assert driver.execute_script("return document.getElementById('problem').hidden") is True
    finally:
        if proc.poll() is None:
            signal_and_wait(proc, signal.SIGINT, 60)
        proc.stdout.close()
        proc.stderr.close()
        left = browser.close()
    assert not left, f"browser processes left running: {left}"
