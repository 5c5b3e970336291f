"""The page's view of the home's resource pool: every experiment's job, Move to Top and `job update`'s changes.

Three real experiments (`trialkit run`, real keepers and trials) share a pool of 2 slots in one
TRIALKIT_HOME: a (4 trials) holds both slots, b and c (2 trials each) wait. The page is a's, served by
a's manager; what it shows and changes is checked against `trialkit job list --pool`, and the last test
against the order in which the trials themselves start. Each experiment's trials wait for a gate file
of their own, so the test says when slots free. One browser test clicks Move to Top on the page.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional
from urllib.parse import urlsplit

import pytest
import requests

from conftest import ROOT, TAG, tagged_processes
from experiment_util import TIMEOUT, cli, experiment, experiment_id, export, start_cli
from harness import wait_until
from test_pools import GATED, SPACE, finish, pool_of
from trialkit.control.admin import read_info
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
from trialkit.web import install
from trialkit.web.address import page_token
from web_util import CHROMEDRIVER, CHROMIUM, Browser, fill

NAMES = ("a", "b", "c")
ARTIFACTS = ROOT / "tests" / "artifacts" / "web"


class Site:
    """The three experiments, their gates, and a's page (its base URL and token)."""

    def __init__(self, root: Path):
        self.home = root / "home"
        self.home.mkdir()
        pool_of(self.home, 2)
        self.log = root / "spans"
        self.gates = {name: root / f"gate-{name}" for name in NAMES}
        self.procs: Dict[str, subprocess.Popen] = {}
        self.ids: Dict[str, str] = {}
        self.start("a", trials=4)
        page = self.procs["a"].stdout.readline().strip()
        page = self.procs["a"].stdout.readline().strip() if page.startswith("manager:") else page
        assert page.startswith("page: "), page
        url = urlsplit(page.split()[-1])
        self.page_url = page.split()[-1]
        self.base, self.token = f"{url.scheme}://{url.netloc}", url.query.removeprefix("token=")
        wait_until(lambda: self.started("a") == 2, TIMEOUT, "a's 2 trials to hold the pool")
        for name in ("b", "c"):
            self.start(name, trials=2)
            wait_until(lambda: [r["status"] for r in export(self.ids[name])] == ["WAITING", "WAITING"], TIMEOUT,
                       f"{name}'s trials to wait")

    def start(self, name: str, trials: int) -> None:
        script = GATED.format(log=str(self.log), name=name, gate=str(self.gates[name]))
        # Not preemptible: a job moved ahead of a would take a's slots through a pause (platforms/preempt.py);
        # these tests are about the order the pool's free slots go in.
        config = experiment(self.log.parent, SPACE, script, name=name, experimentName=name, trialConcurrency=2,
                            maxTrialNumber=trials, trainingService={"platform": "local", "preemptible": False})
        self.procs[name] = start_cli("run", config)
        self.ids[name] = experiment_id(self.procs[name].stdout.readline())

    def started(self, name: str) -> int:
        """How many of the experiment's trials have started, by their own notes."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return sum(line.split()[0] == "start" and line.split()[-1] == name for line in lines)

    def close(self) -> None:
        for gate in self.gates.values():
            gate.touch()  # every trial ends, whatever failed
        for proc in self.procs.values():
            finish(proc)

    # -- the page's pool route, as the page calls it --------------------------------------
    def headers(self, **more: str) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **more}

    def pool_route(self) -> str:
        return f"{self.base}/api/ui/experiments/{self.ids['a']}/pool"

    def pool(self) -> Dict[str, Any]:
        answer = requests.get(self.pool_route(), headers=self.headers(), timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def update(self, *updates: Dict[str, Any]) -> Dict[str, Any]:
        answer = requests.post(self.pool_route(), headers=self.headers(), json={"updates": list(updates)}, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def order(self) -> List[str]:
        """The pool's jobs as `trialkit job list --pool` lists them, by name."""
        return [self.name_of(job["id"]) for job in cli_jobs()]

    def name_of(self, experiment: str) -> str:
        return next(name for name, exp in self.ids.items() if exp == experiment)


def cli_jobs() -> List[Dict[str, Any]]:
    done = cli("job", "list", "--pool", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def module_site(tmp_path_factory):
    # The experiments outlive single tests: they carry this module's tag and home, checked at the end.
    tag = "web-queue-" + secrets.token_hex(8)
    root = tmp_path_factory.mktemp("queue")
    saved = {key: os.environ.get(key) for key in (TAG, "TRIALKIT_HOME")}
    os.environ.update({TAG: tag, "TRIALKIT_HOME": str(root / "home")})
    built: Optional[Site] = None
    try:
        built = Site(root)
        yield built
    finally:
        if built is not None:
            built.close()
        else:  # started some, then failed: end what runs
            for proc in tagged_processes(tag):
                proc.kill()
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    wait_until(lambda: not tagged_processes(tag), 30, "the experiments' processes to end")


@pytest.fixture
def site(own_home, module_site, monkeypatch):
    """The module's site, with the test's CLI looking at its home (conftest gives every test its own)."""
    monkeypatch.setenv("TRIALKIT_HOME", str(module_site.home))
    return module_site


def test_the_page_lists_every_experiment_s_job_of_the_pool_as_job_list_does(site):
    shown = site.pool()
    assert shown["pool"] == "default" and shown["can_update"] is True
    rows = shown["jobs"]
    assert [(site.name_of(r["id"]), r["experiment_name"], r["position"], r["priority"], r["slots_acquired"],
             r["slots_needed"], r["status"]) for r in rows] == [("a", "a", 0, 42, 2, 2, "SCHEDULED"),
                                                                ("b", "b", 1, 42, 0, 2, "QUEUED"),
                                                                ("c", "c", 2, 42, 0, 2, "QUEUED")]
    assert rows[0]["submitted"] < rows[1]["submitted"] < rows[2]["submitted"]
    # The CLI's rows, field for field: the page adds the experiment's name only.
    assert [{k: v for k, v in r.items() if k != "experiment_name"} for r in rows] == cli_jobs()


def test_move_to_top_and_job_update_s_changes_reorder_the_pool_as_job_list_shows(site):
    """No waiting job ever gets a strictly smaller priority than a's, which holds the pool: that would preempt
    a's trials were they preemptible (platforms/preempt.py), which is not what this test is about."""
    a, b, c = (site.ids[name] for name in NAMES)

    def listed() -> List[tuple]:
        return [(site.name_of(job["id"]), job["priority"]) for job in cli_jobs()]
    moved = site.update({"job": c, "top": True})
    assert [(site.name_of(r["id"]), r["priority"]) for r in moved["jobs"]] == [("c", 42), ("a", 42), ("b", 42)]
    assert listed() == [("c", 42), ("a", 42), ("b", 42)]
    site.update({"job": c, "top": True})  # the first job stays first, as it was
    assert listed() == [("c", 42), ("a", 42), ("b", 42)]
    site.update({"job": c, "priority": 50})
    assert listed() == [("a", 42), ("b", 42), ("c", 50)]
    site.update({"job": c, "top": True})  # ahead of the first job, at its priority
    assert listed() == [("c", 42), ("a", 42), ("b", 42)]
    site.update({"job": a, "priority": 40})
    assert listed() == [("a", 40), ("c", 42), ("b", 42)]
    site.update({"job": b, "top": True})
    assert listed() == [("b", 40), ("a", 40), ("c", 42)]
    site.update({"job": b, "behind_of": c}, {"job": c, "ahead_of": a})  # in order, as update-batch
    assert listed() == [("c", 40), ("a", 40), ("b", 42)]
    site.update({"job": a, "ahead_of": c})
    assert listed() == [("a", 40), ("c", 40), ("b", 42)]


def test_bad_requests_are_4xx_with_a_reason_and_change_nothing(site):
    a, b = site.ids["a"], site.ids["b"]
    before = cli_jobs()
    route = site.pool_route()
    asked = [
        ("not json", "the body is not JSON"),
        ({}, "expected {\"updates\""),
        ({"updates": []}, "expected {\"updates\""),
        ({"updates": {"job": b, "top": True}}, "expected {\"updates\""),
        ({"updates": [{"top": True}]}, "each update is"),
        ({"updates": [{"job": b}]}, "an update changes one of"),
        ({"updates": [{"job": b, "priority": 1, "top": True}]}, "an update changes one of"),
        ({"updates": [{"job": b, "colour": "red"}]}, "an update changes one of"),
        ({"updates": [{"job": b, "top": False}]}, "Move to Top is"),
        ({"updates": [{"job": b, "priority": "1"}]}, "priority is a whole number"),
        ({"updates": [{"job": b, "priority": 1.5}]}, "priority is a whole number"),
        ({"updates": [{"job": b, "priority": 2 ** 63}]}, "out of range"),
        ({"updates": [{"job": b, "ahead_of": 5}]}, "ahead_of is a name"),
        ({"updates": [{"job": "nosuch", "top": True}]}, "experiment nosuch has no job in resource pool default"),
        ({"updates": [{"job": b, "ahead_of": "nosuch"}]}, "experiment nosuch has no job"),
        ({"updates": [{"job": b, "behind_of": b}]}, "cannot move behind of itself"),
        # all or none: the first change is undone with the second's refusal
        ({"updates": [{"job": b, "priority": 7}, {"job": b, "ahead_of": b}]}, "cannot move ahead of itself"),
    ]
    for body, reason in asked:
        data = body if isinstance(body, str) else json.dumps(body)
        answer = requests.post(route, headers=site.headers(**{"Content-Type": "application/json"}), data=data,
                               timeout=30)
        assert 400 <= answer.status_code < 500 and reason in answer.json()["error"], (body, answer.text)
    # Who may ask: the page's token, from the page's own site; the admin's token opens the admin routes only.
    admin = read_info(site.home / "experiments" / a).token
    for headers, status in [({}, 401), ({"Authorization": "Bearer wrong"}, 403),
                            ({"Authorization": f"Bearer {admin}"}, 403),
                            (site.headers(Origin="http://evil.example"), 403),
                            (site.headers(**{"Sec-Fetch-Site": "cross-site"}), 403)]:
        answer = requests.post(route, headers=headers, json={"updates": [{"job": b, "top": True}]}, timeout=30)
        assert answer.status_code == status and answer.json()["error"], (headers, answer.text)
    other = requests.get(f"{site.base}/api/ui/experiments/{b}/pool", headers=site.headers(), timeout=30)
    assert other.status_code == 404 and b in other.json()["error"]  # a's page serves a's experiment only
    assert cli_jobs() == before


@pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                    reason="needs Debian's chromium and chromium-driver (bootstrap.sh installs them)")
def test_the_queue_view_shows_the_pool_and_moves_a_job_to_the_top(site):
    last = cli_jobs()[-1]["id"]
    browser = Browser()
    try:
        driver = browser.driver
        driver.get(site.page_url + "/queue")
        rows = "return [...document.querySelectorAll('#pool-jobs tbody tr')].map(r => r.dataset.job)"
        wait_until(lambda: driver.execute_script("return document.body.dataset.ready") == "queue"
                   and len(driver.execute_script(rows)) == 3, 60, "the queue view with the pool's 3 jobs", every=0.1)
        assert driver.execute_script(rows) == [job["id"] for job in cli_jobs()]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "queue-pool.png"))
        heads = driver.execute_script("return [...document.querySelectorAll('#pool-jobs th')].map(h => h.textContent)")
        assert heads == ["Position", "Experiment", "Name", "Priority", "Submitted", "Slots (acquired/needed)",
                         "State", "Actions"]
        cells = driver.execute_script(
            "return [...document.querySelectorAll(`#pool-jobs tr[data-job='${arguments[0]}'] td`)]"
            ".map(c => c.textContent)", site.ids["a"])
        row = next(job for job in cli_jobs() if job["id"] == site.ids["a"])
        assert cells[:4] == [str(row["position"]), site.ids["a"], "a", str(row["priority"])]
        assert cells[5:7] == [f"{row['slots_acquired']}/{row['slots_needed']}", row["status"]]
        driver.execute_script(
            "document.querySelector(`#pool-jobs tr[data-job='${arguments[0]}'] button[data-pool-action=top]`).click()",
            last)
        wait_until(lambda: cli_jobs()[0]["id"] == last, 30, "the job to be first in job list --pool", every=0.1)
        wait_until(lambda: driver.execute_script(rows)[0] == last, 30, "the page to show it first", every=0.1)
        # The first job offers no Move to Top.
        assert not driver.execute_script(
            "return document.querySelector(`#pool-jobs tr[data-job='${arguments[0]}'] button[data-pool-action=top]`)",
            last)
    finally:
        left = browser.close()
    assert not left, f"browser processes left running: {left}"


def test_the_moved_job_s_trials_take_the_next_free_slots(site):
    """Last: it lets a's first trials end. c moved to the top gets both slots they free; b, behind a, none."""
    a, b, c = (site.ids[name] for name in NAMES)
    site.update({"job": c, "top": True}, {"job": b, "behind_of": a})
    assert site.order() == ["c", "a", "b"]
    site.gates["a"].touch()
    wait_until(lambda: site.started("c") == 2, TIMEOUT, "c's trials to take the slots a's freed")
    assert (site.started("a"), site.started("b")) == (2, 0)
    assert [job["status"] for job in cli_jobs() if job["id"] == c] == ["SCHEDULED"]


def test_a_read_only_page_shows_no_pool_and_takes_no_change(tmp_path):
    """`trialkit ui` (no experiment loop behind it): the pool's route says where the pool is shown."""
    store = Store.in_dir(tmp_path / "exp")
    fill(store, "done1", trials=1, steps=1)
    server = ManagerServer(store).start()
    try:
        install(server, store, admin_token="ro", read_only=True)
        headers = {"Authorization": f"Bearer {page_token('ro')}"}
        shown = requests.get(f"{server.url}/api/ui/experiments/done1/pool", headers=headers, timeout=10)
        assert shown.status_code == 501 and "running experiment's page" in shown.json()["error"]
        changed = requests.post(f"{server.url}/api/ui/experiments/done1/pool", headers=headers,
                                json={"updates": [{"job": "done1", "top": True}]}, timeout=10)
        assert changed.status_code == 405
    finally:
        server.stop()
        store.close()


def test_an_experiment_without_a_job_in_the_machine_s_pools_is_told_so(own_home):
    """A Ray or Kubernetes experiment's page: its loop has no job in pools.db to show or change (409, why)."""
    from types import SimpleNamespace

    from trialkit.control import actions
    from trialkit.manager.server import HttpError

    loop = SimpleNamespace(experiment_id="onray01")
    for action, body in (("jobs", None), ("update", {"updates": [{"job": "onray01", "top": True}]})):
        with pytest.raises(HttpError, match="experiment onray01 has no job in this machine's resource pools") as err:
            actions.find("pool", action).run(loop, None, body)
        assert err.value.status == 409


JOINER = """
import time
from trialkit.platforms import pools
pools.open_pool().join("other01")  # a job of the pool, as another experiment's control plane joins
print("joined", flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                    reason="needs Debian's chromium and chromium-driver (bootstrap.sh installs them)")
def test_a_fair_share_pool_shows_weights_and_takes_a_weight_not_a_place(tmp_path, monkeypatch):
    home = tmp_path / "fair"
    home.mkdir()
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    (home / "pools.yml").write_text("pools:\n  default: {slots: 2, scheduler: fair_share}\n")
    log, gate = tmp_path / "spans", tmp_path / "gate"
    joiner = subprocess.Popen([sys.executable, "-c", JOINER], stdout=subprocess.PIPE, text=True)
    script = GATED.format(log=str(log), name="f", gate=str(gate))
    proc = start_cli("run", experiment(tmp_path, SPACE, script, name="f", experimentName="f", trialConcurrency=1,
                                       maxTrialNumber=1))
    browser = None
    try:
        assert joiner.stdout.readline().strip() == "joined"
        exp = experiment_id(proc.stdout.readline())
        proc.stdout.readline()  # manager: ...
        page = proc.stdout.readline().split()[-1]
        url = urlsplit(page)
        route = f"{url.scheme}://{url.netloc}/api/ui/experiments/{exp}/pool"
        headers = {"Authorization": f"Bearer {url.query.removeprefix('token=')}"}
        wait_until(lambda: log.exists() and "start" in log.read_text(), TIMEOUT, "f's trial to start")
        shown = requests.get(route, headers=headers, timeout=30).json()
        assert shown["scheduler"] == "fair_share"
        assert {job["id"]: job["weight"] for job in shown["jobs"]} == {exp: 1, "other01": 1}
        changed = requests.post(route, headers=headers, json={"updates": [{"job": "other01", "weight": 3}]}, timeout=30)
        assert changed.status_code == 200, changed.text
        assert {job["id"]: job["weight"] for job in cli_jobs()} == {exp: 1, "other01": 3}
        for refused in ({"job": exp, "top": True}, {"job": exp, "priority": 1}, {"job": exp, "weight": 0}):
            answer = requests.post(route, headers=headers, json={"updates": [refused]}, timeout=30)
            assert answer.status_code == 400 and answer.json()["error"], (refused, answer.text)
        assert {job["id"]: (job["priority"], job["weight"]) for job in cli_jobs()} == \
            {exp: (42, 1), "other01": (42, 3)}
        browser = Browser()
        browser.driver.get(page + "/queue")
        heads = "return [...document.querySelectorAll('#pool-jobs th')].map(h => h.textContent)"
        wait_until(lambda: "Weight" in browser.driver.execute_script(heads), 60, "the pool's weights", every=0.1)
        assert browser.driver.execute_script(
            "return [...document.querySelectorAll('#pool-jobs button')].map(b => b.dataset.poolAction)") == \
            ["weight", "weight"]  # a place or a priority counts for nothing in a fair share pool: not offered
    finally:
        left = browser.close() if browser is not None else []
        gate.touch()
        finish(proc)
        joiner.kill()
        joiner.wait()
    assert not left, f"browser processes left running: {left}"
