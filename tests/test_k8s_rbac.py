"""The permissions docs/platforms.md gives trialkit's service account cover every call its one module of
cluster calls (trialkit/platforms/kubernetes/client.py) can make.

Every public method of KubeClient is driven, for every kind it takes, against recording stand-ins of the
`kubernetes` API classes; each API method it reaches is read as the (API group, resource, verb) RBAC
checks. The docs' Role and ClusterRole (the block written to trialkit-rbac.yaml) must grant each.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import List, Set, Tuple

import yaml

import k8s_schemas
from trialkit.platforms.kubernetes import client as kube
from trialkit.platforms.kubernetes.client import KubeClient, ObjectRef

DOCS = Path(__file__).resolve().parent.parent / "docs" / "platforms.md"
RBAC_BLOCK = re.compile(r"<!-- test: file=trialkit-rbac\.yaml -->\n```yaml\n(.*?)```", re.DOTALL)
VERBS = {"read": "get", "get": "get", "create": "create", "replace": "update", "patch": "patch", "delete": "delete",
         "list": "list", "delete_collection": "deletecollection"}
Call = Tuple[str, str, str]  # (API group, resource, verb); the group "discovery" for API discovery


class Recorder:
    """Stands in for one of the kubernetes API classes: each method called is noted as RBAC sees it."""

    def __init__(self, group: str, calls: List[Call]):
        self.group, self.calls = group, calls

    def __getattr__(self, method: str):
        def call(*args, **kwargs):
            self.calls.append(self._rbac(method, args))
            return type("Response", (), {"data": b"{}"})()
        return call

    def _rbac(self, method: str, args: tuple) -> Call:
        if method == "get_api_resources":
            return ("discovery", f"{args[0]}/{args[1]}", "get")
        if method.endswith("_custom_object"):
            verb = method.split("_")[0]
            plural = args[2] if "_cluster_" in method else args[3]
            return (args[0], plural, VERBS[verb])
        verb, kind = re.fullmatch(r"(read|create|replace|patch|delete_collection|delete|list)_namespaced_(\w+)",
                                  method).groups()
        return (self.group, kind.replace("_", "") + "s", VERBS[verb])


def client_calls(monkeypatch) -> Set[Call]:
    """Every (group, resource, verb) KubeClient's methods reach, each method driven with every kind it takes."""
    import kubernetes.client

    calls: List[Call] = []
    for name, group in (("CoreV1Api", ""), ("CustomObjectsApi", None), ("AppsV1Api", "apps")):
        monkeypatch.setattr(kubernetes.client, name, lambda api_client, group=group: Recorder(group, calls))
    client = KubeClient(None)
    namespaced = [*kube.CUSTOM_KINDS, *kube.CORE_KINDS, *kube.APPS_KINDS]
    driven = {"create", "replace", "get", "delete", "patch", "set_owner", "served", "list", "get_cluster",
              "list_cluster", "list_pods", "delete_pods"}
    public = {name for name, _ in inspect.getmembers(KubeClient, inspect.isfunction) if not name.startswith("_")}
    assert public == driven, f"drive the new methods too: {sorted(public ^ driven)}"
    owner = {"apiVersion": "v1", "kind": "PyTorchJob", "metadata": {"name": "job", "uid": "u"}}
    for kind in namespaced:
        obj, ref = {"kind": kind, "metadata": {"namespace": "ns", "name": "n"}}, ObjectRef(kind, "ns", "n")
        client.create(obj)
        client.replace(obj)
        client.get(ref)
        client.delete(ref)
        client.patch(ref, {})
        client.set_owner(ref, owner)
    client.served(list(kube.CUSTOM_KINDS))
    for kind in kube.CUSTOM_KINDS:
        client.list(kind, "ns")
    for kind in kube.CLUSTER_KINDS:
        client.get_cluster(kind, "n")
        client.list_cluster(kind)
    client.list_pods("ns", "a=b")
    client.delete_pods("ns", "a=b", 30)
    return set(calls)


def documented_rbac() -> List[dict]:
    found = RBAC_BLOCK.findall(DOCS.read_text(encoding="utf-8"))
    assert len(found) == 1, "docs/platforms.md holds one block written to trialkit-rbac.yaml"
    return list(yaml.safe_load_all(found[0]))


def granted(objects: List[dict], kind: str) -> Set[Call]:
    return {(group, resource, verb) for obj in objects if obj["kind"] == kind for rule in obj["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}


def test_the_docs_role_grants_every_call_the_cluster_module_makes(monkeypatch):
    objects = documented_rbac()
    for obj in objects:
        k8s_schemas.validate_builtin(obj)  # strict, as the API server reads it
    calls = client_calls(monkeypatch)
    cluster_scoped = {(group, plural) for group, _, plural in kube.CLUSTER_KINDS.values()}
    namespaced = {call for call in calls if call[0] != "discovery" and call[:2] not in cluster_scoped}
    assert namespaced - granted(objects, "Role") == set()
    assert {call for call in calls if call[:2] in cluster_scoped} - granted(objects, "ClusterRole") == set()
    assert any(call[0] == "discovery" for call in calls)  # said in the docs: system:discovery grants it
    assert "system:discovery" in DOCS.read_text(encoding="utf-8")


def test_the_check_sees_a_missing_grant(monkeypatch):
    objects = documented_rbac()
    role = next(obj for obj in objects if obj["kind"] == "Role")
    role["rules"] = [rule for rule in role["rules"] if "pods" not in rule["resources"]]
    missing = {call for call in client_calls(monkeypatch) if call[:2] == ("", "pods")}
    assert missing == {("", "pods", "list"), ("", "pods", "deletecollection")}
    assert missing & (set(client_calls(monkeypatch)) - granted(objects, "Role")) == missing

