"""A config's refusal says where, as a compiler's does: `bad.yml:7: trialConcurrency: ...`, the line of the key as
the user wrote it (a nested key's own line, any spelling of it), the file alone for a key it lacks. NNI v2 and v1
configs, JSON ones and Determined's alike; `trialkit run` of a real file: one line, exit 2, no traceback.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiment_util import cli
from trialkit.control.config import load_config
from trialkit.errors import UserError

pytestmark = pytest.mark.usefixtures("home")

V2 = """\
experimentName: lines
searchSpaceFile: search_space.json
trialCommand: python3 train.py
trial_concurrency: {concurrency}
tuner:
  name: TPE
  classArgs:
    optimize_mode: {mode}
trainingService:
  platform: local
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / "search_space.json").write_text(json.dumps({"lr": {"_type": "choice", "_value": [0.1]}}))
    (tmp_path / "train.py").write_text("print('never run')\n")  # what the configs here run
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(path: Path, *args: str) -> str:
    done = cli("run", path, *args)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    return line


def test_each_problem_is_at_the_line_of_its_key_as_written(tmp_path):
    path = write(tmp_path, "bad.yml", V2.format(concurrency=-2, mode="maxi"))
    assert refused(path) == (
        f"trialkit: error: 2 problems: {path}:4: trialConcurrency: -2 is too small (use 1 or more); "
        f"{path}:8: tuner.classArgs.optimize_mode: unknown value 'maxi' (did you mean 'maximize'?)")


def test_a_missing_key_is_at_the_file_alone(tmp_path):
    path = write(tmp_path, "bad.yml", V2.format(concurrency=1, mode="maximize").replace("trialCommand", "# trialCommand"))
    assert refused(path) == (f"trialkit: error: {path}: trialCommand: trialCommand is missing "
                             "(add trialCommand: your command, like python3 train.py)")


@pytest.mark.parametrize("indent", ["  ", "\t"])  # YAML refuses a tab as indentation; JSON takes it
def test_a_json_config_is_placed_by_its_lines_too(tmp_path, indent):
    config = {"searchSpaceFile": "search_space.json", "trialCommand": "python3 train.py", "trialConcurrency": 1,
              "tuner": {"name": "TPE"}, "trainingService": {"platform": "lokal"}}
    path = write(tmp_path, "bad.json", json.dumps(config, indent=indent))
    line = path.read_text().splitlines().index(indent * 2 + '"platform": "lokal"') + 1
    assert refused(path).startswith(f"trialkit: error: {path}:{line}: trainingService.platform: unknown platform ")


def test_a_bad_value_in_the_search_space_file_is_at_its_line_there(tmp_path):
    # A newcomer's quoted "0.5" in search_space.json was placed at the config's line 1 (its searchSpaceFile key),
    # told to "write a number like 0.5"; a syntax error in that file was at its own line already.
    path = write(tmp_path, "bad.yml", V2.format(concurrency=1, mode="maximize"))
    space = tmp_path / "search_space.json"
    space.write_text('{\n  "lr": {"_type": "choice", "_value": [0.1]},\n'
                     '  "dropout": {"_type": "uniform", "_value": ["0.5", 0.9]}\n}\n')
    assert refused(path) == (f"trialkit: error: {space}:3: searchSpaceFile.dropout._value[0]: expected a finite "
                             "number, got '0.5' (write it without quotes: 0.5)")


def test_a_v1_configs_keys_are_placed_where_it_wrote_them(tmp_path):
    path = write(tmp_path, "v1.yml", """\
authorName: me
trialConcurrency: 1
trainingServicePlatform: local
searchSpacePath: search_space.json
tuner:
  builtinTunerName: TPEE
trial:
  command: python3 train.py
  codeDir: .
  gpuNum: -1
""")
    assert refused(path) == (
        f"trialkit: error: 2 problems: {path}:6: tuner.builtinTunerName: unknown tuner 'TPEE' (did you mean 'TPE'?; "
        f"tuner.name in a v2 config); {path}:10: trial.gpuNum: -1 is too small (use 0 or more; trialGpuNumber in a "
        "v2 config)")


def test_a_determined_configs_keys_are_placed_and_its_context_dir_named_as_the_argument(tmp_path):
    path = write(tmp_path, "exp.yaml", """\
name: det
entrypoint: python3 train.py
hyperparameters:
  lr:
    type: double
    minval: 0.1
    maxval: 0.01
searcher: {name: random, metric: loss,
           max_trials: 0}
""")
    assert refused(path, str(tmp_path)) == (
        f"trialkit: error: 2 problems: {path}:7: hyperparameters.lr.maxval: maxval 0.01 is below minval 0.1 "
        f"(swap them); {path}:9: searcher.max_trials: 0 is too small (use 1 or more)")
    path.write_text("entrypoint: python3 train.py\nsearcher: {name: single, metric: loss}\n")
    assert refused(path, str(tmp_path / "absent")).startswith("trialkit: error: CONTEXT_DIR: ")  # an argument's


def placed(path: Path) -> str:
    with pytest.raises(UserError) as caught:
        load_config(path)
    return caught.value.line()


def test_list_items_quoted_keys_and_merged_keys_are_placed(tmp_path):
    determined = write(tmp_path, "exp.yaml", """\
entrypoint: python3 train.py
searcher: {name: single, metric: loss}
environment:
  environment_variables:
    - A=1
    - B
""")
    assert placed(determined).startswith(f"{determined}:6: environment.environment_variables[1]: 'B' is not NAME=VALUE")
    merged = write(tmp_path, "merged.yml", V2.format(concurrency=1, mode="maximize").replace(
        "trainingService:\n  platform: local\n", "base: &base\n  platform: lokal\ntrainingService:\n  <<: *base\n"))
    line = placed(merged)  # an unknown top-level key, and the platform met through the merge: at its own line
    assert f"{merged}:9: base: unknown key" in line and f"{merged}:10: trainingService.platform: unknown platform" in line
    quoted = write(tmp_path, "quoted.yml", V2.format(concurrency=1, mode="maximize") + "'odd key': 1\n")
    assert placed(quoted).startswith(f"{quoted}:11: 'odd key': unknown key"), placed(quoted)
