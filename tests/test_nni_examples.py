"""NNI's example projects (tests/fixtures/nni, written after NNI's own) run unchanged
under `trialkit run` with a Python where nni is NOT installed: the one a user of
those examples brings, scikit-learn and no nni (tools/sklearn_venv.sh), first on
PATH as an activated venv puts it. trialkit's nni (trialkit/shims/nni) serves
their calls; a real process per trial, a real manager, the store on disk.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiment_util import cli, experiment_id
from harness import free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "tests" / "fixtures" / "nni"


@pytest.fixture(scope="module")
def user_python():
    done = subprocess.run(["bash", str(ROOT / "tools" / "sklearn_venv.sh")], capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        pytest.fail(f"cannot prepare the scikit-learn venv: {done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def user_env(tmp_path, user_python):
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ["TRIALKIT_HOME"] = str(tmp_path / "home")
    environ["PATH"] = f"{user_python.parent}{os.pathsep}{environ['PATH']}"  # `python3` is the user's
    assert subprocess.run(["python3", "-c", "import nni"], env=environ, capture_output=True).returncode != 0
    return environ


def project(tmp_path: Path, name: str, trials: int) -> Path:
    """A copy of the example; only its trial count is cut (this machine is small), the rest as NNI ships it."""
    folder = shutil.copytree(EXAMPLES / name, tmp_path / name)
    config = yaml.safe_load((folder / "config.yml").read_text())
    config["maxTrialNumber"] = trials
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    return folder / "config.yml"


def test_nnis_sklearn_classification_runs_where_nni_is_not_installed(tmp_path, user_env):
    done = cli("run", project(tmp_path, "sklearn-classification", 3), env=user_env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = export_in(experiment_id(done.stdout.splitlines()[0]), user_env)
    assert [row["status"] for row in rows] == ["SUCCEEDED"] * 3, rows
    assert all(0.5 < row["final"] <= 1.0 for row in rows), rows  # SVC on the digits: an accuracy


def test_nnis_mnist_shape_with_merge_parameter_reports_every_epoch(tmp_path, user_env):
    done = cli("run", project(tmp_path, "digits-merge-parameter", 2), env=user_env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    rows = export_in(exp, user_env)
    assert [row["status"] for row in rows] == ["SUCCEEDED"] * 2, rows
    for row in rows:
        assert len(row["intermediate"]) == 5 and row["intermediate"][-1] == row["final"]
        logs = cli("trial", "logs", row["trial_id"], env=user_env)
        assert f"trial {row['trial_id']} of {exp} (#{row['sequence']})" in logs.stdout, logs.stdout
        assert f"'lr': {row['parameters']['lr']}" in logs.stdout  # merge_parameter took the tuner's value


def test_nnis_quickstart_notebook_runs_in_the_users_python_with_trialkit_and_no_nni(tmp_path):
    """NNI's notebooks start experiments from the user's own Python (`from nni.experiment import Experiment`):
    here this checkout's, where trialkit is installed (its .pth, setup.py) and nni is not."""
    main = shutil.copytree(EXAMPLES / "hpo-quickstart", tmp_path / "hpo-quickstart") / "main.py"
    text = main.read_text()
    assert "max_trial_number = 10" in text and "run(8080)" in text
    # Only the trial count (this machine is small) and the port (tests run side by side) are cut.
    main.write_text(text.replace("max_trial_number = 10", "max_trial_number = 3").replace("run(8080)",
                                                                                         f"run({free_port()})"))
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ["TRIALKIT_HOME"] = str(tmp_path / "home")
    no_nni = "import importlib.metadata as m\ntry: m.distribution('nni')\nexcept m.PackageNotFoundError: print('none')"
    assert subprocess.run([sys.executable, "-c", no_nni], capture_output=True, text=True).stdout == "none\n"
    done = subprocess.run([sys.executable, main.name], cwd=main.parent, env=environ, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trialkit's nni serves" in done.stderr
    rows = export_in(re.search(r"started experiment (\S+)", done.stdout).group(1), environ)
    assert [row["status"] for row in rows] == ["SUCCEEDED"] * 3, rows
    assert all(len(row["intermediate"]) == 5 and 0 < row["final"] < 1 for row in rows), rows


def export_in(exp: str, environ) -> list:
    done = cli("experiment", "export", exp, env=environ)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
