"""scripts/run.sh (the container entrypoint) and scripts/cleanup.sh (the preStop hook)."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from harness import wait_until
from keeper_util import (PYTHON, assert_gone, cleanup_sh, keeper, kill_group, numbers_after, run_sh, status,
                         trial_dir)


@pytest.fixture
def run_env(trial_env, tmp_path):
    """The environment a platform gives run.sh: trialkit's names and a code dir."""
    code = tmp_path / "code"
    code.mkdir()
    return {**trial_env, "TRIALKIT_PYTHON": PYTHON, "TRIALKIT_CODE_DIR": str(code), "TRIALKIT_TRIAL_ID": "t7"}


def test_run_sh_runs_trialkit_command_under_the_keeper(run_env):
    env = {**run_env, "TRIALKIT_COMMAND": 'echo "trial $TRIALKIT_TRIAL_ID in $PWD" && exit 4'}
    r = run_sh(env)
    line = r.expect(b"trial t7 in")
    assert r.wait() == 4
    assert line.endswith(env["TRIALKIT_CODE_DIR"].encode())  # run from the code dir
    assert line in (trial_dir(env) / "stdout.log").read_bytes()
    assert status(env)["status"] == "FAILED" and status(env)["exit_code"] == 4


def test_run_sh_execs_the_keeper_so_it_is_pid_1_in_a_container(run_env):
    r = run_sh(run_env, "sh", "-c", "echo keeper $TRIALKIT_KEEPER_PID")
    assert numbers_after(r.expect(b"keeper"), b"keeper") == [r.pid]
    assert r.wait() == 0


def test_run_sh_without_a_command_says_how_to_give_one(run_env):
    r = run_sh(run_env)
    assert r.wait() == 2
    assert b"TRIALKIT_COMMAND" in r.stderr


def test_run_sh_exports_the_keys_of_secrets_mounted_under_trialkit_env_from_dir(run_env, tmp_path):
    """A TrainJob's pods take no envFrom: run.sh makes each key of the Secrets mounted there a variable, as
    envFrom would (laid out as the kubelet mounts a Secret: keys are links into ..data), the pod's own kept."""
    for index, keys in enumerate([{"AWS_ACCESS_KEY_ID": "AKIA0001", "AWS_SECRET_ACCESS_KEY": "two\nlines\n",
                                   "AWS_REGION": "from-the-secret", "not-a-name": "x"}, {"AZURE_STORAGE_KEY": "k"}]):
        volume = tmp_path / "env-from" / str(index)
        data = volume / "..2026_11_30_05_00_00.1"
        data.mkdir(parents=True)
        for key, value in keys.items():
            (data / key).write_text(value)
            (volume / key).symlink_to(f"..data/{key}")
        (volume / "..data").symlink_to(data.name)
    env = {**run_env, "TRIALKIT_ENV_FROM_DIR": str(tmp_path / "env-from"), "AWS_REGION": "the pod's own"}
    shown = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AZURE_STORAGE_KEY"]
    r = run_sh(env, PYTHON, "-c", f"import os, json; print('env:', json.dumps([os.environ.get(n) for n in {shown}]))")
    assert json.loads(r.expect(b"env:").split(b":", 1)[1]) == ["AKIA0001", "two\nlines\n", "the pod's own", "k"]
    assert r.wait() == 0


def test_startup_hook_exports_reach_the_trial(run_env):
    hook = trial_dir(run_env).parent / "code" / "startup-hook.sh"
    hook.write_text('echo "hook: preparing"\nexport FROM_HOOK="set by the hook"\n')
    r = run_sh(run_env, "sh", "-c", 'echo "trial sees: $FROM_HOOK"')
    assert r.expect(b"trial sees:") == b"trial sees: set by the hook"
    assert r.wait() == 0
    assert (trial_dir(run_env) / "startup-hook.log").read_text() == "hook: preparing\n"


def test_failing_startup_hook_fails_fast_with_its_output_shown(run_env):
    hook = trial_dir(run_env).parent / "code" / "startup-hook.sh"
    hook.write_text('echo "installing deps"\necho "pip: no such package" >&2\nfalse\necho "not reached"\n')
    started = time.monotonic()
    r = run_sh(run_env, "sh", "-c", "echo the trial ran")
    assert r.wait() == 1  # the failing line's status
    assert time.monotonic() - started < 10
    err = r.stderr
    assert b"startup-hook.sh failed" in err and b"installing deps" in err and b"pip: no such package" in err
    assert b"not reached" not in err and b"the trial ran" not in r.stdout
    assert status(run_env)["status"] == "FAILED"
    assert b"pip: no such package" in (trial_dir(run_env) / "stderr.log").read_bytes()  # the trial's log has it too


def _hook(env, text: str) -> Path:
    hook = trial_dir(env).parent / "code" / "startup-hook.sh"
    hook.write_text(text)
    return hook


def _pids_in(path: Path) -> list:
    wait_until(lambda: path.exists() and path.read_text().endswith("\n"), 60, f"pids in {path.name}")
    return [int(word) for word in path.read_text().split()]


def test_what_a_startup_hook_starts_in_the_background_ends_with_the_trial(run_env, tmp_path):
    # A service left running by the hook (a plain child, and one that left for a session of its own): the
    # trial uses it, and when the trial ends neither outlives it.
    _hook(run_env, f"sleep 300 & echo $! >> {tmp_path}/hook.pids\n"
                   f"setsid sleep 301 & echo $! >> {tmp_path}/hook.pids\n")
    r = run_sh(run_env, "sh", "-c", "echo trial ran")
    r.expect(b"trial ran")
    assert r.wait() == 0
    assert_gone(*_pids_in(tmp_path / "hook.pids"))
    assert status(run_env)["status"] == "SUCCEEDED"


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_a_hanging_startup_hook_is_stopped_within_the_trials_grace(run_env, tmp_path, ignores_sigterm):
    trap = "trap '' TERM\n" if ignores_sigterm else ""
    _hook(run_env, f"{trap}sleep 300 & echo $! $$ > {tmp_path}/hook.pids\nwait\n")
    r = run_sh({**run_env, "TRIALKIT_GRACE_SECONDS": "1"}, "sh", "-c", "echo the trial ran")
    pids = _pids_in(tmp_path / "hook.pids")
    started = time.monotonic()
    r.signal(15)
    assert r.wait() in (143, 137)
    assert time.monotonic() - started < 1 + 6  # the grace, then SIGKILL: never the hook's 300 s
    assert_gone(*pids)
    assert b"the trial ran" not in r.stdout
    assert status(run_env)["status"] == "USER_CANCELED"


def test_a_startup_hook_that_exits_0_does_not_pass_for_a_trial_that_ran(run_env):
    _hook(run_env, "echo nothing to do\nexit 0\n")
    r = run_sh(run_env, "sh", "-c", "echo the trial ran")
    assert r.wait() == 1
    assert b"the trial ran" not in r.stdout and b"startup-hook.sh called exit" in r.stderr
    assert status(run_env)["status"] == "FAILED"


def _keeper_ignoring_sigterm(env, grace: str) -> tuple:
    k = keeper(["sh", "-c", "trap '' TERM; echo ready $$; sleep 600"], env, "--grace", grace)
    return k, numbers_after(k.expect(b"ready"), b"ready")[0]


def test_cleanup_returns_once_the_keeper_has_stopped_the_trial(trial_env):
    k, child = _keeper_ignoring_sigterm(trial_env, grace="1")
    started = time.monotonic()
    assert cleanup_sh(trial_env).returncode == 0
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 1.0 + 6  # the keeper's grace, then its exit; never the whole deadline
    assert k.wait() == 137
    assert_gone(child)


def test_cleanup_gives_up_at_its_deadline_however_long_the_grace(trial_env):
    k, child = _keeper_ignoring_sigterm(trial_env, grace="60")
    started = time.monotonic()
    assert cleanup_sh(trial_env, TRIALKIT_CLEANUP_DEADLINE="1").returncode == 0
    assert 1.0 <= time.monotonic() - started < 5
    assert k.proc.poll() is None  # still in its grace: Kubernetes' SIGKILL is the backstop
    kill_group(child)  # the trial's group: the keeper sees it die and exits
    assert k.wait() == 137


def test_cleanup_without_a_keeper_returns_at_once(trial_env):
    assert cleanup_sh(trial_env).returncode == 0  # no pidfile at all
    # A pidfile whose pid now names another process: the start time tells them apart.
    other = subprocess.Popen(["sleep", "600"])
    try:
        (trial_dir(trial_env) / ".trialkit").mkdir(parents=True)
        (trial_dir(trial_env) / ".trialkit" / "keeper.pid").write_text(f"{other.pid} 1 25\n")
        started = time.monotonic()
        assert cleanup_sh(trial_env).returncode == 0
        assert time.monotonic() - started < 5
        assert other.poll() is None  # not signalled
    finally:
        other.kill()
        other.wait()


def test_a_plain_trial_command_takes_sigterm_itself_and_is_preempted(run_env):
    """dash does not exec `sh -c CMD`'s last command: a plain command line must
    run directly, or the shell dies of the SIGTERM and the training's exit 143
    (checkpointed) is lost, making a pause look like a cancel."""
    script = trial_dir(run_env).parent / "code" / "train.py"
    script.write_text(
        "import signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('checkpointed', flush=True), sys.exit(143)))\n"
        "print('training', flush=True)\n"
        "signal.pause()\n")
    r = run_sh({**run_env, "TRIALKIT_COMMAND": f'{PYTHON} train.py --name "a b"'})
    r.expect(b"training")
    r.proc.send_signal(15)
    assert r.wait() == 143
    assert b"checkpointed" in (trial_dir(run_env) / "stdout.log").read_bytes()
    assert status(run_env)["status"] == "PREEMPTED"


def test_a_command_line_starting_with_a_shell_builtin_runs_under_sh(run_env):
    r = run_sh({**run_env, "TRIALKIT_COMMAND": "exec echo builtin ok"})
    assert r.expect(b"builtin") == b"builtin ok"
    assert r.wait() == 0
