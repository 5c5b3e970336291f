"""A trial across several pods, in every Kubernetes mode, and what the cluster says of a trial first.

`trialkit run` against the stand-in API server; tests/pod_runner.py plays each
operator, the kubelet and the pods' network (an address per pod, the names
cluster DNS gives them), so every pod is a container of the torch trial
image. Each pod runs `python -m trialkit.launch.torch_distributed` over gloo:
the launchers find their peers from what each operator gives (a
FrameworkController task's name under its role's headless Service, a
PyTorchJob's MASTER_ADDR, a TFJob's TF_CONFIG, AdaptDL's supervisor), all
ranks join one world, and rank 0 reports the sum of the ranks once.
"""
from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from containers_util import needs_podman, running
from experiment_util import cli, stored, trial_status
from harness import wait_until
from pod_runner import PodRunner
from test_containers_k8s import (CODE, DISTRIBUTED, TIMEOUT, cluster, experiment_config, logs,  # noqa: F401 (fixture)
                                 metric_values, progress, run_to_the_end)
from trialkit.web import queries

pytestmark = [pytest.mark.containers, needs_podman]

LAUNCH = f"python3 -m trialkit.launch.torch_distributed {CODE}/train.py"
MULTI_NODE = {
    # FrameworkController: one role of two tasks (seed 001's mode).
    "frameworkcontroller": ({"platform": "frameworkcontroller", "taskRoles": [{"name": "worker", "taskNumber": 2}]}, 2),
    # training-operator: a master and two workers.
    "pytorchjob": ({"platform": "kubeflow", "master": {"replicas": 1}, "worker": {"replicas": 2}}, 3),
    # training-operator's TFJob: two workers and a parameter server, the workers first.
    "tfjob": ({"platform": "kubeflow", "operator": "tf-operator", "worker": {"replicas": 2}, "ps": {"replicas": 1}}, 3),
    # AdaptDL: two replicas from the start (its scheduler's allocation).
    "adaptdljob": ({"platform": "adaptdl", "minReplicas": 2, "maxReplicas": 2}, 2),
}


@pytest.mark.parametrize("mode", list(MULTI_NODE))
def test_every_mode_trains_one_world_across_its_pods(mode, cluster, containers, torch_image, tmp_path):  # noqa: F811
    section, pods = MULTI_NODE[mode]
    config, code = experiment_config(tmp_path, DISTRIBUTED, section, trialCommand=LAUNCH)
    home = tmp_path / "home"
    with PodRunner(cluster, containers, torch_image, tmp_path / "kubelet", mounts={CODE: code}) as runner:
        exp = run_to_the_end(config, runner)
        trial = f"{exp}-00000"
        total = float(sum(range(1, pods + 1)))  # each rank adds rank + 1
        assert trial_status(home, trial) == "SUCCEEDED", runner.describe()
        assert metric_values(home, trial) == [total]  # one final result, from rank 0 only
        # The trial ends with its chief pod; the others' keepers may still be flushing.
        runner.wait_for(lambda made: all(pod.done.is_set() for pod in made.values()), TIMEOUT, "every pod to end")
        assert len(runner.pods) == pods and all(pod.exit_code == 0 for pod in runner.pods.values()), runner.describe()
        for rank in range(pods):  # every pod's output, shipped by its keeper, says it was in the whole world
            assert f"rank {rank} of {pods}: sum {total}" in logs(trial, rank), runner.describe()


# Every rank joins and reports it is in; then they hold until the test kills one.
HOLD_TOGETHER = """
import os, time, torch.distributed as dist, trialkit
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()} in", flush=True)
if dist.get_rank() == 0:
    trialkit.report_intermediate_result(1)
time.sleep(600)
"""


# Each operator's policy as trialkit renders it, for a pod SIGKILLed (exit 137) mid-training: the pod to kill,
# and what the trial's reason says. FrameworkController: one failed task fails the attempt, no retries
# (retryPolicy maxRetryCount 0). training-operator: restartPolicy Never, the job fails, cleanPodPolicy Running
# stops the rest. AdaptDL: a replica that exits other than 143 (its checkpoint) fails the job.
KILLED = {
    "frameworkcontroller": ("-worker-1", "exited 137"),
    "pytorchjob": ("-worker-1", "1 Worker replica(s) failed"),
    "adaptdljob": ("-0-1", "exited 137"),
}


@pytest.mark.parametrize("mode", list(KILLED))
def test_a_killed_pod_fails_the_trial_and_its_other_pods_stop(mode, cluster, containers, torch_image,  # noqa: F811
                                                              tmp_path):
    section, _ = MULTI_NODE[mode]
    suffix, says = KILLED[mode]
    config, code = experiment_config(tmp_path, HOLD_TOGETHER, section, trialCommand=LAUNCH)
    home = tmp_path / "home"
    with PodRunner(cluster, containers, torch_image, tmp_path / "kubelet", mounts={CODE: code}) as runner:
        with running(config) as (proc, exp):
            trial = f"{exp}-00000"
            wait_until(lambda: progress(home, trial) >= 1, TIMEOUT, "every pod to join the world")
            [killed] = [name for name in runner.pods if name.endswith(suffix)]
            runner.kill(killed)
            proc.communicate(timeout=TIMEOUT)
        [(status, code_, reason)] = stored(home, exp, "SELECT status, exit_code, reason FROM trials WHERE id=?", trial)
        assert (status, code_) == ("FAILED", 137) and says in reason, (status, code_, reason, runner.describe())
        runner.wait_for(lambda pods: all(pod.done.is_set() for pod in pods.values()), TIMEOUT, "the other pods to stop")


# Runs until the test lets it end, reporting nothing it could deliver.
UNTIL_RELEASED = f"""
import os, time
while not os.path.exists("{CODE}/release"):
    time.sleep(0.2)
"""
UNREACHABLE = "198.51.100.7"  # TEST-NET-2: no pod reaches a manager there (a seed's address copied verbatim)


def trial_row(home: Path, exp: str, trial: str) -> dict:
    """The trial as the page's trial view gets it."""
    with closing(sqlite3.connect(home / "experiments" / exp / "trialkit.db")) as db:
        db.row_factory = sqlite3.Row
        queries.register(db)
        return queries.trial(db, exp, trial)


def test_a_running_pod_whose_keeper_cannot_reach_the_manager_is_running_and_said_so(cluster, containers,  # noqa: F811
                                                                                   image, tmp_path):
    config, code = experiment_config(tmp_path, UNTIL_RELEASED, {"platform": "kubeflow", "master": {"replicas": 1},
                                                                "managerAddress": UNREACHABLE})
    home = tmp_path / "home"
    with PodRunner(cluster, containers, image, tmp_path / "kubelet", mounts={CODE: code}) as runner:
        with running(config) as (proc, exp):
            trial = f"{exp}-00000"
            runner.wait_for(lambda pods: any(p.phase == "Running" for p in pods.values()), TIMEOUT, "the pod to run")
            ran = time.monotonic()
            # The cluster says it runs: so does trialkit, though its keeper has not said a word.
            wait_until(lambda: trial_status(home, trial) == "RUNNING", 20, "the trial to be RUNNING", every=0.5)
            said = f"its keeper has not reached the manager at http://{UNREACHABLE}:"
            wait_until(lambda: said in (trial_row(home, exp, trial)["reason"] or ""), 60, "the silence to be said",
                       every=1)
            assert time.monotonic() - ran < 60
            shown = cli("trial", "show", trial).stdout
            assert f"status         RUNNING: {said}" in shown, shown
            (code / "release").write_text("")
            out, err = proc.communicate(timeout=TIMEOUT)
        assert f"trial {trial}: warning: {said}" in out, out + err  # the progress lines said it too
        [(status, reason)] = stored(home, exp, "SELECT status, reason FROM trials WHERE id=?", trial)
        assert status == "SUCCEEDED" and reason.startswith("ended without reporting a final result; " + said), reason
