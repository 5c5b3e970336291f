"""Kubeflow Trainer v2: one TrainJob (trainer.kubeflow.org/v1alpha1) per trial.

Config: NNI's Kubeflow section (v1 or v2 format) with `operator: trainjob`
(kubeflow.py reads the section and hands the roles here), `runtime` naming
the ClusterTrainingRuntime (default `torch-distributed`; a trial command that
starts a DeepSpeed launcher, trialkit's or Determined's, takes
`deepspeed-distributed`). The roles `master` and `worker` are all nodes of
one shape: a TrainJob has one trainer, so they must agree on image, command,
resources and code.

What goes where (Trainer takes no pod template from a TrainJob):
- `trainer`: image, run.sh as the command, the environment contract (the
  token by reference to the trial's Secret), numNodes, resourcesPerNode;
- `runtimePatches` (per replicated job of the runtime): the trial's labels,
  volumes and mounts (scripts, the keeper's home, checkpoint claim, NFS or
  Azure File, the checkpoint store's Secret, whose keys run.sh exports as
  envFrom would: in the trainer's pods only, as only they run run.sh),
  serviceAccountName (the config's, else the experiment's own
  with no rights, unless the trialTemplate's own patches name one),
  imagePullSecrets and terminationGracePeriodSeconds.
No TrainingRuntime of trialkit's own is needed: patches cannot carry the
preStop hook (cleanup.sh), but run.sh execs the keeper, so the keeper is the
container's PID 1 and gets the kubelet's SIGTERM itself, within the patched
grace. Patches carry no priorityClassName either: `priorityClasses` is
refused (Kueue's WorkloadPriorityClass is the way to order TrainJobs).
Code in the image (`workingDir`) is run.sh's TRIALKIT_CODE_DIR: the trainer
has no workingDir.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import AbstractSet, ClassVar, Dict, List, Optional, Sequence, Tuple

from trialkit import env as envnames
from trialkit.errors import UserError
from trialkit.platforms.base import PlatformStatus, TrialSpec
from trialkit.platforms.kubernetes import render as k8s
from trialkit.platforms.kubernetes.config import KubeCommon, Role, Storage
from trialkit.statuses import FAILED, RUNNING, SUCCEEDED, WAITING

OPERATOR = "trainjob"
KIND = "TrainJob"
API_VERSION = "trainer.kubeflow.org/v1alpha1"
TEMPLATE = "trainjob.yaml"
CONTAINER = "node"  # the trainer's container in Trainer's runtimes
PATCH_MANAGER = "trialkit.io/trialkit"
TORCH = "torch-distributed"
DEEPSPEED = "deepspeed-distributed"
# The runtime's replicated jobs whose pods trialkit patches, the trainer's first (it carries the
# `trainer.kubeflow.org/trainjob-ancestor-step: trainer` label): the runtimes Trainer ships. Another
# runtime's trainer runs in `node`, as Trainer's own do.
RUNTIME_JOBS = {TORCH: ("node",), DEEPSPEED: ("launcher", "node")}
# JobSet names each pod's host <job>-<replicated job>-<job index>-<pod index>: leave room for
# "-launcher-0-" and an index within a DNS label.
NAME_BUDGET = 40
# The Job controller's annotation of a pod's completion index: its node rank in the replicated job.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
ROLE = "node"  # every pod is a node; node 0 reports
# Where the trainer's container mounts the Secrets whose keys become its variables (checkpointStorage's
# secretName), one subdir each: run.sh exports them (TRIALKIT_ENV_FROM_DIR), as envFrom would elsewhere.
ENV_FROM_DIR = "/var/run/trialkit/env-from"
DEEPSPEED_COMMAND = re.compile(r"(^|\s)-m\s+(trialkit|determined)\.launch\.deepspeed(\s|$)")


@dataclass(frozen=True)
class TrainJobConfig:
    node: Role  # the shape of every node; count: numNodes
    common: KubeCommon
    runtime: Optional[str] = None  # None: by the trial command (torch-distributed or deepspeed-distributed)
    storage: Optional[Storage] = None
    platform: ClassVar[str] = "kubeflow"  # configs say `platform: kubeflow, operator: trainjob`


def check_nodes(roles: Sequence[Role], where: str) -> None:
    """A TrainJob's section names at least one role (its nodes)."""
    if not roles:
        raise UserError("a TrainJob needs its nodes", where, "add worker: {replicas: 2, command: ...}")


def from_roles(roles: Sequence[Role], common: KubeCommon, storage: Optional[Storage], runtime: Optional[str],
               where: str) -> TrainJobConfig:
    """The TrainJob of a Kubeflow section's master and worker roles: numNodes is their replicas together."""
    if common.priority_classes:
        raise UserError("a TrainJob's pods take no PriorityClass from trialkit (Trainer's runtimePatches have no "
                        "priorityClassName)", f"{where}.priorityClasses",
                        "remove it: set one in your ClusterTrainingRuntime, or queue with Kueue, in pools.yml, and its "
                        "WorkloadPriorityClass")
    for role in roles:
        if role.name not in ("master", "worker"):
            raise UserError(f"a TrainJob has no {role.name} role", f"{where}.{role.name}",
                            "give master and worker, all nodes alike, or use operator: tf-operator")
    check_nodes(roles, where)
    first = roles[0]
    for role in roles[1:]:
        for what in ("command", "image", "resources", "code_dir"):
            if getattr(role, what) != getattr(first, what):
                raise UserError(f"master and worker differ in {what.replace('_', ' ')}, but a TrainJob's nodes are "
                                "all alike (one trainer)", f"{where}.{role.name}",
                                f"give both the same {what.replace('_', ' ')}, or use operator: pytorch-operator")
    node = Role(ROLE, sum(role.count for role in roles), first.command, first.image, first.resources, first.code_dir)
    return TrainJobConfig(node=node, common=common, runtime=runtime, storage=storage)


def runtime_of(config: TrainJobConfig, template: dict, command: str) -> str:
    """The runtime's name: the config's, else the trialTemplate's, else by the command."""
    if config.runtime:
        return config.runtime
    named = ((template.get("spec") or {}).get("runtimeRef") or {}).get("name")
    if named and config.common.template is not None:
        return named
    return DEEPSPEED if DEEPSPEED_COMMAND.search(command) else TORCH


def render(config: TrainJobConfig, spec: TrialSpec) -> List[dict]:
    names = k8s.trial_names(spec, NAME_BUDGET)
    job = k8s.job_object(config.common, TEMPLATE, names)
    job["apiVersion"] = API_VERSION
    node = config.node
    command = node.command or spec.command
    runtime = runtime_of(config, job, command or "")
    claims, mounts, checkpoint_env = k8s.checkpoint_storage(config.common, names, config.storage)
    secret_mounts, secret_env = env_from_mounts(spec.env_from_secrets)
    in_image = {envnames.CODE_DIR: config.common.working_dir} if config.common.working_dir else {}
    plan = k8s.pod_plan(
        config.common, spec, names, "kubeflow",
        image=node.image, command=node.command, res=node.resources, where="trainingService",
        # Every node runs a keeper with the trial's token: only node 0 ships records, the others their output.
        extra_env={envnames.CHIEF_ROLE: ROLE, envnames.ROLE: ROLE, envnames.RANK_OFFSET: "0", **checkpoint_env,
                   **secret_env, **in_image},
        field_env={envnames.TASK_INDEX: f"metadata.annotations['{COMPLETION_INDEX}']"},
        extra_mounts=[*mounts, *secret_mounts], code_dir=node.code_dir,
    )
    job_spec = job.setdefault("spec", {})
    job_spec["runtimeRef"] = {**(job_spec.get("runtimeRef") or {}), "name": runtime}
    trainer = {**(job_spec.get("trainer") or {}), "image": plan.image, "command": list(k8s.RUN_COMMAND),
               "numNodes": node.count}
    trainer.pop("args", None)  # run.sh would take them for the trial's command
    trainer["env"] = k8s._replace_named(trainer.get("env", []), plan.env)
    if plan.resources:
        trainer["resourcesPerNode"] = plan.resources
    job_spec["trainer"] = trainer
    patches = [patch for patch in job_spec.get("runtimePatches") or [] if patch.get("manager") != PATCH_MANAGER]
    account = plan.service_account or (None if _names_account(patches) else plan.default_service_account)
    job_spec["runtimePatches"] = patches + [runtime_patch(plan, RUNTIME_JOBS.get(runtime, ("node",)), account,
                                                          {mount.volume["name"] for mount in secret_mounts})]
    return k8s.trial_objects(config.common, spec, names, job, claims)


def env_from_mounts(secrets: Sequence[str]) -> Tuple[List[k8s.Mount], Dict[str, str]]:
    """The Secrets whose keys the trainer's container gets as variables, mounted read-only under ENV_FROM_DIR,
    and the variable that tells run.sh where: Trainer's container patch takes no envFrom."""
    if not secrets:
        return [], {}
    mounts = [k8s.Mount({"name": f"trialkit-env-from-{index}", "secret": {"secretName": name}},
                        f"{ENV_FROM_DIR}/{index}", read_only=True) for index, name in enumerate(secrets)]
    return mounts, {envnames.ENV_FROM_DIR: ENV_FROM_DIR}


def _names_account(patches: Sequence[dict]) -> bool:
    """Whether a patch of the trialTemplate's own gives a pod its serviceAccountName."""
    for patch in patches:
        runtime = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
        for entry in runtime.get("replicatedJobs") or []:
            pod = ((entry.get("template") or {}).get("spec") or {}).get("template") or {}
            if (pod.get("spec") or {}).get("serviceAccountName"):
                return True
    return False


def runtime_patch(plan: k8s.PodPlan, jobs: Sequence[str], account: Optional[str],
                  trainer_only: AbstractSet[str] = frozenset()) -> dict:
    """trialkit's patch of the runtime: every pod of `jobs` (the trainer's first) gets the trial's labels, volumes
    and pod settings (`account`: its serviceAccountName, None: the runtime's or the template's patch's); the
    container `node` its mounts. The volumes named in `trainer_only` (the Secrets run.sh exports: env_from_mounts)
    go to the trainer's pods alone: only their container runs run.sh, with the trainer's env. The other pods of a
    runtime run its own command (deepspeed-distributed's nodes: sshd, for the MPI launcher's ssh sessions, which
    see none of the container's environment), which would hold the keys and export none."""
    entries = []
    for index, name in enumerate(jobs):
        mounts = [mount for mount in plan.mounts if index == 0 or mount.volume["name"] not in trainer_only]
        entries.append({"name": name, "template": {"spec": {"template": _pod_patch(plan, account, mounts)}}})
    return {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": entries}}}}


def _pod_patch(plan: k8s.PodPlan, account: Optional[str], mounts: Sequence[k8s.Mount]) -> dict:
    pod_spec: Dict[str, object] = {
        "volumes": [mount.volume for mount in mounts],
        "containers": [{"name": CONTAINER, "volumeMounts": [mount.volume_mount() for mount in mounts]}],
        "terminationGracePeriodSeconds": plan.termination_grace_seconds,
    }
    if account:
        pod_spec["serviceAccountName"] = account
    if plan.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in plan.image_pull_secrets]
    return {"metadata": {"labels": dict(plan.labels)}, "spec": pod_spec}


# --- status ------------------------------------------------------------------------------


def conditions(job: dict) -> Dict[str, dict]:
    """The TrainJob's conditions that hold, by type."""
    return {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}


def said(condition: dict) -> str:
    return ": ".join(part for part in (condition.get("reason"), condition.get("message")) if part)


def suspended(job: dict) -> bool:
    """Held by `spec.suspend` (Kueue's, until it admits the job): its pods do not run."""
    return bool((job.get("spec") or {}).get("suspend"))


def job_status(job: dict) -> PlatformStatus:
    """A TrainJob's status: Failed (its reason, DeadlineExceeded among them), Complete, Suspended; running once a
    child Job of its JobSet has its pods ready (Trainer has no Running condition)."""
    holding = conditions(job)
    if "Failed" in holding:
        return PlatformStatus(FAILED, said(holding["Failed"]))
    if "Complete" in holding:
        return PlatformStatus(SUCCEEDED)
    if suspended(job) or "Suspended" in holding:
        reason = said(holding["Suspended"]) if "Suspended" in holding else "created suspended"
        return PlatformStatus(WAITING, f"suspended ({reason})")
    jobs = (job.get("status") or {}).get("jobsStatus") or []
    if any((child.get("ready") or 0) > 0 or (child.get("succeeded") or 0) > 0 for child in jobs):
        return PlatformStatus(RUNNING)
    return PlatformStatus(WAITING)

