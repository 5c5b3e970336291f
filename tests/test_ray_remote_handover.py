"""A search that hands one trial's checkpoint to another (Hyperband's and BOHB's next round, PBT's exploit) on a
Ray cluster elsewhere: its nodes keep the trials' dirs on their own disks, where the copy made on this machine finds
nothing. Without an object store of checkpoints PBT is refused in one line (tests/test_pbt_platforms.py too), and
Hyperband and BOHB, whose NNI trial code reads no checkpoint, are told at start that the dir starts empty, rather
than start every configuration that goes on from an empty checkpoint dir silently.
"""
from __future__ import annotations

import pytest

from experiment_util import cli
from trialkit.control.config import parse_config
from trialkit.errors import UserError

S3 = {"checkpointStorage": {"type": "s3", "bucket": "ckpts", "endpointUrl": "http://10.0.0.9:9000"}}
SEARCHES = {
    "Hyperband": {"name": "Hyperband", "classArgs": {"R": 9, "eta": 3}},
    "BOHB": {"name": "BOHB", "classArgs": {"min_budget": 1, "max_budget": 9}},
}
REMOTE = ["10.20.30.40:6379", "ray://head.example.com:10001"]


def ray_config(tuner: dict, address: str, **keys) -> dict:
    return {"searchSpace": {"lr": {"_type": "uniform", "_value": [0.01, 0.1]}}, "trialCommand": "python3 train.py",
            "tuner": tuner, "trainingService": {"platform": "ray", "address": address}, **keys}


@pytest.mark.parametrize("address", REMOTE)
@pytest.mark.parametrize("name", list(SEARCHES))
def test_hyperband_and_bohb_on_a_ray_cluster_elsewhere_are_told_the_dir_starts_empty(tmp_path, name, address):
    config = parse_config(ray_config(SEARCHES[name], address), tmp_path)
    assert config.notes == (
        f"{name} on a ray cluster elsewhere: a configuration that goes on to the next round starts with an empty "
        "trialkit.checkpoint_dir(), since each node keeps its trials' dirs on its own disk (checkpointStorage in an "
        "object store carries it); code that keeps no checkpoint, as NNI's, loses nothing",), config.notes
    assert parse_config(ray_config(SEARCHES[name], address, **S3), tmp_path).notes == ()


@pytest.mark.parametrize("address", ["auto", "127.0.0.1:6379", "ray://localhost:10001"])
def test_hyperband_on_a_ray_cluster_on_this_machine_copies_through_the_experiment_dir(tmp_path, address):
    config = parse_config(ray_config(SEARCHES["Hyperband"], address), tmp_path)
    assert config.tuner.name == "Hyperband" and not any("elsewhere" in note for note in config.notes)


def test_a_search_that_hands_nothing_on_runs_on_a_ray_cluster_elsewhere(tmp_path):
    config = parse_config(ray_config({"name": "TPE"}, REMOTE[0]), tmp_path)
    assert config.tuner.name == "TPE" and config.notes == ()


def test_pbt_with_a_shared_dir_on_a_ray_cluster_elsewhere_is_told_its_checkpoint_dir_starts_empty(tmp_path):
    pbt = {"name": "PBTTuner", "classArgs": {"all_checkpoint_dir": "/mnt/efs/pbt", "population_size": 4}}
    config = parse_config(ray_config(pbt, REMOTE[0]), tmp_path)
    assert any(note.startswith("PBT on a ray cluster elsewhere: a trial goes on from another's checkpoint through "
                               "load_checkpoint_dir under all_checkpoint_dir; trialkit.checkpoint_dir() starts empty")
               for note in config.notes), config.notes
    assert not any("elsewhere" in note for note in parse_config(ray_config(pbt, REMOTE[0], **S3), tmp_path).notes)


def test_trialkit_run_says_it_in_one_line(tmp_path, home):
    path = tmp_path / "config.yml"
    path.write_text("searchSpace: {lr: {_type: uniform, _value: [0.01, 0.1]}}\ntrialCommand: python3 train.py\n"
                    "tuner: {name: PBTTuner}\n"
                    "trainingService:\n  platform: ray\n  address: 10.20.30.40:6379\n")
    done = cli("run", path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"trialkit: error: {path}:6: trainingService.address: PBT on a ray cluster elsewhere: "), line
