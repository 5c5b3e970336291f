"""What the Kubernetes platforms render alike: names, labels, environment, pods.

Pure functions: a parsed config and a TrialSpec go in, plain dicts come out.
The job templates are data in `launchers/` (package `trialkit.launchers`) or a
user's trialTemplate; the renderers fill them and never talk to a cluster.
The trial's pods run `/bin/sh run.sh` with no arguments: the user's command
travels in TRIALKIT_COMMAND and is never pasted into a shell line here.
"""
from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass
from importlib.resources import files
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit, urlunsplit

import yaml

from trialkit import env as envnames
from trialkit import schema
from trialkit.errors import UserError
from trialkit.platforms.base import TrialSpec
from trialkit.platforms.kubernetes import shipping, validation
from trialkit.platforms.kubernetes.config import (AzureStorage, KubeCommon, NfsMount, Resources, Storage,
                                                  priority_class)

LABEL_EXPERIMENT = "trialkit.io/experiment"
LABEL_TRIAL = "trialkit.io/trial"
MAX_NAME = 63  # a DNS label: names that become label values and hostnames
# Where run.sh and cleanup.sh are, in the images (images/) and, from the
# trial's ConfigMap, in every pod.
SCRIPTS_DIR = "/opt/trialkit/scripts"
SCRIPT_FILES = ("run.sh", "cleanup.sh", "fetch.py")
SCRIPT_MODE = 0o755
RUN_COMMAND = ["/bin/sh", f"{SCRIPTS_DIR}/run.sh"]
CLEANUP_COMMAND = ["/bin/sh", f"{SCRIPTS_DIR}/cleanup.sh"]
# The keeper's home in a pod: an emptyDir, so it outlives a container restart.
POD_TRIAL_DIR = "/var/lib/trialkit/trial"
# Where a trial's checkpoint claim is mounted, when the section configures one.
POD_CHECKPOINT_DIR = "/var/lib/trialkit/checkpoint"
GPU_RESOURCE = "nvidia.com/gpu"

# Paths on the control plane's machine mean nothing in a pod. The restart count
# is the store's (one higher at each activate or resume): the keeper counts a
# container restarted in the same pod on top of it (its status in the pod's
# emptyDir), except where the operator counts restarts itself (pod_env).
HOST_ONLY_ENV = frozenset(
    {
        envnames.TRIAL_DIR,
        envnames.OUTPUT_DIR,
        envnames.CHECKPOINT_DIR,
        envnames.SHARE_DIR,
        envnames.TENSORBOARD_DIR,
        envnames.CODE_DIR,
        envnames.PARAMETERS_FILE,
        envnames.CHANNEL,
        envnames.STOP_FILE,
    }
)

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


# --- names and labels ----------------------------------------------------


def object_name(parts: Sequence[str], budget: int = MAX_NAME, separator: str = "-") -> str:
    """A valid, deterministic name from `parts`: lowercase, within `budget`.

    With separator "-" the result is a DNS label; with "" it matches
    FrameworkController's `^[a-z0-9]{1,63}$`. When anything had to change
    (case, characters, length) a hash of the original is appended, so two
    trials never share a name.
    """
    allowed = "a-z0-9-" if separator else "a-z0-9"
    original = "-".join(parts)
    clean = re.sub(f"[^{allowed}]+", separator, separator.join(parts).lower()).strip("-")
    if clean == original and len(clean) <= budget:
        return clean
    digest = hashlib.sha256(original.encode()).hexdigest()[:8]
    return clean[: budget - len(digest) - len(separator)].rstrip("-") + separator + digest


def label_value(text: str) -> str:
    """`text` when it is a valid label value, else a clean prefix and a hash of it."""
    if len(text) <= MAX_NAME and _LABEL_VALUE.match(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[: MAX_NAME - len(digest) - 1].strip("-._")
    return f"{clean}-{digest}" if clean else digest


@dataclass(frozen=True)
class TrialNames:
    """The job's name (its ConfigMap and Secret share it) and the trial's labels."""

    job: str
    experiment_label: str
    trial_label: str

    @property
    def labels(self) -> Dict[str, str]:
        return {LABEL_EXPERIMENT: self.experiment_label, LABEL_TRIAL: self.trial_label}

    @property
    def experiment_labels(self) -> Dict[str, str]:
        return {LABEL_EXPERIMENT: self.experiment_label}


def trial_names(spec: TrialSpec, budget: int = MAX_NAME, separator: str = "-") -> TrialNames:
    return TrialNames(
        job=object_name(["tk", spec.experiment_id, spec.trial_id], budget, separator),
        experiment_label=label_value(spec.experiment_id),
        trial_label=label_value(spec.trial_id),
    )


def metadata(name: str, namespace: str, labels: Mapping[str, str]) -> dict:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


# --- templates -----------------------------------------------------------


def packaged_template(filename: str) -> dict:
    """One of the templates shipped in launchers/ (package data trialkit.launchers)."""
    return yaml.safe_load((files("trialkit.launchers") / filename).read_text(encoding="utf-8"))


def job_object(common: KubeCommon, template_file: str, names: TrialNames) -> dict:
    """The job from the user's trialTemplate or the packaged one, named and labelled."""
    job = copy.deepcopy(common.template) if common.template is not None else packaged_template(template_file)
    meta = job.get("metadata") or {}
    meta.update(metadata(names.job, common.namespace, {**meta.get("labels", {}), **names.labels}))
    meta.pop("generateName", None)  # the name is trialkit's: deterministic per trial
    job["metadata"] = meta
    job.pop("status", None)
    return job


def role_entry(entries: Mapping[str, dict], key: str) -> dict:
    """A copy of the template's entry for `key`, else of its first entry."""
    if key in entries:
        return copy.deepcopy(entries[key])
    return copy.deepcopy(next(iter(entries.values()), {}))


# --- one trial's pods ----------------------------------------------------


@dataclass(frozen=True)
class Mount:
    volume: dict
    path: str
    read_only: bool = False

    def volume_mount(self) -> dict:
        item = {"name": self.volume["name"], "mountPath": self.path}
        if self.read_only:
            item["readOnly"] = True
        return item


def claim_mount(volume_name: str, claim: str, path: str) -> Mount:
    return Mount({"name": volume_name, "persistentVolumeClaim": {"claimName": claim}}, path)


def nfs_mount(nfs: NfsMount) -> Mount:
    return Mount({"name": "trialkit-nfs", "nfs": {"server": nfs.server, "path": nfs.path}}, nfs.mount_path)


# The keys Kubernetes' azureFile volume reads from its Secret.
AZURE_ACCOUNT_NAME = "azurestorageaccountname"
AZURE_ACCOUNT_KEY = "azurestorageaccountkey"


def azure_secret_name(names: TrialNames) -> str:
    """The experiment's Secret for its Azure File share: one for all its trials."""
    return object_name(["tk", names.experiment_label, "azure-storage"])


def trial_service_account_name(names: TrialNames) -> str:
    """The experiment's ServiceAccount for its trial pods: one for all its trials, bound to no role."""
    return object_name(["tk", names.experiment_label, "trial"])


def trial_service_account(names: TrialNames, namespace: str) -> dict:
    """A ServiceAccount with no rights, and no token in the pods: training code needs no API access, and must
    not borrow the namespace's default account (or an operator's, as NNI's FrameworkController docs suggest)."""
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": metadata(trial_service_account_name(names), namespace, names.experiment_labels),
            "automountServiceAccountToken": False}


def azure_mount(azure: AzureStorage, names: TrialNames) -> Mount:
    volume = {"name": "trialkit-azure", "azureFile": {"secretName": azure_secret_name(names), "shareName": azure.share,
                                                      "readOnly": False}}
    return Mount(volume, azure.mount_path)


def azure_secret(azure: AzureStorage, names: TrialNames, namespace: str) -> dict:
    """The share's Secret without the account key: submission reads the key from Key Vault and fills it."""
    secret = packaged_template("secret.yaml")
    secret["metadata"] = metadata(azure_secret_name(names), namespace, names.experiment_labels)
    return secret


def base_mounts(common: KubeCommon, names: TrialNames) -> List[Mount]:
    """Every trial pod's volumes: the scripts, the keeper's home, the user's NFS or Azure File share."""
    mounts = [
        Mount(
            {"name": "trialkit-scripts", "configMap": {"name": names.job, "defaultMode": SCRIPT_MODE}},
            SCRIPTS_DIR,
            read_only=True,
        ),
        Mount({"name": "trialkit-trial", "emptyDir": {}}, POD_TRIAL_DIR),
    ]
    if common.nfs:
        mounts.append(nfs_mount(common.nfs))
    if common.azure:
        mounts.append(azure_mount(common.azure, names))
    return mounts


def resources(res: Resources) -> dict:
    """Requests equal to limits: GPUs must be so, and a trial's speed should not vary."""
    amounts: Dict[str, str] = {}
    if res.cpu:
        amounts["cpu"] = str(int(res.cpu)) if float(res.cpu).is_integer() else f"{max(1, round(res.cpu * 1000))}m"
    if res.memory_mib:
        amounts["memory"] = f"{res.memory_mib}Mi"
    if res.gpu:
        amounts[GPU_RESOURCE] = str(res.gpu)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def pod_manager_url(url: str, address: str) -> str:
    """The manager's URL with the host that pods reach it at (managerAddress)."""
    parts = urlsplit(url)
    host = f"[{address}]" if ":" in address else address
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def secret_env_names(spec: TrialSpec) -> List[str]:
    return sorted(name for name in spec.env if name in spec.secret_env)


def pod_env(
    common: KubeCommon,
    spec: TrialSpec,
    names: TrialNames,
    platform: str,
    command: str,
    extra: Optional[Mapping[str, str]] = None,
    fields: Optional[Mapping[str, str]] = None,
    operator_counts_restarts: bool = False,
) -> List[dict]:
    """The environment contract as container env; secrets by reference to the trial's Secret;
    `fields` (name -> fieldPath) from the pod's own metadata (the downward API). Where the operator
    counts restarts (AdaptDL's ADAPTDL_NUM_RESTARTS, one higher at each rescale), a count fixed in
    the template would hide its count from the keeper: the store's is left out."""
    dropped = HOST_ONLY_ENV | {envnames.RESTART_COUNT} if operator_counts_restarts else HOST_ONLY_ENV
    values = {key: value for key, value in spec.public_env().items() if key not in dropped}
    if envnames.MANAGER_URL in values:
        values[envnames.MANAGER_URL] = pod_manager_url(values[envnames.MANAGER_URL], common.manager_address)
    values.update(
        {
            envnames.EXPERIMENT_ID: spec.experiment_id,
            envnames.TRIAL_ID: spec.trial_id,
            envnames.SEQUENCE: str(spec.sequence),
            envnames.PLATFORM: platform,
            envnames.TRIAL_DIR: POD_TRIAL_DIR,
            envnames.GRACE_SECONDS: str(common.keeper_grace_seconds),
            # What the pod's terminationGracePeriodSeconds gives the keeper: it warns of a grace that does not fit.
            envnames.TERMINATION_GRACE: str(common.termination_grace_seconds),
            envnames.COMMAND: command,
        }
    )
    values.update(extra or {})
    env = [{"name": key, "value": str(value)} for key, value in sorted(values.items())]
    env += [{"name": key, "valueFrom": {"fieldRef": {"fieldPath": path}}} for key, path in sorted((fields or {}).items())]
    env += [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": names.job, "key": key}}}
        for key in secret_env_names(spec)
    ]
    return env


@dataclass(frozen=True)
class PodPlan:
    """What trialkit puts into one role's pod template."""

    labels: Dict[str, str]
    image: str
    env: List[dict]
    resources: dict
    mounts: List[Mount]
    termination_grace_seconds: int
    service_account: Optional[str]  # the config's serviceAccountName
    default_service_account: str  # without one in the config or the template: trialkit's own (trial_service_account)
    image_pull_secrets: Tuple[str, ...]
    priority_class: Optional[str]  # from the trial's priority, where priorityClasses maps it
    working_dir: Optional[str] = None  # the code's place in the image, when it is not shipped
    env_from_secrets: Tuple[str, ...] = ()  # Secrets whose keys become variables (a checkpoint store's credentials)


def pod_plan(
    common: KubeCommon,
    spec: TrialSpec,
    names: TrialNames,
    platform: str,
    *,
    image: Optional[str],
    command: Optional[str],
    res: Resources,
    where: str,
    extra_env: Optional[Mapping[str, str]] = None,
    field_env: Optional[Mapping[str, str]] = None,
    extra_mounts: Sequence[Mount] = (),
    code_dir: Optional[str] = None,
    operator_counts_restarts: bool = False,
) -> PodPlan:
    """The plan for a role: its own image, command and code dir, else the section's, else the trial's.
    The code dir is shipped (run.sh fetches it); without one the code is in the image, at workingDir."""
    # Reported, not raised: render_trial names every role's problems at once.
    image = image or common.image or spec.image
    try:
        if not image:
            raise UserError("no image to run the trial in", f"{where}.dockerImage", "set dockerImage or image")
        validation.image(image, f"{where}.dockerImage")  # whatever gave it: the kubelet must be able to pull it
    except UserError as err:
        schema.report(err)
    command = command or spec.command
    if not command or not command.strip():
        schema.report(UserError("no command to run", f"{where}.command", "set command here or trialCommand"))
        command = ""
    mounts = base_mounts(common, names) + list(extra_mounts)
    paths = [mount.path for mount in mounts]
    if len(set(paths)) != len(paths):
        taken = next(path for path in paths if paths.count(path) > 1)
        schema.report(UserError(
            f"trialkit mounts its own volume at {taken}", "trainingService.nfs.containerMountPath", "choose another path"
        ))
    code_dir = code_dir or common.code_dir
    fetched = shipping.pod_env(code_dir)
    return PodPlan(
        labels=names.labels,
        image=image,
        env=pod_env(common, spec, names, platform, command, {**fetched, **(extra_env or {})}, field_env,
                    operator_counts_restarts),
        resources=resources(res),
        mounts=mounts,
        termination_grace_seconds=common.termination_grace_seconds,
        service_account=common.service_account,
        default_service_account=trial_service_account_name(names),
        image_pull_secrets=common.image_pull_secrets,
        priority_class=priority_class(common.priority_classes, spec.priority),
        working_dir=None if code_dir else common.working_dir,
        env_from_secrets=spec.env_from_secrets,
    )


def _replace_named(existing: Iterable[dict], ours: Sequence[dict], key: str = "name") -> List[dict]:
    """`existing` without the entries `ours` replaces, then `ours`: filling twice changes nothing."""
    taken = {item[key] for item in ours}
    return [item for item in existing if item.get(key) not in taken] + list(ours)


def fill_pod(template: Optional[dict], plan: PodPlan, container_name: str) -> dict:
    """A pod template from `template` (kept: what trialkit does not set) and `plan`."""
    pod = copy.deepcopy(template) if template else {}
    meta = pod.setdefault("metadata", {})
    meta["labels"] = {**meta.get("labels", {}), **plan.labels}
    spec = pod.setdefault("spec", {})
    spec["terminationGracePeriodSeconds"] = plan.termination_grace_seconds
    spec["serviceAccountName"] = plan.service_account or spec.get("serviceAccountName") or plan.default_service_account
    if plan.priority_class:
        spec["priorityClassName"] = plan.priority_class
    if plan.image_pull_secrets:
        secrets = [{"name": name} for name in plan.image_pull_secrets]
        spec["imagePullSecrets"] = _replace_named(spec.get("imagePullSecrets", []), secrets)
    spec["volumes"] = _replace_named(spec.get("volumes", []), [mount.volume for mount in plan.mounts])

    containers = spec.setdefault("containers", [])
    container = next((c for c in containers if c.get("name") == container_name), None)
    if container is None:
        container = {"name": container_name}
        containers.insert(0, container)
    container["image"] = plan.image
    if plan.working_dir:
        container["workingDir"] = plan.working_dir
    container["command"] = list(RUN_COMMAND)
    container.pop("args", None)  # run.sh would take them for the trial's command
    container["env"] = _replace_named(container.get("env", []), plan.env)
    if plan.env_from_secrets:
        ours = [{"secretRef": {"name": name}} for name in plan.env_from_secrets]
        container["envFrom"] = [item for item in container.get("envFrom", []) if item not in ours] + ours
    if plan.resources:
        current = container.get("resources", {})
        container["resources"] = {part: {**current.get(part, {}), **plan.resources[part]} for part in ("requests", "limits")}
    ours = [mount.volume_mount() for mount in plan.mounts]
    paths = {mount["mountPath"] for mount in ours}
    kept = [mount for mount in container.get("volumeMounts", []) if mount.get("mountPath") not in paths]
    container["volumeMounts"] = _replace_named(kept, ours)
    # Pod deletion runs cleanup.sh first: it asks the keeper to stop the trial
    # and waits (bounded) for the checkpoint, then Kubernetes' SIGTERM follows.
    container["lifecycle"] = {**container.get("lifecycle", {}), "preStop": {"exec": {"command": list(CLEANUP_COMMAND)}}}
    return pod


# --- the objects besides the job -----------------------------------------


def read_script(filename: str) -> str:
    return (files("trialkit.scripts") / filename).read_text(encoding="utf-8")


def scripts_configmap(names: TrialNames, namespace: str) -> dict:
    configmap = packaged_template("configmap.yaml")
    configmap["metadata"] = metadata(names.job, namespace, names.labels)
    configmap["data"] = {name: read_script(name) for name in SCRIPT_FILES}
    return configmap


def secret_object(names: TrialNames, namespace: str) -> dict:
    """The trial's Secret, without its values: render never writes a secret."""
    secret = packaged_template("secret.yaml")
    secret["metadata"] = metadata(names.job, namespace, names.labels)
    return secret


def claim_object(name: str, namespace: str, labels: Mapping[str, str], storage_class: Optional[str], size_mib: int) -> dict:
    claim = packaged_template("pvc.yaml")
    claim["metadata"] = metadata(name, namespace, labels)
    claim["spec"]["resources"]["requests"]["storage"] = f"{size_mib}Mi"
    if storage_class:
        claim["spec"]["storageClassName"] = storage_class
    return claim


def checkpoint_claim_name(names: TrialNames) -> str:
    return f"{names.job}-checkpoint"


def checkpoint_storage(
    common: KubeCommon, names: TrialNames, storage: Optional[Storage], path: str = POD_CHECKPOINT_DIR
) -> Tuple[List[dict], List[Mount], Dict[str, str]]:
    """The trial's checkpoint claim, its mount and the variable naming it; nothing without storage
    (then the checkpoint dir is on the pod's own disk and a pause loses it)."""
    if storage is None:
        return [], [], {}
    name = checkpoint_claim_name(names)
    claim = claim_object(name, common.namespace, names.labels, storage.storage_class, storage.size_mib)
    return [claim], [claim_mount("trialkit-checkpoint", name, path)], {envnames.CHECKPOINT_DIR: path}


def trial_objects(
    common: KubeCommon, spec: TrialSpec, names: TrialNames, job: dict, extra: Sequence[dict] = ()
) -> List[dict]:
    """Everything to submit, in order: what the job's pods need first, the job last."""
    objects = [secret_object(names, common.namespace)] if secret_env_names(spec) else []
    if common.service_account is None:
        objects.append(trial_service_account(names, common.namespace))
    if common.azure:
        objects.append(azure_secret(common.azure, names, common.namespace))
    return objects + [scripts_configmap(names, common.namespace), *extra, job]


def with_secrets(objects: Sequence[dict], spec: TrialSpec, storage: Optional[Mapping[str, str]] = None) -> List[dict]:
    """`objects` with their Secrets holding their values, done at submission only: the trial's its token,
    the experiment's Azure File Secret `storage` (azure_values)."""
    values = {name: spec.env[name] for name in secret_env_names(spec)}
    out = []
    for obj in objects:
        if obj["kind"] == "Secret":
            obj = {**obj, "stringData": dict(values if LABEL_TRIAL in obj["metadata"]["labels"] else storage or {})}
        out.append(obj)
    return out


def azure_values(azure: AzureStorage, key: str) -> Dict[str, str]:
    """What the Azure File share's Secret holds: the storage account and its key."""
    return {AZURE_ACCOUNT_NAME: azure.account, AZURE_ACCOUNT_KEY: key}


def render_trial(platform_config, spec: TrialSpec) -> List[dict]:
    """Every object that submitting `spec` on this platform creates (`trialkit render`; in a Kueue pool,
    kueue.into_queue then labels the job); a refusal names every problem found."""
    from trialkit.platforms import load

    with schema.every_problem():
        return load(platform_config.platform).render(platform_config, spec)


def render_notes(platform_config) -> List[str]:
    """What a run decides that `render` can only assume: the operator, where the section leaves it to the
    cluster."""
    if not getattr(platform_config, "assumed", False):  # kubeflow with `operator` unset (kubeflow.py)
        return []
    head = "operator is unset: rendered as a PyTorchJob (training-operator)"
    alternative = platform_config.trainjob
    if alternative is None:  # a trialTemplate: a PyTorchJob, whatever else the cluster serves
        return [f"{head}, the kind of its trialTemplate, as a run submits it on any cluster "
                "(set operator to name another)"]
    where_v2 = (f"fails, as this section is no TrainJob ({alternative.what})" if isinstance(alternative, UserError)
                else "submits a TrainJob instead (render it with operator: trainjob)")
    return [f"{head}, as a run submits where the cluster serves PyTorchJob; where it serves only Kubeflow "
            f"Trainer v2, a run {where_v2}"]
