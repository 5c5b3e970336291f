"""Kubernetes trials end to end: `trialkit run` against the stand-in API server, pods run by tests/pod_runner.py.

The control plane renders and submits each trial's objects; the pod runner
plays the operator and the kubelet, so every replica is a real container of
the trial image (images/build.sh) with its keeper as PID 1, reporting to the
real manager on loopback. Each test ends with the trial SUCCEEDED, its
metrics stored once, its logs readable by `trialkit trial logs`, and nothing
left running (the `containers` fixture).
"""
from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import textwrap
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from containers_util import ended, needs_podman, running
from experiment_util import (
    RESUMABLE, cli, experiment_id, reported, runs_as_stored, start_cli, stored, trial_status,
)
from harness import wait_until
from k8s_fake_api import FakeApiServer
from pod_runner import PodRunner, host_address

pytestmark = [pytest.mark.containers, needs_podman]

CODE = "/code"  # where the runner mounts the test's code in every pod
TIMEOUT = 60

# torch.distributed over gloo, one process per pod (RANK and WORLD_SIZE from the operator,
# through the launcher and torchrun): the ranks all-reduce, rank 0 reports the sum.
DISTRIBUTED = """
import os, torch, torch.distributed as dist, trialkit
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"rank {rank} of {world}: sum {total.item()}", flush=True)
if rank == 0:
    trialkit.report_intermediate_result(total.item())
    trialkit.report_final_result(total.item())
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """The stand-in API server, KUBECONFIG at it, a TRIALKIT_HOME of the test's own."""
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    with FakeApiServer() as api:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path)))
        yield api


def experiment_config(tmp_path: Path, script: str, section: dict, **keys) -> tuple:
    """(config path, code dir): one trial of x=3 running `script` from the code dir."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(script))
    config = {"searchSpace": {"x": {"_type": "choice", "_value": [3]}}, "trialConcurrency": 1, "maxTrialNumber": 1,
              "tuner": {"name": "GridSearch"}, "trialCommand": f"python3 {CODE}/train.py",
              "trainingService": {"namespace": "default", "managerAddress": host_address(), "dockerImage": "trainer:1",
                                  "workingDir": CODE, **section}, **keys}
    folder = tmp_path / "project"
    folder.mkdir()
    path = folder / "config.yml"
    path.write_text(yaml.safe_dump(config))
    return path, code


def run_to_the_end(config: Path, runner: PodRunner) -> str:
    """`trialkit run` until the experiment is done; its id."""
    proc = start_cli("run", config)
    out, err = ended(proc, runner, TIMEOUT)
    assert proc.returncode == 0 and out, out + err + runner.describe()
    return experiment_id(out.splitlines()[0])


def finish_run(proc: subprocess.Popen, runner: PodRunner) -> None:
    """Wait for a background `trialkit run` to end well; what went wrong, with the pods' side, if not."""
    out, err = ended(proc, runner, TIMEOUT)
    assert proc.returncode == 0, out + err + runner.describe()


def metric_values(home: Path, trial: str) -> list:
    """The trial's final results as stored: one, if each was stored once."""
    rows = stored(home, trial.rpartition("-")[0], "SELECT value FROM records WHERE trial=? AND type=?", trial, "FINAL")
    return [json.loads(value) for (value,) in rows]


def logs(trial: str, rank: int) -> str:
    done = cli("trial", "logs", trial, "--rank", rank)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_pytorchjob_master_and_worker_over_gloo(cluster, containers, torch_image, tmp_path):
    section = {"platform": "kubeflow", "master": {"replicas": 1}, "worker": {"replicas": 1}}
    config, code = experiment_config(tmp_path, DISTRIBUTED, section,
                                     trialCommand=f"python3 -m trialkit.launch.torch_distributed {CODE}/train.py")
    with PodRunner(cluster, containers, torch_image, tmp_path / "kubelet", mounts={CODE: code}) as runner:
        exp = run_to_the_end(config, runner)
        trial = f"{exp}-00000"
        home = tmp_path / "home"
        assert trial_status(home, trial) == "SUCCEEDED"
        assert metric_values(home, trial) == [3.0]
        assert sorted(name.rsplit("-", 2)[-2] for name in runner.pods) == ["master", "worker"]
        # The trial ends with its master; the worker's keeper may still be flushing.
        runner.wait_for(lambda pods: all(pod.done.is_set() for pod in pods.values()), TIMEOUT, "every pod to end")
        assert all(pod.exit_code == 0 for pod in runner.pods.values())
        assert "rank 0 of 2: sum 3.0" in logs(trial, 0)
        worker = next(name for name in runner.pods if name.endswith("-worker-0"))
        assert "rank 1 of 2: sum 3.0" in runner.logs(worker)


# Two task roles: each says who it is; the worker (the reporting role) reports x.
TWO_ROLES = """
import os, trialkit
role = os.environ["FC_TASKROLE_NAME"]
print(f"task {role}-{os.environ['FC_TASK_INDEX']} runs", flush=True)
x = trialkit.get_next_parameter()["x"]
if role == "worker":
    trialkit.report_final_result(x)
"""


def test_frameworkcontroller_with_two_task_roles(cluster, containers, image, tmp_path):
    section = {"platform": "frameworkcontroller",
               "taskRoles": [{"name": "ps", "taskNumber": 1}, {"name": "worker", "taskNumber": 1}]}
    config, code = experiment_config(tmp_path, TWO_ROLES, section)
    with PodRunner(cluster, containers, image, tmp_path / "kubelet", mounts={CODE: code}) as runner:
        exp = run_to_the_end(config, runner)
        trial, home = f"{exp}-00000", tmp_path / "home"
        assert trial_status(home, trial) == "SUCCEEDED"
        assert metric_values(home, trial) == [3]
        assert sorted(name.rsplit("-", 2)[-2] for name in runner.pods) == ["ps", "worker"]
        shipped = cli("trial", "logs", trial)
        assert shipped.returncode == 0 and "task worker-0 runs" in shipped.stdout, shipped.stdout + shipped.stderr
        ps = next(name for name in runner.pods if "-ps-" in name)
        assert "task ps-0 runs" in runner.logs(ps)  # not shipped: only the reporting task's keeper ships today


def progress(home: Path, trial: str) -> int:
    """The trial's intermediate results stored so far (0 before its store exists)."""
    try:
        return reported(home, trial)
    except sqlite3.OperationalError:
        return 0


@contextlib.contextmanager
def held_at_step_ten(cluster, containers, image, tmp_path: Path, section: dict) -> Iterator[tuple]:
    """(runner, the run's process, the trial) of a RESUMABLE trial under `section` whose first run holds
    at step 10; the run killed, if it still runs, before the runner goes."""
    config, code = experiment_config(tmp_path, RESUMABLE, section)
    with PodRunner(cluster, containers, image, tmp_path / "kubelet", mounts={CODE: code}) as runner:
        with running(config) as (proc, exp):
            trial = f"{exp}-00000"
            # Its second result is step 10, where a first run holds: the stop lands there, not on the way to it.
            wait_until(lambda: progress(tmp_path / "home", trial) >= 2, TIMEOUT, "the trial to hold at step 10")
            yield runner, proc, trial


def test_adaptdljob_rescaled_resumes_from_its_checkpoint(cluster, containers, image, tmp_path):
    section = {"platform": "adaptdl", "adaptive": True,
               "checkpoint": {"storageClass": "local", "storageSize": "1Gi"}}
    home = tmp_path / "home"
    with held_at_step_ten(cluster, containers, image, tmp_path, section) as (runner, proc, trial):
        first = next(iter(runner.pods))
        runner.delete_pod(first)  # AdaptDL's rescale: the pod goes, the job restarts from the checkpoint
        runner.wait_for(lambda pods: len(pods) == 2 and pods[first].done.is_set(), TIMEOUT, "a new group")
        finish_run(proc, runner)
        assert runner.pods[first].exit_code == 143 and "checkpoint at step" in runner.logs(first)
        again = next(name for name in runner.pods if name != first)
        assert "restart 1 from step 10" in runner.logs(again), runner.logs(again)
        assert trial_status(home, trial) == "SUCCEEDED" and metric_values(home, trial) == [3]
        assert "checkpoint at step" in cli("trial", "logs", trial).stdout


def test_pause_then_activate_keeps_progress(cluster, containers, image, tmp_path):
    section = {"platform": "kubeflow", "master": {"replicas": 1},
               "checkpoint": {"storageClass": "local", "storageSize": "1Gi"}}
    home = tmp_path / "home"
    with held_at_step_ten(cluster, containers, image, tmp_path, section) as (runner, proc, trial):
        paused = cli("trial", "pause", trial)
        assert paused.returncode == 0, paused.stderr
        runner.wait_for(lambda pods: runner.history[0].done.is_set(), TIMEOUT, "the paused pod to end")
        # The control plane learns of the end at its next look at the job: until then the trial is running.
        wait_until(lambda: cli("trial", "activate", trial).returncode == 0, TIMEOUT, "the trial to activate",
                   every=0.5)
        finish_run(proc, runner)
        first, again = runner.history
        assert first.exit_code == 143 and first.name == again.name, runner.describe()
        # The store's restart count, risen at the activate (AdaptDL's library refuses to checkpoint twice
        # under one count): the first run was 0.
        assert "restart 0 from step 0" in runner.logs(first), runner.logs(first)
        assert "restart 1 from step 10" in runner.logs(again), runner.logs(again)
        assert trial_status(home, trial) == "SUCCEEDED" and metric_values(home, trial) == [3]
        # The new pod's keeper numbered a fresh spool from 1: the first run's records are kept too, each once.
        statuses, runs = runs_as_stored(home, trial)
        assert statuses == [(0, "RUNNING"), (0, "PREEMPTED"), (1, "RUNNING"), (1, "SUCCEEDED")], statuses
        assert runs == [(0, "PREEMPTED", [5, 10], None), (1, "SUCCEEDED", [15, 20, 25, 30], 3)], runs


HOLD = """
import time, trialkit
trialkit.report_intermediate_result(1)
time.sleep(600)
"""


def test_a_sigkilled_keeper_still_ends_the_trial_in_the_store(cluster, containers, image, tmp_path):
    # The keeper records nothing when SIGKILLed (the runtime's stop timeout ran out, the OOM killer):
    # the platform learns the end from the pod (exit 137) and the job, and the store gets it with the reason.
    config, code = experiment_config(tmp_path, HOLD, {"platform": "kubeflow", "master": {"replicas": 1}})
    home = tmp_path / "home"
    with PodRunner(cluster, containers, image, tmp_path / "kubelet", mounts={CODE: code}) as runner:
        with running(config) as (proc, exp):
            trial = f"{exp}-00000"
            wait_until(lambda: progress(home, trial) >= 1, TIMEOUT, "the trial to run")
            runner.kill(next(iter(runner.pods)))
            proc.communicate(timeout=TIMEOUT)
        [(status, code_, reason)] = stored(home, exp, "SELECT status, exit_code, reason FROM trials WHERE id=?", trial)
        assert (status, code_) == ("FAILED", 137) and "Master replica(s) failed" in reason, (status, code_, reason)
