"""Bad input thrown at the job queue across experiments (platforms/pools.py, `trialkit job ...`, the page's pool
route): each is one line on stderr and exit 2 (the manager: a 4xx with a reason), nothing changed.

One real experiment (`trialkit run --detach`, a trial that waits for a gate file) holds the only slot of a
home's pool; the CLI and its manager's POST /api/ui/experiments/<exp>/pool are driven against it.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path
from typing import Dict, Iterator, List
from urllib.parse import urlsplit

import pytest
import requests

from experiment_util import PYTHON, TIMEOUT, experiment
from harness import wait_until

TRIAL = """
import os, trialkit
trialkit.get_next_parameter()
while not os.path.exists({gate!r}):
    import time; time.sleep(0.05)
trialkit.report_final_result(1.0)
"""


def run_cli(home: Path, *args: object) -> subprocess.CompletedProcess:
    """`trialkit ARGS` in `home`; bytes arguments go as they are (a name that is not UTF-8)."""
    argv: List[object] = [PYTHON, "-m", "trialkit.cli", *(a if isinstance(a, bytes) else str(a) for a in args)]
    return subprocess.run(argv, capture_output=True, timeout=TIMEOUT, env={**os.environ, "TRIALKIT_HOME": str(home)})


def refused(done: subprocess.CompletedProcess, *words: str) -> str:
    """One line on stderr naming `words`, exit 2, no traceback."""
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 2, (done.returncode, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, err
    return err


class Running:
    """A home with a pool of one slot and one running experiment holding it, with its page's URL and token."""

    def __init__(self, root: Path):
        self.home = root / "home"
        self.home.mkdir()
        (self.home / "pools.yml").write_text("pools:\n  default: {slots: 1}\n")
        self.gate = root / "gate"
        config = experiment(root, {"x": {"_type": "uniform", "_value": [0, 1]}}, TRIAL.format(gate=str(self.gate)),
                            trialConcurrency=1, maxTrialNumber=1)
        done = run_cli(self.home, "run", config, "--detach")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.decode().splitlines()
        self.id = lines[0].split()[-1]
        url = urlsplit(next(line for line in lines if line.startswith("page: ")).split()[-1])
        self.pool_url = f"{url.scheme}://{url.netloc}/api/ui/experiments/{self.id}/pool"
        self.token = url.query.removeprefix("token=")
        wait_until(lambda: self.statuses() == ["RUNNING"], TIMEOUT, "the trial to run")

    def statuses(self) -> List[str]:
        done = run_cli(self.home, "experiment", "export", self.id)
        assert done.returncode == 0, done.stderr
        return [row["status"] for row in json.loads(done.stdout)]

    def jobs(self) -> List[Dict[str, object]]:
        done = run_cli(self.home, "job", "list", "--pool", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def post(self, body: bytes) -> requests.Response:
        return requests.post(self.pool_url, data=body, timeout=TIMEOUT,
                             headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})

    def end(self) -> None:
        self.gate.touch()
        wait_until(lambda: self.statuses() == ["SUCCEEDED"], TIMEOUT, "the trial to end")
        done = run_cli(self.home, "experiment", "stop", self.id)
        assert done.returncode in (0, 2), done.stderr  # 2: its control plane had ended by itself
        from trialkit.control.background import manager_runs

        wait_until(lambda: not manager_runs(self.home / "experiments" / self.id), TIMEOUT, "its control plane to end")


@pytest.fixture(scope="module")
def running(tmp_path_factory) -> Iterator[Running]:
    site = Running(tmp_path_factory.mktemp("adversarial"))
    try:
        yield site
    finally:
        site.end()


@pytest.mark.parametrize("command", ["job", "experiment"])
@pytest.mark.parametrize("priority", [2 ** 70, -(2 ** 70)])
def test_a_priority_past_64_bits_is_one_line_and_changes_nothing(running, command, priority):
    refused(run_cli(running.home, command, "update", running.id, "--priority", priority), "priority", "too")
    assert [job["priority"] for job in running.jobs()] == [42]


@pytest.mark.parametrize("option", ["--ahead-of", "--behind-of"])
def test_a_job_name_that_is_not_utf8_is_one_line(running, option):
    refused(run_cli(running.home, "job", "update", running.id, option, b"\xff"), option.strip("-"))
    refused(run_cli(running.home, "job", "update-batch", running.id.encode() + b"." + option.strip("-").encode()
                    + b"=\xff"), option.strip("-"))
    assert [job["priority"] for job in running.jobs()] == [42]


@pytest.mark.parametrize("update", ['{"job": "\\ud800", "top": true}', '{"job": "ID", "ahead_of": "a\\ud800"}',
                                    '{"job": "ID", "behind_of": "\\udfff"}'])
def test_the_page_answers_a_lone_surrogate_400(running, update):
    answer = running.post(f'{{"updates": [{update.replace("ID", running.id)}]}}'.encode())
    assert answer.status_code == 400, answer.text
    assert "UTF-8" in answer.json()["error"], answer.text
    assert [job["priority"] for job in running.jobs()] == [42]


# -- a home whose pools.yml or pools.db is not what it should be (no experiment needed) ----------------------


def test_pools_yml_that_is_a_directory_or_not_utf8_is_one_line(tmp_path):
    (tmp_path / "pools.yml").mkdir()
    refused(run_cli(tmp_path, "job", "list", "--pool"), "pools.yml", "is not a regular file")
    (tmp_path / "pools.yml").rmdir()
    (tmp_path / "pools.yml").write_bytes(b"\xff\xfepools: {}\n")
    refused(run_cli(tmp_path, "job", "list", "--pool"), "pools.yml", "'utf-8' codec can't decode")


def test_a_damaged_pools_db_is_named_by_job_list_update_and_run(tmp_path):
    (tmp_path / "pools.db").write_bytes(b"not a database, some other file\n" * 200)
    refused(run_cli(tmp_path, "job", "list", "--pool"), "pools.db", "not a database", "move it aside")
    config = experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]}}, "import trialkit\n",
                        maxTrialNumber=1)
    refused(run_cli(tmp_path, "run", config), "pools.db", "not a database")
    assert not list((tmp_path / "experiments").glob("*/*.db"))  # no experiment left behind


def test_update_names_a_damaged_pools_db(tmp_path, monkeypatch):
    from trialkit.errors import UserError
    from trialkit.platforms import pools

    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path))
    (tmp_path / "pools.db").write_bytes(b"\x00" * 4096)
    with pytest.raises(UserError, match="pools.db.*not a database"):
        pools.update([("abcd1234", "priority", 1)])


def test_an_update_to_a_done_experiments_job_is_refused(tmp_path):
    config = experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]}},
                        "import trialkit\ntrialkit.get_next_parameter()\ntrialkit.report_final_result(1.0)\n",
                        trialConcurrency=1, maxTrialNumber=1)
    done = run_cli(tmp_path, "run", config)
    assert done.returncode == 0, done.stderr
    ended = done.stdout.decode().split()[2]  # "started experiment ID"
    for args in (("job", "update", ended, "--priority", 1), ("experiment", "update", ended, "--priority", 1),
                 ("job", "update-batch", f"{ended}.priority=1")):
        refused(run_cli(tmp_path, *args), f"experiment {ended} is DONE")


@pytest.mark.parametrize("weight", [1e-7, 5e-324])
def test_a_tiny_weight_is_listed_as_it_is_not_as_zero(tmp_path, monkeypatch, weight):
    from trialkit.platforms import pools

    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path))
    (tmp_path / "pools.yml").write_text("pools:\n  default: {slots: 2, scheduler: fair_share}\n")
    pool = pools.open_pool()
    try:
        pool.join("abcd1234")  # this process is its control plane: a live job
        pools.update([pools.parse_change(f"abcd1234.weight={weight!r}")])  # update-batch's path
        (job,) = pools.jobs()
        assert job["weight"] == weight > 0, job
    finally:
        pool.close()


def test_job_list_of_an_empty_pool_name_is_refused_not_every_experiments_trials(tmp_path):
    refused(run_cli(tmp_path, "job", "list", "--pool", ""), "no resource pool ''")
    assert run_cli(tmp_path, "job", "list", "--pool").returncode == 0  # the default pool, as before


def test_the_page_answers_a_damaged_pools_db_400(running):
    names = ("pools.db", "pools.db-wal", "pools.db-shm")  # its WAL would give the garbage below a valid first page
    for name in names:  # the control plane keeps its open lease table (its fds) meanwhile
        os.rename(running.home / name, running.home / f"{name}.saved")
    try:
        (running.home / "pools.db").write_bytes(b"not a database\n" * 300)
        for answer in (requests.get(running.pool_url, timeout=TIMEOUT,
                                    headers={"Authorization": f"Bearer {running.token}"}),
                       running.post(f'{{"updates": [{{"job": "{running.id}", "priority": 3}}]}}'.encode())):
            assert answer.status_code == 400, answer.text
            assert "pools.db" in answer.json()["error"] and "not a database" in answer.json()["error"], answer.text
    finally:
        for name in names:
            os.replace(running.home / f"{name}.saved", running.home / name)
    assert [job["priority"] for job in running.jobs()] == [42]


def test_ahead_of_back_and_forth_moves_or_says_it_cannot(tmp_path, monkeypatch):
    """Each --ahead-of halves the time between the mover and the job before the other: after ~20 moves no float
    lies between, and a move that would tie the two says so instead of 'updated' with the order unchanged."""
    from trialkit.errors import UserError
    from trialkit.platforms import pools

    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path))
    pool = pools.open_pool()
    try:
        # Submitted as three experiments were in a run here (where the 17th move tied y and z, z behind)
        for job, submitted in (("xxxxxxxx", 1795731507.651952), ("yyyyyyyy", 1795731507.6657107),
                               ("zzzzzzzz", 1795731507.6782053)):
            pool.join(job)  # this process is their control plane: live jobs
            with closing(sqlite3.connect(tmp_path / pools.DB_NAME)) as db, db:
                db.execute("UPDATE jobs SET submitted = ? WHERE experiment = ?", (submitted, job))
        refusals = 0
        for move in range(80):
            mover, other = ("zzzzzzzz", "yyyyyyyy") if move % 2 == 0 else ("yyyyyyyy", "zzzzzzzz")
            try:
                pools.update([(mover, "ahead_of", other)])
            except UserError as err:
                assert "priority of its own" in str(err), err
                refusals += 1
                continue
            order = [job["id"] for job in pools.jobs()]
            assert order.index(mover) < order.index(other), (move, order)
        assert refusals > 0  # the floats did run out
    finally:
        pool.close()


@pytest.mark.parametrize("cluster", ["k: {kubernetes: {namespace: ns, slots: 4}}", "r: {ray: {address: 'ray://x:1', slots: 4}}"])
def test_a_local_job_is_not_moved_into_a_clusters_pool(tmp_path, monkeypatch, cluster):
    from trialkit.errors import UserError
    from trialkit.platforms import pools

    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path))
    (tmp_path / "pools.yml").write_text(f"pools:\n  default: {{slots: 2}}\n  {cluster}\n")
    pool = pools.open_pool()
    try:
        pool.join("abcd1234")
        with pytest.raises(UserError, match="name a pool of this machine's slots"):
            pools.update([pools.parse_change(f"abcd1234.resource-pool={cluster[0]}")])
        assert pools.pool_of("abcd1234") == "default"
    finally:
        pool.close()


def test_experiment_update_of_an_interrupted_experiment_changes_neither_its_job_nor_its_config(tmp_path):
    import psutil

    site = Running(tmp_path)
    info = json.loads((site.home / "experiments" / site.id / "manager.json").read_text())
    manager = psutil.Process(info["pid"])
    manager.kill()  # SIGKILL: its trial's keeper outlives it, its job stays in the pool
    manager.wait(TIMEOUT)
    try:
        refused(run_cli(site.home, "experiment", "update", site.id, "--priority", 5, "--trial-concurrency", 2),
                "not running")
        with closing(sqlite3.connect(site.home / "pools.db")) as db:
            assert db.execute("SELECT priority FROM jobs").fetchall() == [(42,)]
    finally:
        site.gate.touch()  # the orphaned keeper's trial ends
        wait_until(lambda: not live_holders(site.home), TIMEOUT, "the orphaned keeper to end")


def live_holders(home: Path) -> List[int]:
    """The pids of the live processes that hold leases of the home's pools (a trial's keeper, its control plane)."""
    from trialkit.platforms.pools import Holder

    with closing(sqlite3.connect(home / "pools.db")) as db:
        rows = db.execute("SELECT pid, ticks FROM leases").fetchall()
    return [pid for pid, ticks in rows if Holder(pid, ticks).alive()]


def test_a_pools_events_that_is_a_file_is_named_not_pools_db(tmp_path):
    (tmp_path / "pools.events").write_text("some file\n")
    config = experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]}}, "import trialkit\n",
                        maxTrialNumber=1)
    err = refused(run_cli(tmp_path, "run", config), "pools.events", "not a directory", "move it aside")
    assert "pools.db" not in err, err


def test_experiment_update_checks_its_config_changes_before_its_job_changes(running):
    """The manager would refuse maxTrialNumber -1 after the job's priority had changed: both are checked first."""
    err = refused(run_cli(running.home, "experiment", "update", running.id, "--priority", 5,
                          "--max-trial-number", -1), "maxTrialNumber")
    assert [job["priority"] for job in running.jobs()] == [42], err
    done = run_cli(running.home, "experiment", "update", running.id, "--priority", 42, "--max-trial-number", 1)
    assert done.returncode == 0, done.stderr  # the same check takes an update its manager takes


def test_job_list_shows_a_trial_waiting_for_the_pools_slots_as_queued(running, tmp_path):
    """Another experiment's trial, held back while `running` holds the pool's only slot: QUEUED with 0 slots
    acquired (Determined's states: SCHEDULED holds its slots), as `trial list` says WAITING."""
    config = experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]}}, "import trialkit\n",
                        trialConcurrency=1, maxTrialNumber=1)
    done = run_cli(running.home, "run", config, "--detach")
    assert done.returncode == 0, done.stderr
    other = done.stdout.decode().splitlines()[0].split()[-1]
    try:
        def rows() -> List[Dict[str, object]]:
            listed = run_cli(running.home, "job", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            return [row for row in json.loads(listed.stdout) if row["experiment"] == other]

        wait_until(lambda: rows(), TIMEOUT, "its trial to be listed")
        trial = rows()[0]["id"]
        wait_until(lambda: b"WAITING: " in run_cli(running.home, "trial", "show", trial).stdout, TIMEOUT,
                   "its trial to wait for the slot, saying why")  # held by the pool, not just being started
        (row,) = rows()
        assert (row["status"], row["slots_acquired"], row["slots_needed"]) == ("QUEUED", 0, 1), row
    finally:
        stopped = run_cli(running.home, "experiment", "stop", other)
        assert stopped.returncode == 0, stopped.stderr


# -- pools.yml as the one YAML reader reads it (schema.read_data_file) ------------------------------------------


def _config(tmp_path: Path) -> Path:
    return experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]}}, "import trialkit\n", maxTrialNumber=1)


def test_slots_longer_than_python_reads_is_one_line_from_run_and_job_list(tmp_path):
    (tmp_path / "pools.yml").write_text("pools:\n  default: {slots: " + "9" * 5000 + "}\n")
    for done in (run_cli(tmp_path, "job", "list", "--pool"), run_cli(tmp_path, "run", _config(tmp_path))):
        refused(done, "pools.yml", "line 2", "5,000 digits")
    assert not (tmp_path / "experiments").exists() or not list((tmp_path / "experiments").iterdir())


@pytest.mark.parametrize("text, line, key", [
    ("pools:\n  gpu: {slots: 1}\n  cpu: {slots: 2}\n  gpu: {slots: 3}\n", 4, "gpu"),  # a pool twice
    ("pools:\n  default:\n    slots: 1\n    scheduler: fair_share\n    slots: 4\n", 5, "slots"),  # a key twice
    ("pools: {default: {slots: 1}}\npools: {}\n", 2, "pools"),
])
def test_a_pool_or_key_given_twice_is_refused_naming_the_line_of_the_second(tmp_path, text, line, key):
    (tmp_path / "pools.yml").write_text(text)
    for done in (run_cli(tmp_path, "job", "list", "--pool"), run_cli(tmp_path, "run", _config(tmp_path))):
        refused(done, "pools.yml", f"at line {line}", f"the key '{key}' is given twice")


@pytest.mark.parametrize("text, said", [
    ("pool:\n  default: {slots: 1}\n", "pools.yml: unknown key 'pool' (did you mean 'pools'?)"),  # not pools.yml.pool
    ("- default\n", "pools.yml: expected a mapping of keys to values, got ['default']"),
    ("pools:\n  default: {slots: 1\n", "pools.yml: cannot parse it at line 3, column 1: "),
])
def test_pools_yml_is_named_once_then_what_is_wrong_in_it(tmp_path, text, said):
    (tmp_path / "pools.yml").write_text(text)
    err = refused(run_cli(tmp_path, "job", "list", "--pool"), said)
    assert err.count("pools.yml") == 1, err


# -- pools.db faults said as pools.db's, a lock held past the wait waited out ---------------------------------


def test_a_dropped_jobs_table_is_a_pools_db_fault_for_every_reader(tmp_path, monkeypatch):
    from trialkit.errors import UserError
    from trialkit.platforms import pools

    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path))
    pool = pools.open_pool()
    pool.join("abcd1234")
    with closing(sqlite3.connect(tmp_path / "pools.db")) as db:
        db.execute("DROP TABLE jobs")
        db.commit()
    with pytest.raises(UserError, match="pools.db.*no such table: jobs"):  # job update, experiment update
        pools.update([("abcd1234", "priority", 1)])
    with pytest.raises(UserError, match="pools.db.*no such table: jobs"):  # a running control plane's grant
        pool.grant("abcd1234-00000", "abcd1234", 1)
    pool.close()
    refused(run_cli(tmp_path, "job", "list", "--pool"), "pools.db", "no such table: jobs")


def test_a_lock_held_past_the_wait_is_waited_out_and_said_in_one_line(tmp_path, monkeypatch, capsys):
    """Another process's transaction on pools.db outlasts BUSY_SECONDS while a control plane releases a lease
    (a trial ended) and grants one: both wait for it, saying so once, and then do their work."""
    import threading

    from trialkit.platforms import pools

    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path))
    monkeypatch.setattr(pools, "BUSY_SECONDS", 0.3)
    (tmp_path / "pools.yml").write_text("pools:\n  default: {slots: 1}\n")
    pool = pools.open_pool()
    pool.join("abcd1234")
    assert pool.take("abcd1234-00000", "abcd1234", 1)
    other = sqlite3.connect(tmp_path / "pools.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")
    unlock = threading.Timer(1.5, other.execute, ("ROLLBACK",))
    unlock.start()
    try:
        pool.release("abcd1234-00000")  # under the lock: waited out
        assert pool.take("abcd1234-00001", "abcd1234", 1)  # the slot it freed
    finally:
        unlock.join()
        other.close()
        pool.close()
    err = capsys.readouterr().err
    assert err.count("pools.db is held locked by another process") == 1 and len(err.splitlines()) == 1, err
