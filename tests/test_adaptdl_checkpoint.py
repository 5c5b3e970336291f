"""Periodic AdaptDL checkpoints: the atomic commit on a real filesystem, read back by
adaptdl's own loader, and the interval reaching every platform's trials.

The end-to-end runs are in test_adaptdl_keeper.py (a trial killed while writing a
checkpoint) and test_adaptdl_ray.py (a node crash on a real Ray cluster)."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from conftest import ROOT
from trialkit import env
from trialkit.adaptdl import checkpoint_step
from trialkit.adaptdl.boot import _trialkit_adaptdl as hook
from trialkit.control.config import load_config
from trialkit.control.specs import build_spec
from trialkit.platforms.kubernetes import adaptdljob


def test_the_hook_reads_the_variable_env_py_names():
    assert hook.EVERY_VARIABLE == env.CHECKPOINT_EVERY
    assert env.ADAPTDL_BOOT_DIR == Path(hook.__file__).parent
    assert (env.ADAPTDL_BOOT_DIR / "sitecustomize.py").is_file()


def write_checkpoint(directory: Path, name: str, step: int) -> None:
    directory.mkdir(parents=True)
    (directory / "model").write_text(f"weights at {step}")
    (directory / hook.PROGRESS_STATE).write_text(f'{{"step": {step}, "epoch": 0}}')


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_a_commit_replaces_the_checkpoint_of_the_same_restart(tmp_path, monkeypatch, exchange):
    if not exchange:  # as on a filesystem without RENAME_EXCHANGE (NFS)
        monkeypatch.setattr(hook, "_exchange", lambda a, b: False)
    write_checkpoint(tmp_path / "checkpoint-2", "checkpoint-2", 10)
    write_checkpoint(tmp_path / "checkpoint-1", "checkpoint-1", 5)  # an older restart's: removed, as adaptdl does
    write_checkpoint(tmp_path / hook.STAGING, hook.STAGING, 20)
    hook.commit(str(tmp_path), "checkpoint-2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2"]
    assert (tmp_path / "checkpoint-2" / "model").read_text() == "weights at 20"
    assert checkpoint_step(tmp_path / "checkpoint-2") == 20


@pytest.mark.skipif(importlib.util.find_spec("adaptdl") is None, reason="needs the adaptdl extra")
def test_a_swap_cut_between_its_two_renames_is_repaired_and_adaptdl_loads_the_previous_one(tmp_path, monkeypatch):
    import adaptdl.checkpoint

    # SIGKILLed after `checkpoint-0 -> _replaced-checkpoint-0`, before `_checkpoint -> checkpoint-0`.
    write_checkpoint(tmp_path / (hook.REPLACED + "checkpoint-0"), "checkpoint-0", 10)
    write_checkpoint(tmp_path / hook.STAGING, hook.STAGING, 20)
    hook.repair(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [hook.STAGING, "checkpoint-0"]

    class Model(adaptdl.checkpoint.State):
        loaded = None

        def load(self, fileobj):
            self.loaded = fileobj.read()

    monkeypatch.setenv("ADAPTDL_CHECKPOINT_PATH", str(tmp_path))
    monkeypatch.setenv("ADAPTDL_NUM_RESTARTS", "1")
    model = Model("model")
    assert adaptdl.checkpoint.load_state(model) and model.loaded == b"weights at 10"


def test_an_experiments_interval_reaches_the_adaptdljob_pods_and_the_keeper_reads_it(tmp_path):
    (tmp_path / "search_space.json").write_text('{"lr": {"_type": "choice", "_value": [0.1]}}')
    config_file = tmp_path / "config.yml"
    config_file.write_text((ROOT / "examples" / "kubernetes" / "adaptdl.yml").read_text())
    config = load_config(config_file)
    assert config.trial_checkpoint_every == 300
    spec = build_spec(config, "Exp1aB", 0, 0, {"lr": 0.1}, "http://10.20.30.40:8080", "token")
    objects = adaptdljob.render(config.training_service, spec)
    job = next(o for o in objects if o["kind"] == adaptdljob.KIND)
    container = job["spec"]["template"]["spec"]["containers"][0]
    pod_env = {e["name"]: e.get("value") for e in container["env"]}
    assert pod_env[env.CHECKPOINT_EVERY] == "300"
    assert pod_env[env.ADAPTDL["checkpoint_dir"]] == adaptdljob.CHECKPOINT_DIR  # on the job's volume
    # What the keeper in the pod then gives the training process:
    child = env.read(pod_env).child_environ({"PYTHONPATH": "/app"})
    assert child[env.CHECKPOINT_EVERY] == "300"
    assert child["PYTHONPATH"].split(os.pathsep) == [str(env.ADAPTDL_BOOT_DIR), str(env.SHIMS_BOOT_DIR), "/app"]


def test_without_the_key_the_keepers_default_holds_and_0_turns_the_hook_off():
    assert env.read({}).checkpoint_every == env.DEFAULT_CHECKPOINT_EVERY
    off = env.read({env.CHECKPOINT_EVERY: "0"}).child_environ({"PYTHONPATH": "/app"})
    assert str(env.ADAPTDL_BOOT_DIR) not in off["PYTHONPATH"] and off[env.CHECKPOINT_EVERY] == "0"


def test_the_reducers_first_retries_come_quickly_then_adaptdls_own():
    """AdaptDL's reducer sleeps 5 s after each refused connect to rank 0; its own rank 0
    is mostly refused once (its server thread binds after the first connect)."""
    slept = []

    class Clock:
        def sleep(self, seconds):
            slept.append(seconds)

    quick = hook._QuickRetry(Clock())
    for _ in range(5):
        quick.sleep(5)
    assert slept == [*hook.RECONNECT_SECONDS, 5, 5]
