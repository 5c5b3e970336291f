"""Checking rendered objects the way a cluster's API server would, without one.

Three layers, all strict:
- built-in kinds (ConfigMap, Secret, PersistentVolumeClaim, every pod
  template, every object's metadata) with `kubernetes_validate`, strict mode:
  an unknown field is an error, as with `kubectl apply --validate=strict`;
- custom resources with jsonschema against the openAPIV3Schema of the CRDs in
  tests/fixtures/crds, made strict the way the API server's field validation
  is: an object with declared properties and no
  x-kubernetes-preserve-unknown-fields admits no other field;
- the rules the API server checks in code, not in its schemas (name and label
  syntax, unique names, mounts that name a volume, references between the
  objects, quantities).
"""
from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Dict, Iterator, List, Sequence

import jsonschema
import kubernetes_validate
import yaml

CRDS = Path(__file__).parent / "fixtures" / "crds"
CRD_FILES = {
    "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
    "TFJob": "kubeflow.org_tfjobs.yaml",
    "Framework": "frameworkcontroller.microsoft.com_frameworks.yaml",
    "AdaptDLJob": "adaptdl.petuum.com_adaptdljobs.yaml",
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
}
K8S_VERSION = kubernetes_validate.utils.latest_version()
# kubernetes_validate parses its 2 MB schema files on every call; they never
# change, so read each once (the validation itself is untouched).
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")
CONFIGMAP_LIMIT = 1024 * 1024


def _strict(schema: dict) -> dict:
    """`schema` with additionalProperties: false wherever the server prunes or rejects unknown fields."""
    out = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(out)
    # The server checks metadata as ObjectMeta, whatever the CRD says of it,
    # and every object may say its apiVersion and kind.
    out["properties"].update(metadata={"type": "object"}, apiVersion={"type": "string"}, kind={"type": "string"})
    return out


@functools.lru_cache(maxsize=None)
def crd_validator(kind: str) -> jsonschema.protocols.Validator:
    crd = next(doc for doc in yaml.safe_load_all((CRDS / CRD_FILES[kind]).read_text()) if doc)
    version = next(v for v in crd["spec"]["versions"] if v.get("storage", v["name"] == "v1"))
    schema = _strict(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


def validate_builtin(obj: dict) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def pod_templates(obj: dict) -> Iterator[dict]:
    """Every pod template inside a job, where each operator keeps it."""
    spec = obj.get("spec") or {}
    kind = obj["kind"]
    if kind in ("PyTorchJob", "TFJob"):
        field = "pytorchReplicaSpecs" if kind == "PyTorchJob" else "tfReplicaSpecs"
        for replica in spec[field].values():
            yield replica["template"]
    elif kind == "Framework":
        for role in spec["taskRoles"]:
            yield role["task"]["pod"]
    elif kind == "AdaptDLJob":
        yield spec["template"]
    elif kind == "TrainJob":  # what Trainer makes of its runtime, trainer and patches
        import trainer_play

        yield from (template for template, _ in trainer_play.templates(obj).values())


def validate_job(obj: dict) -> None:
    errors = sorted(crd_validator(obj["kind"]).iter_errors(obj), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5])
    # The API server checks every object's metadata as ObjectMeta.
    validate_builtin({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})
    for template in pod_templates(obj):
        # What AdaptDL's admission webhook does too: the template as a PodTemplate.
        validate_builtin({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "template"}, "template": template})


def validate_objects(objects: Sequence[dict]) -> None:
    """Everything one render produced, each object and the references between them."""
    for obj in objects:
        if obj["kind"] in CRD_FILES:
            validate_job(obj)
            check_job_name(obj)
            for template in pod_templates(obj):
                check_pod(template, objects)
        else:
            validate_builtin(obj)
            check_builtin(obj)
        check_metadata(obj["metadata"])
    keys = [(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), f"two objects share a name: {keys}"
    assert len({o["metadata"]["namespace"] for o in objects}) == 1


def check_metadata(meta: dict) -> None:
    assert DNS_SUBDOMAIN.match(meta["name"]) and len(meta["name"]) <= 253, meta["name"]
    assert DNS_LABEL.match(meta["namespace"]) and len(meta["namespace"]) <= 63, meta["namespace"]
    check_labels(meta.get("labels") or {})


def check_labels(labels: Dict[str, str]) -> None:
    for key, value in labels.items():
        assert QUALIFIED_NAME.match(key), key
        assert LABEL_VALUE.match(value) and len(value) <= 63, value


def check_job_name(job: dict) -> None:
    name = job["metadata"]["name"]
    # Operators put job names in label values, pod hostnames and Service names.
    assert len(name) <= 63, name
    if job["kind"] != "Framework":  # FrameworkController's own pattern is in its CRD
        assert DNS_1035.match(name), name


def check_builtin(obj: dict) -> None:
    if obj["kind"] == "ConfigMap":
        assert all(CONFIG_KEY.match(key) for key in obj.get("data", {}))
        assert sum(len(v.encode()) for v in obj.get("data", {}).values()) < CONFIGMAP_LIMIT
    elif obj["kind"] == "PersistentVolumeClaim":
        assert QUANTITY.match(obj["spec"]["resources"]["requests"]["storage"])
    elif obj["kind"] == "Secret":
        assert "data" not in obj and "stringData" not in obj, "render must not write secret values"


def _names(objects: Sequence[dict], kind: str) -> List[str]:
    return [o["metadata"]["name"] for o in objects if o["kind"] == kind]


def check_pod(template: dict, objects: Sequence[dict]) -> None:
    """The API server's own checks of a pod spec, and that what it refers to is rendered."""
    spec = template["spec"]
    check_labels(template.get("metadata", {}).get("labels") or {})
    volumes = spec.get("volumes", [])
    volume_names = [v["name"] for v in volumes]
    assert len(volume_names) == len(set(volume_names)), volume_names
    assert all(DNS_LABEL.match(n) for n in volume_names), volume_names
    for volume in volumes:
        if "configMap" in volume:
            assert volume["configMap"]["name"] in _names(objects, "ConfigMap")
        if "persistentVolumeClaim" in volume:
            assert volume["persistentVolumeClaim"]["claimName"] in _names(objects, "PersistentVolumeClaim")
    containers = spec["containers"]
    container_names = [c["name"] for c in containers]
    assert len(container_names) == len(set(container_names)) and all(DNS_LABEL.match(n) for n in container_names)
    for container in containers:
        env_names = [e["name"] for e in container.get("env", [])]
        assert len(env_names) == len(set(env_names)), env_names
        assert all(ENV_NAME.match(n) for n in env_names), env_names
        for item in container.get("env", []):
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] in _names(objects, "Secret")
        mounts = container.get("volumeMounts", [])
        assert all(m["name"] in volume_names for m in mounts), [m["name"] for m in mounts if m["name"] not in volume_names]
        paths = [m["mountPath"] for m in mounts]
        assert len(paths) == len(set(paths)), paths
        resources = container.get("resources", {})
        for part in ("requests", "limits"):
            assert all(QUANTITY.match(str(v)) for v in resources.get(part, {}).values()), resources
        if "nvidia.com/gpu" in resources.get("requests", {}):
            assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]
