"""PBT as the loop drives it: generations, NNI's checkpoint dirs, exploit and explore, waiting, replay."""
from __future__ import annotations

import math
import random

import pytest

from trialkit.control.searchspace import parse_space
from trialkit.control.tuners import build_tuner, check_tuner
from trialkit.control.tuners.pbt import LOAD, SAVE, perturb
from trialkit.errors import UserError

SPACE = parse_space({
    "lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]},
    "momentum": {"_type": "uniform", "_value": [0, 1]},
    "batch": {"_type": "choice", "_value": [16, 32, 64, 128]},
    "layers": {"_type": "randint", "_value": [1, 5]},
    "width": {"_type": "quniform", "_value": [32, 256, 32]},
})
KEYS = list(SPACE.params)


def generation(tuner, size):
    return [tuner.ask() for _ in range(size)]


def test_generation_zero_draws_the_population_with_nnis_checkpoint_dirs():
    tuner = build_tuner("PBTTuner", {"population_size": 4, "all_checkpoint_dir": "/ckpt"}, SPACE, 1)
    first = generation(tuner, 4)
    assert [(p[LOAD], p[SAVE]) for _, p in first] == [(f"/ckpt/{i}/0", f"/ckpt/{i}/0") for i in range(4)]
    assert all(SPACE.contains({k: p[k] for k in KEYS}) for _, p in first)
    assert tuner.ask() is None and tuner.waiting  # generation 1 waits for generation 0
    assert [tuner.continues_from(pid) for pid, _ in first] == [None] * 4


def test_the_bottom_members_take_a_top_members_checkpoint_and_perturbed_parameters():
    tuner = build_tuner("PBT", {"population_size": 5, "fraction": 0.4, "all_checkpoint_dir": "/c",
                                "optimize_mode": "minimize"}, SPACE, 2)
    first = generation(tuner, 5)
    for pid, _ in first:
        tuner.tell(pid, float(pid))  # minimize: member 0 best, member 4 worst
    second = generation(tuner, 5)
    # NNI's order: the worst of the generation before first; ceil(0.4 * 5) = 2 bottoms (4, 3), 2 tops (0, 1).
    assert [p[SAVE] for _, p in second] == [f"/c/{m}/1" for m in (4, 3, 2, 1, 0)]
    tops = {"/c/0/0", "/c/1/0"}
    for (pid, params), member in zip(second, (4, 3, 2, 1, 0)):
        source = tuner.continues_from(pid)
        assert params[LOAD] == first[source][1][SAVE]
        if member in (4, 3):
            assert params[LOAD] in tops and source in (0, 1)
        else:
            assert source == member and {k: params[k] for k in KEYS} == {k: first[member][1][k] for k in KEYS}
        assert SPACE.contains({k: params[k] for k in KEYS})


def test_perturbation_moves_each_parameter_one_step_within_its_bounds_as_nnis():
    params = {"lr": 1e-2, "momentum": 0.5, "batch": 32, "layers": 1, "width": 256.0}
    seen = {key: set() for key in KEYS}
    for seed in range(200):
        out = perturb(SPACE, params, 0.2, 0.0, random.Random(seed))  # no resampling: steps only
        for key in KEYS:
            seen[key].add(out[key])
    assert sorted(seen["momentum"]) == pytest.approx([0.3, 0.7])  # +- factor times the range
    assert sorted(seen["lr"]) == pytest.approx(sorted({math.exp(math.log(1e-2) + d * 0.2 * math.log(1000))
                                                      for d in (-1, 1)}))  # on the log scale
    assert seen["batch"] == {16, 64} and seen["layers"] == {1, 2} and seen["width"] == {224.0, 256.0}  # clipped
    resampled = {perturb(SPACE, params, 0.2, 1.0, random.Random(s))["momentum"] for s in range(50)}
    assert len(resampled) == 50  # resample_probability 1: drawn anew


def test_a_failed_trial_ranks_last_and_a_resumed_population_is_the_same():
    args = {"population_size": 4, "fraction": 0.25, "all_checkpoint_dir": "/p"}
    uninterrupted = build_tuner("PBT", args, SPACE, 3)
    first = generation(uninterrupted, 4)
    for pid, params in first[1:]:
        uninterrupted.tell(pid, params["momentum"])
    uninterrupted.tell_failed(first[0][0])
    second = generation(uninterrupted, 4)
    assert second[0][1][SAVE] == "/p/0/1"  # the failed member goes first (the worst) and takes a top checkpoint
    assert second[0][1][LOAD] == max(first[1:], key=lambda a: a[1]["momentum"])[1][SAVE]
    resumed = build_tuner("PBT", args, SPACE, 3)
    resumed.replay([(pid, params, None if pid == 0 else params["momentum"]) for pid, params in first] +
                   [(pid, params, None) for pid, params in second[:2]])
    resumed.tell_failed(0)
    assert [resumed.ask() for _ in range(2)] == second[2:]
    assert [resumed.continues_from(pid) for pid, _ in second] == [uninterrupted.continues_from(pid) for pid, _ in second]


def test_class_args_as_nni_names_them():
    assert check_tuner("PBTTuner", None, SPACE) == ("PBT", {"optimize_mode": "maximize"})
    tuner = build_tuner("PBT", None, SPACE, 0, experiment_dir="/exp/abc")
    assert (tuner.size, tuner.factor, tuner.resample_probability, tuner.fraction) == (10, 0.2, 0.25, 0.2)
    assert tuner.root == "/exp/abc/checkpoint"  # NNI's default: the experiment's checkpoint directory
    for args, where, words in [({"all_checkpoint_dir": "ckpt"}, "all_checkpoint_dir", "not an absolute path"),
                               ({"population_size": 0}, "population_size", "too small"),
                               ({"fraction": 1.5}, "fraction", "above 1"),
                               ({"resample_probability": -1}, "resample_probability", "too small")]:
        with pytest.raises(UserError) as err:
            check_tuner("PBT", args, SPACE)
        assert err.value.where == f"tuner.classArgs.{where}" and words in err.value.line()
