"""The experiment config: NNI's YAML (v2, and v1 converted to v2) into one typed object.

    config = load_config("experiment.yml")      # or parse_config(dict, base_dir)
    config.to_dict()                            # v2, camelCase; parse_config() of it gives config back

Keys are matched as NNI matches them (camelCase, snake_case, any case). Paths
in the config (searchSpaceFile, trialCodeDirectory, trialTemplate,
experimentWorkingDirectory) are relative to the config file's directory, and
are stored absolute. Every mistake is a UserError naming the key, the bad
value and the fix.
"""
from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from trialkit import platforms
from trialkit import schema
from trialkit.control.assessors import ASSESSORS, check_assessor
from trialkit.control.checkpoints import CheckpointStorage, parse_storage
from trialkit.control import determined
from trialkit.control.searchspace import SearchSpace, parse_space
from trialkit.control.tuners import ALIASES, TUNERS, check_tuner
from trialkit.env import DEFAULT_GRACE_SECONDS, check_grace
from trialkit.errors import UserError
from trialkit.platforms.pools import DEFAULT_PRIORITY

LOG_LEVELS = ("fatal", "error", "warning", "info", "debug", "trace")

TRIALKIT_KEYS = (
    "trialGraceSeconds", "trialCheckpointEvery", "experimentWorkingDirectory", "trialTemplate", "priority",
    "maxTrialRestarts", "managerTls", "stopWhenFirstTrialsFail", "checkpointStorage",
)
V2_KEYS = (
    "experimentName", "experimentType", "searchSpace", "searchSpaceFile", "trialCommand", "trialCodeDirectory",
    "trialConcurrency", "trialGpuNumber", "maxExperimentDuration", "maxTrialNumber", "maxTrialDuration",
    "nniManagerIp", "useAnnotation", "debug", "logLevel", "tuner", "assessor", "advisor", "trainingService",
) + TRIALKIT_KEYS
# NNI keys trialkit refuses, each with the reason the error gives.
UNSUPPORTED = {
    "sharedStorage": "shared storage is not supported; mount it in the trial through trialTemplate instead",
    "tunerGpuIndices": "tuners run on the CPU in trialkit; remove it",
}

# authorName and description are read and dropped (notes for people, not
# settings); versionCheck and logCollection too (NNI's manager-to-trial
# plumbing, which trialkit's keeper replaces); multiThread must be false.
V1_KEYS = (
    "authorName", "experimentName", "description", "trialConcurrency", "maxExecDuration", "maxTrialNum",
    "trainingServicePlatform", "searchSpacePath", "useAnnotation", "multiPhase", "multiThread", "nniManagerIp",
    "logDir", "debug", "versionCheck", "logLevel", "logCollection", "tuner", "assessor", "advisor", "trial",
)
# v1 sections that belong to one platform; that platform's from_v1() reads them.
V1_PLATFORM_SECTIONS = {
    "localConfig": "local",
    "kubeflowConfig": "kubeflow",
    "frameworkcontrollerConfig": "frameworkcontroller",
}
# v1 key -> v2 key, for the keys that only changed name (also used to name
# the v1 key in errors found after conversion).
V1_RENAMES = {
    "experimentName": "experimentName",
    "trialConcurrency": "trialConcurrency",
    "maxExecDuration": "maxExperimentDuration",
    "maxTrialNum": "maxTrialNumber",
    "searchSpacePath": "searchSpaceFile",
    "nniManagerIp": "nniManagerIp",
    "logDir": "experimentWorkingDirectory",
    "debug": "debug",
    "logLevel": "logLevel",
    "trial.command": "trialCommand",
    "trial.codeDir": "trialCodeDirectory",
    "trial.gpuNum": "trialGpuNumber",
}


@dataclass(frozen=True)
class AlgorithmConfig:
    name: str  # canonical: "TPE", "Medianstop", ...
    class_args: Dict[str, Any]

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "classArgs": copy.deepcopy(self.class_args)}


@dataclass(frozen=True)
class ExperimentConfig:
    search_space: SearchSpace
    trial_command: Optional[str]
    trial_code_directory: str  # absolute
    trial_concurrency: int
    tuner: AlgorithmConfig  # class_args always hold optimize_mode
    training_service: Any  # the platform's own config object
    # The section as written (platform canonical): what to_dict() shows. Not
    # compared: two spellings of one section make equal configs.
    training_service_section: Dict[str, Any] = field(compare=False)
    experiment_name: Optional[str] = None
    assessor: Optional[AlgorithmConfig] = None
    trial_gpu_number: Optional[int] = None
    max_trial_number: Optional[int] = None
    max_experiment_duration: Optional[float] = None  # seconds
    max_trial_duration: Optional[float] = None  # seconds
    nni_manager_ip: Optional[str] = None
    experiment_working_directory: Optional[str] = None  # None: the store's default (TRIALKIT_HOME)
    trial_grace_seconds: float = DEFAULT_GRACE_SECONDS
    trial_checkpoint_every: Optional[float] = None  # None: the keeper's default (TRIALKIT_CHECKPOINT_EVERY)
    max_trial_restarts: int = 0  # restarts of a trial that failed for a cause not its own (a node lost, ...)
    # The experiment stops when its first N trials all failed the same way (a missing module, a typo
    # in the command: the rest would too); 0 runs every trial, as NNI does.
    stop_when_first_trials_fail: int = 3
    trial_template: Optional[str] = None  # absolute
    priority: int = DEFAULT_PRIORITY  # the trials' in the job queue: smaller first, as the pool's jobs
    manager_tls: Optional[Dict[str, str]] = None  # {"certFile", "keyFile"}, absolute: the manager serves HTTPS
    # Where the trials' checkpoints are kept and which (control/checkpoints.py); None: each trial's own
    # checkpoint dir, every checkpoint kept.
    checkpoint_storage: Optional[CheckpointStorage] = None
    # One line each on options NNI accepts and trialkit reads but does not act on (NNI's manager's
    # log level, reuseMode): said when the experiment starts, never refused. Not config: not in to_dict.
    notes: Tuple[str, ...] = field(default=(), compare=False)
    # An NNI v1 config as written (keys as V1_KEYS spell them): what a refusal found after parsing names (as_written).
    # Not config: not in to_dict (the store keeps the v2 form).
    v1: Optional[Dict[str, Any]] = field(default=None, compare=False)
    # The file it was read from (load_config): what a refusal found after parsing names the line of (as_written).
    source: Optional[str] = field(default=None, compare=False)

    @property
    def platform(self) -> str:
        return self.training_service_section["platform"]

    @property
    def optimize_mode(self) -> str:
        return self.tuner.class_args["optimize_mode"]

    def as_written(self, err: UserError) -> UserError:
        """`err` naming the key as the config wrote it (a v1 config's, its v2 name added to the fix), at its line
        in the file the config was read from."""
        if self.v1 is not None:
            written = _in_v1(err, self.v1)
            err = err if written.where == err.where else written
        return err if self.source is None else schema.placed(err, Path(self.source), lacking=False)

    def to_dict(self) -> Dict[str, Any]:
        """v2 config, camelCase, JSON-ready; parse_config() of it equals this config."""
        out: Dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None or item.name in ("training_service", "notes", "v1", "source"):
                continue
            if item.name == "training_service_section":
                out["trainingService"] = copy.deepcopy(value)
            elif isinstance(value, (SearchSpace, AlgorithmConfig, CheckpointStorage)):
                out[schema.camel(item.name)] = value.to_dict()
            else:
                out[schema.camel(item.name)] = value
        return out


# ---------------------------------------------------------------- loading


def load_config(path: Union[str, Path], context_dir: Optional[str] = None,
                check_code: bool = False) -> ExperimentConfig:
    """Read a YAML (or JSON) config file; `context_dir`: a Determined config's context directory; `check_code`:
    parse_config's. A refusal names the file and the line of the key (`bad.yml:7: trialConcurrency: ...`)."""
    path = Path(path)
    data = schema.read_data_file(path, str(path))
    if data is None:  # YAML of nothing, or of comments alone
        raise UserError("the config file is empty", str(path), "write at least trialCommand, searchSpace or "
                        "searchSpaceFile, and tuner, as examples/quickstart/config.yml does")
    try:
        config = parse_config(data, base_dir=path.parent, source=str(path), context_dir=context_dir,
                              check_code=check_code)
    except UserError as err:
        raise schema.placed(err, path) from None
    return replace(config, source=str(path))


def parse_config(data: Any, base_dir: Union[str, Path] = ".", source: str = "config",
                 context_dir: Optional[str] = None, check_code: bool = False) -> ExperimentConfig:
    """A config from its dict (v1, v2, or Determined's); relative paths resolve against `base_dir`.
    `check_code`: the code dir is checked with the other keys (its platform's check_code: the command's script
    is there), so that one refusal lists every mistake (`trialkit run`; a stored config's code dir may have
    changed since it ran, and the run checks it again as it starts)."""
    if not isinstance(data, Mapping):
        raise UserError(f"the config must be a mapping of keys to values, got {schema.show(data)}", source,
                        "start from an example config")
    schema.check_shape(data, source)
    if data and all(isinstance(v, Mapping) and "_type" in v for v in data.values()):
        raise UserError("this is a search space, not an experiment's config", source,
                        "name it in a config's searchSpaceFile, as examples/quickstart/config.yml does")
    base = Path(base_dir).expanduser().absolute()
    if determined.is_determined(data):
        v2, notes = determined.to_v2(data, base, context_dir, check_code)
        try:
            with schema.every_problem():
                config = _parse_v2(v2, base, False)
        except UserError as err:
            raise schema.renamed(err, determined.V2_WHERE) from None
        return replace(config, notes=config.notes + tuple(notes))
    if context_dir is not None:
        raise UserError("a context directory goes with a Determined config", "CONTEXT_DIR",
                        "set trialCodeDirectory in an NNI config instead")
    # Every v1 config names its platform at the top (v1 required it); a stray v1
    # key in a v2 config is then a typo with a did-you-mean, not a format switch.
    if any(isinstance(k, str) and schema.fold(k) == "trainingserviceplatform" for k in data):
        return _parse_v1(data, base, check_code)
    with schema.every_problem():  # a refusal lists every problem it found
        return _parse_v2(data, base, check_code)


# ---------------------------------------------------------------- v2


def _parse_v2(data: Mapping, base: Path, check_code: bool) -> ExperimentConfig:
    """Each part is checked though another failed (schema.attempt: every_problem lists them all); a part built
    from others is checked once they are sound; `check_code` (parse_config's): the code dir too."""
    check = schema.attempt
    for key in data:
        if isinstance(key, str) and schema.fold(key) in _UNSUPPORTED_FOLDS:
            schema.report(UserError(f"NNI's {key!r} is not supported", schema.path("", key),
                                    _UNSUPPORTED_FOLDS[schema.fold(key)]))
    c = schema.normalize_keys(data, V2_KEYS, "", hint="platform options go under trainingService; the top level can ")
    check(_only_false, c, "useAnnotation", "useAnnotation", "annotations are not supported; use a searchSpace")
    if c.get("experimentType") is not None:
        check(schema.as_choice, c["experimentType"], ("hpo",), "experimentType")

    space = check(_search_space, c, base, default=_FAILED)
    tuner = check(_tuner, c, None if space is _FAILED else space, default=_FAILED)
    assessor = check(_assessor, c.get("assessor"), None if tuner is _FAILED else tuner, default=_FAILED)
    service, ignored = check(_nni_section, c, default=(_FAILED, []))  # before the keys it lifts to the top are read
    template = check(_optional, c, "trialTemplate", lambda v, w: _file(v, base, w), default=_FAILED)
    manager_ip = check(_optional, c, "nniManagerIp", schema.as_str, default=_FAILED)
    code_dir = check(lambda: _directory(_optional(c, "trialCodeDirectory", schema.as_str, "."), base,
                                        "trialCodeDirectory"), default=_FAILED)
    gpus = check(_optional, c, "trialGpuNumber", lambda v, w: schema.as_int(v, w, minimum=0), default=_FAILED)
    priority = check(_optional, c, "priority", schema.as_int, default=_FAILED)
    command = check(_optional, c, "trialCommand", _trial_command, default=_FAILED)
    plain = {name: check(_optional, c, key, value_check, default, default=_FAILED)
             for name, key, value_check, default in _plain_keys(base)}
    inputs = (service, template, manager_ip, code_dir, gpus, priority, command)
    platform = _FAILED if _FAILED in inputs else check(_platform, c, base, *inputs, default=_FAILED)
    if check_code and platform is not _FAILED:
        check(_code, platform[0]["platform"], code_dir, command)
    handover_notes = [] if _FAILED in (tuner, platform, plain["checkpoint_storage"]) else check(
        checkpoint_handover, tuner, platform[0]["platform"], platform[1], plain["checkpoint_storage"], default=[])
    schema.raise_reported()
    section, platform_config, priority, notes = platform
    return ExperimentConfig(
        search_space=space,
        trial_command=command,
        trial_code_directory=code_dir,
        tuner=tuner,
        training_service=platform_config,
        training_service_section=section,
        assessor=assessor,
        trial_gpu_number=gpus,
        nni_manager_ip=manager_ip,
        trial_template=template,
        priority=DEFAULT_PRIORITY if priority is None else priority,
        notes=tuple(notes + ignored + handover_notes),
        **plain,
    )


_FAILED = object()  # a part whose problem is reported: nothing is built from it


def _plain_keys(base: Path) -> Tuple[Tuple[str, str, Callable[[Any, str], Any], Any], ...]:
    """(field, key, check, default) of the keys that stand alone: each checked by itself."""
    return (
        ("trial_concurrency", "trialConcurrency", _positive_int, 1),
        ("experiment_name", "experimentName", schema.as_str, None),
        ("max_trial_number", "maxTrialNumber", _positive_int, None),
        ("max_experiment_duration", "maxExperimentDuration", schema.as_duration, None),
        ("max_trial_duration", "maxTrialDuration", schema.as_duration, None),
        ("experiment_working_directory", "experimentWorkingDirectory", lambda v, w: _working_directory(v, base, w),
         None),
        ("trial_grace_seconds", "trialGraceSeconds", lambda v, w: check_grace(schema.as_number(v, w, minimum=0), w),
         DEFAULT_GRACE_SECONDS),
        ("trial_checkpoint_every", "trialCheckpointEvery", lambda v, w: schema.as_number(v, w, minimum=0), None),
        ("max_trial_restarts", "maxTrialRestarts", lambda v, w: schema.as_int(v, w, 0, 1000), 0),
        ("stop_when_first_trials_fail", "stopWhenFirstTrialsFail", lambda v, w: schema.as_int(v, w, 0, 1_000_000), 3),
        ("manager_tls", "managerTls", lambda v, w: manager_tls(v, base, w), None),
        ("checkpoint_storage", "checkpointStorage", parse_storage, None),
    )


def _code(platform: str, code_dir: str, command: str) -> None:
    """The code dir as its platform takes it to each trial (its check_code, where it copies the dir: the local
    platform's), checked with the config's other keys."""
    check = getattr(platforms.load(platform), "check_code", None)
    if check is not None:
        check(code_dir, command)


def _platform(c: Mapping[str, Any], base: Path, service: Any, template: Optional[str], manager_ip: Optional[str],
              code_dir: str, gpus: Optional[int], priority: Optional[int],
              command: Optional[str]) -> Tuple[Dict[str, Any], Any, Optional[int], List[str]]:
    """(the section as written, the platform's config object with the top-level keys it applies, the
    experiment's priority, notes on keys taken without use)."""
    section, platform_config, module = _training_service(
        service, base, {"managerAddress": manager_ip, "trialTemplate": template, "trialCodeDirectory": code_dir})
    platform_config = _with_trial_gpus(module, platform_config, gpus)
    with_code_dir = getattr(module, "with_code_dir", None)  # a platform that ships the code before any trial
    if with_code_dir is not None:
        platform_config = with_code_dir(platform_config, code_dir)
    with_priority = getattr(module, "with_priority", None)  # a platform whose experiments are jobs of a pool
    if with_priority is not None:  # the experiment's one priority: the config's, else the platform's own key's
        platform_config, priority = with_priority(platform_config, priority, DEFAULT_PRIORITY)
    if command is None and getattr(module, "TRIAL_COMMAND_REQUIRED", False):
        raise UserError("trialCommand is missing", "trialCommand", "add trialCommand: your command, like python3 train.py")
    notes = _check_manager_keys(c, module, section["platform"], manager_ip, template)
    if gpus is None and getattr(platform_config, "use_active_gpu", False):
        notes.append("useActiveGpu: true without trialGpuNumber: no GPU is scheduled, as in NNI (each trial "
                     "sees this machine's GPUs as they are); add trialGpuNumber to give each trial its own")
    return section, platform_config, priority, notes


def checkpoint_handover(tuner: AlgorithmConfig, platform: str, platform_config: Any,
                        storage: Optional[CheckpointStorage]) -> List[str]:
    """A search that hands one trial's checkpoint to another (PBT's exploit, a configuration Hyperband or BOHB
    sends on: HANDS_ON_CHECKPOINTS) where the checkpoint reaches the trial that goes on (notes on it, or
    UserError). The copy is made on this machine, from the trial's dir under the experiment dir (the platform's
    seed_checkpoint), or in the object store of checkpoints (checkpointStorage), which the keeper fetches on any
    node. Local trials see this machine's experiment dir, and so do a Ray cluster's on this machine
    (trials_see_this_machine); a remote one's keep their dirs on their own disks, where the copy would find
    nothing: PBT without a dir every node mounts is refused there. A platform whose trials run on
    machines of their own says where they share files (`shared_dirs`: a Kubernetes platform's NFS or Azure File
    mount): PBT's all_checkpoint_dir must be under one, and trials_experiment_dir puts the default there.
    Hyperband and BOHB are only told: NNI's trial code for them reads no checkpoint and loses nothing."""
    if not TUNERS[tuner.name].HANDS_ON_CHECKPOINTS:
        return []
    module = platforms.load(platform)
    given = tuner.class_args.get("all_checkpoint_dir")
    stored = storage is not None and storage.store is not None
    sees_here = getattr(module, "trials_see_this_machine", None)  # Ray: a cluster on this machine
    if sees_here is not None and not sees_here(platform_config) and not stored:
        if tuner.name != "PBT":
            return [f"{tuner.name} on a {platform} cluster elsewhere: a configuration that goes on to the next round "
                    "starts with an empty trialkit.checkpoint_dir(), since each node keeps its trials' dirs on its own "
                    "disk (checkpointStorage in an object store carries it); code that keeps no checkpoint, as NNI's, "
                    "loses nothing"]
        if given is None:
            raise UserError(f"PBT on a {platform} cluster elsewhere: its nodes do not see this machine's experiment "
                            "dir, where PBT's checkpoints go by default", "trainingService.address",
                            "set all_checkpoint_dir to a directory every node mounts at the same path, or put "
                            "checkpointStorage in an object store, s3, gcs or azure")
        return [f"PBT on a {platform} cluster elsewhere: a trial goes on from another's checkpoint through "
                "load_checkpoint_dir under all_checkpoint_dir; trialkit.checkpoint_dir() starts empty, since each "
                "node keeps its trials' dirs on its own disk (checkpointStorage in an object store carries it)"]
    if tuner.name != "PBT":
        return []
    shared_dirs = getattr(module, "shared_dirs", None)
    if shared_dirs is None:
        return []
    mounts = [os.path.normpath(mount) for mount in shared_dirs(platform_config)]
    if given is not None:
        if not any(os.path.commonpath([os.path.normpath(given), mount]) == mount for mount in mounts):
            raise UserError(f"all_checkpoint_dir {given} is on no volume the {platform} pods mount: each pod would "
                            "see only its own", "tuner.classArgs.all_checkpoint_dir",
                            f"put it under {mounts[0]}, the shared volume's containerMountPath, or leave it out"
                            if mounts else "add nfs: {server, path, containerMountPath} to trainingService and put "
                            "it under containerMountPath, or leave it out")
        return []
    if mounts:
        return []
    if stored:
        return [f"PBT on {platform} without a shared volume: a trial goes on from another's checkpoint through "
                "trialkit.checkpoint_dir() (the checkpointStorage copy); NNI's load_checkpoint_dir and "
                "save_checkpoint_dir are on no volume the pods share (add nfs: to trainingService for them)"]
    raise UserError(f"PBT on {platform} needs its checkpoints on a volume every trial pod mounts, and it mounts none",
                    "trainingService", "add nfs: {server, path, containerMountPath}, under which all_checkpoint_dir "
                    "then defaults; or put checkpointStorage in an object store, s3, gcs or azure, for code that keeps "
                    "its state in the dir trialkit.checkpoint_dir returns")


def trials_experiment_dir(config: ExperimentConfig, experiment_dir: Union[str, Path]) -> str:
    """The experiment's dir as its trials see it, for what they read and write by path (PBT's default
    all_checkpoint_dir, build_tuner's experiment_dir): this machine's, or on a platform with a shared volume
    <mount>/trialkit/<experiment id> there (as NNI keeps an experiment's files under <mount>/nni/<id>)."""
    shared_dirs = getattr(platforms.load(config.platform), "shared_dirs", None)
    mounts = shared_dirs(config.training_service) if shared_dirs is not None else ()
    return os.path.join(mounts[0], "trialkit", Path(experiment_dir).name) if mounts else str(experiment_dir)


_UNSUPPORTED_FOLDS = {schema.fold(k): why for k, why in UNSUPPORTED.items()}


def _check_manager_keys(c: Mapping[str, Any], module: Any, platform: str, manager_ip: Optional[str],
                        template: Optional[str]) -> List[str]:
    """Refuse trialkit's keys that this platform would not apply; NNI's that NNI too would not act on
    here, or that concern NNI's manager alone, are accepted with a note (returned) as NNI accepts them."""
    notes = []
    # The manager logs its one way (progress, warnings); the trials' own output is in their dirs.
    if c.get("logLevel") is not None and schema.as_choice(c["logLevel"], LOG_LEVELS, "logLevel") != "info":
        notes.append(f"logLevel {c['logLevel']}: trialkit's manager has one level (its progress and warnings); "
                     f"each trial's output is in its dir (`trialkit trial logs ID`)")
    if c.get("debug") is not None and schema.as_bool(c["debug"], "debug"):
        notes.append("debug: true: trialkit's manager has no debug mode; each trial's output is in its dir "
                     "(`trialkit trial logs ID`)")
    if template is not None and not hasattr(module, "render"):
        raise UserError(f"trialTemplate is not used on the {platform} platform", "trialTemplate",
                        "remove it: only kubeflow, frameworkcontroller and adaptdl fill a job template")
    if manager_ip is not None and platform == "local":
        notes.append("nniManagerIp is not used on the local platform (as in NNI): local trials reach the manager "
                     "on 127.0.0.1")
    return notes


# NNI's training-service keys that NNI's own Python API writes into every config it saves (true by
# default on these platforms), which trialkit reads and does not act on:
# key -> (its platforms, the value that needs no note, the note).
_SECTION_IGNORED = {
    "reuseMode": (("kubeflow", "frameworkcontroller"), False,
                  "reuseMode: true: trialkit runs each trial as its own job, as NNI does with reuseMode: false"),
}
# Top-level keys NNI's TrainingServiceConfig also has, which its saved configs repeat in the section.
_SECTION_REPEATS = ("trialCommand", "trialCodeDirectory", "trialGpuNumber", "nniManagerIp", "debug")


def _nni_section(c: Dict[str, Any]) -> Tuple[Any, List[str]]:
    """The training-service section as NNI reads it, for its platform to parse: NNI's ignored keys
    out (a note for each that matters), the top-level keys it repeats lifted to the top (where the
    top lacks them; the same value twice is one), and its K8sNfsConfig's `storage: nfs` beside
    storageType dropped."""
    section = c.get("trainingService")
    if not isinstance(section, Mapping):
        return section, []  # none, or a mistake that _training_service names
    section, notes = dict(section), []
    platform = next((v for k, v in section.items() if isinstance(k, str) and schema.fold(k) == "platform"), None)
    for key in [k for k in section if isinstance(k, str)]:
        folded = schema.fold(key)
        for name, (kinds, quiet, note) in _SECTION_IGNORED.items():
            if folded == schema.fold(name) and platform in kinds:
                if schema.as_bool(section.pop(key), f"trainingService.{key}") != quiet:
                    notes.append(note)
        top = next((name for name in _SECTION_REPEATS if schema.fold(name) == folded), None)
        if top is None or (top == "trialCodeDirectory" and c.get(top) is None):
            continue  # a cluster platform reads its own trialCodeDirectory
        if c.get(top) is None:
            c[top] = section.pop(key)
        elif c[top] == section[key]:
            del section[key]
        else:
            raise UserError(f"{top} differs here from the top level's", f"trainingService.{key}",
                            f"keep one {top}: trialkit runs one training service")
    storage = section.get("storage")
    if isinstance(storage, Mapping) and storage.get("storage") is not None:
        kind = next((v for k, v in storage.items() if isinstance(k, str) and schema.fold(k) == "storagetype"), None)
        if kind == storage["storage"]:
            section["storage"] = {k: v for k, v in storage.items() if k != "storage"}
    return section, notes


def _optional(c: Mapping[str, Any], key: str, check: Callable[[Any, str], Any], default: Any = None) -> Any:
    """`check(value, key)` of a key that may be absent or null (then `default`)."""
    return default if c.get(key) is None else check(c[key], key)


MAX_COMMAND_BYTES = 100_000  # it travels as one environment variable (TRIALKIT_COMMAND): Linux takes 128 KiB


def _trial_command(value: Any, where: str) -> str:
    command = schema.as_str(value, where)
    if len(command.encode()) > MAX_COMMAND_BYTES:
        raise UserError(f"the command is {len(command.encode()):,} bytes, over the {MAX_COMMAND_BYTES:,} a trial's "
                        "environment carries it in", where, "put the long part in a script in trialCodeDirectory")
    return command


def _positive_int(value: Any, where: str) -> int:
    return schema.as_int(value, where, minimum=1)


def _only_false(c: Mapping[str, Any], key: str, where: str, why: str) -> None:
    if c.get(key) is not None and schema.as_bool(c[key], where):
        raise UserError(f"{key}: true is not supported", where, why)


NAME_MAX, PATH_MAX = 255, 4096  # Linux's bounds on a file name and a path, in bytes
PATH_ROOM = 256  # bytes kept for what trialkit makes below a configured path (experiments/ID/trials/ID/...)


def _absolute(path: str, base: Path, where: str) -> str:
    """The path made absolute; refused when no file could have it (a NUL, a lone surrogate, too long)."""
    if "\x00" in path:
        raise UserError(f"the path {schema.show(path)} holds a NUL character", where, "remove it")
    # os.path.expanduser leaves an unknown ~user alone (pathlib's raises).
    full = os.path.normpath(os.path.join(base, os.path.expanduser(path)))
    try:
        encoded = os.fsencode(full)
    except UnicodeEncodeError:
        raise UserError(f"the path {schema.show(path)} holds a character no file name can (a lone surrogate)", where,
                        "remove it") from None
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        raise UserError(f"the path has a part of {len(longest)} bytes ({schema.show(os.fsdecode(longest))})", where,
                        f"no file name is longer than {NAME_MAX} bytes: use a shorter name")
    if len(encoded) > PATH_MAX - PATH_ROOM:
        raise UserError(f"the path is {len(encoded)} bytes long ({full[:40]}...)", where,
                        f"use a path of at most {PATH_MAX - PATH_ROOM} bytes")
    return full


def _directory(value: Any, base: Path, where: str) -> str:
    path = _absolute(schema.as_str(value, where), base, where)
    if not os.path.isdir(path):
        raise UserError(f"{value!r} is not a directory ({path})", where, "point it at the directory of your trial code")
    _not_kernel_files(path, where)
    return path


TLS_KEYS = ("certFile", "keyFile")


def manager_tls(value: Any, base: Path, where: str) -> Dict[str, str]:
    """`{certFile, keyFile}`: PEM files of the manager's certificate (chain) and key, made absolute."""
    section = schema.normalize_keys(value, TLS_KEYS, where)
    missing = [key for key in TLS_KEYS if section.get(key) is None]
    if missing:
        raise UserError(f"{' and '.join(missing)} missing", where, "give both certFile and keyFile, PEM files")
    return {key: _file(section[key], base, schema.path(where, key)) for key in TLS_KEYS}


def _working_directory(value: Any, base: Path, where: str) -> str:
    """A directory to make experiments in: where it exists already, a directory on a disk."""
    path = _absolute(schema.as_str(value, where), base, where)
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{path} cannot be made: {existing} is not a directory", where, "point it at a directory")
    _not_kernel_files(path, where)
    return path


_KERNEL_FILES = ("/proc", "/sys")  # the kernel's views, not places for code or experiments


def _not_kernel_files(path: str, where: str) -> None:
    real = os.path.realpath(path)
    for root in _KERNEL_FILES:
        if real == root or real.startswith(root + "/"):
            raise UserError(f"{path} is under {root}, the kernel's view of processes and devices", where,
                            "point it at a directory on a disk")


def _file(value: Any, base: Path, where: str) -> str:
    path = _absolute(schema.as_str(value, where), base, where)
    if not os.path.isfile(path):
        raise UserError(f"{value!r} is not a file: {path}", where, "check the path: it is relative to the config file's directory")
    return path


def _search_space(c: Mapping[str, Any], base: Path) -> SearchSpace:
    inline, path = c.get("searchSpace"), c.get("searchSpaceFile")
    if inline is not None and path is not None:
        raise UserError("both searchSpace and searchSpaceFile are given", "searchSpaceFile", "keep one of them")
    if path is not None:
        file = Path(_file(path, base, "searchSpaceFile"))
        try:
            return parse_space(schema.read_data_file(file, "searchSpaceFile"), "searchSpaceFile")
        except UserError as err:  # at its line in the search space's file, as a syntax error there is
            raise schema.placed(err, file, lacking=False, within="searchSpaceFile") from None
    if inline is None:
        raise UserError("the search space is missing", "searchSpace",
                        "add searchSpaceFile: search_space.json, or searchSpace: {...}")
    return parse_space(inline, "searchSpace", allow_empty=True)  # `{}`: trials without parameters


def _algorithm(section: Any, where: str) -> Tuple[Any, Any]:
    """(name, classArgs) of the tuner, advisor or assessor section at `where`."""
    sec = schema.normalize_keys(section, ("name", "classArgs"), where)
    if sec.get("name") is None:
        raise UserError("name is missing", schema.path(where, "name"), "add name: TPE, or another tuner's name")
    _misplaced(sec["name"], where)
    return sec["name"], sec.get("classArgs")


_A_KIND = {"tuner": "a tuner", "advisor": "an advisor"}


def _misplaced(name: Any, where: str) -> None:
    """An assessor's name under tuner or advisor, or a tuner's under assessor: which kind it is and where it goes,
    rather than an unknown name (tuners pick the parameters; assessors stop poor trials early)."""
    folded = schema.fold(name) if isinstance(name, str) else None
    if where != "assessor":
        assessor = next((entry for entry in ASSESSORS if schema.fold(entry) == folded), None)
        what = f"{assessor} is an assessor, not {_A_KIND[where]}: it stops poor trials early and picks no parameters"
        if assessor is None and folded is not None and schema.suggest(name, [*TUNERS, *ALIASES]) is None:
            assessor = schema.suggest(name, ASSESSORS)  # a misspelt assessor: Medianstp
            what = (f"{name} is not {_A_KIND[where]}; it reads like the assessor {assessor}, which stops poor trials "
                    "early and picks no parameters")
        if assessor is not None:
            raise UserError(what, schema.path(where, "name"),
                            f"move it to assessor: {{name: {assessor}}} and name a tuner here, like TPE")
        return
    tuner = next((entry for entry in [*TUNERS, *ALIASES] if schema.fold(entry) == folded), None)
    if tuner is None:
        return
    if TUNERS[ALIASES.get(tuner, tuner)].TAKES_ASSESSOR:
        raise UserError(f"{tuner} is a tuner, not an assessor: it picks the parameters to try", "assessor.name",
                        f"name it under tuner: {{name: {tuner}}} and name an assessor here, like Medianstop, "
                        "or remove the assessor")
    raise UserError(f"{tuner} is a tuner that also stops trials itself, an advisor in NNI, not an assessor",
                    "assessor.name", f"name it under tuner: {{name: {tuner}}} and remove the assessor")


def _tuner(c: Mapping[str, Any], space: Optional[SearchSpace]) -> AlgorithmConfig:
    """The tuner; with no space (it was refused), its name and classArgs are checked against an empty one."""
    # NNI took an advisor (BOHB, Hyperband) in the tuner's place, and refuses both.
    if c.get("tuner") is not None and c.get("advisor") is not None:
        tuner, advisor = _name_in(c["tuner"], "the tuner's"), _name_in(c["advisor"], "the advisor's")
        raise UserError("both tuner and advisor are given: an advisor is a tuner that also decides which trials "
                        "stop, and an experiment has one of the two, as in NNI", "advisor",
                        f"keep one of the two keys: remove advisor: to search with {tuner}, or remove tuner: to "
                        f"search with {advisor}, its classArgs with it")
    where = "advisor" if c.get("advisor") is not None else "tuner"
    if c.get(where) is None:
        raise UserError("the tuner is missing", "tuner", "add tuner: {name: TPE, classArgs: {optimize_mode: maximize}}")
    name, args = _algorithm(c[where], where)
    return AlgorithmConfig(*check_tuner(name, args, space or SearchSpace({}, {}), where))


def _name_in(section: Any, instead: str) -> str:
    """The name a tuner or advisor section gives, as written, for a message about it; `instead` if none reads."""
    name = next((value for key, value in section.items() if isinstance(key, str) and schema.fold(key) == "name"),
                None) if isinstance(section, Mapping) else None
    return name if isinstance(name, str) else instead


def _assessor(section: Any, tuner: Optional[AlgorithmConfig]) -> Optional[AlgorithmConfig]:
    """The assessor; with no tuner (it was refused), checked by itself."""
    if section is None:
        return None
    name, args = _algorithm(section, "assessor")
    if tuner is not None and not TUNERS[tuner.name].TAKES_ASSESSOR:
        raise UserError(f"{tuner.name} decides itself which trials go on (NNI refuses an assessor beside it too)",
                        "assessor", "remove the assessor")
    name, args = check_assessor(name, args)
    if tuner is None:
        return AlgorithmConfig(name, args)
    # Judging trials the other way round from the tuner is always a slip.
    mode = args.setdefault("optimize_mode", tuner.class_args["optimize_mode"])
    if mode != tuner.class_args["optimize_mode"]:
        raise UserError(f"optimize_mode {mode!r} differs from the tuner's {tuner.class_args['optimize_mode']!r}",
                        "assessor.classArgs.optimize_mode", "use the tuner's optimize_mode, or leave it out")
    return AlgorithmConfig(name, args)


def _with_trial_gpus(module: Any, platform_config: Any, gpus: Optional[int]) -> Any:
    """Hand trialGpuNumber to the platform, which applies it (as NNI copies it into its training service's
    config); a platform that sizes GPUs its own way (per role) refuses it rather than ignore it."""
    apply = getattr(module, "with_trial_gpus", None)
    if apply is not None:
        return apply(platform_config, gpus)
    if gpus is not None:
        raise UserError(f"trialGpuNumber is not used on the {module.PLATFORM} platform", "trialGpuNumber",
                        "remove it and set gpuNumber for each role under trainingService")
    return platform_config


def _training_service(section: Any, base: Path, inherited: Mapping[str, Any]) -> Tuple[Dict[str, Any], Any, Any]:
    """(section with its platform canonical, the platform's config object, the platform module).

    Cluster platforms (those that render objects) also take the top-level
    nniManagerIp, trialTemplate and trialCodeDirectory when their section does
    not set them, and a relative trialTemplate in the section, or a code dir in
    it or its roles (the platform's resolve_paths), is read from the config's folder.
    """
    where = "trainingService"
    if section is None:
        section = {"platform": "local"}  # trialkit's default: trials on this machine
    if isinstance(section, list):
        raise UserError("several training services (NNI's hybrid mode) are not supported", where,
                        "keep one trainingService section")
    section = dict(schema.mapping(section, where))
    keys = [k for k in section if isinstance(k, str) and schema.fold(k) == "platform"]
    if not keys:  # a misspelt platform is told as such, not as its consequence (no platform)
        # Closer than a did-you-mean among known keys: `operator`, a key of the section, is 0.62 like `platform`.
        near = next((k for k in section if isinstance(k, str) and schema.suggest(k, ["platform"], cutoff=0.8)), None)
        if near is not None:
            raise schema.unknown_key(near, ["platform"], section, where)
    if len(keys) != 1:
        raise UserError("platform is missing" if not keys else "platform is given twice", f"{where}.platform",
                        "add platform: local, kubeflow, frameworkcontroller, adaptdl or ray")
    name = platforms.canonical_name(section.pop(keys[0]), f"{where}.platform")
    section = {"platform": name, **section}
    module = platforms.load(name)
    if hasattr(module, "render"):
        folded = {schema.fold(k): k for k in section if isinstance(k, str)}
        for key, value in inherited.items():
            # NNI's own configs repeat the top-level nniManagerIp in the section under that name.
            names = (key, "nniManagerIp") if key == "managerAddress" else (key,)
            if value is not None and not any(schema.fold(name) in folded for name in names):
                section[key] = value
        template_key = folded.get(schema.fold("trialTemplate"))
        if template_key and isinstance(section[template_key], str):
            section[template_key] = _file(section[template_key], base, f"{where}.{template_key}")
        config_key = folded.get(schema.fold("configPath"))  # NNI's custom FrameworkController config
        if config_key and name == "frameworkcontroller" and isinstance(section[config_key], str):
            from trialkit.platforms.kubernetes.config import framework_task_roles

            section[config_key] = _file(section[config_key], base, f"{where}.{config_key}")
            if schema.fold("taskRoles") not in folded:  # as NNI: the roles are the Framework's
                section["taskRoles"] = framework_task_roles(section[config_key], f"{where}.{config_key}")
        resolve = getattr(module, "resolve_paths", None)  # code dirs the platform ships, in the section's roles
        if resolve is not None:
            resolve(section, lambda value, at: _directory(value, base, at))
    return section, module.parse_section(copy.deepcopy(section), where), module


# ---------------------------------------------------------------- v1


def _parse_v1(data: Mapping, base: Path, check_code: bool) -> ExperimentConfig:
    v1: Dict[str, Any] = {}
    try:
        with schema.every_problem():  # a refusal lists every problem it found, an unknown key's with the rest
            v1 = schema.normalize_keys(data, V1_KEYS + tuple(V1_PLATFORM_SECTIONS), "")
            return replace(_parse_v2(convert_v1(v1), base, check_code), v1=v1)
    except schema.ConfigProblems as err:
        # A v2 key written for a v1 one leaves that one missing: said once, at the key written.
        written = {_v1_where(one.where, v1) for one in err.problems if _holds(data, one.where)}
        problems = [_in_v1(one, v1, data) for one in err.problems]
        problems = [one for one in problems if one.where not in written or _holds(data, one.where)]
        raise (problems[0] if len(problems) == 1 else schema.ConfigProblems(problems)) from None
    except UserError as err:
        raise _in_v1(err, v1, data) from None


def _in_v1(err: UserError, v1: Mapping[str, Any], data: Any = None) -> UserError:
    """The error naming the key the v1 config wrote, in its place and in its words, its v2 name added.

    `data`: the config as written; an error at a key it holds (one v1 does not know) names it already, and a v2
    key there is told its v1 name."""
    if _holds(data, err.where):
        meant = _v1_where(err.where, v1)
        return err if meant == err.where else UserError(err.what, err.where, f"{err.where} is a v2 key: a v1 "
                                                                              f"config writes {meant}")
    where = _v1_where(err.where, v1)
    what, fix = _v1_words(err.what), _v1_words(err.fix)
    if where != err.where:
        fix = "; ".join(filter(None, [fix, f"{err.where} in a v2 config"]))
    return UserError(what, where, fix)


_V2_TO_V1 = {v2: v1 for v1, v2 in V1_RENAMES.items()}
# The v2 names a v1 config spells otherwise, as words of an error's text ("add trialCommand: ...").
_V2_WORDS = re.compile(r"\b(" + "|".join(sorted((v2 for v2, v1 in _V2_TO_V1.items() if v1 != v2), key=len,
                                                   reverse=True)) + r")\b")


# A fix that writes a v2 section ("move it to assessor: {name: Medianstop}"), as a v1 section names the algorithm.
_V2_ALGORITHM = re.compile(r"\b(tuner|assessor|advisor): \{name: ")


def _v1_words(text: Optional[str]) -> Optional[str]:
    """An error's text (None: none) with each v2 key it names spelled as a v1 config writes it."""
    text = text and _V2_WORDS.sub(lambda match: _V2_TO_V1[match.group(1)], text)
    return text and _V2_ALGORITHM.sub(lambda match: f"{match.group(1)}: {{builtin{match.group(1).title()}Name: ", text)


def _holds(data: Any, where: Optional[str]) -> bool:
    """Whether `where` (a dotted path) names a key of `data` as written."""
    if data is None or where is None:
        return False
    for key in where.split("."):
        if not isinstance(data, Mapping) or key not in data:
            return False
        data = data[key]
    return True


def _v1_where(where: Optional[str], v1: Mapping[str, Any]) -> Optional[str]:
    """Name the key the user wrote: a v1 config's errors speak v1 (the platform's keys as its V1_WHERE says)."""
    if where is None:
        return None
    head, _, rest = where.partition(".")
    if head == "trainingService":
        try:
            module = platforms.load(platforms.canonical_name(v1.get("trainingServicePlatform"), "trainingServicePlatform"))
        except UserError:
            return where
        return schema.rename_path(where, getattr(module, "V1_WHERE", ()))
    if head in ("tuner", "assessor", "advisor") and rest == "name":
        return f"{head}.builtin{head.title()}Name"
    if head in _V2_TO_V1:
        return _V2_TO_V1[head] + ("." + rest if rest else "")
    return where


def convert_v1(v1: Mapping[str, Any]) -> Dict[str, Any]:
    """An NNI v1 config (keys already as V1_KEYS spell them) as a v2 dict."""
    _only_false(v1, "useAnnotation", "useAnnotation", "write a v2 config with a searchSpace")
    _only_false(v1, "multiPhase", "multiPhase", "trialkit trials take one set of parameters")
    _only_false(v1, "multiThread", "multiThread", "the tuner answers one request at a time")
    if v1.get("trainingServicePlatform") is None:
        raise UserError("trainingServicePlatform is missing", "trainingServicePlatform", "add trainingServicePlatform: local")
    if v1.get("searchSpacePath") is None:  # a v1 config has no inline search space (v2's searchSpace)
        raise UserError("searchSpacePath is missing", "searchSpacePath", "add searchSpacePath: search_space.json")
    platform = platforms.canonical_name(v1["trainingServicePlatform"], "trainingServicePlatform")
    for key, owner in V1_PLATFORM_SECTIONS.items():
        if key in v1 and owner != platform:
            raise UserError(f"{key} is for trainingServicePlatform: {owner}", key, f"remove it, or use {owner}")

    v2: Dict[str, Any] = {}
    trial = dict(schema.mapping(v1.get("trial") or {}, "trial"))
    takes_gpus = hasattr(platforms.load(platform), "with_trial_gpus")
    for old, new in V1_RENAMES.items():
        if new == "trialGpuNumber" and not takes_gpus:
            continue  # a cluster platform's from_v1 reads trial.gpuNum as its role's gpuNumber
        holder, key = (trial, old[len("trial."):]) if old.startswith("trial.") else (v1, old)
        if holder.get(key) is not None:
            v2[new] = holder[key]
    for kind in ("tuner", "assessor", "advisor"):
        if v1.get(kind) is not None:
            v2[kind] = _v1_algorithm(v1[kind], kind)

    from_v1 = getattr(platforms.load(platform), "from_v1", None)
    if from_v1 is None:
        raise UserError(f"NNI v1 configs for {platform} are not supported", "trainingServicePlatform",
                        "write a v2 config with a trainingService section")
    v2["trainingService"] = from_v1(dict(v1))
    if getattr(platforms.load(platform), "V1_CODE_DIR_IN_IMAGE", False):
        v2.pop("trialCodeDirectory", None)  # its from_v1 took trial.codeDir: a directory in the image
    return v2


def _v1_algorithm(section: Any, kind: str) -> Dict[str, Any]:
    builtin = f"builtin{kind.title()}Name"
    sec = schema.normalize_keys(section, (builtin, "classArgs", "includeIntermediateResults",
                                          "codeDir", "classFileName", "className"), kind)
    custom = [k for k in ("codeDir", "classFileName", "className") if k in sec]
    if custom:
        raise UserError(f"custom {kind}s are not supported", f"{kind}.{custom[0]}", f"use a built-in {kind}")
    _only_false(sec, "includeIntermediateResults", f"{kind}.includeIntermediateResults",
                "tuners learn from final results only")
    if sec.get(builtin) is None:
        raise UserError(f"{builtin} is missing", f"{kind}.{builtin}", f"add {builtin}: TPE, or another's name")
    out = {"name": sec[builtin]}
    if sec.get("classArgs") is not None:
        out["classArgs"] = sec["classArgs"]
    return out
