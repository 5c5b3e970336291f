"""FrameworkController: one Framework (frameworkcontroller.microsoft.com/v1) per trial.

Config (NNI-compatible): `taskRoles: [{name, taskNumber, command,
dockerImage, cpuNumber, gpuNumber, memorySize,
frameworkAttemptCompletionPolicy: {minFailedTaskCount,
minSucceededTaskCount}}]`, `serviceAccountName`, plus the options every
Kubernetes platform has (k8s_config.parse_common).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, List, Optional, Tuple

from trialkit import env as envnames
from trialkit import schema
from trialkit.errors import UserError
from trialkit.platforms.kubernetes import render as k8s
from trialkit.statuses import FAILED, RUNNING, SUCCEEDED, USER_CANCELED, WAITING
from trialkit.platforms.base import PlatformStatus, TrialSpec
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

PLATFORM = "frameworkcontroller"
KIND = "Framework"
CONTAINER = "trial"
NAME = re.compile(r"^[a-z0-9]{1,63}$")  # FrameworkController's rule for every name
# A task role's headless Service is named {framework}-{role}, a DNS label: a role name this long
# leaves the framework's name 32 characters.
MAX_ROLE_NAME = 30
# What FrameworkController fills in a pod template before it makes each task's pod; pods of a role are
# found at {role}-{index}.{framework}-{role} (its own examples' scheme, which the launchers read).
TASK_HOSTNAME = "{{FC_TASKROLE_NAME}}-{{FC_TASK_INDEX}}"
# The labels FrameworkController puts on every pod it makes.
POD_LABEL_FRAMEWORK = "FC_FRAMEWORK_NAME"
POD_LABEL_TASK_ROLE = "FC_TASKROLE_NAME"
# FrameworkController force-deletes a pod this long after its own grace ran
# out: the kubelet has had the whole termination grace to stop it by then.
FORCE_DELETE_AFTER_SECONDS = 30
UNLIMITED = -1  # FrameworkController's "no such threshold"
STOP_REQUESTED = -210  # its completion code for a Framework stopped by a user
RESERVED_CODES = range(200, 220)  # its own codes, not a container's exit code


@dataclass(frozen=True)
class TaskRole:
    role: Role
    min_failed: int
    min_succeeded: int


@dataclass(frozen=True)
class FrameworkConfig:
    task_roles: Tuple[TaskRole, ...]
    common: KubeCommon
    reporting_role: str = ""
    storage: Optional[Storage] = None  # the checkpoint claim; None: checkpoints on the pod's disk
    platform: ClassVar[str] = PLATFORM


def _threshold(policy: Section, key: str, default: int, task_number: int) -> int:
    value = policy.integer(key, default=default)
    if value != UNLIMITED and not 1 <= value <= task_number:
        schema.report(UserError(f"must be -1 or between 1 and taskNumber ({task_number}), got {value}", policy.at(key)))
        return default
    return value


def parse_task_role(sec: Section) -> TaskRole:
    name = sec.text("name")
    if name is None or not NAME.match(name) or len(name) > MAX_ROLE_NAME:
        raise UserError(f"task role name {name!r} is not valid", sec.at("name"),
                        f"use 1 to {MAX_ROLE_NAME} lowercase letters and digits: it names the role's Service")
    role = parse_role(sec, name, ("taskNumber", "taskNum"))
    policy = sec.section("frameworkAttemptCompletionPolicy") or Section({}, sec.at("frameworkAttemptCompletionPolicy"))
    task_role = TaskRole(
        role=role,
        # Defaults: one failed task fails the trial; it succeeds when all tasks end.
        min_failed=_threshold(policy, "minFailedTaskCount", 1, role.count),
        min_succeeded=_threshold(policy, "minSucceededTaskCount", UNLIMITED, role.count),
    )
    policy.finish()
    sec.finish()
    return task_role


def parse_section(section: dict, where: str) -> FrameworkConfig:
    sec = Section(section, where)
    task_roles = [parse_task_role(item) for item in sec.sections("taskRoles")]
    if not task_roles:
        raise UserError("no task roles", sec.at("taskRoles"), "add taskRoles: [{name: worker, taskNumber: 1, command: ...}]")
    names = [item.role.name for item in task_roles]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate:
        raise UserError(f"task role {duplicate!r} is given twice", sec.at("taskRoles"))
    common = parse_common(sec, [KIND])
    check_images([item.role for item in task_roles], common, f"{where}.taskRoles")
    reporter = reporting_role(sec, names)
    storage = parse_storage(sec)
    sec.finish()
    return FrameworkConfig(task_roles=tuple(task_roles), common=common, reporting_role=reporter, storage=storage)


# A v1 config's errors name its keys: the roles are trial.taskRoles there, the rest frameworkcontrollerConfig's.
V1_WHERE = v1_where("frameworkcontrollerConfig", [("trainingService.taskRoles", "trial.taskRoles")])


def from_v1(v1_config: dict) -> dict:
    """NNI v1 (`trainingServicePlatform: frameworkcontroller`, `trial.taskRoles`, `frameworkcontrollerConfig`)."""
    trial = v1_trial(v1_config, ["taskRoles"])
    out = v1_common(v1_config, PLATFORM, v1_config.get("frameworkcontrollerConfig"))
    if "taskRoles" in trial:
        roles = trial["taskRoles"]
        out["taskRoles"] = [v1_role(role) for role in roles] if isinstance(roles, list) else roles
    return out


def render(config: FrameworkConfig, spec: TrialSpec) -> List[dict]:
    longest_role = max(len(item.role.name) for item in config.task_roles)
    names = k8s.trial_names(spec, k8s.MAX_NAME - 1 - longest_role, separator="")
    job = k8s.job_object(config.common, "framework.yaml", names)
    job_spec = job.setdefault("spec", {})
    job_spec.setdefault("executionType", "Start")
    job_spec.setdefault("retryPolicy", {"fancyRetryPolicy": True, "maxRetryCount": 0})
    entries = {entry.get("name"): entry for entry in job_spec.get("taskRoles") or []}
    task_roles, services = [], []
    claims, mounts, checkpoint_env = k8s.checkpoint_storage(config.common, names, config.storage)
    offset = 0  # the rank of the role's first task: the task roles' pods in order
    for item in config.task_roles:
        role = item.role
        entry = k8s.role_entry(entries, role.name)
        entry["name"] = role.name
        entry["taskNumber"] = role.count
        entry["frameworkAttemptCompletionPolicy"] = {
            "minFailedTaskCount": item.min_failed,
            "minSucceededTaskCount": item.min_succeeded,
        }
        task = entry.setdefault("task", {})
        task.setdefault("retryPolicy", {"fancyRetryPolicy": False, "maxRetryCount": 0})
        task["podGracefulDeletionTimeoutSec"] = config.common.termination_grace_seconds + FORCE_DELETE_AFTER_SECONDS
        plan = k8s.pod_plan(
            config.common, spec, names, PLATFORM,
            image=role.image, command=role.command, res=role.resources, where=f"trainingService.taskRoles.{role.name}",
            # Every task runs a keeper with the trial's token: only task 0 of the reporting role ships.
            # FrameworkController tells a task its index but not how many there are: a launcher's node count.
            extra_env={envnames.CHIEF_ROLE: config.reporting_role, envnames.RANK_OFFSET: str(offset),
                       envnames.NUM_NODES: str(role.count), **checkpoint_env},
            extra_mounts=mounts, code_dir=role.code_dir,
        )
        pod = k8s.fill_pod(task.get("pod"), plan, CONTAINER)
        # FrameworkController retries tasks itself; the kubelet must not.
        pod["spec"]["restartPolicy"] = "Never"
        # Each task is reachable by name: {role}-{index}.{framework}-{role} (the Service below).
        pod["spec"]["hostname"] = TASK_HOSTNAME
        pod["spec"]["subdomain"] = task_service_name(names, role.name)
        task["pod"] = pod
        task_roles.append(entry)
        services.append(task_service(names, role.name, config.common.namespace))
        offset += role.count
    job_spec["taskRoles"] = task_roles
    return k8s.trial_objects(config.common, spec, names, job, [*services, *claims])


def task_service_name(names: k8s.TrialNames, role: str) -> str:
    return f"{names.job}-{role}"


def task_service(names: k8s.TrialNames, role: str, namespace: str) -> dict:
    """The role's headless Service: DNS names for its tasks' pods (hostname.subdomain), ready or not, so that
    the first task can be found while the others still start."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": k8s.metadata(task_service_name(names, role), namespace, names.labels),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {POD_LABEL_FRAMEWORK: names.job, POD_LABEL_TASK_ROLE: role},
        },
    }


# status.state while the Framework is not Completed. The Attempt* states after
# AttemptRunning are an attempt ending: it is retried or the Framework completes.
STATES = {
    "AttemptCreationPending": WAITING,
    "AttemptCreationRequested": WAITING,
    "AttemptPreparing": WAITING,
    "AttemptRunning": RUNNING,
    "AttemptDeletionPending": RUNNING,
    "AttemptDeletionRequested": RUNNING,
    "AttemptDeleting": RUNNING,
    "AttemptCompleted": RUNNING,
}


def job_status(job: dict) -> PlatformStatus:
    """A Framework's status.state and, once Completed, its completion status."""
    status = job.get("status") or {}
    state = status.get("state")
    if state != "Completed":
        return PlatformStatus(STATES.get(state, WAITING))
    completion = (status.get("attemptStatus") or {}).get("completionStatus") or {}
    code = completion.get("code")
    reason = ": ".join(str(part) for part in (completion.get("phrase"), completion.get("diagnostics")) if part)
    exit_code = code if isinstance(code, int) and 0 <= code <= 255 and code not in RESERVED_CODES else None
    if (completion.get("type") or {}).get("name") == "Succeeded":
        return PlatformStatus(SUCCEEDED, "", exit_code)
    return PlatformStatus(USER_CANCELED if code == STOP_REQUESTED else FAILED, reason, exit_code)


class Platform(KubePlatform):
    renderer = staticmethod(render)
    mapper = staticmethod(job_status)
