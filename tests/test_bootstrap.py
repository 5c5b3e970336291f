"""bootstrap.sh installs what each command needs, once: the demo its part, the tests the rest.

The script runs as a user runs it, in a copy of the checkout's inputs, with
a stand-in Python (PYTHON) whose venv, pip and programs only write down what
they were asked: which installs ran, in which order, is the behaviour here;
the installs themselves are pip's (the demo on a fresh machine is timed in
the issue's report, not in a test).
"""
from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path
from typing import List

import pytest

from conftest import ROOT

INPUTS = ("bootstrap.sh", "setup.py", "constraints.txt", "tools/build_horovod.sh", "tools/nni_venv.sh")

# A python that makes venvs of itself and logs every call: `-m venv DIR`, `-m pip install ...`, `-c CODE`
# (build_horovod.sh asks torch's and Python's versions), and the venv's `trialkit` and pytest.
STAND_IN = """#!/bin/sh
echo "$(basename "$0") $*" >>"$BOOTSTRAP_LOG"
case "$1 $2" in
  "-m venv") mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; cp "$0" "$3/bin/trialkit" ;;
  "-c "*) case "$2" in *torch*) echo 2.13.0 ;; *version_info*) echo cp311 ;; esac ;;
esac
case "$*" in  # an editable install's build prints setuptools' banner; PIP_FAILS: it fails as pip fails
  *"pip install "*" -e "*)
    printf 'Collecting optuna>=3\nCollecting aiohttp>=3.9\n'
    printf '  !!\n  Please be careful with folders in your working directory with the same\n  !!\n' >&2
    [ -z "$PIP_FAILS" ] || { echo "ERROR: No matching distribution found for aiohttp>=3.9" >&2; exit 1; } ;;
esac
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    for name in INPUTS:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    python = tmp_path / "python3"
    python.write_text(STAND_IN)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    wheel = tmp_path / "cache" / "wheels" / "horovod-0.28.1-torch2.13.0-cp311" / "horovod-0.28.1-cp311-linux.whl"
    wheel.parent.mkdir(parents=True)
    wheel.touch()  # built once before: the cache serves it
    return root


def run_bootstrap(checkout: Path, *args: str, terminal: bool = False, **environ: str) -> subprocess.CompletedProcess:
    """./bootstrap.sh ARGS as run, its output as text; the stand-in's calls go to calls.log beside the checkout.
    `terminal`: on a terminal that script(1) gives it, whose output (stdout and stderr as one, lines ended by
    the terminal's \\r\\n) is stdout."""
    log = checkout.parent / "calls.log"
    log.unlink(missing_ok=True)
    log.touch()
    env = dict(os.environ, TRIALKIT_TEST_WORKERS="3", PYTHON=str(checkout.parent / "python3"), TRIALKIT_CACHE=str(checkout.parent / "cache"),
               BOOTSTRAP_LOG=str(log), **environ)
    command = ["bash", "bootstrap.sh", *args]
    if terminal:  # its carriage returns kept: no universal newlines
        command = ["script", "-qec", shlex.join(command), "/dev/null"]
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, timeout=60)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def bootstrap(checkout: Path, *args: str) -> List[str]:
    """Run ./bootstrap.sh ARGS; the stand-in's calls, as `program args`."""
    done = run_bootstrap(checkout, *args)
    assert done.returncode == 0, done.stderr
    return (checkout.parent / "calls.log").read_text().splitlines()


def installs(calls: List[str]) -> List[str]:
    """What pip was asked to install in the project's venv, in order (its options and their values left out)."""
    out = []
    for call in calls:
        if call.startswith("python -m pip install "):
            words = call.split()[4:]
            valued = {i + 1 for i, word in enumerate(words) if word in ("-c", "--progress-bar")}
            out.append(" ".join(w for i, w in enumerate(words) if not w.startswith("-") and i not in valued))
    return out


def test_the_demo_installs_torch_and_the_control_extra_and_runs_the_quickstart(checkout):
    calls = bootstrap(checkout, "demo")
    root = str(checkout)
    assert installs(calls) == ["pip wheel setuptools<81", "torch==2.13.0", f"{root}[control]"]
    assert calls[-2:] == [f"python -m compileall -q -j 0 {root}/trialkit", "trialkit run examples/quickstart/config.yml"]
    assert not any("horovod" in call or "nni" in call for call in calls)


def test_the_tests_after_the_demo_add_only_the_rest(checkout):
    bootstrap(checkout, "demo")
    calls = bootstrap(checkout, "test", "-x")
    assert installs(calls)[:2] == [f"{checkout}[all,test]", str(checkout.parent / "cache" / "wheels" /
                                   "horovod-0.28.1-torch2.13.0-cp311" / "horovod-0.28.1-cp311-linux.whl")]
    assert "torch==2.13.0" not in installs(calls)
    assert any(call.startswith("python3 -m venv") and "nni-3.0-venv" in call for call in calls)  # NNI's own
    assert calls[-1] == "python -m pytest -n 3 --dist loadgroup -x"
    assert f"python -m compileall -q -j 0 {checkout}/trialkit" in calls  # the sources, compiled before the tests


def test_the_tests_run_in_workers_unless_told_not_to(checkout):
    assert bootstrap(checkout, "test", "-p", "no:xdist", "-x")[-1] == "python -m pytest -p no:xdist -x"
    assert bootstrap(checkout, "test", "-n0")[-1] == "python -m pytest -n 3 --dist loadgroup -n0"  # the last -n


def test_the_demo_after_the_tests_installs_nothing_and_a_changed_input_installs_again(checkout):
    bootstrap(checkout, "test")
    assert installs(bootstrap(checkout, "demo")) == []
    assert installs(bootstrap(checkout, "test")) == []
    with open(checkout / "constraints.txt", "a") as pins:
        pins.write("somepin==1.0\n")
    assert installs(bootstrap(checkout, "demo")) == ["pip wheel setuptools<81", "torch==2.13.0",
                                                     f"{checkout}[control]"]


def test_the_demos_steps_keep_the_editable_builds_banner_out_and_a_failing_install_shows_its_error(checkout):
    failed = run_bootstrap(checkout, "demo", PIP_FAILS="1")
    assert failed.returncode == 1, failed.stderr
    assert "ERROR: No matching distribution found for aiohttp>=3.9" in failed.stderr
    assert f"bootstrap: pip failed (exit 1); its whole output: {checkout}/.venv/.bootstrap-pip.log" in failed.stderr
    assert "trialkit run" not in (checkout.parent / "calls.log").read_text()  # the demo never started
    done = run_bootstrap(checkout, "demo")
    assert done.returncode == 0, done.stderr
    assert "bootstrap: [3/3] trialkit and its control extra" in done.stderr
    assert "Please be careful" not in done.stdout + done.stderr and "!!" not in done.stderr


def test_on_a_terminal_the_logged_install_says_how_far_pip_got_on_one_line(checkout):
    """A terminal (script(1) gives bootstrap one) sees the packages pip collects, counted on one line that is
    rewritten in place and cleared after; a failure still shows its error and the log."""
    failed = run_bootstrap(checkout, "demo", terminal=True, PIP_FAILS="1")
    assert failed.returncode == 1 and "bootstrap: pip failed (exit 1)" in failed.stdout, failed.stdout
    done = run_bootstrap(checkout, "demo", terminal=True)
    assert done.returncode == 0, done.stdout
    assert "\r\n\rbootstrap:       1 packages, collecting optuna>=3" in done.stdout, done.stdout
    assert "\rbootstrap:       2 packages, collecting aiohttp>=3.9" in done.stdout
    assert "Please be careful" not in done.stdout
