"""Trial classes: loading by module or file, one-line mistakes, save on a stop, load on a restart."""
from __future__ import annotations

import signal
import subprocess

import pytest

from launch_support import PY, Proc, launch_env, write
from trialkit.errors import UserError
from trialkit.trial import Trial, load

GOOD = """
from trialkit.trial import Trial

class Good(Trial):
    def run(self):
        print(f"running with {self.parameters}", flush=True)
        return self.parameters.get("x", 0) * 2

NotATrial = dict
"""


def run_trial(tmp_path, spec: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "trialkit.launch.run_trial", spec], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=launch_env(tmp_path, **extra))


@pytest.mark.parametrize("spec", ["good_trial:Good", "good_trial.py:Good", "pkg.good_trial:Good", "{dir}/pkg/good_trial.py:Good"])
def test_load_by_module_or_file(tmp_path, monkeypatch, spec):
    write(tmp_path, "good_trial.py", GOOD)
    (tmp_path / "pkg").mkdir()
    write(tmp_path / "pkg", "__init__.py", "")
    write(tmp_path / "pkg", "good_trial.py", GOOD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = load(spec.format(dir=tmp_path))
    assert issubclass(cls, Trial) and cls.__name__ == "Good"


@pytest.mark.parametrize("spec, says", [
    ("good_trial", "'good_trial' does not name a class"),
    ("good_trial:", "does not name a class"),
    ("missing.py:Good", "no file missing.py"),
    ("no_such_module:Good", "no module named no_such_module"),
    ("good_trial:Missing", "good_trial has no class Missing"),
    ("good_trial:NotATrial", "good_trial:NotATrial is not a trialkit.Trial"),
    ("good trial:Good", "'good trial' is not a module name"),
])
def test_mistakes_are_one_line_and_exit_2(tmp_path, spec, says):
    write(tmp_path, "good_trial.py", GOOD)
    done = run_trial(tmp_path, spec)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("trialkit.launch.run_trial: error: --trial: ")
    assert says in done.stderr, done.stderr


def test_an_error_inside_the_users_module_keeps_its_traceback(tmp_path):
    write(tmp_path, "broken.py", "import trialkit\nimport no_such_dependency_here\n\n\nclass Anything(trialkit.Trial):\n    pass\n")
    done = run_trial(tmp_path, "broken:Anything")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "No module named 'no_such_dependency_here'" in done.stderr


def test_parameters_in_final_result_out(tmp_path):
    write(tmp_path, "good_trial.py", GOOD)
    done = run_trial(tmp_path, "good_trial:Good", TRIALKIT_PARAMETERS='{"x": 21}')
    assert done.returncode == 0, done.stderr
    assert "running with {'x': 21}" in done.stdout
    assert "final result" in done.stdout and "42" in done.stdout


CHECKPOINTING = """
import os, signal, time
from pathlib import Path
from trialkit.trial import Trial

class Counting(Trial):
    step = 0

    def run(self):
        print(f"ready from step {self.step}", flush=True)
        while not self.should_stop():
            time.sleep(0.01)
        return None

    def save(self, directory):
        (Path(directory) / "step").write_text("7")
        print("saved", flush=True)

    def load(self, directory):
        self.step = int((Path(directory) / "step").read_text())
"""


def test_a_stop_saves_and_exits_143_and_a_restart_loads(tmp_path):
    write(tmp_path, "counting.py", CHECKPOINTING)
    environ = launch_env(tmp_path, TRIALKIT_CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    first = Proc([PY, "-m", "trialkit.launch.run_trial", "counting:Counting"], environ, cwd=tmp_path)
    first.wait_for("ready from step 0")
    first.signal(signal.SIGTERM)
    assert first.finish(60) == 143
    assert "saved" in first.text
    second = Proc([PY, "-m", "trialkit.launch.run_trial", "counting:Counting"], environ, cwd=tmp_path)
    second.wait_for("ready from step 7")
    second.signal(signal.SIGINT)
    assert second.finish(60) == 143


def test_a_trial_without_save_dies_of_sigterm_as_usual(tmp_path):
    write(tmp_path, "plain.py", """
    import time
    from trialkit.trial import Trial
    class Plain(Trial):
        def run(self):
            print("ready", flush=True)
            time.sleep(60)
    """)
    proc = Proc([PY, "-m", "trialkit.launch.run_trial", "plain:Plain"], launch_env(tmp_path), cwd=tmp_path)
    proc.wait_for("ready")
    proc.signal(signal.SIGTERM)
    assert proc.finish(60) == -signal.SIGTERM


def test_run_must_be_defined():
    with pytest.raises(NotImplementedError):
        Trial({}).run()


def test_spec_errors_are_user_errors():
    with pytest.raises(UserError):
        load("nothing-here")
