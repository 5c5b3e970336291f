"""The Determined user's day: the Core API tutorial's stages, their own model, and a look at it all.

They copy Determined's Core API tutorial (tests/fixtures/determined, as
Determined ships it) into their project and run its stages with `trialkit
run CONFIG CONTEXT`: stage 2 (checkpoints), paused from the terminal once its
log shows 21 batches and activated again; stage 3 (adaptive ASHA over
`increment_by`). Then their own model: a Core API script that reports the
training loss every 25 batches and the validation accuracy every 50, run
with a plain config and with the config their team uses (workspace, project,
labels, min_validation_period). They read `trial list`, the exports, the
plot and the page, and `job list --resource-pool` as Determined spells it.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Dict, List

import pytest

from steps import Day, WAIT, User, experiment_id, needs_chromium, page  # noqa: F401 (page: a fixture)

TUTORIAL = Path(__file__).resolve().parent.parent / "fixtures" / "determined"

TRAIN = """
import logging
import determined as det

logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
with det.core.init() as core_context:
    loss = 1.0
    for batch in range(1, 201):
        loss *= 0.99  # a batch of training
        if batch % 25 == 0:
            core_context.train.report_training_metrics(steps_completed=batch, metrics={"loss": loss})
        if batch % 50 == 0:
            core_context.train.report_validation_metrics(steps_completed=batch, metrics={"accuracy": 1 - loss})
"""
LOSSES = {batch: 0.99 ** batch for batch in range(25, 201, 25)}
ACCURACIES = {batch: 1 - 0.99 ** batch for batch in range(50, 201, 50)}

MY_MODEL = """
name: my-model
entrypoint: python3 train.py
searcher:
  name: single
  metric: accuracy
  smaller_is_better: false
max_restarts: 0
"""

# The same, as the team's config has it: keys that describe the experiment in Determined's cluster.
TEAM = """
name: my-model
description: the model as the team trains it
workspace: research
project: vision
labels: [baseline, cpu]
entrypoint: python3 train.py
min_validation_period:
  batches: 50
searcher:
  name: single
  metric: accuracy
  smaller_is_better: false
max_restarts: 0
"""


def status_within(user: User, experiment: str, trial: str, wanted: str, timeout: float) -> str:
    """`trial list` again and again until the trial shows `wanted`; what it showed last."""
    shown = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = user.trial_list(experiment).get(trial, {}).get("status", "")
        if shown == wanted:
            break
        time.sleep(0.5)
    return shown


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    user = User(tmp_path_factory.mktemp("determined-user"))
    today = Day()
    today.user = user
    for name in ("2_checkpoints.py", "2_checkpoints.yaml", "3_hpsearch.py", "3_hpsearch.yaml"):
        shutil.copy(TUTORIAL / name, user.folder / name)
    user.write("train.py", TRAIN)
    user.write("my-model.yaml", MY_MODEL)
    user.write("team.yaml", TEAM)
    with user.acting():
        stage2 = user.start("run", "2_checkpoints.yaml", ".")
        try:
            today.stage2 = experiment_id(stage2)
            today.trial = f"{today.stage2}-00000"
            follow = user.start("trial", "logs", "-f", today.trial)
            try:
                follow.wait_for(r"x is now 21\b")  # the checkpoint at 20 batches is stored
            finally:
                follow.interrupt()
                follow.finish()
            today.pause = user.trialkit("trial", "pause", today.trial)
            today.paused = status_within(user, today.stage2, today.trial, "PAUSED", WAIT)
            today.activate = user.trialkit("trial", "activate", today.trial)
            today.stage2_code = stage2.finish()
        finally:
            stage2.finish()
        today.stage2_run = stage2
        stage3 = user.start("run", "3_hpsearch.yaml", ".")
        today.stage3 = experiment_id(stage3)
        today.stage3_code = stage3.finish()
        today.stage3_run = stage3
        mine = user.start("run", "my-model.yaml", ".")
        today.mine = experiment_id(mine)
        today.mine_code = mine.finish()
        team = user.start("run", "team.yaml", ".")
        today.team_code = team.finish()
        today.team = team
    yield today
    user.stop_leftovers()


def batches(row: dict, group: str) -> List[int]:
    """The steps_completed of one group of a trial's reports, as the export lists them."""
    return [report["steps_completed"] for report in row["intermediate"] if report.get("group") == group]


# ------------------------------------------------------------------ stage 2: pause and activate
def test_the_paused_trial_stops_with_its_checkpoint(day):
    assert day.pause.returncode == 0, day.pause.stderr
    assert day.paused == "PAUSED"  # as `trial list` names PREEMPTED
    assert day.activate.returncode == 0, day.activate.stderr


def test_the_activated_trial_runs_to_its_end(day):
    assert day.stage2_code == 0, day.stage2_run.text
    assert day.user.trial_list(day.stage2)[day.trial]["status"] == "SUCCEEDED"


def test_the_default_export_shows_steps_10_to_100_once_each(day):
    row = day.user.export(day.stage2)[0]
    assert batches(row, "training") == list(range(10, 101, 10))


def test_the_paused_run_is_preempted_in_the_runs_rows(day):
    runs = {row["run"]: row["status"] for row in day.user.export(day.stage2, "--all-runs")}
    assert runs == {0: "PREEMPTED", 1: "SUCCEEDED"}


def test_trial_list_shows_the_batches_trained(day):
    assert day.user.trial_list(day.stage2)[day.trial]["steps"] == "100"


# ------------------------------------------------------------------ stage 3: ASHA
def test_asha_stops_some_trials_and_lets_the_others_finish(day):
    assert day.stage3_code == 0, day.stage3_run.text
    shown = [row["status"] for row in day.user.trial_list(day.stage3).values()]
    assert len(shown) == 10 and "EARLY_STOPPED" in shown and "SUCCEEDED" in shown, shown
    assert set(shown) <= {"EARLY_STOPPED", "SUCCEEDED"}, shown


# ------------------------------------------------------------------ their own model
def test_their_own_model_runs_and_reports_its_validation(day):
    assert day.mine_code == 0
    row = day.user.export(day.mine)[0]
    assert row["status"] == "SUCCEEDED" and row["final"] == pytest.approx(ACCURACIES[200])


def test_the_teams_config_loads_in_one_run(day):
    assert day.team_code == 0, day.team.text
    assert all(key in day.team.text for key in ("workspace", "project", "labels", "min_validation_period"))


def test_the_plot_is_a_picture(day):
    day.user.plot(day.mine, "my-model.png")


def test_the_plot_draws_each_metric_name_chosen(day):
    loss = day.user.plot(day.mine, "loss.png", "--metric", "loss")
    assert loss != day.user.plot(day.mine, "accuracy.png", "--metric", "accuracy")


def test_job_list_takes_determineds_resource_pool_flag(day):
    done = day.user.trialkit("job", "list", "--resource-pool", "default")
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------ the page
def against(drawn: List[dict], xs: Dict[int, float]) -> bool:
    """A series drawn over exactly these batches with these values."""
    return any([x for x, _ in series["points"]] == sorted(xs) and
               [round(y, 9) for _, y in series["points"]] == [round(xs[x], 9) for x in sorted(xs)]
               for series in drawn)


def over_batches(drawn: List[dict], allowed: set) -> bool:
    """Something is drawn (a line of two points at least), and only at batches the trials reported."""
    return any(len(series["points"]) >= 2 for series in drawn) and all(
        x in allowed for series in drawn for x, _ in series["points"])


@needs_chromium()
@pytest.mark.parametrize("view, ready, chart", [("trial/{}-00000", "trial", "trial-curve"),
                                               ("trials", "trials", "curves")], ids=["trial page", "Trials view"])
def test_the_page_draws_the_metrics_against_batches(day, page, view, ready, chart):
    with day.user.viewing(page, day.mine, view.format(day.mine), ready):
        drawn = page.drawn(chart)
        assert over_batches(drawn, set(LOSSES)), drawn


@needs_chromium()
def test_each_metric_name_can_be_chosen_on_the_trial_page(day, page):
    with day.user.viewing(page, day.mine, f"trial/{day.mine}-00000", "trial"):
        for name, values in (("loss", LOSSES), ("accuracy", ACCURACIES)):
            assert page.choose(name), page.text()
            drawn = page.wait_drawn("trial-curve", lambda now: against(now, values), f"the {name} curve")
            assert against(drawn, values), (name, drawn)


@needs_chromium()
def test_the_asha_trials_are_drawn_against_batches(day, page):
    with day.user.viewing(page, day.stage3, "trials", "trials"):
        drawn = page.drawn("curves")
        assert over_batches(drawn, set(range(10, 101, 10))), drawn


def test_nothing_the_day_started_is_left_running(day):
    assert day.user.left_running() == []
