"""Preemption in the home's resource pool (platforms/preempt.py): a job of higher priority that waits gets
the slots of a lower one's running trials, which pause through their checkpoint and resume from it.

Real experiments (`trialkit run`, real keepers, managers and trials) on a pool of 2 slots; the trials
write their own start and end times and steps, and the checks are made from those and the stores.
"""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from experiment_util import TIMEOUT, cli, experiment, experiment_id, start_cli, stored
from gpu_util import most_at_once
from harness import wait_until
from pools_util import home, pool_of  # noqa: F401 (home: a fixture)

STEPS, HOLD = 10, 5
# The user's checkpoint path (docs/sdk.md): a SIGTERM handler that keeps the process alive until a step
# boundary, should_preempt() there, the step saved in checkpoint_dir(), exit 143; a restart loads it.
# Each step is saved before it is reported, so a resumed run starts after the last step it reported.
# Past step `hold` it goes on only once the gate file exists: it holds its slot as long as the test wants.
CHECKPOINTING = """
import os, signal, sys, time, trialkit
signal.signal(signal.SIGTERM, lambda *_: None)
p = trialkit.get_next_parameter()
saved = os.path.join(trialkit.checkpoint_dir(), "step")
step = int(open(saved).read()) if os.path.exists(saved) else 0
def note(kind):
    with open({log!r}, "a") as f:
        f.write(f"{{kind}} {{time.time()}} {name} {{trialkit.get_trial_id()}} {{step}}\\n")
note("start")
while step < {steps}:
    while step >= {hold} and not os.path.exists({gate!r}) and not trialkit.should_preempt():
        time.sleep(0.02)
    if trialkit.should_preempt():
        note("end")
        sys.exit(143)
    time.sleep({pace})
    step += 1
    with open(saved + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(saved + ".tmp", saved)
    trialkit.report_intermediate_result(step)
note("end")
trialkit.report_final_result(p["x"])
"""
SPACE = {"x": {"_type": "choice", "_value": [1, 2, 3, 4]}}


@pytest.fixture(autouse=True)
def two_slots(home):
    pool_of(home, 2)


def checkpointing(tmp_path: Path, name: str, log: Path, steps: int, hold: int, exit: int = 143, **service: Any
                  ) -> Path:
    """`exit`: the code it exits with once it saved its checkpoint for a preemption (0: Determined's Core API
    user who leaves `with det.core.init()` by SystemExit(0))."""
    script = CHECKPOINTING.format(log=str(log), name=name, steps=steps, hold=hold, gate=str(tmp_path / "gate"),
                                  pace=0.05).replace("sys.exit(143)", f"sys.exit({exit})")
    return experiment(tmp_path, SPACE, script,
                      name=name, trialConcurrency=2, maxTrialNumber=2, trialGraceSeconds=20,
                      trainingService={"platform": "local", **service})


def runs(log: Path) -> List[Dict[str, Any]]:
    """Each run of each trial from its own notes: {name, trial, start, end, first (the step it started
    from), last (the step it ended at)}."""
    open_runs: Dict[str, Dict[str, Any]] = {}
    out = []
    for line in log.read_text().splitlines():
        kind, when, name, trial, step = line.split()
        if kind == "start":
            open_runs[trial] = {"name": name, "trial": trial, "start": float(when), "first": int(step)}
        else:
            out.append({**open_runs.pop(trial), "end": float(when), "last": int(step)})
    assert not open_runs, open_runs  # every run noted its end: none was killed
    return out


def fill_the_pool(tmp_path: Path, home: Path, log: Path, exit: int = 143) -> Tuple[subprocess.Popen, str]:
    """Experiment a (priority 42) running, its 2 trials holding the pool's 2 slots at step HOLD (checkpointed
    there) until the gate opens: (its `trialkit run`, its id)."""
    low = start_cli("run", checkpointing(tmp_path, "a", log, steps=STEPS, hold=HOLD, exit=exit))
    a = experiment_id(low.stdout.readline())
    wait_until(lambda: len(stored(home, a, "SELECT DISTINCT trial FROM records WHERE type = 'PERIODICAL' "
                                           "AND value = ?", str(HOLD))) == 2, TIMEOUT, "a's trials to hold")
    return low, a


def steps_stored(home: Path, experiment_id: str, trial: str) -> List[Any]:
    """The trial's intermediate results as the store holds them, every run's, in the order received."""
    return [json.loads(value) for (value,) in stored(
        home, experiment_id, "SELECT value FROM records WHERE trial = ? AND type = 'PERIODICAL' ORDER BY seq", trial)]


def paused_once_then_resumed(home: Path, log: Path, a: str) -> None:
    """Each of experiment a's two trials ran to HOLD (paused), then from HOLD to STEPS (resumed from its
    checkpoint, once) and succeeded; every step stored once."""
    a_runs = [run for run in runs(log) if run["name"] == "a"]
    assert sorted((run["first"], run["last"]) for run in a_runs) == [(0, HOLD)] * 2 + [(HOLD, STEPS)] * 2, a_runs
    assert stored(home, a, "SELECT status, restart_count FROM trials") == [("SUCCEEDED", 1)] * 2, \
        stored(home, a, "SELECT trial, status, reason, source FROM statuses ORDER BY id")
    for (trial,) in stored(home, a, "SELECT id FROM trials"):
        assert steps_stored(home, a, trial) == list(range(1, STEPS + 1)), trial


def stop_all(*procs: Optional[subprocess.Popen]) -> None:
    """After a failure: each experiment ends as SIGINT ends it (its trials stopped, nothing left running)."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=TIMEOUT)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    return out


def test_a_higher_priority_experiment_pauses_the_lower_one_s_trials_through_their_checkpoints(tmp_path, home):
    log = tmp_path / "runs"
    low, a = fill_the_pool(tmp_path, home, log)
    high = None
    try:
        high = start_cli("run", checkpointing(tmp_path, "b", log, steps=5, hold=5, poolPriority=1))
        b = experiment_id(high.stdout.readline())
        # Without preemption b would wait for a, and a for the gate: this wait fails.
        wait_until(lambda: log.read_text().count(" b ") >= 2, TIMEOUT, "b's trials to start while a's hold")
        (tmp_path / "gate").touch()
        a_out = finish(low)
        finish(high)
    finally:
        (tmp_path / "gate").touch()  # every trial ends, whatever failed
        stop_all(low, high)
    found = runs(log)
    assert most_at_once(found) == 2, found  # never more than the pool's 2 slots
    a_runs = [run for run in found if run["name"] == "a"]
    b_runs = [run for run in found if run["name"] == "b"]
    assert len(b_runs) == 2 and len(a_runs) == 4, found  # each of a's trials ran twice: paused, resumed
    b_starts = [run["start"] for run in b_runs]
    for trial in {run["trial"] for run in a_runs}:
        first, resumed = sorted((run for run in a_runs if run["trial"] == trial), key=lambda run: run["start"])
        assert first["first"] == 0 and first["last"] == HOLD, first  # paused mid-way, through should_preempt
        assert resumed["first"] == first["last"] and resumed["last"] == STEPS, (first, resumed)  # from its checkpoint
        assert first["end"] <= min(b_starts) and max(b_starts) <= resumed["start"], found  # b ran in a's pause
    for exp, steps in ((a, STEPS), (b, 5)):
        for (trial,) in stored(home, exp, "SELECT id FROM trials"):
            values = steps_stored(home, exp, trial)
            assert values == list(range(1, steps + 1)), (trial, values)  # every step stored once, none redone
            assert stored(home, exp, "SELECT COUNT(*) FROM records WHERE trial = ? AND type = 'FINAL'",
                          trial) == [(1,)]
    statuses = stored(home, a, "SELECT trial, status, reason FROM statuses WHERE status = 'PREEMPTED'")
    assert sorted(trial for trial, _, _ in statuses) == sorted({run["trial"] for run in a_runs}), statuses
    assert all(f"preempted for experiment {b} (priority 1)" in reason for _, _, reason in statuses), statuses
    assert stored(home, a, "SELECT status, restart_count FROM trials") == [("SUCCEEDED", 1)] * 2, \
        stored(home, a, "SELECT trial, status, reason, source FROM statuses ORDER BY id")
    assert stored(home, b, "SELECT status, restart_count FROM trials") == [("SUCCEEDED", 0)] * 2
    assert f"preempted for experiment {b}" in a_out


def test_a_preempted_trial_that_saves_and_exits_0_is_paused_and_resumes_as_under_a_pause(tmp_path, home):
    """Exit 0 with no final result after the control plane's stop: the stop's status (PREEMPTED, queued to resume
    from its checkpoint), as `trial pause` and `experiment stop` end it; not SUCCEEDED with its work lost."""
    log = tmp_path / "runs"
    low, a = fill_the_pool(tmp_path, home, log, exit=0)
    high = None
    try:
        high = start_cli("run", checkpointing(tmp_path, "b", log, steps=5, hold=5, poolPriority=1))
        wait_until(lambda: log.read_text().count(" b ") >= 2, TIMEOUT, "b's trials to start while a's hold")
        (tmp_path / "gate").touch()
        finish(low)
        finish(high)
    finally:
        (tmp_path / "gate").touch()
        stop_all(low, high)
    paused_once_then_resumed(home, log, a)
    assert len(stored(home, a, "SELECT trial FROM statuses WHERE status = 'PREEMPTED'")) == 2


def test_equal_priority_and_a_job_that_is_not_preemptible_take_nothing(tmp_path):
    from trialkit.platforms.pools import Claim
    from trialkit.platforms.preempt import owed

    def claim(name: str, priority: int, submitted: float, holds: float = 0, waits: float = 0,
              preemptible: bool = True) -> Claim:
        return Claim(name, priority, submitted, holds, waits, preemptible)

    waiting = claim("w", 1, 3.0, waits=2)
    # The lowest job gives back first; the one between gives only what the lowest cannot.
    jobs = [waiting, claim("mid", 20, 1.0, holds=1), claim("low", 42, 2.0, holds=1)]
    assert owed("low", 0, jobs) == (2, waiting)
    assert owed("mid", 0, jobs) == (1, waiting)
    assert owed("mid", 1, jobs) == (0, None)  # a free slot and low's one are enough
    # Of equal priorities, the later submitted gives back first; an equal priority never preempts.
    peers = [waiting, claim("early", 42, 1.0, holds=1), claim("late", 42, 2.0, holds=1)]
    assert owed("late", 1, peers) == (1, waiting) and owed("early", 1, peers) == (0, None)
    assert owed("early", 0, [claim("w", 42, 3.0, waits=2), claim("early", 42, 1.0, holds=2)]) == (0, None)
    # A job that is not preemptible gives nothing, and the others do not count on its slots.
    stubborn = [waiting, claim("mid", 20, 1.0, holds=1), claim("low", 42, 2.0, holds=1, preemptible=False)]
    assert owed("low", 0, stubborn) == (0, None) and owed("mid", 0, stubborn) == (2, waiting)


# No checkpoint: the first run sleeps until the SIGTERM ends it (no handler); the restart finishes.
UNCHECKPOINTED = """
import os, time, trialkit
p = trialkit.get_next_parameter()
if os.environ["TRIALKIT_RESTART_COUNT"] == "0":
    time.sleep(120)
trialkit.report_final_result(p["x"])
"""


def test_a_preempted_trial_that_does_not_checkpoint_is_not_lost_but_starts_again(tmp_path, home):
    low = start_cli("run", experiment(tmp_path, SPACE, UNCHECKPOINTED, name="a", maxTrialNumber=2))
    high = None
    try:
        a = experiment_id(low.stdout.readline())
        wait_until(lambda: stored(home, a, "SELECT status FROM trials") == [("RUNNING",)] * 2, TIMEOUT,
                   "a's trials to hold the pool")
        high = start_cli("run", experiment(tmp_path, SPACE, UNCHECKPOINTED.replace("120", "0"), name="b",
                                           maxTrialNumber=2, trainingService={"platform": "local",
                                                                              "poolPriority": 1}))
        b = experiment_id(high.stdout.readline())
        finish(low)
        finish(high)
    finally:
        stop_all(low, high)
    # Killed by the SIGTERM (the keeper would say USER_CANCELED): paused all the same, and run again.
    assert stored(home, a, "SELECT status, restart_count FROM trials") == [("SUCCEEDED", 1)] * 2, \
        stored(home, a, "SELECT trial, status, reason, source FROM statuses ORDER BY id")
    assert [status for (status,) in stored(home, a, "SELECT DISTINCT status FROM statuses WHERE status NOT IN "
                                                    "('WAITING', 'RUNNING') ORDER BY id")] == ["PREEMPTED", "SUCCEEDED"]
    assert stored(home, b, "SELECT status FROM trials") == [("SUCCEEDED",)] * 2


def test_a_descending_pool_preempts_for_bigger_numbers_and_a_fair_share_pool_for_none():
    from trialkit.platforms.pools import FAIR_SHARE, PRIORITY_DESCENDING, Claim
    from trialkit.platforms.preempt import owed

    waiting, holding = Claim("w", 100, 2.0, 0, 1, True), Claim("h", 42, 1.0, 1, 0, True)
    assert owed("h", 0, [waiting, holding], PRIORITY_DESCENDING) == (1, waiting)
    assert owed("h", 0, [waiting, holding]) == (0, None)  # Determined's order: 100 comes after 42
    assert owed("h", 0, [Claim("w", 1, 2.0, 0, 1, True), holding], FAIR_SHARE) == (0, None)


def test_a_control_plane_resumed_after_kill_9_pauses_its_trials_for_the_job_that_waits(tmp_path, home):
    """Killed, a's control plane cannot preempt: b waits on the slots a's keepers hold. Resumed, it finds
    its trials again and gives their slots back through their checkpoints."""
    log = tmp_path / "runs"
    low, a = fill_the_pool(tmp_path, home, log)
    high = resumed = None
    try:
        low.send_signal(signal.SIGKILL)  # its keepers run on, and hold the pool's 2 slots
        low.communicate()
        high = start_cli("run", checkpointing(tmp_path, "b", log, steps=5, hold=5, poolPriority=1))
        b = experiment_id(high.stdout.readline())
        wait_until(lambda: stored(home, b, "SELECT status FROM trials") == [("WAITING",)] * 2, TIMEOUT,
                   "b's trials to wait")
        resumed = start_cli("experiment", "resume", a)
        wait_until(lambda: log.read_text().count(" b ") >= 2, TIMEOUT, "b's trials to start once a resumed")
        (tmp_path / "gate").touch()
        finish(resumed)
        finish(high)
    finally:
        (tmp_path / "gate").touch()
        stop_all(low, high, resumed)
    paused_once_then_resumed(home, log, a)
    assert stored(home, b, "SELECT status FROM trials") == [("SUCCEEDED",)] * 2


def test_just_enough_trials_are_paused_the_newest_first(tmp_path, home):
    log = tmp_path / "runs"
    low, a = fill_the_pool(tmp_path, home, log)
    high = None
    try:
        high = start_cli("run", experiment(tmp_path, SPACE, UNCHECKPOINTED.replace("120", "0"), name="b",
                                           maxTrialNumber=1, trialConcurrency=1,
                                           trainingService={"platform": "local", "poolPriority": 1}))
        b = experiment_id(high.stdout.readline())
        wait_until(lambda: stored(home, b, "SELECT status FROM trials") == [("SUCCEEDED",)], TIMEOUT, "b's trial")
        (tmp_path / "gate").touch()
        finish(low)
        finish(high)
    finally:
        (tmp_path / "gate").touch()
        stop_all(low, high)
    # b's one trial needed one slot: only a's newest trial (its second) gave it, the first ran on
    first, second = sorted({run["trial"] for run in runs(log) if run["name"] == "a"})
    assert [(run["trial"], run["first"], run["last"]) for run in sorted(runs(log), key=lambda run: run["start"])
            if run["trial"] == first] == [(first, 0, STEPS)], runs(log)
    assert stored(home, a, "SELECT DISTINCT trial FROM statuses WHERE status = 'PREEMPTED'") == [(second,)]
    assert stored(home, a, "SELECT status FROM trials") == [("SUCCEEDED",)] * 2


def test_the_seeds_job_queue_example_plays_out_as_printed(tmp_path, home):
    """Determined's job queue example (`det job list`, `det job update SECOND --ahead-of FIRST`): two experiments
    of priority 42 on one slot; moved ahead, the second takes the slot, the first's trial pausing through its
    checkpoint and queueing again; `#` numbers the pool's order; the Submitted times stay as they were."""
    import getpass

    pool_of(home, 1)
    log = tmp_path / "runs"

    def one_trial(name: str, job_name: str) -> Path:  # it holds its slot at step HOLD until the gate opens
        script = CHECKPOINTING.format(log=str(log), name=name, steps=STEPS, hold=HOLD, gate=str(tmp_path / "gate"),
                                      pace=0.05)
        return experiment(tmp_path, SPACE, script, name=name, experimentName=job_name, trialConcurrency=1,
                          maxTrialNumber=1, trialGraceSeconds=20)

    def listed() -> list:
        done = cli("job", "list", "--resource-pool", "default", "--json")  # Determined's flag
        assert done.returncode == 0, done.stderr
        return [(job["id"], job["type"], job["name"], job["priority"], job["submitted"],
                 f"{job['slots_acquired']}/{job['slots_needed']}", job["status"], job["user"])
                for job in json.loads(done.stdout)]

    me = getpass.getuser()
    low = high = None
    try:
        low = start_cli("run", one_trial("a", "first_job"))
        first = experiment_id(low.stdout.readline())
        wait_until(lambda: log.exists() and " a " in log.read_text(), TIMEOUT, "the first job's trial to run")
        high = start_cli("run", one_trial("b", "second_job"))
        second = experiment_id(high.stdout.readline())
        wait_until(lambda: [row[-2] for row in listed()] == ["SCHEDULED", "QUEUED"], TIMEOUT, "the second to queue")
        before = listed()
        (_, _, _, _, first_submitted, _, _, _), (_, _, _, _, second_submitted, _, _, _) = before
        assert before == [(first, "TYPE_EXPERIMENT", "first_job", 42, first_submitted, "1/1", "SCHEDULED", me),
                          (second, "TYPE_EXPERIMENT", "second_job", 42, second_submitted, "0/1", "QUEUED", me)]

        done = cli("job", "update", second, "--ahead-of", first)
        assert done.returncode == 0, done.stderr
        after = [(second, "TYPE_EXPERIMENT", "second_job", 42, second_submitted, "1/1", "SCHEDULED", me),
                 (first, "TYPE_EXPERIMENT", "first_job", 42, first_submitted, "0/1", "QUEUED", me)]
        wait_until(lambda: listed() == after, TIMEOUT, "the two jobs to swap")
        table = cli("job", "list", "--resource-pool", "default").stdout.splitlines()
        assert table[0].split() == ["#", "id", "type", "experiment", "name", "priority", "submitted", "slots",
                                    "status", "user"]
        assert [line.split()[:3] for line in table[2:]] == [["0", second, "TYPE_EXPERIMENT"],
                                                            ["1", first, "TYPE_EXPERIMENT"]]
        # Their trials, numbered in the pool's order across the experiments.
        trials = json.loads(cli("job", "list", "--json").stdout)
        assert [(job["position"], job["id"], job["status"]) for job in trials] == [
            (0, f"{second}-00000", "RUNNING"), (1, f"{first}-00000", "QUEUED")], trials
        (tmp_path / "gate").touch()
        finish(high)
        finish(low)
    finally:
        (tmp_path / "gate").touch()
        stop_all(low, high)
    # The first's trial paused through its checkpoint (exit 143) and went on from it once the second was done.
    assert stored(home, first, "SELECT status, exit_code FROM statuses WHERE status = 'PREEMPTED'") == [
        ("PREEMPTED", 143)]
    found = sorted((run for run in runs(log) if run["name"] == "a"), key=lambda run: run["start"])
    assert [(run["first"], run["last"]) for run in found] == [(0, HOLD), (HOLD, STEPS)], found
    b_run = next(run for run in runs(log) if run["name"] == "b")
    assert found[0]["end"] <= b_run["start"] and b_run["end"] <= found[1]["start"], runs(log)


# run.sh's interpreter for the keeper (TRIALKIT_PYTHON): it starts the keeper only once the gate file exists, as a
# keeper slow to start on a busy machine would; until then the trial has not started and says nothing.
SLOW_KEEPER = """#!{python}
import os, sys, time
while not os.path.exists({gate!r}):
    time.sleep(0.02)
os.execv(sys.executable, [sys.executable] + sys.argv[1:])
"""
# The trial of the job ahead opens the gate when it starts.
OPENS_THE_GATE = """
import trialkit
open({gate!r}, "w").close()
trialkit.report_final_result(trialkit.get_next_parameter()["x"])
"""


def test_a_trial_preempted_before_it_started_waits_again_without_a_run(tmp_path, home):
    """A trial's slots came free, and before its keeper started the command a job ahead of it came to wait for
    them: it gives them back, but it never ran, so no run ended: no PREEMPTED, no restart; it waits again."""
    import os
    import sys

    pool_of(home, 1)
    gate = tmp_path / "gate"
    slow = tmp_path / "slow-python"
    slow.write_text(SLOW_KEEPER.format(python=sys.executable, gate=str(gate)))
    slow.chmod(0o755)
    low = start_cli("run", experiment(tmp_path, SPACE, UNCHECKPOINTED.replace("120", "0"), name="a",
                                      maxTrialNumber=1, trialConcurrency=1),
                    env={**os.environ, "TRIALKIT_PYTHON": str(slow)})
    high = None
    try:
        a = experiment_id(low.stdout.readline())
        trial = f"{a}-00000"
        # Its slot leased and run.sh started (trial.log opened for it): the keeper waits for the gate.
        wait_until(lambda: (home / "experiments" / a / "trials" / trial / "trial.log").exists(), TIMEOUT,
                   "a's trial to be started")
        high = start_cli("run", experiment(tmp_path, SPACE, OPENS_THE_GATE.format(gate=str(gate)), name="c",
                                           maxTrialNumber=1, trialConcurrency=1, priority=1))
        c = experiment_id(high.stdout.readline())
        out = finish(low)
        finish(high)
    finally:
        gate.touch()
        stop_all(low, high)
    shown = cli("trial", "show", trial).stdout
    assert "PREEMPTED" not in shown and "PAUSED" not in shown and "restarts       0" in shown and "status         SUCCEEDED" in shown, shown
    assert "PAUSED" not in out, out
    assert stored(home, c, "SELECT status FROM trials") == [("SUCCEEDED",)]
