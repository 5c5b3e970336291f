"""Tuners through the loop's interface: ask, tell, tell_failed, replay."""
from __future__ import annotations

import itertools
import json
import random
import statistics
from pathlib import Path

import pytest

from trialkit.control.searchspace import parse_space
from trialkit.control import tuners
from trialkit.control.tuners import TUNERS, build_tuner, check_tuner
from trialkit.errors import UserError

NNI = Path(__file__).parent / "fixtures" / "nni" / "mnist-pytorch"
PLANE = parse_space({"x": {"_type": "uniform", "_value": [-5, 5]}, "y": {"_type": "uniform", "_value": [-5, 5]}})


def bowl(params):
    """A quadratic with its minimum 0 at (1.5, -2)."""
    return (params["x"] - 1.5) ** 2 + (params["y"] + 2) ** 2


def run(tuner, objective, n):
    values = []
    for _ in range(n):
        parameter_id, params = tuner.ask()
        value = objective(params)
        values.append(value)
        tuner.tell(parameter_id, value)
    return values


def test_tpe_beats_random_on_a_quadratic():
    best = {}
    for name in ("Random", "TPE"):
        best[name] = [
            min(run(build_tuner(name, {"optimize_mode": "minimize", "tpe_args": {"n_startup_jobs": 10}}
                                if name == "TPE" else {"optimize_mode": "minimize"}, PLANE, seed), bowl, 60))
            for seed in range(4)
        ]
    assert statistics.mean(best["TPE"]) < statistics.mean(best["Random"]) / 5
    assert max(best["TPE"]) < 0.1  # every seed converges near the minimum


def test_tpe_maximizes_when_asked():
    tuner = build_tuner("tpe", {"optimize_mode": "maximize", "tpe_args": {"n_startup_jobs": 10}}, PLANE, 0)
    values = run(tuner, lambda p: -bowl(p), 60)
    assert statistics.mean(values[-20:]) > statistics.mean(values[:10]) + 5


def test_tpe_default_mode_is_nnis_minimize():
    assert check_tuner("TPE", None, PLANE)[1] == {"optimize_mode": "minimize"}
    assert check_tuner("Random", None, PLANE)[1] == {"optimize_mode": "maximize"}


def test_tpe_handles_every_type_and_nested_choices():
    space = parse_space({
        **json.loads((NNI / "nested_search_space.json").read_text()),
        "n": {"_type": "randint", "_value": [1, 5]},
        "q": {"_type": "quniform", "_value": [0, 10, 2]},
        "ql": {"_type": "qloguniform", "_value": [1, 100, 1]},
        "z": {"_type": "normal", "_value": [0, 1]},
        "qz": {"_type": "qnormal", "_value": [0, 1, 0.5]},
        "ln": {"_type": "lognormal", "_value": [0, 1]},
        "qln": {"_type": "qlognormal", "_value": [1, 1, 1]},
    })
    tuner = build_tuner("TPE", {"tpe_args": {"n_startup_jobs": 5}}, space, 1)  # minimizes
    chosen = []
    for i in range(40):
        parameter_id, params = tuner.ask()
        assert space.contains(params), params
        layer = params["layer0"]
        chosen.append((layer["_name"], layer.get("kernel_size")))
        # best: Conv with kernel 5; TPE must learn through the nested choice
        tuner.tell(parameter_id, -layer.get("kernel_size", 0) if layer["_name"] == "Conv" else 0.0)
    assert chosen[-20:].count(("Conv", 5)) >= 10, chosen


def test_tpe_runs_concurrent_asks():
    tuner = build_tuner("TPE", {"optimize_mode": "minimize", "tpe_args": {"n_startup_jobs": 4}}, PLANE, 2)
    pending = [tuner.ask() for _ in range(8)]
    assert len({pid for pid, _ in pending}) == 8
    for pid, params in pending:
        tuner.tell(pid, bowl(params))
    assert tuner.ask()[0] == 8


# Small enough that the model (TPE, GP, BOHB), the tournaments (Evolution), the rounds (Hyperband), the
# generations (PBT, CMA-ES) drive most of a 16-trial run.
MODEL_EARLY = {"TPE": {"tpe_args": {"n_startup_jobs": 4}}, "Evolution": {"population_size": 4}, "Random": None,
               "Anneal": None, "Hyperband": {"R": 9, "eta": 3},
               "BOHB": {"min_budget": 1, "max_budget": 9, "eta": 3, "random_fraction": 0.1},
               "PBT": {"population_size": 4, "all_checkpoint_dir": "/ckpt"},
               "GP": {"cold_start_num": 4, "selection_num_warm_up": 500, "selection_num_starting_points": 3},
               "CMAES": {"popsize": 4}, "QMC": {"scramble": True, "qmc_type": "halton"}, "Sobol": {"scramble": True}}


def proposals(name: str, seed: int) -> list:
    """Sixteen asks, each told its result (one failed) before the next: every proposal after the first
    depends on the seed and on what the tuner learnt."""
    tuner = build_tuner(name, MODEL_EARLY[name], PLANE, seed)
    asked = []
    for i in range(16):
        parameter_id, params = tuner.ask()
        asked.append((parameter_id, params))
        if i == 5:
            tuner.tell_failed(parameter_id)
        else:
            tuner.tell(parameter_id, bowl(params))
    return asked


@pytest.mark.parametrize("name", sorted(MODEL_EARLY))
def test_same_seed_same_proposals(name):
    # A new tuner is added here, or says why not: GridSearch and Batch try their points in a fixed order.
    assert set(MODEL_EARLY) == set(TUNERS) - {"GridSearch", "Batch"}
    first = proposals(name, 5)
    assert proposals(name, 5) == first
    other = proposals(name, 6)
    assert [p for _, p in other] != [p for _, p in first]  # the seed is applied, not only accepted


# Each tuner's arguments and a space it searches, for the contract every tuner keeps.
EVERY = {**{name: (args, PLANE) for name, args in MODEL_EARLY.items()},
         "GridSearch": (None, parse_space({"x": {"_type": "quniform", "_value": [-4, 4, 1]},
                                           "y": {"_type": "quniform", "_value": [-4, 4, 1]}})),
         "Batch": (None, parse_space({"combine_params": {"_type": "choice", "_value": [
             {"x": x, "y": y} for x in range(-4, 5) for y in range(-2, 3)]}}))}


def concurrent_run(tuner, asks: int):
    """`asks` proposals at concurrency 3, the results arriving in another order than the asks, parameter
    id 4 failing (its last intermediate result told); (the history as the store holds it, with the last ones
    still running, the failed ids). A tuner waiting for its round gets the result of a running trial first."""
    order = random.Random(1)
    running, history = [], {}
    while len(history) < asks:
        asked = tuner.ask()
        if asked is not None:
            running.append(asked)
            history[asked[0]] = (asked[1], None)
        else:
            assert tuner.waiting and running
        if len(running) == 3 or asked is None:
            pid, params = running.pop(order.randrange(len(running)))
            if pid == 4:
                tuner.tell_intermediate(pid, bowl(params))
                tuner.tell_failed(pid)
            else:
                tuner.tell(pid, bowl(params))
                history[pid] = (params, bowl(params))
    return [(pid, params, value) for pid, (params, value) in history.items()], [4]


def close(got, expected) -> bool:
    """Equal parameters, numbers to the last bits of a float (TPE's model holds the unit coordinate the sampler
    drew, a resumed one the coordinate of the stored value)."""
    numbers = {k for k, v in expected.items() if isinstance(v, float)}
    return ({k: got[k] for k in numbers} == pytest.approx({k: expected[k] for k in numbers}, rel=1e-9, abs=1e-12)
            and {k: v for k, v in got.items() if k not in numbers} == {k: v for k, v in expected.items()
                                                                     if k not in numbers})


@pytest.mark.parametrize("name", sorted(EVERY))
def test_a_replayed_tuner_proposes_what_the_uninterrupted_one_does(name):
    assert set(EVERY) == set(TUNERS)  # a new tuner keeps the contract too
    args, space = EVERY[name]
    uninterrupted = build_tuner(name, args, space, 5)
    history, failed = concurrent_run(uninterrupted, 14)
    resumed = build_tuner(name, args, space, 5)  # the same seed: a resumed experiment's (loop.experiment_seed)
    resumed.replay(history)
    for pid in failed:
        resumed.tell_intermediate(pid, bowl(history[pid][1]))  # the loop's replay: the latest intermediate result
        resumed.tell_failed(pid)
    running = [(pid, params) for pid, params, value in history if value is None]
    for _ in range(6):  # and so on: the next proposals, with results coming in
        expected, got = uninterrupted.ask(), resumed.ask()
        if expected is None:  # its round waits for the running trials: they end, in both
            assert got is None and uninterrupted.waiting and resumed.waiting
            for pid, params in running:
                uninterrupted.tell(pid, bowl(params))
                resumed.tell(pid, bowl(params))
            running = []
            expected, got = uninterrupted.ask(), resumed.ask()
        assert got[0] == expected[0] and close(got[1], expected[1])
        assert json.dumps(got[1], sort_keys=True) not in {json.dumps(p, sort_keys=True) for _, p, _ in history}
        uninterrupted.tell(expected[0], bowl(expected[1]))
        resumed.tell(got[0], bowl(got[1]))


@pytest.mark.parametrize("name", sorted(MODEL_EARLY))
def test_each_proposal_draws_numbers_of_its_own(name, monkeypatch):
    """Proposal k's random state is its own (derived_seed): a resumed tuner draws none of the numbers the first
    run drew, so on a continuous space none of its proposals is a repeat that deduplication must replace."""
    monkeypatch.setattr(tuners.Tuner, "_untried", lambda self, rng, tried=None: pytest.fail("a repeat was proposed"))
    first = build_tuner(name, MODEL_EARLY[name], PLANE, 8)
    # Ten asks, or as many as its first round gives before it waits for their results.
    history = [(pid, params, bowl(params)) for pid, params in itertools.islice(iter(first.ask, None), 10)]
    resumed = build_tuner(name, MODEL_EARLY[name], PLANE, 8)
    resumed.replay(history)
    run(resumed, bowl, 10)


SMALL = parse_space({"a": {"_type": "choice", "_value": [1, 2]}, "b": {"_type": "choice", "_value": ["x", "y"]}})


# Hyperband and BOHB run a configuration again on a larger budget, PBT a member in each step, Batch
# searches a space of its own: each has a test of its own below.
@pytest.mark.parametrize("name", sorted(set(TUNERS) - {"Hyperband", "BOHB", "PBT", "Batch"}))
def test_no_tuner_repeats_a_point_and_a_small_space_runs_out(name):
    args = {"population_size": 2} if name == "Evolution" else None
    tuner = build_tuner(name, args, SMALL, 3)
    points = []
    while (asked := tuner.ask()) is not None and len(points) < 10:
        points.append(json.dumps(asked[1], sort_keys=True))
        tuner.tell(asked[0], float(asked[1]["a"]))
    assert sorted(points) == sorted(json.dumps(p, sort_keys=True) for p in SMALL.grid())
    assert tuner.ask() is None and tuner.points_tried == 4
    # and resumed from half of them, the other half
    resumed = build_tuner(name, args, SMALL, 3)
    resumed.replay([(i, json.loads(p), 1.0) for i, p in enumerate(points[:2])])
    rest = [json.dumps(resumed.ask()[1], sort_keys=True) for _ in range(2)]
    assert sorted(points[:2] + rest) == sorted(points) and resumed.ask() is None


def test_random_without_deduplication_samples_with_replacement_as_determined_does():
    tuner = build_tuner("Random", {"deduplicate": False}, SMALL, 3)  # a Determined config's random searcher
    points = [json.dumps(tuner.ask()[1], sort_keys=True) for _ in range(10)]
    assert len(set(points)) <= 4 and tuner.ask() is not None  # max_trials trials, however small the space


def test_grid_search_enumerates_exactly_the_grid_then_stops():
    space = parse_space({
        "opt": {"_type": "choice", "_value": ["sgd", "adam"]},
        "layers": {"_type": "randint", "_value": [1, 4]},
    })
    tuner = build_tuner("gridsearch", None, space, 0)
    seen = []
    while (asked := tuner.ask()) is not None:
        seen.append(asked)
        tuner.tell(asked[0], 1.0)
    assert [pid for pid, _ in seen] == list(range(6))
    assert [p for _, p in seen] == [{"opt": o, "layers": n} for o in ("sgd", "adam") for n in (1, 2, 3)]
    assert tuner.ask() is None


def test_grid_search_resumes_without_repeating():
    space = parse_space({"a": {"_type": "choice", "_value": [1, 2, 3]}, "b": {"_type": "choice", "_value": ["x", "y"]}})
    first = build_tuner("GridSearch", None, space, 0)
    done = [first.ask() for _ in range(3)]
    resumed = build_tuner("GridSearch", None, space, 0)
    resumed.replay([(pid, params, 0.5) for pid, params in done])
    rest = []
    while (asked := resumed.ask()) is not None:
        rest.append(asked)
    assert [pid for pid, _ in rest] == [3, 4, 5]
    assert sorted(json.dumps(p, sort_keys=True) for _, p in done + rest) == sorted(
        json.dumps(p, sort_keys=True) for p in space.grid())


def test_grid_search_refuses_a_continuous_space():
    with pytest.raises(UserError) as err:
        build_tuner("GridSearch", None, PLANE, 0)
    assert err.value.where == "searchSpace.x"


@pytest.mark.parametrize("tuner, key", [("Hyperband", "TRIAL_BUDGET"), ("BOHB", "TRIAL_BUDGET"),
                                        ("PBTTuner", "load_checkpoint_dir"), ("PBT", "save_checkpoint_dir")])
def test_a_search_space_key_the_tuner_sets_itself_is_refused(tuner, key):
    # A newcomer's TRIAL_BUDGET choice under Hyperband was replaced by Hyperband's budget without a word.
    space = parse_space({"x": {"_type": "uniform", "_value": [0, 1]}, key: {"_type": "choice", "_value": [1, 2]}})
    with pytest.raises(UserError) as err:
        check_tuner(tuner, {"all_checkpoint_dir": "/tmp/ckpt"} if "PBT" in tuner else {}, space)
    assert err.value.where == f"searchSpace.{key}" and f"remove {key} from the search space" in err.value.line()


def test_random_resume_continues_the_same_sequence():
    original = build_tuner("Random", None, PLANE, 11)
    asked = [original.ask() for _ in range(6)]
    resumed = build_tuner("Random", None, PLANE, 11)
    resumed.replay([(pid, params, bowl(params)) for pid, params in asked[:4]])
    assert [resumed.ask(), resumed.ask()] == asked[4:]


def test_tpe_replay_rebuilds_the_model():
    args = {"optimize_mode": "minimize", "tpe_args": {"n_startup_jobs": 5}}
    original = build_tuner("TPE", args, PLANE, 3)
    history = []
    for _ in range(30):
        pid, params = original.ask()
        history.append((pid, params, bowl(params)))
        original.tell(pid, bowl(params))
    # one still running when the control plane died: no value yet
    pid, params = original.ask()
    history.append((pid, params, None))

    resumed = build_tuner("TPE", args, PLANE, 99)
    resumed.replay(history)
    resumed.tell(30, bowl(params))  # the running one reports after the resume
    assert [t.value for t in resumed._study.trials] == pytest.approx([v for _, p, v in history[:30]] + [bowl(params)])
    after_resume = run(resumed, bowl, 15)
    assert resumed.ask()[0] == 46  # ids go on after the largest stored one
    # a model rebuilt from 31 results does much better than a cold start
    cold = run(build_tuner("TPE", args, PLANE, 99), bowl, 15)
    assert statistics.mean(after_resume) < statistics.mean(cold) / 2


def test_results_are_idempotent_and_failures_count():
    tuner = build_tuner("Evolution", {"population_size": 2}, PLANE, 0)
    a, b, c = (tuner.ask() for _ in range(3))
    tuner.tell(a[0], 1.0)
    tuner.tell(a[0], 5.0)  # a duplicate delivery changes nothing
    tuner.tell(b[0], float("nan"))  # counts as failed
    tuner.tell_failed(c[0])
    assert [value for _, value in tuner.population()] == [1.0]
    with pytest.raises(KeyError):
        tuner.tell(99, 1.0)


def test_evolution_mutates_one_parameter_of_a_population_member():
    space = parse_space({k: {"_type": "uniform", "_value": [0, 1]} for k in "abcd"})
    tuner = build_tuner("Evolution", {"optimize_mode": "maximize", "population_size": 6}, space, 4)
    history = []
    for i in range(40):
        pid, params = tuner.ask()
        if i >= 6:
            assert any(sum(params[k] != old[k] for k in "abcd") <= 1 for old in history), params
        history.append(params)
        tuner.tell(pid, sum(params.values()))


def test_evolution_improves_on_its_first_population():
    gains = []
    for seed in range(5):
        values = run(build_tuner("Evolution", {"optimize_mode": "minimize", "population_size": 10}, PLANE, seed),
                     bowl, 100)
        gains.append(statistics.mean(values[:10]) - statistics.mean(values[-30:]))
    assert statistics.mean(gains) > 5


@pytest.mark.parametrize(
    "name, args, where, words",
    [
        ("TPF", None, "tuner.name", "did you mean 'TPE'"),
        ("SMAC", None, "tuner.name", "not available in trialkit"),
        (3, None, "tuner.name", "unknown tuner"),
        ("TPE", {"optimize_mode": "maximise"}, "tuner.classArgs.optimize_mode", "did you mean 'maximize'"),
        ("TPE", {"optimise_mode": "maximize"}, "tuner.classArgs.optimise_mode", "did you mean 'optimize_mode'"),
        ("TPE", {"seed": -1}, "tuner.classArgs.seed", "too small"),
        ("TPE", {"tpe_args": {"n_startup_jobs": "ten"}}, "tuner.classArgs.tpe_args.n_startup_jobs", "whole number"),
        ("TPE", {"tpe_args": {"gamma": 0.25}}, "tuner.classArgs.tpe_args.gamma", "unknown key"),
        ("Evolution", {"population_size": 1}, "tuner.classArgs.population_size", "too small"),
        ("GridSearch", {"seed": 1}, "tuner.classArgs.seed", "unknown key"),
        ("Random", [1], "tuner.classArgs", "mapping"),
    ],
)
def test_bad_names_and_class_args_are_one_line_errors(name, args, where, words):
    with pytest.raises(UserError) as err:
        check_tuner(name, args, PLANE)
    assert err.value.where == where
    assert words in err.value.line() and "\n" not in err.value.line()


def test_tpe_args_reach_optuna():
    tuner = build_tuner("TPE", {"tpe_args": {"n_startup_jobs": 3, "n_ei_candidates": 5, "constant_liar_type": None}},
                        PLANE, 0)
    sampler = tuner._study.sampler
    assert sampler._n_startup_trials == 3 and sampler._n_ei_candidates == 5
    assert sampler._constant_liar is False
    # NNI's TPE is univariate and lies "best" by default: said to optuna, whose defaults changed in 5.0
    sampler = build_tuner("TPE", None, PLANE, 0)._study.sampler
    assert sampler._multivariate is False and sampler._constant_liar is True
