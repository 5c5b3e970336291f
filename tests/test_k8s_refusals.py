"""Mistakes in a cluster platform's config stop `trialkit run` before anything
starts (issue 23): one line, exit 2, no experiment created, no manager.

Each case starts from one of NNI's own example configs (examples/kubernetes)
and makes the mistake a user would: a misspelled key under v1's `trial:`
section (silently dropped before: the trial ran with no GPU), a misspelled
key in a v2 section, a role with no image.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from experiment_util import cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "kubernetes"


def example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


def changed(name: str, change) -> dict:
    config = copy.deepcopy(example(name))
    change(config)
    return config


def rename(mapping: dict, old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


CASES = [
    # v1: the issue's case, gpuNumber for gpuNum, on each platform that reads v1's trial section
    ("adaptdl-v1.yml", lambda c: rename(c["trial"], "gpuNum", "gpuNumber"),
     "trial.gpuNumber: unknown key 'gpuNumber' (did you mean 'gpuNum'?)"),
    ("kubeflow-tf-v1.yml", lambda c: c["trial"].update(gpuNum=1),
     "trial.gpuNum: unknown key 'gpuNum'"),
    ("frameworkcontroller-v1.yml", lambda c: rename(c["trial"], "taskRoles", "taskRole"),
     "trial.taskRole: unknown key 'taskRole' (did you mean 'taskRoles'?)"),
    # v2 sections: did-you-mean on a misspelled key
    ("kubeflow-pytorch.yml", lambda c: rename(c["trainingService"]["worker"], "cpuNumber", "cpuNumbr"),
     "trainingService.worker.cpuNumbr: unknown key 'cpuNumbr' (did you mean 'cpuNumber'?)"),
    ("adaptdl.yml", lambda c: c["trainingService"].update(maxReplica=4),
     "trainingService.maxReplica: unknown key 'maxReplica' (did you mean 'maxReplicas'?)"),
    ("frameworkcontroller.yml", lambda c: c["trainingService"]["taskRoles"][0].update(taskNumbr=2),
     "unknown key 'taskNumbr' (did you mean 'taskNumber'?)"),
    # no image anywhere for a role
    ("kubeflow-pytorch.yml", lambda c: c["trainingService"].pop("dockerImage"),
     "trainingService.master.dockerImage: role 'master' has no image to run"),
    ("kubeflow-tf-v1.yml", lambda c: c["trial"]["ps"].pop("image"),
     "role 'ps' has no image to run"),
    ("frameworkcontroller.yml", lambda c: [r.pop("dockerImage", None) for r in c["trainingService"]["taskRoles"]]
     and c["trainingService"].pop("dockerImage", None),
     "has no image to run"),
    ("adaptdl.yml", lambda c: [c["trainingService"].pop(k, None) for k in ("image", "dockerImage")],
     "no image to run the trial in"),
] + [
    # names and values a cluster refuses (issue 45, item 5): each was rendered and failed every trial
    ("kubeflow-pytorch.yml", lambda c: c["trainingService"].update(dockerImage="registry.example.com/mnist trialkit:1"),
     "trainingService.dockerImage: image 'registry.example.com/mnist trialkit:1' holds whitespace"),
    ("frameworkcontroller.yml", lambda c: c["trainingService"]["taskRoles"][0].update(dockerImage="Team/Mnist:1"),
     "names its repository in uppercase"),
    ("kubeflow-tf-v1.yml", lambda c: c["trial"]["ps"].update(image="registry.example.com/tf:1:2"),
     "is not an image reference"),
    ("adaptdl.yml", lambda c: c["trainingService"]["checkpoint"].update(storageClass="BAD CLASS"),
     "trainingService.checkpoint.storageClass: 'BAD CLASS' is not a StorageClass name"),
    ("kubeflow-pytorch.yml", lambda c: c["trainingService"].update(priorityClasses={2 ** 64: "high"}),
     "trainingService.priorityClasses: priority 18446744073709551616 is outside the cluster's priorities"),
    ("kubeflow-pytorch.yml", lambda c: c["trainingService"].update(priorityClasses={1: "High"}),
     "trainingService.priorityClasses.1: 'High' is not a PriorityClass name"),
    ("frameworkcontroller.yml", lambda c: c["trainingService"].update(serviceAccountName="framework_controller"),
     "'framework_controller' is not a ServiceAccount name"),
    ("adaptdl.yml", lambda c: c["trainingService"].update(imagePullSecrets=[{"name": "pull secret"}]),
     "trainingService.imagePullSecrets[0].name: 'pull secret' is not a Secret name"),
    ("kubeflow-pytorch.yml", lambda c: c["trainingService"].update(namespace="Team-A"),
     "trainingService.namespace: 'Team-A' is not a namespace name"),
]
CLUSTER_REFUSES = CASES[-9:]


@pytest.mark.parametrize("name, change, says", CASES, ids=[f"{c[0]}:{c[2][:40]}" for c in CASES])
def test_a_mistake_stops_run_in_one_line_before_anything_starts(name, change, says, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "search_space.json").write_text((EXAMPLES / "search_space.json").read_text())
    for extra in EXAMPLES.glob("*.yaml"):  # trialTemplate files the examples name
        (folder / extra.name).write_text(extra.read_text())
    config = folder / "config.yml"
    config.write_text(yaml.safe_dump(changed(name, change)))
    done = cli("run", config)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert says in lines[0]
    assert not (home / "experiments").exists() or not any((home / "experiments").iterdir()), "nothing was created"


@pytest.mark.parametrize("name", ["adaptdl-v1.yml", "kubeflow-tf-v1.yml", "frameworkcontroller-v1.yml",
                                  "kubeflow-pytorch.yml", "adaptdl.yml", "frameworkcontroller.yml"])
def test_the_unchanged_examples_render(name, tmp_path):
    # The cases above fail for their mistake, not because the examples are broken.
    config = EXAMPLES / name
    done = cli("render", config, "--trial", "0")
    assert done.returncode == 0, done.stderr
    assert "kind:" in done.stdout


@pytest.mark.parametrize("name, change, says", CLUSTER_REFUSES, ids=[f"{c[0]}:{c[2][:40]}" for c in CLUSTER_REFUSES])
def test_render_refuses_what_a_cluster_would_refuse_in_one_line(name, change, says, tmp_path):
    config = tmp_path / "config.yml"
    for extra in [*EXAMPLES.glob("*.yaml"), EXAMPLES / "search_space.json"]:  # the files the examples name
        (tmp_path / extra.name).write_text(extra.read_text())
    config.write_text(yaml.safe_dump(changed(name, change)))
    done = cli("render", config, "--trial", "0")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
