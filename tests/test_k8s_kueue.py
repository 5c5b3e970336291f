"""Kueue as the queue (trialkit/platforms/kubernetes/kueue.py): a pool of pools.yml that is a LocalQueue.

The platforms run against the stand-in API server through the official client, with Kueue's admission
played by kueue_play (suspend, admit by priority and quota, preempt, evict); jobs are rendered for real and
validated against the CRDs. Nothing here runs a pod: tests/test_containers_kueue.py does.
"""
from __future__ import annotations

import copy
import socket

import pytest
import yaml

import k8s_schemas
from experiment_util import cli
from kueue_play import KueuePlay
from pools_util import config_refusal, home, pools_yml  # noqa: F401 (home: a fixture)
from test_kube_client import api, client  # noqa: F401 (fixtures)
from trialkit.errors import UserError
from trialkit.platforms import pools
from trialkit.platforms.base import TrialSpec
from trialkit.platforms.kubernetes import adaptdljob, frameworkcontroller, kubeflow, kueue
from trialkit.platforms.kubernetes import render as k8s
from trialkit.platforms.kubernetes.client import ObjectRef
from trialkit.statuses import PREEMPTED, WAITING

BASE = {"namespace": "team", "managerAddress": "10.0.0.2", "dockerImage": "i:1"}
TRAINJOB = {"platform": "kubeflow", "operator": "trainjob", "worker": {"replicas": 1}, **BASE}
PYTORCHJOB = {"platform": "kubeflow", "operator": "pytorch-operator", "master": {"replicas": 1}, **BASE}
TFJOB = {"platform": "kubeflow", "operator": "tf-operator", "worker": {"replicas": 2}, "ps": {"replicas": 1}, **BASE}
FRAMEWORK = {"platform": "frameworkcontroller", "taskRoles": [{"name": "worker", "taskNumber": 2}], **BASE}
QUEUE = kueue.Queue("gpu-team", "team", "team-queue", "research")


@pytest.fixture
def kueue_pool(home):
    pools_yml(home, "  gpu-team: {kueue: {namespace: team, localQueue: team-queue, priorityClass: research}}\n")


def trial(name: str) -> TrialSpec:
    return TrialSpec("expa", name, 1, "python3 train.py",
                     env={"TRIALKIT_TOKEN": "t0k", "TRIALKIT_MANAGER_URL": "http://127.0.0.1:8081/api/v1"})


def render(section: dict) -> dict:
    module = {"kubeflow": kubeflow, "frameworkcontroller": frameworkcontroller, "adaptdl": adaptdljob}
    parsed = module[section["platform"]].parse_section(copy.deepcopy(section), "trainingService")
    return module[section["platform"]].render(parsed, trial("expa-00001"))[-1]


# --- pools.yml ----------------------------------------------------------------------------------


def test_a_kueue_pool_in_pools_yml(kueue_pool, home):
    assert pools.read_config(home) == {"gpu-team": pools.PoolSpec(namespace="team", local_queue="team-queue",
                                                                  priority_class="research")}
    assert kueue.for_namespace("team") == QUEUE
    assert kueue.for_namespace("other") is None


@pytest.mark.parametrize("text, says", [
    ("  q: {kueue: {namespace: team}}\n", "pools.q.kueue: the Kueue pool has no localQueue"),
    ("  q: {kueue: {namespace: team, localQueue: lq}, slots: 4}\n", "pools.q.slots: slots is set beside kueue"),
    ("  q: {kueue: {namespace: team, localQueue: Team_Queue}}\n", "pools.q.kueue.localQueue: 'Team_Queue' is not a "
                                                                  "Kubernetes name"),
    ("  q: {kueue: {namespace: team, localQueue: lq, priority: high}}\n", "pools.q.kueue.priority"),
    # Too long to show whole: cut short, its quote closed.
    (f"  q: {{kueue: {{namespace: team, localQueue: {'q' * 70}}}}}\n",
     f"pools.q.kueue.localQueue: '{'q' * 55}...' is not a Kubernetes name"),
])
def test_kueue_pool_mistakes_are_one_line(home, text, says):
    assert says in config_refusal(home, text)


def test_a_namespace_has_one_pool_kueue_or_leases(home, api, client, tmp_path):
    pools_yml(home, "  a: {kueue: {namespace: team, localQueue: lq}}\n  b: {kubernetes: {namespace: team, slots: 2}}\n")
    platform = kubeflow.Platform(kubeflow.parse_section(dict(TRAINJOB), "trainingService"), tmp_path, client=client)
    with pytest.raises(UserError, match="pools a, b all name namespace 'team'"):
        platform.check_ready()


# --- joining the queue --------------------------------------------------------------------------


@pytest.mark.parametrize("section, suspend", [
    (TRAINJOB, ("spec", "suspend")),
    (PYTORCHJOB, ("spec", "runPolicy", "suspend")),
    (TFJOB, ("spec", "runPolicy", "suspend")),
])
def test_every_job_kind_is_labelled_into_the_queue_and_created_suspended(section, suspend):
    job = kueue.queued(render(section), QUEUE)
    k8s_schemas.validate_job(job)
    assert job["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-queue"
    assert job["metadata"]["labels"][kueue.PRIORITY_LABEL] == "research"
    held = job
    for key in suspend:
        held = held[key]
    assert held is True


def test_framework_pods_join_as_a_pod_group():
    job = kueue.queued(render(FRAMEWORK), QUEUE)
    k8s_schemas.validate_job(job)
    meta = job["spec"]["taskRoles"][0]["task"]["pod"]["metadata"]
    assert meta["labels"][kueue.QUEUE_LABEL] == "team-queue"
    assert meta["labels"][kueue.POD_GROUP_LABEL] == job["metadata"]["name"]
    assert meta["annotations"][kueue.POD_GROUP_COUNT] == "2"
    assert kueue.QUEUE_LABEL not in job["metadata"]["labels"]  # Kueue does not manage Frameworks: their pods


def test_an_adaptdl_job_joins_only_with_a_fixed_count_of_pods():
    section = {"platform": "adaptdl", **BASE}
    with pytest.raises(UserError, match="fixed number of pods"):
        kueue.queued(render({**section, "minReplicas": 1, "maxReplicas": 3}), QUEUE)
    job = kueue.queued(render({**section, "minReplicas": 2, "maxReplicas": 2}), QUEUE)
    k8s_schemas.validate_job(job)
    assert job["spec"]["template"]["metadata"]["annotations"][kueue.POD_GROUP_COUNT] == "2"


# --- admission read back ------------------------------------------------------------------------


def platform_of(section: dict, client, tmp_path, said: list):
    platform = kubeflow.Platform(kubeflow.parse_section(dict(section), "trainingService"), tmp_path, client=client)
    platform.on_waiting = lambda trial_id, why: said.append((trial_id, why))
    return platform


def job_path(api, handle: str) -> str:
    kind, _, name = handle.split("/")
    return next(path for path in api.objects if path.endswith(f"/{kind.lower()}s/{name}"))


def test_a_job_waits_with_kueues_words_takes_no_lease_and_starts_when_admitted(kueue_pool, api, client, tmp_path):
    play = KueuePlay(api, "team", "team-queue", pods=1, classes={"research": 10})
    said: list = []
    platform = platform_of(TRAINJOB, client, tmp_path, said)
    first, second = (platform.submit(trial(f"expa-{n:05d}")) for n in range(2))
    play.turn()
    assert platform.status(first).status == WAITING and not api.objects[job_path(api, first)]["spec"]["suspend"]
    waiting = platform.status(second)
    assert waiting.status == WAITING
    assert waiting.reason.startswith("queued in Kueue's LocalQueue team-queue: Pending: couldn't assign flavors")
    assert said == [("expa-00001", waiting.reason)]  # the store hears it once, not at every look
    platform.status(second)
    assert len(said) == 1
    assert not any("configmaps/trialkit-pool" in path for path in api.objects)  # no lease of trialkit's


def test_an_eviction_ends_the_trial_preempted_once_its_pods_are_gone(kueue_pool, api, client, tmp_path):
    play = KueuePlay(api, "team", "team-queue", pods=1, classes={"research": 10})
    platform = platform_of(TRAINJOB, client, tmp_path, [])
    handle = platform.submit(trial("expa-00000"))
    play.turn()
    pod = {"metadata": {"name": "p", "labels": copy.deepcopy(api.objects[job_path(api, handle)]["metadata"]["labels"])},
           "status": {"phase": "Running"}}
    api.pods.append(pod)
    play.evict(handle.rsplit("/", 1)[-1])
    assert platform.status(handle).status != PREEMPTED  # its pods still checkpoint
    assert any(obj["kind"] == "TrainJob" for obj in api.objects.values())
    api.pods.remove(pod)
    said = platform.status(handle)
    assert said.status == PREEMPTED and said.reason.startswith("evicted by Kueue (Preempted: Evicted by the test)")
    assert not any(obj["kind"] == "TrainJob" for obj in api.objects.values())  # deleted: a new one resumes it
    gone = platform.status(handle)
    assert (gone.status, gone.reason) == (PREEMPTED, said.reason)
    platform.submit(trial("expa-00000"))  # the experiment resumes it: a new job, queued again
    assert platform.status(handle).status == WAITING


def test_a_job_kueue_never_manages_says_so(kueue_pool, api, client, tmp_path):
    platform = platform_of(PYTORCHJOB, client, tmp_path, [])
    handle = platform.submit(trial("expa-00000"))  # no Kueue plays here: no Workload comes
    reason = platform.status(handle).reason
    assert "which has made no Workload for it yet" in reason and "Kueue does not manage PyTorchJob" in reason


def test_job_list_shows_the_queue_in_kueues_order(kueue_pool, api, client, tmp_path):
    play = KueuePlay(api, "team", "team-queue", pods=1, classes={"research": 10, "urgent": 100})
    platform = platform_of(TRAINJOB, client, tmp_path, [])
    handles = [platform.submit(trial(f"expa-{n:05d}")) for n in range(3)]
    play.turn()
    rows = kueue.jobs(QUEUE, client)
    assert [(r["id"], r["status"], r["priority"]) for r in rows] == [
        ("expa-00000", "ADMITTED", 10), ("expa-00001", "QUEUED", 10), ("expa-00002", "QUEUED", 10)]
    assert rows[0]["admission"] == "ClusterQueue cq" and rows[0]["slots_acquired"] == 1
    assert rows[1]["admission"].startswith("Pending: couldn't assign flavors") and rows[1]["slots_acquired"] == 0
    assert rows[1]["experiment"] == "expa" and rows[1]["name"].startswith("trainjob-")
    kueue.set_priority(ObjectRef.parse(handles[2]), "urgent", client)  # waiting: Kueue takes it, and preempts
    play.turn()
    rows = kueue.jobs(QUEUE, client)
    # The evicted one waits from its eviction: behind the one of its priority that waited all along.
    assert [(r["id"], r["status"], r["priority"], r["priority_class"]) for r in rows] == [
        ("expa-00002", "ADMITTED", 100, "urgent"), ("expa-00001", "QUEUED", 10, "research"),
        ("expa-00000", "EVICTED", 10, "research")]
    assert rows[2]["admission"].startswith("Preempted: Preempted to accommodate a workload")


def test_job_list_of_a_kueue_pool_whose_api_server_does_not_answer_is_one_line(kueue_pool, tmp_path, monkeypatch):
    """As `trialkit run` says it: one line naming the kubeconfig and what failed, exit 2, no traceback."""
    with socket.socket() as closed:  # a port that nothing listens on once this is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    done = cli("job", "list", "--pool", "gpu-team")
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("trialkit: error: KUBECONFIG: list Workload in team: cannot reach the API server: ")
    assert line.endswith("(check the cluster in your kubeconfig, and that it is up)")


def test_a_priority_class_changes_only_while_the_job_waits(kueue_pool, api, client, tmp_path):
    play = KueuePlay(api, "team", "team-queue", pods=1, classes={"research": 10, "urgent": 100})
    platform = platform_of(TRAINJOB, client, tmp_path, [])
    admitted = platform.submit(trial("expa-00000"))
    play.turn()
    with pytest.raises(UserError) as caught:
        kueue.set_priority(ObjectRef.parse(admitted), "urgent", client)
    assert "is admitted by Kueue: a WorkloadPriorityClass changes only while the job waits" in caught.value.line()
    waiting = platform.submit(trial("expa-00001"))
    with pytest.raises(UserError) as caught:
        kueue.set_priority(ObjectRef.parse(waiting), "nosuch", client)
    assert "no WorkloadPriorityClass 'nosuch' (name one of: research, urgent)" in caught.value.line()


def test_a_pod_groups_wait_is_read_from_its_workload(kueue_pool, api, client, tmp_path):
    platform = frameworkcontroller.Platform(frameworkcontroller.parse_section(dict(FRAMEWORK), "trainingService"),
                                            tmp_path, client=client)
    said: list = []
    platform.on_waiting = lambda trial_id, why: said.append(why)
    handle = platform.submit(trial("expa-00000"))
    name = handle.rsplit("/", 1)[-1]
    framework = next(obj for obj in api.objects.values() if obj["kind"] == "Framework")
    pod = framework["spec"]["taskRoles"][0]["task"]["pod"]
    assert pod["metadata"]["labels"][kueue.POD_GROUP_LABEL] == name
    assert "made no Workload" in platform.status(handle).reason  # no pods yet, no Workload yet
    # Kueue's Workload of the group, named after it, and its gated pods.
    api.objects[f"/apis/kueue.x-k8s.io/v1beta2/namespaces/team/workloads/{name}"] = {
        "kind": "Workload", "metadata": {"name": name, "namespace": "team", "uid": "w1", "resourceVersion": "1"},
        "spec": {"queueName": "team-queue"}, "status": {"conditions": [
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "2 pods wait for quota"}]}}
    api.pods.append({"metadata": {"name": f"{name}-worker-0", "labels": dict(pod["metadata"]["labels"])},
                     "spec": {"schedulingGates": [{"name": kueue.ADMISSION_GATE}]}, "status": {"phase": "Pending"}})
    waiting = platform.status(handle)
    assert (waiting.status, waiting.reason) == (WAITING, "queued in Kueue's LocalQueue team-queue: Pending: 2 pods "
                                                         "wait for quota")
    assert said[-1] == waiting.reason
