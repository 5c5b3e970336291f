"""NNI's other built-in tuners (GP, Batch), CMA-ES and the quasi-random samplers, and the NNI tuners refused."""
from __future__ import annotations

import importlib.util
import json
import statistics

import pytest

from trialkit.control.searchspace import parse_space
from trialkit.control import tuners
from trialkit.control.tuners import build_tuner, check_tuner
from trialkit.control.tuners.samplers import _acquisition, from_units, paths
from trialkit.errors import UserError

PLANE = parse_space({"x": {"_type": "uniform", "_value": [-5, 5]}, "y": {"_type": "uniform", "_value": [-5, 5]}})


def bowl(params):
    return (params["x"] - 1.5) ** 2 + (params["y"] + 2) ** 2


def run(tuner, n):
    values = []
    for _ in range(n):
        pid, params = tuner.ask()
        values.append(bowl(params))
        tuner.tell(pid, values[-1])
    return values


FAST_GP = {"optimize_mode": "minimize", "cold_start_num": 6, "selection_num_warm_up": 2000,
           "selection_num_starting_points": 4}


def test_gp_closes_in_on_the_minimum_after_its_random_start():
    gp = [min(run(build_tuner("GPTuner", FAST_GP, PLANE, seed), 20)) for seed in range(3)]
    rand = [min(run(build_tuner("Random", {"optimize_mode": "minimize"}, PLANE, seed), 20)) for seed in range(3)]
    assert statistics.mean(gp) < statistics.mean(rand) / 5 and max(gp) < 0.5, (gp, rand)


def test_gps_utilities_are_nnis():
    class Model:  # a GP's predict: the mean and standard deviation at each point
        def predict(self, points, return_std):
            return points[:, 0] * 1.0, points[:, 1] * 1.0

    import numpy
    from scipy.stats import norm

    point = numpy.array([[0.7, 0.2]])
    args = {"kappa": 5.0, "xi": 0.1}
    assert _acquisition({**args, "utility": "ucb"}, Model(), 0.5)(point)[0] == pytest.approx(0.7 + 5 * 0.2)
    z = (0.7 - 0.5 - 0.1) / 0.2
    assert _acquisition({**args, "utility": "poi"}, Model(), 0.5)(point)[0] == pytest.approx(norm.cdf(z))
    assert _acquisition({**args, "utility": "ei"}, Model(), 0.5)(point)[0] == pytest.approx(
        (0.7 - 0.5 - 0.1) * norm.cdf(z) + 0.2 * norm.pdf(z))
    # and each reaches the search: the same seed, another utility, another point
    proposals = set()
    for utility in ("ei", "ucb", "poi"):
        tuner = build_tuner("GP", {**FAST_GP, "utility": utility, "cold_start_num": 4}, PLANE, 1)
        run(tuner, 4)
        proposals.add(json.dumps(tuner.ask()[1]))
    assert len(proposals) == 3


def test_gp_takes_nnis_class_args_and_defaults():
    assert check_tuner("GPTuner", None, PLANE) == ("GP", {"optimize_mode": "maximize"})
    tuner = build_tuner("GP", None, PLANE, 0)
    assert {k: tuner.args[k] for k in ("utility", "kappa", "xi", "nu", "alpha", "cold_start_num",
                                       "selection_num_warm_up", "selection_num_starting_points")} == \
        {"utility": "ei", "kappa": 5.0, "xi": 0.0, "nu": 2.5, "alpha": 1e-6, "cold_start_num": 10,
         "selection_num_warm_up": 100000, "selection_num_starting_points": 250}  # NNI's
    with pytest.raises(UserError) as err:
        check_tuner("GP", {"utility": "pi"}, PLANE)
    assert err.value.where == "tuner.classArgs.utility"


def test_cma_es_learns_generation_by_generation():
    tuner = build_tuner("CMAES", {"optimize_mode": "minimize", "popsize": 6, "sigma0": 0.3}, PLANE, 2)
    values = []
    for _ in range(8):
        asked = [tuner.ask() for _ in range(6)]
        assert tuner.ask() is None and tuner.waiting  # the next generation waits for this one
        for pid, params in asked:
            values.append(bowl(params))
            tuner.tell(pid, values[-1])
    assert statistics.mean(values[-6:]) < statistics.mean(values[:6]) / 10, values


def test_cma_es_class_args_reach_cmaes():
    from cmaes import SepCMA

    tuner = build_tuner("CMAES", {"sigma0": 0.25, "popsize": 8, "lr_adapt": True}, PLANE, 0)
    assert (tuner._cma.population_size, tuner._cma._sigma, tuner._cma._lr_adapt) == (8, 0.25, True)
    assert isinstance(build_tuner("CMAES", {"use_separable_cma": True}, PLANE, 0)._cma, SepCMA)
    assert build_tuner("CMAES", None, PLANE, 0).popsize == 6  # CMA-ES's 4 + floor(3 ln 2)
    with pytest.raises(UserError) as err:
        check_tuner("CMAES", {"use_separable_cma": True, "lr_adapt": True}, PLANE)
    assert err.value.where == "tuner.classArgs.lr_adapt"


def cells(points, columns, rows):
    """The cells of a columns x rows grid over the plane that the points fall in."""
    return sorted((min(int((p["x"] + 5) / 10 * columns), columns - 1), min(int((p["y"] + 5) / 10 * rows), rows - 1))
                  for p in points)


def test_sobol_and_halton_cover_the_space_evenly_from_the_first_points():
    every = {(2, 2): [(i, j) for i in range(2) for j in range(2)], (2, 3): [(i, j) for i in range(2) for j in range(3)]}
    # Sobol's first four points: one in each quadrant; Halton's (bases 2 and 3) first six: one in each of 2 x 3.
    for name, args, grid in (("Sobol", None, (2, 2)), ("Sobol", {"scramble": True, "seed": 4}, (2, 2)),
                             ("QMC", None, (2, 2)), ("QMC", {"qmc_type": "halton"}, (2, 3))):
        tuner = build_tuner(name, args, PLANE, 0)
        first = [tuner.ask()[1] for _ in range(grid[0] * grid[1])]
        assert cells(first, *grid) == every[grid], (name, args)
    # a point is a function of its parameter id and the seed alone
    scrambled = [build_tuner("QMC", {"scramble": True, "seed": s}, PLANE, 0).ask()[1] for s in (1, 1, 2)]
    assert scrambled[0] == scrambled[1] != scrambled[2]
    with pytest.raises(UserError) as err:
        check_tuner("Sobol", {"seed": 3}, PLANE)
    assert "scramble" in err.value.line() and err.value.where == "tuner.classArgs.seed"


def test_quasi_random_points_reach_nested_choices():
    space = parse_space({"layer": {"_type": "choice", "_value": [
        {"_name": "conv", "kernel": {"_type": "choice", "_value": [3, 5]}},
        {"_name": "pool", "size": {"_type": "randint", "_value": [2, 5]}}]}, "lr": {"_type": "uniform",
                                                                                "_value": [0, 1]}})
    assert paths(space) == [("layer",), ("layer", "conv", "kernel"), ("layer", "pool", "size"), ("lr",)]
    tuner = build_tuner("QMC", None, space, 0)
    points = [tuner.ask()[1] for _ in range(16)]
    assert all(space.contains(p) for p in points)
    assert {p["layer"]["_name"] for p in points} == {"conv", "pool"}
    assert from_units(space, {("layer",): 0.9, ("layer", "conv", "kernel"): 0.0, ("layer", "pool", "size"): 0.99,
                              ("lr",): 0.5}) == {"layer": {"_name": "pool", "size": 4}, "lr": 0.5}


BATCH = parse_space({"combine_params": {"_type": "choice", "_value": [
    {"optimizer": "Adam", "learning_rate": 0.001}, {"optimizer": "Adam", "learning_rate": 0.0001},
    {"optimizer": "SGD", "learning_rate": 0.01}]}})


def test_batch_tries_each_parameter_set_once_in_order_as_nnis():
    tuner = build_tuner("BatchTuner", None, BATCH, 0)
    asked = []
    while (got := tuner.ask()) is not None:
        asked.append(got)
    assert asked == [(0, {"optimizer": "Adam", "learning_rate": 0.001}),
                     (1, {"optimizer": "Adam", "learning_rate": 0.0001}), (2, {"optimizer": "SGD", "learning_rate": 0.01})]
    resumed = build_tuner("Batch", None, BATCH, 0)
    resumed.replay([(0, asked[0][1], 0.5), (1, asked[1][1], None)])
    assert resumed.ask() == asked[2] and resumed.ask() is None
    for space, words in ((PLANE, "one parameter"), (parse_space({"p": {"_type": "choice", "_value": [1, 2]}}),
                                                    "option 0 is not a set of parameters")):
        with pytest.raises(UserError) as err:
            check_tuner("Batch", None, space)
        assert words in err.value.line()
    with pytest.raises(UserError) as err:
        check_tuner("Batch", {"optimize_mode": "minimize", "seed": 1}, BATCH)
    assert err.value.where == "tuner.classArgs.seed"


@pytest.mark.parametrize("name, instead", [("SMAC", "use TPE"), ("MetisTuner", "use GP"), ("Metis", "use GP"),
                                           ("DNGOTuner", "use GP"), ("ppo_tuner", "use TPE"),
                                           ("RegularizedEvolutionTuner", "use Evolution")])
def test_nni_tuners_not_carried_are_refused_naming_the_nearest_one_and_why(name, instead):
    with pytest.raises(UserError) as err:
        check_tuner(name, None, PLANE)
    line = err.value.line()
    assert "is not available in trialkit: " in line and instead in line and "\n" not in line
    assert err.value.where == "tuner.name"


def test_a_tuner_whose_library_is_missing_says_which_extra_installs_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(tuners.importlib.util, "find_spec", lambda name: None if name == "statsmodels" else real(name))
    with pytest.raises(UserError) as err:
        check_tuner("BOHB", None, PLANE)
    assert "statsmodels" in err.value.line() and "pip install 'trialkit[search]'" in err.value.line()
    assert check_tuner("Hyperband", None, PLANE)[0] == "Hyperband"  # needs nothing beyond the standard library
