"""A paused and activated trial's metrics in TensorBoard are one series, as every other view shows them.

Real experiments (`trialkit run`, `trial pause`, `trial activate`) with
TRIALKIT_TENSORBOARD_DIR set, read back from the event files the keepers
wrote (each run its own file) with tensorboardX's own Event protobuf: a
Determined trial's reports at their steps_completed, an NNI trial's after
the earlier run's, never over them from step 0 again.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import List, Tuple

import pytest

from experiment_util import cli, experiment, experiment_id, export, paused_and_activated, reported, start_cli
from harness import wait_until
from test_delivery import tensorboard_scalars
from trialkit.platforms.base import TrialSpec
from trialkit.platforms.local import tensorboard_dir

pytest.importorskip("tensorboardX", reason="the keeper writes TensorBoard scalars with tensorboardX (control extra)")

FIXTURES = Path(__file__).parent / "fixtures" / "determined"

# NNI's way: no step in the report; a checkpoint on SIGTERM (exit 143), the next run going on from it.
NNI_TRIAL = """
import json, os, pathlib, signal, sys, time
import trialkit

trialkit.get_next_parameter()
state = pathlib.Path(os.environ["TRIALKIT_CHECKPOINT_DIR"]) / "state.json"
start = json.loads(state.read_text())["step"] + 1 if state.exists() else 0
asked = []
signal.signal(signal.SIGTERM, lambda *_: asked.append(1))
for step in range(start, 30):
    trialkit.report_intermediate_result(step)
    if asked:
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps({"step": step}))
        sys.exit(143)
    time.sleep(0.05 if start else 1)  # the first run waits for its pause
trialkit.report_final_result(29)
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRIALKIT_TENSORBOARD_DIR", str(tmp_path / "tensorboard"))
    return tmp_path / "home"


def two_runs(home: Path, *run: object) -> str:
    """The experiment `trialkit run RUN...` runs, its trial paused and activated, both runs' ends as they were."""
    exp, _ = paused_and_activated(home, list(run))
    runs = json.loads(cli("experiment", "export", exp, "--all-runs").stdout)
    assert [row["status"] for row in runs] == ["PREEMPTED", "SUCCEEDED"]
    return exp


def series(logdir: Path, tag: str) -> List[Tuple[int, float]]:
    """(step, value) of one tag, as the event files hold them in the order they were written."""
    return [(step, value) for name, step, value in tensorboard_scalars(logdir) if name == tag]


def trial_logdir(tmp_path: Path, exp: str, sequence: int = 0) -> Path:
    """The trial's own TensorBoard dir: TRIALKIT_TENSORBOARD_DIR/EXPERIMENT_ID/TRIAL_ID."""
    return tmp_path / "tensorboard" / exp / f"{exp}-{sequence:05d}"


def test_a_determined_trials_runs_are_written_at_their_steps_completed(home, tmp_path):
    exp = two_runs(home, FIXTURES / "2_checkpoints.yaml", FIXTURES)
    logdir = trial_logdir(tmp_path, exp)
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2  # a file per run
    # Each batch once (the paused run stopped at its checkpoint, the next went on from it); x counts batches.
    assert series(logdir, "metric/training.x") == [(n, n) for n in range(10, 101, 10)]
    assert series(logdir, "metric/validation.x") == [(100, 100)]
    assert [report["steps_completed"] for report in export(exp)[0]["intermediate"]] == [*range(10, 101, 10), 100]


def test_an_nni_trials_next_run_goes_on_after_the_last_step_written(home, tmp_path):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, NNI_TRIAL, maxTrialNumber=1,
                        trialConcurrency=1, trialGraceSeconds=10)
    exp = two_runs(home, config)
    logdir = trial_logdir(tmp_path, exp)
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2
    # The report of step N (its value) at step N: run 1 went on from run 0's checkpoint and its last step.
    assert series(logdir, "metric/default") == [(n, n) for n in range(30)]
    assert export(exp)[0]["intermediate"] == list(range(30))


def test_local_trials_at_once_each_write_their_own_dir_and_experiment_tensorboard_names_them(home, tmp_path,
                                                                                           monkeypatch):
    """Two trials at once under TRIALKIT_TENSORBOARD_DIR: each writes its scalars in a dir of its own (newcomer23:
    one dir for both, and one trial's scalars lost), and `experiment tensorboard` prints the command over
    them. Without the variable the run's trials get none, and the command says how to turn it on."""
    script = """
    import time, trialkit
    x = trialkit.get_next_parameter()["x"]
    for step in range(3):
        trialkit.report_intermediate_result(x * 10 + step)
        time.sleep(0.2)
    trialkit.report_final_result(x)
    """
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2]}}, script, maxTrialNumber=2,
                        trialConcurrency=2, tuner={"name": "GridSearch"})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = done.stdout.split()[2]
    for row in export(exp):
        x = row["parameters"]["x"]
        assert series(trial_logdir(tmp_path, exp, row["sequence"]), "metric/default") == \
            [(step, x * 10 + step) for step in range(3)], row
    shown = cli("experiment", "tensorboard", exp)
    assert shown.returncode == 0 and shown.stdout.strip() == (
        f"TensorBoard of experiment {exp}: tensorboard --logdir {tmp_path / 'tensorboard' / exp} (a run per trial)")

    monkeypatch.delenv("TRIALKIT_TENSORBOARD_DIR")
    again = cli("run", experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, script, name="plain",
                                  maxTrialNumber=1))
    plain = again.stdout.split()[2]
    refused = cli("experiment", "tensorboard", plain)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "got no TensorBoard dir" in refused.stderr and "TRIALKIT_TENSORBOARD_DIR=DIR" in refused.stderr


def test_a_resume_without_the_variable_goes_on_in_the_dir_the_experiment_ran_with(home, tmp_path):
    """`trialkit run` with TRIALKIT_TENSORBOARD_DIR, Ctrl-C mid-trial, `experiment resume` in a shell without
    the variable: the trial's next run writes in the same dir, going on after its last step, and `experiment
    tensorboard` still names it (newcomer25: the resumed trial got no TensorBoard dir, its series cut short)."""
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, NNI_TRIAL, maxTrialNumber=1,
                        trialConcurrency=1, trialGraceSeconds=10)
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        wait_until(lambda: reported(home, f"{exp}-00000") >= 3, 120, "3 intermediate results")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    plain = {k: v for k, v in os.environ.items() if k != "TRIALKIT_TENSORBOARD_DIR"}
    resumed = cli("experiment", "resume", exp, env=plain)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    logdir = trial_logdir(tmp_path, exp)
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2  # a file per run
    assert series(logdir, "metric/default") == [(n, n) for n in range(30)]
    shown = cli("experiment", "tensorboard", exp, env=plain)
    assert shown.stdout.strip().endswith(f"--logdir {tmp_path / 'tensorboard' / exp} (a run per trial)")


def test_a_dir_named_for_the_resume_wins_over_the_one_the_experiment_ran_with(tmp_path):
    """What docs/sdk.md says of a resume whose environment names a TensorBoard DIR other than the run's."""
    spec = TrialSpec("abcd1234", "abcd1234-00000", 0, "python3 train.py")
    ran_with = str(tmp_path / "before" / "abcd1234")
    assert tensorboard_dir({}, spec, ran_with) == str(tmp_path / "before" / "abcd1234" / "abcd1234-00000")
    named = {"TRIALKIT_TENSORBOARD_DIR": str(tmp_path / "now")}
    assert tensorboard_dir(named, spec, ran_with) == str(tmp_path / "now" / "abcd1234" / "abcd1234-00000")
