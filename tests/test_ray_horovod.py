"""trialkit.ray.horovod: Horovod workers started by Ray on the session's two-raylet cluster, no ssh.

The builders are tested as data; the launches are real: horovod 0.28.1 with
gloo on the CPU, one worker on each raylet (STRICT_SPREAD), real actors.
"""
from __future__ import annotations

import importlib.util
import re
import signal

import psutil
import pytest

from launch_support import PY, Proc, launch_env, write
from trialkit.errors import UserError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("horovod") is None or importlib.util.find_spec("ray") is None,
                                reason="needs horovod (tools/build_horovod.sh) and ray")

from trialkit.ray import horovod as horovod_ray  # noqa: E402  (after the skip: it names horovod's modules)

LAUNCH = [PY, "-m", "trialkit.ray.horovod"]

# -- the builders, as data ------------------------------------------------------------------------


def test_options_defaults_and_the_address_from_the_environment(tmp_path, monkeypatch):
    assert horovod_ray.parse_options([], {}) == horovod_ray.Options()
    assert horovod_ray.parse_options([], {"RAY_ADDRESS": "10.0.0.1:6379"}).address == "10.0.0.1:6379"
    options = horovod_ray.parse_options(["--nodes", "2", "--workers-per-node", "3", "--cpus-per-worker", "0.5",
                                         "--gpus-per-worker", "1", "--address", "h:6379", "--placement-timeout", "5"],
                                        {"RAY_ADDRESS": "ignored:1"})
    assert options == horovod_ray.Options(2, 3, 0.5, 1.0, "h:6379", 5.0)
    assert options.world_size == 6
    monkeypatch.chdir(tmp_path)
    assert horovod_ray.parse_options(["--working-dir", "."], {}).working_dir == str(tmp_path)


@pytest.mark.parametrize("argv, what", [
    (["--nodes", "0"], "argument --nodes: invalid positive int value: '0'"),
    (["--cpus-per-worker", "-1"], "invalid non-negative float value"),
    (["--np", "2"], "unrecognized arguments: --np 2"),
    (["--working-dir", "/no/such/dir"], "argument --working-dir: '/no/such/dir' is not a directory"),
])
def test_option_mistakes_are_one_line(argv, what):
    with pytest.raises(UserError) as caught:
        horovod_ray.parse_options(argv, {})
    assert what in caught.value.line() and "\n" not in caught.value.line()


def test_one_bundle_per_node_holds_its_workers():
    assert horovod_ray.bundles(horovod_ray.Options(nodes=2)) == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert horovod_ray.bundles(horovod_ray.Options(nodes=1, workers_per_node=2, cpus_per_worker=0.5,
                                                   gpus_per_worker=1)) == [{"CPU": 1.0, "GPU": 2.0}]


def test_ranks_follow_the_bundles_and_a_worker_gets_horovodruns_gloo_variables():
    slots = horovod_ray.assignments(["nodeA", "nodeA", "nodeB", "nodeB"])
    assert [(s.hostname, s.rank, s.local_rank, s.cross_rank, s.size) for s in slots] == [
        ("nodeA", 0, 0, 0, 4), ("nodeA", 1, 1, 0, 4), ("nodeB", 2, 0, 1, 4), ("nodeB", 3, 1, 1, 4)]
    base = {"PATH": "/bin", "TRIALKIT_TRIAL_DIR": "/t", "RAY_JOB_ID": "01", "CUDA_VISIBLE_DEVICES": "0",
            "TRIALKIT_LAUNCH_SOCKET": "/s", "PWD": "/here"}
    assert horovod_ray.worker_environ(base, slots[2], ("10.0.0.1", 4242), "eth0", gpus=0) == {
        "PATH": "/bin", "TRIALKIT_TRIAL_DIR": "/t",
        "HOROVOD_HOSTNAME": "nodeB", "HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4242",
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": "eth0",
        "CUDA_VISIBLE_DEVICES": ""}
    with_gpu = horovod_ray.worker_environ(base, slots[0], ("10.0.0.1", 4242), None, gpus=1)
    assert "CUDA_VISIBLE_DEVICES" not in with_gpu and "HOROVOD_GLOO_IFACE" not in with_gpu


def test_a_mistake_in_the_options_is_one_line_before_any_cluster(tmp_path):
    proc = Proc([*LAUNCH, "--nodes", "two", "--", "train.py"], launch_env(tmp_path, RAY_ADDRESS="127.0.0.1:1"))
    assert proc.finish(timeout=60) == 2
    assert proc.err_lines == ["trialkit.ray.horovod: error: argument --nodes: invalid positive int value: "
                              "'two' "
                              "(the options: [--nodes NODES] [--workers-per-node WORKERS_PER_NODE] "
                              "[--cpus-per-worker CPUS_PER_WORKER] [--gpus-per-worker GPUS_PER_WORKER] "
                              "[--address ADDRESS] [--placement-timeout PLACEMENT_TIMEOUT] "
                              "[--working-dir WORKING_DIR])"]


def test_a_launcher_without_ray_says_so_in_one_line(tmp_path):
    code = "import sys; sys.modules['ray'] = None; from trialkit.ray import horovod; sys.exit(horovod.main())"
    proc = Proc([PY, "-c", code, "train.py"], launch_env(tmp_path))
    assert proc.finish(timeout=60) == 2
    assert proc.err_lines == ["trialkit.ray.horovod: error: ray is not installed here "
                              "(install it with pip install trialkit[ray] on the launcher's node and the workers')"]


def test_an_address_that_does_not_answer_is_one_line_in_seconds(tmp_path):
    proc = Proc([*LAUNCH, "--address", "127.0.0.1:1", "--", "train.py"], launch_env(tmp_path))
    assert proc.finish(timeout=60) == 2
    assert proc.err_lines == ["trialkit.ray.horovod: error: --address: cannot reach the Ray cluster at 127.0.0.1:1 "
                              "(Connection refused) (check the address, and that the head node is up and its port "
                              "is open to this machine)"]


# -- on the cluster ---------------------------------------------------------------------------------

TRAIN = """
import os, torch, horovod.torch as hvd
hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for step in range(3):
    torch.manual_seed(100 * hvd.rank() + step)  # each rank its own batch: only allreduce keeps them equal
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
weights = model.weight.detach()
agree = torch.equal(hvd.allreduce(weights, op=hvd.Max), hvd.allreduce(weights, op=hvd.Min))
print(f"rank {hvd.rank()} of {hvd.size()} agree {agree} raylet {os.environ['RAY_RAYLET_PID']}", flush=True)
"""


@pytest.fixture
def cluster(ray_cluster):
    from ray.util.state import list_placement_groups

    yield ray_cluster
    ray_cluster.wait_clean()
    assert not list_placement_groups(address=ray_cluster.dashboard_url, filters=[("state", "!=", "REMOVED")])


def node_of(cluster, pid: int) -> str:
    """Which of the fixture's nodes runs this process (its raylet descends from that node's `ray start`)."""
    ancestors = {p.pid for p in psutil.Process(pid).parents()}
    return next(name for name, node in cluster.nodes.items() if node.process.pid in ancestors)


@pytest.mark.slow
def test_two_workers_train_on_two_raylets(cluster, tmp_path):
    script = write(tmp_path, "train.py", TRAIN)
    proc = Proc([*LAUNCH, "--nodes", "2", "--", str(script)], launch_env(tmp_path, RAY_ADDRESS=cluster.address),
                cwd=tmp_path)
    assert proc.finish(timeout=300) == 0, proc.err[-3000:]
    lines = re.findall(r"^\[rank=(\d)\] rank (\d) of 2 agree True raylet (\d+)$", proc.text, re.M)
    assert sorted((prefix, rank) for prefix, rank, _ in lines) == [("0", "0"), ("1", "1")], proc.text[-3000:]
    assert sorted(node_of(cluster, int(raylet)) for _, _, raylet in lines) == ["head", "node2"]


@pytest.mark.slow
def test_workers_fill_each_nodes_bundle_with_fractional_cpus(cluster, tmp_path):
    """3 workers of half a CPU on each 2-CPU node: they fit only as fractions; ranks fill a node first."""
    script = write(tmp_path, "where.py", """
    import os
    print("slot", *(os.environ[f"HOROVOD_{name}"] for name in ("RANK", "LOCAL_RANK", "CROSS_RANK", "SIZE")),
          os.environ["RAY_RAYLET_PID"], flush=True)
    """)
    proc = Proc([*LAUNCH, "--nodes", "2", "--workers-per-node", "3", "--cpus-per-worker", "0.5",
                 "--placement-timeout", "20", "--", str(script)], launch_env(tmp_path, RAY_ADDRESS=cluster.address))
    assert proc.finish(timeout=180) == 0, proc.err[-3000:]
    slots = sorted(re.findall(r"^\[rank=\d\] slot (\d) (\d) (\d) 6 (\d+)$", proc.text, re.M))
    assert [(rank, local, cross) for rank, local, cross, _ in slots] == [
        ("0", "0", "0"), ("1", "1", "0"), ("2", "2", "0"), ("3", "0", "1"), ("4", "1", "1"), ("5", "2", "1")]
    nodes = [node_of(cluster, int(raylet)) for *_, raylet in slots]
    assert len(set(nodes[:3])) == len(set(nodes[3:])) == 1 and nodes[0] != nodes[3]


@pytest.mark.slow
def test_a_failing_rank_stops_the_other_and_the_launch_fails(cluster, tmp_path):
    script = write(tmp_path, "fail.py", """
    import signal, sys, torch, horovod.torch as hvd
    try:
        hvd.init()
        hvd.allreduce(torch.tensor([0.0]))  # both are up and listening for SIGINT
        if hvd.rank() == 0:
            sys.exit(5)
        signal.pause()
    except KeyboardInterrupt:
        print(f"rank {hvd.rank()} interrupted", flush=True)
        sys.exit(130)
    """)
    proc = Proc([*LAUNCH, "--nodes", "2", "--", str(script)],
                launch_env(tmp_path, RAY_ADDRESS=cluster.address, TRIALKIT_GRACE_SECONDS="20"))
    assert proc.finish(timeout=120) == 5, proc.err[-3000:]
    assert "[rank=1] rank 1 interrupted\n" in proc.text
    assert proc.err_lines[-1] == (f"trialkit.ray.horovod: rank 0 failed with exit code 5 running {script}; "
                                  f"stopped the other workers")


@pytest.mark.slow
def test_a_wedged_worker_is_killed_after_the_grace(cluster, tmp_path):
    """Rank 1's wrap_rank is stopped (SIGSTOP) so it cannot pass SIGINT on: the grace ends in SIGKILL."""
    script = write(tmp_path, "wedged.py", """
    import os, pathlib, signal, sys, time
    if os.environ["HOROVOD_RANK"] == "1":
        print(f"wrap_rank {os.getppid()}", flush=True)
        while True:
            signal.pause()
    while not pathlib.Path("wedged").exists():
        time.sleep(0.05)
    sys.exit(5)
    """)
    proc = Proc([*LAUNCH, "--nodes", "2", "--", str(script)],
                launch_env(tmp_path, RAY_ADDRESS=cluster.address, TRIALKIT_GRACE_SECONDS="2"), cwd=tmp_path)
    wrap_rank = psutil.Process(int(proc.wait_for(r"wrap_rank (\d+)").group(1)))
    wrap_rank.suspend()
    (tmp_path / "wedged").touch()
    assert proc.finish(timeout=120) == 5, proc.err[-3000:]
    assert proc.err_lines[-1].startswith("trialkit.ray.horovod: rank 0 failed with exit code 5")
    psutil.wait_procs([wrap_rank], timeout=10)
    assert not wrap_rank.is_running()


@pytest.mark.slow
def test_long_lines_of_two_ranks_never_mix(cluster, tmp_path):
    """Lines longer than a pipe read come through whole, however the two ranks' output interleaves."""
    script = write(tmp_path, "chatty.py", """
    import os, sys
    rank = os.environ["HOROVOD_RANK"]
    for _ in range(20):
        sys.stdout.write(rank * 300_000 + "\\n")
    """)
    proc = Proc([*LAUNCH, "--nodes", "2", "--", str(script)], launch_env(tmp_path, RAY_ADDRESS=cluster.address))
    assert proc.finish(timeout=120) == 0, proc.err[-3000:]
    lines = proc.text.splitlines()
    assert sorted(set(lines)) == [f"[rank={r}] " + str(r) * 300_000 for r in (0, 1)]
    assert len(lines) == 40


# Both ranks join, say so, and wait; SIGTERM runs a handler that says so and exits 143 (a checkpoint).
WAIT_FOR_STOP = """
import os, signal, sys, torch, horovod.torch as hvd
def on_term(signum, frame):
    print(f"rank {hvd.rank()} stopping on {signal.Signals(signum).name}", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
hvd.init()
hvd.allreduce(torch.tensor([0.0]))
print(f"ready {hvd.rank()} pid {os.getpid()}", flush=True)
while True:
    signal.pause()
"""


@pytest.mark.slow
def test_sigterm_to_the_launcher_reaches_every_worker_once(cluster, tmp_path):
    script = write(tmp_path, "wait.py", WAIT_FOR_STOP)
    proc = Proc([*LAUNCH, "--nodes", "2", "--", str(script)], launch_env(tmp_path, RAY_ADDRESS=cluster.address))
    for rank in (0, 1):
        proc.wait_for(f"ready {rank} ", timeout=180)
    proc.signal(signal.SIGTERM)
    assert proc.finish(timeout=120) == 143, proc.err[-3000:]
    for rank in (0, 1):
        assert proc.text.count(f"[rank={rank}] rank {rank} stopping on SIGTERM\n") == 1
    assert proc.err_lines[-1] == "trialkit.ray.horovod: stopped by SIGTERM; rank 0 ended with exit code 143"


@pytest.mark.slow
def test_a_launcher_killed_outright_leaves_no_worker(cluster, tmp_path):
    script = write(tmp_path, "wait.py", WAIT_FOR_STOP)
    proc = Proc([*LAUNCH, "--nodes", "2", "--", str(script)], launch_env(tmp_path, RAY_ADDRESS=cluster.address))
    pids = [int(proc.wait_for(f"ready {rank} pid (\\d+)", timeout=180).group(1)) for rank in (0, 1)]
    proc.signal(signal.SIGKILL)
    assert proc.finish(timeout=60) == -signal.SIGKILL
    # Ray ends the actors of a driver that died; each wrap_rank then stops its script (SIGTERM).
    gone, alive = psutil.wait_procs([psutil.Process(pid) for pid in pids], timeout=60)
    assert not alive


@pytest.mark.slow
def test_more_nodes_than_the_cluster_has_is_one_line(cluster, tmp_path):
    proc = Proc([*LAUNCH, "--nodes", "3", "--placement-timeout", "2", "--", "train.py"],
                launch_env(tmp_path, RAY_ADDRESS=cluster.address))
    assert proc.finish(timeout=120) == 1
    assert proc.err_lines[-1] == ("trialkit.ray.horovod: --nodes: the cluster has no room for 3 x "
                                  "{'CPU': 1.0} on distinct nodes after 2 s (use fewer nodes or smaller workers, or add nodes)")


# -- a Ray platform trial -----------------------------------------------------------------------------

TRIAL = TRAIN + """
import trialkit
print(f"rank {hvd.rank()} cwd {os.getcwd()}", flush=True)
if hvd.rank() == 0:
    trialkit.report_final_result(float(weights.sum()))
"""


@pytest.mark.slow
def test_a_ray_trial_trains_across_nodes_with_its_code_shipped(cluster, tmp_path):
    """The trial's keeper runs the launcher in the trial's actor; --working-dir . ships the trial's
    code (itself shipped there by the platform) on to each worker's node."""
    import ray

    from harness import Manager, wait_until
    from trialkit import env, records
    from trialkit.platforms import load
    from trialkit.platforms.base import TrialSpec
    from trialkit.statuses import FINAL_STATUSES, SUCCEEDED

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRIAL)
    manager = Manager(tmp_path / "manager").start()
    manager.register("hvd", "token-hvd")
    contract = {env.EXPERIMENT_ID: "exp", env.TRIAL_ID: "hvd", env.SEQUENCE: "0", env.MANAGER_URL: manager.url,
                env.TOKEN: "token-hvd", env.CODE_DIR: str(code), "RAY_ADDRESS": cluster.address,
                "OMP_NUM_THREADS": "1"}
    ray_platform = load("ray")
    platform = ray_platform.Platform(ray_platform.parse_section({"platform": "ray", "address": cluster.address},
                                                                "trainingService"), tmp_path / "exp")
    command = "python3 -m trialkit.ray.horovod --nodes 2 --working-dir . -- train.py"
    try:
        handle = platform.submit(TrialSpec("exp", "hvd", 0, command, env=contract, code_dir=str(code)))
        wait_until(lambda: platform.status(handle).status in FINAL_STATUSES, 300, "the trial to end", every=0.5)
        log = (tmp_path / "exp" / "trials" / "hvd" / "stdout.log").read_text()
        assert platform.status(handle).status == SUCCEEDED, log[-3000:]
        stored = manager.store.records_for("hvd")
        assert len([r for r in stored if r["type"] == records.FINAL]) == 1
    finally:
        manager.close()
        ray.shutdown()
    assert re.findall(r"^\[rank=(\d)\] rank \d of 2 agree True", log, re.M) in (["0", "1"], ["1", "0"])
    cwds = dict(re.findall(r"^\[rank=(\d)\] rank \d cwd (\S+)$", log, re.M))
    # Each worker runs in the copy Ray unpacked on its own node: two raylets, two session dirs.
    assert len(cwds) == 2 and cwds["0"] != cwds["1"] and all("_ray_pkg_" in cwd for cwd in cwds.values()), cwds

