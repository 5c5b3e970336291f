"""PBT as the loop drives it: NNI's generations (PBT, PBTTuner; `synchronous: true`) and the asynchronous one
(`synchronous: false`); NNI's checkpoint dirs, exploit and explore, waiting, replay."""
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


# NNI's generations: under both of NNI's names by default, and with `synchronous: true` (the classArg applied).
GENERATIONAL = pytest.mark.parametrize("name, mode", [("PBTTuner", {}), ("PBT", {}), ("PBT", {"synchronous": True})])


@GENERATIONAL
def test_the_bottom_members_take_a_top_members_checkpoint_and_perturbed_parameters(name, mode):
    tuner = build_tuner(name, {"population_size": 5, "fraction": 0.4, "all_checkpoint_dir": "/c",
                               "optimize_mode": "minimize", **mode}, SPACE, 2)
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


@GENERATIONAL
def test_a_failed_trial_ranks_last_and_a_resumed_population_is_the_same(name, mode):
    args = {"population_size": 4, "fraction": 0.25, "all_checkpoint_dir": "/p", **mode}
    uninterrupted = build_tuner(name, args, SPACE, 3)
    first = generation(uninterrupted, 4)
    for pid, params in first[1:]:
        uninterrupted.tell(pid, params["momentum"])
    uninterrupted.tell_failed(first[0][0])
    second = generation(uninterrupted, 4)
    assert second[0][1][SAVE] == "/p/0/1"  # the failed member goes first (the worst) and takes a top checkpoint
    assert second[0][1][LOAD] == max(first[1:], key=lambda a: a[1]["momentum"])[1][SAVE]
    resumed = build_tuner(name, args, SPACE, 3)
    resumed.replay([(pid, params, None if pid == 0 else params["momentum"]) for pid, params in first] +
                   [(pid, params, None) for pid, params in second[:2]])
    resumed.tell_failed(0)
    assert [resumed.ask() for _ in range(2)] == second[2:]
    assert [resumed.continues_from(pid) for pid, _ in second] == [uninterrupted.continues_from(pid) for pid, _ in second]


def test_class_args_as_nni_names_them():
    assert check_tuner("PBTTuner", None, SPACE) == ("PBT", {"optimize_mode": "maximize"})
    tuner = build_tuner("PBT", None, SPACE, 0, experiment_dir="/exp/abc")
    assert (tuner.size, tuner.factor, tuner.resample_probability, tuner.fraction) == (10, 0.2, 0.25, 0.2)
    assert tuner.synchronous  # NNI's generations unless told
    assert tuner.root == "/exp/abc/checkpoint"  # NNI's default: the experiment's checkpoint directory
    for args, where, words in [({"all_checkpoint_dir": "ckpt"}, "all_checkpoint_dir", "not an absolute path"),
                               ({"population_size": 0}, "population_size", "too small"),
                               ({"fraction": 1.5}, "fraction", "above 1"),
                               ({"resample_probability": -1}, "resample_probability", "too small"),
                               ({"synchronous": "yes"}, "synchronous", "true or false")]:
        with pytest.raises(UserError) as err:
            check_tuner("PBT", args, SPACE)
        assert err.value.where == f"tuner.classArgs.{where}" and words in err.value.line()
    assert not build_tuner("PBTTuner", {"synchronous": False}, SPACE, 0).synchronous  # NNI's other name, the same


# ---------------------------------------------------------------- asynchronous

ASYNC = {"synchronous": False}


def steps(tuner, asked):
    """(member, step) of each asked trial, from its save dir."""
    return [tuple(int(part) for part in p[SAVE].split("/")[-2:]) for _, p in asked]


def test_async_a_member_steps_on_without_waiting_for_the_population():
    tuner = build_tuner("PBT", {"population_size": 4, "fraction": 0.25, "all_checkpoint_dir": "/a", **ASYNC}, SPACE, 4)
    first = [tuner.ask() for _ in range(2)]  # two slots: members 0 and 1
    assert steps(tuner, first) == [(0, 0), (1, 0)] and first[0][1][LOAD] == "/a/0/0"
    tuner.tell(first[0][0], 0.5)
    assert steps(tuner, [tuner.ask()]) == [(2, 0)]  # a member never started goes first
    tuner.tell(first[1][0], 0.9)
    third = tuner.ask()
    assert steps(tuner, [third]) == [(3, 0)]
    # Member 0 is ranked with the two members that have a result (ceil(0.25 * 2) = 1 bottom: member 0, the
    # worse); members 2 and 3 are still on their first step, and nothing waits for them.
    fourth = tuner.ask()
    assert steps(tuner, [fourth]) == [(0, 1)]
    assert fourth[1][LOAD] == "/a/1/0" and tuner.continues_from(fourth[0]) == first[1][0]  # exploits member 1
    assert {k: fourth[1][k] for k in KEYS} != {k: first[1][1][k] for k in KEYS}  # and explores
    fifth = tuner.ask()  # member 1, the top, goes on from its own
    assert steps(tuner, [fifth]) == [(1, 1)] and fifth[1][LOAD] == "/a/1/0"
    assert tuner.ask() is None and tuner.waiting  # every member trains: the next to end goes on


def test_async_the_member_of_least_progress_steps_next_and_a_top_member_goes_on_from_its_own():
    tuner = build_tuner("PBT", {"population_size": 3, "fraction": 0.34, "all_checkpoint_dir": "/b", **ASYNC,
                                "optimize_mode": "minimize"}, SPACE, 5)
    start = [tuner.ask() for _ in range(3)]
    for (pid, _), value in zip(start, (1.0, 3.0, 2.0)):  # member 0 best, member 1 worst
        tuner.tell(pid, value)
    best = tuner.ask()  # all at 1 step: the lower member first; member 0 is the top: its own checkpoint, params
    assert steps(tuner, [best]) == [(0, 1)] and best[1][LOAD] == "/b/0/0"
    assert {k: best[1][k] for k in KEYS} == {k: start[0][1][k] for k in KEYS}
    worst = tuner.ask()  # member 1 is the bottom one (ceil(0.34 * 3) = 2, capped at 3 // 2 = 1)
    assert steps(tuner, [worst]) == [(1, 1)] and worst[1][LOAD] == "/b/0/0"
    middle = tuner.ask()
    assert steps(tuner, [middle]) == [(2, 1)] and middle[1][LOAD] == "/b/2/0"
    tuner.tell(worst[0], 0.5)  # member 1 ends its step first; its checkpoint trained 2 steps (member 0's and its own)
    tuner.tell(middle[0], 2.5)
    # Both trained 2 steps: the lower member first, not the latest to end. Ranked by their latest (member 0 by its
    # first step, as it trains its second): member 1 is the top, goes on from its own; member 2 the bottom.
    ahead, behind = tuner.ask(), tuner.ask()
    assert steps(tuner, [ahead, behind]) == [(1, 2), (2, 2)]
    assert ahead[1][LOAD] == behind[1][LOAD] == "/b/1/1"


def test_async_replay_rebuilds_the_population_from_the_trials_dirs_whatever_order_they_ended_in():
    args = {"population_size": 4, "fraction": 0.25, "all_checkpoint_dir": "/r", **ASYNC}
    uninterrupted = build_tuner("PBT", args, SPACE, 6)
    running, history, rng = [uninterrupted.ask(), uninterrupted.ask()], [], random.Random(0)
    while len(history) < 12:
        pid, params = running.pop(rng.randrange(len(running)))  # ends in an order of its own
        value = params["momentum"]
        uninterrupted.tell(pid, value)
        history.append((pid, params, value))
        running.append(uninterrupted.ask())
    resumed = build_tuner("PBT", args, SPACE, 6)
    resumed.replay(history + [(pid, params, None) for pid, params in running])  # two steps still in flight
    assert [resumed.continues_from(pid) for pid, _, _ in history] == \
        [uninterrupted.continues_from(pid) for pid, _, _ in history]
    for pid, params in running:
        uninterrupted.tell(pid, params["momentum"])
        resumed.tell(pid, params["momentum"])
    later = [uninterrupted.ask() for _ in range(2)]
    assert [resumed.ask() for _ in range(2)] == later  # the same members, steps, sources and draws
    taken = steps(uninterrupted, [(pid, params) for pid, params, _ in history] + running + later)
    assert len(set(taken)) == len(taken)  # no member's step twice


def test_async_a_member_is_ranked_against_the_others_at_its_own_progress():
    tuner = build_tuner("PBT", {"population_size": 4, "fraction": 0.25, "all_checkpoint_dir": "/c", **ASYNC}, SPACE, 7)
    first = [tuner.ask() for _ in range(4)]
    for (pid, _), value in zip(first, (0.6, 0.7, 0.5, 0.65)):
        tuner.tell(pid, value)
    behind = tuner.ask()  # member 0 goes on from its own, and is still training when the others step on
    ahead = [tuner.ask() for _ in range(3)]
    assert steps(tuner, [behind] + ahead) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert ahead[1][1][LOAD] == "/c/1/0"  # member 2, the bottom, exploits member 1
    for (pid, _), value in zip(ahead, (0.75, 0.9, 0.62)):
        tuner.tell(pid, value)
    third = [tuner.ask() for _ in range(3)]  # members 1, 2, 3 step on from their own (member 0 is the bottom)
    assert steps(tuner, third) == [(1, 2), (2, 2), (3, 2)] and third[2][1][LOAD] == "/c/3/1"
    tuner.tell(behind[0], 0.7)
    for (pid, _), value in zip(third, (0.8, 0.92, 0.95)):
        tuner.tell(pid, value)
    # Member 0 (0.7 after 2 steps) is the worst of the members' latest (0.8, 0.92, 0.95 after 3 steps), but at
    # 2 steps member 3 had 0.62: member 0 goes on from its own; ranked by their latest, it would exploit.
    on = tuner.ask()
    assert steps(tuner, [on]) == [(0, 2)] and on[1][LOAD] == "/c/0/1" and tuner.continues_from(on[0]) == behind[0]
    assert {k: on[1][k] for k in KEYS} == {k: first[0][1][k] for k in KEYS}
