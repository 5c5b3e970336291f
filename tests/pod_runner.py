"""A kubelet (and the operators) for the stand-in API server: what the control plane creates runs as podman containers.

    from pod_runner import PodRunner
    with FakeApiServer() as api, PodRunner(api, containers, image, tmp_path, mounts={"/code": code}) as runner:
        ... submit trials through the platform (or `trialkit run`) against api ...
        runner.wait_for(lambda pods: ..., timeout, "what")   # pods: {name: Pod}, the runner's view
        runner.delete_pod(name)      # `kubectl delete pod`: the preStop hook, SIGTERM, the grace, SIGKILL
        runner.kill(name)            # SIGKILL the pod's container (as the OOM killer would)
        runner.logs(name_or_pod)     # the container's output (its latest attempt's)
        runner.history               # every pod made, in order (a job made again reuses the names)
        runner.describe()            # every pod's phase, exit code and last lines: for a failure's message

Every 0.1 s the runner looks at the API server's objects and plays:
- the operators: for each PyTorchJob/TFJob (training-operator), Framework
  (FrameworkController), AdaptDLJob and TrainJob (Kubeflow Trainer v2, played
  by trainer_play.py) it makes the pods their operator makes (names, labels,
  annotations, the variables it sets: a PyTorchJob's MASTER_ADDR (the
  master's Service name), MASTER_PORT (the pytorchjob-port), RANK,
  WORLD_SIZE, PET_NNODES, PET_NODE_RANK; a TFJob's TF_CONFIG; FC_* and the
  FrameworkController placeholders ({{FC_TASK_INDEX}}, ...) filled in the
  pod template; ADAPTDL_* with no master address: the replicas ask the
  runner's AdaptDL supervisor (ADAPTDL_SUPERVISOR_URL, /discover) for rank
  0's; a TrainJob's JobSet pods <job>-node-0-<i> with the torch plugin's
  PET_*, PET_MASTER_ADDR <job>-node-0-0.<job>), and writes the job's status
  as that operator does (conditions; state and completion status; phase),
  an ended job's as it ended.
  An AdaptDLJob pod that exits 143 (checkpointed) is restarted in a new
  group with ADAPTDL_NUM_RESTARTS one higher, as AdaptDL's controller does
  on a rescale. A finished job (PyTorchJob/TFJob: cleanPodPolicy Running; a
  completed Framework; an AdaptDLJob; a failed TrainJob) stops its pods
  that still run. A deleted job's pods are deleted (the garbage collector).
  A suspended job (a TrainJob's spec.suspend, a PyTorchJob's
  runPolicy.suspend: Kueue's hold) has no pods: suspending a running one
  deletes them with their grace (an eviction; listed Terminating until
  their containers stop), resuming it makes them again (a new group).
- Kueue, when given one (kueue_play.KueuePlay): its turn comes first in each look.
- the network: the runner makes a podman network of its own (a bridge, no
  DNS server) and gives each pod an address on it (`status.podIP`); a pod
  reaches this machine (the manager) at host_address(). The names the
  cluster's DNS would answer for a job's pods go into each of its pods'
  hosts file: training-operator's per-replica Services (`<job>-<type>-<i>`,
  also `.<namespace>.svc`), `hostname.subdomain` where a pod names both
  and a headless Service (clusterIP None) of the subdomain's name selects
  it, and a TrainJob's `<job>-node-0-<i>.<job>` (JobSet's pods in the
  headless Service JobSet makes of the job's name); nothing else resolves.
  A pod's hostname is its spec's, else its name.
- the kubelet: each pod's first container runs under podman on that
  network, with the pod's image mapped to
  `image`, its command, args, workingDir and env (values, the downward API's
  fieldRefs, Secret and ConfigMap keys; envFrom's Secrets and ConfigMaps), its volumes as host directories
  under `workdir` (emptyDir per pod, a claim per claim name, so a claim
  outlives its job; an NFS volume per server and path, shared by every pod
  that mounts it; ConfigMap and Secret files), and `mounts` (container
  path -> host path, read-only) added to every pod, for code that a test
  keeps on the host. restartPolicy OnFailure/Always restart the container.
  The pod's phase and container statuses (running, terminated with exit
  code, reason and message) go back into the API server's pod list, as a
  kubelet reports them. The message is the kubelet's termination message:
  a host file, emptied before each attempt, is bind-mounted at the
  container's terminationMessagePath (default /dev/termination-log) and
  its text (up to the kubelet's 4096 bytes) read when the container ends.
  (terminationMessagePolicy FallbackToLogsOnError is not played: trialkit's
  templates do not set it.) A pod the platform deletes (delete_collection with a grace)
  runs its preStop hook, then podman stop with what is left of the grace.

Only what trialkit's templates use is played: one container per pod (the
first), no init containers, no scheduling, no resources (a GPU request
runs on the CPU). Containers are started through containers_util.Containers,
so the test's `containers` fixture sees that nothing is left.
"""
from __future__ import annotations

import base64
import ipaddress
import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import trainer_play
from containers_util import Containers, podman

POLL_SECONDS = 0.1
JOB_KINDS = ("PyTorchJob", "TFJob", "Framework", "AdaptDLJob", "TrainJob")
DEFAULT_TERMINATION_PATH = "/dev/termination-log"  # a container's terminationMessagePath unless it sets one
TERMINATION_MESSAGE_BYTES = 4096  # the kubelet keeps no more of it


# Bridges that container networks make (podman's, a runner's own): their addresses come and go with them.
BRIDGES = ("podman", "cni", "veth", "docker", "br-")


def host_address() -> str:
    """A non-loopback IPv4 address of this machine, not a container bridge's: the pods' managerAddress (the
    platform refuses loopback)."""
    import psutil

    for interface, addresses in psutil.net_if_addrs().items():
        if interface.startswith(BRIDGES):
            continue
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    raise AssertionError("this machine has no non-loopback IPv4 address for the pods to reach the manager at")


@dataclass
class Replica:
    """One pod an operator makes: its name, template, and what the operator adds."""

    name: str
    template: dict
    labels: Dict[str, str] = field(default_factory=dict)
    env: Dict[str, str] = field(default_factory=dict)
    role: str = ""
    names: List[str] = field(default_factory=list)  # what the cluster's DNS resolves to this pod (its Services)
    annotations: Dict[str, str] = field(default_factory=dict)


@dataclass
class Pod:
    """The runner's view of one pod; `obj` is the pod as the API server lists it."""

    name: str
    job: str  # the job's path in the API server
    uid: str  # the job's uid: a job made again under the same name is another job
    role: str
    obj: dict
    container: str = ""
    exit_code: Optional[int] = None  # the last attempt's
    restarts: int = 0
    error: str = ""  # why the runner could not run it (podman's complaint)
    deleted: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    ip: str = ""  # its address on the runner's network
    names: List[str] = field(default_factory=list)  # what the cluster's DNS resolves to it
    hosts: Dict[str, str] = field(default_factory=dict)  # its job's pods' names -> addresses (its hosts file)
    group: int = 0  # the job's group it belongs to: AdaptDL's restart, a suspended job's resumption

    @property
    def phase(self) -> str:
        return self.obj["status"]["phase"]


# --- the operators: a job's pods, and its status from them ----------------------------

PYTORCH_PORT = 23456  # training-operator's default for the container port named pytorchjob-port
TF_PORT = 2222  # and for tfjob-port


def _container_port(spec: dict, name: str, default: int) -> int:
    ports = [port for container in spec["template"]["spec"].get("containers", []) for port in container.get("ports", [])]
    return next((port["containerPort"] for port in ports if port.get("name") == name), default)


def _kubeflow_replicas(job: dict, group: int) -> List[Replica]:
    """training-operator's pods: <job>-<type>-<index>, each behind a Service of its name; a PyTorchJob's get
    MASTER_ADDR (the master's Service), MASTER_PORT, WORLD_SIZE, RANK, PET_NNODES and PET_NODE_RANK; a TFJob's
    TF_CONFIG (every replica's Service address by type, and its own task)."""
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    pytorch = job["kind"] == "PyTorchJob"
    specs = job["spec"].get("pytorchReplicaSpecs") or job["spec"].get("tfReplicaSpecs") or {}
    world = sum(spec.get("replicas", 1) for spec in specs.values())
    order = sorted(specs, key=lambda t: (t not in ("Master", "Chief"), t != "Worker", t))
    cluster = {kind.lower(): [f"{name}-{kind.lower()}-{i}.{namespace}.svc:{_container_port(specs[kind], 'tfjob-port', TF_PORT)}"
                              for i in range(specs[kind].get("replicas", 1))] for kind in order}
    replicas, rank = [], 0
    for replica_type in order:
        spec = specs[replica_type]
        for index in range(spec.get("replicas", 1)):
            kind = replica_type.lower()
            # The operator gives each pod its replica type's restartPolicy (ExitCode: its own, so Never).
            template = {**spec["template"], "spec": {**spec["template"]["spec"], "restartPolicy": {
                "ExitCode": "Never"}.get(spec.get("restartPolicy", "Never"), spec.get("restartPolicy", "Never"))}}
            pod = f"{name}-{kind}-{index}"
            if pytorch:
                master = "Master" if "Master" in specs else order[0]
                env = {"MASTER_ADDR": f"{name}-{master.lower()}-0",
                       "MASTER_PORT": str(_container_port(specs[master], "pytorchjob-port", PYTORCH_PORT)),
                       "WORLD_SIZE": str(world), "RANK": str(rank), "PET_NNODES": str(world),
                       "PET_NODE_RANK": str(rank), "PYTHONUNBUFFERED": "1"}
            else:
                env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": index},
                                                "environment": "cloud"})}
            replicas.append(Replica(
                pod, template,
                {"training.kubeflow.org/replica-index": str(index), "training.kubeflow.org/replica-type": kind,
                 "training.kubeflow.org/job-name": name},
                env, role=replica_type,
                # The operator makes a Service per replica, named as its pod.
                names=[pod, f"{pod}.{namespace}.svc", f"{pod}.{namespace}.svc.cluster.local"]))
            rank += 1
    return replicas


def _kubeflow_status(job: dict, pods: List[Pod]) -> dict:
    failed = [p for p in pods if p.phase == "Failed"]
    master = [p for p in pods if p.role in ("Master", "Chief")] or pods
    kind = job["kind"]
    if suspended(job):  # its pods were deleted for it: their ends are no failure
        return {"conditions": [{"type": "Suspended", "status": "True", "reason": f"{kind}Suspended",
                                "message": f"{kind} {job['metadata']['name']} is suspended."}]}
    if failed:
        condition = ("Failed", f"{kind}Failed", f"{kind} {job['metadata']['name']} is failed because "
                                                 f"{sum(p.role == failed[0].role for p in failed)} {failed[0].role} replica(s) failed.")
    elif master and all(p.phase == "Succeeded" for p in master):
        condition = ("Succeeded", f"{kind}Succeeded", f"{kind} {job['metadata']['name']} is successfully completed.")
    elif pods and all(p.phase == "Running" for p in pods):
        condition = ("Running", f"{kind}Running", f"{kind} {job['metadata']['name']} is running.")
    else:
        condition = ("Created", f"{kind}Created", f"{kind} {job['metadata']['name']} is created.")
    kind_, reason, message = condition
    return {"conditions": [{"type": kind_, "status": "True", "reason": reason, "message": message}]}


def _fill_placeholders(node, values: Dict[str, str]):
    """FrameworkController's pod template placeholders ({{FC_TASK_INDEX}}, ...) filled in every string."""
    if isinstance(node, dict):
        return {key: _fill_placeholders(value, values) for key, value in node.items()}
    if isinstance(node, list):
        return [_fill_placeholders(value, values) for value in node]
    if isinstance(node, str):
        for key, value in values.items():
            node = node.replace("{{" + key + "}}", value)
    return node


def _framework_replicas(job: dict, group: int) -> List[Replica]:
    """FrameworkController's pods: <framework>-<role>-<index>, labelled with the framework and role (what a
    headless Service selects), their template's placeholders filled, FC_* in their environment."""
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    replicas = []
    for role in job["spec"]["taskRoles"]:
        for index in range(role["taskNumber"]):
            pod = f"{name}-{role['name']}-{index}"
            values = {"FC_FRAMEWORK_NAMESPACE": namespace, "FC_FRAMEWORK_NAME": name, "FC_TASKROLE_NAME": role["name"],
                      "FC_TASK_INDEX": str(index), "FC_FRAMEWORK_ATTEMPT_ID": "0", "FC_TASK_ATTEMPT_ID": "0",
                      "FC_POD_NAME": pod}
            replicas.append(Replica(
                pod, _fill_placeholders(role["task"]["pod"], values),
                {"FC_FRAMEWORK_NAME": name, "FC_TASKROLE_NAME": role["name"], "FC_TASK_INDEX": str(index)},
                values, role=role["name"]))
    return replicas


def _framework_status(job: dict, pods: List[Pod]) -> dict:
    failed = [p for p in pods if p.phase == "Failed"]
    if failed:
        code = failed[0].exit_code
        return {"state": "Completed", "attemptStatus": {"completionStatus": {
            "code": code, "phrase": "ContainerFailed", "type": {"name": "Failed"},
            "diagnostics": f"pod {failed[0].name} exited {code}"}}}
    if pods and all(p.phase == "Succeeded" for p in pods):
        return {"state": "Completed", "attemptStatus": {"completionStatus": {
            "code": 0, "phrase": "Succeeded", "type": {"name": "Succeeded"}}}}
    running = pods and all(p.phase == "Running" for p in pods)
    return {"state": "AttemptRunning" if running else "AttemptCreationRequested"}


ADAPTDL_SCHED_VERSION = "0.2.11"
ADAPTDL_BASE_PORT = 47000  # AdaptDL's controller: each restart group's master port is this plus the group


def _adaptdl_replicas(job: dict, group: int) -> List[Replica]:
    """AdaptDL's controller: minReplicas pods (its allocation here) named <job>-<group>-<rank>, with no master
    address: the replicas ask its supervisor (the runner's, ADAPTDL_SUPERVISOR_URL) for rank 0's."""
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    count = max(job["spec"].get("minReplicas") or 1, 1)
    template = {**job["spec"]["template"], "spec": {**job["spec"]["template"]["spec"], "restartPolicy": "Never"}}
    return [Replica(
        f"{name}-{group}-{rank}", template,
        {"adaptdl/job": name, "adaptdl/group": str(group), "adaptdl/replica": str(rank)},
        {"ADAPTDL_JOB_ID": f"{namespace}/{name}", "ADAPTDL_NUM_RESTARTS": str(group),
         "ADAPTDL_NUM_REPLICAS": str(count), "ADAPTDL_REPLICA_RANK": str(rank), "ADAPTDL_NUM_NODES": "1",
         "ADAPTDL_MASTER_PORT": str(ADAPTDL_BASE_PORT + group), "ADAPTDL_SCHED_VERSION": ADAPTDL_SCHED_VERSION},
        role="main") for rank in range(count)]


def _adaptdl_status(job: dict, pods: List[Pod]) -> dict:
    failed = [p for p in pods if p.phase == "Failed" and p.exit_code != 143]
    if failed:
        return {"phase": "Failed", "reason": "ReplicaFailed", "message": f"pod {failed[0].name} exited {failed[0].exit_code}"}
    if pods and all(p.phase == "Succeeded" for p in pods):
        return {"phase": "Succeeded"}
    if any(p.exit_code == 143 for p in pods):
        return {"phase": "Stopping"}
    return {"phase": "Running" if pods and all(p.phase == "Running" for p in pods) else "Starting"}


def _trainjob_replicas(job: dict, group: int) -> List[Replica]:
    """Trainer's pods, as JobSet makes them: each one's host <job>-node-0-<i> in the subdomain <job>, a headless
    Service of the job's name (so <host>.<job> resolves to the pod, node 0's being PET_MASTER_ADDR)."""
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    return [Replica(pod.name, pod.template, pod.labels, pod.env, pod.replicated_job,
                    [f"{pod.name}.{name}", f"{pod.name}.{name}.{namespace}.svc",
                     f"{pod.name}.{name}.{namespace}.svc.cluster.local"], pod.annotations)
            for pod in trainer_play.node_pods(job)]


def _trainjob_status(job: dict, pods: List[Pod]) -> dict:
    return trainer_play.status(job, [pod.phase for pod in pods])


def suspended(job: dict) -> bool:
    """Held by Kueue: a TrainJob's spec.suspend, a training-operator job's runPolicy.suspend."""
    spec = job.get("spec") or {}
    return bool(spec.get("suspend") or (spec.get("runPolicy") or {}).get("suspend"))


OPERATORS: Dict[str, tuple] = {
    "TrainJob": (_trainjob_replicas, _trainjob_status),
    "PyTorchJob": (_kubeflow_replicas, _kubeflow_status),
    "TFJob": (_kubeflow_replicas, _kubeflow_status),
    "Framework": (_framework_replicas, _framework_status),
    "AdaptDLJob": (_adaptdl_replicas, _adaptdl_status),
}
FINAL = {"Succeeded", "Failed", "Completed"}


def _finished(status: dict) -> bool:
    conditions = [c["type"] for c in status.get("conditions", [])]
    return bool(FINAL.intersection(conditions)) or status.get("phase") in FINAL or status.get("state") == "Completed"


# --- AdaptDL's supervisor ----------------------------------------------------------------


class Supervisor:
    """AdaptDL's supervisor, its /discover endpoint: the addresses of a job's restart group, by rank, once
    every replica of the group has one (a JSON list, as adaptdl 0.2 reads it); 408 when its wait runs out."""

    WAIT_SECONDS = 30

    def __init__(self, runner: "PodRunner"):
        supervisor = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):
                parts = self.path.strip("/").split("/")
                addresses = supervisor.discover(*parts[1:]) if len(parts) == 4 and parts[0] == "discover" else None
                body = json.dumps(addresses).encode()
                self.send_response(200 if addresses else 408 if len(parts) == 4 else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.runner = runner
        self._server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://{host_address()}:{self._server.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def discover(self, namespace: str, name: str, group: str) -> Optional[List[str]]:
        deadline = time.monotonic() + self.WAIT_SECONDS
        while time.monotonic() < deadline:
            pods = [p for p in list(self.runner.history) if not p.deleted and p.obj["metadata"]["namespace"] == namespace
                    and p.obj["metadata"]["labels"].get("adaptdl/job") == name
                    and p.obj["metadata"]["labels"].get("adaptdl/group") == group]
            if pods:
                return [p.ip for p in sorted(pods, key=lambda p: int(p.obj["metadata"]["labels"]["adaptdl/replica"]))]
            time.sleep(0.1)
        return None


# --- the runner -------------------------------------------------------------------------


class PodRunner:
    def __init__(self, api, containers: Containers, image: str, workdir: Path,
                 mounts: Optional[Dict[str, Path]] = None, images: Optional[Dict[str, str]] = None, kueue=None):
        self.api = api
        self.containers = containers
        self.image = image
        self.images = images or {}  # a pod's image -> the local one; any other image: `image`
        self.workdir = Path(workdir)
        self.mounts = mounts or {}
        self.pods: Dict[str, Pod] = {}  # by name: the latest pod of that name
        self.history: List[Pod] = []  # every pod, in the order made (a job made again reuses its pods' names)
        self.jobs: Dict[str, int] = {}  # job uid -> its current group (AdaptDL restarts, resumptions)
        self.idle: set = set()  # uids of suspended jobs whose pods were deleted: resumed, they get a new group
        self.kueue = kueue  # kueue_play.KueuePlay, or None: no job waits for admission
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pod-runner", daemon=True)
        self._threads: List[threading.Thread] = []
        self.error = ""  # why the runner's loop stopped, if it did
        self.network = f"tk-pods-{uuid.uuid4().hex[:10]}"  # the pods' own network: an address each
        self._addresses: Optional[Iterator[str]] = None
        self._supervisor = Supervisor(self)

    def __enter__(self) -> "PodRunner":
        podman("network", "create", "--disable-dns", "--label", f"trialkit.test={self.containers.tag}", self.network)
        subnet = json.loads(podman("network", "inspect", self.network).stdout)[0]["subnets"][0]["subnet"]
        gateway = ipaddress.ip_network(subnet)[1]
        self._addresses = (str(a) for a in ipaddress.ip_network(subnet).hosts() if a != gateway)
        self._supervisor.start()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        for pod in self.history:
            pod.deleted = True
            if pod.container:
                podman("rm", "-f", "-t", "0", pod.container, check=False)
        for thread in self._threads:
            thread.join(timeout=30)
        self._supervisor.stop()
        podman("network", "rm", "-f", self.network, check=False)

    # --- what a test does -------------------------------------------------------------

    def wait_for(self, predicate: Callable[[Dict[str, Pod]], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(dict(self.pods)):
            if time.monotonic() > deadline:
                states = {name: (pod.phase, pod.exit_code) for name, pod in self.pods.items()}
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; pods: {states}")
            time.sleep(0.05)

    def delete_pod(self, name: str, grace: Optional[int] = None) -> None:
        """As `kubectl delete pod NAME`: gone from the API server, then stopped gracefully."""
        self._remove(self.pods[name], grace)

    def _remove(self, pod: Pod, grace: Optional[int]) -> None:
        """A pod deleted through the API server: gone from its list, then stopped gracefully."""
        with self.api._lock:
            self.api.pods = [p for p in self.api.pods if p is not pod.obj]
        self._delete(pod, grace)

    def kill(self, name: str) -> None:
        """SIGKILL the pod's container (its keeper too), as the OOM killer or a runtime's timeout would."""
        pod = self.pods[name]
        if self._started(pod, 60):
            podman("kill", "-s", "KILL", pod.container)

    def logs(self, pod) -> str:
        """The output of a pod (by name: the latest of that name) as podman keeps it."""
        pod = self.pods[pod] if isinstance(pod, str) else pod
        return self.containers.logs(pod.container)

    def describe(self, lines: int = 20) -> str:
        """Each pod's phase, exit code and last lines of output: for a failing test's message."""
        out = [f"the runner stopped: {self.error}"] if self.error else []
        for pod in self.history:
            tail = "\n    ".join(self.logs(pod).splitlines()[-lines:]) if pod.container else ""
            error = f", runner error: {pod.error}" if pod.error else ""
            out.append(f"pod {pod.name}: {pod.phase}, exit {pod.exit_code}, restarts {pod.restarts}{error}\n    {tail}")
        return "\n".join(out)

    # --- the loop ---------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self._turn()
            except Exception as err:  # a fault of the runner: describe() shows it, and it stops playing
                self.error = f"{type(err).__name__}: {err}"
                return

    def _turn(self) -> None:
        """One look at the API server: new jobs get pods, deleted pods stop, jobs get their status."""
        if self.kueue is not None:
            self.kueue.turn()
        with self.api._lock:
            jobs = {path: obj for path, obj in self.api.objects.items() if obj.get("kind") in JOB_KINDS}
        for path, job in jobs.items():
            uid = job["metadata"]["uid"]
            if suspended(job):
                if uid in self.jobs and uid not in self.idle:  # evicted: its pods go, with their grace
                    self.idle.add(uid)
                    for pod in self.history:
                        if pod.uid == uid and not pod.deleted:
                            self._terminate(pod)
            elif uid not in self.jobs:
                self.jobs[uid] = 0
                self._create_pods(path, job)
            elif uid in self.idle:  # admitted again
                self.idle.discard(uid)
                self.jobs[uid] += 1
                self._create_pods(path, job)
        with self.api._lock:
            listed = {id(p) for p in self.api.pods}
            grace = self._last_pod_deletion_grace()
        for pod in list(self.history):
            if pod.deleted:
                continue
            if pod.job not in jobs or jobs[pod.job]["metadata"]["uid"] != pod.uid:
                self._delete(pod, None)  # the garbage collector: the job went
            elif id(pod.obj) not in listed:
                self._delete(pod, grace)  # the platform deleted it
        for path, job in jobs.items():
            self._operate(path, job)

    def _last_pod_deletion_grace(self) -> Optional[int]:
        for request in reversed(self.api.requests):
            if request.method == "DELETE" and request.path.endswith("/pods"):
                value = request.query.get("gracePeriodSeconds")
                return None if value is None else int(value)
        return None

    def _create_pods(self, path: str, job: dict) -> None:
        """The job's pods, each with an address of its own; then every name the cluster's DNS would give them
        (the operator's Services, hostname.subdomain under a headless Service) goes into each one's hosts file."""
        make, _ = OPERATORS[job["kind"]]
        made = []
        for replica in make(job, self.jobs[job["metadata"]["uid"]]):
            template = replica.template
            labels = {**template.get("metadata", {}).get("labels", {}), **job["metadata"].get("labels", {}),
                      **replica.labels}
            obj = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": replica.name, "namespace": job["metadata"].get("namespace", "default"),
                                "labels": labels, "annotations": dict(replica.annotations), "uid": uuid.uuid4().hex},
                   "spec": json.loads(json.dumps(template["spec"])), "status": {"phase": "Pending"}}
            pod = Pod(replica.name, path, job["metadata"]["uid"], replica.role, obj, ip=next(self._addresses),
                      group=self.jobs[job["metadata"]["uid"]])
            obj["status"]["podIP"] = pod.ip
            pod.names = replica.names + self._subdomain_names(obj)
            made.append((pod, replica.env))
        hosts = {name: pod.ip for pod, _ in made for name in pod.names}
        for pod, _ in made:  # all of them listed before any starts: a peer asks for the others
            pod.hosts = hosts
            self.pods[pod.name] = pod
            self.history.append(pod)
            with self.api._lock:
                self.api.pods.append(pod.obj)
        for pod, env in made:
            if job["kind"] == "AdaptDLJob":
                env = {**env, "ADAPTDL_SUPERVISOR_URL": self._supervisor.url}
            self._spawn(self._run_pod, pod, env)

    def _subdomain_names(self, obj: dict) -> List[str]:
        """hostname.subdomain, where the pod names both and a headless Service of the subdomain's name selects it
        (as cluster DNS answers: without the Service, nothing)."""
        spec, meta = obj["spec"], obj["metadata"]
        hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
        with self.api._lock:
            service = self.api.objects.get(f"/api/v1/namespaces/{meta['namespace']}/services/{subdomain}")
        if not (hostname and subdomain and service) or service["spec"].get("clusterIP") != "None":
            return []
        selector = service["spec"].get("selector") or {}
        if not selector or any(meta["labels"].get(key) != value for key, value in selector.items()):
            return []
        name = f"{hostname}.{subdomain}"
        return [name, f"{name}.{meta['namespace']}.svc", f"{name}.{meta['namespace']}.svc.cluster.local"]

    def _operate(self, path: str, job: dict) -> None:
        """The operator's turn: the job's status from its pods, until it has ended (an operator writes a job's end
        once: the pods it stops then, exiting 143, do not change its reason); AdaptDL's restart after a checkpoint."""
        _, status_of = OPERATORS[job["kind"]]
        uid = job["metadata"]["uid"]
        group = self.jobs.get(uid, 0)  # a job held suspended from its creation has no pods yet
        pods = [p for p in self.history if p.uid == uid and p.group == group]
        ended = job.get("status") or {}
        status = ended if _finished(ended) else status_of(job, pods)
        if job["kind"] == "AdaptDLJob" and status["phase"] == "Stopping" and all(p.done.is_set() for p in pods):
            self.jobs[uid] = group + 1
            with self.api._lock:
                self.api.pods = [p for p in self.api.pods if all(p is not pod.obj for pod in pods)]
            for pod in pods:
                pod.deleted = True
            self._create_pods(path, job)
            status = {"phase": "Starting"}
        if _finished(status):
            # cleanPodPolicy Running; FrameworkController's completed attempt; AdaptDL's controller at the job's
            # end (it keeps failed pods): the pods still running go.
            for pod in pods:
                if not pod.done.is_set() and not pod.deleted:
                    self._remove(pod, None)
        with self.api._lock:
            if self.api.objects.get(path) is job:
                job["status"] = status

    # --- the kubelet ------------------------------------------------------------------

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _run_pod(self, pod: Pod, operator_env: Dict[str, str]) -> None:
        try:
            self._run_containers(pod, operator_env)
        except Exception as err:  # a test equipment fault: shown by describe(), the pod stays Pending
            pod.error = str(err)
            pod.done.set()

    def _run_containers(self, pod: Pod, operator_env: Dict[str, str]) -> None:
        spec = pod.obj["spec"]
        container = spec["containers"][0]
        options = ["--network", self.network, "--ip", pod.ip, "--hostname", spec.get("hostname") or pod.name,
                   *(f"--add-host={name}:{ip}" for name, ip in sorted(pod.hosts.items())),
                   *self._volumes(pod, container)]
        if container.get("command"):
            options += ["--entrypoint", json.dumps(container["command"])]
        if container.get("workingDir"):
            options += ["-w", container["workingDir"]]
        user = (container.get("securityContext") or {}).get("runAsUser")
        if user is not None:
            options += ["--user", f"{user}:0"]
        env = {**self._env(pod, container), **operator_env}
        message = self._pod_dir(pod) / "termination-log"
        options += ["-v", f"{message}:{container.get('terminationMessagePath', DEFAULT_TERMINATION_PATH)}"]
        policy = spec.get("restartPolicy", "Always")
        image = self.images.get(container.get("image", ""), self.image)
        while not pod.deleted:
            message.write_text("")  # each attempt says its own
            message.chmod(0o666)  # any uid writes there, as the kubelet's file
            pod.container = self.containers.start(image, *options, command=container.get("args", []), env=env,
                                                  name=f"{pod.name}-{uuid.uuid4().hex[:8]}")
            self._set_status(pod, "Running", {"running": {}})
            pod.exit_code = self.containers.wait(pod.container, timeout=3600)
            again = policy == "Always" or (policy == "OnFailure" and pod.exit_code != 0)
            if pod.deleted or not again:
                break
            pod.restarts += 1
        if pod.exit_code is None:  # deleted before it started: nothing ran
            pod.done.set()
            return
        terminated = {"exitCode": pod.exit_code, "reason": "Completed" if pod.exit_code == 0 else "Error"}
        said = message.read_bytes()[:TERMINATION_MESSAGE_BYTES].decode(errors="replace")
        if said:
            terminated["message"] = said
        self._set_status(pod, "Succeeded" if pod.exit_code == 0 else "Failed", {"terminated": terminated})
        pod.done.set()

    @staticmethod
    def _set_status(pod: Pod, phase: str, state: dict) -> None:
        """A new status in one assignment: the API server may be writing the old one out."""
        name = pod.obj["spec"]["containers"][0]["name"]
        pod.obj["status"] = {"phase": phase, "containerStatuses": [
            {"name": name, "state": state, "restartCount": pod.restarts, "ready": "running" in state}]}

    def _delete(self, pod: Pod, grace: Optional[int]) -> None:
        """The kubelet's deletion: the preStop hook within the grace, then SIGTERM, then SIGKILL at its end."""
        pod.deleted = True
        if grace is None:
            grace = pod.obj["spec"].get("terminationGracePeriodSeconds", 30)
        self._spawn(self._stop_pod, pod, grace)

    def _terminate(self, pod: Pod) -> None:
        """The job controller's deletion of a pod: listed, Terminating, until its container has stopped."""
        pod.obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        pod.deleted = True

        def stop_then_unlist() -> None:
            self._stop_pod(pod, pod.obj["spec"].get("terminationGracePeriodSeconds", 30))
            pod.done.wait(60)
            with self.api._lock:
                self.api.pods = [p for p in self.api.pods if p is not pod.obj]

        self._spawn(stop_then_unlist)

    def _stop_pod(self, pod: Pod, grace: int) -> None:
        deadline = time.monotonic() + grace
        if not self._started(pod, grace):
            return
        hook = (((pod.obj["spec"]["containers"][0].get("lifecycle") or {}).get("preStop") or {}).get("exec") or {})
        if hook.get("command") and grace > 0:
            try:
                podman("exec", pod.container, *hook["command"], check=False, timeout=grace)
            except Exception:  # the hook outran the grace: the kubelet goes on to stop the container
                pass
        left = max(0, int(deadline - time.monotonic()))
        podman("stop", "-t", str(left), pod.container, check=False, timeout=grace + 30)

    @staticmethod
    def _started(pod: Pod, timeout: float) -> bool:
        """Whether the pod's container runs, once its id is known (a trial may report before `start` returns)."""
        deadline = time.monotonic() + timeout
        while not pod.container and not pod.done.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)  # still starting
        return bool(pod.container) and not pod.done.is_set()

    def _pod_dir(self, pod: Pod) -> Path:
        """The pod's own host dir (emptyDirs, the termination message): a pod made again under the same
        name starts empty, as on a cluster."""
        path = self.workdir / "pods" / f"{pod.name}-{pod.obj['metadata']['uid']}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _volumes(self, pod: Pod, container: dict) -> List[str]:
        ns = pod.obj["metadata"]["namespace"]
        sources = {}
        for volume in pod.obj["spec"].get("volumes", []):
            name = volume["name"]
            if "persistentVolumeClaim" in volume:
                path = self.workdir / "claims" / volume["persistentVolumeClaim"]["claimName"]
            elif "nfs" in volume:  # one export, whoever mounts it
                path = self.workdir / "nfs" / volume["nfs"]["server"] / volume["nfs"]["path"].strip("/")
            else:
                path = self._pod_dir(pod) / name
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)  # as a kubelet makes an emptyDir: any uid writes there
            for kind in ("configMap", "secret"):
                if kind in volume:
                    ref = volume[kind].get("name") or volume[kind].get("secretName")
                    mode = volume[kind].get("defaultMode", 0o644)
                    for key, value in self._data(ns, kind, ref).items():
                        (path / key).write_text(value)
                        (path / key).chmod(mode)
            sources[name] = path
        options = []
        for mount in container.get("volumeMounts", []):
            host = sources[mount["name"]] / mount.get("subPath", "")
            host.mkdir(parents=True, exist_ok=True)
            options += ["-v", f"{host}:{mount['mountPath']}{':ro' if mount.get('readOnly') else ''}"]
        for target, host in self.mounts.items():
            options += ["-v", f"{host}:{target}:ro"]
        return options

    def _data(self, namespace: str, kind: str, name: str) -> Dict[str, str]:
        plural = "configmaps" if kind == "configMap" else "secrets"
        with self.api._lock:
            obj = self.api.objects.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}") or {}
        data = dict(obj.get("stringData") or {})
        encoded = obj.get("data") or {}
        for key, value in encoded.items():
            data[key] = base64.b64decode(value).decode() if kind == "secret" else value
        return data

    def _env(self, pod: Pod, container: dict) -> Dict[str, str]:
        ns = pod.obj["metadata"]["namespace"]
        out = {}
        for source in container.get("envFrom", []):  # every key of each, before `env`, which wins over them
            if "secretRef" in source:
                out.update(self._data(ns, "secret", source["secretRef"]["name"]))
            elif "configMapRef" in source:
                out.update(self._data(ns, "configMap", source["configMapRef"]["name"]))
        for item in container.get("env", []):
            if "value" in item:
                out[item["name"]] = str(item["value"])
                continue
            source = item.get("valueFrom", {})
            if "fieldRef" in source:
                out[item["name"]] = self._field(pod, source["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                out[item["name"]] = self._data(ns, "secret", ref["name"])[ref["key"]]
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                out[item["name"]] = self._data(ns, "configMap", ref["name"])[ref["key"]]
        return out

    @staticmethod
    def _field(pod: Pod, path: str) -> str:
        meta = pod.obj["metadata"]
        for prefix, mapping in (("metadata.labels['", meta["labels"]), ("metadata.annotations['",
                                                                          meta.get("annotations", {}))):
            if path.startswith(prefix):
                return mapping.get(path[len(prefix):-2], "")
        simple = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                  "status.podIP": pod.ip, "status.hostIP": host_address(), "spec.nodeName": "localhost"}
        return simple[path]
