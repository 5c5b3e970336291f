"""The manager's GET /metrics (trialkit/manager/metrics.py), scraped over real HTTP as Prometheus would.

Keepers' batches are real HTTP posts to a real manager on loopback (the quick way and aiohttp's alike); the
scrape is parsed with prometheus_client's own parser, so the text format is Prometheus'.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from harness import child_environ, wait_until
from test_server import metric, post
from trialkit.manager import metrics
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
from trialkit.statuses import RUNNING, SUCCEEDED

SCRAPE = "scrape-token-1"


@pytest.fixture
def manager(tmp_path):
    store = Store.in_dir(tmp_path / "exp")
    store.create_experiment("exp")
    store.add_trial("exp", "t1", sequence=0, parameters={}, token="token-1")
    store.add_trial("exp", "t2", sequence=1, parameters={}, token="token-2")
    store.add_trial("exp", "t3", sequence=2, parameters={}, token="token-3")
    store.set_status("t1", RUNNING)
    store.set_status("t3", SUCCEEDED)
    store.set_places({"t2": (0, 1)})  # t2 waits in the job queue
    server = ManagerServer(store)
    metrics.install(server, store, ["admin-token", None, SCRAPE])
    server.start()
    yield server
    server.stop()
    store.close()


def scrape(server, token=SCRAPE) -> dict:
    """(name, labels) -> value of every sample the scrape gave."""
    answer = requests.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["Content-Type"].startswith("text/plain; version=")  # the text exposition format
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(answer.text) for sample in family.samples}


def test_trials_records_latency_keepers_and_queue_as_prometheus_reads_them(manager):
    assert post(manager, "t1", {"records": [metric(1), metric(2)]}).json()["inserted"] == 2
    assert post(manager, "t1", {"records": [metric(1), metric(2), metric(3)]}).json()["inserted"] == 1  # a resend
    seen = scrape(manager)
    assert seen[("trialkit_records_received_total", ())] == 5
    assert seen[("trialkit_records_stored_total", ())] == 3
    assert seen[("trialkit_ack_seconds_count", ())] == 2 and 0 < seen[("trialkit_ack_seconds_sum", ())] < 5
    # Its buckets as prometheus_client's Histogram names them (a dashboard's query matches le="5.0"), cumulative.
    assert seen[("trialkit_ack_seconds_bucket", (("le", "5.0"),))] == 2 == seen[("trialkit_ack_seconds_bucket",
                                                                                (("le", "+Inf"),))]
    assert [labels[0][1] for name, labels in seen if name == "trialkit_ack_seconds_bucket"][:3] == [
        "0.0005", "0.001", "0.0025"]
    assert seen[("trialkit_trials", (("status", "RUNNING"),))] == 1
    assert seen[("trialkit_trials", (("status", "SUCCEEDED"),))] == 1
    assert seen[("trialkit_trials", (("status", "WAITING"),))] == 1
    assert seen[("trialkit_queue_depth", ())] == 1
    assert seen[("trialkit_keepers_connected", ())] == 1  # t1 delivered; t2 and t3 did not
    assert seen[("trialkit_manager_connections", ())] >= 1


@pytest.mark.parametrize("token, status", [(None, 401), ("token-1", 403), ("wrong", 403)])
def test_metrics_want_a_token_of_their_own_not_a_trials(manager, token, status):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = requests.get(f"{manager.url}/metrics", headers=headers, timeout=10)
    assert answer.status_code == status and "trialkit_" not in answer.text


def test_the_admin_token_opens_them_too(manager):
    assert ("trialkit_queue_depth", ()) in scrape(manager, "admin-token")


def test_without_prometheus_client_the_route_says_what_to_install(tmp_path):
    code = textwrap.dedent(f"""
        import sys, requests
        sys.modules["prometheus_client"] = None  # as where the extra is not installed
        from trialkit.manager import metrics
        from trialkit.manager.server import ManagerServer
        from trialkit.manager.store import Store
        store = Store.in_dir({str(tmp_path / 'exp')!r})
        server = ManagerServer(store)
        assert metrics.install(server, store, ["t"]) is None
        server.start()
        answer = requests.get(server.url + "/metrics", headers={{"Authorization": "Bearer t"}}, timeout=10)
        print(answer.status_code, answer.json()["error"])
        server.stop()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == f"503 /metrics needs prometheus_client: {metrics.EXTRA}", done.stderr


HELD = """
import os, pathlib, time, trialkit
trialkit.report_intermediate_result(1)
while not pathlib.Path(os.environ["T_GO"]).exists():
    time.sleep(0.05)
trialkit.report_final_result(2)
"""


def test_a_running_experiments_manager_serves_metrics_to_its_page_token_and_its_scrape_token(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(HELD)
    (code / "config.yml").write_text(json.dumps({
        "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "trialCommand": f"{sys.executable} trial.py",
        "trialConcurrency": 1, "maxTrialNumber": 1, "trainingService": {"platform": "local"},
        "tuner": {"name": "Random"}}))
    home = tmp_path / "home"
    environ = child_environ(TRIALKIT_HOME=str(home), T_GO=str(tmp_path / "go"), TRIALKIT_METRICS_TOKEN=SCRAPE)
    run = subprocess.Popen([sys.executable, "-m", "trialkit.cli", "run", str(code / "config.yml")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    try:
        experiment = run.stdout.readline().split()[-1]
        run.stdout.readline()  # the manager's line
        page = run.stdout.readline().split()[-1]
        base, token = page.split("/?token=")
        server = type("Server", (), {"url": base})
        wait_until(lambda: scrape(server).get(("trialkit_records_stored_total", ()), 0) >= 2, 60,
                   "the trial's records to be counted")  # its RUNNING status and its first result
        by_page = scrape(server, token.split("#")[0])
        assert by_page[("trialkit_trials", (("status", "RUNNING"),))] == 1
        assert by_page[("trialkit_keepers_connected", ())] == 1
        (tmp_path / "go").write_text("")
        assert run.wait(timeout=60) == 0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        out, err = run.communicate()
    assert "Traceback" not in err and experiment, err
