"""A script written against the real nni 3.0 package runs under trialkit's keeper unchanged.

nni lives in a venv of its own (tools/nni_venv.sh, cached under ~/.cache/trialkit)
because it pins old versions of packages trialkit's environment shares.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import yaml

from harness import ROOT, Manager, start_keeper


@pytest.fixture(scope="session")
def nni_python():
    done = subprocess.run(["bash", str(ROOT / "tools" / "nni_venv.sh")], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"cannot prepare the nni 3.0 venv: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


NNI_TRIAL = """
import json, nni
params = nni.get_next_parameter()
print("PARAMS " + json.dumps(params), flush=True)
for i in range(20):
    nni.report_intermediate_result({"default": i * params["lr"], "it's \\"quoted\\"": i})
nni.report_final_result(0.99)
"""


@pytest.mark.parametrize("platform, source", [("kubeflow", "stdout"), ("local", "nni")])
def test_a_script_using_real_nni_gets_its_parameters_and_delivers_every_metric(tmp_path, nni_python, platform,
                                                                                 source):
    manager = Manager(tmp_path / "exp")
    manager.register("t1", "token-1", {"lr": 0.5})
    manager.start()
    try:
        script = tmp_path / "nni_trial.py"
        script.write_text(NNI_TRIAL)
        keeper = start_keeper(tmp_path / "trial", [nni_python, str(script)], manager=manager,
                              TRIALKIT_PLATFORM=platform, TRIALKIT_PARAMETERS='{"lr": 0.5}', TRIALKIT_PARAMETER_ID="5")
        _, err = keeper.communicate(timeout=120)
        assert keeper.returncode == 0, err
        assert "malformed" not in err
        # nni in local mode sends the script's stdout to $NNI_OUTPUT_DIR/trial.log (the trial dir here).
        log = tmp_path / "trial" / ("trial.log" if platform == "local" else "stdout.log")
        assert 'PARAMS {"lr": 0.5}' in log.read_text()
        stored = manager.store.records_for("t1")
        metrics = [r for r in stored if r["type"] != "STATUS"]
        assert [(r["type"], r["sequence"], r["value"]) for r in metrics] == [
            ("PERIODICAL", i, {"default": i * 0.5, "it's \"quoted\"": i}) for i in range(20)] + [("FINAL", 0, 0.99)]
        assert {r["source"] for r in metrics} == {source}
        assert {r["parameter_id"] for r in metrics} == {5}
        assert [r["value"]["status"] for r in stored if r["type"] == "STATUS"] == ["RUNNING", "SUCCEEDED"]
        cfg = json.loads((tmp_path / "trial" / "parameter.cfg").read_text())
        assert cfg == {"parameter_id": 5, "parameter_source": "algorithm", "parameters": {"lr": 0.5},
                       "parameter_index": 0}
    finally:
        manager.close()


# -- NNI's configs load as NNI loads them --------------------------------------------------------

# NNI 3.0's nni.experiment config classes for the platforms trialkit has (local, kubeflow,
# frameworkcontroller; NNI has no adaptdl or ray class), and the ones every config uses.
NNI_CLASSES = ("ExperimentConfig", "AlgorithmConfig", "CustomAlgorithmConfig", "LocalConfig", "KubeflowConfig",
               "KubeflowRoleConfig", "FrameworkControllerConfig", "FrameworkControllerRoleConfig",
               "FrameworkAttemptCompletionPolicy", "K8sStorageConfig", "K8sNfsConfig", "K8sAzureStorageConfig")

# The same Kubeflow experiment, built with NNI's classes; `nni` is the module they come from.
KUBEFLOW_EXPERIMENT = """
c = nni.ExperimentConfig('kubeflow')
c.trial_command = 'python3 m.py'
c.search_space = {'lr': {'_type': 'choice', '_value': [1, 2]}}
c.trial_concurrency = 1
c.trial_code_directory = CODE
c.tuner = nni.AlgorithmConfig(name='TPE', class_args={'optimize_mode': 'maximize'})
ts = c.training_service
ts.operator = 'pytorch-operator'
ts.api_version = 'v1'
ts.storage = nni.K8sNfsConfig(storage_type='nfs', server='10.0.0.1', path='/x')
role = dict(command='python3 m.py', gpu_number=0, cpu_number=1, memory_size='1g', docker_image='img', code_directory=CODE)
ts.master = nni.KubeflowRoleConfig(replicas=1, **role)
ts.worker = nni.KubeflowRoleConfig(replicas=2, **role)
c.nni_manager_ip = '10.0.0.2'
"""


def test_nnis_config_classes_are_importable_from_trialkit_experiment(nni_python):
    done = subprocess.run([nni_python, "-c", "import json, nni.experiment as e; print(json.dumps(dir(e)))"],
                          capture_output=True, text=True, timeout=120)
    assert set(NNI_CLASSES) <= set(json.loads(done.stdout)), done.stderr  # they are NNI's names
    import trialkit.experiment

    assert [name for name in NNI_CLASSES if not hasattr(trialkit.experiment, name)] == []


def test_a_config_built_with_nnis_classes_loads_as_with_trialkits(tmp_path, nni_python):
    from trialkit import experiment
    from trialkit.control.config import parse_config

    (tmp_path / "m.py").write_text("print(1)\n")
    code = f"CODE = {str(tmp_path)!r}\n"
    saved = subprocess.run([nni_python, "-c", "import json, nni.experiment as nni\n" + code + KUBEFLOW_EXPERIMENT
                            + "print(json.dumps(c.json()))"], capture_output=True, text=True, timeout=120)
    assert saved.returncode == 0, saved.stderr
    from_nni = parse_config(json.loads(saved.stdout), str(tmp_path), source="nni's json()")  # NNI's own output
    scope = {"nni": experiment}
    exec(code + KUBEFLOW_EXPERIMENT, scope)
    ours = scope["c"].validate(str(tmp_path))
    # NNI's json() also writes its defaults; of them, only its experiments' dir is a setting trialkit keeps.
    assert from_nni.experiment_working_directory == os.path.expanduser("~/nni-experiments")
    assert ours == dataclasses.replace(from_nni, experiment_working_directory=None)
    assert ours.training_service.common.nfs.server == "10.0.0.1"
    assert [role.count for role in ours.training_service.roles] == [1, 2]
    # What NNI writes and trialkit reads without acting on is said, not refused.
    assert from_nni.notes == ("reuseMode: true: trialkit runs each trial as its own job, as NNI does with "
                              "reuseMode: false",)


FRAMEWORK = """
apiVersion: frameworkcontroller.microsoft.com/v1
kind: Framework
metadata: {name: tfdist}
spec:
  executionType: Start
  taskRoles:
  - name: ps
    taskNumber: 1
    task:
      pod:
        spec:
          restartPolicy: Never
          containers:
          - name: tensorflow
            image: frameworkcontroller/tensorflow-examples:cpu
            command: [sh, -c, "python3 main.py --job_name=ps"]
          volumes: [{name: data, emptyDir: {}}]
  - name: worker
    taskNumber: 2
    frameworkAttemptCompletionPolicy: {minFailedTaskCount: 1, minSucceededTaskCount: 2}
    task:
      gpuNum: 0
      memoryMB: 4096
      pod:
        spec:
          containers:
          - {name: tensorflow, image: "frameworkcontroller/tensorflow-examples:cpu", command: [python3, main.py]}
"""


def test_frameworkcontrollers_config_path_is_the_job_and_its_roles(tmp_path):
    """NNI's custom FrameworkController config: the Framework file's task roles, its pods kept,
    each task's first container the one that runs the keeper (no second copy of the command)."""
    (tmp_path / "main.py").write_text("print(1)\n")
    (tmp_path / "fc.yml").write_text(FRAMEWORK)
    (tmp_path / "config.yml").write_text(yaml.safe_dump({
        "searchSpace": {"lr": {"_type": "choice", "_value": [0.1]}}, "trialCommand": "python3 main.py",
        "tuner": {"name": "TPE"}, "logLevel": "trace", "nniManagerIp": "10.10.10.10",
        "trainingService": {"platform": "frameworkcontroller", "serviceAccountName": "frameworkcontroller",
                            "configPath": "fc.yml", "storage": {"storageType": "nfs", "server": "10.2.3.4",
                                                                "path": "/nni"}}}))
    done = subprocess.run([sys.executable, "-m", "trialkit.cli", "render", "config.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TRIALKIT_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr
    framework = next(o for o in yaml.safe_load_all(done.stdout) if o and o["kind"] == "Framework")
    roles = {role["name"]: role for role in framework["spec"]["taskRoles"]}
    assert [(name, role["taskNumber"]) for name, role in roles.items()] == [("ps", 1), ("worker", 2)]
    assert roles["worker"]["frameworkAttemptCompletionPolicy"] == {"minFailedTaskCount": 1, "minSucceededTaskCount": 2}
    for name, command in (("ps", "sh -c 'python3 main.py --job_name=ps'"), ("worker", "python3 main.py")):
        pod = roles[name]["task"]["pod"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == "frameworkcontroller/tensorflow-examples:cpu"
        assert container["command"][-1].endswith("run.sh")
        assert {e["name"]: e.get("value") for e in container["env"]}["TRIALKIT_COMMAND"] == command
    assert "data" in [v["name"] for v in roles["ps"]["task"]["pod"]["spec"]["volumes"]]  # the template's pod kept
    assert roles["ps"]["task"]["pod"]["spec"]["restartPolicy"] == "Never"


def test_nnis_manager_options_are_noted_not_refused(tmp_path):
    from trialkit.control.config import parse_config

    (tmp_path / "t.py").write_text("")
    config = parse_config({"searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "trialCommand": "python3 t.py",
                           "logLevel": "trace", "debug": True, "nniManagerIp": "10.0.0.9", "tuner": {"name": "Random"},
                           "trainingService": {"platform": "local"}}, str(tmp_path))
    assert [note.split(":")[0] for note in config.notes] == ["logLevel trace", "debug", "nniManagerIp is not used "
                                                             "on the local platform (as in NNI)"]
    assert "notes" not in config.to_dict() and parse_config(config.to_dict(), str(tmp_path)) == config


def test_run_says_the_notes_where_it_starts(tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "t.py").write_text("import trialkit\ntrialkit.report_final_result(1.0)\n")
    (tmp_path / "exp" / "config.yml").write_text(yaml.safe_dump({
        "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "trialCommand": f"{sys.executable} t.py",
        "maxTrialNumber": 1, "logLevel": "trace", "tuner": {"name": "Anneal"},
        "trainingService": {"platform": "local"}}))
    done = subprocess.run([sys.executable, "-m", "trialkit.cli", "run", "config.yml"], cwd=tmp_path / "exp",
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TRIALKIT_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "note: logLevel trace: trialkit's manager has one level" in done.stdout.splitlines()[3]


def test_anneal_takes_nnis_class_args_and_closes_in_on_the_best():
    from trialkit.control.searchspace import parse_space
    from trialkit.control.tuners import build_tuner, check_tuner

    space = parse_space({"x": {"_type": "uniform", "_value": [-5, 5]}, "k": {"_type": "choice", "_value": ["a", "b"]}})
    assert check_tuner("Anneal", None, space) == ("Anneal", {"optimize_mode": "minimize"})  # NNI's default
    tuner = build_tuner("Anneal", {"optimize_mode": "minimize"}, space, 3)
    losses = []
    for _ in range(40):
        parameter_id, params = tuner.ask()
        losses.append((params["x"] - 1.3) ** 2 + (params["k"] == "b"))
        tuner.tell(parameter_id, losses[-1])
    # At first draws from the whole space, at the end near the best (18.1 -> 0.60; Random, same seed: 8.8 -> 13.4).
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < first / 5 and min(losses) < 0.05, (first, last)


def test_curvefitting_takes_nnis_class_args_and_stops_a_curve_headed_below_the_best():
    from trialkit.control.assessors import build_assessor

    assessor = build_assessor("Curvefitting", {"epoch_num": 20, "start_step": 6, "threshold": 0.95, "gap": 2})

    def curve(top):
        return [top * (1 - 0.5 / (i + 1)) for i in range(20)]

    assert not any(assessor.should_stop("early", curve(0.3)[:k]) for k in range(1, 12))  # no success yet
    assessor.trial_end("early", False)
    assessor.trial_end("best", True, curve(0.9))
    low = [assessor.should_stop("low", curve(0.4)[:k]) for k in range(1, 12)]
    assert low == [False] * 5 + [True, False, True, False, True, False]  # from step 6, every 2nd step
    assert not any(assessor.should_stop("high", curve(0.92)[:k]) for k in range(1, 20))
