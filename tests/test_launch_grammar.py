"""The launchers' shared grammar, their exact command lines, and the topology they read."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launch_support import ROOT, launch_env
from trialkit import env
from trialkit.errors import UserError
from trialkit.launch import deepspeed, discover, grammar, horovod, launcher, torch_distributed
from trialkit.launch.grammar import Launch

PY = "/py"
LAUNCHERS = ["torch_distributed", "deepspeed", "horovod"]


@pytest.mark.parametrize("argv, expected", [
    (["train.py"], Launch((), None, ("train.py",))),
    (["train.py", "--lr", "0.1"], Launch((), None, ("train.py", "--lr", "0.1"))),
    # The script keeps its own "--": these are not overrides.
    (["train.py", "--", "--lr", "0.1"], Launch((), None, ("train.py", "--", "--lr", "0.1"))),
    (["--", "train.py", "--", "x"], Launch((), None, ("train.py", "--", "x"))),
    (["--nproc_per_node", "4", "--", "train.py", "--", "--lr", "1"],
     Launch(("--nproc_per_node", "4"), None, ("train.py", "--", "--lr", "1"))),
    (["--trial", "model_def:MyTrial"], Launch((), "model_def:MyTrial", ())),
    (["--trial=model_def:MyTrial"], Launch((), "model_def:MyTrial", ())),
    (["--fusion-threshold-mb", "1", "--cycle-time-ms", "2", "--", "--trial", "m:T"],
     Launch(("--fusion-threshold-mb", "1", "--cycle-time-ms", "2"), "m:T", ())),
    (["python3", "-m", "pkg.train", "--", "-x"], Launch((), None, ("python3", "-m", "pkg.train", "--", "-x"))),
])
def test_parse(argv, expected):
    assert grammar.parse(argv, "torchrun") == expected


@pytest.mark.parametrize("argv, says", [
    ([], "nothing to run"),
    (["--nproc_per_node", "2", "train.py"], "unknown launcher option '--nproc_per_node'"),
    (["--nproc_per_node", "2", "--"], "no script after --"),
    (["--"], "no script after --"),
    (["--trial"], "--trial needs a value"),
    (["--trial", "m:T", "extra"], "--trial takes nothing after it"),
    (["--trial=m:T", "--", "x"], "--trial takes nothing after it"),
    (["--", "--trail", "m:T"], "unknown launcher option '--trail'"),
])
def test_parse_errors(argv, says):
    with pytest.raises(UserError) as caught:
        grammar.parse(argv, "torchrun")
    assert says in caught.value.line()


@pytest.mark.parametrize("name", LAUNCHERS)
@pytest.mark.parametrize("argv, says", [
    ([], "nothing to run"),
    (["--bogus", "train.py"], "unknown launcher option '--bogus'"),
    (["--x", "--"], "no script after --"),
    (["--trial", "m:T", "more"], "--trial takes nothing after it"),
    (["--trial", "no_such_file.py:T"], "no file no_such_file.py"),
    (["--trial", "not a spec"], "does not name a class"),
])
def test_mistakes_are_one_line_and_exit_2(tmp_path, name, argv, says):
    done = subprocess.run([sys.executable, "-m", f"trialkit.launch.{name}", *argv], env=launch_env(tmp_path),
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"trialkit.launch.{name}: error: ") and says in done.stderr


def test_a_topology_mistake_is_one_line(tmp_path):
    environ = launch_env(tmp_path, TRIALKIT_NUM_NODES="2", TRIALKIT_NODE_RANK="2", TRIALKIT_CHIEF_ADDR="10.0.0.1")
    done = subprocess.run([sys.executable, "-m", "trialkit.launch.torch_distributed", "train.py"],
                          env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "node rank 2 is outside 0..1" in done.stderr


def test_help_exits_0(tmp_path):
    done = subprocess.run([sys.executable, "-m", "trialkit.launch.horovod", "--help"], env=launch_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "HOROVODRUN_OVERRIDES" in done.stdout


# -- the commands, exactly ----------------------------------------------------

ONE_NODE = env.Topology(num_nodes=1, node_rank=0, slots_per_node=2, chief_addr="127.0.0.1", chief_port=29400,
                        hosts=(), source="single node")
TWO_NODES = env.Topology(num_nodes=2, node_rank=1, slots_per_node=4, chief_addr="job-master-0", chief_port=23456,
                         hosts=("job-master-0", "job-worker-0"), source="PyTorchJob")
WRAPPED = ["-m", "trialkit.launch.wrap_rank", "RANK", "--", PY, "train.py", "--", "--lr", "0.1"]


def test_worker_commands():
    assert launcher.wrapped("RANK", grammar.parse(["train.py", "--", "--lr", "0.1"], "x"), PY) == WRAPPED
    assert grammar.worker_command(Launch((), "m:T", ()), PY) == [PY, "-m", "trialkit.launch.run_trial", "m:T"]
    assert grammar.worker_command(Launch((), None, ("nsys", "profile", "python3", "t.py")), PY) == \
        ["nsys", "profile", "python3", "t.py"]


def test_torch_distributed_command():
    assert torch_distributed.build_command(ONE_NODE, ["--monitor-interval", "0.05"], WRAPPED, PY) == [
        PY, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2", "--node_rank", "0",
        "--master_addr", "127.0.0.1", "--master_port", "29400", "--max_restarts", "0",
        "--monitor-interval", "0.05", *WRAPPED]
    assert torch_distributed.build_command(TWO_NODES, [], WRAPPED, PY)[3:13] == [
        "--nnodes", "2", "--nproc_per_node", "4", "--node_rank", "1", "--master_addr", "job-master-0",
        "--master_port", "23456"]


def test_deepspeed_command():
    assert deepspeed.build_command(ONE_NODE, ["--bind_cores_to_rank"], WRAPPED, None, PY) == [
        PY, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_addr", "127.0.0.1",
        "--master_port", "29400", "--no_python", "--no_local_rank", "--bind_cores_to_rank", PY, *WRAPPED]
    assert deepspeed.build_command(TWO_NODES, [], WRAPPED, "/tmp/h", PY) == [
        PY, "-m", "deepspeed.launcher.runner", "--hostfile", "/tmp/h", "--no_ssh", "--node_rank", "1",
        "--num_gpus", "4", "--master_addr", "job-master-0", "--master_port", "23456",
        "--no_python", "--no_local_rank", PY, *WRAPPED]
    assert deepspeed.hostfile_text(TWO_NODES) == "job-master-0 slots=4\njob-worker-0 slots=4\n"
    unnamed = env.Topology(2, 0, 1, "10.0.0.1", 29500, (), "trialkit")
    assert deepspeed.hostfile_text(unnamed) == "node-0 slots=1\nnode-1 slots=1\n"


def test_horovod_command():
    assert horovod.build_command(ONE_NODE, ["--fusion-threshold-mb", "1"], WRAPPED, False, PY) == [
        PY, "-m", "horovod.runner.launch", "-np", "2", "-H", "localhost:2", "--gloo",
        "--fusion-threshold-mb", "1", PY, *WRAPPED]
    chief = env.Topology(2, 0, 4, "job-master-0", 23456, ("job-master-0", "job-worker-0"), "PyTorchJob")
    assert horovod.build_command(chief, [], WRAPPED, True, PY)[3:9] == [
        "-np", "8", "-H", "job-master-0:4,job-worker-0:4", "--mpi", PY]
    with pytest.raises(UserError, match="node 0 only"):
        horovod.check_topology(TWO_NODES)


# -- topology from each platform's variables -----------------------------------

TF_CONFIG = ('{"cluster": {"ps": ["j-ps-0.ns.svc:2222"], "worker": ["j-worker-0.ns.svc:2222", "j-worker-1.ns.svc:2222"]},'
             ' "task": {"type": "%s", "index": %d}, "environment": "cloud"}')


@pytest.mark.parametrize("environ, expected", [
    ({}, (1, 0, 1, "127.0.0.1", None, ())),
    ({"TRIALKIT_SLOTS_PER_NODE": "2"}, (1, 0, 2, "127.0.0.1", None, ())),
    ({"TRIALKIT_NUM_NODES": "2", "TRIALKIT_NODE_RANK": "1", "TRIALKIT_CHIEF_ADDR": "10.0.0.1",
      "TRIALKIT_CHIEF_PORT": "1234", "TRIALKIT_SLOTS_PER_NODE": "3", "TRIALKIT_HOSTS": "a, b"},
     (2, 1, 3, "10.0.0.1", 1234, ("a", "b"))),
    ({"PET_NNODES": "3", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "4", "MASTER_ADDR": "j-master-0",
      "MASTER_PORT": "23456", "WORLD_SIZE": "12", "RANK": "2"},
     (3, 2, 4, "j-master-0", 23456, ("j-master-0", "j-worker-0", "j-worker-1"))),
    ({"PET_NNODES": "1:2", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "auto", "MASTER_ADDR": "m",
      "MASTER_PORT": "23456", "TRIALKIT_SLOTS_PER_NODE": "2"}, (2, 0, 2, "m", 23456, ())),
    # Trainer v2's TrainJob: PET_MASTER_ADDR/PORT and no MASTER_ADDR; its pods' hosts are JobSet's names.
    ({"PET_NNODES": "3", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "auto", "PET_MASTER_ADDR": "tj-node-0-0.tj",
      "PET_MASTER_PORT": "29500"},
     (3, 2, 1, "tj-node-0-0.tj", 29500, ("tj-node-0-0.tj", "tj-node-0-1.tj", "tj-node-0-2.tj"))),
    # Before PET_*: one process per pod, WORLD_SIZE pods.
    ({"MASTER_ADDR": "m", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}, (2, 1, 1, "m", 23456, ())),
    # Inside a torchrun worker (LOCAL_RANK) RANK is not a node rank.
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"},
     (1, 0, 1, "127.0.0.1", None, ())),
    ({"FC_FRAMEWORK_NAME": "t1", "FC_TASKROLE_NAME": "worker", "FC_TASK_INDEX": "1", "TRIALKIT_NUM_NODES": "2"},
     (2, 1, 1, "worker-0.t1-worker", 29500, ("worker-0.t1-worker", "worker-1.t1-worker"))),
    ({"ADAPTDL_NUM_REPLICAS": "2", "ADAPTDL_REPLICA_RANK": "1", "ADAPTDL_MASTER_ADDR": "10.1.1.1",
      "ADAPTDL_MASTER_PORT": "47001", "ADAPTDL_NUM_NODES": "1"}, (2, 1, 1, "10.1.1.1", 47001, ())),
    # A TFJob's pods: TF_CONFIG's tasks are the nodes, the workers first here (no chief), the ps last.
    ({"TF_CONFIG": TF_CONFIG % ("ps", 0)},
     (3, 2, 1, "j-worker-0.ns.svc", 2222, ("j-worker-0.ns.svc", "j-worker-1.ns.svc", "j-ps-0.ns.svc"))),
    ({"TF_CONFIG": '{"cluster": {"worker": ["w0:2222"], "chief": ["c0:2000"]}, "task": {"type": "worker"}}'},
     (2, 1, 1, "c0", 2000, ("c0", "w0"))),
    # trialkit's names win over a platform's.
    ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "1",
      "TRIALKIT_NUM_NODES": "1", "TRIALKIT_NODE_RANK": "0", "TRIALKIT_CHIEF_ADDR": "127.0.0.1",
      "TRIALKIT_CHIEF_PORT": "2"}, (1, 0, 1, "127.0.0.1", 2, ())),
])
def test_topology(environ, expected):
    topo = env.topology(environ)
    assert (topo.num_nodes, topo.node_rank, topo.slots_per_node, topo.chief_addr, topo.chief_port,
            topo.hosts) == expected


def test_topology_round_trips_through_the_workers_environment():
    topo = env.topology({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2",
                         "MASTER_ADDR": "j-master-0", "MASTER_PORT": "23456"})
    # A nested launcher sees trialkit's names, and torchrun's own RANK/LOCAL_RANK besides.
    nested = {**topo.environ(), "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "x"}
    assert env.topology(nested) == env.Topology(2, 1, 2, "j-master-0", 23456, topo.hosts, "trialkit")


@pytest.mark.parametrize("environ, says", [
    ({"TRIALKIT_NUM_NODES": "two"}, "TRIALKIT_NUM_NODES='two' is not a whole number"),
    ({"TRIALKIT_NUM_NODES": "2"}, "no chief address"),
    ({"FC_TASKROLE_NAME": "w", "FC_TASK_INDEX": "1"}, "node rank 1 is outside 0..0"),
    ({"TRIALKIT_NUM_NODES": "0"}, "no worker at all"),
    ({"TF_CONFIG": TF_CONFIG % ("evaluator", 0)}, "TF_CONFIG names no task of its cluster's chief, workers or ps"),
    ({"TF_CONFIG": "{not json"}, "TF_CONFIG names no task"),
])
def test_topology_errors(environ, says):
    with pytest.raises(UserError) as caught:
        env.topology(environ)
    assert says in caught.value.line()


def test_launchers_start_without_heavy_imports():
    code = ("import sys, trialkit.launch.torch_distributed, trialkit.launch.deepspeed, trialkit.launch.horovod, "
            "trialkit.launch.wrap_rank; heavy = {'torch', 'deepspeed', 'horovod', 'requests'} & set(sys.modules); "
            "print(sorted(heavy))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


@pytest.mark.parametrize("name, module", [("torch_distributed", "torch"), ("deepspeed", "deepspeed"),
                                          ("horovod", "horovod")])
def test_a_launcher_without_its_engine_says_how_to_install_it_in_one_line(tmp_path, name, module):
    # Before: exit 1, the engine's "No module named 'deepspeed'" and its log left in /tmp (newcomer19).
    code = f"import sys; sys.modules[{module!r}] = None; from trialkit.launch import {name} as l; sys.exit(l.main())"
    done = subprocess.run([sys.executable, "-c", code, "train.py"], capture_output=True, text=True, timeout=60,
                          env=launch_env(tmp_path, TMPDIR=str(tmp_path)))
    how = dict(torch="pip install torch==2.13.0", deepspeed="pip install deepspeed==0.19.8 -c constraints.txt",
               horovod="./bootstrap.sh test (tools/build_horovod.sh builds horovod 0.28.1 for this torch)")[module]
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"trialkit.launch.{name}: error: {module} is not installed here (install it with {how})\n")
    assert not list(tmp_path.glob("trialkit-*.log"))
    pins = (ROOT / "constraints.txt").read_text().split()
    assert module == "horovod" or how.split()[2] in pins  # the version the suite runs with
    if module == "horovod":
        assert "hvd=0.28.1\n" in (ROOT / "tools" / "build_horovod.sh").read_text()


# -- AdaptDL: node 0's address from its supervisor -------------------------------------

class Supervisor:
    """AdaptDL's supervisor's /discover: 408 for the first `late` asks (not every replica has an address yet)."""

    def __init__(self, answer, late: int = 0):
        import http.server
        import threading

        self.asked = []
        supervisor = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                supervisor.asked.append(self.path)
                body = json.dumps(answer).encode() if len(supervisor.asked) > late else b""
                self.send_response(200 if body else 408)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


ADAPTDL_POD = {"ADAPTDL_NUM_REPLICAS": "2", "ADAPTDL_REPLICA_RANK": "1", "ADAPTDL_MASTER_PORT": "47003",
               "ADAPTDL_NUM_RESTARTS": "3", "ADAPTDL_JOB_ID": "team/job"}


@pytest.mark.parametrize("answer", [["10.0.0.5", "10.0.0.6"], {"pod_ip_list": ["10.0.0.5", "10.0.0.6"], "version": "0.2.11"}])
def test_adaptdl_replicas_find_replica_zero_through_the_supervisor(answer):
    supervisor = Supervisor(answer, late=1)
    with supervisor as url:
        environ = discover.with_chief({**ADAPTDL_POD, "ADAPTDL_SUPERVISOR_URL": url})
    assert supervisor.asked == ["/discover/team/job/3"] * 2  # asked again after its 408
    assert env.topology(environ)[:5] == (2, 1, 1, "10.0.0.5", 47003)


def test_adaptdl_asks_only_where_nobody_named_replica_zero():
    with Supervisor(["10.0.0.5"]) as url:
        for environ in ({**ADAPTDL_POD, "ADAPTDL_SUPERVISOR_URL": url, "ADAPTDL_MASTER_ADDR": "10.1.1.1"},
                        {**ADAPTDL_POD, "ADAPTDL_SUPERVISOR_URL": url, "TRIALKIT_CHIEF_ADDR": "10.1.1.1"},
                        {**ADAPTDL_POD, "ADAPTDL_SUPERVISOR_URL": url, "ADAPTDL_NUM_REPLICAS": "1"},
                        ADAPTDL_POD):
            assert discover.with_chief(environ) is environ


def test_an_adaptdl_supervisor_that_does_not_answer_is_one_line(monkeypatch):
    monkeypatch.setattr(discover, "ATTEMPTS", 2)
    with Supervisor([]) as url:
        pass  # gone: its port refuses
    with pytest.raises(UserError) as caught:
        discover.with_chief({**ADAPTDL_POD, "ADAPTDL_SUPERVISOR_URL": url})
    assert caught.value.line().startswith(f"ADAPTDL_SUPERVISOR_URL: cannot ask AdaptDL's supervisor at {url}/discover")
    with Supervisor([]) as url, pytest.raises(UserError, match="named no address"):
        discover.with_chief({**ADAPTDL_POD, "ADAPTDL_SUPERVISOR_URL": url})
