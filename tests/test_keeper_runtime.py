"""The keeper fits the runtime that stops it, and says at its start what a stop would not survive.

A runtime SIGKILLs the keeper a fixed time after its SIGTERM (a pod's
termination grace, which the Kubernetes platforms pass down; docker's and
podman's 10 s): the keeper's default grace ends inside it with the time to
record the trial's end, and a longer grace gets one line at the start. A
pipe in the command (`python3 main.py | tee log`) gets one too: the stop
reaches the pipe's reader, and the trainer dies writing to it before it
saves, as the real adaptdl library does below. The keeper as a container's
PID 1 under podman is tests/test_containers.py's.
"""
from __future__ import annotations

import importlib.util
import json
import shlex
import signal

import pytest

from keeper_util import PYTHON, ROOT, keeper, py, status, trial_dir
from trialkit import env

PRINT_GRACE = py("import os; print('grace', os.environ['TRIALKIT_GRACE_SECONDS'], flush=True)")
IN_A_POD = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", env.TERMINATION_GRACE: "10"}


def warnings(stderr: bytes) -> list:
    return [line for line in stderr.decode().splitlines() if "warning:" in line]


def test_without_a_grace_the_keeper_takes_what_the_runtime_allows(trial_env):
    k = keeper(PRINT_GRACE, {**trial_env, **IN_A_POD})
    assert k.wait() == 0
    assert "grace 4.0" in k.stdout.decode()  # 10 s less 6 s to record and flush
    assert warnings(k.stderr) == []


def test_without_a_runtime_the_default_grace_stays(trial_env):
    k = keeper(PRINT_GRACE, trial_env)  # tests run beside, not as, their container's process
    assert k.wait() == 0
    assert f"grace {env.DEFAULT_GRACE_SECONDS}" in k.stdout.decode()


@pytest.mark.parametrize("how", ["variable", "option"])
def test_a_grace_the_runtime_cuts_short_is_one_line_at_the_start(trial_env, how):
    options = ("--grace", "25") if how == "option" else ()
    environ = {**trial_env, **IN_A_POD, **({} if options else {env.GRACE_SECONDS: "25"})}
    k = keeper(py("print('ran', flush=True)"), environ, *options)
    assert k.wait() == 0
    [line] = warnings(k.stderr)
    assert "a grace of 25 s" in line and "the 10 s Kubernetes waits" in line, line
    assert f"set {env.GRACE_SECONDS}=4" in line and env.TERMINATION_GRACE in line, line
    assert ("--grace" if options else env.GRACE_SECONDS) in line.split("(", 1)[1]


def test_a_grace_that_fits_says_nothing(trial_env):
    k = keeper(py("print('ran', flush=True)"), {**trial_env, **IN_A_POD, env.GRACE_SECONDS: "4"})
    assert k.wait() == 0 and warnings(k.stderr) == []


@pytest.mark.parametrize("line, pipe", [
    ("echo hi | cat", "| cat"),
    ("echo hi |& cat -n", "|& cat -n"),  # bash's pipe of stdout and stderr
    ("echo 'a | b' || true", None),  # a quoted bar and an or-list pipe nothing
    ("echo hi", None),
])
def test_a_pipe_in_the_command_is_one_line_at_the_start(trial_env, line, pipe):
    k = keeper(["bash", "-c", line], trial_env)
    assert k.wait() == 0
    said = warnings(k.stderr)
    assert len(said) == int(pipe is not None), said
    if pipe is not None:
        assert f"(... {pipe})" in said[0] and "BrokenPipeError" in said[0] and "leave the pipe out" in said[0]
        assert "the trial dir's stdout.log" in said[0] and str(trial_dir(trial_env)) not in said[0]  # one text for all
        assert warnings((trial_dir(trial_env) / "stderr.log").read_bytes()) == said  # where the trial's output is


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("adaptdl") is None, reason="needs the adaptdl extra")
def test_adaptdl_behind_a_pipe_loses_its_checkpoint_as_the_warning_says(trial_env, tmp_path):
    # The seed's command: the keeper's warning comes before training, and the stop then goes as it says.
    train = [PYTHON, str(ROOT / "examples" / "adaptdl" / "train.py"), "--epochs", "3", "--step-seconds", "0.02"]
    line = f"{shlex.join(train)} | tee {shlex.quote(str(tmp_path / 'log'))}"
    k = keeper(["/bin/sh", "-c", line], {**trial_env, env.GRACE_SECONDS: "30"})
    k.expect(b"epoch 1 samples")
    said_before = warnings(k.stderr)
    k.signal(signal.SIGTERM)
    k.wait()
    assert any("pipes its output" in said for said in said_before), k.stderr.decode()[-2000:]
    assert not (trial_dir(trial_env) / "checkpoint" / "checkpoint-0").exists()
    assert "BrokenPipeError" in (trial_dir(trial_env) / "stderr.log").read_text()
    assert status(trial_env)["status"] != "PREEMPTED", json.dumps(status(trial_env))
