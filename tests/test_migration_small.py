"""Small things users of other tools type out of habit (issue 23, item 7)."""
from __future__ import annotations

from experiment_util import cli


def test_job_ls_is_job_list(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    listed, ls = cli("job", "list"), cli("job", "ls")
    assert listed.returncode == ls.returncode == 0, ls.stderr
    assert ls.stdout == listed.stdout and ls.stderr == listed.stderr
    assert "ls" in cli("job", "--help").stdout


def test_a_keeper_of_another_version_is_a_clear_line_in_the_trials_status(tmp_path, monkeypatch):
    # An image built with an older trialkit: its keeper (the Python run.sh starts it with,
    # TRIALKIT_PYTHON, finds the old one first) tells the manager its version.
    import shutil
    import sys
    from pathlib import Path

    import trialkit
    from experiment_util import experiment, experiment_id, export

    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    old = tmp_path / "old"
    shutil.copytree(Path(trialkit.__file__).parent, old / "trialkit", ignore=shutil.ignore_patterns("__pycache__"))
    init = old / "trialkit" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{trialkit.__version__}"', '__version__ = "0.0.9"'))
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}},
                        "import trialkit\ntrialkit.get_next_parameter()\ntrialkit.report_final_result(1)\n",
                        maxTrialNumber=1, trialCodeDirectory=".")
    python = tmp_path / "old-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={old} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("TRIALKIT_PYTHON", str(python))
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    line = f"its keeper is trialkit 0.0.9, this manager trialkit {trialkit.__version__}"
    assert f"warning: {line}" in done.stdout
    (row,) = export(experiment_id(done.stdout.splitlines()[0]))
    assert row["status"] == "SUCCEEDED" and line in row["reason"]
