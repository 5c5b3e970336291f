"""A Kubernetes trial gets its code and trialkit's trial side from the manager.

The platform packs the experiment's code dir once (context.py's rules), keeps
it and the trial-side archive where the manager serves them
(manager/archives.py), and names both by digest in the pods' environment;
run.sh fetches them with the trial's token (scripts/fetch.py). Here a real
manager on loopback serves what a real submission (against the fake API
server) kept, and run.sh runs with the rendered pod's environment in a
Python that has no trialkit and no third-party package at all.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

import k8s_schemas
from keeper_util import ROOT, RUN_SH, TIMEOUT
from test_kube_client import api, client  # noqa: F401 (fixtures)
from trialkit.control.config import load_config
from trialkit.errors import UserError
from trialkit.manager import archives
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
from trialkit.platforms import context, trialside
from trialkit.platforms.base import TrialSpec
from trialkit.platforms.kubernetes import frameworkcontroller, kubeflow
from trialkit.platforms.kubernetes import platform as k8s_platform
from trialkit.platforms.kubernetes import render as k8s

TRAIN = """\
import os, sys
import trialkit
params = trialkit.get_next_parameter()
trialkit.report_intermediate_result(params["lr"] * 5)
trialkit.report_final_result(params["lr"] * 9)
print("trialkit from", trialkit.__file__, "hook", os.environ.get("FROM_HOOK"), "psutil" in sys.modules)
"""

# shared/seeds/004, NNI's Kubeflow page: its Python experiment config written as YAML.
KUBEFLOW_SEED = """
searchSpace: {lr: {_type: choice, _value: [0.1]}}
tuner: {name: TPE, classArgs: {optimize_mode: maximize}}
maxTrialNumber: 10
trialConcurrency: 2
trialCodeDirectory: code
nniManagerIp: 10.20.30.41
trainingService:
  platform: kubeflow
  operator: pytorch-operator
  apiVersion: v1alpha2
  storage: {storageType: nfs, server: 10.20.30.40, path: /mnt/nfs/nni}
  worker: {replicas: 2, command: python3 model.py, gpuNumber: 1, cpuNumber: 1, memorySize: 4g,
           codeDirectory: code, dockerImage: msranni/nni:latest}
  master: {replicas: 1, command: python3 model.py, gpuNumber: 0, cpuNumber: 1, memorySize: 4g,
           codeDirectory: code, dockerImage: msranni/nni:latest}
"""

# shared/seeds/001, NNI's FrameworkController page (v1), its code dir here.
FRAMEWORK_SEED = """
authorName: default
experimentName: example_mnist
trialConcurrency: 1
maxTrialNum: 100
nniManagerIp: 10.20.30.41
trainingServicePlatform: frameworkcontroller
searchSpacePath: search_space.json
tuner: {builtinTunerName: TPE, classArgs: {optimize_mode: maximize}}
trial:
  codeDir: code
  taskRoles:
    - name: worker
      taskNum: 1
      command: python3 mnist.py
      gpuNum: 1
      cpuNum: 1
      memoryMB: 8192
      image: msranni/nni:latest
      frameworkAttemptCompletionPolicy: {minFailedTaskCount: 1, minSucceededTaskCount: 1}
frameworkcontrollerConfig:
  storage: nfs
  nfs: {server: 10.1.1.1, path: /exports/nni}
"""


def code_dir(root: Path) -> Path:
    code = root / "code"
    (code / "data").mkdir(parents=True)
    (code / "train.py").write_text(TRAIN)
    (code / "data" / "big.bin").write_bytes(b"x" * 4096)  # ignored: never shipped
    (code / ".trialignore").write_text("data/\n")
    (code / "startup-hook.sh").write_text('export FROM_HOOK="hooked"\n')
    return code


def load(tmp_path: Path, text: str):
    (tmp_path / "search_space.json").write_text('{"lr": {"_type": "choice", "_value": [0.1]}}')
    path = tmp_path / "config.yml"
    path.write_text(text)
    return load_config(path)


def spec_of(trial: str = "a1", experiment: str = "expA", token: str = "tok-a", url: str = "http://127.0.0.1:8081"):
    return TrialSpec(experiment, trial, 1, "python3 train.py",
                     env={"TRIALKIT_TOKEN": token, "TRIALKIT_MANAGER_URL": url, "TRIALKIT_PARAMETERS": '{"lr": 0.1}'})


def pod_envs(objects) -> list:
    return [{e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
            for t in k8s_schemas.pod_templates(objects[-1]) for c in t["spec"]["containers"]]


# --- rendering -------------------------------------------------------------------


@pytest.mark.parametrize("seed, module", [(KUBEFLOW_SEED, kubeflow), (FRAMEWORK_SEED, frameworkcontroller)])
def test_seed_configs_render_pods_that_fetch_the_packed_code_dir(tmp_path, seed, module):
    code = code_dir(tmp_path)
    config = load(tmp_path, seed)
    objects = module.render(config.training_service, spec_of())
    k8s_schemas.validate_objects(objects)
    code_digest = hashlib.sha256(context.pack(code)).hexdigest()
    side_digest = hashlib.sha256(trialside.pack()).hexdigest()
    envs = pod_envs(objects)
    assert envs and all(env["TRIALKIT_CODE_DIGEST"] == code_digest for env in envs)
    assert all(env["TRIALKIT_TRIALSIDE_DIGEST"] == side_digest for env in envs)
    configmap = next(o for o in objects if o["kind"] == "ConfigMap")
    assert configmap["data"]["fetch.py"] == (ROOT / "scripts" / "fetch.py").read_text()


def test_a_roles_own_code_directory_is_shipped_to_its_pods(tmp_path):
    code_dir(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.py").write_text("print('the worker')\n")
    config = load(tmp_path, KUBEFLOW_SEED.replace("codeDirectory: code, dockerImage", "codeDirectory: other, dockerImage", 1))
    job = kubeflow.render(config.training_service, spec_of())[-1]
    digests = {kind: pod_envs([{**job, "spec": {"pytorchReplicaSpecs": {kind: spec}}}])[0]["TRIALKIT_CODE_DIGEST"]
               for kind, spec in job["spec"]["pytorchReplicaSpecs"].items()}
    assert digests["Worker"] == hashlib.sha256(context.pack(other)).hexdigest() != digests["Master"]


def test_a_misspelt_code_key_is_refused_not_ignored(tmp_path):
    code_dir(tmp_path)
    with pytest.raises(UserError, match="codeDirectoryy"):
        load(tmp_path, KUBEFLOW_SEED.replace("codeDirectory: code, dockerImage", "codeDirectoryy: code, dockerImage", 1))


def test_code_in_the_image_ships_nothing_and_runs_in_working_dir(tmp_path):
    code = code_dir(tmp_path)
    (code / "huge.bin").write_bytes(b"")
    os.truncate(code / "huge.bin", context.LIMIT_BYTES + 1)  # sparse: over the limit, yet never packed
    text = KUBEFLOW_SEED.replace("codeDirectory: code, ", "").replace("  operator:", "  workingDir: /workspace\n  operator:")
    config = load(tmp_path, text)
    objects = kubeflow.render(config.training_service, spec_of())
    k8s_schemas.validate_objects(objects)
    assert all("TRIALKIT_CODE_DIGEST" not in env for env in pod_envs(objects))
    containers = [c for t in k8s_schemas.pod_templates(objects[-1]) for c in t["spec"]["containers"]]
    assert {c["workingDir"] for c in containers} == {"/workspace"}


def test_render_of_a_code_dir_over_the_limit_is_one_line_and_writes_nothing(tmp_path):
    code = code_dir(tmp_path)
    (code / "weights.bin").write_bytes(b"")
    os.truncate(code / "weights.bin", context.LIMIT_BYTES + 1)
    (tmp_path / "search_space.json").write_text('{"lr": {"_type": "choice", "_value": [0.1]}}')
    (tmp_path / "config.yml").write_text(FRAMEWORK_SEED)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "trialkit.cli", "render", str(tmp_path / "config.yml"), "-o", str(out)],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "over the 95.0 MB limit" in done.stderr and "weights.bin" in done.stderr and ".trialignore" in done.stderr
    assert not out.exists()
    with pytest.raises(UserError, match="over the 95.0 MB limit"):
        load(tmp_path, FRAMEWORK_SEED)  # as `trialkit run` loads it: refused before the manager starts


def test_a_pod_whose_run_sh_gave_up_fails_the_trial_with_its_reason():
    pod = {"metadata": {"name": "tk-e-t-master-0"}, "spec": {"containers": [{"name": "pytorch", "command": k8s.RUN_COMMAND}]},
           "status": {"containerStatuses": [{"name": "pytorch", "state": {"terminated": {
               "exitCode": 127, "message": "no usable Python in the image: python3 is not found; install python3"}}}]}}
    status = k8s_platform.trial_status(kubeflow.job_status({"status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "PyTorchJobFailed"}]}}), [pod])
    assert status.status == "FAILED" and status.exit_code == 127
    assert status.reason.startswith("tk-e-t-master-0: no usable Python in the image: python3 is not found")


# --- run.sh in a pod's place -----------------------------------------------------


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python with the standard library only: no trialkit, no psutil, requests or yaml."""
    where = tmp_path_factory.mktemp("bare")
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(where)
    python = str(where / "bin" / "python3")
    probe = subprocess.run([python, "-c", "import trialkit"], capture_output=True, cwd=where)
    assert probe.returncode != 0, "the bare Python must not import trialkit"
    return python


@pytest.fixture
def manager(tmp_path):
    """A real manager on loopback; experiments expA (trial a1, token tok-a) and expB (b1, tok-b) in its store."""
    store = Store.in_dir(tmp_path / "experiment")
    for experiment, trial, token in (("expA", "a1", "tok-a"), ("expB", "b1", "tok-b")):
        store.create_experiment(experiment)
        store.add_trial(experiment, trial, sequence=1, parameters={"lr": 0.1}, token=token)
    server = ManagerServer(store).start()
    yield server
    server.stop()
    store.close()


def submitted_env(tmp_path, manager, client) -> dict:  # noqa: F811 (fixture)
    """The rendered pod's environment after a real submission (against the fake API server)."""
    code_dir(tmp_path)
    config = load(tmp_path, FRAMEWORK_SEED.replace("python3 mnist.py", "python3 train.py"))
    platform = frameworkcontroller.Platform(config.training_service, manager.store.path.parent, client=client)
    platform.submit(spec_of(url=manager.url))
    objects = list(yaml.safe_load_all((manager.store.path.parent / "trials" / "a1" / "kubernetes.yaml").read_text()))
    env = {k: v for k, v in pod_envs(objects)[0].items() if isinstance(v, str)}
    return {**env, "TRIALKIT_TOKEN": "tok-a", "TRIALKIT_MANAGER_URL": manager.url}


def run_pod(env: dict, tmp_path: Path, python: str) -> subprocess.CompletedProcess:
    pod = {**env, "PATH": f"{Path(python).parent}:/usr/bin:/bin", "TRIALKIT_PYTHON": python,
           "TRIALKIT_TRIAL_DIR": str(tmp_path / "pod" / "trial"), "TRIALKIT_TERMINATION_LOG": str(tmp_path / "termination")}
    (tmp_path / "pod").mkdir(exist_ok=True)
    return subprocess.run(["sh", RUN_SH], env=pod, cwd=tmp_path / "pod", capture_output=True, text=True, timeout=TIMEOUT)


def test_a_pod_without_trialkit_fetches_code_and_trial_side_and_reports(tmp_path, manager, client, bare_python):  # noqa: F811
    env = submitted_env(tmp_path, manager, client)
    done = run_pod(env, tmp_path, bare_python)
    assert done.returncode == 0, done.stderr
    trial = tmp_path / "pod" / "trial"
    side = trial / ".trialkit" / "trialside" / env["TRIALKIT_TRIALSIDE_DIGEST"]
    # The training code imported the fetched trialkit, ran after the hook, in a Python without psutil.
    assert f"trialkit from {side}/trialkit/__init__.py hook hooked False" in done.stdout
    assert sorted(p.name for p in (trial / "code").iterdir()) == [".trialignore", "startup-hook.sh", "train.py"]
    assert [r["value"] for r in manager.store.records_for("a1", "PERIODICAL")] == [pytest.approx(0.5)]
    assert [r["value"] for r in manager.store.records_for("a1", "FINAL")] == [pytest.approx(0.9)]
    # A restarted container finds both in the pod's cache: the manager is not asked again.
    for path in (manager.store.path.parent / archives.ARCHIVES_DIR / "expA").iterdir():
        path.unlink()
    again = run_pod(env, tmp_path, bare_python)
    assert again.returncode == 0, again.stderr


def test_a_pod_without_trialkit_asked_for_an_object_store_fails_before_training_saying_why(tmp_path, manager, client,  # noqa: F811
                                                                                            bare_python):
    env = {**submitted_env(tmp_path, manager, client),
           "TRIALKIT_CHECKPOINT_STORE": json.dumps({"type": "s3", "bucket": "ckpts", "prefix": "p"})}
    done = run_pod(env, tmp_path, bare_python)
    assert done.returncode == 1, done.stderr
    assert "needs trialkit in the image, with its checkpoints extra" in done.stderr
    assert "Traceback" not in done.stderr and "trialkit from" not in done.stdout  # training never started
    assert manager.store.records_for("a1", "PERIODICAL") == []


def test_bytes_that_do_not_match_the_digest_are_refused(tmp_path, manager, client, bare_python):  # noqa: F811
    env = submitted_env(tmp_path, manager, client)
    kept = archives.archive_path(manager.store.path.parent, "expA", env["TRIALKIT_CODE_DIGEST"])
    kept.write_bytes(context.pack(tmp_path / "code") + b"tampered")
    done = run_pod(env, tmp_path, bare_python)
    assert done.returncode == 1
    assert "not " + env["TRIALKIT_CODE_DIGEST"] in done.stderr and "refused" in done.stderr
    assert "trialkit from" not in done.stdout and not (tmp_path / "pod" / "trial" / "code").exists()
    status = json.loads((tmp_path / "pod" / "trial" / ".trialkit" / "status.json").read_text())
    assert (status["status"], status["reason"]) == ("FAILED", "the experiment's code could not be fetched from the manager")
    assert (tmp_path / "termination").read_text().startswith("the experiment's code could not be fetched")


@pytest.mark.parametrize("trial, token, answer", [("b1", "tok-b", "404"), ("a1", "tok-b", "403"), ("a1", "nope", "401")])
def test_only_the_experiments_own_trial_tokens_get_its_archives(tmp_path, manager, client, bare_python,  # noqa: F811
                                                               trial, token, answer):
    env = {**submitted_env(tmp_path, manager, client), "TRIALKIT_TRIAL_ID": trial, "TRIALKIT_TOKEN": token}
    done = run_pod(env, tmp_path, bare_python)
    assert done.returncode == 1 and f"the manager answered {answer}" in done.stderr
    assert "trialkit from" not in done.stdout


def test_an_image_without_python_fails_before_training_with_the_reason(tmp_path, manager, client):  # noqa: F811
    env = submitted_env(tmp_path, manager, client)
    done = run_pod(env, tmp_path, str(tmp_path / "no-such" / "python3"))
    assert done.returncode == 127
    said = (tmp_path / "termination").read_text()
    assert said.startswith("no usable Python in the image: ") and "is not found" in said
    status = json.loads((tmp_path / "pod" / "trial" / ".trialkit" / "status.json").read_text())
    assert (status["status"], status["reason"]) == ("FAILED", "no usable Python in the image")
    assert manager.store.records_for("a1") == []  # nothing was tried, nothing reported


# --- the trial side: the standard library only ------------------------------------

IMPORT_ALL = """
import sys, pathlib
root = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(root))
before = set(sys.modules)
for path in sorted(root.rglob("*.py")):
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] in ("__main__", "sitecustomize"):
        continue  # they run as they load: the keeper's main, the boot hook
    __import__(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
ours = ("trialkit", "nni", "determined")
print(sorted(name for name in set(sys.modules) - before
             if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] not in ours))
"""


def test_every_trial_side_module_imports_in_a_bare_python(tmp_path, bare_python):
    where = tmp_path / "side"
    context.unpack(trialside.pack(), where)
    done = subprocess.run([bare_python, "-c", IMPORT_ALL, str(where)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", "a module from outside the standard library was imported"


def test_the_archive_holds_every_trialkit_module_its_modules_import():
    import ast

    held = {path[: -len(".py")].replace("/", ".").removesuffix(".__init__") for path in trialside.files()}
    wanted = set()
    for path in trialside.files():
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("trialkit"):
                wanted.add(node.module)
                wanted.update(f"{node.module}.{a.name}" for a in node.names if (ROOT / node.module.replace(".", "/") / f"{a.name}.py").exists())
            elif isinstance(node, ast.Import):
                wanted.update(a.name for a in node.names if a.name.startswith("trialkit"))
    # nni.experiment's lazy import of the control plane's Python API: in a pod it says the API is not there
    # (the one arrow up, tests/test_layering.py's EXCEPTIONS).
    wanted.discard("trialkit.experiment")
    assert wanted and wanted <= held, f"missing from the archive: {sorted(wanted - held)}"
