"""Reading the Kubernetes platforms' `trainingService` sections.

kubeflow, frameworkcontroller and adaptdl share this: key spelling (camelCase
or snake_case, NNI's aliases), the options every Kubernetes platform has, a
role's image, command and resources, and the parts of NNI's v1 format that
they have in common. Every mistake is a UserError naming the key.
"""
from __future__ import annotations

import ipaddress
import math
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from trialkit import env as envnames
from trialkit import layout
from trialkit import schema
from trialkit.errors import UserError
from trialkit.platforms.kubernetes import validation

DEFAULT_NAMESPACE = "default"
DEFAULT_NFS_MOUNT = "/nfs"
DEFAULT_STORAGE_MIB = 1024
# A finished trial's job (and its pods) stays this long for `kubectl logs` and
# `kubectl describe`; a failed one longer, since that is when they are read.
DEFAULT_KEEP_SUCCEEDED_SECONDS = 600.0
DEFAULT_KEEP_FAILED_SECONDS = 86400.0

# Keys naming a code directory on this machine, in the section (the experiment's
# trialCodeDirectory, which the config layer passes down) or in a role (NNI's
# codeDirectory, v1's codeDir): the config layer makes them absolute (resolve_paths),
# and each is packed and shipped to the trial's pods through the manager.
CODE_DIR_KEYS = ("trialCodeDirectory", "codeDirectory", "codeDir")

MIB = 1024 * 1024
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
MAX_MIB = ((1 << 63) - 1) // MIB  # Kubernetes counts a quantity's bytes in 64 bits
_SIZE_UNITS = {"": MIB, "b": 1}  # no unit: MiB, as NNI's memoryMB
for _power, _letter in enumerate("kmgtp", start=1):
    for _suffix in ("", "b", "i", "ib"):
        _SIZE_UNITS[_letter + _suffix] = 1024**_power


def camel(key: str) -> str:
    """`memory_size` -> `memorySize`; camelCase keys pass unchanged."""
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), key)


class Section:
    """One mapping of the config, read key by key; keys nobody asked for are errors.

    A value of the wrong kind reads as the default and is reported
    (schema.report): where the config layer collects problems, a refusal
    lists every one of them at once.
    """

    def __init__(self, data: Any, where: str):
        if not isinstance(data, dict):
            raise UserError(f"expected a mapping, got {type(data).__name__}", where)
        self.where = where
        self._data: Dict[str, Any] = {}
        self._asked: Set[str] = set()
        for key, value in data.items():
            name = camel(str(key))
            if name in self._data:
                raise UserError(f"{key!r} is given twice (camelCase and snake_case)", where, "keep one")
            self._data[name] = value

    def at(self, name: str) -> str:
        return f"{self.where}.{name}"

    def raw(self, name: str, *aliases: str) -> Tuple[str, Any]:
        """The value of `name` or one of its aliases, and the key it was found under."""
        self._asked.update((name, *aliases))
        found = [key for key in (name, *aliases) if key in self._data and self._data[key] is not None]
        if len(found) > 1:
            raise UserError(f"{found[0]} and {found[1]} name the same option", self.where, f"keep only {name}")
        return (found[0], self._data[found[0]]) if found else (name, None)

    def text(self, name: str, *aliases: str, default: Optional[str] = None) -> Optional[str]:
        key, value = self.raw(name, *aliases)
        if value is None:
            return default
        if isinstance(value, (dict, list, bool)) or (isinstance(value, int) and value.bit_length() > 64) \
                or str(value).strip() == "":  # str() of a number past 4,300 digits raises
            return self._wrong("a non-empty string", value, key, default)
        return str(value)

    def integer(
        self, name: str, *aliases: str, default: Optional[int] = None, minimum: Optional[int] = None
    ) -> Optional[int]:
        key, value = self.raw(name, *aliases)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            return self._wrong("an integer", value, key, default)
        if minimum is not None and value < minimum:
            schema.report(UserError(f"must be at least {minimum}, got {schema.show(value)}", self.at(key)))
            return default
        return self._checked(schema.as_int, value, key, default)

    def number(self, name: str, *aliases: str) -> Optional[float]:
        key, value = self.raw(name, *aliases)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            return self._wrong("a positive number", value, key, None)
        return self._checked(schema.as_number, value, key, None)

    def _checked(self, check: Any, value: Any, key: str, default: Any) -> Any:
        """check(value, where): what schema's check gives (a number within its range), else reported."""
        try:
            return check(value, self.at(key))
        except UserError as err:
            schema.report(err)
            return default

    def boolean(self, name: str, *aliases: str, default: bool = False) -> bool:
        key, value = self.raw(name, *aliases)
        if value is None:
            return default
        if not isinstance(value, bool):
            return self._wrong("true or false", value, key, default)
        return value

    def section(self, name: str, *aliases: str) -> Optional["Section"]:
        key, value = self.raw(name, *aliases)
        return None if value is None else Section(value, self.at(key))

    def sections(self, name: str, *aliases: str) -> List["Section"]:
        key, value = self.raw(name, *aliases)
        if value is None:
            return []
        if not isinstance(value, list):
            raise UserError(f"expected a list, got {type(value).__name__}", self.at(key))
        return [Section(item, f"{self.at(key)}[{i}]") for i, item in enumerate(value)]

    def finish(self) -> None:
        for key in sorted(set(self._data) - self._asked):
            schema.report(schema.unknown_key(key, sorted(self._asked), self._data, self.where))

    def _wrong(self, expected: str, value: Any, key: str, default: Any) -> Any:
        schema.report(schema.wrong_value(expected, value, self.at(key)))
        return default


def parse_size_mib(value: Any, where: str) -> int:
    """NNI's sizes ('4g', '8192mb', '1Gi'; a bare number is MiB) in whole MiB, rounded up."""
    if isinstance(value, bool):
        raise UserError(f"expected a size such as 4g or 1024mb, got {value!r}", where)
    if isinstance(value, (int, float)):
        mib = math.ceil(value) if isinstance(value, int) or math.isfinite(value) else MAX_MIB + 1
    else:
        match = _SIZE.match(value) if isinstance(value, str) else None
        unit = match.group(2).lower() if match else None
        if unit not in _SIZE_UNITS:
            raise UserError(
                f"expected a size such as 4g or 1024mb, got {schema.show(value)}", where,
                "units: b, k, m, g, t, powers of 1024"
            )
        mib = float(match.group(1)) * _SIZE_UNITS[unit] / MIB  # inf past a float's range
        mib = math.ceil(mib) if math.isfinite(mib) else MAX_MIB + 1
    if mib < 1:
        raise UserError(f"must be at least 1 MiB, got {schema.show(value)}", where)
    if mib > MAX_MIB:
        raise UserError(f"{schema.show(value)} is too large", where,
                        f"give at most {MAX_MIB} MiB, the most a 64-bit count of bytes holds")
    return mib


@dataclass(frozen=True)
class Resources:
    cpu: Optional[float] = None
    gpu: int = 0
    memory_mib: Optional[int] = None


def _image(sec: Section) -> Optional[str]:
    key, _ = sec.raw("dockerImage", "image")
    found = sec.text("dockerImage", "image")
    return None if found is None else validation.image(found, sec.at(key))


def _named(sec: Section, key: str, what: str) -> Optional[str]:
    """An optional name of a cluster object (a StorageClass, a ServiceAccount), as the cluster takes it."""
    found = sec.text(key)
    return None if found is None else validation.dns_subdomain(found, sec.at(key), what)


def parse_resources(sec: Section) -> Resources:
    memory_key, memory = sec.raw("memorySize", "memoryMB")
    return Resources(
        cpu=sec.number("cpuNumber", "cpuNum"),
        gpu=sec.integer("gpuNumber", "gpuNum", default=0, minimum=0),
        memory_mib=None if memory is None else parse_size_mib(memory, sec.at(memory_key)),
    )


@dataclass(frozen=True)
class Role:
    """A group of identical pods: Kubeflow's master/worker/ps, FrameworkController's task role."""

    name: str
    count: int
    command: Optional[str]  # None: the trial's command
    image: Optional[str]  # None: the section's image, else the trial's
    resources: Resources
    code_dir: Optional[str] = None  # shipped to this role's pods; None: the section's


def parse_role(sec: Section, name: str, count_keys: Sequence[str]) -> Role:
    if sec.text("privateRegistryAuthPath") is not None:
        raise UserError(
            "privateRegistryAuthPath is not supported",
            sec.at("privateRegistryAuthPath"),
            "create an image pull Secret with `kubectl create secret docker-registry` and list it in imagePullSecrets",
        )
    code_key, code_dir = sec.raw("codeDirectory", "codeDir")
    if code_dir is not None:
        code_dir = checked_code_dir(code_dir, sec.at(code_key))
    return Role(
        name=name,
        count=sec.integer(*count_keys, default=1, minimum=1),
        command=sec.text("command"),
        image=_image(sec),
        resources=parse_resources(sec),
        code_dir=code_dir,
    )


def checked_code_dir(path: Any, where: str) -> str:
    """A code directory to ship: its size and ignore rules checked now (a one-line error), packed at render."""
    from trialkit.platforms import context

    if not isinstance(path, str) or not path.startswith("/"):
        raise UserError(f"expected the absolute path of a directory, got {path!r}", where)
    context.collect(path)  # raises UserError: not a directory, or over the size limit
    return path


def resolve_paths(section: dict, directory: Callable[[Any, str], str]) -> None:
    """Make the code directories a section names (CODE_DIR_KEYS, in it or its roles) absolute, in place,
    with the config layer's `directory(value, where)` (relative to the config's folder)."""
    def walk(node: Any, where: str) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in list(items):
            here = f"{where}[{key}]" if isinstance(node, list) else f"{where}.{key}"
            if isinstance(node, dict) and camel(str(key)) in CODE_DIR_KEYS and isinstance(value, str):
                node[key] = directory(value, here)
            else:
                walk(value, here)

    walk(section, "trainingService")


# Without reportingRole, the first of these roles present reports, else the first role.
REPORTING_ROLE_ORDER = ("chief", "master", "worker")


def reporting_role(sec: Section, roles: Sequence[str]) -> str:
    """`reportingRole`: the role whose task 0 ships the trial's records (one keeper
    per pod holds the trial's token, and only one may ship)."""
    key, value = sec.raw("reportingRole")
    if value is None:
        return next((name for name in REPORTING_ROLE_ORDER if name in roles), roles[0])
    if value not in roles:
        raise UserError(f"{value!r} is not one of this trial's roles", sec.at(key), "use one of: " + ", ".join(roles))
    return str(value)


def check_images(roles: Sequence[Role], common: "KubeCommon", where: str) -> None:
    """Every role runs an image: its own, else the section's. Checked when the config
    loads, so a missing one stops `trialkit run` before any trial is submitted; reported (the section's
    keys are read on, so that a misspelt dockerImage is told as such, not as its consequence)."""
    if common.image:
        return
    for role in roles:
        if not role.image:
            schema.report(UserError(f"role {role.name!r} has no image to run", f"{where}.{role.name}.dockerImage",
                            "set dockerImage for the role, or once for the whole section"))


@dataclass(frozen=True)
class NfsMount:
    server: str
    path: str
    mount_path: str


@dataclass(frozen=True)
class Storage:
    """A claim for a trial's checkpoints: it outlives the trial's job (pause and
    activate mount the same one) and goes when the experiment is stopped or deleted."""

    storage_class: Optional[str]  # None: the cluster's default class
    size_mib: int


def parse_storage(sec: Section) -> Optional[Storage]:
    """`checkpoint: {storageClass, storageSize}`; None when the section has none."""
    checkpoint = sec.section("checkpoint")
    if checkpoint is None:
        return None
    size_key, size = checkpoint.raw("storageSize")
    storage = Storage(
        storage_class=_named(checkpoint, "storageClass", "StorageClass"),
        size_mib=DEFAULT_STORAGE_MIB if size is None else parse_size_mib(size, checkpoint.at(size_key)),
    )
    checkpoint.finish()
    return storage


@dataclass(frozen=True)
class Retention:
    """How long a finished trial's job is kept before trialkit deletes it."""

    succeeded_seconds: float = DEFAULT_KEEP_SUCCEEDED_SECONDS
    failed_seconds: float = DEFAULT_KEEP_FAILED_SECONDS


def parse_retention(sec: Section) -> Retention:
    """`keepFinishedJobs: {succeeded: 10m, failed: 1d}` (durations; the others: a failed
    or canceled trial counts as failed)."""
    keep = sec.section("keepFinishedJobs")
    if keep is None:
        return Retention()
    out = Retention(
        succeeded_seconds=_duration(keep, "succeeded", DEFAULT_KEEP_SUCCEEDED_SECONDS),
        failed_seconds=_duration(keep, "failed", DEFAULT_KEEP_FAILED_SECONDS),
    )
    keep.finish()
    return out


def _duration(sec: Section, name: str, default: float) -> float:
    key, value = sec.raw(name)
    return default if value is None else schema.as_duration(value, sec.at(key))


@dataclass(frozen=True)
class KubeCommon:
    """What every Kubernetes platform's section holds besides its jobs' shape."""

    namespace: str
    manager_address: str
    termination_grace_seconds: int
    keeper_grace_seconds: int
    image: Optional[str]
    template: Optional[dict]  # the user's trialTemplate, parsed; None: the packaged one
    service_account: Optional[str]
    image_pull_secrets: Tuple[str, ...]
    nfs: Optional[NfsMount]
    priority_classes: Tuple[Tuple[int, str], ...] = ()  # (trial priority, PriorityClass name), ascending
    retention: Retention = Retention()
    azure: Optional[AzureStorage] = None  # an Azure File share mounted in every pod
    code_dir: Optional[str] = None  # shipped to every pod (a role may name its own); None: the code is in the image
    working_dir: Optional[str] = None  # with the code in the image, where (None: the image's own working directory)


def parse_common(sec: Section, kinds: Sequence[str]) -> KubeCommon:
    """The shared options; `kinds` are the job kinds a trialTemplate may hold."""
    sec.text("platform")  # the config layer chose the module by it
    if sec.boolean("reuseMode"):
        raise UserError("reuseMode is not supported", sec.at("reuseMode"), "remove it: every trial runs as its own job")
    namespace = validation.dns_label(sec.text("namespace", default=DEFAULT_NAMESPACE), sec.at("namespace"), "namespace")
    address_key, address = sec.raw("managerAddress", "nniManagerIp")
    template_path = sec.text("trialTemplate")
    config_path = sec.text("configPath") if FRAMEWORK in kinds else None  # NNI's custom FrameworkController config
    keeper, termination = parse_grace(sec)
    code_dir, working_dir = parse_code(sec)
    nfs, azure = parse_volume(sec)
    return KubeCommon(
        namespace=namespace,
        manager_address=manager_address(address, sec.at(address_key)),
        termination_grace_seconds=termination,
        keeper_grace_seconds=keeper,
        image=_image(sec),
        template=(load_user_template(template_path, sec.at("trialTemplate"), kinds) if template_path is not None
                  else None if config_path is None else custom_framework(config_path, sec.at("configPath"))),
        service_account=_named(sec, "serviceAccountName", "ServiceAccount"),
        image_pull_secrets=parse_pull_secrets(sec),
        nfs=nfs,
        azure=azure,
        priority_classes=parse_priority_classes(sec),
        retention=parse_retention(sec),
        code_dir=code_dir,
        working_dir=working_dir,
    )


def parse_code(sec: Section) -> Tuple[Optional[str], Optional[str]]:
    """(code dir to ship, working dir in the image): `workingDir` says the code is in the image
    (an absolute path there, or . for the image's own) and nothing is shipped; without it the
    experiment's trialCodeDirectory, passed down by the config layer, is packed and shipped."""
    working_key, working = sec.raw("workingDir")
    code_key, code_dir = sec.raw("trialCodeDirectory")
    if working is not None:
        return None, _working_dir(sec.text("workingDir"), sec.at(working_key))
    return (None if code_dir is None else checked_code_dir(code_dir, sec.at(code_key))), None


def _working_dir(path: Optional[str], where: str) -> Optional[str]:
    """An absolute path in the image; "." (NNI's examples) is the image's own working directory."""
    if path is None or path.strip() in (".", "./"):
        return None
    if not path.startswith("/"):
        schema.report(UserError(f"{path!r} is relative, but it names a directory inside the container", where,
                                "give an absolute path in the image, like /workspace, or . for the image's own"))
        return None
    return path


def parse_priority_classes(sec: Section) -> Tuple[Tuple[int, str], ...]:
    """`priorityClasses: {PRIORITY: CLASS, ...}`: trial priorities mapped to the cluster's PriorityClass names."""
    key, value = sec.raw("priorityClasses")
    if value is None:
        return ()
    fix = "map trial priorities to PriorityClass names, like {1: high-priority, 42: normal-priority}"
    if not isinstance(value, dict):
        raise UserError(f"expected a mapping, got {value!r}", sec.at(key), fix)
    out = []
    for priority, name in value.items():
        number = validation.priority(priority, sec.at(key))
        where = f"{sec.at(key)}.{number}"
        if not isinstance(name, str):
            raise UserError(f"{schema.show(name)} is not a PriorityClass name", where, fix)
        out.append((number, validation.dns_subdomain(name, where, "PriorityClass")))
    return tuple(sorted(out))


def priority_class(classes: Tuple[Tuple[int, str], ...], priority: int) -> Optional[str]:
    """The class of the smallest mapped priority at or above `priority` (smaller numbers go first, as in the
    job queue); None above them all."""
    for threshold, name in classes:
        if threshold >= priority:
            return name
    return None


def parse_pull_secrets(sec: Section) -> Tuple[str, ...]:
    """`imagePullSecrets: [{name: S}, ...]` as in a pod spec (a bare name is accepted too)."""
    key, value = sec.raw("imagePullSecrets")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise UserError(f"expected a list, got {type(value).__name__}", sec.at(key), "write - name: SECRET")
    names = []
    for i, item in enumerate(value):
        where = f"{sec.at(key)}[{i}]"
        if isinstance(item, str):
            names.append(validation.dns_subdomain(item, where, "Secret"))
            continue
        entry = Section(item, where)
        name = entry.text("name")
        entry.finish()
        if name is None:
            raise UserError("an image pull secret needs a name", where, "write - name: SECRET")
        names.append(validation.dns_subdomain(name, f"{where}.name", "Secret"))
    return tuple(names)


def parse_grace(sec: Section) -> Tuple[int, int]:
    """(keeper grace, pod termination grace): the pod's always the longer, by the flush time."""
    keeper = sec.integer("keeperGraceSeconds", minimum=1)
    termination = sec.integer("terminationGracePeriodSeconds", minimum=1)
    if keeper is None and termination is None:
        keeper = int(envnames.DEFAULT_GRACE_SECONDS)
    if termination is None:
        termination = keeper + layout.CLEANUP_MARGIN_SECONDS
    if keeper is None:
        keeper = termination - layout.CLEANUP_MARGIN_SECONDS
        if keeper < 1:
            raise UserError(
                f"{termination} s leaves the keeper no time to stop the trial",
                sec.at("terminationGracePeriodSeconds"),
                f"use at least {1 + layout.CLEANUP_MARGIN_SECONDS}",
            )
    if termination <= keeper:
        raise UserError(
            f"must be greater than keeperGraceSeconds ({keeper}), or Kubernetes kills the trial before the keeper stops it",
            sec.at("terminationGracePeriodSeconds"),
            f"use at least {keeper + layout.CLEANUP_MARGIN_SECONDS}",
        )
    return keeper, termination


@dataclass(frozen=True)
class AzureStorage:
    """An Azure File share mounted in every pod (NNI's `azureStorage`); the storage account's key
    is read from Azure Key Vault when the experiment starts and kept in a Secret, never rendered."""

    account: str
    share: str
    vault: str  # the Key Vault holding the account's key
    key_name: str  # the name of the secret in that vault
    mount_path: str


STORAGE_TYPES = ("nfs", "azureStorage")


def parse_volume(sec: Section) -> Tuple[Optional[NfsMount], Optional[AzureStorage]]:
    """`nfs: {server, path, containerMountPath}`, or NNI v2's `storage: {storageType: nfs|azureStorage, ...}`."""
    nfs = sec.section("nfs")
    storage = sec.section("storage")
    if nfs and storage:
        raise UserError("nfs and storage both describe the NFS volume", sec.where, "keep only nfs")
    nfs = nfs or storage
    if nfs is None:
        return None, None
    if nfs is storage:
        kind = storage.text("storageType", default="nfs")
        if kind not in STORAGE_TYPES:
            raise UserError(
                f"storage type {kind!r} is not supported",
                storage.at("storageType"),
                "use nfs or azureStorage, or mount your volume through a trialTemplate",
            )
        if kind == "azureStorage":
            return None, parse_azure(storage)
    return parse_nfs(nfs), None


def parse_azure(sec: Section) -> Optional[AzureStorage]:
    """`storage: {storageType: azureStorage, azureAccount, azureShare, keyVaultName, keyVaultKey, containerMountPath}`."""
    values = {key: sec.text(key) for key in ("azureAccount", "azureShare", "keyVaultName", "keyVaultKey")}
    mount_path = sec.text("containerMountPath", default=DEFAULT_NFS_MOUNT)
    for key, value in values.items():
        if value is None:
            schema.report(UserError(f"Azure File storage needs {key}", sec.at(key)))
    if not mount_path.startswith("/"):
        schema.report(UserError(f"{mount_path!r} is not an absolute path", sec.at("containerMountPath")))
    sec.finish()
    if None in values.values():
        return None
    return AzureStorage(values["azureAccount"], values["azureShare"], values["keyVaultName"], values["keyVaultKey"],
                        mount_path)


def parse_nfs(nfs: Section) -> Optional[NfsMount]:
    server, path = nfs.text("server"), nfs.text("path")
    mount_path = nfs.text("containerMountPath", default=DEFAULT_NFS_MOUNT)
    # Reported, not raised: the section's other problems are found too.
    for key, value in (("server", server), ("path", path)):
        if value is None:
            schema.report(UserError(f"the NFS volume needs a {key}", nfs.at(key)))
    if not mount_path.startswith("/"):
        schema.report(UserError(f"{mount_path!r} is not an absolute path", nfs.at("containerMountPath")))
    nfs.finish()
    return NfsMount(server=server, path=path, mount_path=mount_path) if server and path else None


def shared_dirs(config: Any) -> Tuple[str, ...]:
    """Where every trial pod of the experiment sees the same files: its NFS or Azure File share's mount path
    (the config layer's hook: PBT's all_checkpoint_dir must be under one). A checkpoint claim is not one: each
    trial has its own."""
    common = config.common
    return tuple(volume.mount_path for volume in (common.nfs, common.azure) if volume is not None)


def manager_address(value: Any, where: str) -> str:
    """The address pods reach the manager at: never loopback; default: this machine's first other one."""
    if value is None:
        return default_manager_address(where)
    text = schema.as_str(value, where).strip()
    why = unreachable(text)
    if why:
        raise UserError(
            f"{text} is {why}, which pods cannot reach",
            where,
            "set managerAddress to an address of this machine that the cluster can reach",
        )
    return text


def unreachable(host: str) -> Optional[str]:
    """Why no pod can reach the manager at `host`, or None when one may."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return "a loopback address"
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return None  # a host name: the cluster's DNS decides
    if address.is_loopback:
        return "a loopback address"
    if address.is_unspecified:
        return "the unspecified address"
    return None


def default_manager_address(where: str) -> str:
    import psutil  # a core dependency; imported here because only this default needs it

    for family in (socket.AF_INET, socket.AF_INET6):
        for addresses in psutil.net_if_addrs().values():
            for item in addresses:
                if item.family != family:
                    continue
                address = ipaddress.ip_address(item.address.split("%")[0])
                if not (address.is_loopback or address.is_link_local):
                    return str(address)
    raise UserError("this machine has no non-loopback address for pods to reach the manager at", where, "set managerAddress")


def load_user_template(path: str, where: str, kinds: Sequence[str]) -> dict:
    """A user's job template (Katib-style trialTemplate): one YAML object of one of `kinds`."""
    template = schema.read_data_file(Path(path).expanduser(), where)
    if not isinstance(template, dict) or template.get("kind") not in kinds:
        found = template.get("kind") if isinstance(template, dict) else type(template).__name__
        raise UserError(f"{path} holds {found!r}, not a job template", where, "its kind must be one of: " + ", ".join(kinds))
    return template


# --- NNI v1 --------------------------------------------------------------

_V1_ROLE_KEYS = {"taskNum": "taskNumber", "gpuNum": "gpuNumber", "cpuNum": "cpuNumber", "image": "dockerImage"}


def v1_role(role: Any) -> Any:
    """A v1 role (`taskNum`, `gpuNum`, `memoryMB`, `image`, ...) in v2 spelling."""
    if not isinstance(role, dict):
        return role  # parse_section reports it, with its place
    out = {}
    for key, value in role.items():
        if key == "memoryMB":
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 2 ** 63
            out["memorySize"] = f"{value}mb" if number else value  # parse_size_mib names what is not a size
        else:
            out[_V1_ROLE_KEYS.get(key, key)] = value
    return out


# Keys of v1's `trial:` section that the config layer reads for every platform.
V1_TRIAL_KEYS = ("command", "codeDir")


def v1_trial(v1: dict, known: Sequence[str]) -> dict:
    """v1's `trial:` section, refusing a key this platform would not read (a
    misspelled gpuNum would otherwise run the trial without a GPU)."""
    trial = v1.get("trial") or {}
    if not isinstance(trial, dict):
        raise UserError(f"expected a mapping, got {type(trial).__name__}", "trial")
    choices = sorted({*V1_TRIAL_KEYS, *known})
    for key in trial:
        if key not in choices:
            raise schema.unknown("key", key, choices, f"trial.{key}")
    return trial


def v1_where(section_key: str, roles: Sequence[Tuple[str, str]] = ()) -> List[Tuple[str, str]]:
    """(v2 path, v1 path) pairs naming where v1_common and the platform's roles took each key from;
    the catch-all `trainingService` -> `section_key` comes last."""
    return list(roles) + [
        ("trainingService.managerAddress", "nniManagerIp"),
        ("trainingService.storage.storageType", f"{section_key}.storage"),
        *((f"trainingService.storage.{new}", f"{section_key}.{group}.{old}") for group, old, new in V1_AZURE_KEYS),
        ("trainingService.storage", f"{section_key}.nfs"),
        ("trainingService", section_key),
    ]


# NNI v1's `azureStorage: {accountName, azureShare}` and `keyVault: {vaultName, name}`, as v2 names them.
V1_AZURE_KEYS = (("azureStorage", "accountName", "azureAccount"), ("azureStorage", "azureShare", "azureShare"),
                 ("keyVault", "vaultName", "keyVaultName"), ("keyVault", "name", "keyVaultKey"))


def v1_azure(storage_section: dict) -> dict:
    out = {"storageType": "azureStorage"}
    for group, old, new in V1_AZURE_KEYS:
        part = storage_section.get(group)
        if isinstance(part, dict) and part.get(old) is not None:
            out[new] = part[old]
    return out


def v1_common(v1: dict, platform: str, storage_section: Optional[dict] = None) -> dict:
    """The v2 keys every platform takes from a v1 config: manager address, NFS storage."""
    out: Dict[str, Any] = {"platform": platform}
    if v1.get("nniManagerIp") is not None:
        out["managerAddress"] = v1["nniManagerIp"]
    storage_section = storage_section or {}
    if not isinstance(storage_section, dict):
        raise UserError(f"expected a mapping of keys to values, got {schema.show(storage_section)}", f"{platform}Config",
                        "write it as `key: value` lines")
    kind = storage_section.get("storage", "nfs" if "nfs" in storage_section else None)
    if kind == "azureStorage":
        out["storage"] = v1_azure(storage_section)
    elif kind is not None:
        nfs = storage_section.get("nfs")
        out["storage"] = dict(nfs, storageType=kind) if isinstance(nfs, dict) else {"storageType": kind}
    for key, value in storage_section.items():
        if key not in ("storage", "nfs", "azureStorage", "keyVault"):
            out[key] = value
    return out


# -- NNI's custom FrameworkController config (trainingService.configPath) ----------------------------
FRAMEWORK = "Framework"
_TRIAL_CONTAINER = "trial"  # frameworkcontroller.CONTAINER: the container render fills with the keeper


def custom_framework(path: str, where: str) -> dict:
    """The Framework a configPath names, as the job template: each task's first container is the
    trial's, whose command the keeper runs (NNI replaces that container's command with its own script)."""
    framework = load_user_template(path, where, [FRAMEWORK])
    for role in _framework_roles(framework, where):
        containers = role["task"]["pod"]["spec"]["containers"]
        containers[0]["name"] = _TRIAL_CONTAINER
    return framework


def framework_task_roles(path: str, where: str) -> List[Dict[str, Any]]:
    """The taskRoles of a configPath's Framework, as NNI 3.0 reads them (parseCustomTaskRoles): the
    first container's command (a list quoted into one line, where NNI joins it with spaces) and
    image; the task's gpuNum (0), cpuNum (1), memoryMB (8192); the role's completion policy, which
    the Framework NNI submits keeps (one failed task fails the trial when none)."""
    import shlex

    roles = []
    for role in _framework_roles(load_user_template(path, where, [FRAMEWORK]), where):
        task, container = role["task"], role["task"]["pod"]["spec"]["containers"][0]
        command = container.get("command")
        roles.append({
            "name": role.get("name"),
            "taskNumber": role.get("taskNumber") or 1,
            "command": shlex.join(map(str, command)) if isinstance(command, list) else command,
            "dockerImage": container.get("image"),
            "gpuNumber": task.get("gpuNum") or 0,
            "cpuNumber": task.get("cpuNum") or 1,
            "memoryMB": task.get("memoryMB") or 8192,
            "frameworkAttemptCompletionPolicy": role.get("frameworkAttemptCompletionPolicy")
            or task.get("frameworkAttemptCompletionPolicy") or {"minFailedTaskCount": 1, "minSucceededTaskCount": -1},
        })
    return roles


def _framework_roles(framework: dict, where: str) -> List[dict]:
    roles = (framework.get("spec") or {}).get("taskRoles")
    shaped = isinstance(roles, list) and roles and all(
        isinstance(r, dict) and isinstance(((r.get("task") or {}).get("pod") or {}).get("spec"), dict)
        and (r["task"]["pod"]["spec"].get("containers") or [None])[0] for r in roles)
    if not shaped:
        raise UserError("the Framework has no spec.taskRoles[].task.pod.spec.containers", where,
                        "give each task role a pod with its container, as FrameworkController's Framework "
                        "format has it")
    return roles
