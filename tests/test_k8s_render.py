"""Rendering trials for Kubernetes: every object valid for a real API server.

No API server runs here, so each rendered object is validated strictly
against the real schemas (k8s_schemas: kubernetes-validate for built-in kinds
and pod templates, the operators' CRDs for the jobs) plus the API server's
own rules, for generated option combinations (hypothesis) and for the
examples and the seeds' NNI configs. The rest checks what a user relies on:
the environment contract in the pods, no secret in the output, the AdaptDL
specifics, trialTemplates, and one-line errors for bad configs.
"""
from __future__ import annotations

import json
import string
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import k8s_schemas
import k8s_strategies as gen
from trialkit.control.config import load_config
from trialkit.errors import UserError
from trialkit.platforms.kubernetes import (
    adaptdljob as adaptdl,
    frameworkcontroller,
    config as k8s_config,
    kubeflow,
)
from trialkit.platforms import load
from trialkit.platforms.kubernetes import render as k8s
from trialkit.platforms.base import TrialSpec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "kubernetes"
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JOB_KINDS = set(k8s_schemas.CRD_FILES)


def spec_for(command: str = "python3 train.py --lr 0.1", experiment: str = "Exp1aB", trial: str = "t7") -> TrialSpec:
    return TrialSpec(
        experiment_id=experiment,
        trial_id=trial,
        sequence=7,
        command=command,
        env={
            "TRIALKIT_TOKEN": gen.TOKEN,
            "TRIALKIT_MANAGER_URL": "http://127.0.0.1:8081/api/v1",
            "TRIALKIT_PARAMETERS": '{"lr": 0.1}',
            "TRIALKIT_TRIAL_DIR": "/home/me/exp/trials/t7",
            "TRIALKIT_RESTART_COUNT": "0",
        },
    )


def parse(section: dict):
    return load(section["platform"]).parse_section(section, "trainingService")


def job_of(objects):
    jobs = [o for o in objects if o["kind"] in JOB_KINDS]
    assert len(jobs) == 1 and objects[-1] is jobs[0], "the job is rendered once, last"
    return jobs[0]


def containers(objects):
    """(pod template, trial container) for every role of the job."""
    for template in k8s_schemas.pod_templates(job_of(objects)):
        trial = [c for c in template["spec"]["containers"] if c.get("command") == k8s.RUN_COMMAND]
        assert len(trial) == 1
        yield template, trial[0]


def env_of(container) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def check_contract(objects, config, spec: TrialSpec) -> None:
    """What every platform promises about a trial's objects."""
    k8s_schemas.validate_objects(objects)
    assert gen.TOKEN not in json.dumps(objects), "render must not write the token"
    names = k8s.trial_names(spec)
    for obj in objects:
        assert obj["metadata"]["namespace"] == config.common.namespace
        assert obj["metadata"]["labels"][k8s.LABEL_EXPERIMENT] == names.experiment_label
    for template, container in containers(objects):
        env = env_of(container)
        assert template["metadata"]["labels"] == names.labels
        # The user's command travels as data, exactly as given.
        assert container["command"] == ["/bin/sh", "/opt/trialkit/scripts/run.sh"] and "args" not in container
        assert env["TRIALKIT_COMMAND"].strip()
        assert env["TRIALKIT_TOKEN"] == {"secretKeyRef": {"name": job_of(objects)["metadata"]["name"], "key": "TRIALKIT_TOKEN"}}
        assert env["TRIALKIT_EXPERIMENT_ID"] == spec.experiment_id and env["TRIALKIT_TRIAL_ID"] == spec.trial_id
        assert env["TRIALKIT_SEQUENCE"] == str(spec.sequence)
        assert env["TRIALKIT_PARAMETERS"] == spec.env["TRIALKIT_PARAMETERS"]
        assert env["TRIALKIT_PLATFORM"] == config.platform
        assert env["TRIALKIT_TRIAL_DIR"] == k8s.POD_TRIAL_DIR
        # Its own account with no rights (no token mounted), unless the config names one.
        accounts = [o for o in objects if o["kind"] == "ServiceAccount"]
        if config.common.service_account:
            assert template["spec"]["serviceAccountName"] == config.common.service_account and not accounts
        else:
            [account] = accounts
            assert template["spec"]["serviceAccountName"] == account["metadata"]["name"]
            assert account["automountServiceAccountToken"] is False
        # The store's count, but never over AdaptDL's own (ADAPTDL_NUM_RESTARTS, one higher at each rescale).
        assert env.get("TRIALKIT_RESTART_COUNT") == (None if config.platform == "adaptdl" else "0"), config.platform
        url = urlsplit(env["TRIALKIT_MANAGER_URL"])
        assert (url.hostname, url.port, url.path) == (config.common.manager_address, gen.MANAGER_PORT, "/api/v1")
        keeper = int(env["TRIALKIT_GRACE_SECONDS"])
        assert template["spec"]["terminationGracePeriodSeconds"] > keeper == config.common.keeper_grace_seconds
        assert container["lifecycle"]["preStop"] == {"exec": {"command": ["/bin/sh", "/opt/trialkit/scripts/cleanup.sh"]}}
        scripts = next(v for v in template["spec"]["volumes"] if v["name"] == "trialkit-scripts")
        assert scripts["configMap"]["defaultMode"] == 0o755 == 493
    configmap = next(o for o in objects if o["kind"] == "ConfigMap")
    assert configmap["data"] == {name: (ROOT / "scripts" / name).read_text() for name in ("run.sh", "cleanup.sh", "fetch.py")}
    assert k8s.render_trial(config, spec) == objects, "rendering is deterministic"


# --- every option combination renders valid objects ------------------------


@SETTINGS
@given(section=gen.kubeflow_sections(), spec=gen.trial_specs())
def test_kubeflow_renders_valid_objects(section, spec):
    config = parse(section)
    objects = k8s.render_trial(config, spec)
    check_contract(objects, config, spec)
    job = job_of(objects)
    operator = kubeflow.OPERATORS[config.operator]
    assert job["kind"] == operator.kind
    replicas = job["spec"][operator.replicas_field]
    assert {k: v["replicas"] for k, v in replicas.items()} == {operator.replica_types[r.name]: r.count for r in config.roles}
    for role in config.roles:
        container = next(c for c in replicas[operator.replica_types[role.name]]["template"]["spec"]["containers"] if c["name"] == operator.container)
        assert env_of(container)["TRIALKIT_COMMAND"] == (role.command or spec.command)
        assert container["image"] == (role.image or config.common.image)
        memory = role.resources.memory_mib
        assert container.get("resources", {}).get("limits", {}).get("memory") == (f"{memory}Mi" if memory else None)
    assert len(job["metadata"]["name"]) <= kubeflow.NAME_BUDGET


@SETTINGS
@given(section=gen.frameworkcontroller_sections(), spec=gen.trial_specs())
def test_frameworkcontroller_renders_valid_objects(section, spec):
    config = parse(section)
    objects = k8s.render_trial(config, spec)
    check_contract(objects, config, spec)
    job = job_of(objects)
    assert [r["name"] for r in job["spec"]["taskRoles"]] == [t.role.name for t in config.task_roles]
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    for rendered, task_role in zip(job["spec"]["taskRoles"], config.task_roles):
        assert rendered["taskNumber"] == task_role.role.count
        pod = rendered["task"]["pod"]
        assert pod["spec"]["restartPolicy"] == "Never"
        assert rendered["task"]["podGracefulDeletionTimeoutSec"] > config.common.termination_grace_seconds
        # Its tasks are found by name, {role}-{index}.{framework}-{role}, and know how many they are.
        assert pod["spec"]["hostname"] == "{{FC_TASKROLE_NAME}}-{{FC_TASK_INDEX}}"
        service = services[pod["spec"]["subdomain"]]
        assert pod["spec"]["subdomain"] == f"{job['metadata']['name']}-{rendered['name']}"
        assert k8s_schemas.DNS_LABEL.match(pod["spec"]["subdomain"]) and len(pod["spec"]["subdomain"]) <= 63
        assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
        assert service["spec"]["selector"] == {"FC_FRAMEWORK_NAME": job["metadata"]["name"],
                                               "FC_TASKROLE_NAME": rendered["name"]}
        [container] = [c for c in pod["spec"]["containers"] if c["name"] == "trial"]
        assert env_of(container)["TRIALKIT_NUM_NODES"] == str(task_role.role.count)
    assert len(services) == len(config.task_roles)
    # FrameworkController sets no defaults: every field it reads is there.
    assert job["spec"]["executionType"] == "Start" and set(job["spec"]["retryPolicy"]) == {"fancyRetryPolicy", "maxRetryCount"}


@SETTINGS
@given(section=gen.adaptdl_sections(), spec=gen.trial_specs())
def test_adaptdl_renders_valid_objects(section, spec):
    config = parse(section)
    objects = k8s.render_trial(config, spec)
    check_contract(objects, config, spec)
    job = job_of(objects)
    assert len(job["metadata"]["name"]) <= adaptdl.NAME_BUDGET
    assert job["spec"]["preemptible"] is config.preemptible
    account = [] if config.common.service_account else ["ServiceAccount"]
    assert [o["kind"] for o in objects] == ["Secret", *account, "ConfigMap"] + ["PersistentVolumeClaim"] * 3 + \
        ["AdaptDLJob"]


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.text(alphabet=string.ascii_letters + string.digits + "_-.", min_size=1, max_size=90), min_size=2, max_size=3),
    separator=st.sampled_from(["-", ""]),
)
def test_object_names_are_valid_and_distinct(parts, separator):
    name = k8s.object_name(["tk", *parts], 48, separator)
    pattern = k8s_schemas.DNS_1035 if separator else k8s_schemas.re.compile(r"^[a-z0-9]{1,63}$")
    assert pattern.match(name) and len(name) <= 48
    # Names that differ only in case, or only where characters were replaced, stay distinct.
    assert k8s.object_name(["tk", *[p.swapcase() for p in parts]], 48, separator) != name or all(p == p.swapcase() for p in parts)
    assert k8s.object_name(["tk", *parts], 48, separator) == name


def test_label_values_keep_valid_ids_and_fix_others():
    assert k8s.label_value("GdkBk7Xa") == "GdkBk7Xa"
    for raw in ("-bad start", "x" * 80, "__", "a/b"):
        value = k8s.label_value(raw)
        assert k8s_schemas.LABEL_VALUE.match(value) and len(value) <= 63
    assert k8s.label_value("x" * 80) != k8s.label_value("x" * 81)


# --- the examples and the seeds' NNI configs --------------------------------


def example_section(path: Path) -> dict:
    config = yaml.safe_load(path.read_text())
    if "trainingServicePlatform" in config:
        return load(config["trainingServicePlatform"]).from_v1(config)
    return config["trainingService"]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yml")), ids=lambda p: p.name)
def test_examples_render_cleanly(path, monkeypatch):
    monkeypatch.chdir(EXAMPLES)  # a trialTemplate is named relative to its config
    config_file = yaml.safe_load(path.read_text())
    config = parse(example_section(path))
    command = config_file.get("trialCommand") or config_file["trial"].get("command") or "python3 train.py"
    objects = k8s.render_trial(config, spec_for(command))
    check_contract(objects, config, spec_for(command))
    for template, container in containers(objects):
        # Pods put on GPU nodes (tolerating their taint) ask for a GPU: else they hold a GPU node and use none.
        if any(t.get("key") == k8s.GPU_RESOURCE for t in template["spec"].get("tolerations", [])):
            assert int(container.get("resources", {}).get("limits", {}).get(k8s.GPU_RESOURCE, 0)) >= 1, path.name


V1_SEEDS = {
    # shared/seeds/000: NNI's AdaptDL page, as written.
    "adl": """
authorName: default
experimentName: cifar_adl
trialConcurrency: 1
maxExecDuration: 3h
maxTrialNum: 10
nniManagerIp: 10.20.41.10
trainingServicePlatform: adl
searchSpacePath: search_space.json
useAnnotation: false
tuner:
  builtinTunerName: TPE
  classArgs:
    optimize_mode: minimize
trial:
  command: python3 /main_nni.py
  codeDir: .
  gpuNum: 1
  image: registry.petuum.com/dev/nni:adaptdl
  imagePullSecrets:
    - name: imagepullsecret
  adaptive: true
  checkpoint:
    storageClass: dfs
    storageSize: 1Gi
  nfs:
    server: 172.20.188.236
    path: /
    containerMountPath: /nfs
""",
    # shared/seeds/001: NNI's FrameworkController page, placeholders filled.
    "frameworkcontroller": """
authorName: default
experimentName: example_mnist
trialConcurrency: 1
maxExecDuration: 10h
maxTrialNum: 100
trainingServicePlatform: frameworkcontroller
searchSpacePath: ~/nni/examples/trials/mnist-tfv1/search_space.json
useAnnotation: false
tuner:
  builtinTunerName: TPE
  classArgs:
    optimize_mode: maximize
trial:
  codeDir: ~/nni/examples/trials/mnist-tfv1
  taskRoles:
    - name: worker
      taskNum: 1
      command: python3 mnist.py
      gpuNum: 1
      cpuNum: 1
      memoryMB: 8192
      image: msranni/nni:latest
      frameworkAttemptCompletionPolicy:
        minFailedTaskCount: 1
        minSucceededTaskCount: 1
frameworkcontrollerConfig:
  storage: nfs
  nfs:
    server: 10.1.1.1
    path: /exports/nni
""",
}


def adl_config(tmp_path, code_dir: str):
    """The seed's adl config with trial.codeDir as given, loaded from a file as `trialkit run` loads it."""
    (tmp_path / "search_space.json").write_text('{"lr": {"_type": "choice", "_value": [0.1]}}')
    path = tmp_path / "config.yml"
    path.write_text(V1_SEEDS["adl"].replace("codeDir: .", f"codeDir: {code_dir}"))
    return load_config(path)


def test_adl_code_dir_is_the_containers_working_directory_never_a_local_one(tmp_path):
    # /workspace/cifar exists in the image only: the config loads all the same.
    config = adl_config(tmp_path, "/workspace/cifar")
    spec = spec_for(config.trial_command)
    objects = adaptdl.render(config.training_service, spec)
    check_contract(objects, config.training_service, spec)  # validated against the AdaptDLJob CRD
    assert job_of(objects)["spec"]["template"]["spec"]["containers"][0]["workingDir"] == "/workspace/cifar"
    # NNI's seed writes ".": the image's own working directory.
    seed = adaptdl.render(adl_config(tmp_path, ".").training_service, spec)
    assert "workingDir" not in job_of(seed)["spec"]["template"]["spec"]["containers"][0]
    with pytest.raises(UserError, match="names a directory inside the container"):
        adl_config(tmp_path, "src")


def test_seed_adl_config_renders_as_nni_describes(tmp_path):
    v1 = yaml.safe_load(V1_SEEDS["adl"])
    section = adaptdl.from_v1(v1)
    config = adaptdl.parse_section(section, "trial")
    assert config.common.manager_address == "10.20.41.10"
    objects = adaptdl.render(config, spec_for(v1["trial"]["command"]))
    check_contract(objects, config, spec_for(v1["trial"]["command"]))
    job = job_of(objects)
    template = job["spec"]["template"]
    container = template["spec"]["containers"][0]
    env = env_of(container)
    assert job["spec"]["preemptible"] is True  # adaptive: true
    assert container["image"] == "registry.petuum.com/dev/nni:adaptdl"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert template["spec"]["imagePullSecrets"] == [{"name": "imagepullsecret"}]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    claims = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PersistentVolumeClaim"}
    for path in ("/adaptdl/checkpoint", "/adaptdl/share", "/adaptdl/tensorboard"):
        claim = claims[volumes[mounts[path]]["persistentVolumeClaim"]["claimName"]]
        assert claim["spec"]["storageClassName"] == "dfs" and claim["spec"]["resources"]["requests"]["storage"] == "1024Mi"
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert volumes[mounts["/nfs"]]["nfs"] == {"server": "172.20.188.236", "path": "/"}
    assert env["ADAPTDL_CHECKPOINT_PATH"] == env["TRIALKIT_CHECKPOINT_DIR"] == "/adaptdl/checkpoint"
    assert env["ADAPTDL_SHARE_PATH"] == env["TRIALKIT_SHARE_DIR"] == "/adaptdl/share"
    tensorboard = env["TRIALKIT_TENSORBOARD_DIR"]
    assert tensorboard.startswith("/adaptdl/tensorboard/")
    assert env["ADAPTDL_TENSORBOARD_LOGDIR"] == env["ADAPTDLCTL_TENSORBOARD_LOGDIR"] == tensorboard
    assert env["TRIALKIT_COMMAND"] == "python3 /main_nni.py"
    # Per trial: checkpoint and share (owned by the job once submitted); per
    # experiment: TensorBoard, labelled with the experiment only.
    per_trial = [c for c in claims.values() if k8s.LABEL_TRIAL in c["metadata"]["labels"]]
    assert len(per_trial) == 2
    other = spec_for(v1["trial"]["command"], trial="t8")
    other_claims = {o["metadata"]["name"] for o in adaptdl.render(config, other) if o["kind"] == "PersistentVolumeClaim"}
    assert set(claims) & other_claims == {c for c in claims if c not in {p["metadata"]["name"] for p in per_trial}}


def test_seed_frameworkcontroller_config_renders_as_nni_describes():
    v1 = yaml.safe_load(V1_SEEDS["frameworkcontroller"])
    section = frameworkcontroller.from_v1(dict(v1, nniManagerIp="10.0.0.2"))
    config = frameworkcontroller.parse_section(section, "trial")
    objects = frameworkcontroller.render(config, spec_for(""))
    check_contract(objects, config, spec_for(""))
    role = job_of(objects)["spec"]["taskRoles"][0]
    container = role["task"]["pod"]["spec"]["containers"][0]
    assert role["frameworkAttemptCompletionPolicy"] == {"minFailedTaskCount": 1, "minSucceededTaskCount": 1}
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "8192Mi", "nvidia.com/gpu": "1"}
    assert env_of(container)["TRIALKIT_COMMAND"] == "python3 mnist.py"
    nfs = next(v for v in role["task"]["pod"]["spec"]["volumes"] if "nfs" in v)
    assert nfs["nfs"] == {"server": "10.1.1.1", "path": "/exports/nni"}


def test_v1_kubeflow_config_with_nni_api_version():
    """The seed's Kubeflow page uses apiVersion v1alpha2 and roles with memorySize '4g'."""
    v1 = {
        "nniManagerIp": "10.0.0.2",
        "trainingServicePlatform": "kubeflow",
        "trial": {
            "codeDir": ".",
            "master": {"replicas": 1, "command": "python3 model.py", "gpuNum": 0, "cpuNum": 1, "memorySize": "4g", "image": "msranni/nni:latest"},
            "worker": {"replicas": 2, "command": "python3 model.py", "gpuNum": 1, "cpuNum": 1, "memoryMB": 4096, "image": "msranni/nni:latest"},
        },
        "kubeflowConfig": {"operator": "pytorch-operator", "apiVersion": "v1alpha2", "storage": "nfs", "nfs": {"server": "10.20.30.40", "path": "/mnt/nfs/nni"}},
    }
    config = kubeflow.parse_section(kubeflow.from_v1(v1), "trial")
    objects = kubeflow.render(config, spec_for(""))
    check_contract(objects, config, spec_for(""))
    job = job_of(objects)
    assert job["apiVersion"] == "kubeflow.org/v1"
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {"cpu": "1", "memory": "4096Mi", "nvidia.com/gpu": "1"}


# --- options ---------------------------------------------------------------


def adl(**options) -> dict:
    return {"platform": "adaptdl", "managerAddress": "10.0.0.2", "image": "img:1", **options}


def test_camel_and_snake_case_keys_are_the_same_config():
    camel = {"platform": "frameworkcontroller", "managerAddress": "10.0.0.2", "terminationGracePeriodSeconds": 40,
             "taskRoles": [{"name": "w", "taskNumber": 2, "dockerImage": "img:1", "memorySize": "2g",
                            "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 2, "minSucceededTaskCount": -1}}]}
    assert parse(camel) == parse(gen.respell(camel, "snake"))


@pytest.mark.parametrize(
    "options, keeper, termination",
    [({}, 25, 31), ({"terminationGracePeriodSeconds": 60}, 54, 60), ({"keeperGraceSeconds": 10}, 10, 16),
     ({"keeperGraceSeconds": 10, "terminationGracePeriodSeconds": 11}, 10, 11)],
)
def test_grace_defaults_keep_the_pod_grace_above_the_keeper(options, keeper, termination):
    common = parse(adl(**options)).common
    assert (common.keeper_grace_seconds, common.termination_grace_seconds) == (keeper, termination)


@pytest.mark.parametrize(
    "size, mib", [(512, 512), ("512", 512), ("4g", 4096), ("4GB", 4096), ("8192mb", 8192), ("1Gi", 1024), ("1.5g", 1536), ("100k", 1), ("1t", 1048576)]
)
def test_memory_sizes_in_nni_spelling(size, mib):
    assert k8s_config.parse_size_mib(size, "memorySize") == mib


def test_default_manager_address_is_not_loopback():
    address = parse({k: v for k, v in adl().items() if k != "managerAddress"}).common.manager_address
    assert k8s_config.unreachable(address) is None


def test_no_address_but_loopback_is_a_user_error(monkeypatch):
    import socket
    from types import SimpleNamespace

    import psutil

    loopback = [SimpleNamespace(family=socket.AF_INET, address="127.0.0.1"), SimpleNamespace(family=socket.AF_INET6, address="::1")]
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: {"lo": loopback})
    with pytest.raises(UserError, match="set managerAddress"):
        parse({k: v for k, v in adl().items() if k != "managerAddress"})


def test_user_template_keeps_what_trialkit_does_not_set(tmp_path):
    template = yaml.safe_load((EXAMPLES / "pytorchjob-gpu-nodes.yaml").read_text())
    master = template["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    master["containers"].append({"name": "log-shipper", "image": "fluent/fluent-bit:3.1"})
    master["containers"][0]["env"] = [{"name": "NCCL_DEBUG", "value": "INFO"}]
    path = tmp_path / "template.yaml"
    path.write_text(yaml.safe_dump(template))
    section = {"platform": "kubeflow", "managerAddress": "10.0.0.2", "dockerImage": "img:1", "trialTemplate": str(path),
               "master": {"replicas": 1}, "worker": {"replicas": 3}}
    objects = k8s.render_trial(parse(section), spec_for())
    check_contract(objects, parse(section), spec_for())
    job = job_of(objects)
    assert job["metadata"]["annotations"] == {"team": "vision"}
    for replica in job["spec"]["pytorchReplicaSpecs"].values():  # Worker made from the first entry, Master
        pod = replica["template"]["spec"]
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu" and pod["nodeSelector"]
        assert [c["name"] for c in pod["containers"]] == ["pytorch", "log-shipper"]
        assert env_of(pod["containers"][0])["NCCL_DEBUG"] == "INFO"
    # A rendered job used as the template renders to itself: filling is idempotent.
    path.write_text(yaml.safe_dump(job))
    assert job_of(k8s.render_trial(parse(section), spec_for())) == job


def test_a_finished_jobs_running_pods_are_cleaned_unless_the_template_says_otherwise(tmp_path):
    section = {"platform": "kubeflow", "managerAddress": "10.0.0.2", "dockerImage": "img:1",
               "master": {"replicas": 1}, "worker": {"replicas": 2}}
    job = job_of(k8s.render_trial(parse(section), spec_for()))
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"  # the operator's default is None
    path = tmp_path / "template.yaml"
    for policy, expected in ((None, "Running"), ({"cleanPodPolicy": "All"}, "All")):  # an NNI user's template
        template = {**job, "spec": {key: value for key, value in job["spec"].items() if key != "runPolicy"}}
        if policy is not None:
            template["spec"]["runPolicy"] = policy
        path.write_text(yaml.safe_dump(template))
        rendered = job_of(k8s.render_trial(parse(dict(section, trialTemplate=str(path))), spec_for()))
        assert rendered["spec"]["runPolicy"]["cleanPodPolicy"] == expected


def test_the_trial_pods_account_is_the_configs_else_the_templates_else_one_with_no_rights(tmp_path):
    template = yaml.safe_load((EXAMPLES / "pytorchjob-gpu-nodes.yaml").read_text())
    template["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["serviceAccountName"] = "team-reader"
    path = tmp_path / "template.yaml"
    path.write_text(yaml.safe_dump(template))
    base = {"platform": "kubeflow", "managerAddress": "10.0.0.2", "dockerImage": "img:1", "master": {"replicas": 1}}

    def accounts(section):
        objects = k8s.render_trial(parse(section), spec_for())
        pods = [t["spec"]["serviceAccountName"] for t in k8s_schemas.pod_templates(job_of(objects))]
        return pods, [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]

    own = k8s.trial_service_account_name(k8s.trial_names(spec_for()))
    assert accounts(base) == ([own], [own])
    assert accounts({**base, "trialTemplate": str(path)})[0] == ["team-reader"]
    assert accounts({**base, "trialTemplate": str(path), "serviceAccountName": "trainer"}) == (["trainer"], [])


def test_secret_values_are_filled_only_for_submission():
    spec = spec_for()
    objects = k8s.render_trial(parse(adl()), spec)
    submitted = k8s.with_secrets(objects, spec)
    secrets = [o for o in submitted if "stringData" in o]
    assert [s["kind"] for s in secrets] == ["Secret"] and secrets[0]["stringData"] == {"TRIALKIT_TOKEN": gen.TOKEN}
    assert gen.TOKEN not in json.dumps(objects)
    no_token = TrialSpec("e", "t", 0, "true", env={})
    assert "Secret" not in [o["kind"] for o in k8s.render_trial(parse(adl()), no_token)]


# --- mistakes are one-line UserErrors --------------------------------------


@pytest.mark.parametrize(
    "section, expected",
    [
        (adl(managerAddress="127.0.0.1"), "managerAddress: 127.0.0.1 is a loopback address"),
        (adl(managerAddress="localhost"), "managerAddress: localhost is a loopback address"),
        (adl(managerAddress="::1"), "loopback"),
        (dict(adl(), managerAddress=None, nniManagerIp="0.0.0.0"), "nniManagerIp: 0.0.0.0 is the unspecified address"),
        (adl(keeperGraceSeconds=30, terminationGracePeriodSeconds=30), "terminationGracePeriodSeconds: must be greater than keeperGraceSeconds"),
        (adl(terminationGracePeriodSeconds=5), "leaves the keeper no time"),
        (adl(imageName="x"), "unknown key 'imageName'"),
        (adl(memorySize="4 lots"), "memorySize: expected a size"),
        (adl(gpuNumber=-1), "gpuNumber: must be at least 0"),
        (adl(minReplicas=4, maxReplicas=2), "maxReplicas (2) is below minReplicas (4)"),
        (adl(namespace="Team_A"), "not a namespace name"),
        (adl(checkpoint={"storageSize": "lots"}), "checkpoint.storageSize"),
        (adl(nfs={"server": "1.2.3.4", "path": "/", "containerMountPath": "/adaptdl/share"}), "trialkit mounts its own volume at /adaptdl/share"),
        (adl(storage={"storageType": "s3"}), "storage type 's3' is not supported"),
        (adl(storage={"storageType": "azureStorage", "azureAccount": "a", "keyVaultName": "v", "keyVaultKey": "k"}),
         "storage.azureShare: Azure File storage needs azureShare"),
        (adl(reuseMode=True), "reuseMode is not supported"),
        (adl(trialTemplate="/nonexistent/template.yaml"), "trialTemplate: cannot read"),
        ({"platform": "kubeflow", "managerAddress": "10.0.0.2", "worker": {"replicas": 2, "dockerImage": "i:1"}}, "pytorch-operator needs a master role"),
        ({"platform": "kubeflow", "managerAddress": "10.0.0.2", "master": {"replicas": 2, "dockerImage": "i:1"}}, "exactly one master"),
        # No role at all (a newcomer's first try: a traceback from the TrainJob it might have been).
        ({"platform": "kubeflow", "managerAddress": "10.0.0.2"}, "needs a master role (operator is unset: a PyTorchJob"),
        ({"platform": "kubeflow", "operator": "trainjob", "managerAddress": "10.0.0.2"}, "a TrainJob needs its nodes"),
        ({"platform": "kubeflow", "operator": "pytorch-operator", "managerAddress": "10.0.0.2", "master": {}, "ps": {}}, "pytorch-operator has no ps role"),
        ({"platform": "kubeflow", "operator": "mpi-operator", "managerAddress": "10.0.0.2"}, "unknown operator 'mpi-operator'"),
        ({"platform": "kubeflow", "managerAddress": "10.0.0.2", "master": {"privateRegistryAuthPath": "a.json"}}, "imagePullSecrets"),
        ({"platform": "frameworkcontroller", "managerAddress": "10.0.0.2", "taskRoles": []}, "no task roles"),
        ({"platform": "frameworkcontroller", "managerAddress": "10.0.0.2", "taskRoles": [{"name": "Worker_1"}]}, "task role name 'Worker_1' is not valid"),
        ({"platform": "frameworkcontroller", "managerAddress": "10.0.0.2", "taskRoles": [{"name": "w", "taskNumber": 2, "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 3}}]}, "must be -1 or between 1 and taskNumber (2)"),
        ({"platform": "frameworkcontroller", "managerAddress": "10.0.0.2", "taskRoles": [{"name": "w"}, {"name": "w"}]}, "task role 'w' is given twice"),
    ],
)
def test_config_mistakes_are_one_line_user_errors(section, expected):
    with pytest.raises(UserError) as caught:
        k8s.render_trial(parse(section), spec_for())  # most fail in parse; some only when rendered
    line = caught.value.line()
    assert expected in line and "\n" not in line


def test_a_role_without_image_is_refused_when_the_config_loads_naming_the_key():
    section = {"platform": "kubeflow", "managerAddress": "10.0.0.2", "master": {"replicas": 1}}
    with pytest.raises(UserError, match=r"trainingService\.master\.dockerImage: role 'master' has no image"):
        parse(section)


def first(objects, kind: str) -> dict:
    return next(o for o in objects if o["kind"] == kind)


def test_strict_validation_has_teeth():
    """The checks reject what a strict API server rejects: the render tests mean something."""
    objects = k8s.render_trial(parse(adl()), spec_for())
    job = job_of(objects)
    # Each refused by the check meant for it, not by a crash of the checker on an unexpected shape.
    schema_error = k8s_schemas.kubernetes_validate.ValidationError
    for mutate, error, says in (
        (lambda o: o[-1]["spec"].update(replicas=3),
         AssertionError, "'replicas' was unexpected"),  # not an AdaptDLJob field (the CRD's schema)
        (lambda o: o[-1]["spec"]["template"]["spec"]["containers"][0].update(cmd=["x"]),
         schema_error, "'cmd' was unexpected"),  # not a container field
        (lambda o: o[-1]["spec"]["template"]["spec"].update(terminationGracePeriodSeconds="30"),
         schema_error, "'30' is not of type 'integer'"),  # wrong type
        (lambda o: o[1]["metadata"].update(labels={"trialkit.io/trial": "-bad-"}),
         AssertionError, "-bad-"),  # label syntax
        (lambda o: o[-1]["spec"]["template"]["spec"]["volumes"].pop(),
         AssertionError, "adaptdl-tensorboard"),  # a mount without its volume
        (lambda o: first(o, "PersistentVolumeClaim")["spec"].update(storage="1Gi"),
         schema_error, "'storage' was unexpected"),  # not a PVC spec field
        (lambda o: first(o, "ServiceAccount").update(automountToken=False),
         schema_error, "'automountToken' was unexpected"),  # not a ServiceAccount field
    ):
        broken = json.loads(json.dumps(objects))
        mutate(broken)
        with pytest.raises(error, match=says):
            k8s_schemas.validate_objects(broken)
    k8s_schemas.validate_objects(objects)
    assert job["kind"] == "AdaptDLJob"
