"""Kubeflow's training-operator: one PyTorchJob or TFJob (kubeflow.org/v1) per trial.

Config (NNI-compatible): `operator: pytorch-operator|tf-operator`, roles
`master`, `worker`, `ps` with `replicas`, `command`, `dockerImage`,
`cpuNumber`, `gpuNumber`, `memorySize`, plus the options every Kubernetes
platform has (k8s_config.parse_common).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Mapping, Optional, Tuple

from trialkit import schema
from trialkit.errors import UserError
from trialkit.platforms.kubernetes import render as k8s
from trialkit.statuses import FAILED, RUNNING, SUCCEEDED, WAITING
from trialkit.platforms.base import PlatformStatus, TrialSpec
from trialkit import env as envnames
from trialkit.platforms.kubernetes.config import (
    KubeCommon,
    Role,
    Section,
    Storage,
    check_images,
    parse_common,
    parse_role,
    parse_storage,
    resolve_paths,  # noqa: F401 - the config layer's hook: code dirs made absolute
    reporting_role,
    v1_common,
    v1_role,
    v1_trial,
    v1_where,
)
from trialkit.platforms.kubernetes.platform import KubePlatform

PLATFORM = "kubeflow"
ROLES = ("master", "worker", "ps")
# Older NNI configs name retired versions; training-operator serves v1 only,
# and the objects are the same, so they are rendered as v1.
API_VERSIONS = ("v1", "v1alpha2", "v1beta1", "v1beta2")
# Pods and their Services are named <job>-<replica type>-<index>, and a
# Service name is a DNS label: leave room for "-worker-" and the index.
NAME_BUDGET = 48
# training-operator labels each pod with its index within its replica type.
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"


@dataclass(frozen=True)
class Operator:
    kind: str
    template: str
    replicas_field: str
    container: str
    replica_types: Mapping[str, str]  # config role -> replica type
    required_role: str


OPERATORS = {
    "pytorch-operator": Operator(
        "PyTorchJob", "pytorchjob.yaml", "pytorchReplicaSpecs", "pytorch", {"master": "Master", "worker": "Worker"}, "master"
    ),
    # TensorFlow calls its master the chief.
    "tf-operator": Operator(
        "TFJob", "tfjob.yaml", "tfReplicaSpecs", "tensorflow", {"master": "Chief", "worker": "Worker", "ps": "PS"}, "worker"
    ),
}


@dataclass(frozen=True)
class KubeflowConfig:
    operator: str
    roles: Tuple[Role, ...]
    common: KubeCommon
    reporting_role: str = "master"
    storage: Optional[Storage] = None  # the checkpoint claim; None: checkpoints on the pod's disk
    platform: ClassVar[str] = PLATFORM


def parse_section(section: dict, where: str) -> KubeflowConfig:
    sec = Section(section, where)
    name = sec.text("operator", default="pytorch-operator")
    if name not in OPERATORS:
        raise UserError(f"unknown operator {name!r}", sec.at("operator"), "use pytorch-operator or tf-operator")
    operator = OPERATORS[name]
    api_version = sec.text("apiVersion", default="v1")
    if api_version not in API_VERSIONS:
        raise UserError(f"unknown apiVersion {api_version!r}", sec.at("apiVersion"), "use v1")
    roles = []
    for role_name in ROLES:
        role_sec = sec.section(role_name)
        if role_sec is None:
            continue
        if role_name not in operator.replica_types:
            raise UserError(f"{name} has no {role_name} role", role_sec.where, "use " + " and ".join(operator.replica_types))
        roles.append(parse_role(role_sec, role_name, ("replicas",)))
        role_sec.finish()
    if operator.required_role not in [role.name for role in roles]:
        role = operator.required_role
        raise UserError(f"{name} needs a {role} role", where, f"add {role}: {{replicas: 1, command: ...}}")
    by_name = {role.name: role for role in roles}
    if name == "pytorch-operator" and by_name["master"].count != 1:
        schema.report(UserError("a PyTorchJob has exactly one master", f"{where}.master.replicas",
                                "use replicas: 1 and add workers"))
    common = parse_common(sec, [operator.kind])
    check_images(roles, common, where)
    reporter = reporting_role(sec, [role.name for role in roles])
    storage = parse_storage(sec)
    sec.finish()
    return KubeflowConfig(operator=name, roles=tuple(roles), common=common, reporting_role=reporter, storage=storage)


# A v1 config's errors name its keys: trainingService.worker.X is trial.worker.X there, the rest kubeflowConfig's.
V1_WHERE = v1_where("kubeflowConfig", [(f"trainingService.{role}", f"trial.{role}") for role in ROLES])


def from_v1(v1_config: dict) -> dict:
    """NNI v1 (`trainingServicePlatform: kubeflow`, roles under `trial:`, `kubeflowConfig:`) as a v2 section."""
    kubeflow_config = v1_config.get("kubeflowConfig") or {}
    trial = v1_trial(v1_config, ROLES)
    out = v1_common(v1_config, PLATFORM, kubeflow_config)
    out.update({role: v1_role(trial[role]) for role in ROLES if role in trial})
    return out


def render(config: KubeflowConfig, spec: TrialSpec) -> List[dict]:
    operator = OPERATORS[config.operator]
    names = k8s.trial_names(spec, NAME_BUDGET)
    job = k8s.job_object(config.common, operator.template, names)
    job["apiVersion"] = "kubeflow.org/v1"
    job_spec = job.setdefault("spec", {})
    entries = job_spec.get(operator.replicas_field) or {}
    replica_specs: Dict[str, dict] = {}
    claims, mounts, checkpoint_env = k8s.checkpoint_storage(config.common, names, config.storage)
    offset = 0  # the rank of the role's first pod: Master 0, then the Workers (a PyTorchJob's RANK)
    for role in config.roles:
        replica_type = operator.replica_types[role.name]
        replica = k8s.role_entry(entries, replica_type)
        replica["replicas"] = role.count
        replica.setdefault("restartPolicy", "Never")
        plan = k8s.pod_plan(
            config.common, spec, names, PLATFORM,
            image=role.image, command=role.command, res=role.resources, where=f"trainingService.{role.name}",
            # Every pod runs a keeper with the trial's token: only task 0 of the reporting role ships.
            extra_env={envnames.CHIEF_ROLE: config.reporting_role, envnames.ROLE: role.name,
                       envnames.RANK_OFFSET: str(offset), **checkpoint_env},
            field_env={envnames.TASK_INDEX: f"metadata.labels['{REPLICA_INDEX_LABEL}']"},
            extra_mounts=mounts, code_dir=role.code_dir,
        )
        replica["template"] = k8s.fill_pod(replica.get("template"), plan, operator.container)
        replica_specs[replica_type] = replica
        offset += role.count
    job_spec[operator.replicas_field] = replica_specs
    return k8s.trial_objects(config.common, spec, names, job, claims)


# Conditions that hold ("status": "True"), the most decisive first. The
# operator turns Running off when the job restarts, succeeds or fails.
CONDITIONS = (
    ("Failed", FAILED),
    ("Succeeded", SUCCEEDED),
    ("Suspended", WAITING),
    ("Restarting", RUNNING),
    ("Running", RUNNING),
    ("Created", WAITING),
)


def job_status(job: dict) -> PlatformStatus:
    """A PyTorchJob's or TFJob's status.conditions as a trial status."""
    holding = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    for condition_type, status in CONDITIONS:
        condition = holding.get(condition_type)
        if condition is not None:
            reason = ": ".join(part for part in (condition.get("reason"), condition.get("message")) if part)
            return PlatformStatus(status, reason if status == FAILED else "")
    return PlatformStatus(WAITING)


class Platform(KubePlatform):
    renderer = staticmethod(render)
    mapper = staticmethod(job_status)
