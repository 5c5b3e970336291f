"""The page goes back to the port its run printed (`trialkit ui ID`, `trialkit experiment resume ID`); where
another process holds that port now, it serves on a free one and says so in one line first: the port, who
holds it, the address it serves at instead, and the option that picks one. A real run, a real socket holding
its port, the real commands.
"""
from __future__ import annotations

import os
import signal
import socket
from urllib.parse import urlsplit

import psutil
import pytest
import requests

from experiment_util import cli, experiment, experiment_id, reported, start_cli
from harness import signal_and_wait, wait_until

HOLD = """
import time, trialkit
trialkit.get_next_parameter()
trialkit.report_intermediate_result(1)
while True:
    time.sleep(1)
"""


def page_line(proc) -> str:
    """The page address a starting run or resume prints."""
    for line in proc.stdout:
        if line.startswith("page: http"):
            return line.split()[1]
    raise AssertionError("no page line")


def answers(url: str) -> int:
    parts = urlsplit(url)
    return requests.get(f"{parts.scheme}://{parts.netloc}/", params={"token": parts.query.removeprefix("token=")},
                        timeout=10).status_code


@pytest.fixture
def interrupted(tmp_path, home):
    """An experiment whose run was interrupted with its first trial running, a second to go: (its id, the port its
    run's page had)."""
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2]}}, HOLD, maxTrialNumber=2,
                        trialConcurrency=1, trialGraceSeconds=5)
    run = start_cli("run", config)
    try:
        exp = experiment_id(run.stdout.readline())
        port = urlsplit(page_line(run)).port
        wait_until(lambda: reported(home, f"{exp}-00000") > 0, 60, "the trial to report")
    finally:
        signal_and_wait(run, signal.SIGINT, 60)
    return exp, port


@pytest.fixture
def held(interrupted):
    """That port, held by a listening socket of this test's process; the line naming who holds it."""
    exp, port = interrupted
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        yield exp, port, f"port {port} is taken (by {psutil.Process().name()}, pid {os.getpid()})"


def test_ui_on_a_taken_port_says_where_it_serves_instead(held):
    exp, port, taken = held
    ui = start_cli("ui", exp)
    try:
        moved = ui.stdout.readline().strip()
        address = ui.stdout.readline().strip()
        assert address.startswith("trialkit ui: http://127.0.0.1:"), (moved, address)
        url = address.split()[-1]
        now = urlsplit(url).port
        assert now != port
        assert moved == f"{taken}; serving at http://127.0.0.1:{now} instead; --port N to choose"
        assert ui.stdout.readline().strip() == "read-only, until Ctrl-C"  # not "the address its run printed"
        assert answers(url) == 200
    finally:
        assert signal_and_wait(ui, signal.SIGINT, 30) == 0


def test_a_resume_on_a_taken_port_says_where_it_serves_instead(held):
    exp, port, taken = held
    resumed = start_cli("experiment", "resume", exp)
    try:
        assert resumed.stdout.readline().strip() == f"resumed experiment {exp}", resumed.stderr.read()
        moved = resumed.stdout.readline().strip()
        manager = resumed.stdout.readline().split()[1]
        now = urlsplit(manager).port
        assert now != port
        assert moved == f"{taken}; serving at http://127.0.0.1:{now} instead; --port N to choose"
        url = page_line(resumed)
        assert urlsplit(url).port == now and answers(url) == 200
    finally:
        signal_and_wait(resumed, signal.SIGINT, 60)


def test_a_detached_resume_on_a_taken_port_says_it_too(held):
    exp, port, taken = held
    done = cli("experiment", "resume", exp, "--detach")
    try:
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == f"resumed experiment {exp}", lines
        manager = lines[2].split()[1]
        now = urlsplit(manager).port
        assert now != port
        assert lines[1] == f"{taken}; serving at http://127.0.0.1:{now} instead; --port N to choose"
    finally:
        assert cli("experiment", "stop", exp).returncode == 0


def test_a_resume_refused_its_port_leaves_the_experiment_as_it_was(held):
    # Asked for by --port, a taken port is refused in one line; the store is not touched before the manager
    # listens (a refused resume had left a STOPPED experiment INTERRUPTED, its trials WAITING).
    exp, port, _ = held
    before = cli("experiment", "show", exp).stdout, cli("trial", "list", exp).stdout
    done = cli("experiment", "resume", exp, "--port", port)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert (cli("experiment", "show", exp).stdout, cli("trial", "list", exp).stdout) == before
