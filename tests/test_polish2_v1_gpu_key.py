"""An NNI v1 config's `trial: {gpuNum: 1}` on a machine with no GPU is refused naming the key as written
(`trial.gpuNum`), as the config's other v1 errors do, with its v2 name in the fix; a newcomer read
"trialGpuNumber: ..." and found no such key in his config. A real `trialkit run` of a v1 config file; the
machine's nvidia-smi is a stand-in that lists no GPU (gpu_util), so the test reads the same on a GPU machine.
"""
from __future__ import annotations

import json

import pytest
import yaml

from experiment_util import cli
from gpu_util import fake_gpus


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))


def v1_config(tmp_path, **trial) -> str:
    tmp_path = tmp_path / "code"  # beside TRIALKIT_HOME, not holding it
    tmp_path.mkdir()
    (tmp_path / "search_space.json").write_text(json.dumps({"x": {"_type": "choice", "_value": [1]}}))
    (tmp_path / "trial.py").write_text("import trialkit\ntrialkit.report_final_result(1)\n")
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump({
        "authorName": "newcomer", "experimentName": "v1", "trialConcurrency": 1, "maxTrialNum": 1,
        "searchSpacePath": "search_space.json", "trainingServicePlatform": "local",
        "tuner": {"builtinTunerName": "Random", "classArgs": {"optimize_mode": "maximize"}},
        "trial": {"command": "python3 trial.py", "codeDir": ".", **trial}}))
    return str(path)


def test_a_v1_gpu_num_more_than_the_machine_holds_names_trial_gpu_num(tmp_path, monkeypatch):
    fake_gpus(tmp_path, monkeypatch, 0)
    path = v1_config(tmp_path, gpuNum=1)
    done = cli("run", path)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    line = open(path).read().splitlines().index("  gpuNum: 1") + 1
    assert done.stderr.strip().splitlines() == [
        f"trialkit: error: {path}:{line}: trial.gpuNum: each trial asks for 1 GPU but this machine holds 0 (none) "
        "(leave it out; trialGpuNumber in a v2 config)"]


def test_a_v1_code_dir_holding_the_experiments_names_trial_code_dir(tmp_path, monkeypatch):
    code = tmp_path / "code"
    monkeypatch.setenv("TRIALKIT_HOME", str(code / "home"))
    path = v1_config(tmp_path)
    done = cli("run", path)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    code_dir = open(path).read().splitlines().index("  codeDir: .") + 1
    assert line.startswith(f"trialkit: error: {path}:{code_dir}: trial.codeDir: the experiment dir {code / 'home'}"), line
    assert line.endswith("; trialCodeDirectory in a v2 config)"), line
