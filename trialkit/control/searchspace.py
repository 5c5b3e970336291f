"""NNI's search space format: parsing, validation, sampling, grids, mutation.

A space maps parameter names to `{"_type": T, "_value": V}`. `choice` picks one
of V; an option that is a mapping with `_name` is a nested space of its own,
and the chosen value is `{"_name": NAME, <its parameters>...}` as NNI gives it.
Numeric types follow NNI's formulas: randint [low, high), uniform,
loguniform, normal(mu, sigma), lognormal, and their q-variants
`round(x / q) * q` (clipped to [low, high] for the bounded ones).

Every numeric parameter is a function of one uniform number u in (0, 1)
(`Numeric.from_unit`): sampling draws u, and TPE models u, which is an affine
map of the value (or of its log) for the uniform types and the normal CDF for
the normal ones; one representation serves random search, TPE and resume.

Grid search enumerates choice, randint, quniform and qloguniform (the
quantized values from low to high, both ends included, as NNI's docs list
them). uniform, loguniform and the normal types are continuous or unbounded:
a grid refuses them with an error naming the parameter, rather than inventing
a discretization the user did not ask for.
"""
from __future__ import annotations

import copy
import itertools
import json
import math
import random
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from trialkit import schema
from trialkit.errors import UserError
from trialkit.records import INT64_MAX, INT64_MIN, in_int64

# Names of each type's `_value` entries, in order.
NUMERIC_ARGS: Dict[str, Tuple[str, ...]] = {
    "randint": ("low", "high"),
    "uniform": ("low", "high"),
    "quniform": ("low", "high", "q"),
    "loguniform": ("low", "high"),
    "qloguniform": ("low", "high", "q"),
    "normal": ("mu", "sigma"),
    "qnormal": ("mu", "sigma", "q"),
    "lognormal": ("mu", "sigma"),
    "qlognormal": ("mu", "sigma", "q"),
}
TYPES = ("choice",) + tuple(NUMERIC_ARGS)
GRID_TYPES = ("choice", "randint", "quniform", "qloguniform")
# u never reaches 0 or 1: the normal quantile is infinite there.
_EPS = 1e-12
_STANDARD = NormalDist()
# exp() overflows past about 709.
_MAX_EXP = 700.0


def _tidy(x: float) -> float:
    """Drop float noise from k * q (3 * 0.1 -> 0.3), keeping 12 significant digits."""
    return float(f"{x:.12g}")


@dataclass(frozen=True)
class Numeric:
    kind: str
    a: float  # low, or mu for the normal types
    b: float  # high, or sigma
    q: Optional[float] = None

    @property
    def log(self) -> bool:
        return "log" in self.kind

    @property
    def bounded(self) -> bool:
        return not self.kind.endswith("normal")

    def _clip(self, x: float) -> float:
        return min(max(x, self.a), self.b) if self.bounded else x

    def _quantize(self, x: float) -> float:
        return self._clip(_tidy(round(x / self.q) * self.q))

    def from_unit(self, u: float) -> Union[int, float]:
        u = min(max(u, _EPS), 1.0 - _EPS)
        if self.kind == "randint":
            span = int(self.b) - int(self.a)
            return int(self.a) + min(int(u * span), span - 1)
        if self.bounded:
            lo, hi = (math.log(self.a), math.log(self.b)) if self.log else (self.a, self.b)
            x = lo + u * (hi - lo)
        else:
            x = self.a + self.b * _STANDARD.inv_cdf(u)
        if self.log:
            x = math.exp(x)
        return self._quantize(x) if self.q else self._clip(x)

    def to_unit(self, value: float) -> float:
        """The u that `from_unit` maps to `value` (the middle of its bin for randint)."""
        if self.kind == "randint":
            return (value - self.a + 0.5) / (self.b - self.a)
        if self.log:
            value = math.log(value) if value > 0 else -math.inf
        if self.bounded:
            lo, hi = (math.log(self.a), math.log(self.b)) if self.log else (self.a, self.b)
            u = (value - lo) / (hi - lo)
        else:
            u = _STANDARD.cdf((value - self.a) / self.b) if math.isfinite(value) else 0.0
        return min(max(u, 0.0), 1.0)

    def grid_values(self) -> Iterator[Union[int, float]]:
        if self.kind == "randint":
            yield from range(int(self.a), int(self.b))
            return
        last = None
        for k in itertools.count(math.floor(self.a / self.q)):
            value = self._clip(_tidy(k * self.q))
            if value != last:
                yield value
            if value >= self.b:
                return
            last = value

    def contains(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.kind == "randint":
            return isinstance(value, int) and self.a <= value < self.b
        return self.a <= value <= self.b if self.bounded else True


@dataclass(frozen=True)
class Nested:
    name: str
    space: "SearchSpace"


@dataclass(frozen=True)
class Choice:
    options: Tuple[Any, ...]  # plain values, or Nested

    def index_of(self, value: Any) -> Optional[int]:
        for i, option in enumerate(self.options):
            if isinstance(option, Nested):
                if isinstance(value, Mapping) and value.get("_name") == option.name:
                    return i
            elif option == value and type(option) is type(value):
                return i
        return None

    def value_at(self, index: int, fill: Callable[["SearchSpace"], Dict[str, Any]]) -> Any:
        """Option `index` as a parameter value; `fill` gives a nested option's parameters."""
        option = self.options[index]
        if isinstance(option, Nested):
            return {"_name": option.name, **fill(option.space)}
        return copy.deepcopy(option)


Param = Union[Choice, Numeric]


class SearchSpace:
    """A validated search space; `to_dict()` gives back the user's JSON."""

    def __init__(self, params: Dict[str, Param], raw: Mapping[str, Any], where: str = "searchSpace"):
        self.params = params
        self.where = where  # the config key it came from, for errors found later
        self._raw = copy.deepcopy(dict(raw))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SearchSpace) and self._raw == other._raw

    def __repr__(self) -> str:
        return f"SearchSpace({self._raw!r})"

    def to_dict(self) -> Dict[str, Any]:
        return copy.deepcopy(self._raw)

    def sample(self, rng: random.Random) -> Dict[str, Any]:
        return {key: _sample_param(param, rng) for key, param in self.params.items()}

    def check_grid(self) -> None:
        """UserError naming the first parameter a grid cannot enumerate."""
        for key, param in self.params.items():
            if isinstance(param, Numeric) and param.kind not in GRID_TYPES:
                raise UserError(
                    f"GridSearch cannot enumerate {param.kind!r} (continuous or unbounded)",
                    schema.path(self.where, key),
                    "use choice, randint, quniform or qloguniform for it, or another tuner",
                )
            if isinstance(param, Choice):
                for option in param.options:
                    if isinstance(option, Nested):
                        option.space.check_grid()

    def grid(self) -> Iterator[Dict[str, Any]]:
        """Every point, lazily, the last parameter varying fastest."""
        keys = list(self.params)

        def points(i: int) -> Iterator[Tuple[Any, ...]]:
            if i == len(keys):
                yield ()
                return
            for value in _param_grid(self.params[keys[i]]):
                for rest in points(i + 1):
                    yield (value,) + rest

        for combo in points(0):
            yield dict(zip(keys, combo))

    def contains(self, params: Any) -> bool:
        """Whether `params` is a point of this space (used to skip stale history)."""
        if not isinstance(params, Mapping) or set(params) != set(self.params):
            return False
        for key, param in self.params.items():
            value = params[key]
            if isinstance(param, Numeric):
                if not param.contains(value):
                    return False
                continue
            index = param.index_of(value)
            if index is None:
                return False
            option = param.options[index]
            if isinstance(option, Nested):
                sub = {k: v for k, v in value.items() if k != "_name"}
                if not option.space.contains(sub):
                    return False
        return True

    def mutate(self, params: Mapping[str, Any], rng: random.Random) -> Dict[str, Any]:
        """A copy of `params` with one active parameter (nested ones included) sampled anew."""
        child = copy.deepcopy(dict(params))
        slots: List[Tuple[SearchSpace, Dict[str, Any], str]] = []
        _active_slots(self, child, slots)
        space, holder, key = rng.choice(slots)
        holder[key] = _sample_param(space.params[key], rng)
        return child


def _sample_param(param: Param, rng: random.Random) -> Any:
    if isinstance(param, Choice):
        return param.value_at(rng.randrange(len(param.options)), lambda space: space.sample(rng))
    return param.from_unit(rng.random())


def _active_slots(space: SearchSpace, params: Dict[str, Any], out: List) -> None:
    for key, param in space.params.items():
        out.append((space, params, key))
        if isinstance(param, Choice):
            index = param.index_of(params[key])
            option = param.options[index]
            if isinstance(option, Nested):
                _active_slots(option.space, params[key], out)


def _param_grid(param: Param) -> Iterator[Any]:
    if isinstance(param, Numeric):
        yield from param.grid_values()
        return
    for i, option in enumerate(param.options):
        if isinstance(option, Nested):
            for point in option.space.grid():
                yield {"_name": option.name, **point}
        else:
            yield copy.deepcopy(option)


# ---------------------------------------------------------------- parsing


def parse_space(raw: Any, where: str = "searchSpace", allow_empty: bool = False) -> SearchSpace:
    """Validate NNI's JSON search space; UserError names the parameter and the fix.

    `allow_empty`: an empty space is one point, `{}` (a config's inline
    `searchSpace: {}`, what a Determined config without hyperparameters becomes)."""
    raw = schema.mapping(raw, where)
    if not raw and not allow_empty:
        raise UserError("the search space is empty", where, "add at least one parameter")
    space = _parse_params(raw, where)
    size = _largest_point(space)
    if size > MAX_POINT_BYTES:
        raise UserError(f"a trial's parameters could take {size:,} bytes of JSON, over the {MAX_POINT_BYTES:,} "
                        "a trial's environment carries them in (Linux takes at most 128 KiB a variable)", where,
                        "make the options small: name a file or an index, and read the large data in the trial")
    return space


MAX_POINT_BYTES = 100_000  # TRIALKIT_PARAMETERS, one environment variable: MAX_ARG_STRLEN is 131,072 bytes
_NUMBER_BYTES = 24  # the longest a float's JSON takes (-1.2345678901234567e-308)


def _largest_point(space: "SearchSpace") -> int:
    """An upper bound of the bytes a point of `space` takes as JSON (records.dumps: ensure_ascii, spaced)."""
    total = 2
    for key, param in space.params.items():
        if isinstance(param, Numeric):
            value = _NUMBER_BYTES
        else:
            value = max(_largest_point(o.space) + len(json.dumps(o.name)) + 12 if isinstance(o, Nested)
                        else len(json.dumps(o)) for o in param.options)
        total += len(json.dumps(key)) + 4 + value
    return total


def _parse_params(raw: Mapping, where: str) -> SearchSpace:
    """The space of `raw`; every parameter's problem is refused together with the others'."""
    return SearchSpace(dict(schema.each(_parse_named, [(key, spec, where) for key, spec in raw.items()])), raw, where)


def _parse_named(key: Any, spec: Any, where: str) -> Tuple[str, Param]:
    here = schema.path(where, key)
    if not isinstance(key, str) or not key or key.startswith("_"):
        raise UserError(f"bad parameter name {schema.show(key)}", here,
                        "use a non-empty string that does not start with '_'")
    return key, _parse_param(spec, here)


def _parse_param(spec: Any, where: str) -> Param:
    spec = schema.mapping(spec, where)
    for key in spec:
        if key not in ("_type", "_value"):
            raise schema.unknown("key", key, ("_type", "_value"), schema.path(where, key))
    for key in ("_type", "_value"):
        if key not in spec:
            raise UserError(f"{key} is missing", schema.path(where, key),
                            'write {"_type": "choice", "_value": [...]} or another type')
    kind = spec["_type"]
    if kind not in TYPES:
        raise schema.unknown("parameter type", kind, TYPES, schema.path(where, "_type"))
    value_where = schema.path(where, "_value")
    if kind == "choice":
        return _parse_choice(spec["_value"], value_where)
    return _parse_numeric(kind, spec["_value"], value_where)


def _parse_choice(options: Any, where: str) -> Choice:
    if not isinstance(options, list) or not options:
        raise UserError(f"choice needs a non-empty list of options, got {schema.show(options)}", where,
                        "write _value: [option, ...]")
    parsed: List[Any] = []
    names = set()
    for i, option in enumerate(options):
        if isinstance(option, Mapping) and "_name" in option:
            here = f"{where}[{i}]"
            name = schema.as_str(option["_name"], f"{here}._name")
            if name in names:
                raise UserError(f"two nested options are named {name!r}", f"{here}._name", "give each a unique _name")
            names.add(name)
            sub = {k: v for k, v in option.items() if k != "_name"}
            parsed.append(Nested(name, _parse_params(sub, here)))
        else:
            _check_json(option, f"{where}[{i}]")
            parsed.append(option)
    return Choice(tuple(parsed))


def _check_json(value: Any, where: str) -> None:
    """Options travel as JSON (store, UI, trial environment): strict JSON values only."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{value} is not a JSON value", where, "use a finite number or a string")
    if isinstance(value, int) and not isinstance(value, bool) and not in_int64(value):
        raise UserError(f"{schema.show(value)} is out of range", where,
                        f"use a whole number from {INT64_MIN} to {INT64_MAX}, or a string")
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise UserError(f"key {schema.show(key)} is not a string", where, "quote the key")
            _check_json(item, schema.path(where, key))
    elif value is not None and not isinstance(value, (bool, int, float, str)):
        raise UserError(f"{schema.show(value)} is not a JSON value", where, "use a number, a string, a list or a mapping")


def _parse_numeric(kind: str, values: Any, where: str) -> Numeric:
    names = NUMERIC_ARGS[kind]
    if not isinstance(values, list) or len(values) != len(names):
        raise UserError(f"{kind} needs [{', '.join(names)}], got {schema.show(values)}", where,
                        f"write _value: [{', '.join(names)}]")
    args = dict(zip(names, (schema.as_number(v, f"{where}[{i}]") for i, v in enumerate(values))))
    fix = f"write _value: [{', '.join(names)}]"
    if "q" in args and args["q"] <= 0:
        raise UserError(f"q must be greater than 0, got {schema.show(values[2])}", f"{where}[2]", fix)
    bounded = "sigma" not in args
    a, b = (args["low"], args["high"]) if bounded else (args["mu"], args["sigma"])
    if bounded:
        if kind == "randint" and not (a.is_integer() and b.is_integer()):
            raise UserError(f"randint bounds must be whole numbers, got {schema.show(values)}", where, fix)
        if a >= b:
            raise UserError(f"low ({schema.show(values[0])}) must be less than high ({schema.show(values[1])})", where, fix)
        if "log" in kind and a <= 0:
            raise UserError(f"{kind} needs low > 0, got {schema.show(values[0])}", f"{where}[0]", "use a positive low bound")
    elif b <= 0:
        raise UserError(f"sigma must be greater than 0, got {schema.show(values[1])}", f"{where}[1]", fix)
    # The farthest a value (or its log) can get: keeps b - a, exp() and x / q finite.
    reach = max(abs(a), abs(b), abs(b - a)) if bounded else abs(a) + 8 * b
    too_far = not math.isfinite(reach) or (not bounded and "log" in kind and reach > _MAX_EXP)
    if too_far or ("q" in args and not math.isfinite(reach / args["q"])):
        raise UserError(f"{kind} {schema.show(values)} is out of the range it can sample", where, "use smaller numbers or a larger q")
    return Numeric(kind, a, b, args.get("q"))
