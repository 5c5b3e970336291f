"""The home's resource pool: local experiments share its slots through the lease table (platforms/pools.py).

Real experiments (`trialkit run`, real keepers and trials) on a pool of pools.yml; the trials write their
own start and end times, and the checks are made from those.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest

from experiment_util import TIMEOUT, cli, experiment, experiment_id, export, start_cli
from gpu_util import most_at_once
from harness import wait_until
from pools_util import GATED, SLOTS_HOLDER, finish, home, pool_of, pools_yml, start_holder  # noqa: F401 (home: a fixture)

# Notes its start, holds its slot for `hold` seconds, notes its end, reports.
TIMED = """
import time, trialkit
p = trialkit.get_next_parameter()
with open({log!r}, "a") as f:
    f.write(f"start {{time.time()}} {name}\\n")
time.sleep({hold})
with open({log!r}, "a") as f:
    f.write(f"end {{time.time()}} {name}\\n")
trialkit.report_final_result(p["x"])
"""
SPACE = {"x": {"_type": "choice", "_value": [1, 2, 3, 4]}}


def timed(tmp_path: Path, name: str, log: Path, hold: float, trials: int, **keys) -> Path:
    keys.setdefault("trialConcurrency", 2)
    return experiment(tmp_path, SPACE, TIMED.format(log=str(log), name=name, hold=hold), name=name,
                      maxTrialNumber=trials, **keys)


def spans(log: Path) -> List[Dict[str, Any]]:
    """{start, end, name (its experiment's)} of each trial, from the trials' own notes, paired in order per name."""
    starts: Dict[str, List[float]] = {}
    out = []
    for line in log.read_text().splitlines():
        kind, when, name = line.split()
        if kind == "start":
            starts.setdefault(name, []).append(float(when))
        else:
            out.append({"start": starts[name].pop(0), "end": float(when), "name": name})
    return out


def test_two_experiments_on_a_pool_of_two_slots_never_run_more_than_two_trials(tmp_path, home):
    pool_of(home, 2)
    log = tmp_path / "spans"
    first = start_cli("run", timed(tmp_path, "a", log, hold=2.0, trials=2))
    second = start_cli("run", timed(tmp_path, "b", log, hold=2.0, trials=2))
    ids = [experiment_id(proc.stdout.readline()) for proc in (first, second)]
    for proc in (first, second):
        finish(proc)
    found = spans(log)
    assert len(found) == 4
    assert most_at_once(found) == 2, found  # each experiment alone would run its 2 beside the other's 2
    for exp in ids:
        assert [row["status"] for row in export(exp)] == ["SUCCEEDED", "SUCCEEDED"]
    assert not (home / "pools.db").exists() or _leases(home) == []  # every lease given back


def _leases(home: Path) -> list:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(str(home / "pools.db"))) as db:
        return db.execute("SELECT holder, pid FROM leases").fetchall()


def test_a_lease_whose_holder_was_sigkilled_is_given_again(home):
    from trialkit.platforms import pools

    pool_of(home, 2)
    holder = start_holder(SLOTS_HOLDER, "2")
    try:
        pool = pools.open_pool()
        assert not pool.take("next-00000", "next", 1)  # the holder runs: its 2 slots are the pool's 2
        assert pool.waiting_reason("next", 1) == "waiting for 1 slot of pool default: 0 of 2 free"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert pool.take("next-00000", "next", 2)
    assert _leases(home) == [("next-00000", os.getpid())]
    pool.close()


def test_a_sigkilled_control_plane_keeps_its_running_trial_s_slot_until_that_trial_ends(tmp_path, home):
    pool_of(home, 1)
    log = tmp_path / "spans"
    first = start_cli("run", timed(tmp_path, "a", log, hold=3.0, trials=1, trialConcurrency=1))
    experiment_id(first.stdout.readline())
    wait_until(lambda: log.exists() and "start" in log.read_text(), TIMEOUT, "a's trial to start")
    first.send_signal(signal.SIGKILL)  # its trial's keeper runs on, and holds the slot
    first.communicate()
    second = start_cli("run", timed(tmp_path, "b", log, hold=0.0, trials=1, trialConcurrency=1))
    finish(second)
    a, b = sorted(spans(log), key=lambda span: span["start"])
    assert b["start"] >= a["end"]  # b waited for a's trial, then got the slot a's dead control plane had
    wait_until(lambda: _leases(home) == [], TIMEOUT, "a's keeper to end")


def test_a_pool_too_small_for_a_trial_is_one_line(tmp_path, home):
    pool_of(home, 1)
    done = cli("run", timed(tmp_path, "a", tmp_path / "spans", hold=0.0, trials=1,
                            trainingService={"platform": "local", "slotsPerTrial": 2}))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "each trial asks for 2 slots but pool 'default' has 1" in done.stderr


def test_a_pools_file_with_a_mistake_is_one_line(tmp_path, home):
    pools_yml(home, "  default: {slot: 2}\n")
    done = cli("run", timed(tmp_path, "a", tmp_path / "spans", hold=0.0, trials=1))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "slot" in done.stderr and "pools.yml" in done.stderr


def gated(tmp_path: Path, name: str, log: Path, gate: Path, trials: int, top: Any = None, **service) -> Path:
    """An experiment of GATED trials; `top`: more of the config's top-level keys."""
    return experiment(tmp_path, SPACE, GATED.format(log=str(log), name=name, gate=str(gate)), name=name,
                      trialConcurrency=2, maxTrialNumber=trials, trainingService={"platform": "local", **service},
                      **(top or {}))


# How b goes ahead of a: `job update`, b's config (NNI users write `priority`, Determined users resources.priority,
# which is poolPriority), `job update-batch`.
@pytest.mark.parametrize("how", ["--priority 1", "--ahead-of", "poolPriority: 1", "priority: 1", "update-batch"])
def test_a_later_experiment_moved_ahead_gets_the_next_free_slots(tmp_path, home, how):
    pool_of(home, 2)
    log, gate = tmp_path / "spans", tmp_path / "gate"
    # a's trials do not checkpoint: not preemptible, they hold their slots (tests/test_preemption.py preempts)
    first = start_cli("run", gated(tmp_path, "a", log, gate, trials=4, preemptible=False))
    earlier = experiment_id(first.stdout.readline())
    wait_until(lambda: log.exists() and log.read_text().count("start") == 2, TIMEOUT, "a's 2 trials to hold the pool")
    second = start_cli("run", gated(tmp_path, "b", log, gate, trials=2,
                                    top={"priority": 1} if how == "priority: 1" else None,
                                    **({"poolPriority": 1} if how == "poolPriority: 1" else {})))
    try:
        later = experiment_id(second.stdout.readline())
        wait_until(lambda: [row["status"] for row in export(later)] == ["WAITING", "WAITING"], TIMEOUT, "b to wait")
        # a's priority is the default, 42: smaller starts first; or b takes a's priority and the place before it
        if how == "update-batch":  # Determined's syntax, applied in order
            done = cli("job", "update-batch", f"{earlier}.priority=50", f"{later}.ahead-of={earlier}")
            assert done.returncode == 0, done.stderr
        elif how not in ("poolPriority: 1", "priority: 1"):  # its config's
            done = cli("job", "update", later, *(how.split() if how != "--ahead-of" else [how, earlier]))
            assert done.returncode == 0, done.stderr
        a_priority = 50 if how == "update-batch" else 42
        b_priority = a_priority if how in ("--ahead-of", "update-batch") else 1
        assert [(job["id"], job["priority"], job["slots_acquired"], job["slots_needed"], job["status"])
                for job in pool_jobs()] == [(later, b_priority, 0, 2, "QUEUED"),
                                            (earlier, a_priority, 2, 2, "SCHEDULED")]
    finally:
        gate.touch()  # every trial ends, whatever failed
        for proc in (first, second):
            finish(proc)
    assert pool_jobs() == []  # both control planes ended, and every lease with them
    starts = [span["name"] for span in sorted(spans(log), key=lambda span: span["start"])]
    assert starts == ["a", "a", "b", "b", "a", "a"]  # a submitted first, but b's trials took the slots a's freed


def test_a_trial_held_back_by_a_job_ahead_says_which_job_it_waits_behind(tmp_path, home):
    """One of 2 slots free and experiment c (priority 1) waiting for 2: a's trial would fit, but waits behind c,
    and its waiting reason names c, not only the free count."""
    pool_of(home, 2)
    log = tmp_path / "spans"
    holder = start_holder(SLOTS_HOLDER, "1")
    first = second = None
    try:
        second = start_cli("run", timed(tmp_path, "c", log, hold=0.0, trials=1, trialConcurrency=1, priority=1,
                                        trainingService={"platform": "local", "slotsPerTrial": 2}))
        c = experiment_id(second.stdout.readline())
        wait_until(lambda: "waiting for 2 slots" in cli("trial", "list", c).stdout, TIMEOUT, "c to wait")
        first = start_cli("run", timed(tmp_path, "a", log, hold=0.0, trials=1, trialConcurrency=1))
        a = experiment_id(first.stdout.readline())
        behind = f"waiting behind experiment {c}, priority 1, in pool default: 1 of 2 slots free"
        wait_until(lambda: f"WAITING: {behind}" in cli("trial", "show", f"{a}-00000").stdout, TIMEOUT,
                   "a to say it waits behind c")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        for proc in (second, first):
            if proc is not None:
                finish(proc)
    assert [span["name"] for span in sorted(spans(log), key=lambda span: span["start"])] == ["c", "a"]


def pool_jobs() -> list:
    done = cli("job", "list", "--pool", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_priority_for_an_experiment_with_no_job_in_the_pool_is_refused(home):
    from trialkit.errors import UserError
    from trialkit.platforms import pools

    pool = pools.open_pool()  # the table exists, without that experiment's job
    with pytest.raises(UserError, match="experiment nosuchexp has no job in this home's resource pool"):
        pools.update([("nosuchexp", "priority", 1)])
    pool.join("mine")
    with pytest.raises(UserError, match="experiment nosuchexp has no job in this home's resource pool"):
        pools.update([("mine", "priority", 5), ("mine", "ahead_of", "nosuchexp")])
    assert [job["priority"] for job in pools.jobs()] == [42]  # all or none: the first change is undone too
    pool.close()


def test_behind_of_places_a_job_between_the_other_and_the_next_of_its_priority(home):
    from trialkit.platforms import pools

    pool = pools.open_pool()
    for name in ("j1", "j2", "j3"):
        pool.join(name)
    pools.update([("j3", "behind_of", "j1")])
    assert [job["id"] for job in pools.jobs()] == ["j1", "j3", "j2"]
    pools.update([("j1", "behind_of", "j2")])
    assert [job["id"] for job in pools.jobs()] == ["j3", "j2", "j1"]
    pools.update([("j1", "priority", 7), ("j2", "ahead_of", "j1")])
    assert [(job["id"], job["priority"]) for job in pools.jobs()] == [("j2", 7), ("j1", 7), ("j3", 42)]
    pool.close()


def test_a_job_moves_neither_around_itself_nor_around_one_that_left(home):
    import sqlite3

    from trialkit.errors import UserError
    from trialkit.platforms import pools

    pool = pools.open_pool()
    for name in ("live", "gone"):
        pool.join(name)
    with pytest.raises(UserError, match="cannot move ahead of itself"):
        pools.update([("live", "ahead_of", "live")])
    ended = subprocess.Popen(["true"])  # a process that has ended: as the control plane of a job that is gone
    ended.wait()
    with sqlite3.connect(str(home / pools.DB_NAME)) as db:
        db.execute("UPDATE jobs SET pid = ? WHERE experiment = 'gone'", (ended.pid,))
    with pytest.raises(UserError, match="experiment gone is not running"):
        pools.update([("live", "behind_of", "gone")])
    pool.close()


def test_an_experiment_takes_its_slots_from_the_pool_its_config_names(tmp_path, home):
    pools_yml(home, "  default: {slots: 2}\n  small: {slots: 1}\n")
    log = tmp_path / "spans"
    finish(start_cli("run", timed(tmp_path, "a", log, hold=1.0, trials=2,
                                  trainingService={"platform": "local", "resourcePool": "small"})))
    assert len(spans(log)) == 2 and most_at_once(spans(log)) == 1  # the default pool would run both at once
    done = cli("run", timed(tmp_path, "b", log, hold=0.0, trials=1,
                            trainingService={"platform": "local", "resourcePool": "nosuch"}))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "there is no resource pool 'nosuch'" in done.stderr
