"""The page's routes over plain HTTP, no browser: the token and cross-site guard, and the data API.

What only a browser shows (the views, the page's own requests, a form another site posts at the
manager) is in test_web.py, which needs Chromium; everything here runs wherever the manager runs.
The guard is tested on a real experiment (`trialkit run`): the page its manager serves, the token in
the URL it prints, the real action table behind the page's kill button.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from typing import Any, Dict, List, Optional
from urllib.parse import urlsplit

import pytest
import requests

from conftest import ROOT
from experiment_util import cli, experiment, experiment_id, reported, start_cli, trial_status
from harness import signal_and_wait, wait_until
from trialkit.control.actions import ADMIN_PREFIX, Action
from trialkit.control.admin import read_info
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
from trialkit.statuses import USER_CANCELED
from trialkit.web import install
from trialkit.web.address import page_token
from web_util import config as web_config
from web_util import fill

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
    # The admin token opens the admin routes, not the page's; the page's token opens only the page's.
    admin = {"Authorization": f"Bearer {read_info(home / 'experiments' / exp).token}"}
    assert requests.post(kill, headers=admin, timeout=10).status_code == 403
    admin_kill = f"{base}{ADMIN_PREFIX}/trials/{trial}/kill"
    assert requests.post(admin_kill, headers=good, json={}, timeout=10).status_code == 401
    assert trial_status(home, trial) == "RUNNING"
    # From the page's own origin the same request is the kill button's, and it kills.
    own = {**good, "Origin": base, "Sec-Fetch-Site": "same-origin"}
    assert requests.post(kill, headers=own, timeout=10).status_code == 200
    wait_until(lambda: trial_status(home, trial) == USER_CANCELED, 60, "the trial to be killed")
    shown = cli("trial", "show", trial).stdout
    assert "USER_CANCELED: killed from the page" in shown, shown  # not by `trialkit trial kill`
    listed = cli("trial", "list", exp).stdout  # and why, in the table's last column, as any other end says it
    assert listed.splitlines()[0].endswith("why") and listed.rstrip().endswith("killed from the page"), listed


class Recorder:
    """Stands where the experiment loop performs the page's actions: here, none may arrive."""

    def __init__(self) -> None:
        self.calls: List[Any] = []

    def perform(self, action: Action, trial_id: Optional[str], body: Any) -> Any:
        self.calls.append((action.on, action.name, trial_id))
        return {}


@pytest.fixture
def served(tmp_path):
    """A manager serving the page read-only over a store of finished and running trials."""
    store = Store.in_dir(tmp_path / "exp")
    fill(store, "exp1", trials=4, steps=2, running=1)
    server = ManagerServer(store).start()
    install(server, store, admin_token="tok", read_only=True)
    yield server
    server.stop()
    store.close()


def test_a_read_only_page_has_no_action_route_even_beside_a_loop(tmp_path):
    store = Store.in_dir(tmp_path / "exp")
    trial = fill(store, "exp1", trials=2, steps=2, running=1)[-1]
    server = ManagerServer(store).start()
    loop = Recorder()
    try:
        install(server, store, admin_token="ro", read_only=True, performer=loop)
        read_only = {"Authorization": f"Bearer {page_token('ro')}"}
        answer = requests.post(f"{server.url}/api/ui/experiments/exp1/trials/{trial}/kill",
                               headers=read_only, timeout=10)
        assert answer.status_code == 404
        assert requests.get(f"{server.url}/api/ui/info", headers=read_only, timeout=10).json() == \
            {"read_only": True, "actions": [], "disk": None}
    finally:
        server.stop()
        store.close()
    assert loop.calls == []


def test_the_page_comes_whole_and_its_policy_runs_only_its_own_inline_script(served):
    """One answer holds the page's styles and script (no round of requests before it asks for its data); the
    Content-Security-Policy admits that script by its hash, and no other inline script."""
    answer = requests.get(served.url + "/", timeout=10)
    inline = re.findall(r"<script>(.*?)</script>", answer.text, re.S)
    assert len(inline) == 1 and "function askToken" in inline[0]
    assert inline[0] == requests.get(served.url + "/static/app.js", timeout=10).text
    digest = base64.b64encode(hashlib.sha256(inline[0].encode()).digest()).decode()
    scripts = answer.headers["Content-Security-Policy"].split("script-src ")[1].split(";")[0].split()
    assert scripts == ["'self'", "'unsafe-eval'", f"'sha256-{digest}'"]
    assert ".u-legend" in answer.text and "--accent" in answer.text  # uPlot's styles and the page's
    assert "stylesheet" not in answer.text


def test_the_page_and_its_small_files_need_no_thread_of_the_pool(served):
    """The page, app.js and uPlot (what a cold page waits for) are answered on the server's loop: with its pool of
    threads gone, they still come; its data and the plotly bundles do not."""
    page = requests.get(served.url + "/", timeout=10).text
    uplot = re.search(r'<script id="uplot" src="(/static/uplot-[0-9a-f]+\.min\.js)" defer>', page).group(1)
    basic = re.search(r'data-basic="(/static/plotly-basic-[0-9a-f]+\.min\.js)"', page).group(1)
    served._transport._pool.shutdown()
    for path in ("/", "/static/app.js", "/static/app.css", uplot):
        assert requests.get(served.url + path, timeout=10).status_code == 200, path
    for path in ("/api/ui/experiments", basic):
        assert requests.get(served.url + path, headers={"Authorization": f"Bearer {page_token('tok')}"},
                            timeout=10).status_code == 500, path


def test_page_files_go_gzipped_to_browsers_that_take_gzip(served):
    page = requests.get(served.url + "/", timeout=10).text
    basic, full = re.search(r'data-basic="(/static/plotly-basic-[0-9a-f]+\.min\.js)" data-full="(/static/[^"]+)"',
                            page).groups()
    uplot = re.search(r'<script id="uplot" src="(/static/uplot-[0-9a-f]+\.min\.js)" defer>', page).group(1)
    for path in ("/", "/static/app.js", uplot, basic, full):
        plain = requests.get(served.url + path, headers={"Accept-Encoding": "identity"}, timeout=10)
        packed = requests.get(served.url + path, headers={"Accept-Encoding": "gzip"}, stream=True, timeout=10)
        raw = packed.raw.read(decode_content=False)
        assert "Content-Encoding" not in plain.headers and packed.headers["Content-Encoding"] == "gzip"
        assert packed.headers["Vary"] == plain.headers["Vary"] == "Accept-Encoding"
        assert len(raw) < len(plain.content) and gzip.decompress(raw) == plain.content
        # Each form revalidates against its own tag only.
        for answer, encoding in ((plain, "identity"), (packed, "gzip")):
            again = requests.get(served.url + path, timeout=10,
                                 headers={"Accept-Encoding": encoding, "If-None-Match": answer.headers["ETag"]})
            assert again.status_code == 304
        assert plain.headers["ETag"] != packed.headers["ETag"]
    refused = requests.get(served.url + basic, headers={"Accept-Encoding": "gzip;q=0, br"}, timeout=10)
    assert "Content-Encoding" not in refused.headers and refused.content.startswith(b"/**\n* plotly.js (basic")
    forever = requests.get(served.url + uplot, timeout=10)  # named by its hash: cached for good
    assert forever.content.startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    assert "immutable" in forever.headers["Cache-Control"]


def test_the_trials_api_sorts_filters_and_pages_on_the_server(tmp_path):
    store = Store.in_dir(tmp_path / "exp")
    ids = fill(store, "big", trials=300, steps=3, running=10)
    server = ManagerServer(store).start()
    install(server, store, admin_token="tok", read_only=True)
    try:
        def page(**query: Any) -> Dict[str, Any]:
            answer = requests.get(f"{server.url}/api/ui/experiments/big/trials", params=query,
                                  headers={"Authorization": f"Bearer {page_token('tok')}"}, timeout=10)
            assert answer.status_code == 200, answer.text
            return answer.json()
        first = page(limit=25)
        assert first["total"] == 300 and [r["id"] for r in first["rows"]] == ids[:25]
        assert [r["id"] for r in page(limit=25, offset=275)["rows"]] == ids[275:]
        best = page(sort="metric", order="desc", limit=300)["rows"]
        metrics = [r["metric"] for r in best]
        assert metrics[:290] == sorted(metrics[:290], reverse=True) and metrics[290:] == [None] * 10
        # Every row, unfiltered, tells which rows each filter must return: all of them, and only them.
        every = page(limit=300)["rows"]
        expected = [r["id"] for r in every if r["parameters"]["optimizer"] == "adam" and (r["metric"] or 0) > 0.05]
        assert 0 < len(expected) < 290  # the filter has rows to keep and rows to drop
        adam = page(**{"p:optimizer": "=adam", "metric": ">0.05", "limit": 300})
        assert adam["total"] == len(adam["rows"]) and sorted(r["id"] for r in adam["rows"]) == sorted(expected)
        by_lr = sorted((r["parameters"]["lr"], r["id"]) for r in every if 0.001 <= r["parameters"]["lr"] <= 0.01)
        assert 0 < len(by_lr) < 300
        ranged = page(**{"p:lr": "0.001..0.01", "sort": "p:lr", "limit": 300})["rows"]
        assert [r["id"] for r in ranged] == [trial_id for _, trial_id in by_lr]
        assert page(status="RUNNING")["total"] == 10
        bad = requests.get(f"{server.url}/api/ui/experiments/big/trials", params={"sort": "p:nope"},
                           headers={"Authorization": f"Bearer {page_token('tok')}"}, timeout=10)
        assert bad.status_code == 400
    finally:
        server.stop()
        store.close()


@pytest.fixture
def big(tmp_path):
    """300 trials (290 with a final metric) behind a read-only page: (store, trial ids, get(route, **query) -> JSON;
    route "": the overview)."""
    store = Store.in_dir(tmp_path / "exp")
    ids = fill(store, "big", trials=300, steps=3, running=10)
    server = ManagerServer(store).start()
    install(server, store, admin_token="tok", read_only=True)

    def get(route: str, **query: Any) -> Dict[str, Any]:
        answer = requests.get(f"{server.url}/api/ui/experiments/big" + (f"/{route}" if route else ""), params=query,
                              headers={"Authorization": f"Bearer {page_token('tok')}"}, timeout=10)
        assert answer.status_code == 200, f"{answer.status_code}: {answer.text}"
        return answer.json()
    try:
        yield store, ids, get
    finally:
        server.stop()
        store.close()


def test_curves_name_the_experiments_best_only_among_the_trials_that_hold_it(big):
    """`best` (the curve labelled "(best)") is the experiment's best trial where it is one of the chosen, else None;
    of two trials tied on the best metric, the earlier."""
    store, ids, get = big

    def curves(*chosen: str) -> Dict[str, Any]:
        return get("curves", trials=",".join(chosen))
    ranked = get("trials", sort="metric", order="desc", limit=300)["rows"]
    best, second, last = ranked[0], ranked[1], ranked[289]  # 290 with a final metric, the best first
    assert curves()["best"] == best["id"]  # the 10 best
    assert curves(best["id"])["best"] == best["id"]
    assert curves(last["id"], best["id"], second["id"])["best"] == best["id"]
    others = curves(second["id"], last["id"])
    assert others["best"] is None and others["top"] == second["id"]  # drawn bold, but not the best of all
    assert all(curves(trial)["best"] is None for trial in ids[:300:29] if trial != best["id"])
    # A later trial tied with the best is not the best; the earlier one still is, beside it.
    store.add_trial("big", "big-tied", sequence=300, parameters={"lr": 0.01}, token=None)
    store.add_records("big-tied", [{"seq": 1, "type": "FINAL", "value": best["metric"]}])
    assert curves("big-tied")["best"] is None
    assert curves("big-tied", best["id"])["best"] == best["id"]
    # The ranking kept since (queries._ranked) goes with the store's next write: a new trial beyond the best is it,
    # for the chosen trials' curves (kept: the 10 best, the overview) and for the 10 best.
    assert get("")["best"]["id"] == best["id"]
    store.add_trial("big", "big-beyond", sequence=301, parameters={"lr": 0.01}, token=None)
    store.add_records("big-beyond", [{"seq": 1, "type": "FINAL", "value": best["metric"] + 1}])
    assert curves("big-beyond")["best"] == "big-beyond" and curves(best["id"])["best"] is None
    assert curves()["best"] == "big-beyond" and get("")["best"]["id"] == "big-beyond"


def test_the_trials_answer_brings_the_curves_when_asked(big):
    """with=curves: the trials view's data in one answer, its curves as the curves route gives them."""
    _, ids, get = big
    chosen = f"{ids[3]},{ids[30]}"
    both = get("trials", limit=5, status="SUCCEEDED", **{"with": "curves", "trials": chosen, "curve": "default"})
    assert both["rows"] == get("trials", limit=5, status="SUCCEEDED")["rows"]
    assert both["curves"] == get("curves", trials=chosen, metric="default")
    assert [series["id"] for series in both["curves"]["series"]] == [ids[3], ids[30]]
    assert get("trials", **{"with": "curves"})["curves"] == get("curves")  # none named: the best
    assert "curves" not in get("trials")
    with pytest.raises(AssertionError, match="400: .*only with=curves adds to a page of trials"):
        get("trials", **{"with": "curve"})  # a typo is refused, not ignored


def test_answers_are_strict_json_whatever_a_trial_holds(big):
    """NaN and infinities (a trial's own parameters, its values) come as strings, never as bare NaN nor as null;
    a whole number past 64 bits stays whole; a value the store holds damaged is left out of its curve alone."""
    store, ids, get = big
    store.add_trial("big", "big-odd", sequence=300, token=None,
                    parameters={"lr": float("nan"), "batch": float("-inf"), "optimizer": "adam"})
    store.add_trial("big", "big-wide", sequence=301, token=None, parameters={"lr": 0.5, "batch": 2 ** 70})
    for trial in ("big-odd", "big-wide"):
        store.add_records(trial, [{"seq": 1 + i, "type": "PERIODICAL", "value": 0.1 * i} for i in range(4)])
    with closing(sqlite3.connect(store.path)) as db, db:  # another program's writes: values that are no JSON
        db.execute("UPDATE records SET value = '7,8' WHERE trial = 'big-odd' AND seq = 3")
        db.execute("UPDATE records SET value = '{0.2' WHERE trial = 'big-wide' AND seq = 2")
    odd = get("trials", sort="sequence", order="desc", limit=1, offset=1)["rows"][0]
    assert odd["parameters"] == {"lr": "NaN", "batch": "-Infinity", "optimizer": "adam"}
    newest = get("trials", sort="sequence", order="desc", limit=1, **{"with": "curves", "trials": "big-odd,big-wide"})
    assert newest["rows"][0]["parameters"] == {"lr": 0.5, "batch": 2 ** 70}
    third = 0.1 * 3
    assert [(s["id"], s["steps"], s["values"]) for s in newest["curves"]["series"]] == [
        ("big-odd", [1, 2, 4], [0.0, 0.1, third]), ("big-wide", [1, 3, 4], [0.0, 0.2, third])]


def test_trialkit_ui_serves_stored_experiments_read_only(tmp_path):
    home = tmp_path / "home"
    store = Store.in_dir(home / "experiments" / "done1")
    fill(store, "done1", trials=3, steps=2)
    store.close()
    code = "import sys; from trialkit.web import serve_ui; sys.exit(serve_ui(None, 0))"
    env = dict(os.environ, TRIALKIT_HOME=str(home), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("trialkit ui: http://127.0.0.1:"), line
        url = line.split()[-1]
        base, token = url.split("/?token=")
        headers = {"Authorization": f"Bearer {token}"}
        listed = requests.get(f"{base}/api/ui/experiments", headers=headers, timeout=10).json()
        assert [(e["id"], e["trials"]) for e in listed] == [("done1", 3)]
        assert requests.get(f"{base}/api/ui/info", headers=headers, timeout=10).json()["read_only"] is True
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_numbers_too_large_to_hold_answer_400_with_the_reason_never_500(running):
    """The page's and the admin's priority, update and import routes, for numbers the store or a float cannot hold:
    the refusal the CLI would give, as a 400 (issue 29.7: a UserError surfaced as 500)."""
    home, page, trial = running
    url = urlsplit(page)
    base, token = f"{url.scheme}://{url.netloc}", url.query.removeprefix("token=")
    exp = trial.rpartition("-")[0]
    admin = {"Authorization": f"Bearer {read_info(home / 'experiments' / exp).token}",
             "Content-Type": "application/json"}
    big = "1" + "0" * 400
    asked = [
        (f"/api/ui/experiments/{exp}/trials/{trial}/priority", {"Authorization": f"Bearer {token}"},
         '{"priority": %s}' % big, "out of range"),
        (f"{ADMIN_PREFIX}/trials/{trial}/priority", admin, '{"priority": %d}' % 2 ** 63, "out of range"),
        (f"{ADMIN_PREFIX}/queue/moves", admin, '{"moves": [{"trial_id": "%s", "priority": %s}]}' % (trial, big),
         "out of range"),
        (f"{ADMIN_PREFIX}/experiment/import", admin, '{"results": [{"parameters": {"x": 1}, "value": %s}]}' % big,
         "results[0].value: a whole number of about 400 digits is too large"),
        (f"{ADMIN_PREFIX}/experiment/import", admin, '{"results": [{"parameters": {"x": 1}, "value": NaN}]}',
         "results[0].value: expected a finite number"),
        (f"{ADMIN_PREFIX}/experiment/update", admin, '{"maxExperimentDuration": %s}' % big,
         "maxExperimentDuration: a whole number of about 400 digits is too large"),
    ]
    for path, headers, body, reason in asked:
        answer = requests.post(base + path, headers=headers, data=body, timeout=30)
        assert (answer.status_code, reason in answer.json()["error"]) == (400, True), (path, answer.text)
    assert trial_status(home, trial) == "RUNNING"


def test_trialkit_ui_over_stores_it_cannot_read_answers_409_never_500(tmp_path):
    """A file that is no store, and a store whose config is not JSON, beside a good one: the list names them
    UNREADABLE with the reason, their routes answer 409 with it, the good one reads as ever."""
    import sqlite3
    from contextlib import closing

    home = tmp_path / "home"
    fill(Store.in_dir(home / "experiments" / "good1"), "good1", trials=2, steps=2)
    store = Store.in_dir(home / "experiments" / "odd1")
    fill(store, "odd1", trials=1, steps=1)
    store.close()
    with closing(sqlite3.connect(home / "experiments" / "odd1" / "trialkit.db")) as db:
        db.execute("UPDATE experiments SET config='{not json'")
        db.commit()
    (home / "experiments" / "bad1").mkdir()
    (home / "experiments" / "bad1" / "trialkit.db").write_bytes(b"\x01" * 8192)
    code = "import sys; from trialkit.web import serve_ui; sys.exit(serve_ui(None, 0))"
    env = dict(os.environ, TRIALKIT_HOME=str(home), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        base, token = proc.stdout.readline().split()[-1].split("/?token=")
        headers = {"Authorization": f"Bearer {token}"}
        listed = {e["id"]: e for e in requests.get(f"{base}/api/ui/experiments", headers=headers, timeout=10).json()}
        assert listed["good1"]["trials"] == 2
        assert listed["bad1"]["status"] == listed["odd1"]["status"] == "UNREADABLE"
        assert "file is not a database" in listed["bad1"]["reason"] and "not JSON" in listed["odd1"]["reason"]
        for exp in ("bad1", "odd1"):
            for route in ("", "/trials", "/curves", "/hyper"):
                answer = requests.get(f"{base}/api/ui/experiments/{exp}{route}", headers=headers, timeout=10)
                assert answer.status_code == 409 and exp in answer.json()["error"], (exp, route, answer.text)
        log = requests.get(f"{base}/api/ui/experiments/bad1/trials/bad1-00000/log", headers=headers, timeout=10)
        assert log.status_code == 409, log.text
        assert requests.get(f"{base}/api/ui/experiments/good1/trials", headers=headers, timeout=10).json()["total"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
    assert "failed" not in err and "Traceback" not in err, err


def test_the_page_address_the_run_printed_answers_again_through_the_command_it_names(tmp_path, monkeypatch):
    """Issue 40.3: the run's page goes with its manager; the run's end names `trialkit ui ID`, which serves
    the page read-only at the address the run printed, its token the same: the printed URL works again."""
    from experiment_util import cli

    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}},
                        "import trialkit\ntrialkit.report_final_result(trialkit.get_next_parameter()['x'])\n",
                        maxTrialNumber=1)
    done = cli("run", config)
    assert done.returncode == 0, done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    url = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("page: http"))
    told = done.stdout.splitlines()[-1]
    assert told == (f"page: ended with the run; `trialkit ui {exp}` serves it again, read-only, at the address above")
    # A detached run's user, who never saw that line, reads it in `experiment show`.
    shown = cli("experiment", "show", exp).stdout.splitlines()
    assert f"page        ended with the run; `trialkit ui {exp}` serves it again, read-only" in shown, shown
    base, token = url.split("/?token=")[0], url.split("token=")[1].split("#")[0]
    ask = lambda: requests.get(f"{base}/api/ui/experiments/{exp}", headers={"Authorization": f"Bearer {token}"},  # noqa: E731
                               timeout=10)
    with pytest.raises(requests.ConnectionError):
        ask()  # the run's manager has ended
    ui = start_cli("ui", exp)  # the command the run named, as printed
    try:
        assert ui.stdout.readline().strip() == f"trialkit ui: {url}"  # the very address the run printed
        assert ui.stdout.readline().strip() == "the address its run printed, read-only, until Ctrl-C"
        answer = ask()
        assert answer.status_code == 200 and answer.json()["status"] == "DONE"
        assert requests.get(url, timeout=10).status_code == 200  # the page itself
    finally:
        assert signal_and_wait(ui, signal.SIGINT, 30) == 0


def test_the_first_runs_page_address_opens_the_resumed_experiments_page_and_trialkit_ui(tmp_path, monkeypatch):
    """Brief 8: a page address a user kept from the first run (its token) opens the page of the experiment's
    resume, and `trialkit ui` after it serves that same token."""
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2, 3]}}, HOLD, maxTrialNumber=3,
                        trialConcurrency=1, trialGraceSeconds=5)

    def page_of(proc: subprocess.Popen) -> str:
        """The page URL a starting `trialkit run`/`resume` prints, once its trial runs."""
        for line in proc.stdout:
            if line.startswith("page: http"):
                return line.split()[1]
        raise AssertionError("no page line")

    first = start_cli("run", config)
    try:
        exp = experiment_id(first.stdout.readline())
        url = page_of(first)
        wait_until(lambda: reported(home, f"{exp}-00000") > 0, 60, "the first trial to run")
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    base, token = url.split("/?token=")[0], url.split("token=")[1].split("#")[0]
    ask = lambda: requests.get(f"{base}/api/ui/experiments/{exp}", headers={"Authorization": f"Bearer {token}"},  # noqa: E731
                               timeout=10)
    resumed = start_cli("experiment", "resume", exp)
    try:
        assert page_of(resumed) == url  # the same port, the same token
        answer = ask()
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "RUNNING"
    finally:
        resumed.send_signal(signal.SIGINT)
        resumed.communicate(timeout=60)
    ui = start_cli("ui", exp)
    try:
        assert ui.stdout.readline().strip() == f"trialkit ui: {url}"
        assert ask().status_code == 200
    finally:
        assert signal_and_wait(ui, signal.SIGTERM, 30) == 0  # a service manager's stop ends it as Ctrl-C does


def test_the_tuners_budget_is_a_column_and_an_axis_and_pbts_dirs_are_not(tmp_path):
    """Hyperband's and BOHB's TRIAL_BUDGET is not in the search space but is what NNI users read results by: the
    page lists it beside the space's parameters (table columns, hyperparameter axes); PBT's checkpoint paths are
    not hyperparameters and stay out."""
    store = Store.in_dir(tmp_path / "exp")
    store.create_experiment("hb", web_config())
    for sequence, budget in enumerate((1, 3, 9)):
        trial_id = f"hb-{sequence:05d}"
        store.add_trial("hb", trial_id, sequence=sequence, token=None, parameters={
            "lr": 0.01, "batch": 16, "optimizer": "sgd", "TRIAL_BUDGET": budget,
            "load_checkpoint_dir": "/c/0/0", "save_checkpoint_dir": "/c/0/0"})
        store.add_records(trial_id, [{"seq": 1, "type": "FINAL", "parameter_id": sequence, "value": budget / 10},
                                     {"seq": 2, "type": "STATUS", "time": time.time(),
                                      "value": {"status": "SUCCEEDED", "exit_code": 0}}])
    server = ManagerServer(store).start()
    install(server, store, admin_token="tok", read_only=True)
    try:
        def answer(route: str) -> Dict[str, Any]:
            got = requests.get(f"{server.url}/api/ui/experiments/hb{route}", timeout=10,
                               headers={"Authorization": f"Bearer {page_token('tok')}"})
            assert got.status_code == 200, got.text
            return got.json()
        assert answer("")["parameters"] == ["lr", "batch", "optimizer", "TRIAL_BUDGET"]
        hyper = answer("/hyper")
        assert hyper["parameters"][-1] == "TRIAL_BUDGET" and hyper["columns"]["TRIAL_BUDGET"] == [1, 3, 9]
        assert answer("/trials")["rows"][0]["parameters"]["TRIAL_BUDGET"] == 1
    finally:
        server.stop()
        store.close()
