"""The page's Trials view says "yet" only where more may come: the curves of a trial that ended say it reported
none (not "none yet") while a running one's still wait. The real page in headless Chromium over a store on
disk, served live (not read-only).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from test_web import browser, wait_for  # noqa: F401 - browser: the module's Chromium
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
from trialkit.web import install, page_url

TOKEN = "words-token"


def words_store(root: Path, experiment_id: str, trials: dict, status: str) -> Store:
    """An experiment in `status` whose trials (id suffix -> status) never reported anything."""
    store = Store.in_dir(root / experiment_id)
    store.create_experiment(experiment_id, {"searchSpace": {"x": {"_type": "choice", "_value": [1]}},
                                            "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}}})
    for sequence, trial_status in enumerate(trials.values()):
        trial_id = f"{experiment_id}-{sequence:05d}"
        store.add_trial(experiment_id, trial_id, sequence=sequence, parameters={"x": 1}, token=None)
        store.set_status(trial_id, "RUNNING")
        if trial_status != "RUNNING":
            store.set_status(trial_id, trial_status, exit_code=1)
    store.set_experiment_status(experiment_id, status)
    return store


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A live page of a RUNNING experiment: one trial FAILED, one RUNNING, neither reported anything."""
    store = words_store(tmp_path_factory.mktemp("words"), "liveexp", {"failed": "FAILED", "running": "RUNNING"},
                        "RUNNING")
    server = ManagerServer(None).start()
    install(server, store, admin_token=TOKEN, read_only=False)
    yield server
    server.stop()
    store.close()


def curves_note(driver, server, exp: str, view: str) -> str:
    driver.get("about:blank")
    driver.get(page_url(server, TOKEN, exp) + view)
    wait_for(driver, "return document.body.dataset.ready === 'trials' && "
                     "document.getElementById('curves').dataset.empty !== undefined", "the trials view's curves")
    return driver.execute_script("return document.getElementById('curves').textContent")


def test_an_ended_trials_empty_curves_drop_yet_and_a_running_ones_keep_it(page, browser):  # noqa: F811
    assert curves_note(browser, page, "liveexp", "/trials?sel=liveexp-00000") == \
        "no metrics: this trial has reported none"
    assert curves_note(browser, page, "liveexp", "/trials?sel=liveexp-00001") == \
        "no metrics: this trial has reported none yet"  # it runs: it may still

