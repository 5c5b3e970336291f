"""The machine's cores shared among the local trials that run at once (OMP_NUM_THREADS, platforms/local.py).

Each trial reports the OMP_NUM_THREADS it was started with (0: none). Two trials at once on this machine
get half its cores each; a trial alone, or one that a pool of one slot runs alone, is left the whole
machine (no variable); a value the user's environment sets is theirs.
"""
from __future__ import annotations

import os

from experiment_util import cli, experiment, experiment_id, export
from pools_util import home, pool_of  # noqa: F401 (home: a fixture)

SPACE = {"x": {"_type": "choice", "_value": [1, 2]}}
TRIAL = """
import os, trialkit
trialkit.get_next_parameter()
trialkit.report_final_result(int(os.environ.get("OMP_NUM_THREADS", "0")))
"""
CORES = len(os.sched_getaffinity(0))


def threads_seen(tmp_path, concurrency: int, env=None) -> list:
    config = experiment(tmp_path, SPACE, TRIAL, trialConcurrency=concurrency, maxTrialNumber=2,
                        tuner={"name": "GridSearch"})
    done = cli("run", config, env=env)
    assert done.returncode == 0, done.stderr
    rows = export(experiment_id(done.stdout.splitlines()[0]))
    return sorted(row["final"] for row in rows)


def without_threads() -> dict:
    return {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}


def test_two_trials_at_once_share_the_cores(tmp_path, home):
    half = max(1, CORES // 2)
    assert threads_seen(tmp_path, 2, without_threads()) == [half, half]


def test_a_trial_alone_has_the_whole_machine(tmp_path, home):
    assert threads_seen(tmp_path, 1, without_threads()) == [0, 0]


def test_a_pool_that_runs_one_trial_at_once_leaves_it_the_whole_machine(tmp_path, home):
    pool_of(home, 1)
    assert threads_seen(tmp_path, 2, without_threads()) == [0, 0]


def test_the_users_own_setting_is_kept(tmp_path, home):
    assert threads_seen(tmp_path, 2, dict(without_threads(), OMP_NUM_THREADS="3")) == [3, 3]


def test_the_cores_are_divided_by_the_trials_at_once_and_each_trials_workers():
    from trialkit.platforms.local import trial_threads

    assert trial_threads(16, 2, 1) == 8
    assert trial_threads(16, 2, 2) == 4  # slotsPerTrial 2: a launcher's two workers share the trial's 8
    assert trial_threads(16, 3, 1) == 5  # what is left over stays free
    assert trial_threads(2, 4, 1) == 1  # never none
    assert trial_threads(16, 1, 4) is None  # alone: the whole machine, as before (torchrun sets 1 a rank itself)
