"""A Determined experiment config (0.38) as trialkit's own (NNI v2 keys), as `det experiment create CONFIG
CONTEXT_DIR` would run it.

    if is_determined(data): v2 = to_v2(data, base_dir, context_dir)    # then config.py parses v2

Each Determined field becomes trialkit settings, or is refused by name with
a UserError (one line, exit 2); nothing is read and dropped.
docs/migration/determined.md is the table. What the Core API serves the
trial from the config (the searcher's metric and lengths, `data`) travels in
env.DETERMINED, set by an `env` in front of the entrypoint: a command line
that stays a plain command (no shell between the keeper and the training).
"""
from __future__ import annotations

import base64
import json
import math
import os
import re
import shlex
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from trialkit import env, platforms, schema
from trialkit.control.assessors import asha_brackets, check_assessor
from trialkit.errors import UserError

GUIDE = "see docs/migration/determined.md"
TOP_KEYS = ("name", "description", "entrypoint", "hyperparameters", "searcher", "resources", "max_restarts", "environment",
            "bind_mounts", "checkpoint_storage", "data", "trainingService")
SEARCHERS = ("single", "random", "grid", "adaptive_asha")
SEARCHER_KEYS = {
    "single": ("name", "metric", "smaller_is_better", "max_length"),
    "random": ("name", "metric", "smaller_is_better", "max_length", "max_trials", "max_concurrent_trials"),
    "grid": ("name", "metric", "smaller_is_better", "max_length", "max_concurrent_trials"),
    "adaptive_asha": ("name", "metric", "smaller_is_better", "max_length", "max_trials", "max_concurrent_trials",
                      "time_metric", "max_time", "max_rungs", "divisor", "mode", "bracket_rungs"),
}
LENGTH_UNITS = ("batches", "epochs", "records")
DEFAULT_CONCURRENCY = 16  # Determined's max_concurrent_trials for random and grid
DEFAULT_MAX_RESTARTS = 5  # Determined's
TRIAL_CLASS = re.compile(r"^[\w./-]+:[A-Za-z_]\w*$")  # the legacy `model_def:MyTrial` entrypoint


def is_determined(data: Mapping[str, Any]) -> bool:
    """A Determined config names its entrypoint or its searcher; an NNI config has neither key."""
    return "entrypoint" in data or "searcher" in data


def to_v2(data: Mapping[str, Any], base: Path, context_dir: Optional[str]) -> Dict[str, Any]:
    """trialkit's v2 config dict of a Determined config; relative paths are read from `base`."""
    for key in data:
        if key not in TOP_KEYS:
            raise UserError(f"Determined's {key!r} is not supported by trialkit", str(key), f"remove it; {GUIDE}")
    if data.get("entrypoint") is None:
        raise UserError("entrypoint is missing", "entrypoint", "add entrypoint: python3 train.py")
    section = dict(schema.mapping(data.get("trainingService") or {"platform": "local"}, "trainingService"))
    platform = platforms.canonical_name(section.get("platform"), "trainingService.platform")
    local = platform == "local"
    searcher = _searcher(data.get("searcher"))
    resources = _resources(data.get("resources") or {}, local, section)
    v2: Dict[str, Any] = {
        "searchSpace": _space(data.get("hyperparameters") or {}, "hyperparameters", searcher["name"] == "grid"),
        "trialCodeDirectory": context_dir if context_dir is not None else str(base),
        "maxTrialRestarts": schema.as_int(_default(data, "max_restarts", DEFAULT_MAX_RESTARTS), "max_restarts",
                                          0, 1000),
        "trainingService": section,
    }
    if data.get("name") is not None:
        v2["experimentName"] = schema.as_str(data["name"], "name")
    if data.get("description") is not None:
        schema.as_str(data["description"], "description")  # a note for people, read and dropped as NNI's is
    _apply_searcher(v2, searcher, resources)
    variables = _environment(data.get("environment") or {}, platform, section)
    _bind_mounts(data.get("bind_mounts") or [], local)
    storage = _checkpoint_storage(data.get("checkpoint_storage"), local)
    if storage is not None:
        v2["experimentWorkingDirectory"] = storage
    settings = {"searcher": searcher, "data": data.get("data") or {}}
    v2["trialCommand"] = _command(data["entrypoint"], resources["slots_per_trial"], settings, variables)
    return v2


def _default(data: Mapping[str, Any], key: str, default: Any) -> Any:
    return default if data.get(key) is None else data[key]


# ---------------------------------------------------------------- entrypoint


def _command(entrypoint: Any, slots: int, settings: Dict[str, Any], variables: List[str]) -> str:
    """The trial command: `env TRIALKIT_DETERMINED=... [VARS...] ENTRYPOINT`."""
    if isinstance(entrypoint, list):
        entry = shlex.join(schema.as_str(part, f"entrypoint[{i}]") for i, part in enumerate(entrypoint))
    else:
        entry = schema.as_str(entrypoint, "entrypoint").strip()
    if TRIAL_CLASS.match(entry):
        # Determined's legacy trial class: horovod when distributed, else the class in one process.
        launcher = "trialkit.launch.horovod --trial" if slots > 1 else "trialkit.launch.run_trial"
        entry = f"python3 -m {launcher} {entry}"
    packed = base64.urlsafe_b64encode(json.dumps(settings, separators=(",", ":")).encode()).decode()
    return " ".join(["env", f"{env.DETERMINED}={packed}", *map(shlex.quote, variables), entry])


# ---------------------------------------------------------------- hyperparameters


def _space(hparams: Any, where: str, grid: bool) -> Dict[str, Any]:
    """NNI's search space of Determined's hyperparameters; a nested group is a choice of one `_name` option."""
    out: Dict[str, Any] = {}
    for name, spec in schema.mapping(hparams, where).items():
        here = schema.path(where, name)
        if isinstance(spec, dict) and "type" not in spec:
            out[name] = {"_type": "choice", "_value": [{"_name": name, **_space(spec, here, grid)}]}
        else:
            out[name] = _hparam(spec, here, grid)
    return out


HPARAM_KEYS = {
    "const": ("type", "val"),
    "categorical": ("type", "vals"),
    "int": ("type", "minval", "maxval", "count"),
    "double": ("type", "minval", "maxval", "count"),
    "log": ("type", "minval", "maxval", "base", "count"),
}


def _hparam(spec: Any, where: str, grid: bool) -> Dict[str, Any]:
    if not isinstance(spec, dict):
        return {"_type": "choice", "_value": [spec]}  # a bare value is a const
    kind = schema.as_choice(spec["type"], list(HPARAM_KEYS), schema.path(where, "type"))
    for key in spec:
        if key not in HPARAM_KEYS[kind]:
            raise UserError(f"{key!r} is not a key of a {kind} hyperparameter", schema.path(where, key),
                            f"use {', '.join(HPARAM_KEYS[kind][1:])}")
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
    if grid:
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
    return {"_type": "loguniform", "_value": [base ** low, base ** high]}  # base**u, u uniform: the same law


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


def _searcher(section: Any) -> Dict[str, Any]:
    if section is None:
        raise UserError("searcher is missing", "searcher", "add searcher: {name: single, metric: validation_loss}")
    sec = dict(schema.mapping(section, "searcher"))
    name = schema.as_str(sec.get("name"), "searcher.name")
    if name not in SEARCHERS:
        raise UserError(f"Determined's {name!r} searcher is not supported by trialkit", "searcher.name",
                        f"use {', '.join(SEARCHERS)}; {GUIDE}")
    for key in sec:
        if key not in SEARCHER_KEYS[name]:
            raise UserError(f"{key!r} is not supported for the {name} searcher", f"searcher.{key}",
                            f"remove it; {GUIDE}")
    if sec.get("metric") is None:
        raise UserError("metric is missing", "searcher.metric", "add metric: the validation metric to search on")
    sec["metric"] = schema.as_str(sec["metric"], "searcher.metric")
    sec["smaller_is_better"] = schema.as_bool(_default(sec, "smaller_is_better", True), "searcher.smaller_is_better")
    length = sec.get("max_length")
    if isinstance(length, dict):
        if len(length) != 1 or next(iter(length)) not in LENGTH_UNITS:
            raise UserError(f"max_length {schema.show(length)} is not one length", "searcher.max_length",
                            "write max_length: {batches: N} (or epochs, records), or a number")
        schema.as_int(next(iter(length.values())), "searcher.max_length", minimum=1)
    elif length is not None:
        schema.as_int(length, "searcher.max_length", minimum=1)
    if name in ("random", "adaptive_asha") and sec.get("max_trials") is None:
        raise UserError("max_trials is missing", "searcher.max_trials", "add max_trials: the number of trials")
    return sec


def _apply_searcher(v2: Dict[str, Any], searcher: Dict[str, Any], resources: Dict[str, Any]) -> None:
    name = searcher["name"]
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
        if concurrency is None:
            _, args = check_assessor("ASHA", v2["assessor"]["classArgs"], "searcher")
            concurrency = min(sum(b.max_concurrent_trials for b in asha_brackets(args)), args["max_trials"])
    elif name == "single":
        concurrency = 1
    concurrency = concurrency or DEFAULT_CONCURRENCY
    if resources.get("max_slots") is not None:
        concurrency = min(concurrency, max(resources["max_slots"] // resources["slots_per_trial"], 1))
    v2["trialConcurrency"] = concurrency


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
                        "add time_metric and max_time (or max_length)")
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
            raise UserError(f"Determined's resources.{key} is not supported by trialkit", f"resources.{key}",
                            f"remove it; {GUIDE}")
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
            raise UserError(f"Determined's environment.{key} is not supported by trialkit{why}",
                            f"environment.{key}", f"remove it; {GUIDE}")
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


def _bind_mounts(mounts: Any, local: bool) -> None:
    """A local trial sees this machine's files: a mount of a path at the same path is what it has already;
    anything else would need a container."""
    if not isinstance(mounts, list):
        raise UserError("bind_mounts must be a list", "bind_mounts", "list {host_path, container_path} mappings")
    for i, mount in enumerate(mounts):
        where = f"bind_mounts[{i}]"
        sec = schema.mapping(mount, where)
        for key in sec:
            if key not in ("host_path", "container_path", "read_only"):
                raise UserError(f"{key!r} is not supported in a bind mount", f"{where}.{key}", f"remove it; {GUIDE}")
        if not local:
            raise UserError("bind_mounts are applied on the local platform only", where,
                            "mount volumes through trainingService (nfs) or trialTemplate")
        host = schema.as_str(sec.get("host_path"), f"{where}.host_path")
        if schema.as_str(sec.get("container_path"), f"{where}.container_path") != host or not os.path.isabs(host):
            raise UserError("a local trial sees host paths as they are", f"{where}.container_path",
                            f"set container_path to host_path ({host}), an absolute path")
        if not os.path.exists(host):
            raise UserError(f"{host} does not exist", f"{where}.host_path", "point it at an existing path")
        if schema.as_bool(sec.get("read_only", False), f"{where}.read_only"):
            raise UserError("read_only cannot be enforced on the local platform", f"{where}.read_only",
                            "remove it (the trial runs as you, with your permissions)")


def _checkpoint_storage(section: Any, local: bool) -> Optional[str]:
    """shared_fs: the experiment (its trials' checkpoint dirs among it) is made under host_path/storage_path."""
    if section is None:
        return None
    sec = schema.mapping(section, "checkpoint_storage")
    kind = sec.get("type")
    if kind != "shared_fs":
        raise UserError(f"checkpoint_storage type {schema.show(kind)} is not supported", "checkpoint_storage.type",
                        "use type: shared_fs (or leave checkpoint_storage out: the trial's own dir)")
    for key in sec:
        if key not in ("type", "host_path", "storage_path"):
            raise UserError(f"checkpoint_storage.{key} is not supported by trialkit", f"checkpoint_storage.{key}",
                            f"remove it: trialkit keeps every checkpoint; {GUIDE}")
    if not local:
        raise UserError("shared_fs checkpoint storage is applied on the local platform only", "checkpoint_storage",
                        "on a cluster, mount shared storage with trainingService's nfs")
    host = schema.as_str(sec.get("host_path"), "checkpoint_storage.host_path")
    if not os.path.isabs(host):
        raise UserError(f"host_path {host!r} is not absolute", "checkpoint_storage.host_path", "give an absolute path")
    storage = sec.get("storage_path")
    return os.path.join(host, schema.as_str(storage, "checkpoint_storage.storage_path")) if storage else host
