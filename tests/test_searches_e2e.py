"""NNI's own Hyperband, BOHB and PBT examples under `trialkit run`, and PBT through trialkit's checkpoint dir.

The configs in tests/fixtures/nni/mnist-advisor and mnist-pbt-tuner-pytorch
are NNI's as it ships them; their training scripts stand in for NNI's with
the same calls (TRIAL_BUDGET, the checkpoint dirs) and a closed-form model.
Each test reads what a user would: the budgets each trial got (its parameters,
and the intermediate results its budget made it report), each round's results
and which went on, which checkpoint each PBT trial loaded. Real processes, a
real manager, the store on disk.
"""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import yaml

from experiment_util import cli, experiment, experiment_id, export, interrupted_after, start_cli
from harness import wait_until
from s3_server import create_secret, kubeflow_config, s3, s3_server  # noqa: F401 - s3 fixtures: moto on loopback
from test_nni_compat import nni_python  # noqa: F401 - the fixture: the real nni 3.0's python
from trialkit.control import background
from trialkit.manager import paths
from trialkit.web import queries

EXAMPLES = Path(__file__).parent / "fixtures" / "nni"
BUDGET = "TRIAL_BUDGET"
WAIT = 300.0


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def example(tmp_path: Path, folder: str, config: str, **cut: Any) -> Path:
    """A copy of NNI's example with only `cut` changed (this machine is small and has no GPU)."""
    copy = shutil.copytree(EXAMPLES / folder, tmp_path / folder)
    data = yaml.safe_load((copy / config).read_text())
    for key, value in cut.items():
        holder, _, name = key.rpartition(".")
        (data[holder] if holder else data)[name] = value
    (copy / config).write_text(yaml.safe_dump(data))
    return copy / config


def run(config: Path) -> List[Dict[str, Any]]:
    done = cli("run", config, timeout=WAIT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = export(experiment_id(done.stdout.splitlines()[0]))
    assert [row["sequence"] for row in rows] == list(range(len(rows)))
    return rows


def configuration(row: Dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in row["parameters"].items() if k != BUDGET}, sort_keys=True)


def result(row: Dict[str, Any]) -> Optional[float]:
    """What NNI's advisors rank a trial by: its final result, else its latest intermediate one."""
    if row["final"] is not None:
        return row["final"]
    return row["intermediate"][-1] if row["intermediate"] else None


def rounds(rows: List[Dict[str, Any]], first_sizes: List[int]) -> List[List[List[Dict[str, Any]]]]:
    """The trials by bracket and round, as a user reads them off the export: a configuration not seen before
    joins the first round of the newest bracket (`first_sizes`: each bracket's, in the order they open) until it
    is full, one seen before goes on from its round."""
    brackets: List[List[List[Dict[str, Any]]]] = []
    where: Dict[str, tuple] = {}
    for row in rows:
        config = configuration(row)
        if config in where:
            b, i = where[config]
            while len(brackets[b]) <= i + 1:
                brackets[b].append([])
            brackets[b][i + 1].append(row)
            where[config] = (b, i + 1)
        else:
            if not brackets or len(brackets[-1][0]) == first_sizes[(len(brackets) - 1) % len(first_sizes)]:
                brackets.append([[]])
            brackets[-1][0].append(row)
            where[config] = (len(brackets) - 1, 0)
    return brackets

# NNI's own Bracket (hyperband_advisor.py): (n, r) of each round of each bracket, the order they open in.
NNI_BRACKETS = """
import json, math, sys
from nni.algorithms.hpo.hyperband_advisor import Bracket
R, eta = int(sys.argv[1]), int(sys.argv[2])
s_max = math.floor(math.log(R, eta) + 1e-6)
out = []
for s in range(s_max, -1, -1):
    bracket = Bracket("0-%d" % s, s, s_max, eta, R, "maximize")
    rounds = []
    while not bracket.is_completed():
        rounds.append(list(bracket.get_n_r()))
        bracket.increase_i()
    out.append(rounds)
print(json.dumps(out))
"""


def nni_brackets(nni_python: str, tmp_path: Path, r: int, eta: int) -> List[List[List[int]]]:
    script = tmp_path / "nni_brackets.py"
    script.write_text(NNI_BRACKETS)
    done = subprocess.run([nni_python, str(script), str(r), str(eta)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def check_rounds(brackets: List[List[List[Dict[str, Any]]]], expected: List[List[List[int]]], maximize: bool) -> int:
    """Each round ran NNI's budget; each full round after the first is the best of the round before. The
    number of rounds that went on."""
    checked = 0
    for b, bracket in enumerate(brackets):
        table = expected[b % len(expected)]
        for i, trials in enumerate(bracket):
            assert {row["parameters"][BUDGET] for row in trials} == {table[i][1]}, (b, i)
            if i == 0:
                continue
            ranked = sorted((row for row in bracket[i - 1] if result(row) is not None),
                            key=lambda row: (-result(row) if maximize else result(row), row["sequence"]))
            best = [configuration(row) for row in ranked[:table[i][0]]]
            assert [configuration(row) for row in trials] == best[:len(trials)], (b, i)
            checked += len(trials) == table[i][0]
    return checked


def test_nnis_hyperband_example_gives_nnis_budgets_and_sends_each_rounds_best_on(tmp_path, nni_python):
    expected = nni_brackets(nni_python, tmp_path, 100, 3)  # config_hyperband.yml: R 100, eta 3
    assert [len(b) for b in expected] == [5, 4, 3, 2, 1] and expected[0][0] == [81, 1]
    rows = run(example(tmp_path, "mnist-advisor", "config_hyperband.yml", maxTrialNum=160))
    assert len(rows) == 160 and {row["status"] for row in rows} == {"SUCCEEDED"}
    assert [row["parameters"][BUDGET] for row in rows[:81]] == [1] * 81
    # Each trial trained its budget: TRIAL_BUDGET * 10 batches, a result every 10.
    assert all(len(row["intermediate"]) == row["parameters"][BUDGET] for row in rows)
    brackets = rounds(rows, [b[0][0] for b in expected])
    # The first bracket ran to its last round (1 on budget 100) while the next ones started (parallelism).
    assert [len(r) for r in brackets[0]] == [81, 27, 9, 3, 1] and len(brackets) >= 2
    assert check_rounds(brackets, expected, maximize=True) >= 4


def test_nnis_bohb_example_runs_its_first_bracket_as_nnis_bohb_does(tmp_path):
    """config_bohb.yml: min_budget 1, max_budget 27, eta 3: NNI's BOHB opens s = 3, 27 configurations on
    budget 1, the best 9 on 3, 3 on 9, 1 on 27 (n = ceil(4 * 3^s / (s + 1)), r = 27 / 3^s, one bracket at a
    time, trialConcurrency 1)."""
    rows = run(example(tmp_path, "mnist-advisor", "config_bohb.yml", maxTrialNum=40))
    assert [row["parameters"][BUDGET] for row in rows] == [1] * 27 + [3] * 9 + [9] * 3 + [27]
    assert all(len(row["intermediate"]) == row["parameters"][BUDGET] for row in rows)
    assert check_rounds(rounds(rows, BOHB_FIRST), [[[27, 1], [9, 3], [3, 9], [1, 27]]], maximize=True) == 3


BOHB_FIRST = [27, 12, 6, 4]  # n of NNI's BOHB brackets s = 3, 2, 1, 0 for max_budget 27, min_budget 1, eta 3


def test_an_interrupted_bohb_experiment_resumes_in_the_bracket_it_was_in(tmp_path):
    exp = interrupted_after(example(tmp_path, "mnist-advisor", "config_bohb.yml", maxTrialNum=40), 15)
    before = export(exp)
    assert 15 <= len(before) < 27, len(before)  # stopped in the first round
    done = cli("experiment", "resume", exp, timeout=WAIT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = export(exp)
    # The bracket went on where it was: its first round filled up to 27 new configurations (none drawn twice),
    # then its best went on, those from before the interruption among them.
    assert [row["parameters"][BUDGET] for row in rows] == [1] * 27 + [3] * 9 + [9] * 3 + [27]
    assert len({configuration(row) for row in rows[:27]}) == 27
    assert check_rounds(rounds(rows, BOHB_FIRST), [[[27, 1], [9, 3], [3, 9], [1, 27]]], maximize=True) == 3
    assert any(row["sequence"] < len(before) for row in rows[:27] if configuration(row) in
               {configuration(r) for r in rows[27:36]})


# A trial that fails on its two best values after reporting an intermediate result (no final one).
FAILS_AT_THE_TOP = """
import sys, time, trialkit
p = trialkit.get_next_parameter()
trialkit.report_intermediate_result(p["x"])
if p["x"] >= 0.8:
    sys.exit(1)
time.sleep(0.2)
trialkit.report_final_result(p["x"])
"""


def test_a_trial_that_failed_after_reporting_goes_on_by_its_latest_result_across_a_resume(tmp_path):
    """As NNI's advisors rank a round: by the final result, else the latest intermediate one; the first of the
    two failures is told again by the resumed experiment's store, the second as it happens."""
    space = {"x": {"_type": "choice", "_value": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]}}
    config = experiment(tmp_path, space, FAILS_AT_THE_TOP, maxTrialNumber=12, trialConcurrency=1,
                        tuner={"name": "Hyperband", "classArgs": {"R": 9, "eta": 3, "exec_mode": "serial"}})
    exp = interrupted_after(config, 1, status="FAILED")
    failed = [row for row in export(exp) if row["status"] == "FAILED"]
    assert failed and failed[0]["final"] is None and failed[0]["intermediate"] == [failed[0]["parameters"]["x"]]
    done = cli("experiment", "resume", exp, timeout=WAIT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = export(exp)
    assert [row["parameters"][BUDGET] for row in rows] == [1] * 9 + [3] * 3
    assert check_rounds(rounds(rows, [9]), [[[9, 1], [3, 3], [1, 9]]], maximize=True) == 1
    assert failed[0]["parameters"]["x"] in [row["parameters"]["x"] for row in rows[9:]]  # it went on


# NNI-style trial code (no trialkit.checkpoint_dir()): the first trial on budget CUT writes MARKER after its first
# intermediate result and waits there for the Ctrl-C; every other trial runs straight through.
CUT_SHORT_ON_A_BUDGET = """
import os, time, trialkit
p = trialkit.get_next_parameter()
for epoch in range(p["TRIAL_BUDGET"]):
    trialkit.report_intermediate_result(p["x"] * (epoch + 1))
    if p["TRIAL_BUDGET"] == CUT and not os.path.exists(MARKER):
        open(MARKER, "w").close()  # its result is with the keeper: delivered by the stop at the latest
        time.sleep(120)
trialkit.report_final_result(p["x"] * p["TRIAL_BUDGET"])
"""


@pytest.mark.parametrize("tuner, cut", [
    ({"name": "Hyperband", "classArgs": {"R": 9, "eta": 3, "exec_mode": "serial"}}, 3),  # a promoted trial
    ({"name": "BOHB", "classArgs": {"min_budget": 1, "max_budget": 9, "eta": 3}}, 9),  # the bracket's last round
], ids=["hyperband", "bohb"])
def test_a_trial_cut_short_by_ctrl_c_runs_again_on_resume_and_its_round_ranks_its_final(tmp_path, tuner, cut):
    """The round waits for the trial the Ctrl-C stopped: `experiment resume` runs it again from the start (it
    saved no checkpoint), and the round goes on by its final result, not the one intermediate result it had
    reported."""
    marker = tmp_path / "cut"
    space = {"x": {"_type": "choice", "_value": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]}}
    code = CUT_SHORT_ON_A_BUDGET.replace("MARKER", repr(str(marker))).replace("CUT", str(cut))
    config = experiment(tmp_path, space, code, maxTrialNumber=13, trialConcurrency=1, tuner=tuner)
    exp = interrupted_after(config, 0, marker=marker)
    cut_short = [row for row in export(exp) if row["final"] is None]
    assert [(row["parameters"][BUDGET], row["status"], len(row["intermediate"])) for row in cut_short] == \
        [(cut, "PREEMPTED", 1)], cut_short
    done = cli("experiment", "resume", exp, timeout=WAIT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = export(exp)
    assert [row["parameters"][BUDGET] for row in rows] == [1] * 9 + [3] * 3 + [9]
    assert {row["status"] for row in rows} == {"SUCCEEDED"}
    again = next(row for row in rows if row["trial_id"] == cut_short[0]["trial_id"])
    assert again["final"] == pytest.approx(again["parameters"]["x"] * cut)
    assert check_rounds(rounds(rows, [9]), [[[9, 1], [3, 3], [1, 9]]], maximize=True) == 2


# A trial written for trialkit that keeps its epochs in trialkit.checkpoint_dir(): a configuration that goes on
# finds its round before's checkpoint there and trains only the epochs its budget adds.
CONTINUING_TRIAL = """
import json, os, trialkit
p = trialkit.get_next_parameter()
path = os.path.join(trialkit.checkpoint_dir(), "state.json")
state = json.load(open(path)) if os.path.exists(path) else {"epochs": 0, "trials": []}
for epoch in range(state["epochs"], p["TRIAL_BUDGET"]):
    trialkit.report_intermediate_result(p["x"] * (epoch + 1))
state["epochs"] = p["TRIAL_BUDGET"]
state["trials"].append(trialkit.get_trial_id())
json.dump(state, open(path, "w"))
trialkit.report_final_result(p["x"] * p["TRIAL_BUDGET"])
"""


def test_a_configuration_hyperband_sends_on_starts_from_its_round_befores_checkpoint(tmp_path, home):
    space = {"x": {"_type": "uniform", "_value": [0, 1]}}
    config = experiment(tmp_path, space, CONTINUING_TRIAL, maxTrialNumber=13, trialConcurrency=2,
                        tuner={"name": "Hyperband", "classArgs": {"R": 9, "eta": 3, "exec_mode": "serial"}})
    rows = run(config)
    assert [row["parameters"][BUDGET] for row in rows] == [1] * 9 + [3] * 3 + [9]
    by_config = {}
    for row in rows:
        line = by_config.setdefault(configuration(row), [])
        line.append(row)
        state = json.loads((home / "experiments" / row["trial_id"].rpartition("-")[0] / "trials" / row["trial_id"] /
                            "checkpoint" / "state.json").read_text())
        assert state["trials"] == [r["trial_id"] for r in line]  # each went on from the one before it
        added = row["parameters"][BUDGET] - (line[-2]["parameters"][BUDGET] if len(line) > 1 else 0)
        assert len(row["intermediate"]) == added  # it trained only the epochs its budget added
        shown = cli("trial", "show", row["trial_id"]).stdout  # trial show says which, as it does PBT's
        if len(line) == 1:
            assert "went on from" not in shown, shown
        else:
            previous = line[-2]
            said = f"{previous['trial_id']} (its round before, TRIAL_BUDGET {previous['parameters'][BUDGET]})"
            assert f"went on from   {said}" in shown, shown
            assert page_trial(home, row["trial_id"])["went_on_from"] == said  # the trial's page, alike
    assert sorted(len(line) for line in by_config.values())[-1] == 3


def page_trial(home: Path, trial_id: str) -> Dict[str, Any]:
    """The trial page's answer for the trial (the page's query on its store)."""
    experiment_id = trial_id.rpartition("-")[0]
    with closing(sqlite3.connect(home / "experiments" / experiment_id / "trialkit.db")) as db:
        db.row_factory = sqlite3.Row
        queries.register(db)
        return queries.trial(db, experiment_id, trial_id)


# ---------------------------------------------------------------- PBT


def generations(rows: List[Dict[str, Any]], size: int) -> List[List[Dict[str, Any]]]:
    return [rows[g:g + size] for g in range(0, len(rows), size)]


def heirs(rows: List[Dict[str, Any]]) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """(trial, the trial it goes on from) of each PBT trial after a member's first step: the one whose save dir it
    was given to load."""
    by_save = {row["parameters"]["save_checkpoint_dir"]: row for row in rows}
    return [(row, by_save[row["parameters"]["load_checkpoint_dir"]]) for row in rows
            if row["parameters"]["load_checkpoint_dir"] != row["parameters"]["save_checkpoint_dir"]]


def test_nnis_pbt_example_trains_each_generation_from_the_checkpoints_pbt_gives(tmp_path, home):
    rows = run(example(tmp_path, "mnist-pbt-tuner-pytorch", "config.yml", maxTrialNum=30, **{"trial.gpuNum": 0}))
    assert {row["status"] for row in rows} == {"SUCCEEDED"}
    root = home / "experiments" / rows[0]["trial_id"].rpartition("-")[0] / "checkpoint"  # NNI's default place
    population = generations(rows, 10)  # PBTTuner's default population_size
    explored: List[str] = []  # the parameters the bottom members changed from the top ones they copied
    for g, generation in enumerate(population):
        members = sorted(int(Path(row["parameters"]["save_checkpoint_dir"]).parent.name) for row in generation)
        assert members == list(range(10))
        # A generation starts once the one before ended.
        if g:
            assert min(row["started"] for row in generation) >= max(row["ended"] for row in population[g - 1])
        previous = {row["parameters"]["save_checkpoint_dir"]: row for row in population[g - 1]} if g else {}
        ranked = sorted(population[g - 1], key=lambda row: -row["final"]) if g else []
        tops = {row["parameters"]["save_checkpoint_dir"] for row in ranked[:2]}  # fraction 0.2 of 10 (NNI's)
        bottoms = {int(Path(row["parameters"]["save_checkpoint_dir"]).parent.name) for row in ranked[-2:]}
        for row in generation:
            params = row["parameters"]
            save, load = Path(params["save_checkpoint_dir"]), params["load_checkpoint_dir"]
            assert save.parent.parent == root and save.name == str(g)
            model = json.loads((save / "model.pth").read_text())  # what the trial saved
            assert model["epochs"] == g + 1  # it went on from a checkpoint each generation
            if g == 0:
                assert load == str(save) and model["loaded_from"] == []
                continue
            assert model["loaded_from"][-1] == load  # the checkpoint it loaded is the one PBT gave
            member = int(save.parent.name)
            source = previous[load]
            if member in bottoms:  # exploit a top member's checkpoint, explore its parameters
                assert load in tops
                assert params["batch_size"] in (16, 32, 64, 128) and 0 <= params["momentum"] <= 1
                explored += [key for key in ("batch_size", "lr", "momentum")
                             if params[key] != source["parameters"][key]]
            else:  # its own checkpoint, its own parameters
                assert load == str(save.parent / str(g - 1))
                assert {k: params[k] for k in ("batch_size", "lr", "momentum")} == \
                    {k: source["parameters"][k] for k in ("batch_size", "lr", "momentum")}
    assert explored  # (each is resampled or moved a step; that none of them moved is below a chance in 10,000)
    # The population got better: its mean in the last generation beats its mean in the first. (Not its best: with
    # momentum the best member can overshoot its target, and its best fell in 51 of 2000 seeds of this search driven
    # offline; the mean rose in all 2000.)
    assert sum(r["final"] for r in population[-1]) > sum(r["final"] for r in population[0])


# A trial written for trialkit: its state in trialkit.checkpoint_dir(), which PBT fills with the better trial's.
TRIALKIT_PBT_TRIAL = """
import json, os, trialkit
p = trialkit.get_next_parameter()
path = os.path.join(trialkit.checkpoint_dir(), "state.json")
state = json.load(open(path)) if os.path.exists(path) else {"w": 0.0, "line": []}
state["w"] += p["lr"] * (1.0 - state["w"])
state["line"].append(trialkit.get_trial_id())
json.dump(state, open(path, "w"))
trialkit.report_final_result(state["w"])
"""

# As NNI's mnist-pbt example orders it: the final result first, the checkpoint after (here a moment later, as a
# big one would be): the trial that goes on from it must wait for it.
SAVES_AFTER_RESULT_PBT_TRIAL = TRIALKIT_PBT_TRIAL.replace("json.dump(state, open(path, \"w\"))\n", "").replace(
    "trialkit.report_final_result(state[\"w\"])\n",
    "trialkit.report_final_result(state[\"w\"])\nimport time; time.sleep(0.5)\njson.dump(state, open(path, \"w\"))\n")

# The same, as Determined's Core API writes it: the checkpoint named by latest_checkpoint, restored and stored.
DETERMINED_PBT_TRIAL = """
import json, os
import determined as det

info = det.get_cluster_info()
with det.core.init() as core:
    state = {"w": 0.0, "line": []}
    if info.latest_checkpoint is not None:
        with core.checkpoint.restore_path(info.latest_checkpoint) as path:
            state = json.loads((path / "state.json").read_text())
    for op in core.searcher.operations():
        state["w"] += info.trial.hparams["lr"] * (1.0 - state["w"])
        state["line"].append(os.environ["TRIALKIT_TRIAL_ID"])
        with core.checkpoint.store_path({"steps_completed": len(state["line"])}) as (path, storage_id):
            (path / "state.json").write_text(json.dumps(state))
        op.report_completed(state["w"])
"""


def state_of(home: Path, row: Dict[str, Any]) -> Dict[str, Any]:
    """The trial's own saved state: in its checkpoint dir, or its latest Determined checkpoint there."""
    checkpoint = home / "experiments" / row["trial_id"].rpartition("-")[0] / "trials" / row["trial_id"] / "checkpoint"
    if (checkpoint / "latest").exists():
        checkpoint = checkpoint / (checkpoint / "latest").read_text().strip()
    return json.loads((checkpoint / "state.json").read_text())


@pytest.mark.parametrize("trial", [TRIALKIT_PBT_TRIAL, DETERMINED_PBT_TRIAL, SAVES_AFTER_RESULT_PBT_TRIAL],
                         ids=["trialkit", "determined", "saves-after-its-result"])
def test_pbt_goes_on_from_the_better_trials_checkpoint_through_the_trials_own_checkpoint_dir(tmp_path, home, trial):
    space = {"lr": {"_type": "loguniform", "_value": [0.01, 0.5]}}
    config = experiment(tmp_path, space, trial, maxTrialNumber=12, trialConcurrency=2,
                        tuner={"name": "PBTTuner", "classArgs": {"population_size": 4, "fraction": 0.25}})
    rows = run(config)
    population = generations(rows, 4)
    by_save = {row["parameters"]["save_checkpoint_dir"]: row for row in rows}
    for g, generation in enumerate(population):
        for row in generation:
            line = state_of(home, row)["line"]
            assert line[-1] == row["trial_id"] and len(line) == g + 1
            if g:  # it started from the checkpoint of the trial whose save dir PBT gave it to load
                source = by_save[row["parameters"]["load_checkpoint_dir"]]
                assert line[:-1] == state_of(home, source)["line"]
        if g:  # the worst of the generation before went on from the best one's checkpoint
            worst = min(population[g - 1], key=lambda row: row["final"])
            best = max(population[g - 1], key=lambda row: row["final"])
            heir = next(row for row in generation if Path(row["parameters"]["save_checkpoint_dir"]).parent ==
                        Path(worst["parameters"]["save_checkpoint_dir"]).parent)
            assert state_of(home, heir)["line"][:-1] == state_of(home, best)["line"]
    # Its code saved nothing into NNI's save_checkpoint_dir: trial show points at no such empty place.
    shown = cli("trial", "show", rows[-1]["trial_id"]).stdout
    assert "went on from" in shown and "saves into" not in shown, shown


@pytest.mark.parametrize("trial", [TRIALKIT_PBT_TRIAL, DETERMINED_PBT_TRIAL], ids=["trialkit", "determined"])
def test_pbt_with_an_object_store_copies_the_better_checkpoint_there_and_each_heir_restores_it(tmp_path, home, s3,
                                                                                                 trial):
    """With checkpointStorage in S3, the exploit is a copy inside the store, which the heir's keeper fetches
    before it starts: the way it works where no trial dir is shared (Kubernetes pods on other nodes)."""
    bucket = s3.bucket()
    space = {"lr": {"_type": "loguniform", "_value": [0.01, 0.5]}}
    config = experiment(tmp_path, space, trial, maxTrialNumber=8, trialConcurrency=2,
                        tuner={"name": "PBT", "classArgs": {"population_size": 4, "fraction": 0.25}},
                        checkpointStorage={"type": "s3", "bucket": bucket, "endpointUrl": s3.url})
    rows = run(config)
    assert heirs(rows)
    for row, source in heirs(rows):
        assert state_of(home, row)["line"] == state_of(home, source)["line"] + [row["trial_id"]]
        log = (home / "experiments" / row["trial_id"].rpartition("-")[0] / "trials" / row["trial_id"] /
               "trial.log").read_text()
        assert "restored checkpoint" in log and f"/{row['trial_id']}/" in log, log
    went_on = {row["trial_id"] for row, _ in heirs(rows)}
    for row in rows:  # nothing to go on from: a member's first step starts empty
        if row["trial_id"] in went_on:
            continue
        assert "restored checkpoint" not in (home / "experiments" / row["trial_id"].rpartition("-")[0] / "trials" /
                                             row["trial_id"] / "trial.log").read_text()


@pytest.mark.containers
def test_pbt_on_kubernetes_goes_on_from_the_better_trials_checkpoint_through_s3(tmp_path, home, s3, monkeypatch,
                                                                               containers, image):
    """PyTorchJob trials whose pods share no volume, checkpoints in S3: each heir's pod restores the copy of
    its source's checkpoint and goes on from it. The pods are real containers of the trial image
    (tests/pod_runner.py), reaching moto at this machine's address on their bridge."""
    from containers_util import ended, running
    from k8s_fake_api import FakeApiServer
    from pod_runner import PodRunner, host_address

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRIALKIT_PBT_TRIAL + 'print("line", json.dumps(state["line"]), flush=True)\n')
    space = {"lr": {"_type": "loguniform", "_value": [0.01, 0.5]}}
    path = kubeflow_config(tmp_path, s3, host_address(), searchSpace=space, trialConcurrency=2, maxTrialNumber=4,
                           trialCommand="python3 /code/train.py",
                           tuner={"name": "PBTTuner", "classArgs": {"population_size": 2, "fraction": 0.5}})
    with FakeApiServer() as api:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path)))
        create_secret(api, s3, "team-s3")
        with PodRunner(api, containers, image, tmp_path / "kubelet", mounts={"/code": code}) as runner:
            with running(path) as (proc, exp):
                out, err = ended(proc, runner, WAIT)
                assert proc.returncode == 0, out + err + runner.describe()
            logs = "\n".join(runner.logs(pod) for pod in runner.history)
    rows = export(exp)
    assert logs.count("restored checkpoint") == 2, logs
    for row in generations(rows, 2)[0]:
        assert f'line {json.dumps([row["trial_id"]])}' in logs, logs
    for row, source in heirs(rows):  # its pod had none of the source's files but what it fetched from S3
        assert f'line {json.dumps([source["trial_id"], row["trial_id"]])}' in logs, logs


@pytest.mark.slow
def test_pbt_on_the_ray_platform_copies_the_better_checkpoint_too(ray_cluster, tmp_path, home):
    space = {"lr": {"_type": "loguniform", "_value": [0.01, 0.5]}}
    config = experiment(tmp_path, space, TRIALKIT_PBT_TRIAL, maxTrialNumber=8, trialConcurrency=2,
                        nniManagerIp="127.0.0.1",
                        tuner={"name": "PBT", "classArgs": {"population_size": 4, "fraction": 0.25}},
                        trainingService={"platform": "ray", "address": ray_cluster.address, "cpusPerTrial": 1})
    rows = run(config)
    assert heirs(rows)
    for row, source in heirs(rows):
        assert state_of(home, row)["line"] == state_of(home, source)["line"] + [row["trial_id"]]
    ray_cluster.wait_clean()


# NNI-style PBT trial code: its state in load_checkpoint_dir, left in save_checkpoint_dir at its end. The first
# trial of generation 1 writes MARKER and waits there for the Ctrl-C.
PBT_CUT_SHORT = """
import json, os, time, trialkit
p = trialkit.get_next_parameter()
load = os.path.join(p["load_checkpoint_dir"], "state.json")
state = json.load(open(load)) if os.path.exists(load) else {"steps": 0}
state["steps"] += 1
if state["steps"] == 2 and not os.path.exists(MARKER):
    open(MARKER, "w").close()
    time.sleep(120)
os.makedirs(p["save_checkpoint_dir"], exist_ok=True)
json.dump(state, open(os.path.join(p["save_checkpoint_dir"], "state.json"), "w"))
trialkit.report_final_result(p["lr"] * state["steps"])
"""


def cut_short_pbt(tmp_path: Path, script: str, synchronous: bool) -> Tuple[str, List[Dict[str, Any]]]:
    """A 12-trial PBT of `script` (population 4, 2 at once), Ctrl-C'd once a trial wrote its MARKER: the
    experiment's id and its trials then."""
    marker = tmp_path / "cut"
    space = {"lr": {"_type": "loguniform", "_value": [0.01, 0.5]}}
    config = experiment(tmp_path, space, script.replace("MARKER", repr(str(marker))), maxTrialNumber=12,
                        trialConcurrency=2,
                        tuner={"name": "PBTTuner", "classArgs": {"population_size": 4, "fraction": 0.25,
                                                                 "synchronous": synchronous}})
    exp = interrupted_after(config, 0, marker=marker)
    return exp, export(exp)


def test_a_pbt_generation_cut_short_by_ctrl_c_runs_its_members_again_on_resume(tmp_path):
    """As NNI's PBTTuner resumes: the generation a Ctrl-C cut short runs its unfinished members again (from the
    checkpoint of the generation before, which they had not replaced), and the next generation starts once it
    ended, each member loading a checkpoint that exists: every trial of generation g trained g + 1 steps."""
    exp, before = cut_short_pbt(tmp_path, PBT_CUT_SHORT, True)
    cut = [row["trial_id"] for row in before if row["final"] is None and row["status"] != "WAITING"]
    assert cut and {row["status"] for row in before if row["trial_id"] in cut} == {"PREEMPTED"}, before
    assert len(before) < 9  # generation 2 had not started
    done = cli("experiment", "resume", exp, timeout=WAIT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = export(exp)
    # (A trial the Ctrl-C found past its final result ran again too: the next generation loads its checkpoint.)
    assert len(rows) == 12 and all(row["final"] is not None for row in rows), rows
    assert {row["status"] for row in rows if row["trial_id"] in cut} == {"SUCCEEDED"}
    for g, generation in enumerate(generations(rows, 4)):
        for row in generation:
            saved = Path(row["parameters"]["save_checkpoint_dir"]) / "state.json"
            assert json.loads(saved.read_text())["steps"] == g + 1, (g, row)


# NNI's mnist-pbt order: the final result, then the save. Member 3, the best, at its first step's first try,
# reports its final result once the other members saved theirs (its generation is then complete, and the loop
# makes the next one, whose trials go on from it), and writes MARKER 2 s later, waiting there for the Ctrl-C
# with its checkpoint not yet saved.
PBT_SAVES_AFTER_ITS_FINAL = """
import json, os, time, trialkit
p = trialkit.get_next_parameter()
save = p["save_checkpoint_dir"]
root, (member, step) = os.path.dirname(os.path.dirname(save)), save.split(os.sep)[-2:]
load = os.path.join(p["load_checkpoint_dir"], "state.json")
state = json.load(open(load)) if os.path.exists(load) else {"steps": 0}
state["steps"] += 1
cut = (member, step) == ("3", "0") and not os.path.exists(MARKER)
while cut and not all(os.path.exists(os.path.join(root, str(m), "0", "state.json")) for m in range(3)):
    time.sleep(0.05)
trialkit.report_final_result(1000.0 if member == "3" else p["lr"] * state["steps"])
if cut:
    time.sleep(2)
    open(MARKER, "w").close()
    time.sleep(120)
os.makedirs(save, exist_ok=True)
json.dump(state, open(os.path.join(save, "state.json"), "w"))
"""


def test_a_pbt_trial_stopped_after_its_final_result_but_before_its_save_runs_again_before_its_heirs(tmp_path):
    """Its generation has its result, but the next one loads its checkpoint: `experiment resume` runs it again,
    and the trials that go on from it, made before the stop, wait for that run's end (else each would load a
    checkpoint never written)."""
    exp, before = cut_short_pbt(tmp_path, PBT_SAVES_AFTER_ITS_FINAL, True)
    cut = next(row for row in before if place(row) == (3, 0))
    assert cut["status"] == "PREEMPTED" and cut["final"] == 1000.0, cut
    heirs_made = [row for row in before if row["parameters"]["load_checkpoint_dir"] == cut["parameters"]["save_checkpoint_dir"]
                  and row is not cut]
    assert heirs_made and {row["status"] for row in heirs_made} == {"WAITING"}, before
    done = cli("experiment", "resume", exp, timeout=WAIT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = export(exp)
    assert len(rows) == 12 and {row["status"] for row in rows} == {"SUCCEEDED"}, rows
    for g, generation in enumerate(generations(rows, 4)):
        for row in generation:
            saved = Path(row["parameters"]["save_checkpoint_dir"]) / "state.json"
            assert json.loads(saved.read_text())["steps"] == g + 1, (g, row)


def test_a_paused_trial_whose_heirs_wait_holds_only_them_and_they_say_so(tmp_path):
    """`trial pause` of a trial between its final result and its save: the trials that go on from it wait for
    its end, each saying so in its reason, and the other trials of the next generation run meanwhile (newcomer16:
    nothing ran until it was activated); activated, it runs again, and its heirs load what it then saved."""
    marker = tmp_path / "cut"
    space = {"lr": {"_type": "loguniform", "_value": [0.01, 0.5]}}
    config = experiment(tmp_path, space, PBT_SAVES_AFTER_ITS_FINAL.replace("MARKER", repr(str(marker))),
                        maxTrialNumber=8, trialConcurrency=2,
                        tuner={"name": "PBTTuner", "classArgs": {"population_size": 4, "fraction": 0.25}})
    done = cli("run", config, "--detach")
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    try:
        pause_the_cut_one_then_activate_it(exp, marker)
    finally:
        cli("experiment", "stop", exp)  # a failed step leaves no run behind (stopping an ended one says so)


def pause_the_cut_one_then_activate_it(exp: str, marker: Path) -> None:
    wait_until(marker.exists, WAIT, "member 3's final result")
    cut = next(row for row in export(exp) if place(row) == (3, 0))["trial_id"]
    assert cli("trial", "pause", cut).returncode == 0
    rows: List[Dict[str, Any]] = []

    def others_ran() -> bool:
        rows[:] = export(exp)
        heirs = [r for r in rows if r["sequence"] >= 4 and r["parameters"]["load_checkpoint_dir"].endswith("3/0")]
        others = [r for r in rows if r["sequence"] >= 4 and r not in heirs]
        return bool(heirs) and len(others) + len(heirs) == 4 and all(r["status"] == "SUCCEEDED" for r in others)

    wait_until(others_ran, WAIT, "the next generation's trials that do not go on from the paused one")
    waiting = [r for r in rows if r["sequence"] >= 4 and r["status"] == "WAITING"]
    assert waiting and all(r["reason"] == f"waits for {cut}'s end: it goes on from its checkpoint"
                           for r in waiting), rows
    # The run's progress lines count them, so that its user sees why nothing starts (they once counted none).
    log = background.log_path(paths.experiment_dir(exp))  # a detached run's console
    counted = f", {len(waiting)} waiting (waits for {cut}'s end: it goes on from its checkpoint), "
    wait_until(lambda: counted in log.read_text(), WAIT, f"a progress line with {counted!r}")
    assert cli("trial", "activate", cut).returncode == 0
    wait_until(lambda: {r["status"] for r in export(exp)} == {"SUCCEEDED"} and len(export(exp)) == 8, WAIT,
               "the experiment's end")
    for g, generation in enumerate(generations(export(exp), 4)):
        for row in generation:
            state = Path(row["parameters"]["save_checkpoint_dir"]) / "state.json"
            assert json.loads(state.read_text())["steps"] == g + 1, (g, row)


def test_a_trial_killed_between_its_final_result_and_its_save_warns_that_its_heirs_may_lack_it(tmp_path):
    """Killed, it does not run again, and its generation keeps its result: the trials that go on from it start
    from what it left, and the run's console says so (newcomer16: nothing said it)."""
    marker = tmp_path / "cut"
    space = {"lr": {"_type": "loguniform", "_value": [0.01, 0.5]}}
    config = experiment(tmp_path, space, PBT_SAVES_AFTER_ITS_FINAL.replace("MARKER", repr(str(marker))),
                        maxTrialNumber=8, trialConcurrency=2,
                        tuner={"name": "PBTTuner", "classArgs": {"population_size": 4, "fraction": 0.25}})
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        wait_until(marker.exists, WAIT, "member 3's final result")
        cut = next(row for row in export(exp) if place(row) == (3, 0))["trial_id"]
        assert cli("trial", "kill", cut).returncode == 0
        out, _ = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    heirs = [row["trial_id"] for row in export(exp) if row["trial_id"] != cut and
             row["parameters"]["load_checkpoint_dir"] == next(r for r in export(exp) if r["trial_id"] == cut)[
                 "parameters"]["save_checkpoint_dir"]]
    said = [line for line in out.splitlines() if "after its final result, before its end" in line]
    assert len(heirs) >= 2 and sorted(said) == sorted(  # the best member's own next step and a bottom one's exploit
        f"trial {heir}: warning: it goes on from {cut}, which ended USER_CANCELED after its final result, before "
        "its end: what it saved last may be missing" for heir in heirs), out


# NNI code that reads its load_checkpoint_dir but never writes its save_checkpoint_dir (newcomer23's mnist.py).
PBT_NEVER_SAVES = """
import json, os, nni
p = nni.get_next_parameter()
path = os.path.join(p["load_checkpoint_dir"], "model.json")
w = json.load(open(path))["w"] if os.path.isfile(path) else 0.0
nni.report_final_result(w + p["lr"])
"""


def test_a_pbt_search_whose_steps_never_save_warns_once_and_claims_no_continuity(tmp_path):
    """Each generation repeats the one before when nothing is saved: the console says why, once; each step's
    reason says it left no checkpoint; `trial show` and the page of a later step say it started afresh (with
    whose parameters), not that it "went on from" a checkpoint that was never there."""
    space = {"lr": {"_type": "loguniform", "_value": [0.01, 0.5]}}
    config = experiment(tmp_path, space, PBT_NEVER_SAVES, maxTrialNumber=4, trialConcurrency=2,
                        tuner={"name": "PBTTuner", "classArgs": {"population_size": 2}})
    done = cli("run", config, timeout=WAIT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    warned = [line for line in done.stdout.splitlines() if "warning: a PBT step ended without leaving its checkpoint"
              in line]
    assert len(warned) == 1, done.stdout
    exp = experiment_id(done.stdout.splitlines()[0])
    rows = export(exp)
    assert all("its step left no checkpoint: nothing in its save_checkpoint_dir" in row["reason"] for row in rows)
    # `trial list` says it too, beside SUCCEEDED, in its why column
    listed = cli("trial", "list", exp).stdout
    assert listed.count("its step left no checkpoint") == len(rows), listed
    later = next(row for row in rows if place(row)[1] == 1)
    load = later["parameters"]["load_checkpoint_dir"]
    source = next(r for r in rows if r["parameters"]["save_checkpoint_dir"] == load)
    shown = cli("trial", "show", later["trial_id"]).stdout
    said = (f"with the parameters of {source['trial_id']} (member {place(source)[0]}, step 0), which left no "
            "checkpoint to load")
    assert "went on from" not in shown and f"started afresh {said}" in shown.splitlines(), shown
    page = page_trial(tmp_path / "home", later["trial_id"])
    assert page["went_on_from"] == said and page["started_afresh"] is True


# ---------------------------------------------------------------- PBT, asynchronous (`synchronous: false`)

# One member's step a trial, its state in NNI's load/save dirs or (NATIVE) trialkit's checkpoint dir; the line
# of trials it trained through. Member 0's first step trains until some member's later step has started (MARK),
# or 30 s: under generations none can start before it ends.
ASYNC_PBT_TRIAL = """
import json, os, time, trialkit
p = trialkit.get_next_parameter()
member, step = p["save_checkpoint_dir"].split(os.sep)[-2:]
if step != "0":
    open(MARK, "a").close()
load, save = (trialkit.checkpoint_dir(),) * 2 if NATIVE else (p["load_checkpoint_dir"], p["save_checkpoint_dir"])
path = os.path.join(load, "state.json")
state = json.load(open(path)) if os.path.exists(path) else {"line": []}
state["line"].append(trialkit.get_trial_id())
if (member, step) == ("0", "0"):
    deadline = time.time() + 30
    while not os.path.exists(MARK) and time.time() < deadline:
        time.sleep(0.05)
os.makedirs(save, exist_ok=True)
json.dump(state, open(os.path.join(save, "state.json"), "w"))
trialkit.report_final_result(p["lr"] * len(state["line"]))
"""


def place(row: Dict[str, Any]) -> Tuple[int, int]:
    """(member, step) of a PBT trial, from the save dir it was given."""
    save = Path(row["parameters"]["save_checkpoint_dir"])
    return int(save.parent.name), int(save.name)


def saved_line(home: Path, row: Dict[str, Any], native: bool) -> List[str]:
    folder = (home / "experiments" / row["trial_id"].rpartition("-")[0] / "trials" / row["trial_id"] / "checkpoint"
              if native else Path(row["parameters"]["save_checkpoint_dir"]))
    return json.loads((folder / "state.json").read_text())["line"]


@pytest.mark.parametrize("native", [False, True], ids=["nni-dirs", "trialkit-checkpoint-dir"])
def test_async_pbt_steps_a_member_on_before_the_slowest_member_of_its_generation_ended(tmp_path, home, native):
    space = {"lr": {"_type": "loguniform", "_value": [0.01, 0.5]}}
    script = ASYNC_PBT_TRIAL.replace("MARK", repr(str(tmp_path / "later-step"))).replace("NATIVE", repr(native))
    config = experiment(tmp_path, space, script, maxTrialNumber=10, trialConcurrency=2,
                        tuner={"name": "PBT", "classArgs": {"population_size": 4, "fraction": 0.25,
                                                            "synchronous": False}})
    rows = run(config)
    assert {row["status"] for row in rows} == {"SUCCEEDED"}, rows
    by_place = {place(row): row for row in rows}
    assert len(by_place) == len(rows)  # no member's step twice
    slowest = by_place[(0, 0)]
    # No barrier: a member went on to its next step while member 0 still trained its first.
    assert any(step and row["started"] < slowest["ended"] for (_, step), row in by_place.items()), rows
    by_save = {row["parameters"]["save_checkpoint_dir"]: row for row in rows}
    for row in rows:
        line = saved_line(home, row, native)
        assert line[-1] == row["trial_id"]
        if place(row)[1] == 0:
            assert line == [row["trial_id"]]
            continue
        # It started from the checkpoint PBT gave it: the latest finished step of its member or of a top one.
        source = by_save[row["parameters"]["load_checkpoint_dir"]]
        assert source["ended"] <= row["started"] and line[:-1] == saved_line(home, source, native)


# NNI-style: member 1's second step waits at its first try for the Ctrl-C (MARKER).
ASYNC_PBT_CUT_SHORT = """
import json, os, time, trialkit
p = trialkit.get_next_parameter()
load = os.path.join(p["load_checkpoint_dir"], "state.json")
state = json.load(open(load)) if os.path.exists(load) else {"line": []}
state["line"].append(p["save_checkpoint_dir"])
if p["save_checkpoint_dir"].endswith(os.path.join("1", "1")) and not os.path.exists(MARKER):
    open(MARKER, "w").close()
    time.sleep(120)
os.makedirs(p["save_checkpoint_dir"], exist_ok=True)
json.dump(state, open(os.path.join(p["save_checkpoint_dir"], "state.json"), "w"))
trialkit.report_final_result(p["lr"] * len(state["line"]))
"""


def test_async_pbt_interrupted_and_resumed_repeats_no_members_step_and_loses_none(tmp_path):
    exp, before = cut_short_pbt(tmp_path, ASYNC_PBT_CUT_SHORT, False)
    cut = [row["trial_id"] for row in before if place(row) == (1, 1)]
    assert len(before) < 12 and [r["status"] for r in before if r["trial_id"] in cut] == ["PREEMPTED"], before
    done = cli("experiment", "resume", exp, timeout=WAIT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = export(exp)
    # (A trial the Ctrl-C found past its final result ran again too: a later step may load its checkpoint.)
    assert len(rows) == 12 and all(row["final"] is not None for row in rows), rows
    assert [(row["trial_id"], row["status"]) for row in rows if place(row) == (1, 1)] == [(cut[0], "SUCCEEDED")]
    steps: Dict[int, List[int]] = {}
    for row in rows:
        member, step = place(row)
        steps.setdefault(member, []).append(step)
    # Each member's steps once each, none skipped.
    assert all(sorted(taken) == list(range(len(taken))) for taken in steps.values()), steps
    for row in rows:  # each trained on the checkpoint it was given, which the step it went on from had saved
        params = row["parameters"]
        line = json.loads((Path(params["save_checkpoint_dir"]) / "state.json").read_text())["line"]
        loaded = Path(params["load_checkpoint_dir"]) / "state.json"
        assert line == (json.loads(loaded.read_text())["line"] if place(row)[1] else []) + \
            [params["save_checkpoint_dir"]], row
