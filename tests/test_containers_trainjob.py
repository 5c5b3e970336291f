"""Kubeflow Trainer v2's TrainJob and Kueue end to end: `trialkit run` against the stand-in API server, the
pods real containers of the trial image run by tests/pod_runner.py, which plays Trainer's controller
(tests/trainer_play.py: JobSet's pod names, the torch plugin's PET_*) and, given one, Kueue's admission
(tests/kueue_play.py: suspend, admit by priority and quota, preempt).
"""
from __future__ import annotations

import json

import pytest

from containers_util import needs_podman, running
from experiment_util import cli, stored, trial_status
from harness import wait_until
from kueue_play import KueuePlay
from pod_runner import PodRunner, host_address
from pools_util import pools_yml
from s3_server import create_secret, s3, s3_server  # noqa: F401 - fixtures
from test_containers_k8s import (CODE, DISTRIBUTED, RESUMABLE, TIMEOUT, cluster, experiment_config,  # noqa: F401
                                 finish_run, logs, metric_values, progress, run_to_the_end)
from test_containers_k8s_multinode import UNREACHABLE
from trialkit.platforms.kubernetes.client import KubeClient

pytestmark = [pytest.mark.containers, needs_podman]


def test_a_trainjob_of_two_nodes_trains_over_gloo_with_pet_names_only(cluster, containers, torch_image, tmp_path):
    section = {"platform": "kubeflow", "operator": "trainjob", "worker": {"replicas": 2}}
    config, code = experiment_config(tmp_path, DISTRIBUTED, section,
                                     trialCommand=f"python3 -m trialkit.launch.torch_distributed {CODE}/train.py")
    with PodRunner(cluster, containers, torch_image, tmp_path / "kubelet", mounts={CODE: code}) as runner:
        exp = run_to_the_end(config, runner)
        trial, home = f"{exp}-00000", tmp_path / "home"
        assert trial_status(home, trial) == "SUCCEEDED", runner.describe()
        assert metric_values(home, trial) == [3.0]
        job = next(obj for obj in cluster.objects.values() if obj["kind"] == "TrainJob")["metadata"]["name"]
        assert sorted(runner.pods) == [f"{job}-node-0-0", f"{job}-node-0-1"]  # JobSet's names
        assert all(pod.exit_code == 0 for pod in runner.pods.values())
        assert "rank 0 of 2: sum 3.0" in logs(trial, 0)
        assert "rank 1 of 2: sum 3.0" in logs(trial, 1)  # node 1's keeper shipped its output by rank


SEES_THE_STORES_KEY = """
import os, trialkit
print("key id", os.environ.get("AWS_ACCESS_KEY_ID"), flush=True)
trialkit.report_final_result(1.0)
"""


def test_a_trainjobs_trial_gets_the_checkpoint_stores_secret_as_variables(cluster, containers, image, tmp_path, s3):
    """checkpointStorage.secretName on a TrainJob, which takes no envFrom: its pod mounts the Secret and run.sh,
    in a real container of the trial image, exports its keys, which the trial (and its keeper) read."""
    create_secret(cluster, s3, "team-s3")
    section = {"platform": "kubeflow", "operator": "trainjob", "worker": {"replicas": 1}}
    storage = {"type": "s3", "bucket": s3.bucket(), "secretName": "team-s3",
               "endpointUrl": s3.reachable_at(host_address())}
    config, code = experiment_config(tmp_path, SEES_THE_STORES_KEY, section, checkpointStorage=storage)
    with PodRunner(cluster, containers, image, tmp_path / "kubelet", mounts={CODE: code}) as runner:
        exp = run_to_the_end(config, runner)
        trial = f"{exp}-00000"
        assert trial_status(tmp_path / "home", trial) == "SUCCEEDED", runner.describe()
        done = cli("trial", "logs", trial)
        assert f"key id {s3.access_key}" in done.stdout, done.stdout + done.stderr + runner.describe()


URGENT = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
          "metadata": {"name": "urgent-report", "namespace": "default",
                       "labels": {"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": "urgent"}},
          "spec": {"runPolicy": {"suspend": True}, "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {
              "spec": {"containers": [{"name": "pytorch", "image": "someone-else:1",
                                       "command": ["python3", "-c", "import time; time.sleep(20)"]}]}}}}}}


def statuses(home, exp: str, trial: str) -> list:
    return stored(home, exp, "SELECT status, reason FROM statuses WHERE trial=? ORDER BY id", trial)


def test_kueue_admits_evicts_and_the_trial_resumes_from_its_checkpoint(cluster, containers, image, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    pools_yml(home, "  gpu: {kueue: {namespace: default, localQueue: lq, priorityClass: research}}\n")
    kueue = KueuePlay(cluster, "default", "lq", pods=1, classes={"research": 10, "urgent": 100})
    section = {"platform": "kubeflow", "operator": "trainjob", "worker": {"replicas": 1},
               "checkpoint": {"storageClass": "local", "storageSize": "1Gi"}}
    config, code = experiment_config(tmp_path, RESUMABLE, section)
    with PodRunner(cluster, containers, image, tmp_path / "kubelet", mounts={CODE: code}, kueue=kueue) as runner:
        with running(config) as (proc, exp):
            trial = f"{exp}-00000"
            wait_until(lambda: progress(home, trial) >= 2, TIMEOUT, "the admitted trial to hold at step 10")
            first = next(iter(runner.pods))
            # Someone's job of higher priority comes: Kueue preempts the trial's to admit it.
            KubeClient.from_environment().create(json.loads(json.dumps(URGENT)))
            wait_until(lambda: kueue.evictions, TIMEOUT, "Kueue to evict the trial's job")
            wait_until(lambda: any(status == "PREEMPTED" for status, _ in statuses(home, exp, trial)), TIMEOUT,
                       "the trial to end PREEMPTED")
            # Its next job waits behind the urgent one, in Kueue's queue and with Kueue's words.
            listed = []

            def queued() -> bool:
                done = cli("job", "list", "--pool", "gpu", "--json")
                listed[:] = json.loads(done.stdout) if done.returncode == 0 else []
                return [(row["id"], row["status"]) for row in listed] == [("pytorchjob-urgent-report", "ADMITTED"),
                                                                          (trial, "QUEUED")]
            wait_until(queued, TIMEOUT, "job list --pool to show the queue")
            assert listed[1]["priority_class"] == "research" and listed[1]["experiment"] == exp
            wait_until(lambda: any("queued in Kueue's LocalQueue lq: Pending" in (reason or "")
                                   for _, reason in statuses(home, exp, trial)), TIMEOUT, "Kueue's reason stored")
            finish_run(proc, runner)
        assert trial_status(home, trial) == "SUCCEEDED" and metric_values(home, trial) == [3]
        again = runner.pods[first]  # the new job's pod: the same trial, the same name
        assert runner.history[0].exit_code == 143 and "checkpoint at step 10" in runner.logs(runner.history[0])
        assert "restart 1 from step 10" in runner.logs(again), runner.describe()
        assert kueue.evictions == [first.rsplit("-node-", 1)[0]]


def test_a_waiting_jobs_priority_class_changes_and_an_admitted_ones_is_refused(cluster, containers, image,
                                                                               tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    pools_yml(home, "  gpu: {kueue: {namespace: default, localQueue: lq}}\n")
    kueue = KueuePlay(cluster, "default", "lq", pods=1, classes={"research": 10, "urgent": 100})
    hold = "import time, trialkit\ntrialkit.report_intermediate_result(1)\ntime.sleep(600)\n"
    config, code = experiment_config(tmp_path, hold, {"platform": "kubeflow", "operator": "trainjob",
                                                      "worker": {"replicas": 1}}, trialConcurrency=2, maxTrialNumber=2,
                                     searchSpace={"x": {"_type": "choice", "_value": [3, 4]}})
    with PodRunner(cluster, containers, image, tmp_path / "kubelet", mounts={CODE: code}, kueue=kueue) as runner:
        with running(config) as (proc, exp):
            first, second = f"{exp}-00000", f"{exp}-00001"
            wait_until(lambda: progress(home, first) >= 1 or progress(home, second) >= 1, TIMEOUT,
                       "one trial to run")
            admitted, waiting = (first, second) if progress(home, first) >= 1 else (second, first)
            refused = cli("job", "update", admitted, "--priority", "urgent")
            assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
            assert "is admitted by Kueue: a WorkloadPriorityClass changes only while the job waits" in refused.stderr
            changed = cli("job", "update", waiting, "--priority", "urgent")
            assert changed.returncode == 0 and changed.stdout.strip() == f"updated {waiting}: priority class urgent"
            # Kueue takes it, and preempts the admitted trial for the waiting one now ahead of it.
            wait_until(lambda: kueue.evictions, TIMEOUT, "Kueue to preempt for the raised job")
            wait_until(lambda: progress(home, waiting) >= 1, TIMEOUT, "the raised trial to run")
            cli("experiment", "stop", exp)
            proc.communicate(timeout=TIMEOUT)


# Runs until the test releases its trial, reporting nothing it could deliver.
UNTIL_RELEASED = f"""
import os, time
while not os.path.exists("{CODE}/release-" + os.environ["TRIALKIT_TRIAL_ID"]):
    time.sleep(0.2)
"""


def test_a_trial_kueue_held_then_admitted_runs_by_the_clusters_word_though_its_keeper_is_unheard(
        cluster, containers, image, tmp_path):
    """Both lines of issue 41 at once: Kueue held the trial (WAITING with its words), admits it, and its pod
    runs; its keeper cannot reach the manager, so only the cluster says it runs: the trial is RUNNING, and no
    longer counted as waiting for Kueue."""
    home = tmp_path / "home"
    home.mkdir()
    pools_yml(home, "  gpu: {kueue: {namespace: default, localQueue: lq}}\n")
    kueue = KueuePlay(cluster, "default", "lq", pods=1)
    section = {"platform": "kubeflow", "operator": "trainjob", "worker": {"replicas": 1},
               "managerAddress": UNREACHABLE}
    config, code = experiment_config(tmp_path, UNTIL_RELEASED, section, trialConcurrency=2, maxTrialNumber=2,
                                     searchSpace={"x": {"_type": "choice", "_value": [3, 4]}})
    with PodRunner(cluster, containers, image, tmp_path / "kubelet", mounts={CODE: code}, kueue=kueue) as runner:
        with running(config) as (proc, exp):
            trials = (f"{exp}-00000", f"{exp}-00001")
            wait_until(lambda: "RUNNING" in [trial_status(home, trial) for trial in trials], TIMEOUT,
                       "a trial to run", every=0.5)
            first, second = trials if trial_status(home, trials[0]) == "RUNNING" else trials[::-1]
            wait_until(lambda: any("queued in Kueue's LocalQueue lq" in (reason or "")
                                   for _, reason in statuses(home, exp, second)), TIMEOUT, "the second to wait")
            kueue.pods = 2  # the ClusterQueue's quota grows: Kueue admits the second
            wait_until(lambda: trial_status(home, second) == "RUNNING", TIMEOUT, "the second trial to run",
                       every=0.5)
            (code / f"release-{first}").write_text("")
            wait_until(lambda: trial_status(home, first) == "SUCCEEDED", TIMEOUT, "the first trial to end")
            (code / f"release-{second}").write_text("")
            out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, out + err + runner.describe()
    # The line of the first trial's end counts the second as running, not as held by Kueue.
    [line] = [line for line in out.splitlines() if line.startswith(f"trial {first} SUCCEEDED")]
    assert "1 done, 1 running, 0 failed" in line and "waiting" not in line, line
