#!/usr/bin/env python3
"""The config reference, generated from the config schema itself.

    python tools/gen_config_reference.py            # print the whole reference (Markdown)
    python tools/gen_config_reference.py --check    # exit 1 when a key lacks a description

Nothing here lists keys by hand. They come from where the parsers declare them:

- the top level: `trialkit.control.config.V2_KEYS` (trialkit's own in
  `TRIALKIT_KEYS`, refused NNI keys in `UNSUPPORTED`), defaults from the
  `ExperimentConfig` dataclass;
- tuners, assessors and their classArgs: the `TUNERS` / `ASSESSORS` tables and
  each class's `ARGS`; NNI names that trialkit does not carry: `NNI_ONLY`;
- search space types: `trialkit.control.searchspace.NUMERIC_ARGS`;
- local and ray sections: each module's `_OPTIONS` table and its config dataclass;
- the Kubernetes sections: every key that `parse_section` asks its
  `k8s_config.Section` for (recorded while parsing example sections), with the
  aliases, kinds, defaults and minimums it asks with;
- NNI v1: `convert_v1` run over a v1 config whose every value is a marker; where
  each marker lands in the v2 result is that key's v2 name.

What cannot come from code is the one-line meaning of each key: DESCRIPTIONS
below. `missing_descriptions()` names keys the schema has and DESCRIPTIONS
lacks, `stale_descriptions()` entries for keys that are gone;
tests/test_docs.py fails on either, so the reference follows the code.
tools/gen_docs.py writes `render(name)` into the pages, between
`<!-- generated: name -->` and `<!-- end generated -->`.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple

# One line per key: what it means (and, for a few, its kind where the parser
# does not show it). "top.KEY" for the top level, "<platform>.PATH" for a
# trainingService key (PATH as the reference shows it: "master.replicas" is
# "<role>.replicas" for kubeflow), "k8s.KEY" for what all Kubernetes platforms share.
DESCRIPTIONS: Dict[str, str] = {
    # top level
    "top.experimentName": "A name to show beside the experiment id.",
    "top.experimentType": "Only `hpo` (NNI's value for a hyperparameter experiment).",
    "top.searchSpace": "The search space inline, in NNI's format (see [search space](#search-space)).",
    "top.searchSpaceFile": "A JSON or YAML file holding the search space; relative to the config file.",
    "top.trialCommand": "The command each trial runs, a shell line, started in the trial code directory "
    "(required for local and ray; cluster roles may give their own `command`).",
    "top.trialCodeDirectory": "Where the trial's code is; relative to the config file. Its `.trialignore` "
    "says what trials leave out; a `startup-hook.sh` at its top runs before each trial.",
    "top.trialConcurrency": "How many trials run at once.",
    "top.trialGpuNumber": "GPUs per trial. local: the trial waits (WAITING, with the reason) until that many GPUs "
    "are free and runs with exactly those (`CUDA_VISIBLE_DEVICES`); `0` gives it none (an empty "
    "`CUDA_VISIBLE_DEVICES`); left out, trials see the GPUs the control plane sees. ray: the GPUs each trial's actor "
    "asks Ray for. Refused on the Kubernetes platforms: set `gpuNumber` per role.",
    "top.maxExperimentDuration": "Stop the experiment once it has run this long (`30m`, `2h`, `1d`, or seconds): "
    "the time its runs ran, summed, as NNI's execDuration (the time it stood stopped between a stop and "
    "`experiment resume` counts not); running trials end SYS_CANCELED.",
    "top.maxTrialNumber": "Stop proposing trials after this many.",
    "top.maxTrialDuration": "Stop a trial that runs longer (graceful stop, then FAILED with a timeout reason).",
    "top.nniManagerIp": "The address trials reach the manager at (a name for `managerAddress` on the cluster "
    "platforms; ray's workers use it too). Refused on local, where trials use 127.0.0.1.",
    "top.useAnnotation": "Must be false: NNI's annotations are not supported.",
    "top.debug": "Must be false: the manager has no debug mode (each trial's output is in its dir).",
    "top.logLevel": "Only `info`, the manager's one level (NNI's other levels are refused).",
    "top.tuner": "`{name, classArgs}`: which tuner proposes parameters (see [tuners](#tuners)).",
    "top.assessor": "`{name, classArgs}`: which assessor stops poor trials early (see [assessors](#assessors)).",
    "top.advisor": "NNI's advisors (Hyperband, BOHB) in the tuner's place: the same as `tuner`; a config has one "
    "of the two, as in NNI.",
    "top.trainingService": "Where trials run: `platform:` local, kubeflow, frameworkcontroller, adaptdl or ray, "
    "and that platform's keys (below).",
    "top.maxTrialRestarts": "trialkit (Determined's `max_restarts`): how many times a trial that failed for a cause "
    "not its own (its keeper killed, its Ray worker or node lost, its pod evicted or OOM-killed) starts again, from its "
    "checkpoint, with the restart count one higher (default 0). A trial's own non-zero exit is never retried.",
    "top.stopWhenFirstTrialsFail": "trialkit: the experiment stops (status ERROR, `trialkit run` exits 1) when its "
    "first N trials all failed the same way (one reason, one exit code: a module missing where the trials run, a typo "
    "in the command), and says why; default 3. `0` runs every trial whatever fails, as NNI does.",
    "top.trialGraceSeconds": "trialkit: how long a stopped trial has between SIGTERM and SIGKILL "
    "(`TRIALKIT_GRACE_SECONDS` in the trial).",
    "top.trialCheckpointEvery": "trialkit: seconds of training between the AdaptDL checkpoints trialkit takes, "
    "so that a node that dies without warning costs at most that much; `0`: only AdaptDL's own, on SIGTERM "
    "(`TRIALKIT_CHECKPOINT_EVERY` in the trial; the default and the cost: "
    "[periodic AdaptDL checkpoints](../platforms.md#periodic-adaptdl-checkpoints)).",
    "top.experimentWorkingDirectory": "trialkit: where the experiment's dir goes (default `$TRIALKIT_HOME/experiments`; "
    "a link there keeps it findable by id).",
    "top.trialTemplate": "trialkit: your own job template (YAML) for the cluster platforms, instead of the packaged "
    "one; refused on local and ray.",
    "top.priority": "trialkit: the experiment's one priority, smaller first, as Determined's priority scheduler "
    "(default 42): on the local platform its job's in the resource pool (the pool's free slots go to the smallest "
    "number first; the same as `trainingService.poolPriority`, which must not differ from it) and its trials' in "
    "its job queue.",
    "top.managerTls": "trialkit: `{certFile, keyFile}`, PEM files: the manager serves HTTPS only, to trials and "
    "the page (`trialkit run --tls-cert/--tls-key` does the same); trials must trust the certificate "
    "([TLS](../platforms.md#the-manager-over-tls)).",
    "top.checkpointStorage": "trialkit: where the trials' checkpoints are kept besides their checkpoint dirs and "
    "which stay: `{type: local|s3|gcs|azure, bucket, container, prefix, endpointUrl, region, accountUrl, secretName, "
    "saveTrialLatest, saveTrialBest, saveExperimentBest}` (Determined's `checkpoint_storage` and retention: "
    "[checkpoints](../checkpoints.md)). Without it every checkpoint stays in its trial's dir.",
    # local
    "local.platform": "`local`.",
    "local.useActiveGpu": "`false`: a GPU that runs a process this experiment did not start (as nvidia-smi "
    "shows) gets no trial; `true`: it is used like the others. Without trialGpuNumber it schedules nothing, as in "
    "NNI (taken, with a note).",
    "local.maxTrialNumberPerGpu": "How many trials may share one GPU. Needs trialGpuNumber.",
    "local.gpuIndices": "The GPUs trials may use, nvidia-smi's indices (`0`, `[0, 1]` or `\"0,1\"`; default: "
    "every GPU, or those a `CUDA_VISIBLE_DEVICES` set for `trialkit run` names). Needs trialGpuNumber.",
    "local.slotsPerTrial": "trialkit: the slots each trial gets (`TRIALKIT_SLOTS_PER_NODE`: workers a launcher "
    "starts); default: the trial's GPUs (trialGpuNumber), else 1.",
    "local.resourcePool": "trialkit: the pool of `$TRIALKIT_HOME/pools.yml` the trials take their slots from, "
    "shared with every local experiment of that home (default: `default`).",
    "local.poolPriority": "trialkit: the experiment's priority in its resource pool, Determined's order: the pool's "
    "free slots go to smaller numbers first (default: the config's `priority`, else 42; a Determined config's "
    "`resources.priority`; `job update` with the experiment's id changes it); "
    "bigger first in a pool of `scheduler: priority_descending`; refused in a `fair_share` pool.",
    "local.preemptible": "trialkit: whether the trials give their slots back, paused through their checkpoint, to "
    "a job of higher priority that waits for them in the resource pool (default `true`; AdaptDL's word). "
    "`false`: they keep their slots, for trials that cannot stop with a checkpoint.",
    "local.warmStart": "trialkit: start eligible trials warm (default `false`): each trial's keeper is forked "
    "from a process that has imported the keeper and the trial script's third-party modules, and forks the "
    "trial's `python script.py` in turn; every trial is still a process tree of its own "
    "(the local platform's Warm start).",
    "local.poolWeight": "trialkit: the experiment's weight in a `scheduler: fair_share` resource pool: the pool's "
    "slots are divided among the jobs that want them in proportion to their weights (default 1; `job update "
    "--weight` changes it); refused in a pool scheduled by priority.",
    # ray
    "ray.platform": "`ray`.",
    "ray.address": "The cluster: `ray://HEAD:10001`, `HEAD:6379`, or `auto` (a cluster on this machine).",
    "ray.cpusPerTrial": "CPUs each trial holds on the cluster.",
    "ray.gpusPerTrial": "GPUs each trial holds on the cluster (trialGpuNumber sets it too); Ray sets the "
    "trial's `CUDA_VISIBLE_DEVICES` to the ones it gives.",
    "ray.workingDir": "A directory shipped to the nodes; trials run in it.",
    "ray.runtimeEnv": "Ray's `runtime_env` for the trials' workers (pip packages, env vars).",
    # every Kubernetes platform
    "k8s.platform": "The platform's name.",
    "k8s.namespace": "The namespace trials are created in.",
    "k8s.managerAddress": "The address pods reach the manager at; loopback is refused. "
    "Default: this machine's first non-loopback address.",
    "k8s.trialTemplate": "Your own job template (YAML) to fill instead of the packaged one: tolerations, "
    "node selectors, sidecars.",
    "k8s.keeperGraceSeconds": "The keeper's grace in the pod: SIGTERM to SIGKILL of the trial.",
    "k8s.terminationGracePeriodSeconds": "The pod's grace; must exceed keeperGraceSeconds "
    "(default: keeperGraceSeconds + <!-- const trialkit.layout.CLEANUP_MARGIN_SECONDS -->).",
    "k8s.dockerImage": "The image every pod runs (a role may give its own).",
    "k8s.workingDir": "The code is in the image, here (an absolute path; `.`: the image's own working directory): "
    "nothing is shipped. Without it, the trial code directory is packed (its `.trialignore`, the size limit) and "
    "each pod fetches it from the manager (AdaptDL: NNI v1's `trial.codeDir` is this key).",
    "k8s.trialCodeDirectory": "The top-level `trialCodeDirectory`, passed down: shipped to every pod unless "
    "`workingDir` is set.",
    "k8s.serviceAccountName": "The trial pods' service account (default: the experiment's own, `tk-<experiment>-trial`, "
    "bound to no role and with no token in the pods; a trialTemplate's pods keep theirs). Not FrameworkController's "
    "own account, which NNI's FrameworkController page puts here: the training code would get the controller's "
    "rights.",
    "k8s.imagePullSecrets": "Secrets to pull the image: `- name: SECRET`.",
    "k8s.priorityClasses": "Trial priorities mapped to the cluster's PriorityClass names (`{1: high, 42: normal}`): "
    "a trial's pods run as the class of the smallest priority at or above its own (smaller goes first, as in "
    "the job queue; none above them all).",
    "k8s.nfs": "An NFS volume mounted in every pod: `{server, path, containerMountPath}`.",
    "k8s.nfs.server": "The NFS server.",
    "k8s.nfs.path": "The exported path.",
    "k8s.nfs.containerMountPath": "Where it is mounted in the pod.",
    "k8s.storage": "NNI v2's form of the volume: `{storageType: nfs, server, path, containerMountPath}` or "
    "`{storageType: azureStorage, azureAccount, azureShare, keyVaultName, keyVaultKey, containerMountPath}`.",
    "k8s.storage.storageType": "`nfs`, or `azureStorage`: an Azure File share mounted in every pod, its account key "
    "read from Azure Key Vault with the Azure CLI (`az login` first) when the experiment starts and kept only in a "
    "Secret of the experiment.",
    "k8s.storage.azureAccount": "The Azure storage account (NNI v1: `azureStorage.accountName`).",
    "k8s.storage.azureShare": "The file share in it (NNI v1: `azureStorage.azureShare`).",
    "k8s.storage.keyVaultName": "The Key Vault holding the account's key (NNI v1: `keyVault.vaultName`).",
    "k8s.storage.keyVaultKey": "The name of the secret in that vault holding the key (NNI v1: `keyVault.name`).",
    "k8s.storage.server": "The NFS server.",
    "k8s.storage.path": "The exported path.",
    "k8s.storage.containerMountPath": "Where it is mounted in the pod.",
    "k8s.imagePullSecrets[].name": "The Secret's name.",
    "k8s.checkpoint": "A per-trial claim for checkpoints, owned by no job: pausing a trial keeps it and activating "
    "mounts it again; it goes when the experiment is stopped or deleted. Kubeflow and FrameworkController mount it at "
    "`/var/lib/trialkit/checkpoint` (`TRIALKIT_CHECKPOINT_DIR`); without it, checkpoints are on the pod's disk and a "
    "pause loses them. AdaptDL always has it, at `/adaptdl/checkpoint`, with a share claim at `/adaptdl/share`.",
    "k8s.checkpoint.storageClass": "The claim's storage class (default: the cluster's).",
    "k8s.checkpoint.storageSize": "The claim's size (default 1Gi).",
    "k8s.keepFinishedJobs": "How long a finished trial's job (and its pods) stays before trialkit deletes it, "
    "for `kubectl logs` and `kubectl describe`.",
    "k8s.keepFinishedJobs.succeeded": "After success: a duration (default 10m).",
    "k8s.keepFinishedJobs.failed": "After failure or cancellation: a duration (default 1d).",
    "k8s.reuseMode": "Must be false: every trial is its own job.",
    # kubeflow
    "kubeflow.operator": "`pytorch-operator` (PyTorchJob), `tf-operator` (TFJob) or `trainjob` (Kubeflow Trainer v2's "
                         "TrainJob); unset: a PyTorchJob, or a TrainJob on a cluster that serves only Trainer v2 "
                         "(with a `trialTemplate`: a PyTorchJob, its kind, on any cluster).",
    "kubeflow.apiVersion": "Accepted for old NNI configs; objects are always rendered as `kubeflow.org/v1` "
                           "(a TrainJob as `trainer.kubeflow.org/v1alpha1`, which `v1alpha1` may name).",
    "kubeflow.runtime": "trialkit: a TrainJob's ClusterTrainingRuntime (default `torch-distributed`; "
                        "`deepspeed-distributed` for a DeepSpeed launcher's command). Only with a TrainJob.",
    "kubeflow.master": "The master (PyTorchJob; one replica) or chief (TFJob).",
    "kubeflow.worker": "The workers.",
    "kubeflow.ps": "The parameter servers (TFJob only).",
    "kubeflow.reportingRole": "The role whose task 0 ships the trial's records (`master`, `worker` or `ps`; default: "
    "`master` if present, else `worker`). Every pod runs a keeper; only this one reports.",
    "kubeflow.<role>.replicas": "How many pods of this role.",
    "kubeflow.<role>.command": "This role's command (default: trialCommand).",
    "kubeflow.<role>.dockerImage": "This role's image (default: the section's).",
    "kubeflow.<role>.cpuNumber": "CPUs per pod.",
    "kubeflow.<role>.gpuNumber": "GPUs per pod.",
    "kubeflow.<role>.memorySize": "Memory per pod: `4g`, `8192mb`, `1Gi` (a bare number is MiB).",
    "kubeflow.<role>.privateRegistryAuthPath": "Refused: create an image pull Secret and list it in imagePullSecrets.",
    "kubeflow.<role>.codeDirectory": "This role's code directory (NNI's `code_directory`; relative to the config "
    "file), shipped to its pods instead of trialCodeDirectory.",
    # frameworkcontroller
    "frameworkcontroller.taskRoles": "The task roles, each a group of identical pods.",
    "frameworkcontroller.configPath": "NNI's custom FrameworkController config: a Framework YAML file (relative to "
    "the config's folder) that is each trial's job, as in NNI: its task roles (name, taskNumber, the first "
    "container's command and image, the task's gpuNum, cpuNum, memoryMB) are the taskRoles when the section has "
    "none, and that first container runs the trial's keeper.",
    "frameworkcontroller.reportingRole": "The task role whose task 0 ships the trial's records (default: the role named "
    "`chief`, `master` or `worker`, in that order, else the first). Every task runs a keeper; only this one reports.",
    "frameworkcontroller.taskRoles[].name": "The role's name: 1 to 30 lowercase letters and digits (its tasks' "
    "headless Service is `<framework>-<name>`).",
    "frameworkcontroller.taskRoles[].taskNumber": "How many pods of this role: the nodes of a launcher that its "
    "command runs (`TRIALKIT_NUM_NODES`), task i at `<name>-<i>.<framework>-<name>`.",
    "frameworkcontroller.taskRoles[].command": "This role's command (default: trialCommand).",
    "frameworkcontroller.taskRoles[].dockerImage": "This role's image (default: the section's).",
    "frameworkcontroller.taskRoles[].cpuNumber": "CPUs per pod.",
    "frameworkcontroller.taskRoles[].gpuNumber": "GPUs per pod.",
    "frameworkcontroller.taskRoles[].memorySize": "Memory per pod: `4g`, `8192mb`, `1Gi` (a bare number is MiB).",
    "frameworkcontroller.taskRoles[].privateRegistryAuthPath": "Refused: use imagePullSecrets.",
    "frameworkcontroller.taskRoles[].codeDirectory": "This role's code directory (relative to the config file), "
    "shipped to its pods instead of trialCodeDirectory.",
    "frameworkcontroller.taskRoles[].frameworkAttemptCompletionPolicy": "When the role ends the trial.",
    "frameworkcontroller.taskRoles[].frameworkAttemptCompletionPolicy.minFailedTaskCount":
        "This many failed tasks fail the trial (-1: never).",
    "frameworkcontroller.taskRoles[].frameworkAttemptCompletionPolicy.minSucceededTaskCount":
        "This many succeeded tasks end the trial (-1: when all have ended).",
    # adaptdl
    "adaptdl.command": "The command (default: trialCommand).",
    "adaptdl.cpuNumber": "CPUs per replica.",
    "adaptdl.gpuNumber": "GPUs per replica.",
    "adaptdl.memorySize": "Memory per replica: `4g`, `8192mb`, `1Gi` (a bare number is MiB).",
    "adaptdl.adaptive": "AdaptDL's `preemptible`: its scheduler may stop and rescale the job.",
    "adaptdl.minReplicas": "The fewest replicas.",
    "adaptdl.maxReplicas": "The most replicas.",
    "adaptdl.tensorboardImage": "The image `trialkit experiment tensorboard` runs TensorBoard in (it needs a "
    "`tensorboard` command).",
}

# Kinds for keys read with Section.raw(), which does not say.
RAW_KINDS = {"memorySize": "size", "storageSize": "size", "imagePullSecrets": "list", "managerAddress": "string",
             "priorityClasses": "mapping"}
KIND_NAMES = {"text": "string", "integer": "integer", "number": "number", "boolean": "boolean",
              "section": "mapping", "sections": "list of mappings"}


@dataclass
class Key:
    path: str  # as the reference shows it: "worker.replicas", "taskRoles[].name"
    aliases: Tuple[str, ...] = ()
    kind: str = ""
    default: str = ""
    note: str = ""  # a limit the parser enforces: "at least 1"


@dataclass
class Table:
    name: str  # the description prefix: "top", "local", "k8s", "kubeflow", ...
    keys: List[Key] = field(default_factory=list)


# ---------------------------------------------------------------- top level


def top_level() -> Table:
    from trialkit.control import config

    fields = {f.name: f for f in dataclasses.fields(config.ExperimentConfig)}
    hints = typing.get_type_hints(config.ExperimentConfig)
    table = Table("top")
    for key in config.V2_KEYS:
        snake = "".join("_" + c.lower() if c.isupper() else c for c in key)
        item = fields.get(snake)
        kind, default = "", ""
        if item is not None:
            kind = _kind_of(hints[snake])
            if item.default is not dataclasses.MISSING and item.default is not None:
                default = _show(item.default)
        table.keys.append(Key(key, kind=_TOP_KINDS.get(key, kind), default=default or _TOP_DEFAULTS.get(key, "")))
    return table


# What the dataclass does not show (the key is read into another shape).
_TOP_KINDS = {"searchSpace": "mapping", "searchSpaceFile": "path", "trialCodeDirectory": "path",
              "useAnnotation": "boolean", "debug": "boolean", "experimentType": "string", "tuner": "mapping",
              "assessor": "mapping", "advisor": "mapping", "trainingService": "mapping",
              "maxExperimentDuration": "duration", "maxTrialDuration": "duration", "trialTemplate": "path",
              "experimentWorkingDirectory": "path"}
_TOP_DEFAULTS = {"trialCodeDirectory": ".", "trialConcurrency": "1", "trainingService": "{platform: local}"}


def _kind_of(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Union:  # Optional[X]
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) in (dict, tuple, list):
        return {dict: "mapping", tuple: "list", list: "list"}[typing.get_origin(hint)]
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(hint, "")


def _show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


# ---------------------------------------------------------------- local and ray


def options_table(platform: str) -> Table:
    """A platform that declares its keys in `_OPTIONS` (key -> (dataclass field, checker))."""
    from trialkit import platforms

    module = platforms.load(platform)
    config_class = module.parse_section({"platform": platform}, "trainingService").__class__
    defaults = {f.name: f.default for f in dataclasses.fields(config_class)}
    hints = typing.get_type_hints(config_class)
    table = Table(platform, [Key("platform", kind="string")])
    for key, (name, _check) in module._OPTIONS.items():
        default = defaults.get(name)
        shown = "" if default in (None, dataclasses.MISSING) else _show(default)
        kind = _kind_of(hints[name])
        table.keys.append(Key(key, kind=kind, default=shown))
    return table


# ---------------------------------------------------------------- Kubernetes


# Sections that make every Kubernetes parser ask every key it knows; several
# per platform where keys exclude each other (nfs or storage, pytorch or tf).
K8S_EXAMPLES: Dict[str, List[Dict[str, Any]]] = {
    "kubeflow": [
        {"operator": "pytorch-operator", "managerAddress": "10.0.0.1", "dockerImage": "img",
         "master": {"replicas": 1, "command": "python3 t.py", "cpuNumber": 1, "gpuNumber": 0, "memorySize": "1g"},
         "worker": {"replicas": 2}, "nfs": {"server": "10.0.0.2", "path": "/x", "containerMountPath": "/nfs"},
         "imagePullSecrets": [{"name": "pull"}], "reportingRole": "master",
         "checkpoint": {"storageClass": "dfs", "storageSize": "1Gi"},
         "keepFinishedJobs": {"succeeded": "10m", "failed": "1d"}},
        {"operator": "tf-operator", "managerAddress": "10.0.0.1", "dockerImage": "img",
         "ps": {"replicas": 1}, "worker": {"replicas": 1}, "master": {"replicas": 1},
         "storage": {"storageType": "nfs", "server": "10.0.0.2", "path": "/x", "containerMountPath": "/nfs"}},
        {"managerAddress": "10.0.0.1", "dockerImage": "img", "master": {"replicas": 1},
         "storage": {"storageType": "azureStorage", "azureAccount": "acct", "azureShare": "share",
                     "keyVaultName": "vault", "keyVaultKey": "key", "containerMountPath": "/nfs"}},
    ],
    "frameworkcontroller": [
        {"managerAddress": "10.0.0.1", "dockerImage": "img",
         "taskRoles": [{"name": "worker", "taskNumber": 2, "command": "python3 t.py",
                        "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceededTaskCount": 2}}],
         "nfs": {"server": "10.0.0.2", "path": "/x"}, "imagePullSecrets": [{"name": "pull"}],
         "reportingRole": "worker", "checkpoint": {"storageClass": "dfs", "storageSize": "1Gi"},
         "keepFinishedJobs": {"succeeded": "10m", "failed": "1d"}},
        {"managerAddress": "10.0.0.1", "dockerImage": "img", "taskRoles": [{"name": "worker"}],
         "storage": {"storageType": "nfs", "server": "10.0.0.2", "path": "/x"}},
        {"managerAddress": "10.0.0.1", "dockerImage": "img", "taskRoles": [{"name": "worker"}],
         "storage": {"storageType": "azureStorage", "azureAccount": "acct", "azureShare": "share",
                     "keyVaultName": "vault", "keyVaultKey": "key", "containerMountPath": "/nfs"}},
    ],
    "adaptdl": [
        {"managerAddress": "10.0.0.1", "image": "img", "checkpoint": {"storageClass": "dfs", "storageSize": "1Gi"},
         "nfs": {"server": "10.0.0.2", "path": "/x"}, "imagePullSecrets": [{"name": "pull"}],
         "keepFinishedJobs": {"succeeded": "10m", "failed": "1d"}},
        {"managerAddress": "10.0.0.1", "image": "img",
         "storage": {"storageType": "nfs", "server": "10.0.0.2", "path": "/x"}},
        {"managerAddress": "10.0.0.1", "image": "img",
         "storage": {"storageType": "azureStorage", "azureAccount": "acct", "azureShare": "share",
                     "keyVaultName": "vault", "keyVaultKey": "key", "containerMountPath": "/nfs"}},
    ],
}
K8S_PLATFORMS = tuple(K8S_EXAMPLES)


@contextlib.contextmanager
def _recording() -> Iterator[List[Tuple[str, str, Tuple[str, ...], str, Dict[str, Any]]]]:
    """Record every key a k8s_config.Section is asked for: (where, name, aliases, kind, kwargs)."""
    from trialkit.platforms.kubernetes import config as k8s_config

    Section = k8s_config.Section
    asked: List[Tuple[str, str, Tuple[str, ...], str, Dict[str, Any]]] = []
    originals = {name: getattr(Section, name) for name in ("raw",) + tuple(KIND_NAMES)}
    current: List[Tuple[str, Dict[str, Any]]] = []

    def typed(kind: str) -> Callable[..., Any]:
        def method(self, name, *aliases, **kwargs):
            current.append((kind, kwargs))
            try:
                return originals[kind](self, name, *aliases, **kwargs)
            finally:
                current.pop()
        return method

    def raw(self, name, *aliases):
        kind, kwargs = current[-1] if current else ("raw", {})
        asked.append((self.where, name, aliases, kind, kwargs))
        return originals["raw"](self, name, *aliases)

    Section.raw = raw
    for kind in KIND_NAMES:
        setattr(Section, kind, typed(kind))
    try:
        yield asked
    finally:
        for name, method in originals.items():
            setattr(Section, name, method)


def _k8s_path(platform: str, where: str, name: str) -> str:
    import re

    from trialkit.platforms.kubernetes import kubeflow

    rest = re.sub(r"\[\d+\]", "[]", where[len("trainingService"):].lstrip("."))
    if platform == "kubeflow" and rest.split(".")[0] in kubeflow.ROLES:
        rest = "<role>" + rest[len(rest.split(".")[0]):]
    return f"{rest}.{name}" if rest else name


def k8s_keys(platform: str) -> Dict[str, Key]:
    """Every key `platform`'s parse_section asks for, by path, in the order asked."""
    from trialkit import platforms

    module = platforms.load(platform)
    keys: Dict[str, Key] = {}
    for example in K8S_EXAMPLES[platform]:
        with _recording() as asked:
            module.parse_section({"platform": platform, **copy.deepcopy(example)}, "trainingService")
        for where, name, aliases, kind, kwargs in asked:
            path = _k8s_path(platform, where, name)
            if path in keys:
                continue
            default = kwargs.get("default")
            keys[path] = Key(
                path, aliases=tuple(aliases), kind=RAW_KINDS.get(name) or KIND_NAMES.get(kind, "string"),
                default="" if default in (None, False) else _show(default),
                note=f"at least {kwargs['minimum']}" if kwargs.get("minimum") is not None else "",
            )
    return keys


def k8s_tables() -> List[Table]:
    """The keys all Kubernetes platforms share (one table), then each platform's own."""
    per_platform = {p: k8s_keys(p) for p in K8S_PLATFORMS}
    shared = set.intersection(*(set(keys) for keys in per_platform.values()))
    first = per_platform[K8S_PLATFORMS[0]]
    tables = [Table("k8s", _outer_first([first[path] for path in first if path in shared]))]
    for platform, keys in per_platform.items():
        tables.append(Table(platform, _outer_first([key for path, key in keys.items() if path not in shared])))
    return tables


def _outer_first(keys: List[Key]) -> List[Key]:
    """A section's own keys, then the keys inside its mappings (in the order the parser asked)."""
    return sorted(keys, key=lambda key: "." in key.path or "[" in key.path)


# ---------------------------------------------------------------- tuners, assessors, search space


def tuner_rows() -> List[Tuple[str, str, str, str]]:
    from trialkit.control import tuners

    aliases = {real: alias for alias, real in tuners.ALIASES.items()}
    return [(name, f"`{aliases[name]}`" if name in aliases else "", ", ".join(f"`{a}`" for a in cls.ARGS),
             cls.DEFAULT_MODE) for name, cls in tuners.TUNERS.items()]


def tpe_args() -> List[str]:
    from trialkit.control.tuners import classic

    return list(classic._TPE_ARGS)


def assessor_rows() -> List[Tuple[str, str]]:
    from trialkit.control import assessors

    rows = []
    for name, cls in assessors.ASSESSORS.items():
        args = ", ".join(f"`{a}`" for a in cls.ARGS)
        if name == "Pruner":
            args += " and the pruner's own arguments"
        rows.append((name, args))
    return rows


# ---------------------------------------------------------------- NNI v1


# A v1 config per platform with a marker for every leaf: convert_v1 moves each
# marker to its v2 key. Keys are those of NNI's v1 documentation (the seeds).
V1_COMMON = {
    "authorName": "@", "experimentName": "@", "description": "@", "trialConcurrency": "@", "maxExecDuration": "@",
    "maxTrialNum": "@", "searchSpacePath": "@", "useAnnotation": False, "multiPhase": False, "multiThread": False,
    "nniManagerIp": "@", "logDir": "@", "debug": "@", "versionCheck": "@", "logLevel": "@", "logCollection": "@",
    "tuner": {"builtinTunerName": "@", "classArgs": "@"},
    "assessor": {"builtinAssessorName": "@", "classArgs": "@"},
}
V1_ROLE = {"command": "@", "gpuNum": "@", "cpuNum": "@", "memoryMB": "@", "image": "@"}
V1_PLATFORMS: Dict[str, Dict[str, Any]] = {
    "local": {"trial": {"command": "@", "codeDir": "@", "gpuNum": "@"},
              "localConfig": {"gpuIndices": "@", "maxTrialNumPerGpu": "@", "useActiveGpu": "@"}},
    "kubeflow": {"trial": {"codeDir": "@", "master": dict(replicas="@", **V1_ROLE), "worker": dict(replicas="@", **V1_ROLE),
                           "ps": dict(replicas="@", **V1_ROLE)},
                 "kubeflowConfig": {"operator": "@", "apiVersion": "@", "storage": "nfs",
                                    "nfs": {"server": "@", "path": "@"}}},
    "frameworkcontroller": {
        "trial": {"codeDir": "@", "taskRoles": [dict(V1_ROLE, name="@", taskNum="@", frameworkAttemptCompletionPolicy={
            "minFailedTaskCount": "@", "minSucceededTaskCount": "@"})]},
        "frameworkcontrollerConfig": {"storage": "nfs", "nfs": {"server": "@", "path": "@"},
                                      "serviceAccountName": "@"}},
    "adl": {"trial": {"command": "@", "codeDir": "@", "gpuNum": "@", "cpuNum": "@", "memorySize": "@", "image": "@",
                      "imagePullSecrets": "@", "adaptive": "@", "namespace": "@",
                      "checkpoint": {"storageClass": "@", "storageSize": "@"},
                      "nfs": {"server": "@", "path": "@", "containerMountPath": "@"}}},
}


def _mark(value: Any, path: str) -> Any:
    """Replace every "@" leaf with a marker naming its path."""
    if isinstance(value, dict):
        return {k: _mark(v, f"{path}.{k}" if path else k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mark(v, f"{path}[]") for v in value]
    return f"@{path}" if value == "@" else value


def _leaves(value: Any, path: str = "") -> Iterator[Tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v, f"{path}[]")
    else:
        yield path, value


def v1_mapping(platform: str) -> List[Tuple[str, List[str]]]:
    """(v1 key path, the v2 key paths its value lands at; none when trialkit drops it), for the v1 example."""
    from trialkit.control.config import convert_v1

    v1 = _mark({**V1_COMMON, "trainingServicePlatform": platform, **V1_PLATFORMS[platform]}, "")
    landed: Dict[str, List[str]] = {}
    for path, value in _leaves(convert_v1(v1)):
        if isinstance(value, str) and value.startswith("@"):
            landed.setdefault(value[1:], []).append(path)
    return [(path, landed.get(path, [])) for path, value in _leaves(v1)
            if isinstance(value, str) and value.startswith("@")]


def _platform_key(v1_key: str) -> bool:
    return v1_key.startswith("trial.") or v1_key.split(".")[0].endswith("Config")


# ---------------------------------------------------------------- descriptions


def all_tables() -> List[Table]:
    return [top_level(), options_table("local"), options_table("ray")] + k8s_tables()


def description_keys() -> List[str]:
    return [f"{table.name}.{key.path}" for table in all_tables() for key in table.keys]


def missing_descriptions() -> List[str]:
    return [name for name in description_keys() if name not in DESCRIPTIONS]


def stale_descriptions() -> List[str]:
    from trialkit.control import config

    known = set(description_keys())
    stale = [name for name in DESCRIPTIONS if name not in known]
    return stale + [f"NNI_V2_NOTES.{key}" for key in NNI_V2_NOTES if key not in config.V2_KEYS]


# ---------------------------------------------------------------- Markdown


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def key_table(table: Table, prefix: str = "") -> str:
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key in table.keys:
        name = f"`{prefix}{key.path}`"
        if key.aliases:
            name += " (also " + ", ".join(f"`{a}`" for a in key.aliases) + ")"
        kind = key.kind + (f", {key.note}" if key.note else "")
        default = f"`{key.default}`" if key.default else ""
        meaning = DESCRIPTIONS.get(f"{table.name}.{key.path}", "")
        lines.append(f"| {name} | {kind} | {default} | {_cell(meaning)} |")
    return "\n".join(lines)


def render_top() -> str:
    from trialkit.control import config

    ours = ", ".join(f"`{k}`" for k in config.TRIALKIT_KEYS)
    refused = "\n".join(f"- `{key}`: {why}." for key, why in config.UNSUPPORTED.items())
    return (f"{key_table(top_level())}\n\n"
            f"trialkit's own keys: {ours}. Every other key is NNI's, with NNI's meaning. NNI keys that are refused, "
            f"with the reason the error gives:\n\n{refused}\n")


def render_tuners() -> str:
    from trialkit.control import assessors, tuners

    lines = ["| tuner | also named | classArgs | optimize_mode default |", "| --- | --- | --- | --- |"]
    lines += [f"| `{name}` | {alias} | {args} | `{mode}` |" for name, alias, args, mode in tuner_rows()]
    lines += ["", "`tpe_args` (TPE) takes " + ", ".join(f"`{a}`" for a in tpe_args()) + ".", "",
              "TPE is optuna's TPESampler, univariate as NNI's TPE is: trialkit passes `multivariate=False` and "
              "the constant liar (on unless `constant_liar_type: null`) to optuna, whose defaults for both changed "
              "in optuna 5.0; setup.py allows optuna 4 and 5 (`optuna>=4,<6`, the versions this has been run with). "
              "Evolution's population is its latest `population_size` results (the oldest leaves as a new one "
              "joins).", "",
              "No tuner proposes a point twice (NNI 3.0's deduplication): a repeat is replaced by the first untried "
              "point of the grid, or a fresh random one where a parameter is continuous, and a finite space whose "
              "every point was tried ends the search (`search space exhausted` is printed); Random's "
              "`deduplicate: false` samples with replacement instead, as Determined's random and adaptive_asha "
              "searchers do (a Determined config's tuner is that). A resumed experiment's "
              "tuner is rebuilt from its stored trials and goes on as the uninterrupted one would: each proposal "
              "draws from a random state of its own, derived from the seed and its parameter id.", "",
              "Hyperband, BOHB, PBT and the samplers are described in [Searches](../searches.md): their budgets, "
              "rounds, generations, models, and what a resumed one does. An assessor beside Hyperband, BOHB or PBT "
              "is refused, as NNI refuses it.", "",
              "NNI tuners trialkit does not carry, with what the error says instead:", "",
              "| NNI's tuner | why not | use |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | {why} | {instead} |" for name, (why, instead) in tuners.NNI_ONLY.items()]
    lines += ["",
              "| assessor | classArgs |", "| --- | --- |"]
    lines += [f"| `{name}` | {args} |" for name, args in assessor_rows()]
    lines += ["", "The `Pruner` assessor's `pruner` is one of "
              + ", ".join(f"`{p}`" for p in assessors.PRUNERS) + " (optuna's pruners of those names). "
              + (("NNI assessors trialkit does not carry: " + ", ".join(f"`{n}`" for n in assessors.NNI_ONLY) + ".")
                 if assessors.NNI_ONLY else "NNI's built-in assessors (`Medianstop`, `Curvefitting`) are all here.")]
    return "\n".join(lines) + "\n"


def render_search_space() -> str:
    from trialkit.control import searchspace

    lines = ["| `_type` | `_value` |", "| --- | --- |",
             "| `choice` | a list of options; an option that is a mapping with `_name` is a nested space |"]
    lines += [f"| `{kind}` | `[{', '.join(args)}]` |" for kind, args in searchspace.NUMERIC_ARGS.items()]
    lines += ["", "GridSearch enumerates " + ", ".join(f"`{t}`" for t in searchspace.GRID_TYPES)
              + " and refuses the continuous types."]
    return "\n".join(lines) + "\n"


def render_platform(name: str) -> str:
    """The trainingService table of one platform (`kubernetes` for the shared keys)."""
    tables = {t.name: t for t in all_tables()}
    return key_table(tables["k8s" if name == "kubernetes" else name]) + "\n"


def _v1_rows(rows: Sequence[Tuple[str, List[str]]]) -> str:
    lines = ["| NNI v1 key | trialkit (v2) key |", "| --- | --- |"]
    for v1, v2 in rows:
        lines.append(f"| `{v1}` | " + (", ".join(f"`{k}`" for k in v2) if v2 else "read and ignored") + " |")
    return "\n".join(lines) + "\n"


def render_v1_common() -> str:
    """The keys every v1 config has; a cluster platform also takes nniManagerIp as its managerAddress."""
    merged: Dict[str, List[str]] = {}
    for platform in ("local", "kubeflow"):
        for v1, v2 in v1_mapping(platform):
            if not _platform_key(v1) or v1.startswith("trial.") and v1.count(".") == 1 and platform == "local":
                merged.setdefault(v1, [])
                merged[v1] += [k for k in v2 if k not in merged[v1]]
    return _v1_rows(list(merged.items()))


def render_v1(platform: str) -> str:
    """The keys of one platform's `trial:` and `<platform>Config:` sections."""
    # trial.command, codeDir and gpuNum are in the common table unless this platform also takes them.
    return _v1_rows([(v1, v2) for v1, v2 in v1_mapping(platform) if _platform_key(v1)
                     and not (v1.count(".") == 1 and v1.startswith("trial.")
                              and not any(k.startswith("trainingService.") for k in v2))])


# Where trialkit reads an NNI v2 key differently from NNI (every other NNI key: as NNI does).
NNI_V2_NOTES: Dict[str, str] = {
    "trainingService": "platforms `local`, `kubeflow`, `frameworkcontroller`, `adaptdl` (also `adl`) and `ray`; "
    "NNI's remote, openpai, aml, dlc and hybrid (a list) are not available",
    "tuner": "NNI's built-in tuners by name and by NNI 3.0's aliases (the table below); custom tuner classes are not "
    "supported; TPE is univariate as NNI's; no tuner proposes a point twice, a resumed search included",
    "assessor": "`Medianstop`, `Curvefitting` (NNI's classArgs), `ASHA`, or `Pruner` (optuna's pruners)",
    "useAnnotation": "must be false",
    "advisor": "taken as the tuner, as NNI 3.0 takes it: Hyperband and BOHB with NNI's classArgs, each trial's "
    "budget among its parameters as `TRIAL_BUDGET`; an assessor beside one is refused, and so is a tuner, as in NNI",
    "nniManagerIp": "for cluster platforms, the address pods reach the manager at (`managerAddress`); on local "
    "accepted and not used, as in NNI (a note says so at the start)",
    "trialGpuNumber": "local: a trial waits for that many free GPUs and gets exactly them, as in NNI's local mode; "
    "ray: its actor's `num_gpus`; refused on the Kubernetes platforms (set `gpuNumber` per role)",
    "debug": "accepted; `true` is noted at the start and changes nothing (each trial's output is in its dir)",
    "logLevel": "NNI's levels (`fatal` to `trace`); another than `info` is noted at the start: trialkit's manager "
    "has one level",
    "experimentWorkingDirectory": "holds the experiment's dir; the default is `$TRIALKIT_HOME/experiments`",
    "trialConcurrency": "the same meaning: that many trials at once (local, with no `pools.yml`: no other cap, "
    "whatever the machine's CPUs); a resource pool's declared slots or GPUs may hold some back, and `trialkit run` "
    "says so at the start and in its progress line",
}


def render_nni_v2() -> str:
    """NNI's v2 keys beside trialkit's reading of them."""
    from trialkit.control import config

    lines = ["| NNI v2 key | in trialkit |", "| --- | --- |"]
    for key in config.V2_KEYS:
        if key in config.TRIALKIT_KEYS and key not in NNI_V2_NOTES:
            continue
        lines.append(f"| `{key}` | " + _cell(NNI_V2_NOTES.get(key, "the same key, the same meaning")) + " |")
    for key, why in config.UNSUPPORTED.items():
        lines.append(f"| `{key}` | refused: {_cell(why)} |")
    lines += ["", "Added by trialkit: " + ", ".join(f"`{k}`" for k in config.TRIALKIT_KEYS
                                                   if k not in NNI_V2_NOTES) + "."]
    return "\n".join(lines) + "\n"


def render_statuses(platform: str) -> str:
    """How a platform's job status becomes a trial status, from the platform's own tables."""
    from trialkit.platforms.kubernetes import (
        adaptdljob as adaptdl,
        frameworkcontroller,
        platform as k8s_platform,
        kubeflow,
    )

    if platform == "kubeflow":
        lines = ["| job condition (status True), first match wins | trial status |", "| --- | --- |"]
        lines += [f"| `{cond}` | `{status}` |" for cond, status in kubeflow.CONDITIONS]
        lines.append("| none yet | `WAITING` |")
    elif platform == "frameworkcontroller":
        lines = ["| `status.state` | trial status |", "| --- | --- |"]
        lines += [f"| `{state}` | `{status}` |" for state, status in frameworkcontroller.STATES.items()]
        lines.append("| `Completed` | `SUCCEEDED` when `attemptStatus.completionStatus.type.name` is Succeeded; "
                     f"`USER_CANCELED` for code {frameworkcontroller.STOP_REQUESTED} (stopped); else `FAILED` |")
    else:
        lines = ["| `status.phase` | trial status |", "| --- | --- |"]
        lines += [f"| `{phase}` | `{status}` |" for phase, status in adaptdl.PHASES.items()]
    failures = ", ".join(f"`{reason}`" for reason in sorted(k8s_platform.IMAGE_FAILURES))
    lines += ["", f"Before the job ends, a pod waiting with {failures} fails the trial at once, with the pod's "
              "message as the reason; a job still `WAITING` whose pod runs is `RUNNING` (its keeper need not have "
              "reached the manager yet)."]
    return "\n".join(lines) + "\n"


# NNI 3.0's built-in tuners and advisors (its builtin_algorithms.yml), each with what trialkit makes of it.
NNI_TUNERS = ("TPE", "Random", "Anneal", "Evolution", "GridSearch", "Batch", "GP", "PBT", "Hyperband", "BOHB", "SMAC",
              "Metis", "DNGO", "PPO", "NetworkMorphism", "RegularizedEvolutionTuner", "TPE_legacy")


def render_nni_tuners() -> str:
    from trialkit.control import tuners

    aliases = {real: alias for alias, real in {**tuners.ALIASES, **tuners.NNI_ONLY_ALIASES}.items()}
    lines = ["| NNI's tuner | in trialkit |", "| --- | --- |"]
    for name in NNI_TUNERS:
        spelled = f"`{name}`" + (f" (`{aliases[name]}`)" if name in aliases else "")
        if name in tuners.NNI_ONLY:
            why, instead = tuners.NNI_ONLY[name]
            lines.append(f"| {spelled} | refused: {why}; use {instead} |")
        else:
            lines.append(f"| {spelled} | the same name and classArgs: {SEARCH_NOTES[name]} |")
    return "\n".join(lines) + "\n"


SEARCH_NOTES = {
    "TPE": "optuna's TPESampler, univariate as NNI's",
    "Random": "as NNI's; `deduplicate: false` samples with replacement",
    "Anneal": "hyperopt's anneal, written out",
    "Evolution": "tournaments over the latest `population_size` results",
    "GridSearch": "the grid of the discrete types; a continuous one is refused",
    "Batch": "each option of its one choice, in order",
    "GP": "scikit-learn's Gaussian process, NNI's utilities and acquisition search",
    "PBT": "NNI's generations; with trialkit's `synchronous: false` asynchronous, as Ray Tune's (no generation "
           "waits for its slowest member); NNI's "
           "`load_checkpoint_dir`/`save_checkpoint_dir`, and trialkit's own checkpoint dir copied",
    "Hyperband": "NNI's brackets and rounds, `TRIAL_BUDGET`; `exec_mode` serial or parallelism",
    "BOHB": "NNI's brackets, its KDE model through statsmodels as NNI's",
}


GENERATED: Dict[str, Callable[[], str]] = {
    "status-kubeflow": lambda: render_statuses("kubeflow"),
    "status-frameworkcontroller": lambda: render_statuses("frameworkcontroller"),
    "status-adaptdl": lambda: render_statuses("adaptdl"),
    "nni-v2": render_nni_v2,
    "nni-tuners": render_nni_tuners,
    "config-top": render_top,
    "config-tuners": render_tuners,
    "config-search-space": render_search_space,
    "config-local": lambda: render_platform("local"),
    "config-ray": lambda: render_platform("ray"),
    "config-kubernetes": lambda: render_platform("kubernetes"),
    "config-kubeflow": lambda: render_platform("kubeflow"),
    "config-frameworkcontroller": lambda: render_platform("frameworkcontroller"),
    "config-adaptdl": lambda: render_platform("adaptdl"),
    "v1-common": render_v1_common,
    "v1-local": lambda: render_v1("local"),
    "v1-kubeflow": lambda: render_v1("kubeflow"),
    "v1-frameworkcontroller": lambda: render_v1("frameworkcontroller"),
    "v1-adl": lambda: render_v1("adl"),
}


def render(name: str) -> str:
    return GENERATED[name]()


def main(argv: Sequence[str]) -> int:
    if "--check" in argv:
        problems = [f"no description for {k}" for k in missing_descriptions()]
        problems += [f"description for a key that is gone: {k}" for k in stale_descriptions()]
        print("\n".join(problems) or "every key is described")
        return 1 if problems else 0
    for name in GENERATED:
        print(f"<!-- {name} -->\n{render(name)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    sys.exit(main(sys.argv[1:]))
