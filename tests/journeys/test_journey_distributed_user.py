"""The distributed user's day: two torch workers in a trial, one killed, and what they see of it.

Their trial command is `python -m trialkit.launch.torch_distributed` with two
workers (gloo on the CPU) running a script that all-reduces every step and
prints its pid. With the experiment running, they find rank 1's pid in
`trialkit trial logs --rank 1` and `kill -9` it, as an out-of-memory killer
would. They expect the launcher to stop the other worker, the trial to fail
saying which rank died, nothing to be left running, and each rank's lines
apart in `trial logs --rank N`.
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import time

import psutil
import pytest

from harness import wait_until
from journey import Day, WAIT, User, experiment_id

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (an extra)")

TRAIN = """
import os, time
import torch
import torch.distributed as dist
import trialkit

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"worker {rank} of {dist.get_world_size()} is pid {os.getpid()}", flush=True)
for step in range(1, 3000):
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    if rank == 0:
        trialkit.report_intermediate_result(total.item() * step)
    time.sleep(0.1)
"""

CONFIG = """
searchSpace:
  lr: {_type: choice, _value: [0.1]}
trialCommand: python3 -m trialkit.launch.torch_distributed --nproc_per_node 2 -- train.py
trialConcurrency: 1
maxTrialNumber: 1
tuner:
  name: Random
trainingService:
  platform: local
"""


def pid_in_log(user: User, trial: str, rank: int) -> int:
    """The pid a worker printed, read from `trial logs --rank N` once it shows."""
    found = []

    def printed() -> bool:
        found[:] = re.findall(r"is pid (\d+)", user.logs(trial, "--rank", str(rank), started=False))
        return bool(found)
    wait_until(printed, WAIT, f"rank {rank} to print its pid", every=0.5)
    return int(found[0])


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    user = User(tmp_path_factory.mktemp("distributed-user"))
    today = Day()
    today.user = user
    user.write("train.py", TRAIN)
    user.write("config.yml", CONFIG)
    with user.acting():
        run = user.start("run", "config.yml")
        try:
            today.experiment = experiment_id(run)
            today.trial = f"{today.experiment}-00000"
            today.pids = {rank: pid_in_log(user, today.trial, rank) for rank in (0, 1)}
            os.kill(today.pids[1], signal.SIGKILL)  # kill -9
            killed = time.monotonic()
            today.code = run.finish()
            today.took = time.monotonic() - killed
        finally:
            run.finish()
        today.run = run
        today.alive = [pid for pid in today.pids.values() if psutil.pid_exists(pid)]
        today.row = user.trial_list(today.experiment)[today.trial]
        today.show = user.trialkit("trial", "show", today.trial)
        today.rank_logs = {rank: user.logs(today.trial, "--rank", str(rank)) for rank in (0, 1)}
    yield today
    user.stop_leftovers()


def test_each_rank_has_its_own_log(day):
    for rank, other in ((0, 1), (1, 0)):
        lines = day.rank_logs[rank].splitlines()
        assert f"[rank={rank}] worker {rank} of 2 is pid {day.pids[rank]}" in lines, day.rank_logs[rank]
        assert not any(line.startswith(f"[rank={other}]") for line in lines), day.rank_logs[rank]


def test_the_killed_worker_fails_the_trial_saying_which_rank_died(day):
    assert day.row["status"] == "FAILED" and "rank 1" in day.row["why"], day.row
    assert day.show.returncode == 0, day.show.stderr
    assert "rank 1 failed with signal SIGKILL" in day.show.stdout and "stopped the other workers" in day.show.stdout


def test_the_launcher_stops_the_other_worker_and_the_run_ends(day):
    assert day.alive == []
    assert day.took < 25  # within the keeper's default grace: the survivor was stopped, not waited for
    assert day.code == 1, day.run.text  # the experiment ended without a successful trial


def test_nothing_the_day_started_is_left_running(day):
    assert day.user.left_running() == []
