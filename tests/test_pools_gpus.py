"""GPUs by index across experiments: the home's resource pool leases GPU indices (platforms/pools.py).

This machine has no GPU: a stand-in `nvidia-smi` on PATH (gpu_util) answers trialkit's queries. The
experiments are real (`trialkit run`, keepers, trials); each trial logs the CUDA_VISIBLE_DEVICES it was
given and when it ran, and the checks are made from those lines. The pool's own tests use real SQLite
files and real holder processes.
"""
from __future__ import annotations

import signal
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import pytest

from experiment_util import TIMEOUT, cli, experiment, experiment_id, start_cli, stored
from gpu_util import fake_gpus, most_at_once, overlapping, runs, trial_script
from harness import wait_until
from pools_util import config_refusal, home, pools_yml, start_holder  # noqa: F401 (home: a fixture)
from trialkit.platforms import pools

SPACE = {"x": {"_type": "uniform", "_value": [0, 1]}}


def gpu_experiment(tmp_path: Path, name: str, log: Path, gate: Path, **local) -> Path:
    """Two 1-GPU trials at once, each logging its devices and waiting for the gate file."""
    return experiment(tmp_path, SPACE, trial_script(log, 1, gate), name=name, maxTrialNumber=2, trialConcurrency=2,
                      trialGpuNumber=1, trainingService={"platform": "local", **local})


def finish(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            proc.wait(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == 0, err


def waiting_reasons(home: Path, exp: str) -> list:
    return [reason for reason, in stored(home, exp, "SELECT reason FROM trials WHERE status = 'WAITING'")]


# -- two experiments, one machine's GPUs -----------------------------------------------------------


def test_two_experiments_on_a_two_gpu_pool_never_share_a_gpu(tmp_path, monkeypatch, home):
    fake_gpus(tmp_path, monkeypatch, 4)
    # Slots to spare: only the GPU leases keep b's trials off the GPUs a's trials hold.
    pools_yml(home, "  default: {slots: 4, gpus: [1, 2]}\n")
    log, gate = tmp_path / "runs.log", tmp_path / "go"
    first = start_cli("run", gpu_experiment(tmp_path, "a", log, gate))
    try:
        a = experiment_id(first.stdout.readline())
        wait_until(lambda: len(runs_started(log)) == 2, TIMEOUT, "a's two trials to start")
        second = start_cli("run", gpu_experiment(tmp_path, "b", log, gate))
        try:
            b = experiment_id(second.stdout.readline())
            wait_until(lambda: waiting_reasons(home, b) == WAITS or len(runs_started(log)) > 2, TIMEOUT,
                       "b's two trials to wait for a GPU (or start)")
            assert len(runs_started(log)) == 2, runs_started(log)
            assert waiting_reasons(home, b) == WAITS
        finally:
            gate.touch()
            finish(second)
    finally:
        gate.touch()
        finish(first)
    done = runs(log)
    assert len(done) == 4 and {r["trial"][:len(a)] for r in done} == {a, b}
    assert {r["devices"] for r in done} == {"1", "2"}  # the pool's GPUs, no other
    assert all(a_run["devices"] != b_run["devices"] for a_run, b_run in overlapping(done)), done
    assert most_at_once(done, "1") == 1 and most_at_once(done, "2") == 1
    with closing(sqlite3.connect(str(home / "pools.db"))) as db:
        assert db.execute("SELECT COUNT(*) FROM leases").fetchone() == (0,)  # every GPU given back


WAITS = ["waiting for 1 GPU: GPU 1,2 leased to other trials of this home (0 of 2 free)"] * 2


def runs_started(log: Path) -> list:
    starts = Path(f"{log}.starts")
    return list(starts.iterdir()) if starts.exists() else []


def test_gpu_indices_outside_the_pool_or_a_pool_gpu_the_machine_lacks_is_one_line(tmp_path, monkeypatch, home):
    fake_gpus(tmp_path, monkeypatch, 2)
    log, gate = tmp_path / "runs.log", tmp_path / "go"
    pools_yml(home, "  default: {gpus: [0]}\n")
    done = cli("run", gpu_experiment(tmp_path, "a", log, gate, gpuIndices=[1]))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "gpuIndices names GPU 1, which resource pool 'default' does not hold (its gpus: 0)" in done.stderr
    pools_yml(home, "  default: {gpus: [0, 5]}\n")
    done = cli("run", gpu_experiment(tmp_path, "b", log, gate))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "pools.default.gpus: resource pool 'default' names GPU 5, which is not among this machine's" \
           in done.stderr


# -- the lease table ----------------------------------------------------------------------------------


def ask(*candidates: int, count: int = 1, share: float = 1.0) -> pools.GpuAsk:
    return pools.GpuAsk(count, share, tuple(candidates))


def test_a_gpu_is_shared_only_by_shares_that_fit_across_experiments_and_pools(home):
    pools_yml(home, "  default: {slots: 8, gpus: [0]}\n  other: {slots: 8}\n")
    one, other = pools.open_pool(), pools.open_pool("other")
    try:
        # maxTrialNumberPerGpu 2 in two experiments: a half each, both on GPU 0
        assert one.grant("a-1", "a", 0.5, ask(0, share=0.5)) == (0,)
        assert one.grant("b-1", "b", 0.5, ask(0, share=0.5)) == (0,)
        assert one.grant("c-1", "c", 0.5, ask(0, share=0.5)) is None  # the third half does not fit
        assert one.waiting_reason("c", 0.5, ask(0, share=0.5)) == \
            "waiting for 1 GPU: GPU 0 leased to other trials of this home (0 of 1 free)"
        one.release("a-1")
        assert one.grant("d-1", "d", 1, ask(0)) is None  # a whole GPU while b's half runs
        assert one.grant("c-1", "c", 0.5, ask(0, share=0.5)) == (0,)
        # Another pool of the home counts the same GPU (a GPU is the machine's), and picks the least held.
        assert other.grant("e-1", "e", 2, ask(0, 1, 2, count=2)) == (1, 2)
        assert other.grant("f-1", "f", 1, ask(0, 1, 2)) is None
        assert one.grant("g-1", "g", 1, ask(3)) is None  # free, but not the pool's GPU
        # Trials without GPUs take slots alone.
        assert one.grant("h-1", "h", 1) == ()
    finally:
        one.close()
        other.close()


HOLDER = """
from trialkit.platforms import pools
pool = pools.open_pool()
assert pool.grant("crashed-00000", "crashed", 1, pools.GpuAsk(1, 1.0, (0, 1))) == (0,)
print("taken", flush=True)
import time; time.sleep(600)
"""


def test_a_gpu_whose_holder_was_sigkilled_is_given_again(home):
    pools_yml(home, "  default: {gpus: [0, 1]}\n")
    holder = start_holder(HOLDER)
    pool = pools.open_pool()
    try:
        assert pool.grant("next-00000", "next", 1, ask(0)) is None  # GPU 0 is the live holder's
        assert pool.grant("next-00000", "next", 1, ask(0, 1)) == (1,)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    assert pool.grant("then-00000", "then", 1, ask(0, 1)) == (0,)  # the dead holder's GPU
    pool.close()


OLD_LEASES = """
CREATE TABLE leases (holder TEXT PRIMARY KEY, pool TEXT NOT NULL, experiment TEXT NOT NULL, slots REAL NOT NULL,
                     pid INTEGER NOT NULL, ticks INTEGER NOT NULL, granted REAL NOT NULL DEFAULT (julianday('now')));
"""


def test_a_pools_db_without_gpu_columns_is_brought_up_to_date(home):
    with closing(sqlite3.connect(str(home / "pools.db"))) as db:
        db.executescript(OLD_LEASES)
    pool = pools.open_pool()
    try:
        assert pool.grant("a-1", "a", 1, ask(3)) == (3,)
        assert pool.grant("b-1", "b", 1, ask(3)) is None
    finally:
        pool.close()


@pytest.mark.parametrize("section, what", [
    ("{gpus: 0}", "gpus: cannot read gpus 0 (list the pool's GPUs by nvidia-smi's index, like [0, 1], or write all)"),
    ("{gpus: []}", "cannot read gpus []"),
    ("{gpus: [0, 0]}", "GPU indices repeat: [0, 0]"),
    ("{gpus: [-1]}", "pools.default.gpus"),
])
def test_a_pool_s_gpus_with_a_mistake_is_one_user_error(home, section, what):
    assert what in config_refusal(home, f"  default: {section}\n")


def test_a_pool_of_gpus_has_a_slot_per_gpu_unless_told(home):
    pools_yml(home, "  default: {gpus: [0, 2]}\n  big: {slots: 3, gpus: all}\n")
    assert pools.read_config(home) == {"default": pools.PoolSpec(2, (0, 2)), "big": pools.PoolSpec(3, None)}
