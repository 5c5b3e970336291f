"""The page's routes over plain HTTP, no browser: the token and cross-site guard, and the data API.

What only a browser shows (the views, the page's own requests, a form another site posts at the
manager) is in test_web.py, which needs Chromium; everything here runs wherever the manager runs.
The guard is tested on a real experiment (`trialkit run`): the page its manager serves, the token in
the URL it prints, the real action table behind the page's kill button.
"""
from __future__ import annotations

import signal
from urllib.parse import urlsplit

import pytest
import requests

from experiment_util import experiment, experiment_id, reported, start_cli, trial_status
from harness import wait_until
from trialkit.statuses import USER_CANCELED

HOLD = """
import time, trialkit
trialkit.get_next_parameter()
trialkit.report_intermediate_result(1)
while True:
    time.sleep(1)
"""


@pytest.fixture
def running(tmp_path, monkeypatch):
    """A `trialkit run` with one trial that runs until stopped: (home, the page's URL, the trial's id)."""
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, HOLD, maxTrialNumber=1,
                        trialGraceSeconds=5)
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        proc.stdout.readline()  # manager: ...
        page = proc.stdout.readline().split()[-1]  # page: <its URL, with the page's token>
        trial = f"{exp}-00000"
        wait_until(lambda: reported(home, trial) > 0, 60, "the trial to run")
        yield home, page, trial
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()


def test_actions_need_the_page_token_and_refuse_cross_site_requests(running):
    home, page, trial = running
    url = urlsplit(page)
    base, token = f"{url.scheme}://{url.netloc}", url.query.removeprefix("token=")
    exp = trial.rpartition("-")[0]
    kill = f"{base}/api/ui/experiments/{exp}/trials/{trial}/kill"
    good = {"Authorization": f"Bearer {token}"}
    assert requests.post(kill, timeout=10).status_code == 401
    assert requests.post(kill, headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 403
    assert requests.get(f"{base}/api/ui/experiments", timeout=10).status_code == 401
    # The right token, sent from another site's page: refused before the token is looked at.
    assert requests.post(kill, headers={**good, "Origin": "http://evil.example"}, timeout=10).status_code == 403
    assert requests.post(kill, headers={**good, "Sec-Fetch-Site": "cross-site"}, timeout=10).status_code == 403
    assert trial_status(home, trial) == "RUNNING"
    # From the page's own origin the same request is the kill button's, and it kills.
    own = {**good, "Origin": base, "Sec-Fetch-Site": "same-origin"}
    assert requests.post(kill, headers=own, timeout=10).status_code == 200
    wait_until(lambda: trial_status(home, trial) == USER_CANCELED, 60, "the trial to be killed")
