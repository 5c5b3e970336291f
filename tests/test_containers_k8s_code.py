"""The seeds' own Kubernetes configs, run to the end in a plain Debian + python3 image with no trialkit in it.

`trialkit run` against the stand-in API server, pods run by tests/pod_runner.py
as podman containers of images/build.sh's Debian base (minbase + python3, no
trialkit, no pip packages). Nothing is mounted into the pods: the code dir
reaches them through the manager, packed and checked by digest, and so does
trialkit's trial side, which the training code then imports.
"""
from __future__ import annotations

import sqlite3
import textwrap
from contextlib import closing
from pathlib import Path

import pytest
import yaml

from containers_util import ended, needs_podman, podman  # its fixtures (containers, image) come from conftest
from pod_runner import PodRunner, host_address
from test_containers_k8s import TIMEOUT, cluster, logs, metric_values, run_to_the_end  # noqa: F401 (fixtures)
from experiment_util import cli, experiment_id, start_cli, stored, trial_status
from trialkit.web import queries

pytestmark = [pytest.mark.containers, needs_podman]

TRAIN = """
import os, trialkit
x = trialkit.get_next_parameter()["x"]
print(f"trialkit from {trialkit.__file__} in {os.getcwd()}", flush=True)
trialkit.report_intermediate_result(x)
trialkit.report_final_result(x * 2)
"""
SIDE = "/var/lib/trialkit/trial/.trialkit/trialside/"


@pytest.fixture(scope="session")
def plain_image(image) -> str:
    """images/build.sh's base: Debian bookworm minbase with python3, in which `import trialkit` fails."""
    name = podman("images", "--filter", "reference=localhost/trialkit-debian",
                  "--format", "{{.Repository}}:{{.Tag}}").stdout.split()[0]
    probe = podman("run", "--rm", "--network", "none", name, "python3", "-c", "import trialkit", check=False)
    assert probe.returncode != 0 and "No module named 'trialkit'" in probe.stderr
    return name


@pytest.fixture(scope="session")
def no_python_image(plain_image, tmp_path_factory) -> str:
    """The plain image with python3 removed: built once, kept (by the base's tag) for later sessions."""
    name = f"localhost/trialkit-nopython:{plain_image.rpartition(':')[2]}"
    if podman("image", "exists", name, check=False).returncode != 0:
        context = tmp_path_factory.mktemp("nopython")
        (context / "Containerfile").write_text(f"FROM {plain_image}\nRUN rm -f /usr/bin/python3*\n")
        podman("build", "--network", "none", "-q", "-t", name, str(context), timeout=300)
    probe = podman("run", "--rm", "--network", "none", name, "/bin/sh", "-c", "command -v python3", check=False)
    assert probe.returncode != 0 and not probe.stdout, probe.stdout
    return name


def project(tmp_path: Path, script_name: str, config: dict) -> Path:
    """The user's folder: the training script beside the config (NNI's examples keep them together)."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / script_name).write_text(textwrap.dedent(TRAIN))
    (folder / "search_space.json").write_text('{"x": {"_type": "choice", "_value": [3]}}')
    path = folder / "config.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def ran_well(config: Path, runner: PodRunner, home: Path) -> str:
    """run_to_the_end, then its trial checked: it succeeded, its code shipped and run; the experiment's id."""
    exp = run_to_the_end(config, runner)
    trial = f"{exp}-00000"
    assert trial_status(home, trial) == "SUCCEEDED", runner.describe()
    assert metric_values(home, trial) == [6]
    shipped = cli("trial", "logs", trial).stdout
    assert f"trialkit from {SIDE}" in shipped and "in /var/lib/trialkit/trial/code" in shipped, runner.describe()
    runner.wait_for(lambda pods: all(pod.done.is_set() for pod in pods.values()), TIMEOUT, "every pod to end")
    assert all(pod.exit_code == 0 for pod in runner.pods.values()), runner.describe()
    return exp


def test_kubeflow_seed_config_runs_its_code_dir_in_a_plain_image(cluster, containers, plain_image, tmp_path):  # noqa: F811
    # shared/seeds/004: the Kubeflow page's experiment, its Python config as YAML (nfs left out: no server here).
    role = {"command": "python3 model.py", "cpuNumber": 1, "memorySize": "4g", "codeDirectory": ".",
            "dockerImage": "msranni/nni:latest"}
    config = project(tmp_path, "model.py", {
        "searchSpaceFile": "search_space.json", "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}},
        "maxTrialNumber": 1, "trialConcurrency": 1,
        "trainingService": {"platform": "kubeflow", "operator": "pytorch-operator", "apiVersion": "v1alpha2",
                            "managerAddress": host_address(),
                            "master": {"replicas": 1, "gpuNumber": 0, **role}, "worker": {"replicas": 2, **role}}})
    with PodRunner(cluster, containers, plain_image, tmp_path / "kubelet") as runner:
        exp = ran_well(config, runner, tmp_path / "home")
        assert sorted(name.rsplit("-", 2)[-2] for name in runner.pods) == ["master", "worker", "worker"]
        for rank in (0, 1, 2):  # the master's output (in the store) and the workers' (shipped by rank)
            assert f"trialkit from {SIDE}" in logs(f"{exp}-00000", rank), runner.describe()


def test_frameworkcontroller_seed_config_runs_its_code_dir_in_a_plain_image(cluster, containers, plain_image,  # noqa: F811
                                                                           tmp_path):
    # shared/seeds/001: the FrameworkController page's v1 config (gpuNum 0 here, nfs left out).
    config = project(tmp_path, "mnist.py", {
        "authorName": "default", "experimentName": "example_mnist", "trialConcurrency": 1, "maxTrialNum": 1,
        "maxExecDuration": "10h", "trainingServicePlatform": "frameworkcontroller", "nniManagerIp": host_address(),
        "searchSpacePath": "search_space.json", "useAnnotation": False,
        "tuner": {"builtinTunerName": "TPE", "classArgs": {"optimize_mode": "maximize"}},
        "trial": {"codeDir": ".", "taskRoles": [{
            "name": "worker", "taskNum": 1, "command": "python3 mnist.py", "gpuNum": 0, "cpuNum": 1,
            "memoryMB": 8192, "image": "msranni/nni:latest",
            "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceededTaskCount": 1}}]}})
    with PodRunner(cluster, containers, plain_image, tmp_path / "kubelet") as runner:
        ran_well(config, runner, tmp_path / "home")


def test_adaptdl_seed_config_with_its_checkpoint_claim_in_a_plain_image(cluster, containers, plain_image,  # noqa: F811
                                                                       tmp_path):
    # shared/seeds/000: the AdaptDL page's config as v2 (its code dir shipped: no workingDir; nfs left out).
    config = project(tmp_path, "main_nni.py", {
        "searchSpaceFile": "search_space.json", "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "minimize"}},
        "maxTrialNumber": 1, "trialConcurrency": 1, "trialCommand": "python3 main_nni.py",
        "trainingService": {"platform": "adl", "managerAddress": host_address(), "gpuNumber": 0, "adaptive": True,
                            "image": "registry.petuum.com/dev/nni:adaptdl",
                            "imagePullSecrets": [{"name": "imagepullsecret"}],
                            "checkpoint": {"storageClass": "dfs", "storageSize": "1Gi"}}})
    with PodRunner(cluster, containers, plain_image, tmp_path / "kubelet") as runner:
        ran_well(config, runner, tmp_path / "home")


def test_an_image_without_python_fails_the_trial_with_the_reason(cluster, containers, no_python_image,  # noqa: F811
                                                                  tmp_path):
    # run.sh finds no python3: it writes why to the pod's termination message and exits 127 before the
    # keeper or the training code; the platform copies the message into the trial's reason.
    config = project(tmp_path, "model.py", {
        "searchSpaceFile": "search_space.json", "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}},
        "maxTrialNumber": 1, "trialConcurrency": 1,
        "trainingService": {"platform": "kubeflow", "operator": "pytorch-operator", "apiVersion": "v1alpha2",
                            "managerAddress": host_address(),
                            "master": {"replicas": 1, "command": "python3 model.py", "codeDirectory": ".",
                                       "dockerImage": "msranni/nni:latest"}}})
    home, why = tmp_path / "home", "no usable Python in the image: python3 is not found"
    with PodRunner(cluster, containers, no_python_image, tmp_path / "kubelet") as runner:
        out, err = ended(start_cli("run", config), runner, TIMEOUT)
        exp = experiment_id(out.splitlines()[0])
        [pod] = runner.history
        assert pod.exit_code == 127 and "trialkit from" not in runner.logs(pod), runner.describe()
    trial = f"{exp}-00000"
    [(status, code, reason)] = stored(home, exp, "SELECT status, exit_code, reason FROM trials WHERE id=?", trial)
    assert (status, code) == ("FAILED", 127) and why in reason, (status, code, reason, out, err)
    assert stored(home, exp, "SELECT COUNT(*) FROM records WHERE trial=? AND type IN ('PERIODICAL', 'FINAL')",
                  trial) == [(0,)]  # no training was tried
    shown = cli("trial", "show", trial).stdout
    assert f"status         FAILED: {pod.name}: {why}" in shown, shown
    with closing(sqlite3.connect(home / "experiments" / exp / "trialkit.db")) as db:  # what the page gets
        db.row_factory = sqlite3.Row
        queries.register(db)
        page = queries.trials_page(db, exp, queries.TrialQuery())
        detail = queries.trial(db, exp, trial)
    assert why in page["rows"][0]["reason"] and why in detail["reason"], (page["rows"], detail)
