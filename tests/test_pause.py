"""Pause and activate, end to end: a paused trial checkpoints, frees its slot, and resumes where it stopped.

`trialkit run` runs in the background with one slot; a GridSearch over
`hold` makes trial 0 train three steps and then wait to be paused, and
trial 1 run straight through. Trial 0 is paused (SIGTERM -> it saves its
step -> exit 143), trial 1 takes the slot, trial 0 is activated and goes on
from its checkpoint in the same dirs, one restart later. Once through the
SDK (a script with checkpoint_dir()), once through a trialkit.Trial class
(save/load called for it), paused as a trial and as an experiment.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiment_util import (
    by_sequence, cli, experiment, experiment_id, export, reported, start_cli, stored, trial_status,
)
from harness import wait_until

HOLD = {"hold": {"_type": "choice", "_value": [1, 0]}}
WAIT = 60.0  # an upper bound for a loaded machine; never waited for on success

# Trial 0 (hold) trains three steps, then waits for the stop that pauses it:
# SIGTERM is blocked and taken by sigwait, so nothing races the checkpoint.
SDK_SCRIPT = """
import json, os, signal, sys, trialkit
from pathlib import Path
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
hold = trialkit.get_next_parameter()["hold"]
restarts = int(os.environ["TRIALKIT_RESTART_COUNT"])
state = Path(trialkit.checkpoint_dir()) / "state.json"
step = json.loads(state.read_text())["step"] if state.exists() else 0
print(f"start at step {step}, restart {restarts}", flush=True)
while step < 6:
    trialkit.report_intermediate_result(step)
    step += 1
    if step == 3 and hold and restarts == 0:
        signal.sigwait([signal.SIGTERM])
        assert trialkit.should_preempt()  # the keeper said so before the signal
        state.write_text(json.dumps({"step": step}))
        sys.exit(143)
trialkit.report_final_result({"default": step, "restarts": restarts})
"""

TRIAL_CLASS = """
import json, os, time
from pathlib import Path
import trialkit

class Counting(trialkit.Trial):
    step = 0

    def run(self):
        restarts = int(os.environ["TRIALKIT_RESTART_COUNT"])
        while self.step < 6:
            trialkit.report_intermediate_result(self.step)
            self.step += 1
            if self.step == 3 and self.parameters["hold"] and restarts == 0:
                while not self.should_stop():
                    time.sleep(0.02)
                return None
        return self.step

    def save(self, directory):
        (Path(directory) / "state.json").write_text(json.dumps({"step": self.step}))
        print(f"saved step {self.step}", flush=True)

    def load(self, directory):
        self.step = json.loads((Path(directory) / "state.json").read_text())["step"]
        print(f"loaded step {self.step}", flush=True)
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def start(config: Path):
    """`trialkit run CONFIG` in the background; (process, experiment id, its two trial ids)."""
    proc = start_cli("run", config)
    exp = experiment_id(proc.stdout.readline())
    return proc, exp, f"{exp}-00000", f"{exp}-00001"


def ok(*args) -> str:
    done = cli(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def assert_resumed(exp: str, home: Path) -> dict:
    """Trial 0 went on from its checkpoint, one restart later, in its dirs; trial 1 ran once."""
    rows = by_sequence(export(exp))
    held, other = rows[0], rows[1]
    assert held["status"] == "SUCCEEDED" and held["restart_count"] == 1
    assert held["run"] == 1 and held["intermediate"] == [0, 1, 2, 3, 4, 5]  # the export: both runs, one series
    runs = [(row["run"], row["intermediate"]) for row in json.loads(cli("experiment", "export", exp, "--all-runs").stdout)
            if row["sequence"] == 0]
    assert runs == [(0, [0, 1, 2]), (1, [3, 4, 5])]  # steps continued from the checkpoint, none repeated
    assert held["trial_dir"] == str(home / "experiments" / exp / "trials" / held["trial_id"])
    assert json.loads((Path(held["trial_dir"]) / "checkpoint" / "state.json").read_text()) == {"step": 3}
    assert other["status"] == "SUCCEEDED" and other["restart_count"] == 0
    return held


def test_a_paused_trial_frees_its_slot_and_resumes_from_its_checkpoint(tmp_path, home):
    config = experiment(tmp_path, HOLD, SDK_SCRIPT, trialConcurrency=1, maxTrialNumber=2, trialGraceSeconds=10,
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    proc, exp, held, other = start(config)
    wait_until(lambda: reported(home, held) == 3, WAIT, "trial 0 to train three steps")
    # It saves its checkpoint only as it stops: the pause says what happens if it does not.
    assert f"it holds none yet: if it saves none, its progress restarts from the beginning when `trialkit trial " \
           f"activate {held}` runs it again" in ok("trial", "pause", held)
    wait_until(lambda: trial_status(home, other) == "SUCCEEDED", WAIT, "trial 1 to run in the freed slot")
    assert trial_status(home, held) == "PREEMPTED"
    assert "status         PAUSED" in ok("trial", "show", held)
    assert proc.poll() is None  # a paused trial keeps the experiment going
    ok("trial", "activate", held)
    assert proc.wait(timeout=WAIT) == 0, proc.stderr.read()
    assert_resumed(exp, home)["final"] == {"default": 6, "restarts": 1}
    log = ok("trial", "logs", held)
    assert "start at step 0, restart 0" in log and "start at step 3, restart 1" in log
    paused, other_started = stored(home, exp, "SELECT MIN(s.time), (SELECT started FROM trials WHERE id=?) "
                                   "FROM statuses s WHERE s.trial=? AND s.status='PREEMPTED'", other, held)[0]
    assert other_started >= paused  # trial 1 started once trial 0 left its slot


def test_a_paused_experiment_asks_nothing_and_a_trial_class_saves_and_loads(tmp_path, home):
    config = experiment(tmp_path, HOLD, TRIAL_CLASS, trialConcurrency=1, maxTrialNumber=2, trialGraceSeconds=10,
                        trialCommand="python3 -m trialkit.launch.run_trial trial.py:Counting",
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    proc, exp, held, _ = start(config)
    wait_until(lambda: reported(home, held) == 3, WAIT, "trial 0 to train three steps")
    ok("experiment", "pause", exp)
    wait_until(lambda: trial_status(home, held) == "PREEMPTED", WAIT, "trial 0 to be paused")
    ok("experiment", "pause", exp)  # a round trip through the loop, after it saw the trial end
    assert stored(home, exp, "SELECT COUNT(*) FROM trials")[0][0] == 1  # the tuner waits
    assert "PAUSED" in ok("experiment", "list")
    jobs = json.loads(ok("job", "list", "--json"))
    assert [(job["id"], job["status"], job["slots_acquired"]) for job in jobs] == [(held, "PAUSED", 0)]
    ok("experiment", "activate", exp)
    assert proc.wait(timeout=WAIT) == 0, proc.stderr.read()
    assert assert_resumed(exp, home)["final"] == 6
    log = ok("trial", "logs", held)
    assert "saved step 3" in log and "loaded step 3" in log
