"""Determined experiment configs as trialkit reads them: each field applied, or refused by name (exit 2).

The configs of tests/fixtures/determined are Determined's own (its Core API
tutorial), unchanged; the rest are written here in Determined's format.
"""
from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path

import pytest
import yaml

from experiment_util import cli
from trialkit import env
from trialkit.control.assessors import Bracket, asha_brackets, build_assessor
from trialkit.control.config import load_config, parse_config
from trialkit.errors import UserError

FIXTURES = Path(__file__).parent / "fixtures" / "determined"


def parse(tmp_path: Path, **config):
    config.setdefault("entrypoint", "python3 train.py")
    config.setdefault("searcher", {"name": "single", "metric": "loss"})
    return parse_config(config, tmp_path)


def settings(command: str) -> dict:
    """What the Core API is served: the env.DETERMINED word at the front of the trial command."""
    words = shlex.split(command)
    assert words[0] == "env" and words[1].startswith(env.DETERMINED + "=")
    return json.loads(base64.urlsafe_b64decode(words[1].split("=", 1)[1]))


def test_the_tutorials_asha_config_becomes_random_search_with_determineds_asha(tmp_path):
    config = load_config(FIXTURES / "3_hpsearch.yaml", str(tmp_path))
    assert config.experiment_name == "core-api-stage-3"
    assert config.tuner.name == "Random" and config.optimize_mode == "minimize"  # smaller_is_better's default
    assert config.max_trial_number == 10
    assert config.search_space.to_dict() == {"increment_by": {"_type": "randint", "_value": [1, 9]}}
    assert config.assessor.name == "ASHA"
    assert config.assessor.class_args == {"optimize_mode": "minimize", "metric": "x", "time_metric": "batches",
                                          "max_time": 100, "max_trials": 10}
    # Determined's default concurrency for this search: 4 trials in each of its two brackets.
    assert config.trial_concurrency == 8
    assert config.max_trial_restarts == 0
    assert config.trial_code_directory == str(tmp_path)  # the context directory, as det experiment create's
    assert config.platform == "local"
    assert config.trial_command.endswith(" python3 3_hpsearch.py")
    assert settings(config.trial_command)["searcher"]["time_metric"] == "batches"


def test_the_tutorials_distributed_config_gives_each_trial_its_slots(tmp_path):
    config = load_config(FIXTURES / "4_distributed.yaml")
    assert config.training_service.slots == 8
    assert config.trial_concurrency == 1 and config.max_trial_number == 1  # single: one trial
    assert config.trial_code_directory == str(FIXTURES)  # no context dir given: the config's own
    assert settings(config.trial_command)["searcher"]["max_length"] == 100
    assert config.trial_command.endswith(" ./4_distributed.py launcher")


def test_max_restarts_defaults_to_determineds_five(tmp_path):
    assert parse(tmp_path).max_trial_restarts == 5
    assert load_config(FIXTURES / "1_metrics.yaml").max_trial_restarts == 5
    assert parse(tmp_path, max_restarts=0).max_trial_restarts == 0


def test_hyperparameter_types_become_the_same_search_space(tmp_path):
    config = parse(tmp_path, hyperparameters={
        "global_batch_size": 32,
        "name": {"type": "const", "val": "mnist"},
        "layers": {"type": "int", "minval": 1, "maxval": 4},
        "dropout": {"type": "double", "minval": 0.2, "maxval": 0.5},
        "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1},
        "act": {"type": "categorical", "vals": ["relu", "tanh"]},
        "optimizer": {"momentum": {"type": "double", "minval": 0.8, "maxval": 0.9}, "kind": "sgd"},
    })
    assert config.search_space.to_dict() == {
        "global_batch_size": {"_type": "choice", "_value": [32]},
        "name": {"_type": "choice", "_value": ["mnist"]},
        "layers": {"_type": "randint", "_value": [1, 5]},
        "dropout": {"_type": "uniform", "_value": [0.2, 0.5]},
        "lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]},
        "act": {"_type": "choice", "_value": ["relu", "tanh"]},
        "optimizer": {"_type": "choice", "_value": [{"_name": "optimizer",
                                                     "momentum": {"_type": "uniform", "_value": [0.8, 0.9]},
                                                     "kind": {"_type": "choice", "_value": ["sgd"]}}]},
    }


def test_a_grid_takes_determineds_count_points(tmp_path):
    config = parse(tmp_path, searcher={"name": "grid", "metric": "loss", "smaller_is_better": False},
                   hyperparameters={"a": {"type": "int", "minval": 1, "maxval": 10, "count": 4},
                                    "b": {"type": "double", "minval": 0, "maxval": 1, "count": 3},
                                    "c": {"type": "log", "minval": -3, "maxval": -1, "count": 3},
                                    "d": {"type": "int", "minval": 0, "maxval": 2}})
    assert config.tuner.name == "GridSearch" and config.optimize_mode == "maximize"
    space = config.search_space.to_dict()
    assert space["a"]["_value"] == [1, 4, 7, 10] and space["b"]["_value"] == [0, 0.5, 1]
    assert space["c"]["_value"] == pytest.approx([0.001, 0.01, 0.1])
    assert space["d"] == {"_type": "randint", "_value": [0, 3]}  # no count: every integer
    assert len(list(config.search_space.grid())) == 4 * 3 * 3 * 3
    assert config.trial_concurrency == 16  # Determined's default
    with pytest.raises(UserError, match="count"):
        parse(tmp_path, searcher={"name": "grid", "metric": "l"},
              hyperparameters={"b": {"type": "double", "minval": 0, "maxval": 1}})


def test_resources_priority_restarts_and_concurrency_are_applied(tmp_path):
    config = parse(tmp_path, searcher={"name": "random", "metric": "acc", "max_trials": 20,
                                       "max_concurrent_trials": 6},
                   resources={"slots_per_trial": 2, "max_slots": 8, "priority": 10}, max_restarts=3)
    assert config.max_trial_number == 20
    assert config.trial_concurrency == 4  # max_slots 8 / 2 slots, below max_concurrent_trials 6
    assert config.training_service.slots == 2
    # Determined's priority orders experiments: the job's in its resource pool (smaller first there too), and
    # the experiment's one priority (its trials', all alike, in its own queue)
    assert (config.training_service.pool_priority, config.priority) == (10, 10)
    assert config.max_trial_restarts == 3


def test_a_trial_class_entrypoint_runs_the_class_with_horovod_when_distributed(tmp_path):
    # The class's module, in the context dir, binding the class (checked on the local platform).
    (tmp_path / "model_def.py").write_text("class MyTrial:\n    pass\n")
    one = parse(tmp_path, entrypoint="model_def:MyTrial").trial_command
    assert one.endswith(" python3 -m trialkit.launch.run_trial model_def:MyTrial")
    two = parse(tmp_path, entrypoint="model_def:MyTrial", resources={"slots_per_trial": 2}).trial_command
    assert two.endswith(" python3 -m trialkit.launch.horovod --trial model_def:MyTrial")
    listed = parse(tmp_path, entrypoint=["python3", "-m", "determined.launch.torch_distributed", "train.py"])
    assert listed.trial_command.endswith(" python3 -m determined.launch.torch_distributed train.py")


# A trial class's name bound at the module's top level in any way is taken: its source is read, never run.
BINDINGS = {
    "imported": "from elsewhere import MyTrial\n",
    "imported as": "import elsewhere.sub as MyTrial\n",
    "assigned": "from elsewhere import Base\nMyTrial = Base\n",
    "unpacked": "MyTrial, Other = make()\n",
    "guarded": "try:\n    from fast import MyTrial\nexcept ImportError:\n    from slow import MyTrial\n",
    "in a with": "with registry() as MyTrial:\n    pass\n",
    "star import": "from elsewhere import *\n",
    "module getattr": "def __getattr__(name):\n    return object\n",
    "global": "def make():\n    global MyTrial\n    MyTrial = object\n",
    "walrus": "if (MyTrial := make()):\n    pass\n",
    "not python": "this is not Python(\n",
}


@pytest.mark.parametrize("source", BINDINGS.values(), ids=list(BINDINGS))
def test_a_trial_class_bound_in_any_way_is_taken(tmp_path, source):
    (tmp_path / "model_def.py").write_text(source)
    assert parse(tmp_path, entrypoint="model_def:MyTrial").trial_command.endswith(" model_def:MyTrial")


def test_a_trial_class_in_a_package_is_read_from_its_init(tmp_path):
    (tmp_path / "model_def").mkdir()
    (tmp_path / "model_def" / "__init__.py").write_text("from .trials import MyTrial\n")
    assert parse(tmp_path, entrypoint="model_def:MyTrial").trial_command.endswith(" model_def:MyTrial")
    with pytest.raises(UserError, match=r"^entrypoint: model_def has no class MyTrail \(.*model_def/__init__.py "
                                        r"binds no such name at its top level\) \(did you mean MyTrial\?\)$"):
        parse(tmp_path, entrypoint="model_def:MyTrail")


def test_a_name_bound_only_inside_a_function_or_class_is_not_the_modules(tmp_path):
    (tmp_path / "model_def.py").write_text("class Outer:\n    MyTrial = 1\ndef f():\n    MyTrial = 2\n")
    with pytest.raises(UserError, match=r"model_def has no class MyTrial .*\(give the name of your trial class in "
                                        r"it\)$"):
        parse(tmp_path, entrypoint="model_def:MyTrial")


def test_environment_variables_data_and_shared_fs_storage_are_applied(tmp_path):
    config = parse(tmp_path, environment={"environment_variables": ["A=1", "B=two words"]},
                   data={"url": "s3://x"}, checkpoint_storage={"type": "shared_fs", "host_path": str(tmp_path),
                                                               "storage_path": "ckpts"},
                   bind_mounts=[{"host_path": str(tmp_path), "container_path": str(tmp_path)}])
    words = shlex.split(config.trial_command)
    assert words[2:6] == ["A=1", "B=two words", "python3", "train.py"]
    assert settings(config.trial_command)["data"] == {"url": "s3://x"}
    assert config.experiment_working_directory == str(tmp_path / "ckpts")


def test_a_resource_pool_and_priority_are_the_local_platform_s_pool_and_the_job_s_place_in_it(tmp_path):
    assert parse(tmp_path, resources={"resource_pool": "a100"}).training_service.resource_pool == "a100"
    prioritized = parse(tmp_path, resources={"priority": 10})
    assert (prioritized.training_service.pool_priority, prioritized.priority) == (10, 10)
    assert parse(tmp_path, resources={"weight": 2.5}).training_service.pool_weight == 2.5  # fair share's
    for key, value in (("priority", 10), ("weight", 2)):
        with pytest.raises(UserError, match=f"resources.{key} orders experiments in a local resource pool only"):
            parse(tmp_path, resources={key: value}, trainingService={"platform": "kubeflow"})
    with pytest.raises(UserError, match="must be greater than 0"):
        parse(tmp_path, resources={"weight": 0})


@pytest.mark.parametrize("extra, where", [
    ({"checkpoint_policy": "all"}, "checkpoint_policy"),
    ({"resources": {"shm_size": 4096}}, "resources.shm_size"),
    ({"searcher": {"name": "pbt", "metric": "l"}}, "searcher.name"),
    ({"searcher": {"name": "single", "metric": "l", "source_trial_id": 3}}, "searcher.source_trial_id"),
    ({"checkpoint_storage": {"type": "directory", "container_path": "/ckpt"}}, "checkpoint_storage.type"),
    ({"checkpoint_storage": {"type": "s3", "bucket": "b", "secret_key": "kept"}}, "checkpoint_storage.secret_key"),
    ({"checkpoint_storage": {"type": "azure", "container": "c", "connection_string": "k"}},
     "checkpoint_storage.connection_string"),
    ({"checkpoint_storage": {"type": "gcs", "bucket": "b", "endpoint_url": "http://x"}},
     "checkpoint_storage.endpoint_url"),
    ({"checkpoint_storage": {"type": "shared_fs", "host_path": "/tmp", "save_trial_best": -1}},
     "checkpoint_storage.save_trial_best"),
    ({"environment": {"image": "det:latest"}}, "environment.image"),
    ({"environment": {"pod_spec": {}}}, "environment.pod_spec"),
    ({"bind_mounts": [{"host_path": "/tmp", "container_path": "/data"}]}, "bind_mounts[0].container_path"),
    ({"hyperparameters": {"x": {"type": "int", "minval": 1, "maxval": 2, "step": 1}}}, "hyperparameters.x.step"),
])
def test_what_trialkit_does_not_do_is_refused_by_name(tmp_path, extra, where):
    with pytest.raises(UserError) as caught:
        parse(tmp_path, **extra)
    assert caught.value.where == where


DESCRIBING = {"workspace": "research", "project": "mnist", "labels": ["baseline", "cpu"], "description": "a run",
              "notes": "try lr first", "min_validation_period": {"batches": 100}, "min_checkpoint_period": 200,
              "scheduling_unit": 50, "perform_initial_validation": True, "records_per_epoch": 60000}


def test_keys_that_only_describe_or_pace_determineds_loop_are_taken_with_one_note(tmp_path):
    noted = parse(tmp_path, name="a", **DESCRIBING)
    plain = parse(tmp_path, name="a")
    assert (noted.experiment_name, noted.trial_command) == ("a", plain.trial_command)
    assert plain.notes == () and len(noted.notes) == 1
    assert noted.notes[0].startswith(", ".join(DESCRIBING) + ": taken, not used"), noted.notes
    for key, wrong in (("description", {"not": "text"}), ("labels", "baseline"), ("scheduling_unit", 0),
                       ("min_validation_period", {"steps": 5}), ("perform_initial_validation", "yes")):
        with pytest.raises(UserError) as caught:
            parse(tmp_path, **{key: wrong})
        assert caught.value.where == key or caught.value.where.startswith(key + "["), caught.value.line()


def test_a_realistic_determined_config_runs_and_says_its_note_once(tmp_path):
    config = yaml.safe_load((FIXTURES / "2_checkpoints.yaml").read_text())
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**config, **DESCRIBING}))
    done = cli("run", path, FIXTURES, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    notes = [line for line in done.stdout.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and all(key in notes[0] for key in DESCRIBING), done.stdout


def test_every_problem_in_a_determined_config_is_refused_at_once_in_one_line_exit_2(tmp_path):
    config = yaml.safe_load((FIXTURES / "2_checkpoints.yaml").read_text())
    config.update(checkpoint_policy="best", profiling={"enabled": True},
                  searcher={"name": "single", "metric": "x", "source_trial_id": 3},
                  resources={"shm_size": 4096, "slots_per_trial": 1},
                  hyperparameters={"lr": {"type": "double", "minval": 1, "maxval": 0}},
                  checkpoint_storage={"type": "s3", "bucket": "b", "access_key": "AK", "secret_key": "SK",
                                      "save_trial_latest": "one"},
                  environment={"pod_spec": {}}, workspace="research")
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config))
    done = cli("run", path, FIXTURES)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    wheres = ["checkpoint_policy", "profiling", "searcher.source_trial_id", "hyperparameters.lr.maxval",
              "resources.shm_size", "environment.pod_spec", "checkpoint_storage.access_key",
              "checkpoint_storage.secret_key", "checkpoint_storage.save_trial_latest"]
    assert f"{len(wheres)} problems: " in done.stderr, done.stderr
    for where in wheres:
        assert f"{where}: " in done.stderr, (where, done.stderr)
    assert "workspace" not in done.stderr  # taken, with its note
    assert "SK" not in done.stderr and "AK" not in done.stderr  # a credential is named by its key, never shown


def test_a_typo_is_an_unknown_key_with_a_did_you_mean_and_determineds_own_keys_are_not_supported(tmp_path):
    """Told "not supported (remove it)" of `hyperparamters`, a user deleted their hyperparameters."""
    path = tmp_path / "exp.yaml"
    (tmp_path / "train.py").write_text("print('never run')\n")
    path.write_text(yaml.safe_dump({
        "entrypoint": "python3 train.py", "hyperparamters": {"lr": {"type": "double", "minval": 0, "maxval": 1}},
        "searcher": {"name": "randm", "metric": "loss", "max_trials": 4}, "resources": {"slots_per_trail": 2},
        "profiling": {"enabled": True}}, sort_keys=False))
    done = cli("run", path, tmp_path)
    assert (done.returncode, done.stdout) == (2, "") and done.stderr.count("\n") == 1, done.stderr
    assert "4 problems: " in done.stderr, done.stderr
    for fragment in ("hyperparamters: unknown key 'hyperparamters' (did you mean 'hyperparameters'?)",
                     "searcher.name: unknown searcher 'randm' (did you mean 'random'?)",
                     "resources.slots_per_trail: unknown key 'slots_per_trail' (did you mean 'slots_per_trial'?)",
                     "profiling: Determined's 'profiling' is not supported by trialkit (remove it"):
        assert fragment in done.stderr, (fragment, done.stderr)
    assert done.stderr.count("not supported") == 1, done.stderr


@pytest.mark.parametrize("config, where, meant", [
    ({"entrypoint": "python3 train.py", "serarcher": {"name": "single", "metric": "loss"}}, "serarcher", "searcher"),
    ({"searcher": {"name": "single", "metric": "loss"}, "entrypiont": "python3 train.py"}, "entrypiont", "entrypoint"),
    ({"entrypoint": "python3 train.py", "searcher": {"name": "single", "metric": "loss"},
      "bind_mounts": [{"host_pth": "/tmp", "container_path": "/tmp"}]}, "bind_mounts[0].host_pth", "host_path"),
    ({"entrypoint": "python3 train.py", "searcher": {"name": "random", "metric": "loss", "max_trail": 3}},
     "searcher.max_trail", "max_trials"),
    ({"entrypoint": "python3 train.py", "searcher": {"name": "single", "metric": "loss"},
      "hyperparameters": {"lr": {"type": "double", "minvl": 0, "maxval": 1}}}, "hyperparameters.lr.minvl", "minval"),
])
def test_a_misspelt_key_is_the_one_problem_not_the_key_it_leaves_missing(tmp_path, config, where, meant):
    with pytest.raises(UserError) as caught:
        parse_config(config, tmp_path)
    assert (caught.value.where, caught.value.fix) == (where, f"did you mean {meant!r}?"), caught.value.line()


def test_determineds_directory_storage_is_named_not_supported_rather_than_unknown(tmp_path):
    with pytest.raises(UserError) as caught:
        parse(tmp_path, checkpoint_storage={"type": "directory", "container_path": "/mnt/checkpoints"})
    assert caught.value.where == "checkpoint_storage.type", caught.value.line()
    assert "Determined's 'directory' checkpoint storage is not supported" in caught.value.line()
    assert "shared_fs" in caught.value.fix


def test_trialkits_stop_when_first_trials_fail_is_taken_in_a_determined_config(tmp_path):
    """The advice an experiment stopped by its first failures prints (stopWhenFirstTrialsFail: 0) applies to a
    Determined config too."""
    assert parse(tmp_path).stop_when_first_trials_fail == 3
    assert parse(tmp_path, stopWhenFirstTrialsFail=0).stop_when_first_trials_fail == 0
    with pytest.raises(UserError) as caught:
        parse(tmp_path, stopWhenFirstTrialsFail=-1)
    assert caught.value.where == "stopWhenFirstTrialsFail", caught.value.line()


def test_a_context_dir_is_only_for_a_determined_config(tmp_path):
    with pytest.raises(UserError, match="Determined"):
        parse_config({"searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "trialCommand": "true",
                      "tuner": {"name": "Random"}}, tmp_path, context_dir=str(tmp_path))


def test_asha_brackets_are_determineds():
    # adaptive_asha.go for max_time 100, max_trials 10, divisor 4, max_rungs 5, standard mode:
    # rungs = min(5, log4(100)+1, log4(10)+1) = 2; brackets of 2 and 1 rungs; trials 7 and 3.
    assert asha_brackets({"max_time": 100, "max_trials": 10}) == [Bracket((25, 100), 7, 4), Bracket((100,), 3, 4)]
    assert asha_brackets({"max_time": 1000, "max_trials": 100, "mode": "aggressive"}) == [
        Bracket((15, 62, 250, 1000), 100, 100)]  # log4(100 trials) + 1 = 4 rungs
    assert [b.units for b in asha_brackets({"max_time": 64, "max_trials": 64, "divisor": 2, "max_rungs": 3,
                                            "mode": "conservative", "max_concurrent_trials": 5})] == [
        (16, 32, 64), (32, 64), (64,)]


def validation(batches: int, x: float) -> dict:
    return {"group": "validation", "steps_completed": batches, "metrics": {"x": x, "batches": batches}}


def test_asha_stops_a_trial_outside_the_best_quarter_of_its_rung():
    asha = build_assessor("ASHA", {"optimize_mode": "minimize", "metric": "x", "time_metric": "batches",
                                   "max_time": 100, "max_trials": 8, "mode": "aggressive"})
    assert [b.units for b in asha.brackets] == [(25, 100)]

    def report(trial, *points):
        return asha.should_stop(trial, [asha.step_value(validation(b, x)) for b, x in points])

    assert asha.step_value({"group": "training", "metrics": {"x": 1, "batches": 30}}) is None
    assert not report("a", (10, 5.0))  # below the first rung: not judged
    assert not report("a", (10, 5.0), (30, 5.0))  # alone in the rung: the best so far
    assert report("b", (30, 9.0))  # second of two: only max(2 / 4, 1) = 1 goes on
    assert not report("c", (30, 1.0))  # the new best
    assert report("d", (30, 2.0))  # second of four: 4 / 4 = 1 goes on
    assert asha.should_stop("d", [])  # once stopped, stopped
    # At the top rung Determined tells a trial it is done; here it ends by itself with its final result.
    assert not report("c", (30, 1.0), (100, 50.0))


def test_asha_counts_a_failed_trial_as_the_worst_at_its_rung():
    asha = build_assessor("ASHA", {"optimize_mode": "maximize", "metric": "x", "time_metric": "batches",
                                   "max_time": 100, "max_trials": 8, "divisor": 2, "mode": "aggressive"})
    assert [b.units for b in asha.brackets] == [(12, 25, 50, 100)]

    def report(trial, batches, x):
        return asha.should_stop(trial, [asha.step_value(validation(batches, x))])

    assert not report("a", 20, 10.0)
    assert report("b", 20, 5.0)  # [10, 5]: the best half is a
    asha.trial_end("b", succeeded=False)  # stopped here, not failed: counted once
    assert not report("c", 5, 1.0)  # below the first rung
    asha.trial_end("c", succeeded=False)  # failed: the worst at rung 0 -> [10, 5, -inf]
    # [10, 7, 5, -inf]: the best 4 / 2 = 2 go on; without c's failure counted, 3 / 2 = 1 would stop d.
    assert not report("d", 20, 7.0)


def test_on_kubernetes_the_image_and_variables_go_into_the_trials_pod(tmp_path):
    (tmp_path / "train.py").touch()
    config = {"name": "on-kubeflow", "entrypoint": "python3 train.py", "searcher": {"name": "single", "metric": "l"},
              "environment": {"image": "example/det:1", "environment_variables": ["NCCL_DEBUG=INFO"]},
              "trainingService": {"platform": "kubeflow", "managerAddress": "10.0.0.5", "master": {"replicas": 1}}}
    path = tmp_path / "k.yaml"
    path.write_text(yaml.safe_dump(config))
    done = cli("render", path)
    assert done.returncode == 0, done.stderr
    pod = next(d for d in yaml.safe_load_all(done.stdout) if d["kind"] == "PyTorchJob")
    container = pod["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["image"] == "example/det:1"
    command = next(e["value"] for e in container["env"] if e["name"] == "TRIALKIT_COMMAND")
    assert shlex.split(command)[2:] == ["NCCL_DEBUG=INFO", "python3", "train.py"]
    with pytest.raises(UserError) as caught:
        parse(tmp_path, resources={"slots_per_trial": 2}, trainingService=config["trainingService"])
    assert caught.value.where == "resources.slots_per_trial"


def test_asha_judges_plain_intermediate_results_by_their_position():
    """An NNI-style trial (report_intermediate_result(number)) under `assessor: {name: ASHA}`: time is the count."""
    asha = build_assessor("ASHA", {"optimize_mode": "maximize", "max_time": 4,
                                   "max_trials": 4, "divisor": 2, "mode": "aggressive"})
    assert [b.units for b in asha.brackets] == [(1, 2, 4)]
    assert [asha.step_value(v) for v in (0.5, {"default": 0.25}, "text")] == [(None, 0.5), (None, 0.25), None]
    assert not asha.should_stop("a", [(None, 0.9), (None, 0.9)])
    assert not asha.should_stop("b", [(None, 0.95)])  # rung 1 (position 1): the better of two
    assert asha.should_stop("b", [(None, 0.95), (None, 0.1)])  # rung 2 (position 2): [0.9, 0.1]: stopped


def test_an_older_asha_config_rungs_on_max_length_in_steps_completed(tmp_path):
    config = parse(tmp_path, searcher={"name": "adaptive_asha", "metric": "acc", "smaller_is_better": False,
                                       "max_length": {"batches": 1000}, "max_trials": 16, "mode": "aggressive",
                                       "max_concurrent_trials": 2})
    assert config.assessor.class_args == {"optimize_mode": "maximize", "metric": "acc", "time_metric": None,
                                          "max_time": 1000, "max_trials": 16, "mode": "aggressive",
                                          "max_concurrent_trials": 2}
    assert config.trial_concurrency == 2
    asha = build_assessor("ASHA", config.assessor.class_args)
    at = {"group": "validation", "steps_completed": 500, "metrics": {"acc": 0.9}}
    assert asha.step_value(at) == (500, 0.9)
    with pytest.raises(UserError, match="go together"):
        parse(tmp_path, searcher={"name": "adaptive_asha", "metric": "a", "max_trials": 4, "max_time": 10})


GRID = {"name": "grid", "metric": "loss"}


@pytest.mark.parametrize("config, where, said", [
    ({"hyperparameters": {"lr": {"type": "log", "minval": -3, "maxval": 400}}}, "hyperparameters.lr.maxval",
     "10**400 is past a float's range"),
    ({"hyperparameters": {"lr": {"type": "log", "minval": -400, "maxval": -1}}}, "hyperparameters.lr.minval",
     "10**-400 is below the smallest float"),
    ({"hyperparameters": {"lr": {"type": "log", "base": 2, "minval": 1, "maxval": 2000, "count": 3}},
      "searcher": GRID}, "hyperparameters.lr.maxval", "2**2000 is past a float's range"),
    ({"hyperparameters": {"x": {"type": "double", "minval": 0, "maxval": 1, "count": 10**9}, "y": 3},
      "searcher": GRID}, "hyperparameters.x", "1,000,000,000 values of this hyperparameter alone"),
    ({"hyperparameters": {"opt": {"n": {"type": "int", "minval": 0, "maxval": 10**9, "count": 10**8}},
                          "act": {"type": "categorical", "vals": ["relu", "tanh"]}},
      "searcher": GRID}, "hyperparameters.opt.n", "100,000,000 values of this hyperparameter alone"),
    ({"hyperparameters": {"opt": {"n": {"type": "int", "minval": 1, "maxval": 1000, "count": 1000}},
                          "m": {"type": "double", "minval": 0, "maxval": 1, "count": 200}},
      "searcher": GRID}, "hyperparameters.opt.n", "the grid has 200,000 points (1,000 values of this one)"),
    ({"hyperparameters": {"n": {"type": "int", "minval": 0, "maxval": 10**9}}, "searcher": GRID},
     "hyperparameters.n", "1,000,000,001 values of this hyperparameter alone"),  # no count: every integer
    ({"hyperparameters": {"": 1}}, "hyperparameters.''", "bad parameter name ''"),
    ({"hyperparameters": {5: 1}}, "hyperparameters.5", "bad parameter name 5"),
    ({"data": {"blob": "x" * 100_000}}, "data", "bytes once packed into the trial's command"),
    ({"entrypoint": []}, "entrypoint", "an empty list: there is no command to run"),
])
def test_a_determined_input_is_one_line_in_the_users_own_keys(tmp_path, config, where, said):
    with pytest.raises(UserError) as caught:
        parse(tmp_path, **config)
    assert (caught.value.where, said in caught.value.what) == (where, True), caught.value.line()


HUGE = {"type": "int", "minval": 1, "maxval": 10**9, "count": 10**9}
EMPTY = {"type": "categorical", "vals": []}
THOUSAND = {"type": "double", "minval": 0, "maxval": 1, "count": 1000}


@pytest.mark.parametrize("hyperparameters, problems", [
    # An empty list's grid has 0 values: the size of the grid once passed as 0, and the billion were built.
    ({"n": HUGE, "c": EMPTY}, {"hyperparameters.n": "1,000,000,000 values of this hyperparameter alone",
                               "hyperparameters.c.vals": "vals must be a non-empty list"}),
    ({"c": EMPTY, "a": THOUSAND, "b": THOUSAND}, {"hyperparameters.c.vals": "vals must be a non-empty list",
                                                  "hyperparameters.a": "the grid has 1,000,000 points"}),
    ({"n": HUGE, "m": {**HUGE, "maxval": 10**6}}, {"hyperparameters.n": "1,000,000,000 values",
                                                   "hyperparameters.m": "1,000,000 values"}),
])
@pytest.mark.timeout(15)  # a grid built would take minutes and gigabytes: fail fast instead
def test_a_grid_too_large_is_refused_unbuilt_with_every_other_problem(tmp_path, hyperparameters, problems):
    with pytest.raises(UserError) as caught:
        parse(tmp_path, searcher={"name": "grid", "metric": "loss", "max_length": 1}, hyperparameters=hyperparameters)
    found = {one.where: one.what for one in getattr(caught.value, "problems", [caught.value])}
    assert set(found) == set(problems), caught.value.line()
    for where, said in problems.items():
        assert said in found[where], (where, found[where])


def test_a_users_grid_with_two_mistakes_is_refused_at_once_not_built(tmp_path):
    """A new user's config: a billion-point count and an empty categorical. It once printed nothing for 30 s
    and grew to 2.2 GB."""
    path = tmp_path / "hp.yaml"
    (tmp_path / "train.py").write_text("print('never run')\n")
    path.write_text("entrypoint: python3 train.py\n"
                    "hyperparameters:\n"
                    "  n: {type: int, minval: 1, maxval: 1000000000, count: 1000000000}\n"
                    "  c: {type: categorical, vals: []}\n"
                    "searcher: {name: grid, metric: loss, max_length: 1}\n")
    done = cli("run", path, tmp_path, timeout=20)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout
    assert done.stderr.count("\n") == 1 and "2 problems: " in done.stderr, done.stderr
    assert "hyperparameters.n: 1,000,000,000 values" in done.stderr and "hyperparameters.c.vals: " in done.stderr


@pytest.mark.parametrize("value, kind", [("!!timestamp 2024-05-01", "date"), ("!!binary aGVsbG8=", "bytes"),
                                         ("!!set {a, b}", "set")])
def test_data_that_json_cannot_carry_to_the_trial_is_named_with_its_type(tmp_path, value, kind):
    path = tmp_path / "exp.yaml"
    path.write_text(f"entrypoint: python3 train.py\nsearcher: {{name: single, metric: loss}}\n"
                    f"data:\n  snapshot: {value}\n")
    with pytest.raises(UserError) as caught:
        load_config(path)
    assert caught.value.where == "data.snapshot" and f"is a {kind}, which the trial cannot get" in caught.value.what


def test_an_empty_entrypoint_or_context_dir_is_refused_before_anything_runs(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("entrypoint: []\nsearcher: {name: single, metric: loss}\n")
    done = cli("run", path, tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout  # no trial ran `env` (and printed its token)
    assert done.stderr.startswith(f"trialkit: error: {path}:1: entrypoint: an empty list") and done.stderr.count("\n") == 1
    path.write_text("entrypoint: python3 train.py\nsearcher: {name: single, metric: loss}\n")
    done = cli("run", path, "")
    assert (done.returncode, done.stdout) == (2, ""), done.stdout
    assert done.stderr.startswith("trialkit: error: CONTEXT_DIR: the context directory is an empty path"), done.stderr
    done = cli("run", path, tmp_path / "absent")
    assert done.returncode == 2 and done.stderr.startswith("trialkit: error: CONTEXT_DIR: "), done.stderr


def test_a_searchers_key_written_at_the_top_says_where_it_belongs(tmp_path):
    """A new user put max_concurrent_trials at the top and was told it was not supported: it is, in the searcher."""
    config = {"entrypoint": "python3 train.py", "max_concurrent_trials": 2,
              "searcher": {"name": "random", "metric": "loss", "max_trials": 2}}
    with pytest.raises(UserError) as caught:
        parse_config(config, tmp_path)
    assert (caught.value.where, caught.value.fix) == ("max_concurrent_trials", "move it under searcher:")
    assert "not supported" not in caught.value.line()
