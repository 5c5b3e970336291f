"""AdaptDL: one AdaptDLJob (adaptdl.petuum.com/v1) per trial, elastic when adaptive.

Config (NNI's `adl`): `image`, `command`, `cpuNumber`, `gpuNumber`,
`memorySize`, `adaptive` (AdaptDL's preemptible: the scheduler may stop and
rescale it), `minReplicas`, `maxReplicas`, `checkpoint: {storageClass,
storageSize}`, `nfs`, `imagePullSecrets`, plus the options every Kubernetes
platform has (k8s_config.parse_common: the experiment's code dir is shipped,
unless `workingDir` says the code is in the image, as NNI v1's `trial.codeDir`
does here). Each trial gets claims for /adaptdl/checkpoint and
/adaptdl/share; the experiment one for /adaptdl/tensorboard.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List, Optional

from trialkit import env as envnames
from trialkit import schema
from trialkit.errors import UserError
from trialkit.platforms.kubernetes import render as k8s
from trialkit.statuses import FAILED, RUNNING, SUCCEEDED, WAITING
from trialkit.platforms.base import PlatformStatus, TrialSpec
from trialkit.platforms.kubernetes.config import (
    DEFAULT_STORAGE_MIB,
    KubeCommon,
    Resources,
    Section,
    Storage,
    parse_common,
    parse_resources,
    parse_storage,
    resolve_paths,  # noqa: F401 - the config layer's hook: code dirs made absolute
    shared_dirs,  # noqa: F401 - the config layer's hook: where PBT's checkpoints may go
    v1_common,
    v1_trial,
)
from trialkit.platforms.kubernetes.platform import KubePlatform

PLATFORM = envnames.ADAPTDL_PLATFORM  # its pods say so in TRIALKIT_PLATFORM: the keeper keeps the scheduler's job name
KIND = "AdaptDLJob"
CONTAINER = "main"
CHECKPOINT_DIR = "/adaptdl/checkpoint"
SHARE_DIR = "/adaptdl/share"
TENSORBOARD_DIR = "/adaptdl/tensorboard"
# AdaptDL names each pod's host <job>-<restart group>-<rank>, a DNS label:
# leave room for the group (it grows with every rescale) and the rank.
NAME_BUDGET = 48

# NNI's adl mode runs the trial in its image, from trial.codeDir there: that
# key names a directory in the container, never one on this machine.
V1_CODE_DIR_IN_IMAGE = True
# The trial keys of NNI v1's `trial:` section that are this platform's options.
_V1_KEYS = {
    "command": "command", "codeDir": "workingDir", "image": "image", "gpuNum": "gpuNumber", "cpuNum": "cpuNumber",
    "memorySize": "memorySize", "adaptive": "adaptive", "checkpoint": "checkpoint", "nfs": "nfs",
    "imagePullSecrets": "imagePullSecrets", "namespace": "namespace",
}


@dataclass(frozen=True)
class AdaptDLConfig:
    command: Optional[str]  # None: the trial's command
    resources: Resources
    preemptible: bool
    min_replicas: Optional[int]
    max_replicas: Optional[int]
    storage: Storage  # AdaptDL's checkpoint, share and TensorBoard claims
    common: KubeCommon
    tensorboard_image: str = "tensorflow/tensorflow:2.16.1"  # what `trialkit experiment tensorboard` runs
    platform: ClassVar[str] = PLATFORM


def parse_section(section: dict, where: str) -> AdaptDLConfig:
    sec = Section(section, where)
    min_replicas = sec.integer("minReplicas", minimum=0)
    max_replicas = sec.integer("maxReplicas", minimum=1)
    if min_replicas is not None and max_replicas is not None and max_replicas < min_replicas:
        schema.report(UserError(f"maxReplicas ({max_replicas}) is below minReplicas ({min_replicas})",
                                sec.at("maxReplicas")))
    config = AdaptDLConfig(
        command=sec.text("command"),
        resources=parse_resources(sec),
        preemptible=sec.boolean("adaptive", "preemptible"),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        storage=parse_storage(sec) or Storage(None, DEFAULT_STORAGE_MIB),
        common=parse_common(sec, [KIND]),
        tensorboard_image=sec.text("tensorboardImage", default=AdaptDLConfig.tensorboard_image),
    )
    sec.finish()
    if not config.common.image:
        schema.report(UserError("no image to run the trial in", sec.at("image"), "set image or dockerImage"))
    return config


# A v1 config's errors name its keys: every option of the section came from `trial:`.
V1_WHERE = [(f"trainingService.{new}", f"trial.{old}") for old, new in _V1_KEYS.items()] + [
    ("trainingService.managerAddress", "nniManagerIp"), ("trainingService", "trial")]


def from_v1(v1_config: dict) -> dict:
    """NNI v1 (`trainingServicePlatform: adl`, everything under `trial:`) as a v2 section."""
    trial = v1_trial(v1_config, list(_V1_KEYS))
    out = v1_common(v1_config, PLATFORM)
    out.update({new: trial[old] for old, new in _V1_KEYS.items() if old in trial})
    return out


def render(config: AdaptDLConfig, spec: TrialSpec) -> List[dict]:
    common = config.common
    names = k8s.trial_names(spec, NAME_BUDGET)
    checkpoint_claim = k8s.checkpoint_claim_name(names)
    share_claim = f"{names.job}-share"
    tensorboard_claim = tensorboard_name(spec.experiment_id)
    # One TensorBoard volume for the experiment, a directory in it per trial:
    # TensorBoard then shows the trials side by side.
    tensorboard_dir = f"{TENSORBOARD_DIR}/{names.job}"
    env = {
        envnames.CHECKPOINT_DIR: CHECKPOINT_DIR,
        envnames.SHARE_DIR: SHARE_DIR,
        envnames.TENSORBOARD_DIR: tensorboard_dir,
        envnames.ADAPTDL["checkpoint_dir"]: CHECKPOINT_DIR,
        envnames.ADAPTDL["share_dir"]: SHARE_DIR,
        envnames.ADAPTDL["tensorboard_dir"]: tensorboard_dir,
        envnames.ADAPTDL_OLD_TENSORBOARD: tensorboard_dir,
    }
    mounts = [
        k8s.claim_mount("adaptdl-checkpoint", checkpoint_claim, CHECKPOINT_DIR),
        k8s.claim_mount("adaptdl-share", share_claim, SHARE_DIR),
        k8s.claim_mount("adaptdl-tensorboard", tensorboard_claim, TENSORBOARD_DIR),
    ]
    plan = k8s.pod_plan(
        common, spec, names, PLATFORM,
        image=None, command=config.command, res=config.resources, where="trainingService",
        extra_env=env, extra_mounts=mounts, operator_counts_restarts=True,
    )
    job = k8s.job_object(common, "adaptdljob.yaml", names)
    job_spec = job.setdefault("spec", {})
    job_spec["preemptible"] = config.preemptible
    for key, value in (("minReplicas", config.min_replicas), ("maxReplicas", config.max_replicas)):
        if value is not None:
            job_spec[key] = value
    job_spec["template"] = k8s.fill_pod(job_spec.get("template"), plan, CONTAINER)
    storage = config.storage
    claims = [
        k8s.claim_object(checkpoint_claim, common.namespace, names.labels, storage.storage_class, storage.size_mib),
        k8s.claim_object(share_claim, common.namespace, names.labels, storage.storage_class, storage.size_mib),
        # Labelled with the experiment only: shared by every trial.
        k8s.claim_object(
            tensorboard_claim, common.namespace, names.experiment_labels, storage.storage_class, storage.size_mib
        ),
    ]
    return k8s.trial_objects(common, spec, names, job, claims)


# --- TensorBoard over the experiment's claim (NNI's adl mode serves one) -----------

TENSORBOARD_PORT = 6006
LABEL_TENSORBOARD = "trialkit.io/tensorboard"


def tensorboard_name(experiment_id: str) -> str:
    """The experiment's TensorBoard claim, and its Deployment and Service."""
    return k8s.object_name(["tk", experiment_id, "tensorboard"])


def render_tensorboard(config: AdaptDLConfig, experiment_id: str) -> List[dict]:
    """The experiment's TensorBoard claim (every trial writes its dir there), and a Deployment and a
    Service that serve it read-only on port 6006."""
    common, storage = config.common, config.storage
    name = tensorboard_name(experiment_id)
    labels = {k8s.LABEL_EXPERIMENT: k8s.label_value(experiment_id), LABEL_TENSORBOARD: "true"}
    claim = k8s.claim_object(name, common.namespace, {k8s.LABEL_EXPERIMENT: labels[k8s.LABEL_EXPERIMENT]},
                             storage.storage_class, storage.size_mib)
    container = {
        "name": "tensorboard",
        "image": config.tensorboard_image,
        "command": ["tensorboard", "--logdir", TENSORBOARD_DIR, "--bind_all", "--port", str(TENSORBOARD_PORT)],
        "ports": [{"name": "http", "containerPort": TENSORBOARD_PORT}],
        "volumeMounts": [{"name": "tensorboard", "mountPath": TENSORBOARD_DIR, "readOnly": True}],
    }
    pod_spec = {"containers": [container],
                "volumes": [{"name": "tensorboard", "persistentVolumeClaim": {"claimName": name, "readOnly": True}}]}
    if common.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in common.image_pull_secrets]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": k8s.metadata(name, common.namespace, labels),
        "spec": {"replicas": 1, "selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": k8s.metadata(name, common.namespace, labels),
        "spec": {"selector": dict(labels), "ports": [{"name": "http", "port": TENSORBOARD_PORT, "targetPort": "http"}]},
    }
    return [claim, deployment, service]


PHASES = {
    "Pending": WAITING,
    "Starting": WAITING,
    "Running": RUNNING,
    "Stopping": RUNNING,  # rescaling: its pods stop to restart from a checkpoint
    "Succeeded": SUCCEEDED,
    "Failed": FAILED,
}


def job_status(job: dict) -> PlatformStatus:
    """An AdaptDLJob's status.phase (no phase yet: Pending, as its controller assumes)."""
    status = job.get("status") or {}
    result = PHASES.get(status.get("phase") or "Pending", WAITING)
    reason = ": ".join(str(part) for part in (status.get("reason"), status.get("message")) if part)
    return PlatformStatus(result, reason if result == FAILED else "")


class Platform(KubePlatform):
    renderer = staticmethod(render)
    mapper = staticmethod(job_status)

    def experiment_objects(self, experiment_id: str) -> List[dict]:
        return render_tensorboard(self.config, experiment_id)

    def kept_objects(self, experiment_id: str) -> List[dict]:
        """The TensorBoard claim: its data can be served after the experiment (seed 000's promise)."""
        return [obj for obj in render_tensorboard(self.config, experiment_id) if obj["kind"] == "PersistentVolumeClaim"]

    def start_tensorboard(self, experiment_id: str) -> str:
        """Serve the experiment's TensorBoard claim (made once: asked again, what runs is kept); how to reach it.
        What serves it goes when the experiment ends; the claim stays until `trialkit experiment delete`, and
        asked again, the experiment's data is served from it."""
        for obj in render_tensorboard(self.config, experiment_id):
            self.client.create(obj, on_conflict="keep")
        name, namespace = tensorboard_name(experiment_id), self.config.common.namespace
        return (f"TensorBoard of experiment {experiment_id}: kubectl port-forward -n {namespace} service/{name} "
                f"{TENSORBOARD_PORT}:{TENSORBOARD_PORT}, then open http://localhost:{TENSORBOARD_PORT}")
