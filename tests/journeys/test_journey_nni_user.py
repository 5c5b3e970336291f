"""The NNI user's day: their NNI v2 config and `import nni` trial, run, Ctrl-C, resume, and a look at it all.

They write a TPE search with trialConcurrency 4 and a Medianstop assessor, no
pools.yml, and a trial that reports dict metrics ({"default", "loss"}) each
epoch, saves its epoch on SIGTERM and exits 143 (docs/concepts.md, "Stopping
with a checkpoint"), and says when it reported its final result. They
`trialkit run` it, press Ctrl-C once four trials have ended and the next are
a second into training, `trialkit experiment resume` it, then read `trial
list`, `trial logs`, the export, the plot and the page. Each trial also
appends its start and end times to a file of theirs (runs.log): how
they see what ran at once.
"""
from __future__ import annotations

import json
import re
import time
from typing import Dict, List

import pytest

from harness import wait_until
from journey import (Day, WAIT, User, experiment_id, max_at_once, needs_chromium,
                   page, printed_page)  # noqa: F401 (page: a fixture)

EPOCHS = 5
TRIALS = 12

TRIAL = """
import json, os, signal, sys, time
import nni
import trialkit

RUNS = RUNS_LOG
params = nni.get_next_parameter()
state = os.path.join(trialkit.checkpoint_dir(), "state.json")
epoch = json.load(open(state))["epoch"] if os.path.exists(state) else 0
print(f"starting at epoch {epoch}", flush=True)


def runs(word):
    with open(RUNS, "a") as log:
        log.write(f"{word} {nni.get_trial_id()} {time.time()}\\n")


def save_and_leave(signum, frame):
    os.makedirs(os.path.dirname(state), exist_ok=True)
    with open(state, "w") as f:
        json.dump({"epoch": epoch}, f)
    print(f"checkpointed at epoch {epoch}", flush=True)
    runs("end")
    sys.exit(143)


signal.signal(signal.SIGTERM, save_and_leave)
runs("start")
accuracy = 0.0
while epoch < EPOCHS:
    time.sleep(0.4)  # an epoch of training
    epoch += 1
    accuracy = (1 - (params["x"] - 0.3) ** 2 - (params["y"] - 0.7) ** 2) * epoch / EPOCHS
    nni.report_intermediate_result({"default": accuracy, "loss": 1 - accuracy})
nni.report_final_result({"default": accuracy, "loss": 1 - accuracy})
print("final result reported; saving the model", flush=True)
time.sleep(1)
runs("end")
"""

CONFIG = f"""
experimentName: nni-user
searchSpaceFile: search_space.json
trialCommand: python3 trial.py
trialCodeDirectory: .
trialConcurrency: 4
maxTrialNumber: {TRIALS}
tuner:
  name: TPE
  classArgs:
    optimize_mode: maximize
    seed: 3
assessor:
  name: Medianstop
  classArgs:
    optimize_mode: maximize
    start_step: {EPOCHS}
trainingService:
  platform: local
"""

SPACE = {"x": {"_type": "uniform", "_value": [0, 1]}, "y": {"_type": "uniform", "_value": [0, 1]}}


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    user = User(tmp_path_factory.mktemp("nni-user"))
    today = Day()
    today.user = user
    runs = user.notes / "runs.log"
    user.write("trial.py", TRIAL.replace("RUNS_LOG", repr(str(runs))).replace("EPOCHS", str(EPOCHS)))
    user.write("search_space.json", json.dumps(SPACE))
    user.write("config.yml", CONFIG)
    with user.acting():
        first = user.start("run", "config.yml")
        try:
            today.experiment = experiment_id(first)
            first.wait_for(r"^trial \S+ ", count=4)  # four trials have ended
            # ... and the next are a second into training: the user presses Ctrl-C.
            wait_until(lambda: runs.exists() and runs.read_text().count("start ") >= 5, WAIT, "a fifth trial")
            time.sleep(1.2)
            today.first_code = first.ctrl_c()
        finally:
            first.finish()
        today.first = first
        today.after_ctrl_c = user.trial_list(today.experiment)
        today.export_after_ctrl_c = {row["trial_id"]: row for row in user.export(today.experiment)}
        today.logs_after_ctrl_c = {trial: user.logs(trial, started=False) for trial in today.after_ctrl_c}
        today.resumed = user.resume(today.experiment)
        today.trials = user.trial_list(today.experiment)
        today.logs = {trial: user.logs(trial, started=False) for trial in today.trials}
    today.runs = [line.split() for line in runs.read_text().splitlines()]
    yield today
    user.stop_leftovers()


def interrupted_with_a_checkpoint(today: Day) -> Dict[str, int]:
    """The trials still training when Ctrl-C came that saved their epoch: trial -> the epoch saved.
    (Those the terminal reported after its SIGINT line, whose log says they checkpointed.)"""
    lines = today.first.lines
    sigint = next(i for i, line in enumerate(lines) if line.startswith("SIGINT"))
    after = [line.split()[1] for line in lines[sigint:] if line.startswith("trial ")]
    saved = {}
    for trial in after:
        found = re.search(r"checkpointed at epoch (\d+)", today.logs_after_ctrl_c.get(trial, ""))
        if found:
            saved[trial] = int(found.group(1))
    return saved


# ------------------------------------------------------------------ the run and Ctrl-C
def test_the_run_prints_its_experiment_and_its_page(day):
    assert re.fullmatch(r"[a-z0-9]{8}", day.experiment)
    assert printed_page(day.first).startswith("http://127.0.0.1:")


def test_four_trials_run_at_once_with_no_pools_yml(day):
    # A trial started twice (resumed) counts from each start to the end that followed it.
    intervals = []
    for word, trial, at in day.runs:
        if word == "start":
            ends = [float(t) for w, tr, t in day.runs if w == "end" and tr == trial and float(t) >= float(at)]
            assert ends, f"{trial} never wrote its end"
            intervals.append((float(at), min(ends)))
    assert max_at_once(intervals) == 4


def test_ctrl_c_stops_the_run_gracefully_and_says_so(day):
    assert any(line.startswith("SIGINT: stopping the trials gracefully") for line in day.first.lines)
    assert any(line.startswith(f"experiment {day.experiment} STOPPED") for line in day.first.lines), day.first.text


def test_some_trials_were_training_when_ctrl_c_came_and_saved_their_epoch(day):
    # The day's premise: the next step judges what became of them.
    assert interrupted_with_a_checkpoint(day), day.first.text


def test_a_trial_that_saved_its_checkpoint_on_ctrl_c_is_preempted(day):
    saved = interrupted_with_a_checkpoint(day)
    assert saved  # (never true by having nothing to judge)
    shown = {trial: day.export_after_ctrl_c[trial]["status"] for trial in saved}
    assert shown == {trial: "PREEMPTED" for trial in saved}


# ------------------------------------------------------------------ the resume
def test_the_resumed_experiment_runs_to_its_end(day):
    assert day.resumed.code == 0, day.resumed.text
    assert any(line.startswith(f"experiment {day.experiment} DONE") for line in day.resumed.lines), day.resumed.text
    assert len(day.trials) >= TRIALS


def test_resume_continues_each_preempted_trial_from_its_checkpoint(day):
    saved = interrupted_with_a_checkpoint(day)
    assert saved
    for trial, epoch in saved.items():
        assert f"starting at epoch {epoch}" in day.logs[trial].split("checkpointed at epoch", 1)[-1], trial
        assert day.trials[trial]["status"] in ("SUCCEEDED", "EARLY_STOPPED"), day.trials[trial]


def test_a_resumed_search_tries_nothing_twice(day):
    tried = [json.dumps(row["parameters"], sort_keys=True) for row in day.user.export(day.experiment)]
    assert len(set(tried)) == len(tried), tried


def test_medianstop_never_stops_a_trial_that_reported_its_final_result(day):
    finished = [trial for trial, log in day.logs.items() if "final result reported" in log]
    assert finished
    assert {trial: day.trials[trial]["status"] for trial in finished
            if day.trials[trial]["status"] == "EARLY_STOPPED"} == {}


def test_trial_list_shows_each_trial_with_its_parameters(day):
    assert all(re.fullmatch(r"x=\S+, y=\S+", row["parameters"]) for row in day.trials.values()), day.trials
    assert any(row["status"] == "SUCCEEDED" and row["final"] != "-" for row in day.trials.values())


# ------------------------------------------------------------------ export and plot
def test_the_csv_export_is_flat(day):
    rows = day.user.export_csv(day.experiment)
    assert len(rows) == len(day.trials)
    nested = {(row["trial_id"], column): cell for row in rows for column, cell in row.items()
              if cell.strip()[:1] in ("[", "{")}
    assert nested == {}
    assert any("loss" in column for column in rows[0])  # the dict's other key has columns of its own


def test_the_plot_is_a_picture(day):
    day.user.plot(day.experiment, "search.png")


def test_the_plot_draws_the_metric_key_chosen(day):
    assert day.user.plot(day.experiment, "loss.png", "--metric", "loss") != day.user.plot(day.experiment, "default.png")


# ------------------------------------------------------------------ the page
def test_the_page_address_still_answers_after_the_run(day):
    with day.user.page_after(day.resumed) as url:
        assert url is not None, day.resumed.text


def reported(day: Day, key: str) -> Dict[str, List[float]]:
    """Each trial's values of one metric key, over all its runs, as the export has them."""
    out: Dict[str, List[float]] = {}
    for row in day.user.export(day.experiment, "--all-runs"):
        out.setdefault(row["trial_id"], []).extend(value[key] for value in row["intermediate"])
    return out


def drawn_from(drawn: List[dict], values: Dict[str, List[float]]) -> bool:
    """Every point a chart draws is one its trial reported, and one trial's whole curve at least is drawn.
    (A trial canceled before it reported may be named in the legend, with nothing to draw.)"""
    def trial_of(series: dict) -> str:
        return series["name"].split()[0]  # "ID" or "ID (best)"
    return any(len(series["points"]) == EPOCHS for series in drawn) and all(
        {round(y, 9) for _, y in series["points"]} <= {round(v, 9) for v in values.get(trial_of(series), [])}
        for series in drawn)


@needs_chromium()
def test_the_page_draws_each_trials_curve(day, page):
    with day.user.viewing(page, day.experiment, "trials", "trials"):
        drawn = page.drawn("curves")
        assert drawn_from(drawn, reported(day, "default")), drawn


@needs_chromium()
def test_each_metric_key_can_be_chosen_on_the_page(day, page):
    with day.user.viewing(page, day.experiment, "trials", "trials"):
        assert page.choose("loss"), page.text()
        losses = reported(day, "loss")
        drawn = page.wait_drawn("curves", lambda now: drawn_from(now, losses), "the loss curves")
        assert drawn_from(drawn, losses), drawn


def test_nothing_the_day_started_is_left_running(day):
    assert day.user.left_running() == []
