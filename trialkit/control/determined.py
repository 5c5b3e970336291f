"""A Determined experiment config (0.38) as trialkit's own (NNI v2 keys), as `det experiment create CONFIG
CONTEXT_DIR` would run it.

    if is_determined(data): v2, notes = to_v2(data, base_dir, context_dir)    # then config.py parses v2

Each Determined field becomes trialkit settings; a few that only describe
the experiment or pace Determined's own training loop are checked and noted
(NOTED_KEYS); the rest are refused by name. A refusal is one line (exit 2)
listing every problem found, in the keys the user wrote (V2_WHERE names
them for what config.py finds in the translation).
docs/migration/determined.md is the table. What the Core API serves the
trial from the config (the searcher's metric and lengths, `data`) travels in
env.DETERMINED, set by an `env` in front of the entrypoint: a command line
that stays a plain command (no shell between the keeper and the training).
"""
from __future__ import annotations

import base64
import difflib
import json
import math
import os
import re
import shlex
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from trialkit import env, platforms, schema, trial
from trialkit.control.assessors import asha_brackets, check_assessor
from trialkit.errors import UserError

GUIDE = "see docs/migration/determined.md"
TOP_KEYS = ("name", "entrypoint", "hyperparameters", "searcher", "resources", "max_restarts", "environment",
            "bind_mounts", "checkpoint_storage", "data", "trainingService", "stopWhenFirstTrialsFail")
SEARCHERS = ("single", "random", "grid", "adaptive_asha")
SEARCHER_KEYS = {
    "single": ("name", "metric", "smaller_is_better", "max_length"),
    "random": ("name", "metric", "smaller_is_better", "max_length", "max_trials", "max_concurrent_trials"),
    "grid": ("name", "metric", "smaller_is_better", "max_length", "max_concurrent_trials"),
    "adaptive_asha": ("name", "metric", "smaller_is_better", "max_length", "max_trials", "max_concurrent_trials",
                      "time_metric", "max_time", "max_rungs", "divisor", "mode", "bracket_rungs"),
}
# Determined's own keys (its expconf schema, 0.38) and searchers that trialkit does not take: refused as not
# supported; any other key is a typo, refused as unknown with the key it is closest to.
DETERMINED_TOP_KEYS = ("checkpoint_policy", "data_layer", "debug", "integrations", "internal", "log_policies",
                       "optimizations", "pbs", "preemption_timeout", "profiling", "reproducibility",
                       "retention_policy", "security", "slurm", "tensorboard_storage")
DETERMINED_RESOURCE_KEYS = ("agent_label", "devices", "is_single_node", "native_parallel", "shm_size")
DETERMINED_ENVIRONMENT_KEYS = ("add_capabilities", "drop_capabilities", "force_pull_image", "pod_spec", "ports",
                               "proxy_ports", "registry_auth")
DETERMINED_SEARCHER_KEYS = ("budget", "explore_function", "length_per_round", "num_rounds", "num_rungs",
                            "population_size", "replace_function", "source_checkpoint_uuid", "source_trial_id",
                            "stop_once", "unit")
DETERMINED_STORAGE_TYPES = ("directory",)  # a path inside Determined's task containers
DETERMINED_SEARCHERS = ("adaptive", "adaptive_simple", "async_halving", "custom", "manual", "pbt", "sync_halving")
# What trialkit has for a Determined searcher it does not take, after the list of those it does.
INSTEAD_OF = {
    "pbt": ", or trialkit's PBT tuner: a trialkit config, NNI's keys, with tuner: {name: PBT, classArgs: "
           "{population_size: 10}} and your entrypoint as trialCommand runs your Core API code unchanged, "
           "latest_checkpoint naming the checkpoint each trial goes on from",
    "async_halving": ": adaptive_asha is asynchronous successive halving",
    **dict.fromkeys(("adaptive", "adaptive_simple", "sync_halving"),
                    ", or trialkit's Hyperband tuner: tuner: {name: Hyperband} in a trialkit config"),
}
LENGTH_UNITS = ("batches", "epochs", "records")
DEFAULT_CONCURRENCY = 16  # Determined's max_concurrent_trials for random and grid
DEFAULT_MAX_RESTARTS = 5  # Determined's
TRIAL_CLASS = re.compile(r"^[\w./-]+:[A-Za-z_]\w*$")  # the legacy `model_def:MyTrial` entrypoint
MAX_GRID_POINTS = 100_000  # trials a grid may run: past it, a count is a slip (10**9 points), refused unbuilt
MAX_SETTINGS_BYTES = 64_000  # the searcher and `data`, packed into the trial's command (one environment variable)
# Where the v2 config's checks (config.py) speak of a key this translation wrote, the Determined key it came from.
V2_WHERE = (("searchSpace", "hyperparameters"), ("trialCommand", "entrypoint"), ("trialCodeDirectory", "CONTEXT_DIR"),
            ("maxTrialRestarts", "max_restarts"), ("experimentName", "name"), ("maxTrialNumber", "searcher.max_trials"),
            ("trialConcurrency", "searcher.max_concurrent_trials"),
            ("experimentWorkingDirectory", "checkpoint_storage.host_path"), ("assessor.classArgs", "searcher"),
            ("checkpointStorage.endpointUrl", "checkpoint_storage.endpoint_url"),
            ("checkpointStorage.accountUrl", "checkpoint_storage.account_url"),
            ("checkpointStorage.secretName", "checkpoint_storage.secret_name"),
            ("checkpointStorage.saveExperimentBest", "checkpoint_storage.save_experiment_best"),
            ("checkpointStorage.saveTrialBest", "checkpoint_storage.save_trial_best"),
            ("checkpointStorage.saveTrialLatest", "checkpoint_storage.save_trial_latest"),
            ("checkpointStorage", "checkpoint_storage"),
            ("tuner", "searcher"))
_FAILED = object()  # a part whose problem is reported: nothing is built from it


def is_determined(data: Mapping[str, Any]) -> bool:
    """A Determined config names its entrypoint or its searcher; an NNI config has neither key."""
    return "entrypoint" in data or "searcher" in data


def to_v2(data: Mapping[str, Any], base: Path, context_dir: Optional[str],
          check_code: bool = False) -> Tuple[Dict[str, Any], List[str]]:
    """trialkit's v2 config dict of a Determined config, and a note on the keys it takes without use; relative
    paths are read from `base`; `check_code`: config.parse_config's. A refusal lists every problem found
    (schema.ConfigProblems), as for NNI's."""
    with schema.every_problem():
        return _translate(data, base, context_dir, check_code)


def _translate(data: Mapping[str, Any], base: Path, context_dir: Optional[str],
               check_code: bool) -> Tuple[Dict[str, Any], List[str]]:
    noted = [key for key in data if key in NOTED_KEYS and data[key] is not None]
    for key in data:
        if key in NOTED_KEYS:
            if data[key] is not None:
                schema.attempt(NOTED_KEYS[key], data[key], key)
        elif key not in TOP_KEYS and key in _SEARCHER_ALL_KEYS and key not in DETERMINED_TOP_KEYS:
            schema.report(UserError("a searcher's key, not a top-level one", key, "move it under searcher:"))
        elif key not in TOP_KEYS:
            schema.report(_refused_key(key, data, "", TOP_KEYS + tuple(NOTED_KEYS), DETERMINED_TOP_KEYS,
                                       f"Determined's {key!r} is not supported by trialkit"))
    code_dir = schema.attempt(_context_dir, context_dir, base, default=_FAILED)
    entry = schema.attempt(_entrypoint, data.get("entrypoint"), default=_FAILED)
    searcher = schema.attempt(_searcher, data.get("searcher"), default=_FAILED)
    grid = searcher["name"] == "grid" if searcher is not _FAILED else _names_grid(data.get("searcher"))
    space = schema.attempt(_search_space, data.get("hyperparameters") or {}, grid, default=_FAILED)
    restarts = schema.attempt(schema.as_int, _default(data, "max_restarts", DEFAULT_MAX_RESTARTS), "max_restarts",
                              0, 1000, default=_FAILED)
    name = _FAILED if data.get("name") is None else schema.attempt(schema.as_str, data["name"], "name",
                                                                   default=_FAILED)
    user_data = schema.attempt(_data, data.get("data"), default=_FAILED)
    # What follows depends on the platform: with none to go by, its checks would only guess.
    section = dict(schema.mapping(data.get("trainingService") or {"platform": "local"}, "trainingService"))
    platform = platforms.canonical_name(section.get("platform"), "trainingService.platform")
    local = platform == "local"
    if local and entry is not _FAILED and code_dir is not _FAILED:  # elsewhere the code may be the image's
        schema.attempt(_entry_code, entry, code_dir, check_code)
    resources = schema.attempt(_resources, data.get("resources") or {}, local, section, default=_FAILED)
    variables = schema.attempt(_environment, data.get("environment") or {}, platform, section, default=_FAILED)
    schema.attempt(_bind_mounts, data.get("bind_mounts") or [], local)
    storage = schema.attempt(_checkpoint_storage, data.get("checkpoint_storage"), local, default=_FAILED)
    if _FAILED in (code_dir, entry, searcher, space, restarts, user_data, resources, variables, storage):
        return {}, []  # refused at the end of to_v2, every problem together
    v2: Dict[str, Any] = {"searchSpace": space, "trialCodeDirectory": code_dir, "maxTrialRestarts": restarts,
                          "trainingService": section}
    if name is not _FAILED:
        v2["experimentName"] = name
    if data.get("stopWhenFirstTrialsFail") is not None:  # trialkit's, as trainingService: the v2 checks apply
        v2["stopWhenFirstTrialsFail"] = data["stopWhenFirstTrialsFail"]
    operations = schema.attempt(_apply_searcher, v2, searcher, resources, default=[])
    working_dir, v2["checkpointStorage"] = storage
    if working_dir is not None:
        v2["experimentWorkingDirectory"] = working_dir
    settings = {"searcher": searcher, "data": user_data, **({"operations": operations} if operations else {})}
    v2["trialCommand"] = schema.attempt(_command, entry, resources["slots_per_trial"], settings, variables)
    return v2, ([f"{', '.join(noted)}: taken, not used: they describe the experiment in Determined's WebUI or pace "
                 f"the training loop of its Trial APIs, which trialkit does not run (a Core API script paces "
                 f"itself)"] if noted else [])


def _refused_key(key: Any, section: Mapping[str, Any], where: str, taken: Tuple[str, ...],
                 determineds: Tuple[str, ...], unsupported: str) -> UserError:
    """The error for a key of `section` (at `where`) that is none of `taken`: one of Determined's own keys
    (`determineds`) is `unsupported` (remove it); any other is an unknown key with the taken key it is closest
    to (told to remove a misspelt `hyperparameters`, a user deleted them)."""
    if key in determineds:
        return UserError(unsupported, schema.path(where, key), f"remove it; {GUIDE}")
    return schema.unknown_key(key, taken, section, where)


def _default(data: Mapping[str, Any], key: str, default: Any) -> Any:
    return default if data.get(key) is None else data[key]


def _names_grid(section: Any) -> bool:
    return isinstance(section, Mapping) and section.get("name") == "grid"


def _context_dir(context_dir: Optional[str], base: Path) -> str:
    """`det experiment create CONFIG CONTEXT_DIR`'s directory (relative to where the command runs), else the
    config's folder."""
    if context_dir is None:
        return str(base)
    if not context_dir.strip():
        raise UserError("the context directory is an empty path", "CONTEXT_DIR",
                        "give the directory of your code, `.` for this one, or leave it out for the config's")
    return os.path.abspath(context_dir)


# ---------------------------------------------------------------- the keys only noted


def _labels(value: Any, where: str) -> None:
    if not isinstance(value, list):
        raise schema.wrong_value("a list of labels", value, where, "write labels: [a, b]")
    for i, label in enumerate(value):
        schema.as_str(label, f"{where}[{i}]")


def _length(value: Any, where: str) -> None:
    """Determined's length: a number, or `{batches|epochs|records: N}`."""
    if isinstance(value, dict):
        if len(value) != 1 or next(iter(value)) not in LENGTH_UNITS:
            raise UserError(f"{schema.show(value)} is not one length", where,
                            "write {batches: N}, {epochs: N} or {records: N}, or a number")
        value = next(iter(value.values()))
    schema.as_int(value, where, minimum=1)


NOTED_KEYS = {
    "description": schema.as_str,
    "notes": schema.as_str,
    "workspace": schema.as_str,
    "project": schema.as_str,
    "labels": _labels,
    "min_validation_period": _length,
    "min_checkpoint_period": _length,
    "perform_initial_validation": schema.as_bool,
    "scheduling_unit": lambda value, where: schema.as_int(value, where, minimum=1),
    "records_per_epoch": lambda value, where: schema.as_int(value, where, minimum=0),
}


# ---------------------------------------------------------------- entrypoint


def _entrypoint(entrypoint: Any) -> str:
    """The command as one line: a string as written, a list's words quoted."""
    if entrypoint is None:
        raise UserError("entrypoint is missing", "entrypoint", "add entrypoint: python3 train.py")
    if isinstance(entrypoint, list):
        if not entrypoint:  # `env` alone would run, and print the trial's environment, its token with it
            raise UserError("an empty list: there is no command to run", "entrypoint",
                            "list the command's words, e.g. [python3, train.py]")
        return shlex.join(schema.as_str(part, f"entrypoint[{i}]") for i, part in enumerate(entrypoint))
    return schema.as_str(entrypoint, "entrypoint").strip()


def translated(command: Optional[str]) -> bool:
    """Whether a trial command is one a Determined config was translated into (_command)."""
    return (command or "").startswith(f"env {env.DETERMINED}=")


def _entry_code(entry: str, code_dir: str, check_code: bool) -> None:
    """What the entrypoint runs is in the context directory: its legacy trial class, and with `check_code` its
    script (the local platform's check_code, with the config's other problems: the user learns of every mistake
    at once)."""
    if check_code and os.path.isdir(code_dir):  # one that is not is refused as trialCodeDirectory (config.py)
        try:
            platforms.load("local").check_code(code_dir, entry)
        except UserError as err:  # in the keys its user wrote: entrypoint, not trialCommand
            raise schema.renamed(err, V2_WHERE) from None
    _trial_class(entry, code_dir)


def _trial_class(entry: str, code_dir: str) -> None:
    """A legacy `module:Class` entrypoint's module is in the context directory and binds the class at its top level
    (its source read, never imported: the control plane runs no user code): else every trial fails alike, each
    saying that no module or no class has that name."""
    module, _, name = entry.partition(":")
    if not TRIAL_CLASS.match(entry) or "/" in module:
        return
    base = Path(code_dir, *module.split("."))
    source = next((path for path in (base / "__init__.py", base.with_suffix(".py")) if path.is_file()), None)
    if source is None:
        near = difflib.get_close_matches(module, [path.stem for path in Path(code_dir).glob("*.py")], n=1)
        raise UserError(f"{module} is not a module in the context directory {code_dir}", "entrypoint",
                        f"did you mean {near[0]}?" if near else
                        "give the module of your trial class, as `det` takes it")
    names = trial.module_names(str(source))
    if names is not None and name not in names:
        near = difflib.get_close_matches(name, list(names), n=1)
        raise UserError(f"{module} has no class {name} ({source} binds no such name at its top level)", "entrypoint",
                        f"did you mean {near[0]}?" if near else "give the name of your trial class in it")


def _command(entry: str, slots: int, settings: Dict[str, Any], variables: List[str]) -> str:
    """The trial command: `env TRIALKIT_DETERMINED=... [VARS...] ENTRYPOINT`."""
    if TRIAL_CLASS.match(entry):
        # Determined's legacy trial class: horovod when distributed, else the class in one process.
        launcher = "trialkit.launch.horovod --trial" if slots > 1 else "trialkit.launch.run_trial"
        entry = f"python3 -m {launcher} {entry}"
    packed = base64.urlsafe_b64encode(json.dumps(settings, separators=(",", ":")).encode()).decode()
    if len(packed) > MAX_SETTINGS_BYTES:
        raise UserError(f"{len(packed):,} bytes once packed into the trial's command, over the "
                        f"{MAX_SETTINGS_BYTES:,} it may take (the command is one environment variable, of 128 KiB "
                        "at most)", "data",
                        "put large data in a file in the context directory and name the file in data")
    return " ".join(["env", f"{env.DETERMINED}={packed}", *map(shlex.quote, variables), entry])


_JSON_TYPES = (str, int, float, bool, type(None))


def _data(value: Any) -> Dict[str, Any]:
    """`data`, which the trial gets as JSON (det.get_cluster_info().user_data): a mapping of JSON's values."""
    if value is None:
        return {}
    data = schema.mapping(value, "data")
    _json_only(data, "data")
    return dict(data)


def _json_only(value: Any, where: str) -> None:
    """Refuse what JSON cannot carry to the trial: a YAML date, `!!binary` bytes, a set, a key not a string."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, _JSON_TYPES):  # JSON writes a number's (or true's) key as its text
                raise UserError(f"the key {schema.show(key)} is a {type(key).__name__}, which JSON keys cannot be",
                                schema.path(where, key), "write the key as a string: quote it")
            _json_only(item, schema.path(where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _json_only(item, f"{where}[{i}]")
    elif not isinstance(value, _JSON_TYPES):
        raise UserError(f"{schema.show(value)} is a {type(value).__name__}, which the trial cannot get as JSON",
                        where, "write it as a quoted string, a number, a list or a mapping")


# ---------------------------------------------------------------- hyperparameters


def _search_space(hparams: Any, grid: bool) -> Dict[str, Any]:
    """NNI's search space of Determined's hyperparameters. A grid's values are made per hyperparameter once its
    own count is checked (_hparam); their product is counted, never made, and checked after."""
    space = _space(hparams, "hyperparameters", grid)
    if grid:
        points, values, where = _grid_size(hparams, "hyperparameters")
        if points > MAX_GRID_POINTS:
            raise UserError(f"the grid has {points:,} points ({values:,} values of this one), over the "
                            f"{MAX_GRID_POINTS:,} trials trialkit runs of one grid", where, _GRID_FIX)
    return space


_GRID_FIX = "give it a smaller count: Determined's grid runs a trial at every point"


def _space(hparams: Any, where: str, grid: bool) -> Dict[str, Any]:
    """A nested group is a choice of one `_name` option. Each hyperparameter's problem is its own."""
    out: Dict[str, Any] = {}
    for name, spec in schema.mapping(hparams, where).items():
        here = schema.path(where, name)
        if isinstance(spec, dict) and "type" not in spec:
            out[name] = {"_type": "choice", "_value": [{"_name": name, **_space(spec, here, grid)}]}
        else:
            out[name] = schema.attempt(_hparam, spec, here, grid)
    return out


def _grid_size(hparams: Mapping[Any, Any], where: str) -> Tuple[int, int, str]:
    """(points of the grid over `hparams`, values of its largest hyperparameter, where that one is), counted from
    the specs alone: a count of 10**9 is one number here, never a list."""
    points, largest, at = 1, 0, where
    for name, spec in hparams.items():
        here = schema.path(where, name)
        if isinstance(spec, dict) and "type" not in spec:
            size, values, inner = _grid_size(spec, here)
        else:
            size = values = _grid_values(spec)
            inner = here
        points *= size
        if values > largest:
            largest, at = values, inner
    return points, largest, at


def _whole(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _grid_values(spec: Any) -> int:
    """The values a grid takes of one hyperparameter; 1 where the spec is wrong (refused on its own: an empty
    list counted as 0 would make any grid beside it look empty)."""
    if not isinstance(spec, dict):
        return 1
    kind = spec.get("type")
    if kind == "categorical":
        return len(spec["vals"]) or 1 if isinstance(spec.get("vals"), list) else 1
    count = _whole(spec.get("count"))
    count = count if count is not None and count > 0 else None
    if kind == "int":
        low, high = _whole(spec.get("minval")), _whole(spec.get("maxval"))
        span = high - low + 1 if low is not None and high is not None and high >= low else None
        return min(count or span or 1, span or count or 1)
    return count or 1 if kind in ("double", "log") else 1


HPARAM_KEYS = {
    "const": ("type", "val"),
    "categorical": ("type", "vals"),
    "int": ("type", "minval", "maxval", "count"),
    "double": ("type", "minval", "maxval", "count"),
    "log": ("type", "minval", "maxval", "base", "count"),
}


_HPARAM_ALL_KEYS = tuple(sorted({key for keys in HPARAM_KEYS.values() for key in keys}))


def _hparam(spec: Any, where: str, grid: bool) -> Dict[str, Any]:
    if not isinstance(spec, dict):
        return {"_type": "choice", "_value": [spec]}  # a bare value is a const
    kind = schema.as_choice(spec["type"], list(HPARAM_KEYS), schema.path(where, "type"))
    for key in spec:
        if key not in HPARAM_KEYS[kind]:
            schema.report(_refused_key(key, spec, where, HPARAM_KEYS[kind], _HPARAM_ALL_KEYS,
                                       f"{key!r} is not a key of a {kind} hyperparameter"))
    if kind == "const":
        return {"_type": "choice", "_value": [spec.get("val")]}
    if kind == "categorical":
        vals = spec.get("vals")
        if not isinstance(vals, list) or not vals:
            raise UserError("vals must be a non-empty list", schema.path(where, "vals"), "list the values")
        return {"_type": "choice", "_value": vals}
    number = schema.as_int if kind == "int" else schema.as_number
    low, high = (number(spec.get(k), schema.path(where, k)) for k in ("minval", "maxval"))
    if high < low:
        raise UserError(f"maxval {high} is below minval {low}", schema.path(where, "maxval"), "swap them")
    base = schema.as_number(spec.get("base", 10), schema.path(where, "base"), positive=True)
    if kind == "log":  # the ends as numbers, before a grid's points between them
        ends = [_power(base, low, schema.path(where, "minval")), _power(base, high, schema.path(where, "maxval"))]
    if grid:
        values = _grid_values(spec)
        if values > MAX_GRID_POINTS:  # before a list of them is made
            raise UserError(f"{values:,} values of this hyperparameter alone, over the {MAX_GRID_POINTS:,} trials "
                            "trialkit runs of one grid", where, _GRID_FIX)
        if spec.get("count") is None and kind != "int":
            raise UserError(f"a grid needs count for a {kind} hyperparameter", schema.path(where, "count"),
                            "add count: the number of values to try")
        if spec.get("count") is not None:
            count = schema.as_int(spec["count"], schema.path(where, "count"), minimum=1)
            return {"_type": "choice", "_value": _grid_points(kind, low, high, base, count)}
    if kind == "int":
        return {"_type": "randint", "_value": [low, high + 1]}  # Determined's maxval is inclusive
    if kind == "double":
        return {"_type": "uniform", "_value": [low, high]}
    return {"_type": "loguniform", "_value": ends}  # base**u, u uniform: the same law


def _power(base: float, exponent: float, where: str) -> float:
    """base**exponent, which must be a float above 0 (Determined's log range is base**minval..base**maxval)."""
    try:
        value = base ** exponent
    except OverflowError:
        value = math.inf
    if not 0 < value < math.inf:
        beyond = "past a float's range (1.8e308)" if value else "below the smallest float, so 0"
        raise UserError(f"{base:g}**{exponent:g} is {beyond}", where,
                        "give an exponent whose power of base a float holds")
    return value


def _grid_points(kind: str, low: float, high: float, base: float, count: int) -> List[Any]:
    """Determined's grid values (grid.go): count evenly spaced points, both ends in; one is the middle."""
    if kind == "int":
        count = min(count, int(high - low) + 1)
        if count == 1:
            return [int((low + high) // 2)]
        return sorted({int(math.floor(low + i * (high - low) / (count - 1) + 0.5)) for i in range(count)})
    points = [(low + high) / 2] if count == 1 else [low + i * (high - low) / (count - 1) for i in range(count)]
    return [base ** p for p in points] if kind == "log" else points


# ---------------------------------------------------------------- searcher


_SEARCHER_ALL_KEYS = DETERMINED_SEARCHER_KEYS + tuple(sorted({key for keys in SEARCHER_KEYS.values() for key in keys}))


def _searcher(section: Any) -> Dict[str, Any]:
    if section is None:
        raise UserError("searcher is missing", "searcher", "add searcher: {name: single, metric: validation_loss}")
    sec = dict(schema.mapping(section, "searcher"))
    name = schema.as_str(sec.get("name"), "searcher.name")
    if name not in SEARCHERS and name not in DETERMINED_SEARCHERS:
        raise schema.unknown("searcher", name, SEARCHERS, "searcher.name")
    if name not in SEARCHERS:
        raise UserError(f"Determined's {name!r} searcher is not supported by trialkit", "searcher.name",
                        f"use {', '.join(SEARCHERS)}{INSTEAD_OF.get(name, '')}; {GUIDE}")
    for key in sec:
        if key not in SEARCHER_KEYS[name]:
            schema.report(_refused_key(key, sec, "searcher", SEARCHER_KEYS[name], _SEARCHER_ALL_KEYS,
                                       f"{key!r} is not supported for the {name} searcher"))
    if sec.get("metric") is None:
        raise UserError("metric is missing", "searcher.metric", "add metric: the validation metric to search on")
    sec["metric"] = schema.as_str(sec["metric"], "searcher.metric")
    sec["smaller_is_better"] = schema.as_bool(_default(sec, "smaller_is_better", True), "searcher.smaller_is_better")
    if sec.get("max_length") is not None:
        _length(sec["max_length"], "searcher.max_length")
    if name in ("random", "adaptive_asha") and sec.get("max_trials") is None:
        raise UserError("max_trials is missing", "searcher.max_trials", "add max_trials: the number of trials")
    return sec


def _apply_searcher(v2: Dict[str, Any], searcher: Dict[str, Any], resources: Dict[str, Any]) -> List[int]:
    """The tuner, assessor, trial count and concurrency the searcher means; the lengths of the Core API's
    searcher operations when they are not one of the whole length (_operations)."""
    name = searcher["name"]
    operations: List[int] = []
    mode = "minimize" if searcher["smaller_is_better"] else "maximize"
    # Determined's random and adaptive_asha sample with replacement: max_trials trials, however small the space.
    v2["tuner"] = {"name": "GridSearch", "classArgs": {"optimize_mode": mode}} if name == "grid" else \
        {"name": "Random", "classArgs": {"optimize_mode": mode, "deduplicate": False}}
    if name == "single":
        v2["maxTrialNumber"] = 1  # Determined's single is a random search of one trial
    elif searcher.get("max_trials") is not None:
        v2["maxTrialNumber"] = schema.as_int(searcher["max_trials"], "searcher.max_trials", minimum=1)
    concurrency = searcher.get("max_concurrent_trials")
    if concurrency is not None:
        concurrency = schema.as_int(concurrency, "searcher.max_concurrent_trials", minimum=0) or None
    if name == "adaptive_asha":
        v2["assessor"] = {"name": "ASHA", "classArgs": _asha_args(searcher, mode)}
        _, args = check_assessor("ASHA", v2["assessor"]["classArgs"], "searcher")
        if concurrency is None:
            concurrency = min(sum(b.max_concurrent_trials for b in asha_brackets(args)), args["max_trials"])
        operations = _operations(searcher, args)
    elif name == "single":
        concurrency = 1
    concurrency = concurrency or DEFAULT_CONCURRENCY
    if resources.get("max_slots") is not None:
        concurrency = min(concurrency, max(resources["max_slots"] // resources["slots_per_trial"], 1))
    v2["trialConcurrency"] = concurrency
    return operations


def _operations(searcher: Dict[str, Any], args: Dict[str, Any]) -> List[int]:
    """adaptive_asha on max_length is the legacy searcher's form: its operations end at the rungs (each op's
    length the next rung's), and scripts written for it (Determined's Core API tutorial, stage 3) validate only
    when an operation completes; so the operations are every rung's length, lowest first, and each validation
    meets a rung. On time_metric and max_time (Determined 0.38) there is one operation of max_time, and a script
    reports its validations when it likes: [] (the shim's one operation)."""
    if searcher.get("time_metric") is not None:
        return []
    return sorted({units for bracket in asha_brackets(args) for units in bracket.units})


def _asha_args(searcher: Dict[str, Any], mode: str) -> Dict[str, Any]:
    """The ASHA assessor's classArgs: rungs on time_metric up to max_time, or (older configs) on the
    validation's steps_completed up to max_length."""
    if searcher.get("max_time") is not None or searcher.get("time_metric") is not None:
        if searcher.get("max_time") is None or searcher.get("time_metric") is None:
            raise UserError("time_metric and max_time go together", "searcher.max_time",
                            "give both, or max_length alone")
        max_time, time_metric = searcher["max_time"], searcher["time_metric"]
    elif searcher.get("max_length") is not None:
        length = searcher["max_length"]
        max_time, time_metric = (next(iter(length.values())) if isinstance(length, dict) else length), None
    else:
        raise UserError("adaptive_asha needs its length", "searcher.max_time",
                        "add time_metric, and max_time or max_length")
    args = {"optimize_mode": mode, "metric": searcher["metric"], "time_metric": time_metric, "max_time": max_time,
            "max_trials": searcher["max_trials"]}
    for key in ("divisor", "max_rungs", "mode", "bracket_rungs", "max_concurrent_trials"):
        if searcher.get(key) is not None:
            args[key] = searcher[key]
    return args


# ---------------------------------------------------------------- resources, environment, storage


RESOURCE_KEYS = ("slots_per_trial", "max_slots", "priority", "weight", "resource_pool")


def _resources(section: Any, local: bool, training_service: Dict[str, Any]) -> Dict[str, Any]:
    sec = schema.mapping(section, "resources")
    for key in sec:
        if key not in RESOURCE_KEYS:
            schema.report(_refused_key(key, sec, "resources", RESOURCE_KEYS, DETERMINED_RESOURCE_KEYS,
                                       f"Determined's resources.{key} is not supported by trialkit"))
    out = {"slots_per_trial": schema.as_int(_default(sec, "slots_per_trial", 1), "resources.slots_per_trial",
                                            minimum=1)}
    if sec.get("max_slots") is not None:
        out["max_slots"] = schema.as_int(sec["max_slots"], "resources.max_slots", minimum=1)
    # Determined's job priority and fair share weight order experiments: here the experiment's job in its
    # local resource pool (its trials share one priority, so a copy as the trials' own would order nothing).
    for key, option, check in (("priority", "poolPriority", lambda value, where: schema.as_int(value, where, 1, 99)),
                               ("weight", "poolWeight", lambda value, where: schema.as_number(value, where,
                                                                                               positive=True))):
        if sec.get(key) is not None:
            if not local:
                raise UserError(f"resources.{key} orders experiments in a local resource pool only",
                                f"resources.{key}", "remove it: trials run where trainingService says")
            training_service[option] = check(sec[key], f"resources.{key}")
    if sec.get("resource_pool") is not None:
        if not local:
            raise UserError("resources.resource_pool names a pool of the local platform only",
                            "resources.resource_pool", "remove it: trials run where trainingService says")
        training_service["resourcePool"] = schema.as_str(sec["resource_pool"], "resources.resource_pool")
    if sec.get("slots_per_trial") is not None:
        if not local:
            raise UserError("resources.slots_per_trial is applied on the local platform only",
                            "resources.slots_per_trial", "give each role its workers under trainingService")
        training_service["slotsPerTrial"] = out["slots_per_trial"]
    return out


ENVIRONMENT_KEYS = ("image", "environment_variables")


def _environment(section: Any, platform: str, training_service: Dict[str, Any]) -> List[str]:
    """The environment's variables as `NAME=VALUE` words; its image goes to a Kubernetes platform's section."""
    sec = schema.mapping(section, "environment")
    for key in sec:
        if key not in ENVIRONMENT_KEYS:
            why = "; a pod spec goes in trialTemplate" if key == "pod_spec" else ""
            schema.report(_refused_key(key, sec, "environment", ENVIRONMENT_KEYS, DETERMINED_ENVIRONMENT_KEYS,
                                       f"Determined's environment.{key} is not supported by trialkit{why}"))
    if sec.get("image") is not None:
        image = schema.as_str(sec["image"], "environment.image")  # a {cpu, cuda} mapping is refused here
        if not hasattr(platforms.load(platform), "render"):
            raise UserError(f"environment.image is not used on the {platform} platform", "environment.image",
                            "remove it, or run on kubeflow, frameworkcontroller or adaptdl")
        training_service.setdefault("dockerImage", image)
    variables = sec.get("environment_variables") or []
    if not isinstance(variables, list):
        raise UserError("environment_variables per device type is not supported", "environment.environment_variables",
                        "give one list of NAME=VALUE")
    for i, item in enumerate(variables):
        if not isinstance(item, str) or not re.match(r"^[A-Za-z_]\w*=", item):
            raise UserError(f"{schema.show(item)} is not NAME=VALUE", f"environment.environment_variables[{i}]",
                            "write NAME=VALUE")
    return variables


BIND_MOUNT_KEYS = ("host_path", "container_path", "read_only")


def _bind_mounts(mounts: Any, local: bool) -> None:
    """A local trial sees this machine's files: a mount of a path at the same path is what it has already;
    anything else would need a container."""
    if not isinstance(mounts, list):
        raise UserError("bind_mounts must be a list", "bind_mounts", "list {host_path, container_path} mappings")
    for i, mount in enumerate(mounts):
        where = f"bind_mounts[{i}]"
        sec = schema.mapping(mount, where)
        for key in sec:
            if key not in BIND_MOUNT_KEYS:
                schema.report(_refused_key(key, sec, where, BIND_MOUNT_KEYS, ("propagation",),
                                           f"{key!r} is not supported in a bind mount"))
        if not local:
            raise UserError("bind_mounts are applied on the local platform only", where,
                            "mount volumes through trainingService's nfs or trialTemplate")
        host = schema.as_str(sec.get("host_path"), f"{where}.host_path")
        if schema.as_str(sec.get("container_path"), f"{where}.container_path") != host or not os.path.isabs(host):
            raise UserError("a local trial sees host paths as they are", f"{where}.container_path",
                            f"set container_path to host_path, {host}, an absolute path")
        if not os.path.exists(host):
            raise UserError(f"{host} does not exist", f"{where}.host_path", "point it at an existing path")
        if schema.as_bool(sec.get("read_only", False), f"{where}.read_only"):
            raise UserError("read_only cannot be enforced on the local platform", f"{where}.read_only",
                            "remove it: the trial runs as you, with your permissions")


STORAGE_KEYS = {  # Determined's keys of each storage type -> trialkit's checkpointStorage key (None: refused)
    "shared_fs": {"host_path": None, "storage_path": None, "propagation": None},
    "s3": {"bucket": "bucket", "prefix": "prefix", "endpoint_url": "endpointUrl", "region": "region",
           "secret_name": "secretName"},
    "gcs": {"bucket": "bucket", "prefix": "prefix", "secret_name": "secretName"},
    "azure": {"container": "container", "account_url": "accountUrl", "secret_name": "secretName"},
}
SAVE_KEYS = {"save_experiment_best": "saveExperimentBest", "save_trial_best": "saveTrialBest",
             "save_trial_latest": "saveTrialLatest"}
# Credentials written into the config: trialkit keeps configs (`experiment show` prints them), so refused.
CREDENTIAL_KEYS = {
    "access_key": "AWS_ACCESS_KEY_ID", "secret_key": "AWS_SECRET_ACCESS_KEY",
    "connection_string": "AZURE_STORAGE_CONNECTION_STRING", "credential": "AZURE_STORAGE_ACCOUNT_KEY",
}


def _checkpoint_storage(section: Any, local: bool) -> Tuple[Optional[str], Dict[str, Any]]:
    """(the experiment's dir for shared_fs, else None; trialkit's checkpointStorage). shared_fs: the
    experiment (its trials' checkpoint dirs among it) is made under host_path/storage_path; s3, gcs, azure:
    each checkpoint uploaded there. The save keys default as Determined's (0, 1, 1) even without a section."""
    if section is None:
        return None, {"type": "local"}
    sec = schema.mapping(section, "checkpoint_storage")
    if sec.get("type") in DETERMINED_STORAGE_TYPES:
        raise UserError(f"Determined's {sec['type']!r} checkpoint storage is not supported by trialkit",
                        "checkpoint_storage.type", f"use shared_fs with host_path on the local platform, or s3, gcs "
                        f"or azure; {GUIDE}")
    kind = schema.as_choice(sec.get("type"), list(STORAGE_KEYS), "checkpoint_storage.type")
    out: Dict[str, Any] = {"type": "local" if kind == "shared_fs" else kind}
    for key, value in sec.items():
        where = schema.path("checkpoint_storage", key)
        if key == "type" or value is None:
            continue
        if key in SAVE_KEYS:
            out[SAVE_KEYS[key]] = schema.attempt(schema.as_int, value, where, 0)
        elif key in CREDENTIAL_KEYS:
            schema.report(UserError(f"a credential in the config would be kept with the experiment (and shown by "
                                    f"`trialkit experiment show`)", where,
                                    f"remove it; set {CREDENTIAL_KEYS[key]} in the environment trialkit runs in, or "
                                    f"name a Kubernetes Secret with secret_name; {GUIDE}"))
        elif key not in STORAGE_KEYS[kind]:
            schema.report(UserError(f"checkpoint_storage.{key} is not a key of {kind} storage", where,
                                    f"use {', '.join(list(STORAGE_KEYS[kind]) + list(SAVE_KEYS))}; {GUIDE}"))
        elif STORAGE_KEYS[kind][key] is not None:
            out[STORAGE_KEYS[kind][key]] = value
    if kind != "shared_fs":
        return None, out
    if sec.get("propagation") is not None:
        schema.as_str(sec["propagation"], "checkpoint_storage.propagation")  # a container's mount option: noted
    if not local:
        raise UserError("shared_fs checkpoint storage is applied on the local platform only", "checkpoint_storage",
                        "on a cluster, use type: s3, gcs or azure, or mount shared storage with trainingService's "
                        "nfs")
    host = schema.as_str(sec.get("host_path"), "checkpoint_storage.host_path")
    if not os.path.isabs(host):
        raise UserError(f"host_path {host!r} is not absolute", "checkpoint_storage.host_path", "give an absolute path")
    storage = sec.get("storage_path")
    where = os.path.join(host, schema.as_str(storage, "checkpoint_storage.storage_path")) if storage else host
    return where, out
