"""On `experiment resume`, a trial the Ctrl-C stopped without a checkpoint (its Hyperband round waits for its
result, so it runs again) says in its history that it starts over, not that it goes on from a checkpoint it
never saved (a newcomer read "resumed: it goes on from its checkpoint" on such a trial). A real run, a real
Ctrl-C (SIGINT) and a real resume; NNI-style trial code that keeps no checkpoint.
"""
from __future__ import annotations

import pytest

from experiment_util import cli, experiment, export, interrupted_after
from trialkit.control.queue import RERUN

# The first trial writes MARKER after its first intermediate result and waits there for the Ctrl-C.
CUT_SHORT = """
import os, time, trialkit
p = trialkit.get_next_parameter()
trialkit.report_intermediate_result(p["x"])
if not os.path.exists(MARKER):
    open(MARKER, "w").close()
    time.sleep(120)
trialkit.report_final_result(p["x"])
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))


def test_a_trial_cut_short_without_a_checkpoint_says_on_resume_that_it_starts_over(tmp_path):
    marker = tmp_path / "cut"
    space = {"x": {"_type": "choice", "_value": [0.1, 0.2, 0.3]}}
    config = experiment(tmp_path, space, CUT_SHORT.replace("MARKER", repr(str(marker))), maxTrialNumber=4,
                        trialConcurrency=1, tuner={"name": "Hyperband", "classArgs": {"R": 3, "eta": 3,
                                                                                       "exec_mode": "serial"}})
    said = []
    exp = interrupted_after(config, 0, marker=marker, out=said)
    cut = f"{exp}-00000"
    assert any(line.startswith(f"trial {cut}") and "it saved no checkpoint" in line for line in said), said
    assert export(exp)[0]["reason"].endswith(RERUN)  # what `experiment resume` queues again
    done = cli("experiment", "resume", exp, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    history = cli("trial", "show", cut).stdout.split("history:")[1]
    resumed = [line for line in history.splitlines() if "resumed:" in line]
    assert len(resumed) == 1 and resumed[0].split()[2] == "WAITING", history
    assert resumed[0].endswith("resumed: it starts over: it saved no checkpoint"), history
