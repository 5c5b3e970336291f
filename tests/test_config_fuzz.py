"""Config fuzz: random mutations of valid configs either load (and round-trip) or
fail with one UserError whose single line names a key; never another exception.

The mutations reach the classes of input an outside run found tracebacks in
(issue 29): whole numbers past a float's range or of thousands of digits
where a duration, a bound or a q is expected, paths longer than a file name
or a path can be, a value that holds itself, nesting past the bound."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import yaml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trialkit.control.config import parse_config
from trialkit.errors import UserError
from trialkit.schema import ConfigProblems

NNI = Path(__file__).parent / "fixtures" / "nni" / "mnist-pytorch"

V2 = {
    "experimentName": "fuzz",
    "searchSpace": {
        "lr": {"_type": "loguniform", "_value": [1e-4, 0.1]},
        "batch_size": {"_type": "choice", "_value": [16, 32, 64]},
        "layer": {"_type": "choice", "_value": [
            {"_name": "Empty"},
            {"_name": "Conv", "kernel": {"_type": "randint", "_value": [1, 5]}},
        ]},
        "momentum": {"_type": "quniform", "_value": [0, 1, 0.1]},
        "noise": {"_type": "qnormal", "_value": [0, 1, 0.5]},
    },
    "trialCommand": "python3 mnist.py",
    "trialCodeDirectory": ".",
    "trialConcurrency": 2,
    "trialGpuNumber": 1,
    "maxTrialNumber": 10,
    "maxExperimentDuration": "1h",
    "maxTrialDuration": 600,
    "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize", "seed": 1, "tpe_args": {"n_startup_jobs": 5}}},
    "assessor": {"name": "Medianstop", "classArgs": {"optimize_mode": "maximize", "start_step": 2}},
    "trainingService": {"platform": "local", "useActiveGpu": False, "gpuIndices": [0], "slotsPerTrial": 1},
    "trialGraceSeconds": 10,
    "priority": 1,
}
V2_FILE = {**{k: v for k, v in V2.items() if k != "searchSpace"}, "searchSpaceFile": "nested_search_space.json"}
V1 = {
    **yaml.safe_load((NNI / "config_v1.yml").read_text()),
    "localConfig": {"gpuIndices": "0", "maxTrialNumPerGpu": 1, "useActiveGpu": False},
    "assessor": {"builtinAssessorName": "Medianstop", "classArgs": {"start_step": 1}},
}
BASES = [V2, V2_FILE, V1]

# Values and keys that reach past the first check.
WORDS = [
    "TPE", "Random", "GridSearch", "Evolution", "Anneal", "Medianstop", "Pruner", "median", "local",
    "maximize", "minimize", "choice", "uniform", "randint", "loguniform", "normal", "qlognormal",
    "1h", "30m", "2.5d", "-1", "0", "search_space.json", "nested_search_space.json", ".", "..", "~", "~nobody",
    "\x00", "", " ", "a\nb", "\ud800", "a" * 5000, "/tmp/" + "a/" * 3000, "1" + "0" * 400 + "s",
]
KEYS = [
    "trialCommand", "trial_command", "maxTrialNumber", "maxTrialNum", "searchSpace", "searchSpaceFile",
    "tuner", "assessor", "advisor", "name", "classArgs", "class_args", "optimize_mode", "start_step", "seed",
    "tpe_args", "population_size", "pruner", "_type", "_value", "_name", "platform", "useActiveGpu",
    "gpuIndices", "trainingService", "trial", "command", "codeDir", "builtinTunerName", "localConfig",
]
# Past int64, past a float, past what repr() writes (made by a map: hypothesis repr()s a sampled list).
HUGE = st.sampled_from([63, 400, 5000]).map(lambda digits: 10 ** digits) | st.just(-(2 ** 63) - 1)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 40), st.integers(), HUGE, st.floats(), st.text(max_size=10),
    st.sampled_from(WORDS),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6), st.integers(0, 2)), inner, max_size=3),
    max_leaves=8,
)
Path_ = Tuple[Any, ...]


def places(node: Any, at: Path_ = ()) -> Iterator[Path_]:
    """Every path to a value inside `node` (dict keys, list indexes)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield at + (key,)
        yield from places(child, at + (key,))


def parent(config: Any, path: Path_) -> Any:
    for key in path[:-1]:
        config = config[key]
    return config


def typo(key: Any, data: st.DataObject) -> Any:
    if not isinstance(key, str) or not key:
        return data.draw(st.sampled_from(KEYS))
    i = data.draw(st.integers(0, len(key) - 1))
    return data.draw(st.sampled_from([
        key[:i] + key[i + 1:],  # a letter missing
        key[:i] + key[i] * 2 + key[i + 1:],  # a letter twice
        key.swapcase(),
        key + "s",
        data.draw(st.sampled_from(KEYS)),
    ]))


def nested(levels: int, leaf: Any) -> Any:
    for _ in range(levels):
        leaf = [leaf]
    return leaf


def mutate(config: Any, data: st.DataObject) -> Any:
    targets: List[Path_] = list(places(config))
    if not targets:
        return data.draw(VALUES)
    path = data.draw(st.sampled_from(targets))
    holder, key = parent(config, path), path[-1]
    op = data.draw(st.sampled_from(["set", "set", "delete", "rename", "add"]))
    if op == "set":
        holder[key] = data.draw(VALUES)
    elif op == "delete":
        del holder[key]
    elif op == "rename" and isinstance(holder, dict):
        holder[typo(key, data)] = holder.pop(key)
    elif op == "add" and isinstance(holder[key], dict):
        holder[key][data.draw(st.sampled_from(KEYS) | st.text(max_size=6))] = data.draw(VALUES)
    return config


def entangle(config: Any, data: st.DataObject) -> Any:
    """The last mutation, if any (places() cannot walk what it makes): a value that holds itself (what a
    YAML alias inside the value it names makes), or one nested deep."""
    op = data.draw(st.sampled_from([None, None, "itself", "deep"]))
    targets: List[Path_] = list(places(config))
    if op is None or not targets:
        return config
    path = data.draw(st.sampled_from(targets))
    holder = parent(config, path)
    holder[path[-1]] = holder if op == "itself" else nested(data.draw(st.integers(90, 3000)), data.draw(SCALARS))
    return config


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_every_mutated_config_loads_or_says_which_key_is_wrong(data):
    config = copy.deepcopy(data.draw(st.sampled_from(BASES)))
    for _ in range(data.draw(st.integers(1, 3))):
        config = mutate(config, data)
    config = entangle(config, data)
    try:
        loaded = parse_config(config, NNI)
    except UserError as err:
        assert "\n" not in err.line() and "\r" not in err.line()
        # Each problem starts with the key's path as the user reads it: a path past a long word's length (a
        # choice nested 60 deep) is shown by its ends, as every long word of a line is.
        for one in err.problems if isinstance(err, ConfigProblems) else [err]:
            assert one.where and one.line().startswith(UserError("", one.where).line().rstrip(":") + ": ")
        return
    stored = json.loads(json.dumps(loaded.to_dict()))
    assert parse_config(stored, "/") == loaded


def test_the_unmutated_bases_load():
    for base in BASES:
        assert parse_config(copy.deepcopy(base), NNI).trial_command == "python3 mnist.py"


# Each at every place of every base, not by chance: the classes an outside run found tracebacks in (issue 29).
EVERYWHERE = {
    "a number past repr": lambda holder: 10 ** 5000,
    "a negative one in a list": lambda holder: [-(10 ** 5000)],
    "a number past a float": lambda holder: -(10 ** 400),
    "a path past a file name": lambda holder: "a" * 5000,
    "a lone surrogate": lambda holder: "python3 \ud800",
    "itself": lambda holder: holder,
}


EXAMPLES = Path(__file__).parent.parent / "examples" / "kubernetes"  # the cluster platforms' sections, v1 and v2
CLUSTER_BASES = [yaml.safe_load(path.read_text()) for path in sorted(EXAMPLES.glob("*.yml"))]


@pytest.mark.parametrize("kind", list(EVERYWHERE))
def test_each_hostile_value_at_each_place_is_one_line_or_loads(kind):
    for base, folder in [(base, NNI) for base in BASES] + [(base, EXAMPLES) for base in CLUSTER_BASES]:
        for path in list(places(base)):
            config = copy.deepcopy(base)
            holder = parent(config, path)
            holder[path[-1]] = EVERYWHERE[kind](holder)
            try:
                parse_config(config, folder)
            except UserError as err:  # one line naming where: the key, or each key of several problems
                assert "\n" not in err.line() and (err.where or isinstance(err, ConfigProblems)), (path, err.line())
