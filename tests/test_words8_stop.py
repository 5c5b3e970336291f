"""What a user reads of a Hyperband or PBT trial that `trialkit experiment stop` cut short without a checkpoint:
`trial list` says PAUSED, its reason names what waits for it in its tuner's own word (Hyperband's round, PBT's
generation, as NNI says them), and `experiment stop --help` says the same status. A real detached run, a real
`experiment stop`; NNI-style trial code that keeps no checkpoint.
"""
from __future__ import annotations

import pytest

from experiment_util import cli, experiment, experiment_id, reported
from harness import wait_until

WAIT = 60.0  # an upper bound for a loaded machine; never waited for on success
# Each trial reports once, then waits for the stop (which kills it: it has no SIGTERM handler).
WAITS = """
import time, trialkit
p = trialkit.get_next_parameter()
trialkit.report_intermediate_result(1.0)
time.sleep(120)
trialkit.report_final_result(1.0)
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def ok(*args) -> str:
    done = cli(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("tuner, unit", [
    ({"name": "Hyperband", "classArgs": {"R": 3, "eta": 3, "exec_mode": "serial"}}, "round"),
    ({"name": "PBTTuner", "classArgs": {"population_size": 2}}, "generation"),
])
def test_a_trial_cut_short_by_experiment_stop_is_paused_as_the_help_says(tmp_path, home, tuner, unit):
    space = {"x": {"_type": "uniform", "_value": [0, 1]}}
    config = experiment(tmp_path, space, WAITS, maxTrialNumber=4, trialConcurrency=1, tuner=tuner)
    exp = experiment_id(ok("run", config, "--detach").splitlines()[0])
    trial = f"{exp}-00000"
    wait_until(lambda: reported(home, trial) >= 1, WAIT, "the trial to report")
    ok("experiment", "stop", exp)
    row = next(line for line in ok("trial", "list", exp).splitlines() if line.startswith(trial))
    assert " PAUSED " in row and f"its {unit} waits for its result" in row, row
    assert "PAUSED" in " ".join(ok("experiment", "stop", "--help").split())
