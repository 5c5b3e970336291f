"""The container contract, run for real: the trial image under podman (marker `containers`).

The image is images/build.sh's (the public images/Dockerfile.cpu, built
offline), run.sh is its entrypoint and execs the keeper as PID 1. Each test
starts containers, does what a runtime or an operator would (podman stop, the
preStop hook by exec, a read-only root, an arbitrary uid), and reads what the
keeper recorded in the trial dir. The `containers` fixture fails a test that
leaves a container, a process, a mount or a cgroup behind.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from containers_util import needs_podman, podman
from harness import wait_until
from trialkit.process import RUN_MODULE_OFF_CWD
from trialkit.statuses import PREEMPTED, SUCCEEDED, USER_CANCELED

pytestmark = [pytest.mark.containers, needs_podman]

TRIAL_DIR = "/var/lib/trialkit/trial"

# A trial that says it is ready (a file in the trial dir), then waits to be
# stopped; on SIGTERM it does what T_ON_TERM says: exit 0, checkpoint and exit
# 143, or nothing (it ignores the signal).
WAIT_FOR_STOP = r"""
import os, pathlib, signal, sys, time
home = pathlib.Path(os.environ["TRIALKIT_TRIAL_DIR"])
how = os.environ["T_ON_TERM"]
def on_term(signum, frame):
    if how == "checkpoint":
        (home / "saved").write_text("step 3")
        sys.exit(143)
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if how == "ignore" else on_term)
(home / "ready").touch()
while True:
    time.sleep(0.05)
"""

# Orphans: a child forks a grandchild and exits; the grandchild, reparented to
# PID 1 (the keeper), exits in turn. Zombies left in the container are counted.
ORPHANS = r"""
import os, time
for _ in range(3):
    child = os.fork()
    if child == 0:
        if os.fork() == 0:
            time.sleep(0.2)
            os._exit(0)
        os._exit(0)
    os.waitpid(child, 0)  # the child is the trial's to reap; its orphan is PID 1's
time.sleep(1.0)
zombies = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        continue
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        zombies.append(pid)
print("zombies", len(zombies), flush=True)
"""

PRINT_IDS = r"""
import os
print("uid", os.getuid(), "gid", os.getgid(), flush=True)
print("pid1", open("/proc/1/cmdline").read().replace("\0", " ").strip(), flush=True)
"""

READ_ONLY = r"""
import os, pathlib
try:
    pathlib.Path("/home/trial/x").write_text("x")
    print("root is writable", flush=True)
except OSError as err:
    print("root refused:", err.strerror, flush=True)
(pathlib.Path(os.environ["TRIALKIT_TRIAL_DIR"]) / "out").write_text("written")
"""


def python(script: str) -> str:
    """A TRIALKIT_COMMAND line (run.sh hands it to the keeper, which runs it with sh: the quotes hold
    shell syntax). The other tests pass their command as run.sh's arguments: no shell, which would
    take the SIGTERM itself."""
    return "python3 -c " + "'" + script.replace("'", "'\\''") + "'"


def trial_dir(tmp_path: Path) -> Path:
    path = tmp_path / "trial"
    path.mkdir()
    path.chmod(0o777)  # any uid the container runs as writes there
    return path


def mounted(path: Path) -> tuple:
    return ("-v", f"{path}:{TRIAL_DIR}")


def status(path: Path) -> dict:
    return json.loads((path / ".trialkit" / "status.json").read_text())


def started(containers, image, home: Path, on_term: str, *options: str, **env) -> str:
    """A container whose trial is running and waiting to be stopped."""
    container = containers.start(image, *mounted(home), *options, command=["python3", "-c", WAIT_FOR_STOP],
                                 env={"T_ON_TERM": on_term, **env})
    wait_until(lambda: (home / "ready").exists(), 30, "the trial to start")
    return container


@pytest.mark.parametrize("user", [(), ("--user", "123456:0")], ids=["image-user", "uid-without-passwd-entry"])
def test_the_keeper_is_pid_1_and_the_trial_runs_unprivileged(containers, image, tmp_path, user):
    # No trial dir is mounted: the image's own must be writable by whatever uid runs it.
    container = containers.start(image, *user, env={"TRIALKIT_COMMAND": python(PRINT_IDS)})
    assert containers.wait(container) == 0, containers.logs(container)
    out = containers.logs(container)
    uid = user[1].split(":")[0] if user else "1000"
    assert f"uid {uid} gid 0" in out and f"pid1 python3 -c {RUN_MODULE_OFF_CWD} trialkit.keeper" in out, out
    copied = tmp_path / "status.json"
    podman("cp", f"{container}:{TRIAL_DIR}/.trialkit/status.json", str(copied))
    assert json.loads(copied.read_text())["status"] == SUCCEEDED


@pytest.mark.parametrize("on_term, code, final", [
    ("exit", 0, SUCCEEDED),
    ("checkpoint", 143, PREEMPTED),
    ("ignore", 128 + 9, USER_CANCELED),  # the keeper's SIGKILL after the grace: it exits as the trial died
])
def test_podman_stop(containers, image, tmp_path, on_term, code, final):
    home = trial_dir(tmp_path)
    container = started(containers, image, home, on_term, TRIALKIT_GRACE_SECONDS="1")
    began = time.monotonic()
    podman("stop", "-t", "20", container)  # far past the grace: the keeper ends by itself
    assert containers.wait(container) == code
    assert time.monotonic() - began < 10
    assert status(home)["status"] == final, status(home)
    assert (home / "saved").exists() is (on_term == "checkpoint")


def test_podman_stop_with_its_default_timeout_leaves_an_ended_status(containers, image, tmp_path):
    # Neither side sets a timeout: podman's 10 s must cover the image's grace and the keeper's flush.
    home = trial_dir(tmp_path)
    container = started(containers, image, home, "ignore")
    podman("stop", container)
    containers.wait(container)
    assert status(home)["status"] == USER_CANCELED, "SIGKILLed mid-grace, the status says RUNNING forever"


def test_a_users_own_image_stopped_with_podmans_default_timeout_ends_its_trial(containers, user_image, tmp_path):
    # trialkit by pip, run.sh as the entrypoint, no TRIALKIT_* variable anywhere: the keeper, its PID 1, takes the
    # grace podman's 10 s allow, and records the end of a trial that ignores SIGTERM before podman's SIGKILL.
    home = trial_dir(tmp_path)
    container = containers.start(user_image, "-v", f"{home}:/work", command=["python3", "-c", WAIT_FOR_STOP],
                                 env={"T_ON_TERM": "ignore"})
    wait_until(lambda: (home / "ready").exists(), 30, "the trial to start")
    began = time.monotonic()
    podman("stop", container)
    containers.wait(container)
    assert time.monotonic() - began < 10, "podman's SIGKILL ended it"
    assert status(home)["status"] == USER_CANCELED, "SIGKILLed mid-grace, the status says RUNNING forever"
    assert "warning" not in containers.logs(container), containers.logs(container)


def test_a_users_own_image_under_podmans_init_ends_its_trial_before_the_sigkill(containers, user_image, tmp_path):
    # `podman run --init`: PID 1 is /run/podman-init, the keeper its child; the keeper still takes the grace
    # podman's 10 s allow, and records the end of a trial that ignores SIGTERM.
    home = trial_dir(tmp_path)
    container = containers.start(user_image, "--init", "-v", f"{home}:/work", command=["python3", "-c", WAIT_FOR_STOP],
                                 env={"T_ON_TERM": "ignore"})
    wait_until(lambda: (home / "ready").exists(), 30, "the trial to start")
    pid1 = podman("exec", container, "cat", "/proc/1/comm").stdout.strip()
    began = time.monotonic()
    podman("stop", container)
    containers.wait(container)
    assert time.monotonic() - began < 10, f"podman's SIGKILL ended it (PID 1 {pid1})"
    ended = status(home)
    assert ended["status"] == USER_CANCELED, ended
    assert ended["reason"] == "killed: it was still running 4 s after SIGTERM (TRIALKIT_GRACE_SECONDS)", ended
    assert f"[trialkit-keeper] {ended['reason']}" in containers.logs(container)


def test_a_grace_longer_than_podman_allows_is_said_at_the_start(containers, user_image, tmp_path):
    home = trial_dir(tmp_path)
    container = containers.start(user_image, "-v", f"{home}:/work", command=["python3", "-c", "print('ran')"],
                                 env={"TRIALKIT_GRACE_SECONDS": "25"})
    assert containers.wait(container) == 0
    said = [line for line in containers.logs(container).splitlines() if "warning" in line]
    assert len(said) == 1 and "the 10 s podman waits" in said[0] and "TRIALKIT_GRACE_SECONDS=4" in said[0], said


def test_orphans_are_reaped(containers, image):
    container = containers.start(image, command=["python3", "-c", ORPHANS])
    assert containers.wait(container) == 0
    assert "zombies 0" in containers.logs(container), containers.logs(container)


def test_cleanup_sh_as_the_prestop_hook_lets_the_trial_checkpoint(containers, image, tmp_path):
    home = trial_dir(tmp_path)
    container = started(containers, image, home, "checkpoint", TRIALKIT_GRACE_SECONDS="5")
    # As the kubelet runs it; the hook ends with the container (its PID 1 is gone).
    podman("exec", container, "/bin/sh", "/opt/trialkit/scripts/cleanup.sh", check=False)
    assert containers.wait(container) == 143
    assert status(home)["status"] == PREEMPTED and (home / "saved").read_text() == "step 3"


def test_cleanup_sh_is_bounded_by_its_deadline(containers, image, tmp_path):
    home = trial_dir(tmp_path)
    container = started(containers, image, home, "ignore", TRIALKIT_GRACE_SECONDS="60")
    began = time.monotonic()
    hook = podman("exec", "-e", "TRIALKIT_CLEANUP_DEADLINE=1", container, "/bin/sh", "/opt/trialkit/scripts/cleanup.sh")
    took = time.monotonic() - began
    assert hook.returncode == 0 and took < 8, f"the hook took {took:.1f} s"
    assert containers.inspect(container)["State"]["Running"], "the keeper is still in its grace"
    assert status(home)["status"] == "RUNNING"


def test_a_read_only_root_with_only_the_trial_dir_writable(containers, image, tmp_path):
    home = trial_dir(tmp_path)
    container = containers.start(image, "--read-only", "--read-only-tmpfs=false", *mounted(home),
                                 command=["python3", "-c", READ_ONLY])
    assert containers.wait(container) == 0, containers.logs(container)
    assert "root refused: Read-only file system" in containers.logs(container)
    assert (home / "out").read_text() == "written" and status(home)["status"] == SUCCEEDED
