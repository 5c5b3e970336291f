"""A config's errors name what the user wrote (a v1 config's keys, NNI's unfilled placeholders), every one at once.

Run as a user runs them: `trialkit render CONFIG`, one line on stderr, exit 2.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from experiment_util import cli

# shared/seeds/001: NNI's FrameworkController page, as written (placeholders and all).
FRAMEWORKCONTROLLER_V1 = """
authorName: default
experimentName: example_mnist
trialConcurrency: 1
maxExecDuration: 10h
maxTrialNum: 100
trainingServicePlatform: frameworkcontroller
searchSpacePath: search_space.json
useAnnotation: false
tuner:
  builtinTunerName: TPE
  classArgs:
    optimize_mode: maximize
trial:
  codeDir: .
  taskRoles:
    - name: worker
      taskNum: 1
      command: python3 mnist.py
      gpuNum: 1
      cpuNum: 1
      memoryMB: 8192
      image: msranni/nni:latest
      frameworkAttemptCompletionPolicy:
        minFailedTaskCount: 1
        minSucceededTaskCount: 1
frameworkcontrollerConfig:
  storage: nfs
  serviceAccountName: {your_frameworkcontroller_service_account_name}
  nfs:
    server: {your_nfs_server}
    path: {your_nfs_server_exported_path}
"""


def render(tmp_path: Path, text: str):
    (tmp_path / "search_space.json").write_text(json.dumps({"lr": {"_type": "choice", "_value": [0.1]}}))
    (tmp_path / "config.yml").write_text(text)
    return cli("render", tmp_path / "config.yml")


def test_a_v1_configs_unfilled_placeholders_are_named_by_their_v1_keys_all_at_once(tmp_path):
    done = render(tmp_path, FRAMEWORKCONTROLLER_V1)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    line = done.stderr
    assert line.startswith("trialkit: error: 3 problems: ")
    for v1_key, placeholder, v2_key in (
            ("frameworkcontrollerConfig.serviceAccountName", "{your_frameworkcontroller_service_account_name}",
             "trainingService.serviceAccountName"),
            ("frameworkcontrollerConfig.nfs.server", "{your_nfs_server}", "trainingService.storage.server"),
            ("frameworkcontrollerConfig.nfs.path", "{your_nfs_server_exported_path}", "trainingService.storage.path")):
        assert f"{v1_key}: {placeholder} is a placeholder left unfilled" in line
        assert f"{v2_key} in a v2 config" in line
    filled = FRAMEWORKCONTROLLER_V1.replace("{your_frameworkcontroller_service_account_name}", "frameworkcontroller") \
        .replace("{your_nfs_server}", "10.20.30.40").replace("{your_nfs_server_exported_path}", "/exports/nni")
    done = render(tmp_path, filled)
    assert done.returncode == 0, done.stderr


def test_a_v1_roles_and_trial_keys_are_named_as_written(tmp_path):
    v1 = yaml.safe_load(FRAMEWORKCONTROLLER_V1)
    v1["frameworkcontrollerConfig"] = {"serviceAccountName": "fc", "namespce": "default"}
    v1["trial"]["taskRoles"][0]["taskNum"] = "one"
    done = render(tmp_path, yaml.safe_dump(v1))
    assert done.returncode == 2
    assert "2 problems: " in done.stderr
    assert "frameworkcontrollerConfig.namespce: unknown key" in done.stderr
    assert "trial.taskRoles[0].taskNumber: expected an integer, got 'one'" in done.stderr


def test_a_v2_configs_refusal_lists_every_problem(tmp_path):
    config = {"searchSpaceFile": "search_space.json", "trialCommand": "python3 train.py",
              "tuner": {"name": "TPE"},
              "trainingService": {"platform": "kubeflow", "operator": "pytorch-operator", "managerAddress": "10.0.0.1",
                                  "dockerImage": "example/train:1", "nodeSelectr": {"a": "b"},
                                  "storage": {"storageType": "nfs", "server": {"your_nfs_server": None}, "path": "/x"},
                                  "master": {"replicas": "many", "command": "python3 train.py"}}}
    done = render(tmp_path, yaml.safe_dump(config))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "3 problems: " in done.stderr
    for fragment in ("trainingService.nodeSelectr: unknown key",
                     "trainingService.storage.server: {your_nfs_server} is a placeholder left unfilled",
                     "trainingService.master.replicas: expected an integer, got 'many'"):
        assert fragment in done.stderr


def test_rendering_names_every_roles_problem_at_once(tmp_path):
    config = {"searchSpaceFile": "search_space.json", "tuner": {"name": "TPE"},
              "trainingService": {"platform": "kubeflow", "operator": "tf-operator", "managerAddress": "10.0.0.1",
                                  "dockerImage": "example/train:1",
                                  "worker": {"replicas": 2}, "ps": {"replicas": 1}}}  # no command anywhere
    done = render(tmp_path, yaml.safe_dump(config))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "2 problems: " in done.stderr
    assert "trainingService.worker.command: no command to run" in done.stderr
    assert "trainingService.ps.command: no command to run" in done.stderr


def run_config(tmp_path: Path, config: dict):
    """`trialkit run` of `config` written as YAML, beside the train.py it runs; refused before anything runs."""
    (tmp_path / "train.py").write_text("print('never run')\n")
    (tmp_path / "config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    done = cli("run", tmp_path / "config.yml")
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_an_nni_configs_mistakes_of_every_kind_are_listed_in_one_run(tmp_path):
    line = run_config(tmp_path, {
        "searchSpace": {"lr": {"_type": "uniform", "_value": [1, 0]}, "act": {"_type": "choice", "_value": []}},
        "trialCommand": "python3 train.py", "trialConcurrency": -1, "maxExperimentDuration": "10 minutes",
        "tuner": {"name": "TPE"}, "trainingService": {"platform": "local"}})
    assert "4 problems: " in line, line
    for fragment in ("searchSpace.lr._value: low (1) must be less than high (0)",
                     "searchSpace.act._value: choice needs a non-empty list of options",
                     "trialConcurrency: -1 is too small", "maxExperimentDuration: cannot read duration '10 minutes'"):
        assert fragment in line, (fragment, line)


def test_an_nni_configs_typos_are_each_named_with_a_did_you_mean_and_nothing_they_cause(tmp_path):
    line = run_config(tmp_path, {
        "searchSpace": {"lr": {"_type": "choice", "_value": [0.1]}}, "trialCommand": "python3 train.py",
        "maxTrialNumbr": 10, "trialConcurrency": 0, "tunr": {"name": "TPE"}})
    assert "3 problems: " in line, line
    for fragment in ("maxTrialNumbr: unknown key 'maxTrialNumbr' (did you mean 'maxTrialNumber'?)",
                     "trialConcurrency: 0 is too small", "tunr: unknown key 'tunr' (did you mean 'tuner'?)"):
        assert fragment in line, (fragment, line)
    assert "the tuner is missing" not in line  # the typo's consequence, not a problem of its own


KUBEFLOW = {"platform": "kubeflow", "operator": "trainjob", "namespace": "team", "managerAddress": "10.0.0.1",
            "dockerImage": "example/train:1", "worker": {"replicas": 2}}


@pytest.mark.parametrize("service, said", [
    ({**{k: v for k, v in KUBEFLOW.items() if k != "platform"}, "platfrom": "kubeflow"},
     "trainingService.platfrom: unknown key 'platfrom' (did you mean 'platform'?)"),
    ({**{k: v for k, v in KUBEFLOW.items() if k != "dockerImage"}, "dockerImg": "example/train:1"},
     "trainingService.dockerImg: unknown key 'dockerImg' (did you mean 'dockerImage'?)"),
    ({**{k: v for k, v in KUBEFLOW.items() if k != "dockerImage"}, "worker": {"replicas": 2, "dockerImg": "e/t:1"}},
     "trainingService.worker.dockerImg: unknown key 'dockerImg' (did you mean 'dockerImage'?)"),
])
def test_a_typo_of_a_required_key_is_told_as_the_typo_not_as_the_key_missing(tmp_path, service, said):
    """The did-you-mean wins over what the typo causes (no platform, a role with no image), whichever the
    config's check found first."""
    line = run_config(tmp_path, {"searchSpace": {"lr": {"_type": "choice", "_value": [0.1]}},
                                 "trialCommand": "python3 train.py", "tuner": {"name": "TPE"},
                                 "trainingService": service})
    assert line.endswith(f"config.yml:{line.split('config.yml:')[1].split(':')[0]}: {said}\n"), line
    assert "missing" not in line and "no image" not in line and "problems" not in line, line


def test_a_v1_configs_typo_is_listed_with_its_other_problems(tmp_path):
    (tmp_path / "space.json").write_text(json.dumps({"lr": {"_type": "uniform", "_value": [1, 0]}}))
    line = run_config(tmp_path, {
        "authorName": "default", "trialConcurrency": -1, "maxTrialNumbr": 3, "trainingServicePlatform": "local",
        "searchSpacePath": "space.json", "tunr": {"builtinTunerName": "TPE"},
        "trial": {"command": "python3 train.py", "codeDir": "."}})
    assert "4 problems: " in line, line
    for fragment in ("maxTrialNumbr: unknown key 'maxTrialNumbr' (did you mean 'maxTrialNum'?)",
                     "tunr: unknown key 'tunr' (did you mean 'tuner'?)", "trialConcurrency: -1 is too small",
                     "searchSpacePath.lr._value: low (1) must be less than high (0)"):
        assert fragment in line, (fragment, line)


@pytest.mark.parametrize("text, said", [("trialConcurrency: [\n", "cannot parse it at line 2, column 1: "),
                                        (None, "cannot read it: No such file")])
def test_a_config_file_that_cannot_be_read_is_named_once(tmp_path, text, said):
    path = tmp_path / "config.yml"
    if text is not None:
        path.write_text(text)
    done = cli("run", path)
    assert (done.returncode, done.stderr.count(str(path))) == (2, 1), done.stderr
    assert f"{path}: {said}" in done.stderr, done.stderr


def test_a_search_space_given_as_the_config_is_said_to_be_one(tmp_path):
    # It was read as a config of unknown keys: one 2,000-character line that listed the top-level keys per key.
    path = tmp_path / "search_space.json"
    path.write_text(json.dumps({"lr": {"_type": "loguniform", "_value": [1e-4, 0.1]},
                                "batch_size": {"_type": "choice", "_value": [16, 32]}}))
    done = cli("run", path)
    assert done.returncode == 2 and done.stderr == (
        f"trialkit: error: {path}: this is a search space, not an experiment's config (name it in a config's "
        "searchSpaceFile, as examples/quickstart/config.yml does)\n"), done.stderr


V1_WITH_V2_KEYS = """\
authorName: default
trialConcurrency: 1
maxTrialNumber: 3
trainingServicePlatform: local
searchSpacePath: search_space.json
tuner:
  name: TPE
trial:
  command: python3 train.py
  codeDir: .
trialCommand: python3 train.py
"""


def test_a_v2_key_in_a_v1_config_is_named_as_written_at_its_line(tmp_path):
    # A newcomer's v1 config with v2's maxTrialNumber was told "maxTrialNum: unknown key 'maxTrialNum' (did you
    # mean 'maxTrialNum'?...)", no line: the key the user wrote, renamed to the one it should have been.
    done = render(tmp_path, V1_WITH_V2_KEYS)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    line = done.stderr
    assert line == (f"trialkit: error: 3 problems: {tmp_path / 'config.yml'}:3: maxTrialNumber: unknown key "
                    "'maxTrialNumber' (maxTrialNumber is a v2 key: a v1 config writes maxTrialNum); "
                    f"{tmp_path / 'config.yml'}:7: tuner.name: unknown key 'name' (tuner.name is a v2 key: a v1 "
                    "config writes tuner.builtinTunerName); "
                    f"{tmp_path / 'config.yml'}:11: trialCommand: unknown key 'trialCommand' (trialCommand is a v2 "
                    "key: a v1 config writes trial.command)\n"), line  # no "builtinTunerName is missing" besides
