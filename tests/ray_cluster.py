"""A real Ray cluster on this machine for the tests: a head and a second node.

Each node is `ray start --block`, in the foreground and in its own session,
so a node is one process tree the fixture owns. Its processes carry the
node's own TRIALKIT_TEST_TAG value (they outlive single tests), and nodes are
stopped by pid, never with `ray stop`, which stops every cluster on the
machine. Stopping a node gracefully is SIGTERM to its `ray start`: Ray drains
the node (whoever runs there is told), then shuts it down. A crash is SIGKILL
to all of the node's processes at once.

The nodes' instance-metadata service is a stub in the test process, one URL
prefix per node (TRIALKIT_IMDS_URL), so a test can post a spot notice for one
node: IMDSv2 (token PUT, then GET with the token) as EC2 serves it.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List

import psutil
import pytest

from conftest import PYTHON, TAG, tagged_processes
from trialkit.process import spawn

RAY = str(Path(PYTHON).with_name("ray"))
NODE_START_TIMEOUT = 60.0
HEAD_CPUS = 2
NODE2_CPUS = 2  # a worker of 2 CPUs fits once on each node: 2 workers, 1 when node2 goes
TRAINING_PROCESS_MARKERS = ("trialkit.keeper", "scripts/run.sh")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ImdsStub:
    """EC2's instance metadata service, spot notices only, for several nodes at once."""

    TOKEN = "stub-token"

    def __init__(self) -> None:
        self.notices: Dict[str, dict] = {}
        self.requests: List[tuple] = []  # (method, path, had a valid token)
        self.v2 = True  # False: the token PUT fails, as behind a hop limit of 1
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                stub.requests.append(("PUT", self.path, False))
                if stub.v2 and self.path.endswith("/latest/api/token"):
                    self._answer(200, stub.TOKEN)
                else:
                    self._answer(403, "")

            def do_GET(self) -> None:
                valid = self.headers.get("X-aws-ec2-metadata-token") == stub.TOKEN
                stub.requests.append(("GET", self.path, valid))
                node, _, rest = self.path.lstrip("/").partition("/")
                if stub.v2 and not valid:
                    self._answer(401, "")
                elif rest == "latest/meta-data/spot/instance-action" and node in stub.notices:
                    self._answer(200, json.dumps(stub.notices[node]))
                else:
                    self._answer(404, "")

            def _answer(self, code: int, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/{node}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class RayNode:
    name: str
    tag: str
    process: subprocess.Popen
    temp_dir: Path
    log: Path


@dataclass
class RayCluster:
    root: Path
    imds: ImdsStub
    port: int = field(default_factory=free_port)
    client_port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    nodes: Dict[str, RayNode] = field(default_factory=dict)
    starts: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def client_address(self) -> str:
        return f"ray://127.0.0.1:{self.client_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def tags(self) -> List[str]:
        return [node.tag for node in self.nodes.values()]

    def start_head(self) -> RayNode:
        return self._start("head", HEAD_CPUS, [
            "--head", "--port", str(self.port), "--ray-client-server-port", str(self.client_port),
            "--include-dashboard", "true", "--dashboard-port", str(self.dashboard_port),
        ])

    def start_node(self, name: str = "node2", cpus: int = NODE2_CPUS, gpus: int = 0) -> RayNode:
        """A node joining the head; `gpus`: GPUs Ray counts and hands out by index, none of them real."""
        return self._start(name, cpus, ["--address", self.address] + (["--num-gpus", str(gpus)] if gpus else []))

    def _start(self, name: str, cpus: int, args: List[str]) -> RayNode:
        assert name not in self.nodes, f"{name} is running"
        self.starts += 1
        # Each start its own dir: a new node must not replay an old one's logs.
        temp_dir = self.root / f"{name}-{self.starts}"
        tag = f"ray-{name}-{uuid.uuid4().hex[:8]}"
        environ = dict(os.environ, **{TAG: tag, "TRIALKIT_IMDS_URL": self.imds.url(name),
                                      # Ray's OOM killer weighs the whole machine, which other
                                      # test runs share: it must not kill our workers for theirs.
                                      "RAY_memory_monitor_refresh_ms": "0",
                                      # Else Ray Client's proxy forks while gRPC threads run and the
                                      # child often crashes: a client's first session then fails.
                                      "GRPC_ENABLE_FORK_SUPPORT": "0"})
        log = self.root / f"{name}-{self.starts}.log"
        with log.open("wb") as out:
            # Its own session; and should this process die without stopping it,
            # the node gets SIGTERM and stops itself rather than outlive us.
            process = spawn(
                [RAY, "start", "--block", "--num-cpus", str(cpus), "--node-ip-address", "127.0.0.1",
                 "--temp-dir", str(temp_dir), "--disable-usage-stats", "--object-store-memory", str(80 << 20),
                 "--dashboard-agent-listen-port", "0", *args],
                env=environ, stdout=out, stderr=subprocess.STDOUT, parent_death_signal=signal.SIGTERM).popen
        node = self.nodes[name] = RayNode(name, tag, process, temp_dir, log)
        deadline = time.monotonic() + NODE_START_TIMEOUT
        while b"block forever" not in log.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                self.crash_node(name)
                raise RuntimeError(f"ray start for {name} failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        return node

    def node_id(self, name: str) -> str:
        """The Ray node id of a node this fixture started (its sockets live in its temp dir)."""
        import ray

        temp_dir = str(self.nodes[name].temp_dir)
        return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["RayletSocketName"].startswith(temp_dir))

    def stop_node(self, name: str, timeout: float = 60.0) -> None:
        """Gracefully: SIGTERM to its `ray start`, which drains the node, then stops it."""
        node = self.nodes.pop(name)
        processes = _processes(node)
        node.process.send_signal(signal.SIGTERM)
        try:
            node.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        _kill(processes + _processes(node), grace=10.0)
        node.process.wait()

    def crash_node(self, name: str) -> None:
        """All of the node's processes SIGKILLed at once, as when its machine dies."""
        node = self.nodes.pop(name)
        _kill(_processes(node), grace=0.0)
        node.process.wait()

    def training_processes(self) -> List[str]:
        """Keepers and trial commands still running on any node."""
        found = []
        for tag in self.tags:
            for proc in tagged_processes(tag):
                try:
                    line = " ".join(proc.cmdline())
                except psutil.Error:
                    continue
                if any(marker in line for marker in TRAINING_PROCESS_MARKERS) or "train.py" in line:
                    found.append(f"{proc.pid} {line[:160]}")
        return found

    def live_actors(self) -> List[str]:
        """Actors not dead and tasks running, as Ray's state API lists them."""
        from ray.util.state import list_actors, list_tasks

        actors = list_actors(address=self.dashboard_url, filters=[("state", "!=", "DEAD")])
        tasks = list_tasks(address=self.dashboard_url, filters=[("state", "=", "RUNNING")])
        return [f"actor {a.class_name} {a.state}" for a in actors] + [f"task {t.name} RUNNING" for t in tasks]

    def wait_clean(self, timeout: float = 30.0) -> None:
        """Wait until no actor is alive and no keeper runs on the cluster, or fail."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.live_actors() + self.training_processes()
            if not left:
                return
            if time.monotonic() > deadline:
                pytest.fail("left on the Ray cluster: " + "; ".join(left))
            time.sleep(0.5)

    def shutdown(self) -> None:
        for name in [n for n in self.nodes if n != "head"] + [n for n in self.nodes if n == "head"]:
            self.stop_node(name, timeout=30.0)


def _processes(node: RayNode) -> List[psutil.Process]:
    """The node's processes: its `ray start` and what descends from it, and what carries
    its tag (orphans; Ray's own processes rewrite their title over their environment)."""
    found = {proc.pid: proc for proc in tagged_processes(node.tag)}
    try:
        root = psutil.Process(node.process.pid)
        found.update({proc.pid: proc for proc in [root] + root.children(recursive=True)})
    except psutil.NoSuchProcess:
        pass
    return list(found.values())


def _kill(processes: List[psutil.Process], grace: float) -> None:
    """Wait up to `grace` for them to end, then SIGKILL what is left, by pid."""
    _, alive = psutil.wait_procs(processes, timeout=grace) if grace else ([], processes)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


@pytest.fixture(scope="session")
def ray_cluster():
    """A head (2 CPUs) and node2 (2 CPUs); tests that stop node2 start it again."""
    imds = ImdsStub()
    # Short: Ray's socket paths live under it and must fit a Unix socket name.
    root = Path(tempfile.mkdtemp(prefix="tkray-", dir="/tmp"))
    cluster = RayCluster(root, imds)
    try:
        cluster.start_head()
        cluster.start_node("node2")
        yield cluster
    finally:
        cluster.shutdown()
        imds.close()
        shutil.rmtree(root, ignore_errors=True)
