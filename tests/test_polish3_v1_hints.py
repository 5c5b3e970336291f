"""An NNI v1 config's errors name its keys as the user wrote them, in the line's words and its fix, not only in
its place: a missing `trial.command`, a missing `searchSpacePath` (a v1 config has no inline search space), a
command too long for a trial's environment (its script goes in `trial.codeDir`). Real `trialkit run`, refused.
"""
from __future__ import annotations

import pytest
import yaml

from experiment_util import cli

pytestmark = pytest.mark.usefixtures("home")


def refused(tmp_path, trial, **keys) -> str:
    """`trialkit run` of a v1 config with this `trial` section and keys: its one line on stderr, exit 2, the
    config's path in it written as CONFIG."""
    config = {"trialConcurrency": 1, "maxTrialNum": 1, "trainingServicePlatform": "local",
              "searchSpacePath": "search_space.json", "tuner": {"builtinTunerName": "Random"},
              "trial": {"codeDir": ".", **trial}, **keys}
    (tmp_path / "search_space.json").write_text('{"x": {"_type": "choice", "_value": [1]}}')
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump({key: value for key, value in config.items() if value is not None}))
    done = cli("run", path)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    return line.replace(str(path), "CONFIG")


def test_a_v1_config_without_its_command_is_told_to_add_trial_command(tmp_path):
    assert refused(tmp_path, {}) == ("trialkit: error: CONFIG: trial.command: trial.command is missing (add trial.command: "
                                     "your command, like python3 train.py; trialCommand in a v2 config)")


def test_a_v1_config_without_its_search_space_is_told_to_add_search_space_path(tmp_path):
    assert refused(tmp_path, {"command": "python3 trial.py"}, searchSpacePath=None) == (
        "trialkit: error: CONFIG: searchSpacePath: searchSpacePath is missing (add searchSpacePath: search_space.json)")


def test_a_v1_command_too_long_is_told_to_go_in_a_script_in_trial_code_dir(tmp_path):
    line = refused(tmp_path, {"command": "echo " + "x" * 100_000})
    lines = (tmp_path / "config.yml").read_text().splitlines()
    command_line = next(n for n, text in enumerate(lines, 1) if text.startswith("  command: "))
    assert line.startswith(f"trialkit: error: CONFIG:{command_line}: trial.command: the command is 100,005 bytes"), line
    assert line.endswith("(put the long part in a script in trial.codeDir; trialCommand in a v2 config)"), line
