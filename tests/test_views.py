"""Metrics as their users wrote them, on the CLI's faces (issue 39.3): `experiment plot` draws each metric a
trial reports (NNI's dict keys, Determined's groups against steps_completed) on the axes its search space
gives the parameters; `--metric NAME` picks one. A real experiment (local trials reporting through the SDK);
a Determined trial's two runs are written into a store as its keepers deliver them.
"""
from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from experiment_util import cli, experiment, experiment_id
from trialkit.control.plot import draw
from trialkit.control.results import trial_rows
from trialkit.manager.store import Store
from trialkit.web import queries

pytest.importorskip("matplotlib", reason="plots need matplotlib (the control extra)")

# lr log-uniform, batch a numeric choice: NNI's usual space; the metric a dict, as NNI's examples report it.
SPACE = {"lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]}, "batch": {"_type": "choice", "_value": [64, 16, 32]}}
DICT_TRIAL = """
import trialkit
p = trialkit.get_next_parameter()
for step in range(3):
    trialkit.report_intermediate_result({"default": p["lr"] * step, "loss": 1.0 / (step + 1), "note": "text"})
trialkit.report_final_result({"default": p["lr"], "loss": 0.1})
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def nni_experiment(tmp_path_factory):
    """(home, experiment id): three trials of DICT_TRIAL, run by `trialkit run`."""
    root = tmp_path_factory.mktemp("views")
    home = root / "home"
    config = experiment(root, SPACE, DICT_TRIAL, maxTrialNumber=3, trialConcurrency=3)
    done = cli("run", config, env={**os.environ, "TRIALKIT_HOME": str(home)})
    assert done.returncode == 0, done.stdout + done.stderr
    return home, experiment_id(done.stdout.splitlines()[0])


def rows_of(home: Path, exp: str) -> list:
    store = Store.in_dir(home / "experiments" / exp)
    try:
        return trial_rows(store, exp)
    finally:
        store.close()


def test_every_key_of_a_dict_metric_is_drawn_and_the_axes_follow_the_search_space(nni_experiment, monkeypatch):
    home, exp = nni_experiment
    figure = draw(rows_of(home, exp), exp, search_space=SPACE)
    axes = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["intermediate results", "loss", "final vs lr", "final vs batch"]
    assert [list(line.get_xdata()) for line in axes[1].lines] == [[1, 2, 3]] * 3  # every trial's loss, by step
    assert axes[2].get_xscale() == "log"  # loguniform: a linear axis put every point at 0
    # A choice: its options, in the space's order, as categories (not 16..64 on a number line).
    assert [label.get_text() for label in axes[3].get_xticklabels()] == ["64", "16", "32"]
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    png = home.parent / "loss.png"
    done = cli("experiment", "plot", exp, "-o", png, "--metric", "loss")
    assert done.returncode == 0, done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_names_the_metrics_it_knows(nni_experiment, monkeypatch):
    home, exp = nni_experiment
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    assert "--metric NAME" in cli("experiment", "plot", "--help").stdout
    done = cli("experiment", "plot", exp, "-o", home.parent / "x.png", "--metric", "accuracy")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "no metric 'accuracy'" in done.stderr and "default, loss" in done.stderr  # the text "note" is no metric


def determined_trial(home: Path) -> str:
    """A Determined Core API trial paused at 40 batches and resumed from its checkpoint, as its keepers deliver
    it: training x every 10 batches, run 0 up to 40, run 1 again from 40 (the checkpoint's) to 60, then the
    validation; the searcher metric is x."""
    store = Store.in_dir(home / "experiments" / "det")
    store.create_experiment("det", {"searchSpace": {}})
    store.add_trial("det", "det-00000", sequence=0, parameters={}, token=None)
    seq, now = 0, time.time()

    def report(run: int, group: str, step: int, x: float) -> dict:
        nonlocal seq
        seq += 1
        return {"seq": seq, "type": "PERIODICAL", "run": run, "time": now + seq, "value": {
            "group": group, "steps_completed": step, "metrics": {"loss": 1 / step, "x": x}, "default": x}}
    batch = [report(0, "training", step, step) for step in (10, 20, 30, 40)]
    batch += [report(1, "training", step, step + 0.5) for step in (40, 50, 60)]
    batch.append(report(1, "validation", 60, 60.5))
    store.add_records("det-00000", batch)
    store.close()
    return "det"


def test_determined_groups_are_drawn_against_batches_and_every_run_is_one_curve(home, monkeypatch):
    exp = determined_trial(home)
    rows = rows_of(home, exp)
    assert rows[0]["steps"] == 60
    figure = draw(rows, exp)
    axes = [ax for ax in figure.axes if ax.get_visible()]
    # The searcher metric of the validation first; then the rest, the training loss among them.
    assert [ax.get_title() for ax in axes] == ["validation.x", "validation.loss", "training.x", "training.loss"]
    assert all(ax.get_xlabel() == "batches (steps_completed)" for ax in axes)
    (training,) = axes[2].lines
    assert list(training.get_xdata()) == [10, 20, 30, 40, 50, 60]  # batches, not the record's place (1..8)
    assert list(training.get_ydata()) == [10, 20, 30, 40.5, 50.5, 60.5]  # run 1's report at 40 replaced run 0's
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    done = cli("experiment", "plot", exp, "-o", home.parent / "det.png", "--metric", "training.loss")
    assert done.returncode == 0, done.stderr


def test_a_name_two_groups_share_is_refused_with_the_names_that_tell_them_apart(home, monkeypatch):
    exp = determined_trial(home)
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    done = cli("experiment", "plot", exp, "-o", home.parent / "det.png", "--metric", "loss")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "report 'loss' in 2 groups" in done.stderr
    assert "name one of: validation.x, validation.loss, training.x, training.loss" in done.stderr


def test_determined_metrics_are_named_as_their_user_wrote_them(home, monkeypatch):
    """report_training_metrics(metrics={"loss": ...}), report_validation_metrics(metrics={"accuracy": ...}): the
    names are loss and accuracy (each in one group), on the plot and in --metric; GROUP.NAME works too."""
    store = Store.in_dir(home / "experiments" / "mine")
    store.create_experiment("mine", {"searchSpace": {}})
    store.add_trial("mine", "mine-00000", sequence=0, parameters={}, token=None)
    reports = [("training", 25, "loss", 0.8), ("training", 50, "loss", 0.6), ("validation", 50, "accuracy", 0.4)]
    store.add_records("mine-00000", [{"seq": seq, "type": "PERIODICAL", "run": 0, "value": {
        "group": group, "steps_completed": step, "metrics": {name: value}}}
        for seq, (group, step, name, value) in enumerate(reports, 1)])
    store.close()
    axes = [ax for ax in draw(rows_of(home, "mine"), "mine").axes if ax.get_visible()]
    # The name as written, its group beside it as Determined's UI marks it.
    assert [ax.get_title() for ax in axes] == ["accuracy (validation)", "loss (training)"]
    assert [ax.get_ylabel() for ax in axes] == ["accuracy", "loss"]
    (loss,) = draw(rows_of(home, "mine"), "mine", ["loss"]).axes[0].lines
    assert (list(loss.get_xdata()), list(loss.get_ydata())) == ([25, 50], [0.8, 0.6])
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    for name in ("loss", "accuracy", "training.loss"):
        done = cli("experiment", "plot", "mine", "-o", home.parent / f"{name}.png", "--metric", name)
        assert done.returncode == 0, done.stderr
    assert (home.parent / "loss.png").read_bytes() == (home.parent / "training.loss.png").read_bytes()
    assert (home.parent / "loss.png").read_bytes() != (home.parent / "accuracy.png").read_bytes()
    done = cli("experiment", "plot", "mine", "-o", home.parent / "x.png", "--metric", "acc")
    assert done.returncode == 2 and "name one of: accuracy, loss" in done.stderr, done.stderr


def test_an_experiment_that_ended_in_error_says_why_in_the_words_of_its_run(tmp_path, home):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2, 3, 4]}}, "raise SystemExit(3)\n",
                        maxTrialNumber=4, trialConcurrency=1)
    done = cli("run", config)
    exp = experiment_id(done.stdout.splitlines()[0])
    said = next(line for line in done.stdout.splitlines() if line.startswith("error: "))[len("error: "):]
    assert "the first 3 trials all failed the same way" in said
    shown = cli("experiment", "show", exp).stdout.splitlines()
    assert f"status      ERROR: {said}" in shown
    with closing(sqlite3.connect(home / "experiments" / exp / "trialkit.db")) as db:
        db.row_factory = sqlite3.Row
        queries.register(db)
        assert queries.experiment(db, exp)["reason"] == said  # the page's overview shows it (test_web's ended page)
