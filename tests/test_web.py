"""The web page in a real headless Chromium, against a real manager with real trials.

The module starts one ManagerServer with the page installed and six trials on
the local platform (real keepers, a real training script reporting through
the SDK): four that finish at once and two that run until stopped; its kill
action is the platform's hard kill. Pausing from the page runs a real
experiment (`trialkit run`): the page its manager serves, the runner's pause
(SIGTERM -> the script checkpoints and exits 143 -> PAUSED). One browser
serves the whole module. Screenshots of each view land in tests/artifacts/web/.
What needs no browser (the guard over plain HTTP, the data API, the files, trialkit
ui) is in test_web_routes.py, which runs without Chromium.
"""
from __future__ import annotations

import errno
import json
import os
import re
import secrets
import signal
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import requests

from conftest import TAG, tagged_processes
from experiment_util import cli, experiment, experiment_id, gated_run, reported, start_cli, trial_status
from harness import signal_and_wait, wait_until
from trialkit.control.config import parse_config
from trialkit.control.actions import Action
from trialkit.manager.server import HttpError, ManagerServer
from trialkit.control.specs import build_spec
from trialkit.manager.store import Store, new_token
from trialkit.statuses import FINAL_STATUSES, PREEMPTED, SUCCEEDED, USER_CANCELED
from trialkit.platforms.local import LocalConfig, Platform
from trialkit.web import install, page_url
from web_util import CHROMEDRIVER, CHROMIUM, Browser, click, fill, open_the_run_and_end_it, shot, wait_for

pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                                reason="needs Debian's chromium and chromium-driver (bootstrap.sh installs them)")

EXPERIMENT = "webtest1"
SCRIPT_VALUE = "<script>window.pwned = 1</script>"
IMG_VALUE = '<img src=x onerror="window.pwned = 2">'
LOG_MARKUP = "<b>not bold</b>"
NOTE = "<i>note</i>"  # a parameter name with markup in it
ELASTIC_REASON = "the goodput model chose 2 workers (now 1): <b>rescaling</b>"

TRAIN = f"""
import json, os, pathlib, signal, sys, time
import trialkit, trialkit.sdk

p = trialkit.get_next_parameter()
trialkit.sdk.report_elastic(2, {{1: 1.0, 2: 1.83}}, {ELASTIC_REASON!r})  # as adaptdl-ray reports a decision
asked = []
signal.signal(signal.SIGTERM, lambda *_: asked.append(1))
print({LOG_MARKUP!r}, "note:", p[{NOTE!r}], flush=True)
for step in range(p["steps"]):
    trialkit.report_intermediate_result(p["lr"] * (step + 1))
    print("step", step, flush=True)
    if asked:  # a graceful stop: save, then 143 says "checkpointed, resume me"
        ckpt = pathlib.Path(os.environ["TRIALKIT_CHECKPOINT_DIR"])
        ckpt.mkdir(parents=True, exist_ok=True)
        (ckpt / "state.json").write_text(json.dumps({{"step": step}}))
        sys.exit(143)
    time.sleep(p["wait"])
trialkit.report_final_result(p["lr"] * p["steps"])
"""

QUICK = [{"lr": 0.1, NOTE: "plain"}, {"lr": 0.3, NOTE: SCRIPT_VALUE}, {"lr": 0.2, NOTE: IMG_VALUE},
         {"lr": 0.05, NOTE: "plain"}]
HOLD, VICTIM = 4, 5  # run until stopped: the one whose log is followed, the one killed from the page


class Site:
    """The manager with the page, its store, the platform running the trials, and what the actions did."""

    def __init__(self, root: Path):
        self.home = root / "home"
        self.exp_dir = self.home / "experiments" / EXPERIMENT
        code = root / "code"
        code.mkdir(parents=True)
        (code / "train.py").write_text(TRAIN)
        space = {"lr": {"_type": "uniform", "_value": [0.01, 1]},
                 NOTE: {"_type": "choice", "_value": ["plain", SCRIPT_VALUE, IMG_VALUE]},
                 "steps": {"_type": "choice", "_value": [5, 100000]}, "wait": {"_type": "choice", "_value": [0, 0.2]}}
        self.config = parse_config({
            "searchSpace": space, "trialCommand": "python3 train.py", "trialCodeDirectory": str(code),
            "trialConcurrency": 6, "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}},
            "trainingService": {"platform": "local"}, "trialGraceSeconds": 10})
        self.store = Store.in_dir(self.exp_dir)
        self.store.create_experiment(EXPERIMENT, config=self.config.to_dict())
        self.server = ManagerServer(self.store).start()
        self.token = secrets.token_urlsafe(16)
        self.platform = Platform(LocalConfig(), self.exp_dir)
        self.platform.on_end = self._ended
        self.calls: List[Any] = []
        self.killed: set = set()
        install(self.server, self.store, admin_token=self.token, read_only=False, performer=self)
        self.ids = [self._submit(i, dict(params, steps=5, wait=0)) for i, params in enumerate(QUICK)]
        self.ids.append(self._submit(HOLD, {"lr": 0.01, NOTE: "held", "steps": 100000, "wait": 0.2}))
        self.ids.append(self._submit(VICTIM, {"lr": 0.02, NOTE: "victim", "steps": 100000, "wait": 0.2}))

    def _submit(self, sequence: int, params: Dict[str, Any]) -> str:
        trial_id = f"{EXPERIMENT}-{sequence:05d}"
        trial_dir = self.exp_dir / "trials" / trial_id
        token = new_token()
        self.store.add_trial(EXPERIMENT, trial_id, sequence=sequence, parameters=params, token=token,
                             trial_dir=str(trial_dir), stdout_path=str(trial_dir / "stdout.log"),
                             stderr_path=str(trial_dir / "stderr.log"))
        self.platform.submit(build_spec(self.config, EXPERIMENT, sequence, sequence, params, self.server.url, token))
        return trial_id

    # What the experiment loop does: record how a trial ended once its keeper exited.
    def _ended(self, handle: str) -> None:
        if self.store.trial(handle)["status"] in FINAL_STATUSES:
            return
        found = self.platform.status(handle)
        status = USER_CANCELED if handle in self.killed else found.status
        self.store.set_status(handle, status, exit_code=found.exit_code, reason=found.reason)

    # The page's actions, as the experiment loop would perform them: its kill is the platform's hard kill.
    def perform(self, action: Action, trial_id: Optional[str], body: Any) -> Any:
        if (action.on, action.name) != ("trial", "kill"):
            raise HttpError(501, f"this site does not {action.on} {action.name}")
        self.calls.append(("kill", trial_id))
        self.killed.add(trial_id)
        self.platform.kill(trial_id)

    def status(self, index: int) -> str:
        return self.store.trial(self.ids[index])["status"]

    def close(self) -> None:
        for trial_id in self.ids:
            self.platform.kill(trial_id)
        wait_until(lambda: all(self.status(i) in FINAL_STATUSES for i in range(len(self.ids))), 30, "trials to end")
        self.server.stop()
        self.store.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    # The trials outlive single tests: they carry this module's tag, checked at the end. So all six start at
    # once, while the tag is set, in a home of the module's own with a slot for each: a trial held for a slot
    # would start later with a test's tag and be killed as that test's leftover.
    root = tmp_path_factory.mktemp("web")
    (root / "home").mkdir()
    (root / "home" / "pools.yml").write_text(f"pools:\n  default: {{slots: {len(QUICK) + 2}}}\n")
    tag = "web-trials-" + secrets.token_hex(8)
    old = {name: os.environ.get(name) for name in (TAG, "TRIALKIT_HOME")}
    os.environ.update({TAG: tag, "TRIALKIT_HOME": str(root / "home")})
    try:
        built = Site(root)
    finally:
        for name, value in old.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
    yield built
    built.close()
    wait_until(lambda: not tagged_processes(tag), 10, "the trials' processes to end")


@pytest.fixture(scope="module")
def browser():
    started = Browser()
    yield started.driver
    left = started.close()
    assert not left, f"browser processes left running: {left}"


def open_view(driver, site: Site, view: str, ready: str) -> None:
    """Load the page at a view (the first time through the printed URL, which carries the token)."""
    if driver.current_url.startswith(site.server.url):
        driver.get(f"{site.server.url}/{view}")
        driver.refresh()  # a hash-only change would not load the page anew
    else:
        driver.get(page_url(site.server, site.token) + view)
    wait_for(driver, f"return document.body.dataset.ready === {json.dumps(ready)}", f"the {ready} view")


def cell_texts(driver, selector: str) -> List[str]:
    return driver.execute_script(
        f"return [...document.querySelectorAll({json.dumps(selector)})].map(e => e.textContent)")


# ---------------------------------------------------------------- views

def test_the_trials_table_shows_every_trial(site, browser):
    wait_until(lambda: all(site.status(i) == SUCCEEDED for i in range(len(QUICK))), 90, "the quick trials to succeed")
    open_view(browser, site, "#/", "experiments")
    assert cell_texts(browser, "#experiments tbody td:first-child") == [EXPERIMENT]
    shot(browser, "experiments")
    open_view(browser, site, f"#/exp/{EXPERIMENT}", "overview")
    shot(browser, "overview")
    open_view(browser, site, f"#/exp/{EXPERIMENT}/trials", "trials")
    wait_for(browser, f"return document.querySelectorAll('#trials tbody tr').length === {len(site.ids)}", "every trial")
    assert sorted(cell_texts(browser, "#trials tbody td:nth-child(2)")) == sorted(site.ids)
    # Sorted by metric from the page (the server orders): the best first.
    browser.find_element("css selector", "button.sort[data-sort=metric]").click()
    wait_for(browser, "return location.hash.includes('sort=metric')", "the sort to apply")
    wait_for(browser, "return document.querySelector('#trials tbody td:nth-child(2)').textContent === "
             + json.dumps(site.ids[1]), "the best trial first")
    shot(browser, "trials")


def test_a_curve_and_the_parallel_coordinates_render_with_data(site, browser):
    chosen = site.ids[:3]
    open_view(browser, site, f"#/exp/{EXPERIMENT}/trials?sel={','.join(chosen)}", "trials")
    plotted = wait_for(browser, "const u = document.getElementById('curves').uplot; return u && u.series.slice(1)"
                                ".map((s, i) => [s.label, u.data[i + 1].filter(y => y !== null).length])", "the curves")
    assert sorted(plotted) == sorted([[chosen[1] + " (best)", 5], [chosen[0], 5], [chosen[2], 5]])
    assert browser.execute_script("return document.querySelectorAll('#curves canvas').length") == 1  # drawn
    assert browser.execute_script("return document.getElementById('curves').uplot.data[0]") == [1, 2, 3, 4, 5]
    assert plotly_scripts(browser) == []  # uPlot draws the curves: no plotly on this view
    # The chart is as wide as its place, and follows it when the window is resized.
    widths = "const n = document.getElementById('curves'); return [n.uplot.width, n.clientWidth]"
    drawn, room = browser.execute_script(widths)
    assert drawn == room > 0
    try:
        browser.set_window_size(900, 1000)
        wait_for(browser, f"const n = document.getElementById('curves'); return n.clientWidth < {room} && "
                          "n.uplot.width === n.clientWidth", "the chart to follow the narrower window")
    finally:
        browser.set_window_size(1400, 1000)  # web_util.CHROMIUM_FLAGS' size, for the tests after this one
    shot(browser, "curves")

    open_view(browser, site, f"#/exp/{EXPERIMENT}/params", "params")
    dims = browser.execute_script("return document.getElementById('parcoords').data[0].dimensions"
                                  ".map(d => [d.label, d.values.length])")
    assert dims == [["lr", 4], ["&lt;i&gt;note&lt;/i&gt;", 4], ["steps", 4], ["wait", 4], ["metric", 4]]
    assert browser.execute_script("return document.querySelectorAll('#parcoords canvas').length") > 0
    assert browser.execute_script("return document.querySelectorAll('#parcoords .y-axis').length") == 5
    assert browser.execute_script("return document.querySelectorAll('#scatter .scatterlayer .point').length") == 4 * 4
    assert plotly_scripts(browser) == ["plotly"]  # parallel coordinates: the full bundle draws both charts
    shot(browser, "hyperparameters")


def test_a_live_update_gives_the_curves_their_new_points_in_the_same_chart(site, browser):
    held = site.ids[HOLD]  # reports every 0.2 s until the module ends
    open_view(browser, site, f"#/exp/{EXPERIMENT}/trials?sel={held}", "trials")
    seen = wait_for(browser, "const u = document.getElementById('curves').uplot; "
                             "if (u) u.kept = true; return u && u.data[0].length", "the held trial's curve")
    grown = wait_for(browser, "const u = document.getElementById('curves').uplot; "
                              f"return u && u.data[0].length > {seen} && [u.kept === true, u.data[0].length]",
                     "the curve to grow without a reload")
    assert grown[0], f"the chart was made anew for {grown[1]} points (from {seen})"


def plotly_scripts(driver) -> List[str]:
    """The plotly bundles the page has run, by name less their hash."""
    sources = driver.execute_script("return [...document.scripts].map(s => s.src)")
    return [src.rsplit("/", 1)[1].rsplit("-", 1)[0] for src in sources if "/static/plotly" in src]


def test_values_from_trials_show_as_text(site, browser):
    open_view(browser, site, f"#/exp/{EXPERIMENT}/trials", "trials")
    notes = cell_texts(browser, "#trials tbody td.param:nth-child(7)")
    assert SCRIPT_VALUE in notes and IMG_VALUE in notes
    assert NOTE in cell_texts(browser, "#trials thead button.sort")
    open_view(browser, site, f"#/exp/{EXPERIMENT}/trial/{site.ids[1]}", "trial")
    assert SCRIPT_VALUE in cell_texts(browser, ".params td")
    wait_for(browser, "return document.getElementById('log').textContent.includes('step 4')", "the log")
    assert LOG_MARKUP in browser.execute_script("return document.getElementById('log').textContent")
    open_view(browser, site, f"#/exp/{EXPERIMENT}/params", "params")
    # plotly's labels too: tick labels, axis titles, categories on the scatter plots.
    assert SCRIPT_VALUE in cell_texts(browser, "#parcoords .tick text")
    assert NOTE in cell_texts(browser, "#parcoords .axis-title")
    scatter = cell_texts(browser, "#scatter text")
    assert NOTE in scatter and SCRIPT_VALUE in scatter
    # Nothing ran: no script but the page's three (uPlot, app.js, plotly), no image element, nothing set by them.
    assert browser.execute_script("return document.scripts.length") == 3
    assert browser.execute_script("return document.querySelectorAll('img').length") == 0
    assert browser.execute_script("return window.pwned === undefined")
    shot(browser, "escaped")


def test_the_trial_page_shows_an_elastic_jobs_last_sizing_decision(site, browser):
    wait_until(lambda: site.status(0) == SUCCEEDED, 90, "a quick trial to succeed")
    open_view(browser, site, f"#/exp/{EXPERIMENT}/trial/{site.ids[0]}", "trial")
    assert browser.execute_script("return document.getElementById('elastic').parentElement.hidden") is False
    facts = cell_texts(browser, "#elastic dt, #elastic dd")
    assert facts[:6] == ["Workers now", "2", "Predicted speedup", "1: 1.00x  2: 1.83x", "Last decision", ELASTIC_REASON]
    assert facts[6] == "At" and facts[7] not in ("", "—")
    shot(browser, "elastic")


def test_the_trial_page_follows_its_log_without_reload(site, browser):
    hold = site.ids[HOLD]
    open_view(browser, site, f"#/exp/{EXPERIMENT}/trial/{hold}", "trial")
    browser.execute_script("window.sameDocument = true")
    first = wait_for(browser, "const m = document.getElementById('log').textContent.match(/step (\\d+)\\n$/);"
                              "return m && Number(m[1])", "log lines")
    wait_for(browser, "const m = document.getElementById('log').textContent.match(/step (\\d+)\\n$/);"
                      f"return m && Number(m[1]) >= {first + 5}", "more log lines")
    assert browser.execute_script("return window.sameDocument === true")
    shot(browser, "trial")


# ---------------------------------------------------------------- actions

def test_a_form_another_site_posts_at_the_manager_is_refused(site, browser):
    # The same refusals over plain HTTP, with and without the token, are in test_web_routes.py.
    victim = site.ids[VICTIM]
    kill = f"{site.server.url}/api/ui/experiments/{EXPERIMENT}/trials/{victim}/kill"
    # A page on another site posts a form at the manager, as a CSRF attack would.
    form = (f'<form method="post" action="{kill}"><input name="x" value="1"></form>'
            "<script>document.forms[0].submit()</script>")
    browser.get("data:text/html," + requests.utils.quote(form))
    wait_until(lambda: "refused" in browser.page_source or "token" in browser.page_source, 30, "the refusal")
    assert site.calls == [] and site.status(VICTIM) == "RUNNING"


def test_pausing_a_trial_from_the_page_pauses_it(tmp_path, monkeypatch, browser):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    held = {"lr": 0.01, NOTE: "held", "steps": 100000, "wait": 0.2}
    config = experiment(tmp_path, {k: {"_type": "choice", "_value": [v]} for k, v in held.items()}, TRAIN,
                        maxTrialNumber=1, trialGraceSeconds=10)
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        proc.stdout.readline()  # manager: ...
        url = proc.stdout.readline().split()[-1]  # page: <url with the token>
        trial = f"{exp}-00000"
        wait_until(lambda: reported(tmp_path / "home", trial) > 0, 60, "the trial to run")
        browser.get(url + "/queue")
        wait_for(browser, "return document.body.dataset.ready === 'queue'", "the queue view")
        browser.execute_script("window.sameDocument = true")
        shot(browser, "queue")
        row = f"#queue tr[data-trial='{trial}']"
        click(browser, f"{row} button[data-action=pause]", "the pause button")
        wait_until(lambda: trial_status(tmp_path / "home", trial) == PREEMPTED, 60, "the trial to be paused")
        # The page follows without a reload.
        wait_for(browser, f"return document.querySelector(\"{row} .badge\").textContent === 'PAUSED'",
                 "the page to show it")
        assert browser.execute_script("return window.sameDocument === true")
        trial_dir = tmp_path / "home" / "experiments" / exp / "trials" / trial
        assert json.loads((trial_dir / "checkpoint" / "state.json").read_text())["step"] >= 0
        shot(browser, "queue-paused")
    finally:
        # Stop the experiment (on a failure too: its trial is not left running): the paused trial stays paused.
        code = signal_and_wait(proc, signal.SIGTERM, 60)
    assert code == 1 and trial_status(tmp_path / "home", trial) == PREEMPTED


def test_a_tab_left_open_on_a_run_takes_up_the_address_again_when_trialkit_ui_serves_it(tmp_path, monkeypatch, browser):
    """Issue 40.3: a tab open on the run's page, left open past the run's end, then `trialkit ui ID` on the same
    address (port and token): without a reload the tab shows the experiment's end (its status, its counts, its
    best), says read-only (no "live"), and holds no "Failed to fetch" from while nothing answered."""
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    go, proc = gated_run(tmp_path)
    try:
        browser.get("about:blank")
        exp, url = open_the_run_and_end_it(browser, go, proc)
    finally:
        if proc.poll() is None:
            signal_and_wait(proc, signal.SIGINT, 60)
    wait_for(browser, "return document.getElementById('live').textContent === 'offline'", "the tab to go offline")
    ui = start_cli("ui", exp)
    try:
        assert ui.stdout.readline().strip() == f"trialkit ui: {url}"  # the run's address, its token
        wait_for(browser, "return document.querySelector('h1 .badge').textContent === 'DONE'", "the run's end")
        shot(browser, "tab-after-the-run")
        assert browser.execute_script("return window.sameDocument === true")  # no reload
        counts = cell_texts(browser, "#counts .card h3, #counts .card .big")
        assert counts == ["SUCCEEDED", "2"], counts
        assert cell_texts(browser, ".cards .card .big")[3] == "0.75"  # the best, which came with the trials' last words
        # Taken up by this server: plain read-only, not the run's end note telling to start what now serves it.
        wait_for(browser, "const m = document.getElementById('mode'); return !m.hidden && m.textContent === 'read-only'",
                 "the tab to take up trialkit ui's server")
        assert browser.execute_script("return document.getElementById('live').hidden") is True
        assert not re.search(r"\blive\b", browser.execute_script("return document.body.innerText"), re.I)
        assert browser.execute_script("return document.getElementById('problem').hidden") is True
    finally:
        assert signal_and_wait(ui, signal.SIGINT, 30) == 0


def test_killing_a_trial_from_its_page(site, browser):
    victim = site.ids[VICTIM]
    open_view(browser, site, f"#/exp/{EXPERIMENT}/trial/{victim}", "trial")
    click(browser, "button[data-action=kill]", "the kill button")
    wait_until(lambda: site.status(VICTIM) == USER_CANCELED, 60, "the trial to be killed")
    wait_for(browser, "return document.querySelector('h1 .badge').textContent === 'USER_CANCELED'",
             "the page to show it")
    assert ("kill", victim) in site.calls
    shot(browser, "trial-killed")




def test_the_page_says_when_the_managers_disk_takes_no_writes(tmp_path, browser):
    # A manager of its own: the module's site has keepers delivering, and a write that passes ends the condition.
    store = Store.in_dir(tmp_path / "exp")
    fill(store, "diskexp", trials=2, steps=2)
    server = ManagerServer(store).start()
    install(server, store, admin_token="disk-token", read_only=False)
    server.disk.probe_seconds = 3600  # the test says when the condition ends, not the probe (the real disk is fine)
    try:
        server.disk.failed(OSError(errno.ENOSPC, "No space left on device"), "the store")
        browser.get(page_url(server, "disk-token"))
        shown = wait_for(browser, "const d = document.getElementById('disk'); return d && !d.hidden && d.textContent",
                         "the disk badge")
        assert shown.startswith("DISK: cannot write the store in ") and "No space left on device" in shown
        server.disk.passed()
        wait_for(browser, "return document.getElementById('disk').hidden", "the badge to go once writes pass")
    finally:
        server.stop()
        store.close()


def test_a_failed_trials_log_opens_on_stderr_and_the_bare_address_asks_for_the_token(tmp_path, browser):
    """Issue 31: a failed trial's traceback is on stderr, so its log box shows that first; the bare
    http://host:port/ (as NNI users open it) asks for the printed URL rather than stand empty and offline."""
    store = Store.in_dir(tmp_path / "exp")
    store.create_experiment("failexp", config={"searchSpace": {"x": {"_type": "choice", "_value": [1]}},
                                               "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}},
                                               "trialCommand": "python3 t.py", "trainingService": {"platform": "local"}})
    trial_dir = tmp_path / "trial"
    trial_dir.mkdir()
    (trial_dir / "stdout.log").write_text("loading the data\n")
    (trial_dir / "stderr.log").write_text("Traceback (most recent call last):\nValueError: bad x\n")
    store.add_trial("failexp", "failexp-00000", sequence=0, parameters={"x": 1}, token=None, trial_dir=str(trial_dir),
                    stdout_path=str(trial_dir / "stdout.log"), stderr_path=str(trial_dir / "stderr.log"))
    store.set_status("failexp-00000", "RUNNING")
    store.set_status("failexp-00000", "FAILED", exit_code=1, reason="ValueError: bad x")
    server = ManagerServer(store).start()
    install(server, store, admin_token="fail-token", read_only=True)
    try:
        browser.get(f"{server.url}/")  # a new origin: this tab holds no token for it
        wait_for(browser, "return document.body.dataset.ready === 'token'", "the token prompt")
        assert "needs its token" in browser.execute_script("return document.getElementById('needs-token').textContent")
        browser.find_element("id", "token-input").send_keys(page_url(server, "fail-token"))
        browser.find_element("css selector", "#needs-token button").click()
        wait_for(browser, "return document.body.dataset.ready === 'experiments'", "the experiments, with the token")
        browser.get(f"{server.url}/#/exp/failexp/trial/failexp-00000")
        browser.refresh()
        log = wait_for(browser, "const t = document.getElementById('log').textContent; "
                                "return t.includes('ValueError') && t", "the failed trial's stderr")
        assert "loading the data" not in log
        on = browser.execute_script("return document.querySelector('[data-log].on').dataset.log")
        assert on == "stderr"
    finally:
        server.stop()
        store.close()


# ---------------------------------------------------------------- metrics as users wrote them, words for what is not

VIEWS_SPACE = {"lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]}, "batch": {"_type": "choice", "_value": [64, 16, 32]}}
ENDED_WHY = "the first 3 trials all failed the same way: exit code 1"


NOT_FOUND = "trialkit-keeper: nosuchcommand_xyz: command not found\n"


def views_store(root: Path) -> Store:
    """An ERROR experiment, as a read-only page finds it: an NNI trial with dict metrics (its stdout empty), a
    Determined trial paused at 20 batches and resumed from 10, a trial that failed before reporting or writing
    a log, and a Determined trial that reported its training loss and its validation accuracy (then canceled)."""
    store = Store.in_dir(root / "viewsexp")
    store.create_experiment("viewsexp", {"experimentName": "views", "searchSpace": VIEWS_SPACE,
                                         "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}}})
    for sequence, params in enumerate([{"lr": 0.001, "batch": 16}, {"lr": 0.01, "batch": 64},
                                       {"lr": 0.0001, "batch": 32}, {"lr": 0.05, "batch": 16}]):
        trial_dir = root / f"trial{sequence}"
        trial_dir.mkdir()
        if sequence != 2:  # the one that failed before it wrote anything
            (trial_dir / "stdout.log").write_text("")
        else:  # its command never started: the local keeper said so in its own log, as it does
            (trial_dir / "trial.log").write_text(NOT_FOUND)
        store.add_trial("viewsexp", f"viewsexp-{sequence:05d}", sequence=sequence, parameters=params, token=None,
                        trial_dir=str(trial_dir))
    nni = [{"seq": i + 1, "type": "PERIODICAL", "run": 0, "value": {"default": 0.1 * (i + 1), "loss": 1.0 / (i + 1)}}
           for i in range(3)]
    nni.append({"seq": 4, "type": "FINAL", "run": 0, "value": {"default": 0.5, "loss": 0.1}})
    store.add_records("viewsexp-00000", nni)
    saved = root / "trial1" / "checkpoint" / "0b5e3c1e-7d0c-4c55-9a39-4d1f3e0c8a21"  # a Core API checkpoint
    saved.mkdir(parents=True)
    (saved / "metadata.json").write_text(json.dumps({"steps_completed": 30}))
    (saved / "state").write_text("30")
    det = lambda seq, run, group, step, x: {"seq": seq, "type": "PERIODICAL", "run": run, "value": {  # noqa: E731
        "group": group, "steps_completed": step, "metrics": {"x": x, "loss": 1.0 / step}, "default": x}}
    store.add_records("viewsexp-00001", [det(1, 0, "training", 10, 1), det(2, 0, "training", 20, 2),
                                         det(3, 1, "training", 20, 2.5), det(4, 1, "training", 30, 3.5),
                                         det(5, 1, "validation", 30, 3.4), {"seq": 6, "type": "FINAL", "run": 1,
                                                                            "value": 3.4}])
    store.add_records("viewsexp-00003", [{"seq": seq, "type": "PERIODICAL", "run": 0, "value": {
        "group": group, "steps_completed": step, "metrics": {name: value}}} for seq, (group, step, name, value)
        in enumerate([("training", 10, "loss", 0.9), ("training", 20, "loss", 0.8), ("validation", 20, "accuracy",
                                                                                    0.6)], 1)])
    store.set_status("viewsexp-00003", "RUNNING")
    store.set_status("viewsexp-00003", USER_CANCELED, exit_code=143)
    for trial_id, status in (("viewsexp-00000", SUCCEEDED), ("viewsexp-00001", SUCCEEDED), ("viewsexp-00002", "FAILED")):
        store.set_status(trial_id, "RUNNING")
        store.set_status(trial_id, status, exit_code=0 if status == SUCCEEDED else 1)
    store.set_experiment_status("viewsexp", "ERROR", ENDED_WHY)
    return store


@pytest.fixture(scope="module")
def views_site(tmp_path_factory):
    store = views_store(tmp_path_factory.mktemp("views"))
    server = ManagerServer(None).start()
    install(server, store, admin_token="views-token", read_only=True)
    yield server
    server.stop()
    store.close()


def open_read_only(driver, server, view: str, ready: str, token: str = "views-token", exp: str = "viewsexp") -> None:
    driver.get("about:blank")
    driver.get(page_url(server, token, exp) + view)
    wait_for(driver, f"return document.body.dataset.ready === {json.dumps(ready)}", f"the {ready} view")


def curve(driver, node: str) -> Dict[str, Any]:
    return driver.execute_script(f"const u = document.getElementById({json.dumps(node)}).uplot; return u && "
                                 "{labels: u.series.map(s => s.label), data: u.data}")


def picker(driver, node: str) -> List[str]:
    return driver.execute_script(f"return [...document.querySelectorAll('#{node} option')].map(o => o.value)")


def test_each_metric_is_selectable_and_determined_groups_draw_against_batches(views_site, browser):
    open_read_only(browser, views_site, "/trial/viewsexp-00001", "trial")
    assert picker(browser, "trial-metric") == ["validation.x", "validation.loss", "training.x", "training.loss"]
    shown = curve(browser, "trial-curve")
    assert shown["labels"][0] == "batches (steps_completed)" and shown["data"] == [[30], [3.4]]
    browser.execute_script("const s = document.getElementById('trial-metric'); s.value = 'training.x';"
                           "s.dispatchEvent(new Event('change'))")
    # Both runs as one series, against batches; run 1's report at 20 replaced run 0's.
    wait_for(browser, "const u = document.getElementById('trial-curve').uplot; return u && u.data[0].length === 3",
             "training.x")
    assert curve(browser, "trial-curve")["data"] == [[10, 20, 30], [1, 2.5, 3.5]]
    shot(browser, "determined-trial")
    # NNI's dict metric: every key, default first; the Trials view's curves pick one for all selected trials.
    open_read_only(browser, views_site, "/trials?sel=viewsexp-00000,viewsexp-00001", "trials")
    assert picker(browser, "curve-metric") == ["default", "validation.x", "validation.loss", "loss", "training.x",
                                               "training.loss"]
    browser.execute_script("const s = document.getElementById('curve-metric'); s.value = 'loss';"
                           "s.dispatchEvent(new Event('change'))")
    # The loss curve's own values: the chart of the metric before (drawn, ready, the hash already changed) has two
    # series too, and a wait for less passed on it once.
    wait_for(browser, "const u = document.getElementById('curves').uplot; return location.hash.includes('curve=loss')"
                      " && u.series.length === 2 && JSON.stringify(u.data[1]) === JSON.stringify([1, 0.5, 1 / 3])",
             "the loss curves")
    assert curve(browser, "curves") == {"labels": ["step", "viewsexp-00000"], "data": [[1, 2, 3], [1.0, 0.5, 1 / 3]]}


def test_every_view_opened_by_its_address_is_titled_as_the_overview_is(views_site, browser):
    # A newcomer's link to the Trials view showed only the experiment's id: its name and status came only with
    # the overview's answer. Each view's own answer carries them now.
    open_read_only(browser, views_site, "", "overview")
    titled = browser.execute_script("return document.querySelector('#main > h1').textContent")
    assert titled.startswith("views (viewsexp) ") and "ERROR" in titled, titled
    for view, ready in (("/trials", "trials"), ("/params", "params"), ("/queue", "queue")):
        open_read_only(browser, views_site, view, ready)
        assert browser.execute_script("return document.querySelector('#main > h1').textContent") == titled, view


def test_a_determined_metric_is_named_as_its_user_wrote_it_with_its_group_marked(views_site, browser):
    open_read_only(browser, views_site, "/trial/viewsexp-00003", "trial")
    # Each name in one group only: as the user wrote it (not validation.accuracy, training.loss).
    assert picker(browser, "trial-metric") == ["accuracy", "loss"]
    mark = "const m = document.querySelector('.group-mark'); return [m.hidden, m.textContent, m.title]"
    assert browser.execute_script(mark) == [False, "V", "a validation metric"]
    browser.execute_script("const s = document.getElementById('trial-metric'); s.value = 'loss';"
                           "s.dispatchEvent(new Event('change'))")
    wait_for(browser, "const u = document.getElementById('trial-curve').uplot; return u && u.data[0].length === 2",
             "the loss curve")
    assert curve(browser, "trial-curve")["data"] == [[10, 20], [0.9, 0.8]]
    assert browser.execute_script(mark) == [False, "T", "a training metric"]
    assert browser.execute_script("return document.getElementById('trial-curve').uplot.axes[1].label") == \
        "loss (training)"
    shot(browser, "determined-names")
    # The API takes either name; it answers with the one shown.
    token = page_url(views_site, "views-token").split("token=")[1]
    base = f"{views_site.url}/api/ui/experiments/viewsexp/curves?trials=viewsexp-00003&metric="
    for asked in ("loss", "training.loss"):
        answer = requests.get(base + asked, headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
        assert (answer["metric"], answer["groups"], answer["series"][0]["values"]) == (
            "loss", {"accuracy": "validation", "loss": "training"}, [0.9, 0.8])


def test_an_ended_experiments_page_says_why_and_what_is_empty_in_words(views_site, browser):
    open_read_only(browser, views_site, "", "overview")
    assert browser.execute_script("return document.getElementById('ended-why').textContent") == ENDED_WHY
    assert browser.execute_script("return document.getElementById('live').hidden") is True
    assert not re.search(r"\blive\b", browser.execute_script("return document.body.innerText"), re.I)
    shot(browser, "ended-overview")
    open_read_only(browser, views_site, "/trial/viewsexp-00000", "trial")
    facts = cell_texts(browser, ".facts dt")
    assert "Final result" in facts and "Final metric" not in facts  # one row for one number
    assert cell_texts(browser, ".facts dd")[facts.index("Final result")] == "0.5 · loss 0.1"
    wait_for(browser, "return document.getElementById('log').textContent.includes('empty')", "the empty log")
    assert browser.execute_script("return document.getElementById('log').textContent") == \
        "(stdout is empty: the trial has written nothing to it)"
    open_read_only(browser, views_site, "/trial/viewsexp-00002", "trial")
    assert browser.execute_script("return document.getElementById('trial-curve').textContent") == \
        "no metrics: this trial has reported none"  # it ended: not "yet"
    wait_for(browser, "return document.getElementById('log').textContent.startsWith('(no ')", "the absent log")
    # A failed trial opens on its stderr; it wrote no log at all, and ended: not "(no stderr yet)". Its keeper's
    # words, which `trialkit trial logs` prints (trial.log), follow.
    wait_for(browser, "return document.getElementById('log').textContent.includes('command not found')", "trial.log")
    assert browser.execute_script("return document.getElementById('log').textContent") == \
        "(no stderr; the trial's log, as `trialkit trial logs viewsexp-00002` prints it:)\n" + NOT_FOUND
    open_read_only(browser, views_site, "/trials?status=RUNNING", "trials")
    assert cell_texts(browser, "#trials tbody td") == ["no trial matches these filters"]
    # The curves are the experiment's best whatever the filters (queries.curves takes no filter): said so.
    assert cell_texts(browser, ".panel h2") == ["Curves: the experiment's 4 best, regardless of the filters"]
    shot(browser, "empty-words")


def test_a_read_only_page_draws_no_empty_chart_and_asks_for_no_pool(tmp_path, browser):
    """Hyperparameters with no final metric says in one line that there is nothing to draw and why (no empty
    parallel coordinates or scatter axes); a read-only Queue view does not ask for the pool (its route answers
    501 there: the console showed the refusal) and says where the pool is shown."""
    store = Store.in_dir(tmp_path / "nofinal")
    fill(store, "nofinal", trials=3, steps=2, running=3)
    server = ManagerServer(None).start()
    try:
        install(server, store, admin_token="nofinal-token", read_only=True)
        open_read_only(browser, server, "/params", "params", token="nofinal-token", exp="nofinal")
        assert browser.execute_script("return document.querySelector('.chart-note').textContent") == \
            "Nothing to draw: these charts show each trial by its final metric, and no trial has one."
        assert browser.execute_script("return ['parcoords', 'scatter'].map(id => "
                                      "document.getElementById(id).parentElement.hidden)") == [True, True]
        assert plotly_scripts(browser) == []  # nothing drawn, nothing loaded to draw it
        open_read_only(browser, server, "/queue", "queue", token="nofinal-token", exp="nofinal")
        assert browser.execute_script("return document.getElementById('pool-note').textContent") == \
            "Read-only: the resource pool's jobs are shown by a running experiment's page."
        asked = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert any("/queue" in name for name in asked) and not any(name.endswith("/pool") for name in asked), asked
        shot(browser, "read-only-empty")
    finally:
        server.stop()
        store.close()


# A waiting trial's reason as the loop words it (queue.requeued): 190 characters.
LONG_WHY = ("activated; waiting for a free slot: 2 of 2 in use by this experiment's trials (trialConcurrency: "
            "`trialkit experiment update longwhy --trial-concurrency N` changes it)")


def test_a_long_reason_is_clipped_in_the_trials_table_and_whole_on_hover(tmp_path, browser):
    """A newcomer's long waiting reason pushed the Trials table's other columns out of its panel (a window of
    1400 pixels: web_util.CHROMIUM_FLAGS')."""
    store = Store.in_dir(tmp_path / "longwhy")
    fill(store, "longwhy", trials=2, steps=1, running=1)
    store.set_status("longwhy-00001", "WAITING", reason=LONG_WHY)
    server = ManagerServer(None).start()
    try:
        install(server, store, admin_token="longwhy-token", read_only=True)
        open_read_only(browser, server, "/trials", "trials", token="longwhy-token", exp="longwhy")
        wait_for(browser, "return document.querySelectorAll('#trials tbody tr').length === 2", "both trials")
        seen = browser.execute_script(
            "const w = document.querySelector('#trials').closest('.table-wrap');"
            "const r = document.querySelector('#trials tr[data-trial=\"longwhy-00001\"] .reason');"
            "const status = (id) => document.querySelector(`#trials tr[data-trial=\"${id}\"] td:nth-child(4)`);"
            "return {fits: w.scrollWidth <= w.clientWidth, sw: w.scrollWidth, cw: w.clientWidth, title: r.title, text: r.textContent.trim(),"
            "clipped: r.scrollHeight > r.clientHeight, width: status('longwhy-00001').getBoundingClientRect().width}")
        assert seen["fits"], seen  # no column pushed out of the table's panel
        assert seen["title"] == seen["text"] == LONG_WHY and seen["clipped"], seen
        shot(browser, "long-reason")
    finally:
        server.stop()
        store.close()


def test_parameter_axes_follow_the_search_space(views_site, browser):
    open_read_only(browser, views_site, "/params", "params")
    layout = browser.execute_script("const l = document.getElementById('scatter').layout;"
                                    "return [l.xaxis.type, l.xaxis2.type, l.xaxis2.categoryarray]")
    assert layout == ["log", "category", ["64", "16", "32"]]  # not every lr at 0, not 16..64 on a number line
    # Each axis spans the space as declared, not the values drawn (lr 0.001 and 0.01; batch 64 and 16, never 32):
    # lr from 1e-4 to 1e-1, batch with all three of its choices, on both charts.
    dims = browser.execute_script("return document.getElementById('parcoords').data[0].dimensions"
                                  ".map(d => [d.label, d.range])")
    assert dims[:2] == [["lr (log)", [-4, -1]], ["batch", [0, 2]]], dims
    ticks = browser.execute_script("return [...document.querySelectorAll('#parcoords .y-axis')].map(a => "
                                   "[...a.querySelectorAll('.tick text')].map(t => t.textContent))")
    assert ticks[:2] == [["0.0001", "0.001", "0.01", "0.1"], ["64", "16", "32"]], ticks  # as drawn
    scatter = browser.execute_script("const l = document.getElementById('scatter')._fullLayout;"
                                     "return [l.xaxis.range, l.xaxis2.range]")
    assert scatter[1] == [-0.5, 2.5] and scatter[0][0] < -4 < -1 < scatter[0][1] < -0.8, scatter
    # Labelled as the parallel coordinates are: plotly's own labels wrote 0.0001 as "100μ" (newcomer11).
    labels = browser.execute_script("return [...document.querySelectorAll('#scatter .xtick text')]"
                                    ".map(t => t.textContent)")
    assert labels == ["0.0001", "0.001", "0.01", "0.1"], labels
    shot(browser, "axes")


def test_an_integer_parameters_axes_have_whole_ticks(tmp_path, browser):
    """A randint and Hyperband's TRIAL_BUDGET (1, 3, 9: in no search space) are ticked on whole numbers only, on
    both charts, as `experiment plot` ticks them (a new user saw 1.2, 1.4 on TRIAL_BUDGET); a uniform is not."""
    store = Store.in_dir(tmp_path / "whole")
    space = {"depth": {"_type": "randint", "_value": [1, 3]}, "lr": {"_type": "uniform", "_value": [0.1, 0.2]}}
    store.create_experiment("whole", {"experimentName": "whole", "searchSpace": space,
                                      "tuner": {"name": "Hyperband", "classArgs": {"optimize_mode": "maximize"}}})
    for sequence, (budget, depth, lr) in enumerate([(1, 1, 0.11), (3, 2, 0.15), (9, 2, 0.19)]):
        trial_id = f"whole-{sequence:05d}"
        store.add_trial("whole", trial_id, sequence=sequence, token=None,
                        parameters={"TRIAL_BUDGET": budget, "depth": depth, "lr": lr})
        store.add_records(trial_id, [{"seq": 1, "type": "FINAL", "run": 0, "value": lr}])
        store.set_status(trial_id, "RUNNING")
        store.set_status(trial_id, SUCCEEDED, exit_code=0)
    server = ManagerServer(None).start()
    try:
        install(server, store, admin_token="whole-token", read_only=True)
        open_read_only(browser, server, "/params", "params", token="whole-token", exp="whole")
        labels = browser.execute_script("return document.getElementById('parcoords').data[0].dimensions"
                                        ".map(d => d.label)")
        axes = browser.execute_script("return [...document.querySelectorAll('#parcoords .y-axis')].map(a => "
                                      "[...a.querySelectorAll('.tick text')].map(t => t.textContent))")
        ticks = dict(zip(labels, axes))
        assert ticks["TRIAL_BUDGET"] == ["1", "2", "3", "4", "5", "6", "7", "8", "9"], ticks
        assert ticks["depth"] == ["1", "2", "3"], ticks  # the space's span, as experiment plot draws it
        assert any("." in tick for tick in ticks["lr"]), axes  # a float axis keeps the chart's own ticks
        layout = browser.execute_script("const l = document.getElementById('scatter')._fullLayout; return "
                                        "[1, 2, 3].map(i => [l['xaxis' + (i > 1 ? i : '')].title.text, "
                                        "l['xaxis' + (i > 1 ? i : '')]._vals.map(v => v.x)])")
        scatter = dict(layout)
        assert set(scatter["TRIAL_BUDGET"]) <= set(range(1, 10)) and len(scatter["TRIAL_BUDGET"]) > 2, layout
        assert scatter["depth"] == [1, 2, 3], layout
        assert not all(float(x).is_integer() for x in scatter["lr"]), layout
        shot(browser, "whole-ticks")
    finally:
        server.stop()
        store.close()


# NNI's PBT trial code: it saves into its save_checkpoint_dir, which no store lists.
NNI_PBT = """
import os, trialkit
p = trialkit.get_next_parameter()
os.makedirs(p["save_checkpoint_dir"], exist_ok=True)
open(os.path.join(p["save_checkpoint_dir"], "model.pth"), "w").write(str(p["x"]))
trialkit.report_final_result(p["x"])
"""


def test_a_pbt_trial_says_where_it_went_on_from_and_where_it_saves(tmp_path, monkeypatch, browser):
    """A real PBT run (NNI's PBTTuner, two members, two generations): `trial show` and the trial page of a
    second-generation trial name the trial it went on from with its member and step, and the page's Checkpoints
    says where its save_checkpoint_dir is rather than only "no checkpoint stored"."""
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    config = experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]}}, NNI_PBT, maxTrialNumber=4,
                        trialConcurrency=2, tuner={"name": "PBTTuner", "classArgs": {"population_size": 2}})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    exp = experiment_id(done.stdout.splitlines()[0])
    params = {row["trial_id"]: row["parameters"] for row in json.loads(cli("experiment", "export", exp).stdout)}
    second = f"{exp}-00002"
    load = params[second]["load_checkpoint_dir"]
    source = next(trial for trial, p in params.items() if p["save_checkpoint_dir"] == load)
    member, step = Path(load).parts[-2:]
    said = f"{source} (member {member}, step {step})"
    shown = cli("trial", "show", second).stdout.splitlines()
    assert step == "0" and f"went on from   {said}" in shown
    saves = params[second]["save_checkpoint_dir"]
    assert f"saves into     {saves} (its save_checkpoint_dir: NNI's PBT; no checkpoint store lists it)" in shown
    assert "went on from" not in cli("trial", "show", f"{exp}-00000").stdout  # a member's first step
    store = Store.in_dir(tmp_path / "home" / "experiments" / exp)
    server = ManagerServer(None).start()
    try:
        install(server, store, admin_token="pbt-token", read_only=True)
        browser.get("about:blank")
        browser.get(page_url(server, "pbt-token", exp) + f"/trial/{second}")
        wait_for(browser, "return document.body.dataset.ready === 'trial'", "the trial view")
        facts = browser.execute_script("return [...document.querySelectorAll('.facts dt')].map(d => "
                                       "[d.textContent, d.nextElementSibling.textContent])")
        assert ["Went on from", said] in facts, facts
        assert cell_texts(browser, "#checkpoints tbody td") == [
            f"none in the store: this trial saves into its save_checkpoint_dir (NNI's PBT), {saves}"]
        shot(browser, "pbt-trial")
    finally:
        server.stop()
        store.close()


def test_the_curves_title_says_there_are_none_where_no_trial_reported_an_intermediate_result(tmp_path, browser):
    """Trials that reported final results only: the curves' title says there are none, not "the 10 best"."""
    store = Store.in_dir(tmp_path / "finalonly")
    fill(store, "finalonly", trials=11, steps=0)
    server = ManagerServer(None).start()
    try:
        install(server, store, admin_token="finalonly-token", read_only=True)
        open_read_only(browser, server, "/trials", "trials", token="finalonly-token", exp="finalonly")
        assert cell_texts(browser, ".panel h2") == ["Curves: none, no trial has reported an intermediate result"]
        assert browser.execute_script("return document.getElementById('curves').textContent") == \
            "no intermediate results: these trials reported a final result only"
        # One trial has reported one, outside the 10 best shown (it has no final metric): they are the best again.
        store.add_trial("finalonly", "finalonly-late", sequence=11, parameters={}, token=None)
        store.add_records("finalonly-late", [{"seq": 1, "type": "PERIODICAL", "value": 0.1}])
        open_read_only(browser, server, "/trials", "trials", token="finalonly-token", exp="finalonly")
        assert cell_texts(browser, ".panel h2") == ["Curves: the experiment's 10 best"]
    finally:
        server.stop()
        store.close()


def test_a_refused_token_is_said_once(views_site, browser):
    browser.get("about:blank")
    browser.get(f"{views_site.url}/?token=not-the-token#/")
    said = wait_for(browser, "return document.getElementById('problem').textContent", "the refusal")
    assert said == "wrong token: open the page at the URL trialkit printed"


@pytest.fixture(scope="module")
def ties_site(tmp_path_factory):
    """Three finished trials of three steps each, 1 and 2 tied on the best final metric (stored newest first, so no
    view gets the rule by the order rows come in), in a home of their own, and a read-only page over them."""
    home = tmp_path_factory.mktemp("ties") / "home"
    store = Store.in_dir(home / "experiments" / "ties")
    store.create_experiment("ties", {"experimentName": "ties", "searchSpace": VIEWS_SPACE,
                                     "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}}})
    for sequence, final in reversed(list(enumerate([0.5, 0.9, 0.9]))):
        trial_id = f"ties-{sequence:05d}"
        store.add_trial("ties", trial_id, sequence=sequence, parameters={"lr": 0.01, "batch": 16}, token=None)
        store.add_records(trial_id, [{"seq": step, "type": "PERIODICAL", "value": final * step / 4}
                                     for step in (1, 2, 3)] + [{"seq": 4, "type": "FINAL", "value": final}])
        store.set_status(trial_id, "RUNNING")
        store.set_status(trial_id, SUCCEEDED, exit_code=0)
    store.set_experiment_status("ties", "DONE")
    server = ManagerServer(None).start()
    install(server, store, admin_token="ties-token", read_only=True)
    yield home, server
    server.stop()
    store.close()


def test_trials_tied_on_the_final_metric_have_one_best_in_every_view(ties_site, browser):
    """The CLI, the Overview, the Trials view's curve legend and its bold line all call trial 1 (the earlier of
    the two tied) the best."""
    home, server = ties_site
    shown = cli("experiment", "show", "ties", env=dict(os.environ, TRIALKIT_HOME=str(home)))
    assert re.search(r"^best +ties-00001 final=0\.9 ", shown.stdout, re.M), shown.stdout + shown.stderr
    open_read_only(browser, server, "", "overview", "ties-token", "ties")
    assert cell_texts(browser, ".card a[href*='/trial/']") == ["ties-00001"]
    open_read_only(browser, server, "/trials", "trials", "ties-token", "ties")
    drawn = wait_for(browser, "const u = document.getElementById('curves').uplot; "
                              "return u && u.series.slice(1).map(s => [s.label, s.width])", "the curves")
    assert sorted(drawn) == [["ties-00000", 1.5], ["ties-00001 (best)", 3], ["ties-00002", 1.5]]


def test_whole_steps_tick_at_whole_numbers(ties_site, browser):
    _, server = ties_site
    for view, ready, node in (("/trials", "trials", "curves"), ("/trial/ties-00000", "trial", "trial-curve")):
        open_read_only(browser, server, view, ready, "ties-token", "ties")
        ticks = wait_for(browser, f"const u = document.getElementById({json.dumps(node)}).uplot; "
                                  "return u && u.axes[0]._values", f"the {node} chart's step ticks")
        assert ticks == ["1", "2", "3"], (view, ticks)


# Before any script of the page runs: every use of ICU's formats (Intl, toLocaleString, localeCompare) is noted.
NOTE_INTL = """
window.intlUsed = [];
for (const name of ['NumberFormat', 'DateTimeFormat', 'Collator', 'PluralRules', 'RelativeTimeFormat']) {
  const real = Intl[name];
  const noted = (how) => function (target, self, args) { window.intlUsed.push(name); return how(target, self, args); };
  Intl[name] = new Proxy(real, {construct: noted((t, _, args) => Reflect.construct(t, args)), apply: noted(Reflect.apply)});
}
for (const [proto, name] of [[Number.prototype, 'toLocaleString'], [Date.prototype, 'toLocaleString'],
                             [String.prototype, 'localeCompare']]) {
  const real = proto[name];
  proto[name] = function (...args) { window.intlUsed.push(name); return real.apply(this, args); };
}
"""


def test_the_trials_view_draws_its_table_and_curves_without_icu(ties_site, browser):
    """The first use of Intl costs a fresh renderer 15-60 ms (bench/bench_web.py): the trials view, the page's
    first on a big experiment, never makes one; its chart's numbers read as the table's."""
    _, server = ties_site
    hook = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": NOTE_INTL})["identifier"]
    try:
        open_read_only(browser, server, "/trials", "trials", "ties-token", "ties")
        ticks = wait_for(browser, "const u = document.getElementById('curves').uplot; "
                                  "return u && u.axes[1]._values", "the curves' metric ticks")
        legend = browser.execute_script("const u = document.getElementById('curves').uplot; u.setCursor({left: "
                                        "u.valToPos(2, 'x'), top: 10}); return [...u.root.querySelectorAll('.u-value')]"
                                        ".map(v => v.textContent)")
        used = browser.execute_script("return window.intlUsed")
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": hook})
    assert used == [], used
    assert ticks and all(re.fullmatch(r"-?\d+(\.\d+)?", tick) for tick in ticks), ticks
    assert legend == ["2", "0.45", "0.45", "0.25"], legend  # at step 2: the step, then each trial's value, best first


def test_the_curves_keep_their_width_when_the_page_grows_past_the_window(ties_site, browser):
    """The page's scrollbar has its place from the start: a view that grows past the window keeps its width, and its
    chart is not drawn again narrower (a cold trials view of 1,000 trials drew its curves twice: bench_web.py)."""
    _, server = ties_site
    size = browser.get_window_size()
    browser.set_window_size(1400, 1600)  # the view fits: no scrollbar yet
    widths = ("const u = document.getElementById('curves').uplot; "
              "return u && [document.documentElement.scrollHeight <= innerHeight, document.getElementById('main').clientWidth,"
              " u.width]")
    try:
        open_read_only(browser, server, "/trials", "trials", "ties-token", "ties")
        fits, page, chart = wait_for(browser, widths, "the curves")
        assert fits
        browser.execute_script("document.getElementById('main').append(Object.assign(document.createElement('div'), "
                               "{style: 'height: 4000px'}))")  # as a long table would
        browser.execute_async_script("const done = arguments[0]; requestAnimationFrame(() => requestAnimationFrame(done))")
        assert browser.execute_script(widths) == [False, page, chart]
    finally:
        browser.set_window_size(size["width"], size["height"])


def test_the_trials_view_asks_its_table_and_curves_in_one_answer(ties_site, browser):
    """A cold page waits for one answer, not two (each waits its turn at a loaded machine's manager: bench_web.py);
    a new selection asks for its curves alone."""
    _, server = ties_site
    asked = "return performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('/api/ui/exp'))"
    open_read_only(browser, server, "/trials", "trials", "ties-token", "ties")
    wait_for(browser, "return document.getElementById('curves').uplot", "the curves")
    first = browser.execute_script(asked)
    assert len(first) == 1 and "/trials?" in first[0] and "with=curves" in first[0], first
    browser.execute_script("location.hash = location.hash.split('?')[0] + '?sel=ties-00000'")
    wait_for(browser, "return document.getElementById('curves').uplot.series.length === 2", "the chosen trial's curve")
    assert [name.split("?")[0].rsplit("/", 1)[-1] for name in browser.execute_script(asked)[1:]] == ["curves"]


def test_a_rows_box_selects_its_trial_for_the_curves(ties_site, browser):
    """Checking a row's box adds its trial to the selection (the address's sel) and the curves show it; unchecking
    takes it out again."""
    _, server = ties_site
    open_read_only(browser, server, "/trials", "trials", "ties-token", "ties")
    wait_for(browser, "return document.getElementById('curves').uplot", "the curves")
    box = "#trials tr[data-trial='ties-00002'] input[type=checkbox]"
    browser.find_element("css selector", box).click()
    wait_for(browser, "return location.hash.endsWith('sel=ties-00002') && "
                      "document.getElementById('curves').uplot.series.length === 2", "the checked trial's curve")
    assert browser.execute_script("return document.getElementById('curves').uplot.series[1].label") == "ties-00002"
    assert browser.find_element("css selector", box).is_selected()
    browser.find_element("css selector", box).click()
    wait_for(browser, "return !location.hash.includes('sel=') && "
                      "document.getElementById('curves').uplot.series.length === 4", "the best three again")


# Before any script of the page runs: counts the frames in which the Trials view is on show without its rows, and
# notes the width each uPlot chart is made with.
COUNT_EMPTY_FRAMES = """
window.emptyFrames = 0;
window.madeWidths = [];
let made;
Object.defineProperty(window, 'uPlot', {configurable: true, get: () => made, set: (real) => {
  made = new Proxy(real, {construct: (target, args) => { window.madeWidths.push(args[0].width); return new target(...args); }});
}});
const look = () => {
  const table = document.getElementById('trials');
  if (table && table.checkVisibility() && !document.querySelector('#trials tbody tr')) {
    window.emptyFrames += 1;
  }
  requestAnimationFrame(look);
};
requestAnimationFrame(look);
"""


def test_the_trials_view_is_built_out_of_sight_until_its_answer_is_in(ties_site, browser):
    """While its answer comes (300 ms here), the view's frame is built but not shown: no frame lays it out and paints
    it empty (that held a cold page's answer back: bench_web.py); its curves are made as wide as their place."""
    _, server = ties_site
    hook = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": COUNT_EMPTY_FRAMES})["identifier"]
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": False, "latency": 300,
                                                                 "downloadThroughput": -1, "uploadThroughput": -1})
    try:
        open_read_only(browser, server, "/trials", "trials", "ties-token", "ties")
        drawn, room = wait_for(browser, "const n = document.getElementById('curves'); "
                                        "return n.uplot && [n.uplot.width, n.clientWidth]", "the curves")
        empty, made = browser.execute_script("return [window.emptyFrames, window.madeWidths]")
    finally:
        browser.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": False, "latency": 0,
                                                                     "downloadThroughput": -1, "uploadThroughput": -1})
        browser.execute_cdp_cmd("Network.disable", {})
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": hook})
    assert empty == 0
    assert made == [drawn] and drawn == room > 0  # made once, at the width it keeps


def test_an_address_that_names_no_view_says_so_and_links_the_views(views_site, browser):
    for view in ("/hyperparameters", "/trial", "/trials/extra"):
        open_read_only(browser, views_site, view, "not-found")
        said = browser.execute_script("return document.getElementById('not-found').textContent")
        assert said.startswith(f"The page has no view at #/exp/viewsexp{view}. An experiment's views: Overview, "
                               "Trials, Hyperparameters, Queue"), said
        links = browser.execute_script("return [...document.querySelectorAll('#not-found a')].map(a => a.hash)")
        assert links == ["#/exp/viewsexp", "#/exp/viewsexp/trials", "#/exp/viewsexp/params", "#/exp/viewsexp/queue"]
        assert browser.execute_script("return document.getElementById('ended-why')") is None  # not the Overview
    shot(browser, "not-found")
    browser.get("about:blank")
    browser.get(page_url(views_site, "views-token") + "#/nowhere")
    wait_for(browser, "return document.body.dataset.ready === 'not-found'", "the not-found view")
    assert browser.execute_script("return document.getElementById('not-found').textContent") == \
        "The page has no view at #/nowhere: open the experiments list."


def test_the_checkpoints_table_fits_in_its_panel(views_site, browser):
    """A checkpoint's uuid and its path (tens of characters each) in a window of 1000 pixels: the table stays
    inside its panel and the page does not scroll sideways."""
    try:
        browser.set_window_size(1000, 1000)
        open_read_only(browser, views_site, "/trial/viewsexp-00001", "trial")
        wait_for(browser, "return document.querySelectorAll('#checkpoints tbody tr td').length === 7", "the checkpoint")
        table, panel, page = browser.execute_script(
            "const t = document.getElementById('checkpoints'); const p = t.closest('.panel');"
            "return [t.getBoundingClientRect().right, p.getBoundingClientRect().right - parseFloat("
            "getComputedStyle(p).paddingRight), [document.documentElement.scrollWidth, window.innerWidth]]")
        assert table <= panel, (table, panel)
        assert page[0] <= page[1], page
        browser.execute_script("document.getElementById('checkpoints').scrollIntoView()")
        shot(browser, "checkpoints-table")
    finally:
        browser.set_window_size(1400, 1000)  # web_util.CHROMIUM_FLAGS' size, for the tests after this one


# The quickstart's search space (examples/quickstart) and a short-named parameter more: a filter input each,
# beside Metric's; the last one's column is narrower than its input used to be (70 px).
WIDE_SPACE = {"lr": {"_type": "loguniform", "_value": [0.001, 0.3]}, "momentum": {"_type": "uniform", "_value": [0, 1]},
              "hidden_size": {"_type": "choice", "_value": [8, 32, 128]},
              "batch_size": {"_type": "choice", "_value": [16, 64, 256]}, "wd": {"_type": "choice", "_value": [0, 1]}}
WIDE_PARAMETERS = {"lr": 0.0123456789, "momentum": 0.512345678, "hidden_size": 128, "batch_size": 256, "wd": 0}


@pytest.fixture
def quickstart_site(tmp_path):
    """A read-only page of an experiment of WIDE_SPACE: three trials, one FAILED with a long reason."""
    store = Store.in_dir(tmp_path / "qs")
    store.create_experiment("qs", {"experimentName": "quickstart", "searchSpace": WIDE_SPACE,
                                   "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}}})
    for sequence in range(3):
        trial_id = f"qs-{sequence:05d}"
        store.add_trial("qs", trial_id, sequence=sequence, token=None, parameters=WIDE_PARAMETERS)
        store.add_records(trial_id, [{"seq": 1, "type": "FINAL", "value": 0.912345}])
    store.set_status("qs-00001", "FAILED", exit_code=1, reason="exit 1: Traceback (most recent call last): File "
                     "\"train.py\", line 12, ValueError: the batch does not fit")
    server = ManagerServer(None).start()
    install(server, store, admin_token="qs-token", read_only=True)
    yield server
    server.stop()
    store.close()


def test_the_trials_table_fits_a_window_of_1000_pixels(quickstart_site, browser):
    """Its filter inputs (Metric's and one per parameter) and a failed trial's reason beside its status in a window
    of 1000 pixels: the table fits its frame (no sideways scroll), the reason is cut to one line (its whole text on
    hover), and no cell spills into the next."""
    try:
        browser.set_window_size(1000, 1000)
        open_read_only(browser, quickstart_site, "/trials", "trials", token="qs-token", exp="qs")
        table, frame, cells, line, short = browser.execute_script(
            "const t = document.getElementById('trials'); const w = t.closest('.table-wrap');"
            "const r = t.querySelector('.reason');"
            "return [t.getBoundingClientRect().width, w.clientWidth, [...t.querySelectorAll('tbody tr:nth-child(2) td,"
            " thead tr.filters th')].map(c => [c.getBoundingClientRect().right, Math.max(...[...c.querySelectorAll("
            "'*')].map(e => e.getBoundingClientRect().right), 0)]), [r.getBoundingClientRect().height,"
            " parseFloat(getComputedStyle(r).lineHeight) || r.getBoundingClientRect().height],"
            " t.querySelector('input[data-filter=\"p:wd\"]').closest('th').getBoundingClientRect().width]")
        assert table <= frame, (table, frame)
        assert short < 70, short  # its input takes the room its column has, and asks for little more than 4em
        assert all(inner <= right + 0.5 for right, inner in cells), cells
        assert line[0] < 1.5 * line[1], line
        shot(browser, "trials-1000")
    finally:
        browser.set_window_size(1400, 1000)  # web_util.CHROMIUM_FLAGS' size, for the tests after this one


def test_a_page_left_lets_go_of_its_event_stream(views_site, browser):
    """A browser holds six connections to a host. Each load of the page kept its event stream open after the page
    was left (about:blank, another address), so the seventh load waited for a connection for good."""
    for _ in range(8):
        browser.get("about:blank")
        browser.get(page_url(views_site, "views-token", "viewsexp"))
        wait_for(browser, "return document.body.dataset.ready === 'overview'", "the overview", timeout=15)


def test_a_curve_is_drawn_on_an_axis_around_its_values(tmp_path, browser):
    """A newcomer's PBT trial reported 0.836 three times: uPlot's own axis took 0 in (0 to 1.5), the line drawn
    as if nothing were there to read. The axis spans the values with room either side (a tenth of the value where
    they are all one); a loss that nears 0 still starts at 0; ticks close together are told apart."""
    store = Store.in_dir(tmp_path / "close")
    store.create_experiment("close", {"searchSpace": {}, "trialConcurrency": 1})
    for sequence, values in enumerate(([0.836] * 3, [2.3, 0.4, 0.05], [0.912345 + s * 1e-7 for s in range(30)],
                                       [0.9123456 + s * 1e-7 for s in range(60)])):
        trial = f"close-{sequence:05d}"
        store.add_trial("close", trial, sequence=sequence, parameters={}, token=None)
        store.add_records(trial, [{"seq": i + 1, "type": "PERIODICAL", "sequence": i, "parameter_id": sequence,
                                   "value": value} for i, value in enumerate(values)])
    server = ManagerServer(None).start()
    try:
        install(server, store, admin_token="close-token", read_only=True)
        spans = []
        ticks = []
        for trial in ("close-00000", "close-00001", "close-00002", "close-00003"):
            open_read_only(browser, server, f"/trial/{trial}", "trial", token="close-token", exp="close")
            spans.append(wait_for(browser, "const u = document.getElementById('trial-curve').uplot; "
                                           "return u && [u.scales.y.min, u.scales.y.max]", f"{trial}'s curve"))
            ticks.append(browser.execute_script("const u = document.getElementById('trial-curve').uplot; "
                                                "return [u.axes[1]._values, u.axes[1]._size]"))
        labels = ticks[2]
        (low, high), (loss_low, loss_high) = spans[:2]
        assert 0.75 <= low < 0.836 < high <= 0.92, spans
        assert loss_low == 0 and 2.3 < loss_high <= 2.61, spans
        # 0.912345 to 0.912348: each tick its own label (six digits read 0.912346 three times), the axis wide
        # enough for them, its title clear of them.
        values, size = labels
        assert len(set(values)) == len(values) > 2 and size >= 24 + 7 * max(map(len, values)), labels
        # One precision on an axis: 0.912350 beside 0.912349, not 0.91235 (six digits, a trailing zero dropped).
        assert all(len({len(value) for value in shown}) == 1 for shown, _ in ticks[2:]), ticks
        shot(browser, "close-values")
    finally:
        server.stop()
        store.close()
