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
from harness import free_port, wait_until

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
    # SVC on the digits: accuracies (the sigmoid kernel may score under 0.5; the notebook's test saw it)
    assert all(0.0 <= row["final"] <= 1.0 for row in rows), rows


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


def no_pythonpath(tmp_path: Path, **extra: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ["TRIALKIT_HOME"] = str(tmp_path / "home")
    environ.update(extra)
    return environ


def test_nnis_mnist_tfv2_launch_py_runs_with_use_active_gpu_and_no_gpu_number(tmp_path):
    """NNI's launch.py sets use_active_gpu and no GPU number; NNI runs it, and so does trialkit, saying that
    no GPU is scheduled. Its mnist.py (TensorFlow on MNIST, neither here) is a stand-in of the same calls."""
    launch = shutil.copytree(EXAMPLES / "mnist-tfv2", tmp_path / "mnist-tfv2") / "launch.py"
    text = launch.read_text()
    assert "use_active_gpu = True" in text and "trial_gpu_number" not in text
    # Only the trial count (this machine is small) and the port (tests run side by side) are cut.
    launch.write_text(text.replace("max_trial_number = 10", "max_trial_number = 3").replace(
        "run(8080)", f"run({free_port()})"))
    environ = no_pythonpath(tmp_path)
    done = subprocess.run([sys.executable, str(launch)], cwd=tmp_path, env=environ, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    notes = [line for line in done.stdout.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith("note: useActiveGpu: true without trialGpuNumber: no GPU is "
                                                   "scheduled, as in NNI"), done.stdout
    rows = export_in(re.search(r"started experiment (\S+)", done.stdout).group(1), environ)
    assert [row["status"] for row in rows] == ["SUCCEEDED"] * 3, rows
    assert all(len(row["intermediate"]) == 3 and row["intermediate"][-1] == row["final"] for row in rows), rows


def test_nnis_python_api_start_notebook_runs_as_a_script(tmp_path, user_python):
    """The notebook's cells as one script, in the user's Python (trialkit, no nni); its trials run the
    sklearn example's main.py in the venv that has scikit-learn, first on PATH."""
    folder = shutil.copytree(EXAMPLES / "sklearn-python-api", tmp_path / "sklearn")
    for name in ("main.py", "search_space.json"):
        shutil.copy(EXAMPLES / "sklearn-classification" / name, folder / name)
    script = folder / "python_api_start.py"
    script.write_text(script.read_text().replace("start(8080)", f"start({free_port()})"))  # side by side
    environ = no_pythonpath(tmp_path, PATH=f"{user_python.parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run([sys.executable, script.name], cwd=folder, env=environ, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("started experiment ") and lines[2].startswith("note: useActiveGpu: true"), lines
    assert lines[3] == "RUNNING", lines
    assert "TrialResult(parameter={" in done.stdout and "TrialMetricData(" in done.stdout, done.stdout
    rows = export_in(lines[0].split()[2], environ)
    assert "SUCCEEDED" in [row["status"] for row in rows], rows
    finals = [row["final"] for row in rows if row["status"] == "SUCCEEDED"]
    # Accuracies, and the search found a real model; one trial may score low (an SVC with the sigmoid kernel on
    # the digits can: seen below 0.5 in a whole-suite run).
    assert all(0.0 <= final <= 1.0 for final in finals) and max(finals) > 0.5, rows


def test_nnis_kubeflow_docs_python_example_runs_with_only_its_host_names_changed(tmp_path):
    """NNI's Kubeflow page (the seed) writes KubeflowRowConfig, operator and api_version on the experiment's
    config and a master with no docker_image: each is taken, with a note where trialkit differs, and the
    trials go to the cluster (here an API server stand-in) as PyTorchJobs."""
    from k8s_fake_api import FakeApiServer

    main = shutil.copytree(EXAMPLES / "kubeflow-seed", tmp_path / "kubeflow-seed") / "main.py"
    main.write_text(main.read_text().replace("run(8080)", f"run({free_port()})"))  # side by side
    with FakeApiServer() as api:
        environ = no_pythonpath(tmp_path, KUBECONFIG=str(api.kubeconfig(tmp_path)))
        proc = subprocess.Popen([sys.executable, main.name], cwd=main.parent, env=environ, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            started = proc.stdout.readline()
            exp = re.search(r"started experiment (\S+)", started).group(1)
            wait_until(lambda: len(jobs(api.objects)) == 2, 60, "the first two trials submitted")
            seen = json.loads(json.dumps(api.objects))  # as submitted: the stop deletes them
            stopped = cli("experiment", "stop", exp, env=environ)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            out, err = proc.stdout.read(), proc.stderr.read()  # not communicate(): it skips what readline buffered
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, out + err
    notes = [line for line in (started + out).splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: operator and api_version on the experiment's config (NNI 2.x's place) are the training service's; "
        "api_version v1alpha2: the job is rendered as kubeflow.org/v1, the one version training-operator serves",
        "note: training_service.master has no docker_image: it runs NNI's default, msranni/nni:latest (trialkit's "
        "trial side is fetched into it as it starts)"], started + out
    job = seen[jobs(seen)[0]]
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    for kind in ("Master", "Worker"):
        assert replicas[kind]["template"]["spec"]["containers"][0]["image"] == "msranni/nni:latest"


def jobs(objects: dict) -> list:
    return [path for path in objects if path.startswith("/apis/kubeflow.org/v1/") and "/pytorchjobs/" in path]
