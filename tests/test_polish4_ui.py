"""`trialkit ui ID` of an experiment whose run still goes serves no second, read-only copy on a port and token of
its own: it prints the live page's address (the one the run printed, from its manager.json) in one line and
exits 0. A real `trialkit run` and a real `trialkit ui` against it.
"""
from __future__ import annotations

import signal

import pytest
import requests

from experiment_util import cli, experiment, experiment_id, start_cli
from harness import signal_and_wait
from test_faces import SLOW

pytestmark = pytest.mark.usefixtures("home")  # conftest's: TRIALKIT_HOME in the test's tmp_path


def test_ui_of_a_running_experiment_prints_the_live_pages_address_and_exits(tmp_path):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, SLOW, maxTrialNumber=1)
    run = start_cli("run", config)
    try:
        exp = experiment_id(run.stdout.readline())
        url = None
        while url is None:
            line = run.stdout.readline()
            assert line, "the run ended before it printed its page"
            url = line.split()[1] if line.startswith("page: http") else None

        ui = cli("ui", exp, timeout=60)  # serving a copy, it would not end
        assert ui.returncode == 0, ui.stderr
        assert ui.stdout.splitlines() == [f"experiment {exp} is running: its run serves the live page at {url}"]
        assert requests.get(url, timeout=10).status_code == 200
        assert cli("experiment", "stop", exp).returncode == 0
        run.communicate(timeout=60)
    finally:
        if run.poll() is None:  # a failed assertion: Ctrl-C, so that its keeper and trial end with it
            signal_and_wait(run, signal.SIGINT, 60)
