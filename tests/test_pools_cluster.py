"""A Kubernetes namespace's resource pool: leases in a ConfigMap of the namespace (kubernetes/pool_leases.py).

No API server can run here: the stand-in (k8s_fake_api, on loopback, reached through the official
client) keeps the ledger and, as a real server does, refuses a write over a resourceVersion that is not
the latest (409). The experiments are real platform objects (kubeflow's), two of them, as two control
planes would be.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time

import pytest

from harness import child_environ, wait_until
from pools_util import config_refusal, home, pools_yml  # noqa: F401 (home: a fixture)
from test_kube_client import api, client  # noqa: F401 (fixtures)
from trialkit.errors import UserError
from trialkit.platforms import pools
from trialkit.platforms.base import PlatformStatus, TrialSpec
from trialkit.platforms.kubernetes import kubeflow, pool_leases
from trialkit.platforms.kubernetes import render as k8s
from trialkit.platforms.kubernetes.client import KubeClient
from trialkit.statuses import SUCCEEDED, USER_CANCELED, WAITING

SECTION = {"platform": "kubeflow", "namespace": "team", "managerAddress": "10.0.0.2", "dockerImage": "i:1",
           "master": {"replicas": 1}, "worker": {"replicas": 1}}  # two pods a trial: two slots


@pytest.fixture(autouse=True)
def team_pool(home):
    pools_yml(home, "  gpu-team: {kubernetes: {namespace: team, slots: 4}}\n")


def trial(experiment: str, name: str) -> TrialSpec:
    return TrialSpec(experiment, name, 1, "python3 train.py",
                     env={"TRIALKIT_TOKEN": "t0k", "TRIALKIT_MANAGER_URL": "http://127.0.0.1:8081/api/v1"})


def jobs(api) -> dict:
    """Job name -> whether it ended, of the jobs the cluster holds."""
    return {path.rsplit("/", 1)[-1]: bool((obj.get("status") or {}).get("conditions"))
            for path, obj in api.objects.items() if "/pytorchjobs/" in path}


def succeed(api, handle: str) -> None:
    path = next(path for path in api.objects if path.endswith("/pytorchjobs/" + handle.rsplit("/", 1)[-1]))
    api.objects[path]["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}


def test_two_experiments_in_one_namespace_never_hold_more_than_its_slots(api, client, tmp_path):
    first = kubeflow.Platform(kubeflow.parse_section(SECTION, "trainingService"), tmp_path / "a", client=client)
    second = kubeflow.Platform(kubeflow.parse_section(SECTION, "trainingService"), tmp_path / "b",
                               client=KubeClient.from_environment(attempts=4, backoff=0.01))
    a = [first.submit(trial("expa", f"expa-{n}")) for n in range(2)]
    b = [second.submit(trial("expb", f"expb-{n}")) for n in range(2)]
    assert len(jobs(api)) == 2  # a's two trials: 4 slots of 4; b's wait, nothing of theirs in the cluster
    assert [second.status(handle).status for handle in b] == [WAITING, WAITING]
    assert second.status(b[0]).reason == "waiting for 2 slots of pool gpu-team (namespace team): 0 of 4 free"
    succeed(api, a[0])
    assert second.status(b[0]).status == WAITING  # a's control plane has not seen its trial end yet
    assert first.status(a[0]).status == SUCCEEDED  # now it has: its slots go back
    assert second.status(b[0]).reason == ""  # created: pending in the cluster
    assert second.status(b[1]).reason.startswith("waiting for 2 slots of pool gpu-team")
    assert jobs(api) == {"tk-expa-expa-0": True, "tk-expa-expa-1": False, "tk-expb-expb-0": False}  # 4 slots busy
    second.stop(b[1])  # stopped while it waited: it never reaches the cluster
    assert second.status(b[1]).status == USER_CANCELED
    assert second.status(b[1]).started is False  # so an experiment's stop leaves it waiting for the resume
    for platform, handle in ((first, a[1]), (second, b[0])):
        succeed(api, handle)
        assert platform.status(handle).status == SUCCEEDED
    assert pool_leases.NamespacePool(client, "gpu-team", "team", 4).leases() == {}
    for platform in (first, second):
        platform.pool.close()
        platform.remove_experiment("x", [])


def job(name: str) -> dict:
    return {"kind": "PyTorchJob", "metadata": {"name": name, "namespace": "team",
                                               "labels": {k8s.LABEL_EXPERIMENT: "e", k8s.LABEL_TRIAL: name}},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}}}}


class SecondToWrite:
    """The real client, except that before its first write another control plane takes slots."""

    def __init__(self, client: KubeClient, before):
        self._client, self._before = client, before

    def __getattr__(self, name):
        return getattr(self._client, name)

    def replace(self, obj: dict) -> dict:
        before, self._before = self._before, None
        if before is not None:
            before()
        return self._client.replace(obj)


def test_a_write_over_a_ledger_another_control_plane_changed_is_made_again(api, client):
    other = pool_leases.NamespacePool(client, "gpu-team", "team", 2, holder="other")
    mine = pool_leases.NamespacePool(SecondToWrite(client, lambda: other.take("o-1", "o", 2, job("o-1"))),
                                     "gpu-team", "team", 2, holder="mine")
    try:
        assert not mine.take("m-1", "m", 1, job("m-1"))  # read 0 of 2 used, but the other took 2 before it wrote
        assert sorted(mine.leases()) == ["o-1"]
        assert [request.method for request in api.requests].count("PUT") == 2  # its own refused (409), the other's
    finally:
        other.close()
        mine.close()


def test_many_control_planes_at_once_get_no_more_than_the_slots(api, client):
    takers = [pool_leases.NamespacePool(KubeClient.from_environment(attempts=4, backoff=0.01), "gpu-team", "team",
                                        3, holder=f"cp-{n}") for n in range(8)]
    granted = []
    threads = [threading.Thread(target=lambda p=p, n=n: granted.append(p.take(f"t-{n}", f"e{n}", 1, job(f"t-{n}"))))
               for n, p in enumerate(takers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert granted.count(True) == 3 and len(granted) == 8
    assert len(takers[0].leases()) == 3
    for taker in takers:
        taker.close()


def test_a_crashed_control_plane_s_lease_expires_unless_its_job_still_runs(api, client):
    crashed = pool_leases.NamespacePool(client, "gpu-team", "team", 2, lease_seconds=0.3, holder="crashed")
    assert crashed.take("c-1", "c", 2, job("c-1"))
    crashed.close()  # it renews no more, as a control plane killed with -9
    client.create({**job("c-1"), "apiVersion": "kubeflow.org/v1"})  # its job, with a running pod
    api.pods.append({"metadata": {"name": "c-1-master-0", "labels": job("c-1")["metadata"]["labels"]},
                     "status": {"phase": "Running"}})
    later = pool_leases.NamespacePool(client, "gpu-team", "team", 2, holder="later")
    time.sleep(0.5)
    assert not later.take("l-1", "l", 1, job("l-1"))  # expired, but its job runs: the slots stay its
    api.pods[0]["status"]["phase"] = "Succeeded"
    assert later.take("l-1", "l", 1, job("l-1"))  # its pods ended: the slots are free again
    assert sorted(later.leases()) == ["l-1"]
    later.close()


def test_a_live_control_plane_renews_its_leases(api, client):
    # A lease of 1.5 s renewed every 0.5 s, looked at for 3 s: unrenewed, it would be gone by the third look;
    # a renewal late by up to 1 s (a loaded machine) still keeps it.
    holder = pool_leases.NamespacePool(client, "gpu-team", "team", 1, lease_seconds=1.5, holder="live")
    assert holder.take("h-1", "h", 1, job("h-1"))  # its job not created yet: only the renewals keep the lease
    other = pool_leases.NamespacePool(client, "gpu-team", "team", 1, holder="other")
    try:
        for _ in range(4):
            time.sleep(0.75)
            assert not other.take("o-1", "o", 1, job("o-1"))
    finally:
        holder.close()
    wait_until(lambda: other.take("o-1", "o", 1, job("o-1")), 5, "the lease to expire once not renewed")
    other.close()


def test_a_trial_with_more_pods_than_the_pool_has_is_refused(api, client, tmp_path):
    section = {**SECTION, "worker": {"replicas": 4}}
    platform = kubeflow.Platform(kubeflow.parse_section(section, "trainingService"), tmp_path / "a", client=client)
    with pytest.raises(UserError) as caught:
        platform.submit(trial("expa", "expa-0"))
    assert "each trial asks for 5 slots (its pods) but pool 'gpu-team' of namespace team has 4" in caught.value.line()
    assert jobs(api) == {}


def test_a_namespace_without_a_pool_is_not_pooled(api, client, tmp_path, home):
    pools_yml(home, "  other: {kubernetes: {namespace: elsewhere, slots: 1}}\n")
    platform = kubeflow.Platform(kubeflow.parse_section(SECTION, "trainingService"), tmp_path / "a", client=client)
    handles = [platform.submit(trial("expa", f"expa-{n}")) for n in range(3)]
    assert platform.pool is None and len(jobs(api)) == 3
    assert [platform.status(handle).reason for handle in handles] == [""] * 3  # created, none held


@pytest.mark.parametrize("section, what", [
    ("{kubernetes: {namespace: team}}", "the Kubernetes pool has no slots"),
    ("{slots: 2, kubernetes: {namespace: team, slots: 2}}", "slots is set beside kubernetes"),
    ("{kubernetes: {namespace: team, slots: 0}}", "kubernetes.slots"),
    ("{kubernetes: {namespce: team, slots: 1}}", "namespce"),
])
def test_a_kubernetes_pool_with_a_mistake_is_one_user_error(home, section, what):
    assert what in config_refusal(home, f"  team: {section}\n")


def test_a_local_experiment_cannot_take_a_namespace_s_pool(home):
    assert pools.read_config(home) == {"gpu-team": pools.PoolSpec(4, namespace="team")}
    with pytest.raises(UserError) as caught:
        pools.open_pool("gpu-team")
    assert "resource pool 'gpu-team' is Kubernetes namespace team's" in caught.value.line()


def test_two_pools_naming_one_namespace_is_one_user_error_before_any_trial(client, home, tmp_path):
    pools_yml(home, "  a: {kubernetes: {namespace: team, slots: 1}}\n"
                    "  b: {kubernetes: {namespace: team, slots: 2}}\n")
    platform = kubeflow.Platform(kubeflow.parse_section(SECTION, "trainingService"), tmp_path / "a", client=client)
    with pytest.raises(UserError) as caught:
        platform.check_ready()
    assert "pools a, b all name namespace 'team'" in caught.value.line()


def test_two_pools_naming_one_ray_cluster_is_one_user_error(home):
    from trialkit.platforms import ray_pool

    pools_yml(home, "  a: {ray: {address: 'head:6379', slots: 1}}\n  b: {ray: {address: 'head:6379', slots: 2}}\n")
    with pytest.raises(UserError) as caught:
        ray_pool.for_address("head:6379")
    assert "pools a, b all name Ray cluster head:6379" in caught.value.line()
    assert ray_pool.for_address("elsewhere:6379") is None


# -- a Ray cluster's pool (a real cluster: ray_cluster.py) -----------------------------------------

RAY_HOLDER = """
import sys, time, ray
ray.init(address=sys.argv[1], namespace="trialkit", log_to_driver=False)
from trialkit.platforms import ray_pool
assert ray_pool.RayPool("shared", 2).take("c-1", "crashed", 1, "trialkit-trial-c-1")
print("taken", flush=True)
time.sleep(600)
"""


@pytest.fixture
def ray_driver(ray_cluster, home):
    """The test process as a control plane's Ray driver; the pool's ledger and the driver go after the test."""
    import ray

    from trialkit.ray import cluster, pool_ledger

    pools_yml(home, f"  shared: {{ray: {{address: '{ray_cluster.address}', slots: 2}}}}\n")
    yield ray_cluster
    if ray.is_initialized():
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(pool_ledger.ledger_name("shared"), namespace=cluster.NAMESPACE))
    ray.shutdown()
    ray_cluster.wait_clean()


def holders_alive(cluster) -> int:
    return sum("Holder" in actor for actor in cluster.live_actors())


@pytest.mark.slow
def test_a_ray_pool_s_lease_stands_while_its_group_does_or_its_unplaced_holder_lives(ray_driver):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from trialkit.platforms import ray_pool

    ray.init(address=ray_driver.address, namespace="trialkit", log_to_driver=False)
    pool = ray_pool.RayPool("shared", 2)
    assert pool.take("m-0", "mine", 1, "trialkit-trial-m-0")  # its group not made yet: our holder keeps it
    crashed = subprocess.Popen([sys.executable, "-c", RAY_HOLDER, ray_driver.address], stdout=subprocess.PIPE,
                               text=True, env=child_environ())
    try:
        assert crashed.stdout.readline().strip() == "taken"
        # Its trial's placement group, as the platform makes it: detached, it outlives its control plane.
        group = placement_group([{"memory": 1}], name="trialkit-trial-c-1", lifetime="detached")
        assert not pool.take("m-1", "mine", 1, "trialkit-trial-m-1")  # 2 of 2 leased
        assert pool.waiting_reason(1) == "waiting for 1 slot of pool shared (Ray cluster): 0 of 2 free"
    finally:
        crashed.kill()
        crashed.wait()
        crashed.stdout.close()
    try:
        wait_until(lambda: holders_alive(ray_driver) == 1, 60, "the crashed control plane's holder to die with it")
        assert not pool.take("m-1", "mine", 1, "trialkit-trial-m-1")  # its holder is gone, but its group stands
    finally:
        remove_placement_group(group)  # its trial ended
    assert pool.take("m-1", "mine", 1, "trialkit-trial-m-1")
    assert pool.held() == {"m-0": 1, "m-1": 1}


GATED = ("import os, time, trialkit\n"
         "open({log!r}, 'a').write(f'start {{time.time()}} {name}\\n')\n"
         "while not os.path.exists({gate!r}):\n"
         "    time.sleep(0.05)\n"
         "open({log!r}, 'a').write(f'end {{time.time()}} {name}\\n')\n"
         "trialkit.report_final_result(1)\n")


@pytest.mark.slow
def test_a_ray_experiment_s_trial_waits_for_the_slot_another_holds_and_can_be_stopped(ray_driver, tmp_path, home):
    from harness import Manager
    from test_ray_platform import WHERE, final, spec
    from trialkit.platforms import load, ray_pool
    from trialkit.platforms.ray import parse_section

    pools_yml(home, f"  shared: {{ray: {{address: '{ray_driver.address}', slots: 1}}}}\n")
    manager = Manager(tmp_path / "manager").start()
    code, log, gate = tmp_path / "code", tmp_path / "spans", tmp_path / "gate"
    code.mkdir()
    platform = load("ray").Platform(parse_section({"platform": "ray", "address": ray_driver.address}, WHERE),
                                    tmp_path / "exp")
    ended = []
    platform.on_end = ended.append
    try:
        specs = [spec(name, GATED.format(log=str(log), gate=str(gate), name=name), code, manager)
                 for name in ("t1", "t2")]
        first = platform.submit(specs[0])
        wait_until(lambda: log.exists() and "start" in log.read_text(), 60, "t1 to start")
        other = ray_pool.RayPool("shared", 1)  # another control plane's experiment on the same cluster
        assert not other.take("other-1", "other", 1, "trialkit-trial-other-1")  # t1 holds the pool's slot
        second = platform.submit(specs[1])
        assert platform.status(second) == PlatformStatus(WAITING, "waiting for 1 slot of pool shared (Ray cluster): "
                                                                  "0 of 1 free")
        platform.stop(second, 5)  # stopped while it waits: it never reaches Ray
        assert platform.status(second).status == USER_CANCELED and ended == [second]
        assert platform.status(second).started is False  # an experiment's stop would keep it for the resume
        gate.touch()
        assert final(platform, first).status == SUCCEEDED
        wait_until(lambda: other.take("other-1", "other", 1, "trialkit-trial-other-1"), 30,
                   "t1's slot to come back once its group is gone")
    finally:
        gate.touch()
        manager.close()
    assert "t2" not in log.read_text()
