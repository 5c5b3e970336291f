"""A local trial runs its command in the user's environment, as NNI's do.

The user's environment here is the real nni 3.0's venv (tools/nni_venv.sh),
apart from trialkit's: its bin dir first on the PATH that starts the experiment
makes its `python3` the trial's, while the keeper stays on trialkit's Python.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from experiment_util import cli, experiment_id, export
from harness import ROOT

NNI_MAIN = """
import nni
params = nni.get_next_parameter()
nni.report_intermediate_result({"default": params["x"] / 2, "loss": 1 - params["x"]})
nni.report_final_result({"default": params["x"], "loss": 1 - params["x"]})
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def nni_python() -> str:
    done = subprocess.run(["bash", str(ROOT / "tools" / "nni_venv.sh")], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"cannot prepare the nni 3.0 venv: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def nni_project(tmp_path: Path, main: str) -> Path:
    """NNI's layout: main.py, search_space.json, config.yml with `python3 main.py`."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "main.py").write_text(textwrap.dedent(main))
    config = {"searchSpace": {"x": {"_type": "choice", "_value": [0.25, 0.75]}}, "trialCommand": "python3 main.py",
              "trialCodeDirectory": ".", "trialConcurrency": 1, "maxTrialNumber": 2,
              "tuner": {"name": "GridSearch"}, "trainingService": {"platform": "local"}}
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    return folder / "config.yml"


def user_shell(first_on_path: str) -> dict:
    """The environment of a user whose shell has `first_on_path` first on PATH."""
    environ = dict(os.environ)
    environ["PATH"] = first_on_path + os.pathsep + "/usr/bin:/bin"
    return environ


def test_python3_on_the_users_path_runs_the_trial_and_its_nni_results_are_stored(tmp_path, nni_python, home):
    config = nni_project(tmp_path, NNI_MAIN)
    # trialkit itself is started by its full path: only the trial's `python3` comes from PATH.
    done = cli("run", config, env=user_shell(os.path.dirname(nni_python)))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = sorted(export(experiment_id(done.stdout.splitlines()[0])), key=lambda row: row["parameters"]["x"])
    assert [(row["status"], row["final"]) for row in rows] == [
        ("SUCCEEDED", {"default": 0.25, "loss": 0.75}), ("SUCCEEDED", {"default": 0.75, "loss": 0.25})]
    assert rows[0]["intermediate"] == [{"default": 0.125, "loss": 0.75}]


def test_a_trial_that_cannot_import_the_sdk_names_the_interpreter_that_ran_it(tmp_path, nni_python, home):
    # nni's venv has no trialkit, and `-I` keeps the keeper's PYTHONPATH (trialkit/shims, which would
    # serve trialkit there: tests/test_shims.py) out: `import trialkit` fails.
    config = nni_project(tmp_path, "import trialkit\n")
    config.write_text(config.read_text().replace("python3 main.py", "python3 -I main.py"))
    done = cli("run", config, env=user_shell(os.path.dirname(nni_python)))
    assert done.returncode == 1, done.stdout + done.stderr
    rows = export(experiment_id(done.stdout.splitlines()[0]))
    assert {row["status"] for row in rows} == {"FAILED"}
    log = (Path(rows[0]["trial_dir"]) / "trial.log").read_text()
    hints = [line for line in log.splitlines() if "hint:" in line]
    assert hints == [f"trialkit-keeper: hint: the trial's command ran on {os.path.dirname(nni_python)}/python3, "
                     f"which cannot import trialkit: install it there ({os.path.dirname(nni_python)}/python3 -m pip "
                     "install trialkit), or start the experiment with the environment that has it first on PATH"]


def test_the_quickstart_runs_with_the_environment_bootstrap_demo_gives_it(tmp_path, home):
    # `./bootstrap.sh demo` puts the project's venv first on PATH; the rest of
    # this PATH has no trialkit (the system's python3).
    assert 'PATH="$venv/bin:$PATH" "$venv/bin/trialkit" run examples/quickstart/config.yml' in \
        (ROOT / "bootstrap.sh").read_text()
    project = tmp_path / "quickstart"
    shutil.copytree(ROOT / "examples" / "quickstart", project)
    config = yaml.safe_load((project / "config.yml").read_text())
    config.update(maxTrialNumber=2, tuner={"name": "Random", "classArgs": {"optimize_mode": "maximize"}})
    (project / "config.yml").write_text(yaml.safe_dump(config))
    done = cli("run", project / "config.yml", env=user_shell(os.path.dirname(sys.executable)), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {row["status"] for row in export(experiment_id(done.stdout.splitlines()[0]))} == {"SUCCEEDED"}
