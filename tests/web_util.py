"""For the web page's tests and benchmark: stores filled with trials, and one headless Chromium.

The browser is Debian's chromium driven by its chromedriver through selenium.
It runs under a process tag of its own (conftest's rule: a module-wide
service must not count as a test's leftover) and `Browser.close()` checks
that no process carrying that tag is left.
"""
from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from experiment_util import printed_page
from harness import wait_until
from trialkit import records
from trialkit.manager.store import Store
from trialkit.statuses import FAILED, RUNNING, SUCCEEDED

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TAG = "TRIALKIT_TEST_TAG"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  # Parallel coordinates draw with WebGL: without a GPU that is SwiftShader, which
                  # Chromium now uses only when asked.
                  "--enable-unsafe-swiftshader", "--window-size=1400,1000")

SEARCH_SPACE = {"lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]},
                "batch": {"_type": "choice", "_value": [16, 32, 64]},
                "optimizer": {"_type": "choice", "_value": ["sgd", "adam"]}}


def config(max_trials: Optional[int] = None) -> Dict[str, Any]:
    """An experiment config as the store holds it (ExperimentConfig.to_dict's shape)."""
    out: Dict[str, Any] = {
        "experimentName": "web", "searchSpace": SEARCH_SPACE, "trialCommand": "python3 train.py",
        "trialConcurrency": 4, "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}},
        "trainingService": {"platform": "local"}, "maxExperimentDuration": 3600.0}
    if max_trials:
        out["maxTrialNumber"] = max_trials
    return out


def fill(store: Store, experiment_id: str, trials: int, steps: int, seed: int = 0,
         running: int = 0) -> List[str]:
    """`trials` trials with `steps` intermediate results each; all but `running` finished with a final metric."""
    rng = random.Random(seed)
    store.create_experiment(experiment_id, config(trials))
    ids = []
    for sequence in range(trials):
        trial_id = f"{experiment_id}-{sequence:05d}"
        params = {"lr": 10 ** rng.uniform(-4, -1), "batch": rng.choice([16, 32, 64]),
                  "optimizer": rng.choice(["sgd", "adam"])}
        store.add_trial(experiment_id, trial_id, sequence=sequence, parameters=params, token=None)
        quality = rng.random()
        batch = [{"seq": 1, "type": records.STATUS, "value": {"status": RUNNING}, "time": time.time()}]
        batch += [{"seq": i + 2, "type": "PERIODICAL", "sequence": i, "parameter_id": sequence,
                   "value": quality * (1 - math.exp(-(i + 1) / 20)) + rng.uniform(-0.01, 0.01)} for i in range(steps)]
        if sequence < trials - running:
            final = quality * (1 - math.exp(-steps / 20))
            batch.append({"seq": steps + 2, "type": "FINAL", "parameter_id": sequence,
                          "value": {"default": final, "loss": 1 - final}})
            batch.append({"seq": steps + 3, "type": records.STATUS, "time": time.time(),
                          "value": {"status": FAILED if sequence % 17 == 16 else SUCCEEDED, "exit_code": 0}})
        store.add_records(trial_id, batch)
        ids.append(trial_id)
    return ids


class Browser:
    """One headless Chromium (selenium's `driver`), in a fresh profile, under its own process tag."""

    def __init__(self):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.tag = "browser-" + uuid.uuid4().hex
        self.profile = tempfile.mkdtemp(prefix="trialkit-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={self.profile}")
        environ = dict(os.environ, **{TAG: self.tag})
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER, env=environ), options=options)

    def close(self) -> List[str]:
        """Quit; the command lines of any tagged process still alive after a grace (then killed)."""
        from conftest import tagged_processes

        try:
            self.driver.quit()
        finally:
            deadline = time.monotonic() + 10
            left = tagged_processes(self.tag)
            while left and time.monotonic() < deadline:
                time.sleep(0.1)
                left = tagged_processes(self.tag)
            described = []
            for proc in left:
                try:
                    described.append(" ".join(proc.cmdline())[:100])
                    proc.kill()
                except Exception:  # noqa: BLE001 - gone meanwhile
                    pass
            shutil.rmtree(self.profile, ignore_errors=True)
        return described


ARTIFACTS = Path(__file__).resolve().parent / "artifacts" / "web"


def shot(driver, name: str) -> None:
    """A screenshot of the page, kept under tests/artifacts/web for a look after a failure."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def click(driver, selector: str, what: str, timeout: float = 30) -> None:
    """A user's click on the element `selector` finds, found again where the page redrew it between the find and
    the click (a live view's rows are replaced as results come in)."""
    from selenium.common.exceptions import StaleElementReferenceException

    def clicked() -> bool:
        try:
            driver.find_element("css selector", selector).click()
        except StaleElementReferenceException:
            return False
        return True
    wait_until(clicked, timeout, what, every=0.05)


def wait_for(driver, script: str, what: str, timeout: float = 60) -> Any:
    """The script's first true answer; on a timeout, a screenshot and what the page's problem line says."""
    answer: List[Any] = []

    def check() -> bool:
        answer[:] = [driver.execute_script(script)]
        return bool(answer[0])
    try:
        wait_until(check, timeout, what, every=0.1)
    except AssertionError:
        shot(driver, "failed-" + "".join(c if c.isalnum() else "-" for c in what))
        problem = driver.execute_script("const p = document.getElementById('problem'); "
                                        "return p ? p.textContent : 'no page: ' + location.href")
        raise AssertionError(f"timed out waiting for {what}; the page says: {problem!r}") from None
    return answer[0]


def open_the_run_and_end_it(driver, go: Path, proc) -> Tuple[str, str]:
    """The page a gated run (experiment_util.gated_run) printed, open in `driver` on its RUNNING overview with the
    events stream live and the document marked (window.sameDocument: a reload would lose it); then the gate
    opened and the run ended, exit 0. (the experiment's id, the page's address)"""
    exp, url = printed_page(proc)
    driver.get(url)
    wait_for(driver, "return document.body.dataset.ready === 'overview'", "the overview")
    wait_for(driver, "return document.getElementById('live').textContent === 'live'", "the events stream")
    driver.execute_script("window.sameDocument = true")
    assert driver.execute_script("return document.querySelector('h1 .badge').textContent") == "RUNNING"
    go.write_text("")
    assert proc.wait(timeout=90) == 0
    return exp, url
