"""Every config in examples/kubernetes, run as written with only its host names changed.

A user copies the folder, puts an address of their machine where the
example says `10.20.30.40` (managerAddress, nniManagerIp), and runs
`trialkit run`. Here the stand-in API server and tests/pod_runner.py are
the cluster (the examples' images are the torch trial image, an NFS export
is a host directory); the first trial must succeed with its one final
result from every pod it spans, then the user stops the experiment (the
examples ask for 10 to 100 trials).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from containers_util import needs_podman, running
from experiment_util import cli, stored, trial_status
from harness import wait_until
from pod_runner import PodRunner, host_address
from test_containers_k8s import TIMEOUT, cluster, logs, metric_values  # noqa: F401 (fixture)

pytestmark = [pytest.mark.containers, needs_podman]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "kubernetes"
CONFIGS = sorted(path.name for path in EXAMPLES.glob("*.yml"))
# The examples' host names: the manager's address, and where an example's image holds its code (NNI's adl mode).
MANAGER = re.compile(r"^(\s*(?:managerAddress|nniManagerIp):\s*)\S+", re.MULTILINE)
IN_IMAGE = {"adaptdl-v1.yml": "/workspace"}


def pods_of(config: dict) -> int:
    """How many pods one trial of the example spans."""
    if "trainingServicePlatform" in config:  # v1
        trial = config["trial"]
        if "taskRoles" in trial:
            return sum(role.get("taskNum", 1) for role in trial["taskRoles"])
        return sum(trial[role].get("replicas", 1) for role in ("master", "worker", "ps") if role in trial) or 1
    section = config["trainingService"]
    if "taskRoles" in section:
        return sum(role.get("taskNumber", 1) for role in section["taskRoles"])
    if section["platform"] == "adaptdl":
        return section.get("minReplicas") or 1
    return sum(section[role].get("replicas", 1) for role in ("master", "worker", "ps") if role in section)


def test_every_example_is_run_here():
    assert CONFIGS == ["adaptdl-v1.yml", "adaptdl.yml", "frameworkcontroller-v1.yml", "frameworkcontroller.yml",
                       "kubeflow-pytorch.yml", "kubeflow-tf-v1.yml"]


@pytest.mark.parametrize("name", CONFIGS)
def test_an_example_runs_as_written_with_its_host_names_changed(name, cluster, containers, torch_image,  # noqa: F811
                                                                 tmp_path):
    folder = tmp_path / "kubernetes"
    shutil.copytree(EXAMPLES, folder)
    text = (folder / name).read_text()
    assert MANAGER.search(text), "every example names the manager's address"
    (folder / name).write_text(MANAGER.sub(lambda m: m.group(1) + host_address(), text))
    config = yaml.safe_load((folder / name).read_text())
    pods, home = pods_of(config), tmp_path / "home"
    mounts = {IN_IMAGE[name]: folder} if name in IN_IMAGE else {}  # an image built with the folder in it
    with PodRunner(cluster, containers, torch_image, tmp_path / "kubelet", mounts=mounts) as runner:
        with running(folder / name) as (proc, exp):
            trial = f"{exp}-00000"
            wait_until(lambda: trial_status(home, trial) in ("SUCCEEDED", "FAILED"), TIMEOUT * 3,
                       "the first trial to end", every=0.5)
            assert trial_status(home, trial) == "SUCCEEDED", runner.describe()
            # The reporting pod's keeper says SUCCEEDED as it ends; a slower worker may still be finishing, and
            # the stop below would end it (exit 143 at load 11): each pod of the first trial ends on its own first.
            first = [pod for pod in runner.history if pod.obj["metadata"]["labels"]["trialkit.io/trial"] == trial]
            runner.wait_for(lambda _: all(pod.done.is_set() for pod in first), TIMEOUT,
                            "the first trial's pods to end")
            stopped = cli("experiment", "stop", exp)
            assert stopped.returncode == 0, stopped.stderr
            proc.communicate(timeout=TIMEOUT)
        [value] = metric_values(home, trial)
        assert 0.1 < value <= 1.0  # an accuracy, better than chance over ten classes
        assert len(first) == pods and all(pod.ended_well for pod in first), runner.describe()
        if pods > 1:  # one world across the pods: each says so in its output, shipped by rank
            for rank in range(pods):
                assert f"rank {rank} of {pods} on " in logs(trial, rank), runner.describe()
        [(count,)] = stored(home, exp, "SELECT COUNT(*) FROM records WHERE trial=? AND type='FINAL'", trial)
        assert count == 1
