"""The newcomer's hour (issue 40): the version, the quickstart, a quick list, the page, and a broken first try.

A newcomer asks `trialkit --version`, runs the quickstart (examples/quickstart,
copied into their folder and cut to 4 trials of 2 epochs), lists their
experiments, and opens the page from the address the run printed. Their own
first experiment imports a module they misspelled: it ends in ERROR, and the
page should say why as the terminal did.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import time
from pathlib import Path

import pytest

from journey import Day, User, experiment_id, needs_chromium, page  # noqa: F401 (page: a fixture)

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
TRIALS = 4
LIST_BOUND = 1.5  # seconds: loose, for a loaded machine (the speed itself is measured in bench/)

BROKEN = """
import trialkit
import tqdmm  # the newcomer's typo

trialkit.report_final_result(1.0)
"""


def quickstart(user: User) -> None:
    """The quickstart's files as the README points to them, cut short."""
    config = (QUICKSTART / "config.yml").read_text()
    assert "maxTrialNumber: 10" in config
    user.write("quickstart/config.yml", config.replace("maxTrialNumber: 10", f"maxTrialNumber: {TRIALS}"))
    user.write("quickstart/search_space.json", (QUICKSTART / "search_space.json").read_text())
    train = (QUICKSTART / "train.py").read_text()
    assert "EPOCHS = 8" in train
    user.write("quickstart/train.py", train.replace("EPOCHS = 8", "EPOCHS = 2"))


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    user = User(tmp_path_factory.mktemp("newcomer"))
    today = Day()
    today.user = user
    quickstart(user)
    user.write("mine/train.py", BROKEN)
    user.write("mine/config.yml", (user.folder / "quickstart" / "config.yml").read_text().replace(
        "experimentName: quickstart", "experimentName: my-first"))
    user.write("mine/search_space.json", (QUICKSTART / "search_space.json").read_text())
    with user.acting():
        today.version = user.trialkit("--version")
        run = user.start("run", "quickstart/config.yml")
        today.experiment = experiment_id(run)
        today.code = run.finish()
        today.run = run
        today.list_seconds = []
        for _ in range(3):
            started = time.monotonic()
            today.listed = user.trialkit("experiment", "list")
            today.list_seconds.append(time.monotonic() - started)
        broken = user.start("run", "mine/config.yml")
        today.broken = experiment_id(broken)
        today.broken_code = broken.finish()
        today.broken_run = broken
    yield today
    user.stop_leftovers()


def test_trialkit_version_says_which_trialkit(day):
    assert day.version.returncode == 0, day.version.stderr
    assert importlib.metadata.version("trialkit") in day.version.stdout


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the quickstart trains with torch (an extra)")
def test_the_quickstart_runs_to_its_end(day):
    assert day.code == 0, day.run.text
    assert any(line.startswith(f"experiment {day.experiment} DONE") for line in day.run.lines), day.run.text
    statuses = [row["status"] for row in day.user.trial_list(day.experiment).values()]
    assert statuses == ["SUCCEEDED"] * TRIALS


def test_experiment_list_answers_at_once(day):
    assert day.listed.returncode == 0 and day.experiment in day.listed.stdout, day.listed.stderr
    assert min(day.list_seconds) < LIST_BOUND, day.list_seconds


@needs_chromium()
def test_the_printed_page_opens_after_the_run(day, page):
    with day.user.page_after(day.run) as url:
        assert url is not None, day.run.text
        page.open(url, "overview")
        assert day.experiment in page.text()


def test_the_broken_experiment_ends_saying_why(day):
    assert day.broken_code == 1
    said = day.broken_run.text
    assert re.search(r"the first \d+ trials all failed the same way: ModuleNotFoundError: No module named 'tqdmm'",
                     said), said


@needs_chromium()
def test_the_broken_experiments_page_says_why_it_stopped(day, page):
    with day.user.viewing(page, day.broken):
        shown = page.text()
        assert "all failed the same way" in shown and "tqdmm" in shown, shown


def test_nothing_the_day_started_is_left_running(day):
    assert day.user.left_running() == []
