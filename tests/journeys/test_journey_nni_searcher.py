"""The NNI searcher's day (issue 42): NNI's Hyperband and PBTTuner configs, typed `trialkit` in their own folder.

They bring NNI's Hyperband example in NNI's v2 keys (`advisor: {name:
Hyperband, classArgs: {R, eta, optimize_mode, exec_mode}}`, R 9 so it is
quick; `serial`, as NNI's example offers, so the first bracket's rounds come
in one order whatever the machine's speed: under `parallelism` the next
bracket fills the slots a round's last trials leave) and a
trial that trains TRIAL_BUDGET epochs of `nni.get_next_parameter()`. They
misspell the advisor first, fix it, press Ctrl-C while the first bracket's
first round is still training, `trialkit experiment resume` it, and read
`trial list` and `experiment show`. Then a PBTTuner search (population 4, two
generations; its trials started warm, as docs/platforms.md advises for PBT's
short steps) whose trial loads `load_checkpoint_dir`, reports its final result
and then saves to `save_checkpoint_dir` (NNI's mnist-pbt example's order, a
save that takes a while), and writes which trial's checkpoint it loaded to a
file of theirs (loads.log); they press Ctrl-C once the first generation has
reported, while it saves, and resume it. The budgets and rounds are read off `trial list`
as a user would (NNI's formula is checked at the unit level in
tests/test_hyperband*.py and tests/test_searches_e2e.py; here, the day's
order through the public faces).
"""
from __future__ import annotations

import json
import re
import time
from typing import Dict, List, Set, Tuple

import pytest

from harness import wait_until
from journey import WAIT, Day, User, experiment_id, table

R, ETA = 9, 3
# NNI's first bracket for R 9, eta 3 (s_max 2): 9 configurations on budget 1, the best 3 go on at 3, the best 1 at 9.
BUDGETS = [1] * 9 + [3] * 3 + [9]
FIRST_ROUND = 9
HYPERBAND_TRIALS = len(BUDGETS)
POPULATION = 4

HYPERBAND = f"""
experimentName: nni-searcher
searchSpaceFile: search_space.json
trialCommand: python3 trial.py
trialCodeDirectory: .
trialConcurrency: 3
maxTrialNumber: {HYPERBAND_TRIALS}
advisor:
  name: ADVISOR
  classArgs:
    R: {R}
    eta: {ETA}
    optimize_mode: maximize
    exec_mode: serial
trainingService:
  platform: local
"""

# Choices only, so `trial list`'s short numbers name each configuration exactly; products distinct, so no ties.
SPACE = {"lr": {"_type": "choice", "_value": [0.11, 0.23, 0.37, 0.41, 0.53, 0.67, 0.79, 0.83, 0.97]},
         "dropout": {"_type": "choice", "_value": [0.1, 0.2, 0.3, 0.4, 0.5]}}

HYPERBAND_TRIAL = """
import time
import nni

params = nni.get_next_parameter()
with open(STARTS_LOG, "a") as log:
    log.write(f"{nni.get_trial_id()}\\n")
accuracy = 0.0
for epoch in range(params["TRIAL_BUDGET"]):
    time.sleep(0.4)  # an epoch of training
    accuracy = params["lr"] * (1 - params["dropout"]) * (epoch + 1)
    nni.report_intermediate_result(accuracy)
nni.report_final_result(accuracy)
"""

PBT = f"""
experimentName: nni-pbt
searchSpaceFile: pbt_space.json
trialCommand: python3 pbt_trial.py
trialCodeDirectory: .
trialConcurrency: {POPULATION}
maxTrialNumber: {2 * POPULATION}
tuner:
  name: PBTTuner
  classArgs:
    optimize_mode: maximize
    population_size: {POPULATION}
trainingService:
  platform: local
  warmStart: true  # docs/platforms.md's advice for PBT's short steps
"""

PBT_SPACE = {"lr": {"_type": "choice", "_value": [0.11, 0.23, 0.37, 0.41, 0.53]},
             "momentum": {"_type": "uniform", "_value": [0.1, 0.9]}}

PBT_TRIAL = """
import json, os, time
import nni

params = nni.get_next_parameter()
load = os.path.join(params["load_checkpoint_dir"], "model.json")
model = json.load(open(load)) if os.path.exists(load) else None
with open(LOADS_LOG, "a") as log:
    log.write(f"{nni.get_trial_id()} {model['trial'] if model else '-'}\\n")
time.sleep(0.3)  # a step of training
accuracy = params["lr"] * params["momentum"] + (model["accuracy"] if model else 0)
nni.report_final_result(accuracy)
with open(REPORTED_LOG, "a") as log:
    log.write(f"{nni.get_trial_id()}\\n")
time.sleep(3)  # then the model is saved, as NNI's mnist-pbt example orders it: a big one takes a while
os.makedirs(params["save_checkpoint_dir"], exist_ok=True)
with open(os.path.join(params["save_checkpoint_dir"], "model.json"), "w") as out:
    json.dump({"trial": nni.get_trial_id(), "accuracy": accuracy}, out)
"""


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    user = User(tmp_path_factory.mktemp("nni-searcher"), console=True)
    today = Day()
    today.user = user
    loads = user.notes / "loads.log"
    user.write("search_space.json", json.dumps(SPACE))
    starts = user.notes / "starts.log"
    user.write("trial.py", HYPERBAND_TRIAL.replace("STARTS_LOG", repr(str(starts))))
    user.write("config.yml", HYPERBAND.replace("ADVISOR", "Hyperbnd"))
    user.write("pbt_space.json", json.dumps(PBT_SPACE))
    reported = user.notes / "reported.log"
    user.write("pbt_trial.py", PBT_TRIAL.replace("LOADS_LOG", repr(str(loads))).replace("REPORTED_LOG",
                                                                                        repr(str(reported))))
    user.write("pbt.yml", PBT)
    with user.acting():
        today.typo = user.trialkit("run", "config.yml")
        user.write("config.yml", HYPERBAND.replace("ADVISOR", "Hyperband"))
        first = user.start("run", "config.yml")
        try:
            today.experiment = experiment_id(first)
            first.wait_for(r"^trial \S+ ", count=4)  # four trials of the first round ended ...
            wait_until(lambda: starts.exists() and len(starts.read_text().split()) >= 7, WAIT, "7 trials started")
            time.sleep(0.2)  # ... and the next are training: the user presses Ctrl-C
            today.first_code = first.ctrl_c()
        finally:
            first.finish()
        today.first = first
        today.after_ctrl_c = user.trial_list(today.experiment)
        today.resumed = user.resume(today.experiment)
        today.trials = user.trial_list(today.experiment)
        today.shown = user.trialkit("experiment", "show", today.experiment)
        pbt = user.start("run", "pbt.yml")
        try:
            today.pbt = experiment_id(pbt)
            wait_until(lambda: reported.exists() and len(reported.read_text().split()) >= POPULATION, WAIT,
                       "the first generation's final results")
            pbt.ctrl_c()  # while the first generation saves its models
        finally:
            pbt.finish()
        today.pbt_after_ctrl_c = user.trial_list(today.pbt)
        today.pbt_run = user.resume(today.pbt)
        today.pbt_code = today.pbt_run.code
        today.pbt_list = user.trialkit("trial", "list", today.pbt)
    today.loads = dict(line.split() for line in loads.read_text().splitlines()) if loads.exists() else {}
    yield today
    user.stop_leftovers()


def configuration_and_budget(row: Dict[str, str]) -> Tuple[str, int]:
    """What `trial list` says a trial tried: its configuration (the parameters but its budget) and its budget."""
    found = re.fullmatch(r"(.*), TRIAL_BUDGET=(\S+)", row["parameters"])
    assert found, row
    return found.group(1), int(found.group(2))


def budgets_by_configuration(today: Day) -> Dict[str, List[int]]:
    """Each configuration's budgets, in the order of its trials."""
    out: Dict[str, List[int]] = {}
    for trial in sorted(today.trials):
        config, budget = configuration_and_budget(today.trials[trial])
        out.setdefault(config, []).append(budget)
    return out


# ------------------------------------------------------------------ the typo
def test_a_misspelt_advisor_is_one_line_naming_hyperband(day):
    said = [line for line in day.typo.stderr.splitlines() if line.strip()]
    assert day.typo.returncode == 2 and len(said) == 1 and day.typo.stdout == "", day.typo
    assert "'Hyperband'" in said[0] and "Hyperbnd" in said[0], said


# ------------------------------------------------------------------ Ctrl-C mid-bracket and the resume
def test_ctrl_c_came_while_the_first_round_was_training(day):
    assert any(line.startswith("SIGINT") for line in day.first.lines), day.first.text
    assert any(line.startswith(f"experiment {day.experiment} STOPPED") for line in day.first.lines), day.first.text
    ended = [row for row in day.after_ctrl_c.values() if row["status"] == "SUCCEEDED"]
    assert 4 <= len(ended) < FIRST_ROUND, day.after_ctrl_c


def test_the_trials_ctrl_c_cut_short_wait_for_the_resume(day):
    # NNI's trial code saves no checkpoint: its round waits for their final results (docs/searches.md).
    cut = {trial: row["status"] for trial, row in day.after_ctrl_c.items() if row["status"] != "SUCCEEDED"}
    assert "PAUSED" in cut.values() and set(cut.values()) <= {"PAUSED", "WAITING"}, day.after_ctrl_c
    assert {trial: day.trials[trial]["status"] for trial in cut} == {trial: "SUCCEEDED" for trial in cut}


def test_the_resumed_experiment_runs_to_its_end(day):
    assert day.resumed.code == 0, day.resumed.text
    assert any(line.startswith(f"experiment {day.experiment} DONE") for line in day.resumed.lines), day.resumed.text
    assert len(day.trials) == HYPERBAND_TRIALS
    assert {row["status"] for row in day.trials.values()} == {"SUCCEEDED"}, day.trials


def test_the_trials_got_nnis_budgets_of_the_first_bracket(day):
    assert [configuration_and_budget(day.trials[trial])[1] for trial in sorted(day.trials)] == BUDGETS, day.trials


def test_no_configuration_of_a_round_is_tried_twice(day):
    tried = [configuration_and_budget(row) for row in day.trials.values()]
    assert len(set(tried)) == len(tried), sorted(tried)


def best_of(rows: List[Dict[str, str]], count: int) -> Set[str]:
    return {configuration_and_budget(row)[0] for row in sorted(rows, key=lambda row: -float(row["final"]))[:count]}


def test_each_rounds_best_went_on(day):
    # The Ctrl-C'd trials of the first round ran again before it was ranked: its best of all 9 went on.
    trials = [day.trials[trial] for trial in sorted(day.trials)]
    went_on = {config: budgets for config, budgets in budgets_by_configuration(day).items() if len(budgets) > 1}
    assert {config for config in went_on} == best_of(trials[:FIRST_ROUND], FIRST_ROUND // ETA), day.trials
    assert {config for config, budgets in went_on.items() if budgets == [1, 3, 9]} == \
        best_of(trials[FIRST_ROUND:FIRST_ROUND + 3], 1), day.trials


# ------------------------------------------------------------------ what the faces say
def test_trial_list_shows_trial_budget_whole(day):
    assert all(re.search(r"TRIAL_BUDGET=\d+$", row["parameters"]) for row in day.trials.values()), day.trials


def test_experiment_show_names_the_best_ones_budget(day):
    assert day.shown.returncode == 0, day.shown.stderr
    best = [line for line in day.shown.stdout.splitlines() if line.startswith("best")]
    assert len(best) == 1 and re.search(r"TRIAL_BUDGET\W+\d+\b", best[0]), day.shown.stdout
    # The brackets' shape as the config wrote it: what the budgets in the table follow.
    assert f"tuner       Hyperband (maximize; R={R}, eta={ETA}, exec_mode=serial)" in day.shown.stdout.splitlines()


# ------------------------------------------------------------------ PBT
def test_the_pbt_search_runs_to_its_end(day):
    assert day.pbt_code == 0, day.pbt_run.text
    assert any(line.startswith(f"experiment {day.pbt} DONE") for line in day.pbt_run.lines), day.pbt_run.text
    # Warm start took the steps: its zygote ran (warm-start.log, docs/platforms.md's Warm start), and no trial
    # started cold (each would say so, and why, on the run's output).
    assert (day.user.home / "experiments" / day.pbt / "warm-start.log").exists()
    assert "starts cold" not in day.pbt_run.text and "warmStart" not in day.pbt_run.text, day.pbt_run.text


def test_the_first_generation_ctrl_c_cut_while_it_saved_waits_to_run_again(day):
    first = sorted(day.pbt_after_ctrl_c)[:POPULATION]
    paused = [trial for trial in first if day.pbt_after_ctrl_c[trial]["status"] == "PAUSED"]
    assert paused, day.pbt_after_ctrl_c
    for trial in first:  # one whose save beat the Ctrl-C ended as usual
        row = day.pbt_after_ctrl_c[trial]
        assert row["status"] == "SUCCEEDED" or "its final result came before its end" in row["why"], row


def test_the_second_generation_loads_checkpoints_the_first_saved(day):
    trials = sorted(day.loads)
    assert len(trials) == 2 * POPULATION, day.loads
    first, second = trials[:POPULATION], trials[POPULATION:]
    assert [day.loads[trial] for trial in first] == ["-"] * POPULATION, day.loads
    assert all(day.loads[trial] in first for trial in second), day.loads


def test_trial_list_does_not_show_pbts_checkpoint_dirs(day):
    assert day.pbt_list.returncode == 0, day.pbt_list.stderr
    rows = {row["trial"]: row["parameters"] for row in table(day.pbt_list.stdout)}
    assert len(rows) == 2 * POPULATION
    assert "checkpoint_dir" not in day.pbt_list.stdout, day.pbt_list.stdout
    assert all(re.fullmatch(r"lr=\S+, momentum=\S+", shown) for shown in rows.values()), rows


def test_nothing_the_day_started_is_left_running(day):
    assert day.user.left_running() == []
