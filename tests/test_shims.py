"""trialkit's fallback packages (trialkit/shims): served to a training process only
where its Python finds no real package of that name, through the boot dir the
keeper puts on its PYTHONPATH, beside AdaptDL's and the interpreter's own
sitecustomize. Real interpreters, real imports; the nni venv is the real nni 3.0's.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Dict, Optional

import pytest

from trialkit import env
from trialkit.shims import BOOT_DIR

ROOT = Path(__file__).resolve().parent.parent
PROBE = "import nni, trialkit; print(nni.__file__); print(trialkit.__file__)"


def child(checkpoint_every: float = 0.0, pythonpath: str = "", trial_dir: Optional[Path] = None) -> Dict[str, str]:
    """The environment the keeper gives a training process (its trial dir `trial_dir`, else the working dir:
    give one wherever the process runs, or its channel lands in the checkout)."""
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        base["PYTHONPATH"] = pythonpath
    given = {env.TRIAL_DIR: str(trial_dir)} if trial_dir is not None else {}
    trial = env.read({env.CHECKPOINT_EVERY: str(checkpoint_every), **given})
    return trial.child_environ(base)


def run(python: str, code: str, environ: Dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", code], env=environ, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_keepers_child_has_the_boot_dir_once_after_adaptdls_and_before_the_users():
    assert env.SHIMS_BOOT_DIR == BOOT_DIR and (BOOT_DIR / "sitecustomize.py").is_file()
    both = child(300, "/app").get("PYTHONPATH").split(os.pathsep)
    assert both == [str(env.ADAPTDL_BOOT_DIR), str(BOOT_DIR), "/app"]
    assert child(0, "/app")["PYTHONPATH"].split(os.pathsep) == [str(BOOT_DIR), "/app"]
    # An environment that already holds them (a keeper's own, inherited) gets each once.
    again = env.read({}).child_environ(child(300, "/app"))["PYTHONPATH"].split(os.pathsep)
    assert again == both


def test_where_nni_is_absent_the_trial_gets_trialkits_nni(tmp_path):
    done = run(sys.executable, PROBE, child(trial_dir=tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == str(BOOT_DIR.parent / "nni" / "__init__.py")
    assert "trialkit's nni serves the trial API" in done.stderr
    # The boot dir's finder is what the keeper adds (this interpreter has trialkit's .pth finder without it).
    finders = "import sys; print([type(f).__name__ for f in sys.meta_path])"
    assert "'FallbackFinder'" in run(sys.executable, finders, child(trial_dir=tmp_path), tmp_path).stdout
    plain = run(sys.executable, finders, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, tmp_path)
    assert plain.returncode == 0 and "'FallbackFinder'" not in plain.stdout, plain.stderr


def test_an_interpreter_without_trialkit_gets_trialkit_too(tmp_path):
    """A local trial runs the user's own Python, where trialkit is often not installed."""
    bare = tmp_path / "bare"
    done = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    python = str(bare / "bin" / "python")
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert "No module named 'trialkit'" in run(python, "import trialkit", environ, tmp_path).stderr
    served = run(python, PROBE + "; nni.report_final_result(0.5)", child(trial_dir=tmp_path), tmp_path)
    assert served.returncode == 0, served.stderr
    assert served.stdout.splitlines()[1] == str(ROOT / "trialkit" / "__init__.py")
    assert "final result 0: 0.5" in served.stdout  # trialkit's SDK, standalone outside a keeper


def test_a_real_nni_is_never_shadowed(tmp_path, nni_python):
    # To stderr: nni in local mode sends stdout to $NNI_OUTPUT_DIR/trial.log.
    code = "import sys, nni; print('NNI-AT', nni.__file__, file=sys.stderr)"
    done = run(nni_python, code, child(300, trial_dir=tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"NNI-AT {Path(nni_python).parent.parent}/lib/" in done.stderr  # the venv's site-packages
    assert "trialkit's nni" not in done.stderr


def test_nni_in_the_scripts_own_dir_wins_too(tmp_path):
    (tmp_path / "nni.py").write_text("WHO = 'mine'\n")
    done = run(sys.executable, "import nni; print(nni.WHO)", child(trial_dir=tmp_path), tmp_path)
    assert done.stdout.strip() == "mine", done.stderr


def test_the_boot_hooks_and_the_users_sitecustomize_each_run_once(tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    (users / "sitecustomize.py").write_text("print('USERS-SITECUSTOMIZE', flush=True)\n")
    code = ("import sys; finders = [type(f).__name__ for f in sys.meta_path]; "
            "print(finders.count('FallbackFinder'), finders.count('_AdaptDLFinder'), finders[-1]); import nni")
    for every, adaptdl_finders in ((300, 1), (0, 0)):
        done = run(sys.executable, code, child(every, str(users), tmp_path), tmp_path)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines.count("USERS-SITECUSTOMIZE") == 1, done.stdout
        assert lines[-1] == f"1 {adaptdl_finders} FallbackFinder", done.stdout


@pytest.fixture(scope="module")
def nni_python():
    if shutil.which("bash") is None:
        pytest.skip("no bash to run tools/nni_venv.sh")
    done = subprocess.run(["bash", str(ROOT / "tools" / "nni_venv.sh")], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"cannot prepare the nni 3.0 venv: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


PTH = Path(sysconfig.get_paths()["purelib"]) / "trialkit-fallbacks.pth"
NOTEBOOK = """
import sys
at_start = sorted(m for m in sys.modules if m.split(".")[0] in ("trialkit", "nni"))
from nni.experiment import Experiment, ExperimentConfig, AlgorithmConfig, LocalConfig
import nni, trialkit.experiment
print(at_start, nni.__file__, Experiment is trialkit.experiment.Experiment, LocalConfig is trialkit.experiment.LocalConfig,
      nni.experiment.AlgorithmConfig is trialkit.experiment.AlgorithmConfig)
"""


def test_nni_experiment_in_any_python_with_trialkit_installed(tmp_path):
    """NNI's notebooks run in the user's Python, no keeper: the .pth setup.py installs serves `nni` there,
    trialkit.experiment's names as nni.experiment's, and loads nothing of trialkit at start."""
    assert PTH.is_file(), f"no {PTH}: reinstall trialkit (pip install -e .) so setup.py puts it there"
    done = run(sys.executable, NOTEBOOK, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", str(BOOT_DIR.parent / "nni" / "__init__.py"), "True", "True", "True"]


def test_nni_experiment_is_an_attribute_of_a_bare_import_nni(tmp_path):
    """`import nni; nni.experiment.Experiment(...)`, with no `import nni.experiment` before it: NNI's package
    allows it, and the docs say trialkit's does."""
    code = "import nni, trialkit.experiment; print(nni.experiment.Experiment is trialkit.experiment.Experiment)"
    done = run(sys.executable, code, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, tmp_path)
    assert done.returncode == 0 and done.stdout == "True\n", done.stderr[-2000:]


def test_the_pth_does_not_shadow_a_real_nni(tmp_path, nni_python):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    shutil.copy(PTH, site_dir)  # the nni venv with trialkit's .pth, trialkit on its path
    code = (f"import site; site.addsitedir({str(site_dir)!r}); import nni, determined; "
            "print(nni.__file__); print(determined.__file__)")
    done = run(nni_python, code, dict(os.environ, PYTHONPATH=str(ROOT)), tmp_path)
    assert done.returncode == 0, done.stderr
    real = done.stdout.splitlines()[0]
    assert real.startswith(f"{Path(nni_python).parent.parent}/lib/") and "/site-packages/nni/" in real, real
    # ... while the .pth's finder serves what the venv lacks: it was live.
    assert done.stdout.splitlines()[1] == str(BOOT_DIR.parent / "determined" / "__init__.py")


MERGE_CASES = """
import argparse, json
from nni.utils import merge_parameter, extract_scalar_reward
out = []
def attempt(f):
    try:
        out.append(repr(f()))
    except Exception as err:
        out.append(type(err).__name__ + ': ' + str(err))
attempt(lambda: merge_parameter({'lr': 0.1, 'layers': 2, 'act': 'relu'}, {'lr': 1, 'act': 'tanh'}))
attempt(lambda: vars(merge_parameter(argparse.Namespace(lr=0.1, epochs=3), {'epochs': 5})))
attempt(lambda: merge_parameter({'lr': 0.1}, {'momentum': 0.9}))
attempt(lambda: merge_parameter({'layers': 2}, {'layers': 2.5}))
attempt(lambda: merge_parameter({'lr': None}, {'lr': 'x'}))
attempt(lambda: merge_parameter({'lr': 0.1}, None))
attempt(lambda: extract_scalar_reward({'default': 0.5, 'loss': 1}))
attempt(lambda: extract_scalar_reward('x'))
print(json.dumps(out))
"""


def test_trialkits_nni_utils_behave_as_nnis(tmp_path, nni_python):
    real = run(nni_python, MERGE_CASES, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, tmp_path)
    ours = run(sys.executable, MERGE_CASES, child(trial_dir=tmp_path), tmp_path)
    assert real.returncode == 0 and ours.returncode == 0, real.stderr + ours.stderr
    assert "trialkit's nni serves the trial API" in ours.stderr  # the fallback answered
    assert json.loads(ours.stdout) == json.loads(real.stdout.splitlines()[-1])
