"""The newcomer's hour (issue 40): the version, the quickstart, a quick list, the page, and a broken first try.

A newcomer types `trialkit` (the console script) in their folder, which holds
the project cloned into a folder named `trialkit`. They ask `trialkit
--version`, run the quickstart (examples/quickstart, copied into their folder
and cut to 4 trials of 2 epochs), list their experiments, and open the page
from the address the run printed. Their own first experiment imports a module
they misspelled: it ends in ERROR, and the page should say why as the terminal
did. Their second, whose code dir holds their notes in a folder `trialkit/`,
they run `--detach` and watch to its end with `experiment show`; then run it
again and lose that run to a SIGKILL (`kill -9`, the OOM killer): once its
trials ended unwatched, `experiment show` and `trial list` read twice, 2 s
apart, say the same, and say it was interrupted; `experiment resume` ends it.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Dict

import pytest

from harness import wait_until
from journey import WAIT, Day, User, experiment_id, needs_chromium, page, table  # noqa: F401 (page: a fixture)

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
TRIALS = 4
LIST_BOUND = 1.5  # seconds: loose, for a loaded machine (the speed itself is measured in bench/)

BROKEN = """
import trialkit
import tqdmm  # the newcomer's typo

trialkit.report_final_result(1.0)
"""

SECOND = """
import time
import trialkit

params = trialkit.get_next_parameter()
with open(STARTS_LOG, "a") as log:
    log.write(f"{trialkit.get_trial_id()}\\n")
for epoch in range(6):
    time.sleep(0.4)  # an epoch of training
    trialkit.report_intermediate_result(params["x"] * (epoch + 1))
trialkit.report_final_result(params["x"] * 6)
"""

SECOND_CONFIG = """
experimentName: my-second
searchSpaceFile: search_space.json
trialCommand: python3 train.py
trialCodeDirectory: .
trialConcurrency: 2
maxTrialNumber: 4
tuner:
  name: Random
  classArgs:
    optimize_mode: maximize
trainingService:
  platform: local
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
    user = User(tmp_path_factory.mktemp("newcomer"), console=True)
    today = Day()
    today.user = user
    user.write("trialkit/README.md", "the project, cloned\n")  # `git clone ... trialkit`, beside their own folders
    quickstart(user)
    user.write("mine/train.py", BROKEN)
    user.write("mine/config.yml", (user.folder / "quickstart" / "config.yml").read_text().replace(
        "experimentName: quickstart", "experimentName: my-first"))
    user.write("mine/search_space.json", (QUICKSTART / "search_space.json").read_text())
    user.write("second/train.py", SECOND.replace("STARTS_LOG", repr(str(starts(user)))))
    user.write("second/config.yml", SECOND_CONFIG)
    user.write("second/search_space.json", json.dumps({"x": {"_type": "uniform", "_value": [0, 1]}}))
    user.write("second/trialkit/notes.md", "lr 0.1 diverged; try 0.01\n")  # their notes, in the code dir
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
        detach(user, today)
        killed(user, today)
    yield today
    user.stop_leftovers()


def detach(user: User, today: Day) -> None:
    """`trialkit run second/config.yml --detach`, then `experiment show` until it ended."""
    today.detached_run = user.trialkit("run", "second/config.yml", "--detach")
    assert today.detached_run.returncode == 0, today.detached_run.stdout + today.detached_run.stderr
    today.detached = experiment_id_of(today.detached_run.stdout)

    def ended() -> bool:
        today.detached_show = user.trialkit("experiment", "show", today.detached)
        return status_of(today.detached_show.stdout) not in ("RUNNING", "WAITING", None)
    wait_until(ended, WAIT, "the detached experiment's end", every=0.5)


def starts(user: User) -> Path:
    """A file of the user's where each trial of their second experiment writes its id as it starts."""
    return user.notes / "starts.log"


def started(user: User) -> int:
    return len(starts(user).read_text().split()) if starts(user).exists() else 0


def killed(user: User, today: Day) -> None:
    """The second experiment again, its `trialkit run` killed by SIGKILL while its third trial trains; two reads
    of it, 2 s apart, once its trials ended unwatched; then `experiment resume`."""
    before = started(user)
    run = user.start("run", "second/config.yml")
    try:
        today.killed = experiment_id(run)
        wait_until(lambda: started(user) >= before + 3, WAIT, "the third trial's start", every=0.1)
        time.sleep(0.5)  # it trains
        os.kill(run.proc.pid, signal.SIGKILL)
        today.killed_code = run.finish()
    finally:
        run.finish()
    wait_until(lambda: "runs unwatched" not in user.trialkit("trial", "list", today.killed).stdout, WAIT,
               "the killed run's trials to end unwatched", every=0.5)
    today.reads = []
    for _ in range(2):
        today.reads.append((user.trialkit("experiment", "show", today.killed),
                            user.trialkit("trial", "list", today.killed)))
        time.sleep(2)
    today.resumed = user.resume(today.killed)
    today.after_resume = user.trial_list(today.killed)


def experiment_id_of(text: str) -> str:
    return re.search(r"^started experiment (\S+)", text, re.M).group(1)


def status_of(shown: str) -> str:
    found = re.search(r"^status\s+(\w+)", shown, re.M)  # the word, without why it ended
    return found.group(1) if found else None


def durations(listed: str) -> Dict[str, str]:
    return {row["trial"]: row["duration"] for row in table(listed)}


def elapsed(shown: str) -> str:
    return re.search(r"^elapsed\s+(\S+)", shown, re.M).group(1)


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


# ------------------------------------------------------------------ from above the clone, notes in the code dir
def test_a_detached_run_from_the_folder_holding_the_clone_runs_to_its_end(day):
    assert "Traceback" not in day.detached_run.stderr, day.detached_run.stderr
    assert status_of(day.detached_show.stdout) == "DONE", day.detached_show.stdout
    statuses = [row["status"] for row in day.user.trial_list(day.detached).values()]
    assert statuses == ["SUCCEEDED"] * 4, statuses


# ------------------------------------------------------------------ the run lost to SIGKILL
def test_the_killed_run_was_killed_mid_way(day):
    assert day.killed_code == -signal.SIGKILL
    listed = table(day.reads[0][1].stdout)
    assert 0 < sum(row["status"] == "SUCCEEDED" for row in listed) < 4, day.reads[0][1].stdout
    assert any(row["why"].endswith("unwatched") for row in listed), day.reads[0][1].stdout  # it trained on


def test_the_killed_run_reads_the_same_2_s_apart(day):
    (shown, listed), (shown_again, listed_again) = day.reads
    assert all(done.returncode == 0 for done in (shown, listed, shown_again, listed_again))
    assert elapsed(shown.stdout) == elapsed(shown_again.stdout), (shown.stdout, shown_again.stdout)
    assert durations(listed.stdout) == durations(listed_again.stdout), (listed.stdout, listed_again.stdout)


def test_the_killed_run_says_it_was_interrupted(day):
    # The words docs/troubleshooting.md gives: INTERRUPTED in experiment show, `experiment INTERRUPTED` beside
    # each trial it had not finished in trial list.
    for shown, listed in day.reads:
        assert status_of(shown.stdout) == "INTERRUPTED", shown.stdout
        unfinished = [row for row in table(listed.stdout) if row["status"] != "SUCCEEDED"]
        assert unfinished and all(row["why"].startswith("experiment INTERRUPTED") for row in unfinished), \
            listed.stdout


def test_experiment_resume_ends_the_killed_run(day):
    assert day.resumed.code == 0, day.resumed.text
    assert any(line.startswith(f"experiment {day.killed} DONE") for line in day.resumed.lines), day.resumed.text
    assert [row["status"] for row in day.after_resume.values()] == ["SUCCEEDED"] * 4, day.after_resume


def test_nothing_the_day_started_is_left_running(day):
    assert day.user.left_running() == []
