"""A resource pool's schedulers beyond the default priority one (platforms/pools.py): fair share by weight, the
Kubernetes order (bigger priority first), and a running experiment's job moved to another pool.

Real experiments (`trialkit run`, real keepers and trials) on pools of pools.yml; each trial notes its start
in a file and waits for its own gate file, so the test decides which trial ends when; what a job holds is read
from the lease table (`job list --pool`).
"""
from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Dict, List

import pytest

from experiment_util import TIMEOUT, cli, experiment, experiment_id, export, start_cli
from harness import wait_until
from pools_util import SLOTS_HOLDER, finish, home, pools_yml, start_holder  # noqa: F401 (home: a fixture)

# Notes its start (a file named EXPERIMENT.TRIAL), waits for gate/TRIAL or gate/all, reports.
GATED = """
import os, time, trialkit
p = trialkit.get_next_parameter()
me = os.environ["TRIALKIT_TRIAL_ID"]
open(os.path.join({started!r}, {name!r} + "." + me), "w").close()
while not (os.path.exists(os.path.join({gate!r}, me)) or os.path.exists(os.path.join({gate!r}, "all"))):
    time.sleep(0.05)
trialkit.report_final_result(p["x"])
"""
SPACE = {"x": {"_type": "uniform", "_value": [0, 1]}}


@pytest.fixture
def dirs(tmp_path) -> Dict[str, Path]:
    out = {"started": tmp_path / "started", "gate": tmp_path / "gate"}
    for path in out.values():
        path.mkdir()
    return out


def gated(tmp_path: Path, dirs: Dict[str, Path], name: str, trials: int, concurrency: int, **service) -> Path:
    script = GATED.format(started=str(dirs["started"]), gate=str(dirs["gate"]), name=name)
    return experiment(tmp_path, SPACE, script, name=name, trialConcurrency=concurrency, maxTrialNumber=trials,
                      trainingService={"platform": "local", **service})


def started(dirs: Dict[str, Path], name: str) -> List[str]:
    """The trial ids of the experiment's trials that have started, in no order."""
    return [path.name.split(".", 1)[1] for path in dirs["started"].glob(f"{name}.*")]


def pool_jobs(name: str = "default") -> list:
    """`job list --pool NAME --json`'s rows, read in this process (the test polls it)."""
    from trialkit.platforms import pools

    return pools.jobs(name)


def held() -> Dict[str, float]:
    """Experiment -> the slots it holds in the default pool, from the lease table."""
    return {job["id"]: job["slots_acquired"] for job in pool_jobs()}


def one_line_refusal(*args: str) -> str:
    done = cli(*args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, (done.returncode, done.stderr)
    return done.stderr


@pytest.mark.parametrize("how", ["job update", "update-batch", "experiment update"])
def test_fair_share_divides_the_pool_by_weight_and_a_new_weight_shifts_it(tmp_path, home, dirs, how):
    pools_yml(home, "  default: {slots: 4, scheduler: fair_share}\n")
    blocker = start_holder(SLOTS_HOLDER, "4")  # every slot of the pool: the experiments queue up behind it
    procs = []
    try:
        # Both want the whole pool (4 trials at once), both queue behind the blocker
        procs = [start_cli("run", gated(tmp_path, dirs, "a", trials=6, concurrency=4, poolWeight=3)),
                 start_cli("run", gated(tmp_path, dirs, "b", trials=6, concurrency=4))]
        a, b = (experiment_id(proc.stdout.readline()) for proc in procs)
        wait_until(lambda: {(job["id"], job["slots_needed"]) for job in pool_jobs()} == {(a, 4), (b, 4)},
                   TIMEOUT, "a and b to wait for 4 slots each")
        assert {job["id"]: job["weight"] for job in pool_jobs()} == {a: 3, b: 1}
        listed = cli("job", "list", "--pool")  # a fair share pool's table shows weights, not priorities
        assert listed.returncode == 0 and listed.stdout.split()[5] == "weight", listed.stdout + listed.stderr
        blocker.kill()
        blocker.wait()
        # The 4 slots free at once go 3 to a (weight 3), 1 to b (weight 1), and stay so while both wait
        wait_until(lambda: sum(held().values()) == 4, TIMEOUT, "the pool's 4 slots to be taken")
        assert held() == {a: 3, b: 1}
        wait_until(lambda: len(started(dirs, "a")) + len(started(dirs, "b")) == 4, TIMEOUT, "4 trials to start")
        assert (len(started(dirs, "a")), len(started(dirs, "b"))) == (3, 1)  # the trials' own word
        assert all(job["status"] == "QUEUED" for job in pool_jobs())  # both still want more

        assert "must be greater than 0" in one_line_refusal("job", "update", b, "--weight", "0")
        assert "must be greater than 0" in one_line_refusal("job", "update-batch", f"{b}.weight=-1")
        assert "fair share" in one_line_refusal("job", "update", b, "--priority", "1")  # Determined: one or other
        assert "fair share" in one_line_refusal("job", "update", b, "--ahead-of", a)
        if how == "job update":
            done = cli("job", "update", b, "--weight", "3")
        elif how == "update-batch":  # Determined's syntax, both at once
            done = cli("job", "update-batch", f"{a}.weight=3", f"{b}.weight=3")
        else:
            done = cli("experiment", "update", b, "--weight", "3")
        assert done.returncode == 0, done.stderr
        assert {job["id"]: job["weight"] for job in pool_jobs()} == {a: 3, b: 3}
        # One of a's trials ends: with 2 against b's 1 at equal weights, b is owed the slot (at 3:1, a took it)
        (dirs["gate"] / started(dirs, "a")[0]).touch()
        wait_until(lambda: len(started(dirs, "a")) + len(started(dirs, "b")) == 5, TIMEOUT, "a 5th trial to start")
        wait_until(lambda: sum(held().values()) == 4, TIMEOUT, "the freed slot to be taken again")
        assert held() == {a: 2, b: 2}
        assert (len(started(dirs, "a")), len(started(dirs, "b"))) == (3, 2)
    finally:
        blocker.kill()
        blocker.wait()
        (dirs["gate"] / "all").touch()
        for proc in procs:
            finish(proc)
    for exp in (a, b):
        assert [row["status"] for row in export(exp)] == ["SUCCEEDED"] * 6


def test_a_running_experiment_moved_to_another_pool_starts_its_next_trials_there(tmp_path, home, dirs):
    pools_yml(home, "  default: {slots: 2}\n  other: {slots: 1}\n")
    proc = start_cli("run", gated(tmp_path, dirs, "b", trials=3, concurrency=3))
    try:
        b = experiment_id(proc.stdout.readline())
        wait_until(lambda: len(started(dirs, "b")) == 2 and [job["slots_needed"] for job in pool_jobs()] == [3], TIMEOUT,
                   "2 trials to hold the default pool's 2 slots and a third to wait")
        assert "there is no resource pool 'nosuch'" in one_line_refusal("job", "update", b, "--resource-pool",
                                                                        "nosuch")
        assert "counts only in a fair_share pool" in one_line_refusal("job", "update", b, "--weight", "2")
        assert "a trial's job has no resource pool of its own" in one_line_refusal(
            "job", "update", started(dirs, "b")[0], "--resource-pool", "other")  # its experiment's is
        done = cli("job", "update", b, "--resource-pool", "other")
        assert done.returncode == 0, done.stderr
        # Its third trial takes the other pool's slot; the first two keep their leases in default
        wait_until(lambda: len(started(dirs, "b")) == 3, TIMEOUT, "the third trial to start in the other pool")
        assert sorted(pool for pool, in _lease_pools(home)) == ["default", "default", "other"]
        done = cli("experiment", "update", b, "--priority", "7")  # the one function job update uses
        assert done.returncode == 0 and done.stdout == f"updated experiment {b}: priority\n", done.stderr
        other = cli("job", "list", "--pool", "other", "--csv")
        assert other.returncode == 0, other.stderr
        assert other.stdout.splitlines()[1].split(",")[5:7] == ["7", "1"]  # its priority, its weight
        # Each pool lists it with what it holds there: default its first two trials' leases, other the third's
        assert [(job["id"], job["slots_acquired"], job["slots_needed"]) for job in pool_jobs()] == [(b, 2, 2)]
        assert [(job["id"], job["slots_acquired"], job["slots_needed"]) for job in pool_jobs("other")] == [(b, 1, 1)]
        listed = cli("job", "list", "--pool").stdout
        assert f"{b}  TYPE_EXPERIMENT" in listed and "2/2" in listed, listed
    finally:
        (dirs["gate"] / "all").touch()
        finish(proc)
    assert [row["status"] for row in export(b)] == ["SUCCEEDED"] * 3


def test_delete_takes_the_experiment_s_job_out_of_pools_db(tmp_path, home, dirs):
    """The jobs table keeps an ended experiment's job for its resume; once it is deleted no row names it."""
    (dirs["gate"] / "all").touch()
    done = cli("run", gated(tmp_path, dirs, "a", trials=1, concurrency=1))
    assert done.returncode == 0, done.stderr
    a = experiment_id(done.stdout.splitlines()[0])
    assert _job_rows(home) == [(a,)]
    deleted = cli("experiment", "delete", a, "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert _job_rows(home) == []


def _job_rows(home: Path) -> list:
    with closing(sqlite3.connect(str(home / "pools.db"))) as db:
        return db.execute("SELECT experiment FROM jobs").fetchall()


def _lease_pools(home: Path) -> list:
    with closing(sqlite3.connect(str(home / "pools.db"))) as db:
        return db.execute("SELECT pool FROM leases").fetchall()


@pytest.mark.parametrize("scheduler, first", [("priority", "small"), ("priority_descending", "big")])
def test_the_kubernetes_order_gives_free_slots_to_the_bigger_priority_first(home, scheduler, first):
    from trialkit.platforms import pools

    pools_yml(home, f"  default: {{slots: 1, scheduler: {scheduler}}}\n")
    pool = pools.open_pool()
    pool.join("small", priority=1)
    pool.join("big", priority=50)
    assert pool.take("blocker-00000", "blocker", 1)
    assert not pool.take("small-00000", "small", 1) and not pool.take("big-00000", "big", 1)  # both wait
    pool.release("blocker-00000")
    last = "big" if first == "small" else "small"
    assert not pool.take(f"{last}-00000", last, 1)  # the other waits ahead of it
    assert pool.take(f"{first}-00000", first, 1)
    assert [job["id"] for job in pools.jobs()] == [first, last]
    pool.close()


@pytest.mark.parametrize("yml, words", [
    ("pools:\n  default: {slots: 2, scheduler: fairshare}\n", "did you mean 'fair_share'"),
    ("pools:\n  default: {slots: 2, scheduler: lottery}\n", "priority, priority_descending, fair_share"),
])
def test_an_unknown_scheduler_in_pools_yml_is_one_line(tmp_path, home, dirs, yml, words):
    (home / "pools.yml").write_text(yml)
    for args in (("run", gated(tmp_path, dirs, "a", trials=1, concurrency=1)), ("job", "list", "--pool")):
        line = one_line_refusal(*map(str, args))
        assert "pools.yml" in line and "scheduler" in line and words in line


def test_a_weight_in_a_priority_pool_and_a_priority_in_a_fair_share_pool_are_refused_at_the_start(tmp_path, home,
                                                                                                  dirs):
    pools_yml(home, "  default: {slots: 2}\n  fair: {slots: 2, scheduler: fair_share}\n")
    weighted = gated(tmp_path, dirs, "a", trials=1, concurrency=1, poolWeight=2)
    assert "counts only in a fair_share pool" in one_line_refusal("run", str(weighted))
    prioritized = gated(tmp_path, dirs, "b", trials=1, concurrency=1, resourcePool="fair", poolPriority=3)
    assert "schedules by fair share" in one_line_refusal("run", str(prioritized))


def test_a_pools_db_written_before_weights_gets_the_column(home):
    from trialkit.platforms import pools

    with closing(sqlite3.connect(str(home / pools.DB_NAME))) as db:  # the jobs table as first released
        db.execute("CREATE TABLE jobs (experiment TEXT PRIMARY KEY, pool TEXT NOT NULL, priority INTEGER NOT NULL "
                   "DEFAULT 42, submitted REAL NOT NULL, pid INTEGER NOT NULL, ticks INTEGER NOT NULL, waiting REAL "
                   "NOT NULL DEFAULT 0, queued REAL NOT NULL DEFAULT 0)")
        db.commit()
    pools_yml(home, "  default: {slots: 2, scheduler: fair_share}\n")
    pool = pools.open_pool()
    pool.join("old", weight=2.5)
    assert [(job["id"], job["weight"]) for job in pools.jobs()] == [("old", 2.5)]
    pool.close()
