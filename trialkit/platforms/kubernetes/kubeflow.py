"""Kubeflow's training-operator: one PyTorchJob or TFJob (kubeflow.org/v1) per trial; Trainer v2's TrainJob
with `operator: trainjob` (trainjob.py).

Config (NNI-compatible): `operator: pytorch-operator|tf-operator|trainjob` (unset: a PyTorchJob, or a TrainJob
on a cluster that serves only Trainer v2), roles
`master`, `worker`, `ps` with `replicas`, `command`, `dockerImage`,
`cpuNumber`, `gpuNumber`, `memorySize`, plus the options every Kubernetes
platform has (k8s_config.parse_common).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

from trialkit import schema
from trialkit.errors import UserError
from trialkit.platforms.kubernetes import render as k8s
from trialkit.platforms.kubernetes import trainjob
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
    shared_dirs,  # noqa: F401 - the config layer's hook: where PBT's checkpoints may go
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
    # `operator` unset: the TrainJob the section is where the cluster serves Trainer v2 and not PyTorchJob
    # (trainjob.TrainJobConfig), or the UserError saying why it cannot be one; None: the config chose.
    trainjob: Any = None
    assumed: bool = False  # `operator` unset: pytorch-operator was taken (render says so)
    platform: ClassVar[str] = PLATFORM


def parse_section(section: dict, where: str) -> Any:
    """A KubeflowConfig, or with `operator: trainjob` a trainjob.TrainJobConfig."""
    sec = Section(section, where)
    chosen = sec.text("operator")
    name = chosen or "pytorch-operator"
    if name not in OPERATORS and name != trainjob.OPERATOR:
        raise UserError(f"unknown operator {name!r}", sec.at("operator"), "use pytorch-operator, tf-operator or trainjob")
    operator = OPERATORS.get(name, OPERATORS["pytorch-operator"])  # a TrainJob's roles are a PyTorchJob's
    api_version = sec.text("apiVersion", default="v1")
    if api_version not in API_VERSIONS + ((trainjob.API_VERSION.split("/")[1],) if name == trainjob.OPERATOR else ()):
        raise UserError(f"unknown apiVersion {api_version!r}", sec.at("apiVersion"), "use v1")
    runtime = sec.text("runtime")
    if runtime is not None and chosen not in (None, trainjob.OPERATOR):
        raise UserError(f"runtime names a Kubeflow Trainer v2 runtime, which {name} has not", sec.at("runtime"),
                        "remove it, or use operator: trainjob")
    roles = []
    for role_name in ROLES:
        role_sec = sec.section(role_name)
        if role_sec is None:
            continue
        if role_name not in operator.replica_types:
            raise UserError(f"{name} has no {role_name} role", role_sec.where, "use " + " and ".join(operator.replica_types))
        roles.append(parse_role(role_sec, role_name, ("replicas",)))
        role_sec.finish()
    if name == trainjob.OPERATOR:
        trainjob.check_nodes(roles, where)
    common = parse_common(sec, [trainjob.KIND if name == trainjob.OPERATOR else operator.kind])
    if name != trainjob.OPERATOR and operator.required_role not in [role.name for role in roles]:
        role = operator.required_role
        fix = f"add {role}: {{replicas: 1, command: ...}}"
        if chosen is None and common.template is None and _is_trainjob(roles, common, runtime, where):
            fix += ", or set operator: trainjob: Kubeflow Trainer v2 runs this section as it is"
        raise UserError(f"{name} needs a {role} role" + (" (operator is unset: a PyTorchJob is assumed)"
                                                         if chosen is None else ""), where, fix)
    by_name = {role.name: role for role in roles}
    if name == "pytorch-operator" and by_name["master"].count != 1:
        schema.report(UserError("a PyTorchJob has exactly one master", f"{where}.master.replicas",
                                "use replicas: 1 and add workers"))
    check_images(roles, common, where)
    reporter = reporting_role(sec, [role.name for role in roles])
    storage = parse_storage(sec)
    sec.finish()
    if name == trainjob.OPERATOR:
        return trainjob.from_roles(roles, common, storage, runtime, where)
    config = KubeflowConfig(operator=name, roles=tuple(roles), common=common, reporting_role=reporter, storage=storage,
                            assumed=chosen is None)
    if chosen is None and common.template is None:  # a PyTorchJob unless the cluster serves only TrainJobs
        try:
            alternative: Any = trainjob.from_roles(roles, common, storage, runtime, where)
        except UserError as err:
            alternative = err
        config = dataclasses.replace(config, trainjob=alternative)
    return config


# A v1 config's errors name its keys: trainingService.worker.X is trial.worker.X there, the rest kubeflowConfig's.
V1_WHERE = v1_where("kubeflowConfig", [(f"trainingService.{role}", f"trial.{role}") for role in ROLES])


def from_v1(v1_config: dict) -> dict:
    """NNI v1 (`trainingServicePlatform: kubeflow`, roles under `trial:`, `kubeflowConfig:`) as a v2 section."""
    kubeflow_config = v1_config.get("kubeflowConfig") or {}
    trial = v1_trial(v1_config, ROLES)
    out = v1_common(v1_config, PLATFORM, kubeflow_config)
    out.update({role: v1_role(trial[role]) for role in ROLES if role in trial})
    return out


def render(config: Any, spec: TrialSpec) -> List[dict]:
    if isinstance(config, trainjob.TrainJobConfig):
        return trainjob.render(config, spec)
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
    # The operator's default (None) leaves a failed job's still-running pods, and the GPUs they hold, until the
    # job is deleted (keepFinishedJobs: a day after a failure); "Running" ends them with the job and keeps the
    # ended pods' logs. A template's own policy stands.
    job_spec.setdefault("runPolicy", {}).setdefault("cleanPodPolicy", "Running")
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
    """A PyTorchJob's or TFJob's status.conditions as a trial status (a TrainJob's: trainjob.job_status)."""
    if job.get("kind") == trainjob.KIND:
        return trainjob.job_status(job)
    holding = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    for condition_type, status in CONDITIONS:
        condition = holding.get(condition_type)
        if condition is not None:
            reason = ": ".join(part for part in (condition.get("reason"), condition.get("message")) if part)
            return PlatformStatus(status, reason if status == FAILED else "")
    return PlatformStatus(WAITING)


def _is_trainjob(roles: List[Role], common: KubeCommon, runtime: Optional[str], where: str) -> bool:
    """Whether the section's roles make a valid TrainJob (`operator: trainjob`)."""
    try:
        trainjob.from_roles(roles, common, None, runtime, where)
    except UserError:
        return False
    return True


class Platform(KubePlatform):
    renderer = staticmethod(render)
    mapper = staticmethod(job_status)

    def check_ready(self) -> None:
        super().check_ready()
        self._settle()

    def submit(self, spec: TrialSpec) -> str:
        self._settle()
        return super().submit(spec)

    def remove_experiment(self, experiment_id: str, trial_ids) -> List[str]:
        self._settle()
        return super().remove_experiment(experiment_id, trial_ids)

    def experiment_ended(self, experiment_id: str, trial_ids) -> None:
        self._settle()
        super().experiment_ended(experiment_id, trial_ids)

    def _settle(self) -> None:
        """`operator` unset: a PyTorchJob where the cluster serves one, else a TrainJob where it serves Trainer v2
        (API discovery, asked once); a cluster that serves neither is one line."""
        alternative = getattr(self.config, "trainjob", None)
        if alternative is None:
            return
        served = self.client.served([OPERATORS["pytorch-operator"].kind, trainjob.KIND])
        if served == [trainjob.KIND]:
            if isinstance(alternative, UserError):
                raise UserError(f"the cluster serves Kubeflow Trainer v2 (TrainJob), not PyTorchJob, and this section "
                                f"is no TrainJob: {alternative.what}", alternative.where, alternative.fix)
            self.config = alternative
            return
        if not served:
            raise UserError("the cluster serves neither PyTorchJob (kubeflow.org/v1, training-operator) nor TrainJob "
                            "(trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2)", "trainingService.operator",
                            "install one of them in the cluster, or name the operator your cluster has")
        self.config = dataclasses.replace(self.config, trainjob=None)
