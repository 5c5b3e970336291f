"""Kubernetes trials end to end: `trialkit run` against the stand-in API server, pods run by tests/pod_runner.py.

The control plane renders and submits each trial's objects; the pod runner
plays the operator and the kubelet, so every replica is a real container of
the trial image (images/build.sh) with its keeper as PID 1, reporting to the
real manager on loopback. Each test ends with the trial SUCCEEDED, its
metrics stored once, its logs readable by `trialkit trial logs`, and nothing
left running (the `containers` fixture).
"""
from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from containers_util import containers, image, needs_podman, torch_image  # noqa: F401 (fixtures)
from experiment_util import cli, experiment_id, start_cli, stored, trial_status
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
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired as late:
        raise AssertionError(f"not done after {TIMEOUT} s: {late.output}\n{runner.describe()}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and out, out + err + runner.describe()
    return experiment_id(out.splitlines()[0])


def finals(home: Path, trial: str) -> list:
    return stored(home, trial.rpartition("-")[0], "SELECT value FROM records WHERE trial=? AND type=?", trial, "FINAL")


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
        assert [value for (value,) in finals(home, trial)] == ["3.0"] or len(finals(home, trial)) == 1
        assert sorted(runner.pods) == sorted(p for p in runner.pods if p.endswith(("-master-0", "-worker-0")))
        assert all(pod.exit_code == 0 for pod in runner.pods.values())
        assert "rank 0 of 2: sum 3.0" in logs(trial, 0)
        worker = next(name for name in runner.pods if name.endswith("-worker-0"))
        assert "rank 1 of 2: sum 3.0" in runner.logs(worker)
