"""The cluster-facing half: kube_client and the platforms' submit/status/stop/kill.

No API server can run here. A local HTTP server on 127.0.0.1
(k8s_fake_api.FakeApiServer) stands in for the API server: the official
`kubernetes` client, configured from a kubeconfig through KUBECONFIG as a
user's would be, sends it real requests, and the tests assert what it
received (verbs, paths, query parameters, bodies, headers), the order of
creation, ownership, retries of transient failures, and that the trial's
token goes to the Secret and nowhere else.
"""
from __future__ import annotations

import json
import logging
import time

import pytest

import k8s_fake_api
import k8s_schemas
from k8s_fake_api import FakeApiServer
from trialkit.errors import UserError
from trialkit.platforms.kubernetes import adaptdljob as adaptdl, frameworkcontroller, kubeflow
from trialkit.platforms.kubernetes import render as k8s
from trialkit.statuses import FAILED, RUNNING, SUCCEEDED, SYS_CANCELED, WAITING
from trialkit.platforms.base import TrialSpec
from trialkit.platforms.kubernetes.client import ClusterError, KubeClient, ObjectRef

TOKEN = "trial-token-5b7e0c1d"


@pytest.fixture
def api(tmp_path, monkeypatch):
    with FakeApiServer() as server:
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path)))
        yield server


@pytest.fixture
def client(api):
    return KubeClient.from_environment(attempts=4, backoff=0.01)


def spec(trial: str = "t1") -> TrialSpec:
    return TrialSpec(
        experiment_id="exp1",
        trial_id=trial,
        sequence=1,
        command="python3 train.py",
        env={"TRIALKIT_TOKEN": TOKEN, "TRIALKIT_MANAGER_URL": "http://127.0.0.1:8081/api/v1"},
    )


def configmap(name: str = "cm", namespace: str = "team") -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, "labels": {"a": "b"}}, "data": {"run.sh": "#!/bin/sh\n"}}


ADAPTDL = {"platform": "adaptdl", "namespace": "team", "managerAddress": "10.0.0.2", "image": "img:1",
           "checkpoint": {"storageClass": "dfs", "storageSize": "2Gi"}}


def adaptdl_platform(tmp_path, client) -> adaptdl.Platform:
    return adaptdl.Platform(adaptdl.parse_section(ADAPTDL, "trainingService"), tmp_path / "experiment", client=client)


# --- kube_client -------------------------------------------------------------


@pytest.mark.parametrize(
    "obj, path",
    [
        (configmap(), "/api/v1/namespaces/team/configmaps"),
        ({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "team"}, "type": "Opaque"}, "/api/v1/namespaces/team/secrets"),
        ({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c", "namespace": "team"},
          "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "dfs"}},
         "/api/v1/namespaces/team/persistentvolumeclaims"),
        ({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j", "namespace": "team"}, "spec": {"x": 1}}, "/apis/kubeflow.org/v1/namespaces/team/pytorchjobs"),
        ({"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "j", "namespace": "team"}, "spec": {}}, "/apis/kubeflow.org/v1/namespaces/team/tfjobs"),
        ({"apiVersion": "frameworkcontroller.microsoft.com/v1", "kind": "Framework", "metadata": {"name": "j", "namespace": "team"}, "spec": {}},
         "/apis/frameworkcontroller.microsoft.com/v1/namespaces/team/frameworks"),
        ({"apiVersion": "adaptdl.petuum.com/v1", "kind": "AdaptDLJob", "metadata": {"name": "j", "namespace": "team"}, "spec": {}}, "/apis/adaptdl.petuum.com/v1/namespaces/team/adaptdljobs"),
    ],
    ids=lambda v: v["kind"] if isinstance(v, dict) else "",
)
def test_create_posts_the_object_to_its_collection(api, client, obj, path):
    created = client.create(obj)
    request = api.requests[-1]
    assert (request.method, request.path, request.body) == ("POST", path, obj)
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == f"Bearer {k8s_fake_api.KUBE_TOKEN}"  # from the kubeconfig
    assert created["metadata"]["uid"] and created["metadata"]["name"] == obj["metadata"]["name"]
    assert client.get(ObjectRef.of(obj))["metadata"]["uid"] == created["metadata"]["uid"]


def test_conflicts_raise_keep_or_replace(api, client):
    client.create(configmap())
    with pytest.raises(ClusterError) as caught:
        client.create(configmap())
    assert caught.value.status == 409 and "already exists" in str(caught.value)
    assert client.create(configmap(), on_conflict="keep")["data"] == {"run.sh": "#!/bin/sh\n"}
    changed = dict(configmap(), data={"run.sh": "exec true\n"})
    assert client.create(changed, on_conflict="replace")["data"] == {"run.sh": "exec true\n"}
    assert api.calls()[-2:] == [("POST", "/api/v1/namespaces/team/configmaps"), ("PUT", "/api/v1/namespaces/team/configmaps/cm")]


def test_missing_objects_read_as_none_and_delete_as_false(api, client):
    ref = ObjectRef("PyTorchJob", "team", "gone")
    assert client.get(ref) is None
    assert client.delete(ref) is False


def test_transient_failures_are_retried_with_backoff(api, client):
    api.faults = ["503", "drop", "429"]
    started = time.monotonic()
    created = client.create(configmap())
    assert created["metadata"]["uid"]
    assert api.calls() == [("POST", "/api/v1/namespaces/team/configmaps")] * 4
    assert time.monotonic() - started >= 0.01  # it backed off between attempts


def test_a_lost_create_answer_is_recovered_not_duplicated(api, client):
    """The server created the object but the answer was lost: the retry meets 409, keep returns it."""
    client.create(configmap())
    api.faults = ["503"]
    again = client.create(configmap(), on_conflict="keep")
    assert again["metadata"]["name"] == "cm"
    assert len([k for k in api.objects if k.endswith("/cm")]) == 1


def test_persistent_failures_raise_after_the_retries(api, client):
    api.faults = ["500"] * 10
    with pytest.raises(ClusterError) as caught:
        client.get(ObjectRef("TFJob", "team", "j"))
    assert caught.value.status == 500 and "injected 500" in str(caught.value)
    assert len(api.requests) == 4  # attempts=4


def test_refusals_are_not_retried(api, client):
    api.faults = ["403"]
    with pytest.raises(ClusterError) as caught:
        client.create(configmap())
    assert caught.value.status == 403 and len(api.requests) == 1


def test_delete_uses_foreground_propagation(api, client):
    job = {"apiVersion": "adaptdl.petuum.com/v1", "kind": "AdaptDLJob", "metadata": {"name": "j", "namespace": "team"}, "spec": {}}
    client.create(job)
    assert client.delete(ObjectRef.of(job)) is True
    request = api.requests[-1]
    assert (request.method, request.path) == ("DELETE", "/apis/adaptdl.petuum.com/v1/namespaces/team/adaptdljobs/j")
    assert request.body["propagationPolicy"] == "Foreground"


def test_no_configuration_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(UserError, match="no Kubernetes configuration found"):
        KubeClient.from_environment()


def test_an_unreachable_server_raises_after_the_retries(tmp_path, monkeypatch):
    with FakeApiServer() as server:
        kubeconfig = server.kubeconfig(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))  # the server is gone: connections are refused
    with pytest.raises(ClusterError, match="cannot reach the API server"):
        KubeClient.from_environment(attempts=2, backoff=0.01).get(ObjectRef("TFJob", "team", "j"))


# --- a platform's submit, status, stop, kill -----------------------------------


def test_submit_creates_needs_first_then_the_job_then_ownership(api, client, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    platform = adaptdl_platform(tmp_path, client)
    handle = platform.submit(spec())
    names = k8s.trial_names(spec(), adaptdl.NAME_BUDGET)
    job_name = names.job
    assert handle == f"AdaptDLJob/team/{job_name}"
    core, crd = "/api/v1/namespaces/team", "/apis/adaptdl.petuum.com/v1/namespaces/team"
    assert api.calls() == [
        ("POST", f"{core}/secrets"),
        ("POST", f"{core}/serviceaccounts"),
        ("POST", f"{core}/configmaps"),
        ("POST", f"{core}/persistentvolumeclaims"),
        ("POST", f"{core}/persistentvolumeclaims"),
        ("POST", f"{core}/persistentvolumeclaims"),
        ("POST", f"{crd}/adaptdljobs"),
        ("PATCH", f"{core}/secrets/{job_name}"),
        ("PATCH", f"{core}/configmaps/{job_name}"),
    ]
    job = api.objects[f"{crd}/adaptdljobs/{job_name}"]
    owner = {"apiVersion": "adaptdl.petuum.com/v1", "kind": "AdaptDLJob", "name": job_name, "uid": job["metadata"]["uid"]}
    for request in api.requests[7:]:
        assert request.body == {"metadata": {"ownerReferences": [owner]}}
    # The pods' account is the experiment's, nobody's: it serves every trial, with no rights.
    account = next(v for k, v in api.objects.items() if "/serviceaccounts/" in k)
    assert "ownerReferences" not in account["metadata"] and account["automountServiceAccountToken"] is False
    # Claims are nobody's: the trial's checkpoint outlives its job (pause), the TensorBoard claim every trial.
    claims = [v for k, v in api.objects.items() if "/persistentvolumeclaims/" in k]
    assert len(claims) == 3 and all("ownerReferences" not in claim["metadata"] for claim in claims)
    # The token: in the Secret's body, and nowhere else at all.
    secret_post = api.requests[0]
    assert secret_post.body["stringData"] == {"TRIALKIT_TOKEN": TOKEN}
    for request in api.requests[1:]:
        assert TOKEN not in json.dumps(request.body)
    assert TOKEN not in caplog.text
    recorded = (tmp_path / "experiment" / "trials" / "t1" / "kubernetes.yaml").read_text()
    assert job_name in recorded and TOKEN not in recorded


def test_submit_is_idempotent(api, client, tmp_path):
    platform = adaptdl_platform(tmp_path, client)
    first = platform.submit(spec())
    second = platform.submit(spec())
    assert first == second
    assert len([k for k in api.objects if "/adaptdljobs/" in k]) == 1


def test_a_refused_job_leaves_nothing_of_the_trial_behind(api, client, tmp_path):
    platform = adaptdl_platform(tmp_path, client)
    api.faults = [None] * 6 + ["403"]  # the six needs are created; the job is refused
    with pytest.raises(ClusterError) as caught:
        platform.submit(spec())
    assert caught.value.status == 403
    left = sorted(k.rsplit("/", 2)[-2] for k in api.objects)
    assert left == ["persistentvolumeclaims", "serviceaccounts"]  # only the experiment's: TensorBoard claim, account
    assert [m for m, _ in api.calls()[-4:]] == ["DELETE"] * 4


def test_where_the_account_may_not_make_service_accounts_the_refusal_names_it(api, client, tmp_path):
    """docs/platforms.md, what the cluster needs: the trial fails at submission with the server's refusal;
    with serviceAccountName the experiment makes none."""
    platform = adaptdl_platform(tmp_path, client)
    api.faults = [None, "403"]  # the trial's Secret is made; its experiment's ServiceAccount is refused
    with pytest.raises(ClusterError) as caught:
        platform.submit(spec())
    assert caught.value.status == 403 and str(caught.value).startswith("create ServiceAccount/team/tk-exp1-trial: 403")
    named = adaptdl.Platform(adaptdl.parse_section({**ADAPTDL, "serviceAccountName": "trainer"}, "trainingService"),
                             tmp_path / "named", client=client)
    named.submit(spec("t2"))
    assert not [key for key in api.objects if "/serviceaccounts/" in key]


def pod_of(objects, name: str, state: dict) -> dict:
    """A pod made from the rendered template, as the kubelet reports it."""
    template = next(k8s_schemas.pod_templates(objects[-1]))
    return {"metadata": {"name": name, "labels": template["metadata"]["labels"]}, "spec": template["spec"],
            "status": {"phase": "Pending", "containerStatuses": [{"name": template["spec"]["containers"][0]["name"], "state": state}]}}


def test_status_reads_the_job_and_its_pods(api, client, tmp_path):
    platform = adaptdl_platform(tmp_path, client)
    handle = platform.submit(spec())
    assert platform.status(handle).status == WAITING  # no status written yet
    path = next(k for k in api.objects if "/adaptdljobs/" in k)
    api.objects[path]["status"] = {"phase": "Running"}
    assert platform.status(handle).status == RUNNING
    objects = adaptdl.render(platform.config, spec())
    api.pods = [pod_of(objects, "p0", {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}})]
    status = platform.status(handle)
    assert (status.status, status.reason) == (FAILED, "p0: ImagePullBackOff: no such image")
    list_pods = api.requests[-1]
    assert (list_pods.method, list_pods.path) == ("GET", "/api/v1/namespaces/team/pods")
    assert list_pods.query["labelSelector"] == "trialkit.io/experiment=exp1,trialkit.io/trial=t1"
    api.objects[path]["status"] = {"phase": "Succeeded"}
    api.pods = [pod_of(objects, "p0", {"terminated": {"exitCode": 0}})]
    assert (platform.status(handle).status, platform.status(handle).exit_code) == (SUCCEEDED, 0)


def test_a_job_that_vanished_is_sys_canceled(api, client, tmp_path):
    platform = adaptdl_platform(tmp_path, client)
    status = platform.status("AdaptDLJob/team/tk-gone")
    assert status.status == SYS_CANCELED and "no longer exists" in status.reason


@pytest.mark.parametrize(
    "module, section",
    [
        (kubeflow, {"platform": "kubeflow", "namespace": "team", "managerAddress": "10.0.0.2", "dockerImage": "i:1", "master": {"replicas": 1}}),
        (frameworkcontroller, {"platform": "frameworkcontroller", "namespace": "team", "managerAddress": "10.0.0.2", "dockerImage": "i:1", "taskRoles": [{"name": "w"}]}),
        (adaptdl, ADAPTDL),
    ],
    ids=["kubeflow", "frameworkcontroller", "adaptdl"],
)
def test_stop_deletes_the_job_and_kill_its_pods_too(api, client, tmp_path, module, section):
    platform = module.Platform(module.parse_section(section, "trainingService"), tmp_path, client=client)
    handle = platform.submit(spec())
    ref = ObjectRef.parse(handle)
    api.pods = [{"metadata": {"name": "p0", "labels": {"trialkit.io/experiment": "exp1", "trialkit.io/trial": "t1"}}}]
    platform.stop(handle)
    assert [(r.method, r.body) for r in api.requests[-1:]] == [("DELETE", {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"})]
    assert api.requests[-1].path.endswith(f"/{ref.name}") and api.pods  # the pods go by garbage collection, with their grace
    platform.submit(spec())
    platform.kill(handle)
    delete_job, delete_pods = api.requests[-2:]
    assert delete_job.body["propagationPolicy"] == "Foreground"
    assert (delete_pods.method, delete_pods.path) == ("DELETE", "/api/v1/namespaces/team/pods")
    assert delete_pods.query == {"labelSelector": "trialkit.io/experiment=exp1,trialkit.io/trial=t1", "gracePeriodSeconds": "0"}
    assert api.pods == []
    platform.kill(handle)  # gone already: nothing to do, no error
    assert api.requests[-1].method == "GET"
