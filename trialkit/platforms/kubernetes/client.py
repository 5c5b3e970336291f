"""The one module that talks to a Kubernetes API server, through the official client.

Configuration comes from KUBECONFIG, else ~/.kube/config, else the pod's
service account (in-cluster). Transient failures (connection errors, 429 and
5xx answers) are retried with exponential backoff by the client's own urllib3
retry, honouring Retry-After; anything else raises ClusterError, never
swallowed. Logs name objects, never their contents: a Secret's values must
not reach a log. `kubernetes` is imported here only, and only when a client
is made, so rendering needs no cluster library.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from trialkit.errors import UserError

log = logging.getLogger(__name__)

# Custom resources: kind -> (group, version, plural).
CUSTOM_KINDS = {
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "TFJob": ("kubeflow.org", "v1", "tfjobs"),
    "Framework": ("frameworkcontroller.microsoft.com", "v1", "frameworks"),
    "AdaptDLJob": ("adaptdl.petuum.com", "v1", "adaptdljobs"),
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    # Kueue's: a queued job's admission (its Workload) and the queue it joins.
    "Workload": ("kueue.x-k8s.io", "v1beta2", "workloads"),
    "LocalQueue": ("kueue.x-k8s.io", "v1beta2", "localqueues"),
}
CLUSTER_KINDS = {"WorkloadPriorityClass": ("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses")}
# Built-in kinds: kind -> the CoreV1Api method suffix.
CORE_KINDS = {"ConfigMap": "config_map", "Secret": "secret", "PersistentVolumeClaim": "persistent_volume_claim",
              "Service": "service", "ServiceAccount": "service_account"}
APPS_KINDS = {"Deployment": "deployment"}  # AppsV1Api: an AdaptDL experiment's TensorBoard
RETRY_STATUSES = (429, 500, 502, 503, 504)
TIMEOUT = (10, 60)  # seconds to connect, to read an answer
DEFAULT_KUBECONFIG = "~/.kube/config"
JSON = "application/json"  # said explicitly: the client sends a create's body untyped


class ClusterError(Exception):
    """The API server refused a request or could not be reached, after the retries."""

    def __init__(self, action: str, target: str, status: Optional[int], message: str):
        self.status = status
        super().__init__(f"{action} {target}: " + (f"{status} " if status else "") + message)


@dataclass(frozen=True)
class ObjectRef:
    """A namespaced object by kind and name; its str() is a trial's handle."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> "ObjectRef":
        kind, namespace, name = text.split("/")
        return cls(kind, namespace, name)

    @classmethod
    def of(cls, obj: dict) -> "ObjectRef":
        return cls(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])


def owner_reference(owner: dict) -> dict:
    """What makes an object garbage when `owner` (as the server returned it) goes."""
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"]}


def load_api_client(attempts: int = 5, backoff: float = 0.5):
    """An ApiClient for this machine's cluster, with retries and backoff configured."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException
    from urllib3.util.retry import Retry

    configuration = client.Configuration()
    path = os.environ.get("KUBECONFIG") or os.path.expanduser(DEFAULT_KUBECONFIG)
    try:
        if os.environ.get("KUBECONFIG") or os.path.exists(path):
            config.load_kube_config(config_file=path, client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            raise UserError(
                "no Kubernetes configuration found",
                "KUBECONFIG",
                f"set KUBECONFIG, create {DEFAULT_KUBECONFIG}, or run inside the cluster",
            )
    except ConfigException as err:
        raise UserError(f"cannot use the Kubernetes configuration: {err}", path)
    # Every method is retried: a create whose answer was lost comes back as
    # 409 AlreadyExists, which create() handles; deletes and patches repeat safely.
    configuration.retries = Retry(
        total=attempts - 1,
        backoff_factor=backoff,
        status_forcelist=RETRY_STATUSES,
        allowed_methods=None,
        raise_on_status=False,
        respect_retry_after_header=True,
    )
    return client.ApiClient(configuration)


class KubeClient:
    """Create, read, patch and delete the objects trials are made of."""

    def __init__(self, api_client: Any):
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._apps = client.AppsV1Api(api_client)

    @classmethod
    def from_environment(cls, attempts: int = 5, backoff: float = 0.5) -> "KubeClient":
        return cls(load_api_client(attempts, backoff))

    def _call(self, action: str, target: str, method, *args, **kwargs) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            # The answer as the server wrote it: the client's models would reject
            # or drop fields they do not know (a newer server, a partial status).
            response = method(*args, _request_timeout=TIMEOUT, _preload_content=False, **kwargs)
            return json.loads(response.data or b"null")
        except ApiException as err:
            raise ClusterError(action, target, err.status, _message(err)) from None
        except HTTPError as err:
            raise ClusterError(action, target, None, f"cannot reach the API server: {err}") from None

    def _on(self, verb: str, ref: ObjectRef, *payload: Any, **kwargs) -> Any:
        """`verb` (create, get, replace, patch, delete) on `ref`, through the API its kind has."""
        if ref.kind in CUSTOM_KINDS:
            group, version, plural = CUSTOM_KINDS[ref.kind]
            method = getattr(self._custom, f"{verb}_namespaced_custom_object")
            where = (group, version, ref.namespace, plural) + (() if verb == "create" else (ref.name,))
        else:
            core_verb = "read" if verb == "get" else verb
            api, kinds = (self._apps, APPS_KINDS) if ref.kind in APPS_KINDS else (self._core, CORE_KINDS)
            method = getattr(api, f"{core_verb}_namespaced_{kinds[ref.kind]}")
            where = (ref.namespace,) if verb == "create" else (ref.name, ref.namespace)
        return self._call(verb, str(ref), method, *where, *payload, **kwargs)

    def create(self, obj: dict, on_conflict: str = "error") -> dict:
        """Create `obj`; when it exists: "error" raises, "keep" returns it, "replace" overwrites it."""
        ref = ObjectRef.of(obj)
        json_body = {"Content-Type": JSON}
        try:
            created = self._on("create", ref, obj, _headers=json_body)
        except ClusterError as err:
            if err.status != 409 or on_conflict == "error":
                raise
            log.info("%s exists already (%s it)", ref, on_conflict)
            if on_conflict == "replace":
                return self._on("replace", ref, obj, _headers=json_body)
            return self.get(ref)
        log.info("created %s", ref)
        return created

    def replace(self, obj: dict) -> dict:
        """Write `obj` over the server's copy; with its metadata.resourceVersion, only over that version (a
        ClusterError with status 409 when another writer came between: read it again)."""
        return self._on("replace", ObjectRef.of(obj), obj, _headers={"Content-Type": JSON})

    def get(self, ref: ObjectRef) -> Optional[dict]:
        """The object as the server has it, or None when there is none."""
        try:
            return self._on("get", ref)
        except ClusterError as err:
            if err.status == 404:
                return None
            raise

    def delete(self, ref: ObjectRef) -> bool:
        """Delete with foreground propagation (dependents first); False when it was gone already."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
        try:
            self._on("delete", ref, body=options)
        except ClusterError as err:
            if err.status == 404:
                return False
            raise
        log.info("deleted %s", ref)
        return True

    def served(self, kinds: List[str]) -> List[str]:
        """Which of the custom `kinds` the API server serves (API discovery: its group and version list them)."""
        found = []
        for kind in kinds:
            group, version, plural = CUSTOM_KINDS[kind]
            try:
                resources = self._call("discover", f"{group}/{version}", self._custom.get_api_resources, group, version)
            except ClusterError as err:
                if err.status == 404:
                    continue  # the group or version is not installed
                raise
            if any(item.get("name") == plural for item in (resources or {}).get("resources") or []):
                found.append(kind)
        return found

    def list(self, kind: str, namespace: str, selector: str = "") -> List[Dict[str, Any]]:
        """The custom objects of `kind` in `namespace` (matching the label `selector`)."""
        group, version, plural = CUSTOM_KINDS[kind]
        target = f"{kind} {selector} in {namespace}" if selector else f"{kind} in {namespace}"
        found = self._call("list", target, self._custom.list_namespaced_custom_object,
                           group, version, namespace, plural, label_selector=selector)
        return found.get("items") or []

    def get_cluster(self, kind: str, name: str) -> Optional[dict]:
        """A cluster-scoped custom object, or None when there is none."""
        group, version, plural = CLUSTER_KINDS[kind]
        try:
            return self._call("get", f"{kind}/{name}", self._custom.get_cluster_custom_object, group, version, plural,
                              name)
        except ClusterError as err:
            if err.status == 404:
                return None
            raise

    def list_cluster(self, kind: str) -> List[Dict[str, Any]]:
        group, version, plural = CLUSTER_KINDS[kind]
        found = self._call("list", kind, self._custom.list_cluster_custom_object, group, version, plural)
        return found.get("items") or []

    def patch(self, ref: ObjectRef, change: dict) -> dict:
        """A JSON merge patch of `ref` (labels, spec.suspend): what it names changes, nothing else."""
        return self._on("patch", ref, change, _headers={"Content-Type": "application/merge-patch+json"})

    def set_owner(self, ref: ObjectRef, owner: dict) -> None:
        """Make `ref` (a built-in kind) garbage-collected with `owner`."""
        self._on("patch", ref, {"metadata": {"ownerReferences": [owner_reference(owner)]}})

    def list_pods(self, namespace: str, selector: str) -> List[Dict[str, Any]]:
        target = f"pods {selector} in {namespace}"
        pods = self._call("list", target, self._core.list_namespaced_pod, namespace, label_selector=selector)
        return pods.get("items") or []

    def delete_pods(self, namespace: str, selector: str, grace_seconds: int) -> None:
        self._call(
            "delete",
            f"pods {selector} in {namespace}",
            self._core.delete_collection_namespaced_pod,
            namespace,
            label_selector=selector,
            grace_period_seconds=grace_seconds,
        )
        log.info("deleted pods %s in %s (grace %s s)", selector, namespace, grace_seconds)


def _message(err: Any) -> str:
    """The server's own explanation (its Status message), else the HTTP reason."""
    try:
        return json.loads(err.body).get("message") or err.reason
    except (TypeError, ValueError, AttributeError):
        return str(err.reason)
