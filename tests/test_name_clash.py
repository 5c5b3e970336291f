"""A folder named `trialkit` where Python starts does not break trialkit.

In an editable install (./bootstrap.sh makes one) setuptools' finder comes after
sys.path's entries, so a folder `trialkit` in the working directory, first on the
path of `python -m`, is taken for a namespace package `trialkit` (setuptools issue
3557). Seen by a user: `trialkit run --detach` from the directory that holds the
clone (itself a folder named trialkit), and a code dir holding a `trialkit/` folder,
whose every trial failed before its command started, and their own `python
train.py` run by hand there. Real console script, real keepers, real trials here.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from experiment_util import TIMEOUT, cli, experiment, experiment_id, export
from harness import wait_until
from trialkit.process import RUN_MODULE_OFF_CWD, own_module_argv

ROOT = Path(__file__).resolve().parent.parent
TRIALKIT = Path(sys.executable).parent / "trialkit"  # the console script the README tells users to run
SPACE = {"x": {"_type": "choice", "_value": [0.25, 0.75]}}
FINAL = "import trialkit\ntrialkit.report_final_result(trialkit.get_next_parameter()['x'])\n"


def trialkit(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(TRIALKIT), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)


def finals(exp: str) -> list:
    """Each trial's status and final metric, by the parameter it was given (the metric is its x)."""
    return sorted((row["parameters"]["x"], row["status"], row["final"]) for row in export(exp))


REPORTED = [(0.25, "SUCCEEDED", 0.25), (0.75, "SUCCEEDED", 0.75)]


def test_run_detach_from_a_dir_holding_a_trialkit_folder(tmp_path):
    here = tmp_path / "clones"
    (here / "trialkit").mkdir(parents=True)  # the clone, seen from the dir that holds it
    config = experiment(here, SPACE, FINAL, maxTrialNumber=2)
    started = trialkit("run", config, "--detach", cwd=here)  # its control plane is `python -m trialkit.cli` here
    assert started.returncode == 0 and "Traceback" not in started.stderr, started.stdout + started.stderr
    exp = experiment_id(started.stdout.splitlines()[0])
    wait_until(lambda: "DONE" in trialkit("experiment", "show", exp, cwd=here).stdout, TIMEOUT,
               "the detached run to end", every=0.2)
    assert finals(exp) == REPORTED


def test_trials_in_a_code_dir_holding_a_trialkit_folder_report_through_the_sdk(tmp_path):
    # The trial's Python is the editable install's; its script's dir (the code dir) is first on its sys.path.
    config = experiment(tmp_path, SPACE, FINAL, maxTrialNumber=2, trialConcurrency=1,
                        trialCommand=f"{shlex.quote(sys.executable)} trial.py")
    (config.parent / "trialkit").mkdir()
    (config.parent / "trialkit" / "notes.txt").write_text("the user's notes\n")
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert finals(experiment_id(done.stdout.splitlines()[0])) == REPORTED


PROBE = "import json, sys, trialkit\nprint(json.dumps([sys.path[:1], '' in sys.path, trialkit.__version__]))\n"


@pytest.mark.parametrize("safe_path", [None, "1"], ids=["plain", "PYTHONSAFEPATH"])
def test_the_code_for_any_python_takes_off_only_the_working_directory(tmp_path, safe_path):
    # What an interpreter older than 3.11 runs (no -P), and scripts/run.sh for every keeper: with PYTHONSAFEPATH
    # the working directory is not on the path, and the first entry (PYTHONPATH's here) must stay.
    (tmp_path / "trialkit").mkdir()
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "probe.py").write_text(PROBE)
    environ = {**os.environ, "PYTHONPATH": str(tmp_path / "probes")}
    environ.pop("PYTHONSAFEPATH", None)
    if safe_path:
        environ["PYTHONSAFEPATH"] = safe_path
    done = subprocess.run([sys.executable, "-c", RUN_MODULE_OFF_CWD, "probe"], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    from trialkit import __version__
    assert json.loads(done.stdout) == [[str(tmp_path / "probes")], False, __version__]


def test_every_spawn_of_our_own_modules_takes_the_working_directory_off():
    # This Python (3.11+) has -P; the keeper's exec in run.sh runs the same code as the Python side's fallback.
    assert own_module_argv("trialkit.cli", "ui") == [sys.executable, "-P", "-m", "trialkit.cli", "ui"]
    assert f"exec \"$python\" -c '{RUN_MODULE_OFF_CWD}' \\\n  trialkit.keeper \"$@\"" in (
        ROOT / "scripts" / "run.sh").read_text()
    spawned = subprocess.run(["grep", "-rnE", r'"-m", *"trialkit|-m trialkit\.[a-z_.]+ "?\$', "trialkit", "scripts",
                              "--include=*.py", "--include=*.sh"], cwd=ROOT, capture_output=True, text=True)
    assert spawned.stdout == "", spawned.stdout


@pytest.mark.parametrize("own, warned", [
    ("trialkit.py", True),
    ("trialkit/__init__.py", True),
    ("trialkit/notes.txt", False),  # a folder trialkit mends: no word
    (None, False),  # the checkout itself: its trialkit/ is the keeper's own
], ids=["module", "package", "folder", "the-checkout"])
def test_the_keeper_says_at_start_which_trialkit_of_the_code_dirs_shadows_the_sdk(tmp_path, own, warned):
    code_dir = ROOT if own is None else tmp_path / "code"
    if own is not None:
        (code_dir / own).parent.mkdir(parents=True, exist_ok=True)
        (code_dir / own).write_text("")
    environ = {**os.environ, "TRIALKIT_TRIAL_DIR": str(tmp_path / "trial")}
    done = subprocess.run(own_module_argv("trialkit.keeper", "--", sys.executable, "-c", "pass"), cwd=code_dir,
                          env=environ, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "a script there imports as trialkit" in line]
    name = "trialkit.py" if own == "trialkit.py" else "a package trialkit/"
    line = (f"[trialkit-keeper] warning: the code dir holds {name}, which a script there imports as trialkit instead "
            "of trialkit's SDK (its functions missing, or not the SDK's); rename it")
    assert said == ([line] if warned else [])


def test_a_launcher_and_its_workers_in_a_code_dir_holding_a_trialkit_folder(tmp_path):
    # torchrun starts each worker as `python -u -m trialkit.launch.wrap_rank` in the code dir: its argv is
    # torchrun's, so what finds the real trialkit there is the training process's sitecustomize (shims/boot).
    pytest.importorskip("torch")
    (tmp_path / "trialkit").mkdir()
    (tmp_path / "trialkit" / "notes.txt").write_text("the user's notes\n")
    (tmp_path / "train.py").write_text("import trialkit\nprint('worker sees', trialkit.__version__)\n")
    environ = {**os.environ, "TRIALKIT_TRIAL_DIR": str(tmp_path / "trial")}
    done = subprocess.run(own_module_argv("trialkit.keeper", "--", sys.executable, "-m",
                                          "trialkit.launch.torch_distributed", "train.py"),
                          cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=TIMEOUT)
    from trialkit import __version__
    assert done.returncode == 0 and f"[rank=0] worker sees {__version__}" in done.stdout, done.stdout + done.stderr


def test_a_users_own_script_beside_a_trialkit_folder_imports_trialkit(tmp_path):
    """`python train.py` by hand in a dir holding a folder `trialkit/` (notes): the install's .pth puts
    NotANamespaceFinder first, so the script's `import trialkit` is trialkit, not that folder; nothing of this
    checkout on PYTHONPATH (which would find it first)."""
    (tmp_path / "trialkit").mkdir()
    (tmp_path / "trialkit" / "notes.txt").write_text("lr 0.1 was best\n")
    (tmp_path / "train.py").write_text("import trialkit\nprint(trialkit.__file__, trialkit.get_next_parameter)\n")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{ROOT / 'trialkit' / '__init__.py'} <function get_next_parameter"), done.stdout
