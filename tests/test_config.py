"""The experiment config: NNI's files as users bring them, v1 and v2, and the Python API."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from trialkit.control.assessors import build_assessor
from trialkit.control.config import load_config, parse_config
from trialkit.errors import UserError
from trialkit.experiment import ConfigBag, Experiment
from trialkit.platforms.local import LocalConfig

NNI = Path(__file__).parent / "fixtures" / "nni" / "mnist-pytorch"
MNIST_SPACE = json.loads((NNI / "search_space.json").read_text())


def minimal(**extra):
    return {
        "searchSpace": {"lr": {"_type": "loguniform", "_value": [1e-4, 0.1]}},
        "trialCommand": "python3 train.py",
        "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}},
        **extra,
    }


def error_of(data, base=NNI) -> UserError:
    with pytest.raises(UserError) as err:
        parse_config(data, base)
    line = err.value.line()
    assert "\n" not in line and err.value.where and err.value.where in line
    return err.value


# ---------------------------------------------------------------- NNI's files, unchanged


def test_nni_minimal_v2_config_loads():
    config = load_config(NNI / "config.yml")
    assert config.search_space.to_dict() == MNIST_SPACE
    assert config.trial_command == "python3 mnist.py"
    assert config.trial_code_directory == str(NNI)  # "." is the config file's directory
    assert config.trial_gpu_number == 0 and config.trial_concurrency == 1
    assert (config.tuner.name, config.optimize_mode) == ("TPE", "maximize")
    # priority: the experiment's one (the default, 42), its job's in the resource pool too
    assert config.platform == "local" and config.training_service == LocalConfig(trial_gpu_number=0, priority=42)


def test_nni_detailed_v2_config_loads():
    config = load_config(NNI / "config_detailed.yml")
    assert config.experiment_name == "MNIST"
    assert config.search_space.to_dict() == MNIST_SPACE
    assert (config.max_trial_number, config.max_experiment_duration, config.max_trial_duration) == (10, 3600, 600)
    assert config.trial_concurrency == 4
    assert config.training_service.use_active_gpu is False


def test_nni_assessor_config_loads():
    config = load_config(NNI / "config_assessor.yml")
    assert (config.assessor.name, config.assessor.class_args) == ("Medianstop", {"optimize_mode": "maximize", "start_step": 5})


def test_nni_v1_config_converts_to_the_same_experiment():
    v1 = load_config(NNI / "config_v1.yml")
    assert v1.experiment_name == "example_mnist_pytorch"
    assert (v1.max_trial_number, v1.max_experiment_duration) == (10, 3600)
    assert v1.search_space.to_dict() == MNIST_SPACE
    assert (v1.trial_command, v1.trial_code_directory, v1.trial_gpu_number) == ("python3 mnist.py", str(NNI), 0)
    v2 = load_config(NNI / "config.yml")
    assert (v1.tuner, v1.training_service, v1.platform) == (v2.tuner, v2.training_service, v2.platform)


def test_v1_local_config_and_assessor_convert():
    v1 = yaml.safe_load((NNI / "config_v1.yml").read_text())
    v1["localConfig"] = {"gpuIndices": "0,1", "maxTrialNumPerGpu": 2, "useActiveGpu": True}
    v1["assessor"] = {"builtinAssessorName": "Medianstop", "classArgs": {"start_step": 3}}
    config = parse_config(v1, NNI)
    assert config.training_service == LocalConfig(use_active_gpu=True, max_trial_number_per_gpu=2, gpu_indices=(0, 1),
                                                  trial_gpu_number=0, priority=42)  # trial.gpuNum
    assert config.assessor.class_args == {"start_step": 3, "optimize_mode": "maximize"}  # the tuner's mode


def test_assessor_class_args_come_back_ready_to_build():
    config = parse_config(minimal(assessor={"name": "pruner", "classArgs": {"pruner": "percentile", "percentile": 25}}), NNI)
    assert (config.assessor.name, config.assessor.class_args) == (
        "Pruner", {"pruner": "percentile", "percentile": 25, "optimize_mode": "maximize"})
    assert build_assessor(config.assessor.name, config.assessor.class_args).should_stop("t", [1.0]) is False


def test_nested_search_space_file_loads():
    config = parse_config(minimal(searchSpace=None, searchSpaceFile="nested_search_space.json"), NNI)
    assert "layer0" in config.search_space.params


# ---------------------------------------------------------------- spelling, round trip


def test_camel_and_snake_case_give_the_same_config():
    camel = minimal(trialConcurrency=2, maxTrialNumber=5, maxTrialDuration="30m", trialGpuNumber=1,
                    trainingService={"platform": "local", "useActiveGpu": True})
    snake = {
        "search_space": camel["searchSpace"], "trial_command": camel["trialCommand"],
        "tuner": {"name": "tpe", "class_args": {"optimize_mode": "MAXIMIZE"}},
        "trial_concurrency": 2, "max_trial_number": 5, "max_trial_duration": 1800, "trial_gpu_number": 1,
        "training_service": {"platform": "Local", "use_active_gpu": True},
    }
    assert parse_config(camel, NNI) == parse_config(snake, NNI)


def test_to_dict_round_trips_through_json(tmp_path):
    config = parse_config(minimal(
        experimentName="e", trialConcurrency=3, maxTrialNumber=7, maxExperimentDuration="1.5h", maxTrialDuration=90,
        trialGpuNumber=1, logLevel="info", debug=False, experimentWorkingDirectory="runs",
        trialGraceSeconds=5, priority=3,
        assessor={"name": "Medianstop", "classArgs": {"start_step": 2}},
        trainingService={"platform": "local", "gpuIndices": [0], "slotsPerTrial": 2},
    ), tmp_path)
    stored = json.loads(json.dumps(config.to_dict()))
    assert parse_config(stored, "/somewhere/else") == config
    assert stored["maxExperimentDuration"] == 5400
    assert stored["experimentWorkingDirectory"] == str(tmp_path / "runs")
    assert config.training_service.slots_per_trial == 2
    (tmp_path / "job.yaml").write_text("kind: AdaptDLJob\n")
    cluster = parse_config(minimal(nniManagerIp="10.0.0.2", trialTemplate="job.yaml",
                                   trainingService={"platform": "adaptdl", "image": "img:1"}), tmp_path)
    assert parse_config(json.loads(json.dumps(cluster.to_dict())), "/somewhere/else") == cluster
    assert cluster.trial_template == str(tmp_path / "job.yaml")


@pytest.mark.parametrize("value, seconds", [
    (90, 90), (2.5, 2.5), ("90", 90), ("90s", 90), ("30m", 1800), ("1.5h", 5400), ("2d", 172800), ("1H", 3600),
])
def test_durations_take_nnis_units(value, seconds):
    assert parse_config(minimal(maxTrialDuration=value), NNI).max_trial_duration == seconds


@pytest.mark.parametrize("value", ["1 hour", "h", "-5m", 0, -1, True, [1], "1.5.h"])
def test_bad_durations_say_how_to_write_one(value):
    assert error_of(minimal(maxExperimentDuration=value)).where == "maxExperimentDuration"


def test_yaml_scientific_notation_is_a_number(tmp_path):
    (tmp_path / "c.yml").write_text(
        "searchSpace:\n  lr: {_type: loguniform, _value: [1e-5, 1e-1]}\ntrialCommand: x\ntuner: {name: Random}\n"
        "experimentName: 2024-01-01\n")
    config = load_config(tmp_path / "c.yml")
    assert config.search_space.params["lr"].a == 1e-5
    assert config.experiment_name == "2024-01-01"  # a string, not a date


@pytest.mark.parametrize("section", ["advisor", "tuner"])
@pytest.mark.parametrize("name, args", [("Hyperband", {"R": 27, "eta": 3, "exec_mode": "serial"}),
                                        ("BOHB", {"min_budget": 1, "max_budget": 9, "eta": 3, "top_n_percent": 20})])
def test_nnis_advisors_are_taken_as_advisor_or_tuner_in_a_v2_config(section, name, args):
    data = {**minimal(tuner=None), section: {"name": name, "classArgs": {"optimize_mode": "maximize", **args}}}
    config = parse_config(data, NNI)
    assert config.tuner.name == name and {k: config.tuner.class_args[k] for k in args} == args


def test_no_training_service_means_local():
    assert parse_config(minimal(), NNI).platform == "local"


# ---------------------------------------------------------------- one-line errors


@pytest.mark.parametrize(
    "data, where, words",
    [
        (minimal(maxTrialNum=3), "maxTrialNum", "did you mean 'maxTrialNumber'"),
        (minimal(operator="pytorch-operator"), "operator", "trainingService"),
        (minimal(tuner={"name": "TPE", "classArgs": {"optimize_mode": "max"}}),
         "tuner.classArgs.optimize_mode", "'max'"),
        (minimal(tuner={"name": "TPE", "class_args": {}, "classArgs": {}}), "tuner.classArgs", "given twice"),
        (minimal(tuner={"classArgs": {}}), "tuner.name", "missing"),
        (minimal(tuner=None), "tuner", "missing"),
        (minimal(tuner="TPE"), "tuner", "mapping"),
        (minimal(advisor={"name": "BOHB"}), "advisor", "both"),
        ({**minimal(tuner=None), "advisor": {"name": "SMAC"}}, "advisor.name", "not available"),
        ({**minimal(tuner=None), "advisor": {"name": "Hyperband"}, "assessor": {"name": "Medianstop"}}, "assessor",
         "Hyperband decides itself which trials go on"),
        (minimal(trialCommand=None), "trialCommand", "missing"),
        (minimal(trialCommand=""), "trialCommand", "non-empty"),
        (minimal(trialConcurrency=0), "trialConcurrency", "too small"),
        (minimal(trialConcurrency="2"), "trialConcurrency", "whole number"),
        (minimal(maxTrialNumber=1.5), "maxTrialNumber", "whole number"),
        (minimal(trialGpuNumber=-1), "trialGpuNumber", "too small"),
        (minimal(searchSpace=None), "searchSpace", "missing"),
        (minimal(searchSpaceFile="search_space.json"), "searchSpaceFile", "both"),
        ({**minimal(searchSpace=None), "searchSpaceFile": "nope.json"}, "searchSpaceFile", "not a file"),
        (minimal(searchSpace={"lr": {"_type": "uniform", "_value": [1, 0]}}), "searchSpace.lr._value", "less than high"),
        (minimal(tuner={"name": "GridSearch"}), "searchSpace.lr", "GridSearch cannot enumerate"),
        ({**minimal(searchSpace=None, tuner={"name": "GridSearch"}), "searchSpaceFile": "search_space.json"},
         "searchSpaceFile.momentum", "GridSearch cannot enumerate"),
        (minimal(trialCodeDirectory="no/such/dir"), "trialCodeDirectory", "not a directory"),
        (minimal(trialTemplate="missing.yaml"), "trialTemplate", "not a file"),
        (minimal(trainingService={"platform": "pai"}), "trainingService.platform", "unknown platform"),
        (minimal(trainingService={"useActiveGpu": True}), "trainingService.platform", "missing"),
        (minimal(trainingService=[{"platform": "local"}]), "trainingService", "hybrid"),
        (minimal(trainingService={"platform": "local", "useActiveGPU": "yes"}), "trainingService.useActiveGpu", "true or false"),
        (minimal(trainingService={"platform": "local", "gpuIndices": "0,x"}), "trainingService.gpuIndices", "GPU indices"),
        (minimal(trainingService={"platform": "local", "gpuIndices": [0, 0]}), "trainingService.gpuIndices", "repeat"),
        (minimal(trainingService={"platform": "local", "maxTrialNumPerGpu": 2}),
         "trainingService.maxTrialNumPerGpu", "did you mean 'maxTrialNumberPerGpu'"),
        (minimal(useAnnotation=True), "useAnnotation", "not supported"),
        (minimal(sharedStorage={}), "sharedStorage", "not supported"),
        (minimal(experimentType="nas"), "experimentType", "'nas'"),
        (minimal(logLevel="loud"), "logLevel", "'loud'"),
        (minimal(trialGraceSeconds=-1), "trialGraceSeconds", "too small"),
        (minimal(assessor={"name": "Medianstop", "classArgs": {"optimize_mode": "minimize"}}),
         "assessor.classArgs.optimize_mode", "differs from the tuner"),
        (minimal(assessor={"name": "Median"}), "assessor.name", "did you mean 'Medianstop'"),
    ],
)
def test_mistakes_are_one_line_errors_naming_the_key(data, where, words):
    err = error_of(data)
    assert err.where == where
    assert words in err.line() and err.fix


@pytest.mark.parametrize(
    "change, where, words",
    [
        ({"maxTrialNum": 0}, "maxTrialNum", "too small"),
        ({"maxExecDuration": "10x"}, "maxExecDuration", "unit"),
        ({"trial": {"command": "", "codeDir": "."}}, "trial.command", "non-empty"),
        ({"trial": {"command": "x", "image": "busybox"}}, "trial.image", "unknown key"),
        ({"tuner": {"builtinTunerName": "TPEE"}}, "tuner.builtinTunerName", "did you mean 'TPE'"),
        ({"tuner": {"codeDir": ".", "classFileName": "t.py", "className": "T"}}, "tuner.codeDir", "custom"),
        ({"kubeflowConfig": {}}, "kubeflowConfig", "trainingServicePlatform: kubeflow"),
        ({"useAnnotation": True}, "useAnnotation", "not supported"),
        ({"multiPhase": True}, "multiPhase", "not supported"),
        ({"trainingServicePlatform": "remote"}, "trainingServicePlatform", "unknown platform"),
        ({"authorname": "me"}, "authorname", "given twice"),
    ],
)
def test_v1_errors_name_the_v1_key(change, where, words):
    v1 = {**yaml.safe_load((NNI / "config_v1.yml").read_text()), **change}
    err = error_of(v1)
    assert err.where == where
    assert words in err.line()


def test_unreadable_and_broken_files_are_user_errors(tmp_path):
    with pytest.raises(UserError) as err:
        load_config(tmp_path / "absent.yml")
    assert "cannot read" in err.value.line()
    (tmp_path / "bad.yml").write_text("tuner:\n  name: [TPE\n")
    with pytest.raises(UserError) as err:
        load_config(tmp_path / "bad.yml")
    assert "line 3" in err.value.line() and err.value.where == str(tmp_path / "bad.yml")
    (tmp_path / "list.yml").write_text("- a\n- b\n")
    with pytest.raises(UserError) as err:
        load_config(tmp_path / "list.yml")
    assert "mapping" in err.value.line()


# ---------------------------------------------------------------- Kubernetes platforms' v1 configs


def test_v1_kubernetes_configs_go_through_the_platforms_from_v1():
    pytest.importorskip("trialkit.platforms.kubernetes.frameworkcontroller")
    pytest.importorskip("trialkit.platforms.kubernetes.adaptdljob")
    # the configs of NNI's FrameworkController and AdaptDL pages
    fc = {
        "authorName": "default", "experimentName": "example_mnist", "trialConcurrency": 1,
        "maxExecDuration": "10h", "maxTrialNum": 100, "trainingServicePlatform": "frameworkcontroller",
        "searchSpacePath": "search_space.json", "useAnnotation": False,
        "tuner": {"builtinTunerName": "TPE", "classArgs": {"optimize_mode": "maximize"}},
        "assessor": {"builtinAssessorName": "Medianstop", "classArgs": {"optimize_mode": "maximize"}},
        "trial": {"codeDir": ".", "taskRoles": [{
            "name": "worker", "taskNum": 1, "command": "python3 mnist.py", "gpuNum": 1, "cpuNum": 1,
            "memoryMB": 8192, "image": "msranni/nni:latest",
            "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceededTaskCount": 1}}]},
        "frameworkcontrollerConfig": {"storage": "nfs", "nfs": {"server": "10.0.0.1", "path": "/exports"}},
    }
    config = parse_config(fc, NNI)
    assert config.platform == "frameworkcontroller" and config.trial_command is None
    assert config.max_experiment_duration == 36000
    adl = {
        "authorName": "default", "experimentName": "cifar_adl", "trialConcurrency": 1, "maxExecDuration": "3h",
        "maxTrialNum": 10, "nniManagerIp": "10.20.41.10", "trainingServicePlatform": "adl",
        "searchSpacePath": "search_space.json", "useAnnotation": False,
        "tuner": {"builtinTunerName": "TPE", "classArgs": {"optimize_mode": "minimize"}},
        "trial": {"command": "python3 /main_nni.py", "codeDir": ".", "gpuNum": 1,
                  "image": "registry.petuum.com/dev/nni:adaptdl", "imagePullSecrets": [{"name": "imagepullsecret"}],
                  "adaptive": True, "checkpoint": {"storageClass": "dfs", "storageSize": "1Gi"},
                  "nfs": {"server": "172.20.188.236", "path": "/", "containerMountPath": "/nfs"}},
    }
    config = parse_config(adl, NNI)
    assert (config.platform, config.trial_command, config.nni_manager_ip) == ("adaptdl", "python3 /main_nni.py", "10.20.41.10")
    assert parse_config(config.to_dict()) == config


# ---------------------------------------------------------------- the Python API


@pytest.fixture
def nni_example(tmp_path: Path, monkeypatch) -> Path:
    """A copy of NNI's mnist-pytorch configs with a script where its command names one (the Python API checks the
    script, as `trialkit run` does), the current directory."""
    copy = shutil.copytree(NNI, tmp_path / "mnist-pytorch")
    (copy / "mnist.py").write_text("import nni\n")
    monkeypatch.chdir(copy)
    return copy


def test_python_api_builds_the_same_config_as_yaml(nni_example):
    exp = Experiment("local")
    exp.config.experiment_name = "MNIST"
    exp.config.search_space = MNIST_SPACE
    exp.config.trial_command = "python3 mnist.py"
    exp.config.trial_code_directory = Path(".")  # NNI's examples pass a Path
    exp.config.trial_gpu_number = 0
    exp.config.tuner.name = "TPE"
    exp.config.tuner.class_args["optimize_mode"] = "maximize"
    exp.config.max_trial_number = 10
    exp.config.trial_concurrency = 4
    exp.config.max_experiment_duration = "1h"
    exp.config.max_trial_duration = "10m"
    exp.config.training_service.use_active_gpu = False
    assert exp.config.validate() == load_config(nni_example / "config_detailed.yml")


def test_python_api_errors_are_the_yaml_errors(nni_example):
    exp = Experiment()
    exp.config.search_space = MNIST_SPACE
    exp.config.trial_command = "python3 mnist.py"
    exp.config.tuner.name = "TPE"
    exp.config.tuner.class_args["optimize_mode"] = "best"
    with pytest.raises(UserError) as err:
        exp.config.validate()
    assert err.value.where == "tuner.classArgs.optimize_mode"
    exp.config.tuner.class_args["optimize_mode"] = "maximize"
    exp.config.max_trial_numbr = 3
    with pytest.raises(UserError) as err:
        exp.config.validate()
    assert "did you mean 'maxTrialNumber'" in err.value.line()
    with pytest.raises(AttributeError, match="did you mean 'trial_concurrency'"):
        exp.config.trial_concurency


def test_python_api_assessor_and_nested_training_service(nni_example):
    exp = Experiment("local")
    exp.config.search_space = MNIST_SPACE
    exp.config.trial_command = "python3 mnist.py"
    exp.config.tuner.name = "Random"
    assert exp.config.validate().assessor is None  # no name: no assessor
    exp.config.assessor.name = "Medianstop"
    exp.config.assessor.class_args["start_step"] = 2
    exp.config.training_service["gpu_indices"] = [1]
    exp.config.trial_gpu_number = 1
    config = exp.config.validate()
    assert config.assessor.class_args == {"start_step": 2, "optimize_mode": "maximize"}
    assert config.training_service.gpu_indices == (1,)
    bag = ConfigBag()
    bag.storage.server = "10.20.30.40"  # nested bags appear on first use, as NNI's config classes would
    bag.unused  # read but never set: left out
    assert bag.to_dict() == {"storage": {"server": "10.20.30.40"}}
