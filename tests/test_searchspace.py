"""NNI's search space: validation, sampling, grids, nested choices."""
from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from trialkit.control.searchspace import Numeric, parse_space
from trialkit.errors import UserError

NNI = Path(__file__).parent / "fixtures" / "nni" / "mnist-pytorch"


def nested_space():
    return parse_space(json.loads((NNI / "nested_search_space.json").read_text()))


def samples(space, n=2000, seed=0):
    rng = random.Random(seed)
    return [space.sample(rng) for _ in range(n)]


def test_the_mnist_space_loads_and_samples_inside_itself():
    space = parse_space(json.loads((NNI / "search_space.json").read_text()))
    for params in samples(space, 200):
        assert params["batch_size"] in (16, 32, 64, 128)
        assert 0 <= params["momentum"] <= 1
        assert space.contains(params)


@pytest.mark.parametrize(
    "spec, check",
    [
        ({"_type": "randint", "_value": [3, 7]}, lambda v: isinstance(v, int) and 3 <= v < 7),
        ({"_type": "uniform", "_value": [-2, 3]}, lambda v: -2 <= v <= 3),
        ({"_type": "quniform", "_value": [1, 11, 2.5]}, lambda v: v in (1, 2.5, 5, 7.5, 10, 11)),
        ({"_type": "loguniform", "_value": [1e-4, 1e-1]}, lambda v: 1e-4 <= v <= 1e-1),
        ({"_type": "qloguniform", "_value": [1, 1000, 10]}, lambda v: 1 <= v <= 1000 and (v == 1 or v % 10 == 0)),
        ({"_type": "normal", "_value": [5, 2]}, lambda v: isinstance(v, float)),
        ({"_type": "qnormal", "_value": [5, 2, 0.5]}, lambda v: (v / 0.5).is_integer()),
        ({"_type": "lognormal", "_value": [0, 1]}, lambda v: v > 0),
        ({"_type": "qlognormal", "_value": [2, 1, 3]}, lambda v: v >= 0 and (v / 3).is_integer()),
    ],
)
def test_every_type_samples_its_own_range(spec, check):
    space = parse_space({"p": spec})
    values = [params["p"] for params in samples(space)]
    assert all(check(v) for v in values), [v for v in values if not check(v)][:5]
    assert all(space.contains({"p": v}) for v in values)


def test_randint_reaches_both_ends_but_not_high():
    values = {p["p"] for p in samples(parse_space({"p": {"_type": "randint", "_value": [0, 4]}}), 500)}
    assert values == {0, 1, 2, 3}


def test_normal_and_loguniform_have_the_right_shape():
    normal = [p["p"] for p in samples(parse_space({"p": {"_type": "normal", "_value": [5, 2]}}), 4000)]
    assert statistics.mean(normal) == pytest.approx(5, abs=0.15)
    assert statistics.stdev(normal) == pytest.approx(2, abs=0.15)
    logs = [math.log10(p["p"]) for p in samples(parse_space({"p": {"_type": "loguniform", "_value": [1e-4, 1]}}), 4000)]
    # uniform in log space: each decade gets about a quarter
    assert sum(1 for x in logs if x < -3) / len(logs) == pytest.approx(0.25, abs=0.03)


def test_sampling_is_reproducible_with_a_seed():
    space = nested_space()
    assert samples(space, 50, seed=3) == samples(space, 50, seed=3)
    assert samples(space, 50, seed=3) != samples(space, 50, seed=4)


def test_nested_choice_gives_the_chosen_options_own_parameters():
    space = nested_space()
    seen = set()
    for params in samples(space, 500):
        for layer in ("layer0", "layer1"):
            value = params[layer]
            seen.add(value["_name"])
            expected = {"Empty": set(), "Conv": {"kernel_size"}, "Max_pool": {"pooling_size"},
                        "Avg_pool": {"pooling_size"}}[value["_name"]]
            assert set(value) - {"_name"} == expected
            if "kernel_size" in value:
                assert value["kernel_size"] in (1, 2, 3, 5)
            if "pooling_size" in value:
                assert value["pooling_size"] in (2, 3, 5)
        assert space.contains(params)
    assert seen == {"Empty", "Conv", "Max_pool", "Avg_pool"}


def test_contains_rejects_what_the_space_cannot_give():
    space = nested_space()
    good = space.sample(random.Random(0))
    assert space.contains(good)
    assert not space.contains({**good, "dropout_rate": 0.95})
    assert not space.contains({**good, "layer0": {"_name": "Conv", "kernel_size": 4}})
    assert not space.contains({**good, "layer0": {"_name": "Dense"}})
    assert not space.contains({k: v for k, v in good.items() if k != "layer1"})


def test_grid_enumerates_exactly_the_product():
    space = parse_space({
        "opt": {"_type": "choice", "_value": ["sgd", "adam"]},
        "layers": {"_type": "randint", "_value": [1, 4]},
        "ratio": {"_type": "quniform", "_value": [0, 1, 0.5]},
    })
    space.check_grid()
    expected = [{"opt": o, "layers": n, "ratio": r} for o in ("sgd", "adam") for n in (1, 2, 3) for r in (0.0, 0.5, 1.0)]
    assert list(space.grid()) == expected


def test_quantized_grid_lists_what_nnis_docs_list():
    # NNI's docs: quniform [1, 11, 2.5] takes the values 1, 2.5, 5, 7.5, 10, 11.
    space = parse_space({"p": {"_type": "quniform", "_value": [1, 11, 2.5]}})
    assert [p["p"] for p in space.grid()] == [1, 2.5, 5, 7.5, 10, 11]
    tenth = parse_space({"p": {"_type": "quniform", "_value": [0, 0.3, 0.1]}})
    assert [p["p"] for p in tenth.grid()] == [0, 0.1, 0.2, 0.3]  # no 0.30000000000000004


def test_nested_grid_expands_each_option():
    space = parse_space({"layer": json.loads((NNI / "nested_search_space.json").read_text())["layer0"]})
    names = [p["layer"]["_name"] for p in space.grid()]
    assert names == ["Empty"] + ["Conv"] * 4 + ["Max_pool"] * 3 + ["Avg_pool"] * 3


@pytest.mark.parametrize("kind", ["uniform", "loguniform", "normal", "lognormal", "qnormal"])
def test_grid_refuses_continuous_parameters_by_name(kind):
    values = [1, 2, 0.5] if kind == "qnormal" else [1, 2]
    space = parse_space({"ok": {"_type": "choice", "_value": [1]}, "lr": {"_type": kind, "_value": values}})
    with pytest.raises(UserError) as err:
        space.check_grid()
    assert err.value.where == "searchSpace.lr"
    assert kind in err.value.line() and "quniform" in err.value.line()


def test_mutate_changes_one_active_parameter():
    space = parse_space({
        "a": {"_type": "uniform", "_value": [0, 1]},
        "b": {"_type": "uniform", "_value": [0, 1]},
        "c": {"_type": "uniform", "_value": [0, 1]},
    })
    rng = random.Random(1)
    parent = space.sample(rng)
    for _ in range(50):
        child = space.mutate(parent, rng)
        assert space.contains(child)
        assert sum(child[k] != parent[k] for k in parent) <= 1
    nested = nested_space()
    parent = nested.sample(rng)
    for _ in range(50):
        assert nested.contains(nested.mutate(parent, rng))


@pytest.mark.parametrize("kind, values", [
    ("uniform", [-3, 8]), ("quniform", [0, 10, 2]), ("loguniform", [1e-3, 10]), ("randint", [2, 9]),
    ("normal", [1, 3]), ("lognormal", [0, 0.5]),
])
def test_unit_coordinate_round_trips(kind, values):
    # TPE models u and replays history through to_unit: the two must agree.
    param = parse_space({"p": {"_type": kind, "_value": values}}).params["p"]
    assert isinstance(param, Numeric)
    for u in (0.05, 0.3, 0.5, 0.77, 0.95):
        value = param.from_unit(u)
        assert param.from_unit(param.to_unit(value)) == pytest.approx(value, rel=1e-6)


@pytest.mark.parametrize(
    "space, where, words",
    [
        ({"lr": {"_type": "uniform", "_value": [1, 1]}}, "searchSpace.lr._value", "less than high"),
        ({"lr": {"_type": "uniform", "_value": [2, 1]}}, "searchSpace.lr._value", "less than high"),
        ({"lr": {"_type": "loguniform", "_value": [0, 1]}}, "searchSpace.lr._value[0]", "low > 0"),
        ({"lr": {"_type": "qloguniform", "_value": [-1, 1, 0.1]}}, "searchSpace.lr._value[0]", "low > 0"),
        ({"lr": {"_type": "unifrom", "_value": [0, 1]}}, "searchSpace.lr._type", "did you mean 'uniform'"),
        ({"lr": {"_type": "uniform"}}, "searchSpace.lr._value", "missing"),
        ({"lr": {"_type": "uniform", "_value": [0, 1], "_default": 0}}, "searchSpace.lr._default", "unknown key"),
        ({"lr": {"_type": "uniform", "_value": [0]}}, "searchSpace.lr._value", "[low, high]"),
        ({"lr": {"_type": "uniform", "_value": [0, "1"]}}, "searchSpace.lr._value[1]", "number"),
        ({"lr": {"_type": "uniform", "_value": [0, True]}}, "searchSpace.lr._value[1]", "number"),
        ({"lr": {"_type": "uniform", "_value": [0, float("nan")]}}, "searchSpace.lr._value[1]", "finite"),
        ({"n": {"_type": "randint", "_value": [1.5, 4]}}, "searchSpace.n._value", "whole numbers"),
        ({"q": {"_type": "quniform", "_value": [0, 1, 0]}}, "searchSpace.q._value[2]", "q must be"),
        ({"s": {"_type": "normal", "_value": [0, -1]}}, "searchSpace.s._value[1]", "sigma"),
        ({"s": {"_type": "lognormal", "_value": [800, 1]}}, "searchSpace.s._value", "out of the range"),
        ({"c": {"_type": "choice", "_value": []}}, "searchSpace.c._value", "non-empty list"),
        ({"c": {"_type": "choice", "_value": 3}}, "searchSpace.c._value", "non-empty list"),
        ({"c": {"_type": "choice", "_value": [1, float("inf")]}}, "searchSpace.c._value[1]", "JSON"),
        ({"c": "choice"}, "searchSpace.c", "mapping"),
        ({"_c": {"_type": "choice", "_value": [1]}}, "searchSpace._c", "parameter name"),
        ({}, "searchSpace", "empty"),
        ({"c": {"_type": "choice", "_value": [{"_name": "a"}, {"_name": "a"}]}}, "searchSpace.c._value[1]._name", "unique"),
        ({"c": {"_type": "choice", "_value": [{"_name": "a", "k": {"_type": "randint", "_value": [5, 1]}}]}},
         "searchSpace.c._value[0].k._value", "less than high"),
    ],
)
def test_mistakes_are_one_line_errors_naming_the_parameter(space, where, words):
    with pytest.raises(UserError) as err:
        parse_space(space)
    assert err.value.where == where
    line = err.value.line()
    assert words in line and "\n" not in line and err.value.fix
