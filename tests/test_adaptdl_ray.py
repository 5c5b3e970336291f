"""adaptdl-ray: the elastic AdaptDL controller on a real Ray cluster, with the real adaptdl library.

The cluster (tests/ray_cluster.py) is a head and node2, 2 CPUs each; jobs ask
2 CPUs a worker, so they run 2 workers, and 1 while node2 is gone or excluded.
The training script is examples/adaptdl_ray/train.py; replica 0 prints
`epoch E loss L replicas N restarts R` after each epoch.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import pytest

from conftest import PYTHON, ROOT
from experiment_util import cli as trialkit_cli, experiment, experiment_id, start_cli, stored, trial_status
from ray_cluster import ImdsStub
from trialkit.errors import UserError
from trialkit.ray import adaptdl_ray as cli
from trialkit.ray import spot
from trialkit.ray.cluster import Node, plan, slots
from trialkit.ray.connect import version_mismatch

EXAMPLE = ROOT / "examples" / "adaptdl_ray"
EPOCH = re.compile(r"epoch (\d+) loss ([0-9.e+-]+) replicas (\d+) restarts (\d+) samples (\d+)")
SAVED = re.compile(r"\(rank 0 .*trialkit: checkpoint at step (\d+)")
RESUMED = re.compile(r"starting from the checkpoint of restart (\d+) at step (\d+)")
SAMPLES = 1024  # the example's dataset: every epoch trains on each sample once
ANSI = re.compile(r"\x1b\[[0-9;]*m")
START_TIMEOUT = 180.0  # a (re)start: actors, python, torch, adaptdl's 5 s connect retry, on a loaded machine

# -- placement --------------------------------------------------------------------------------

HEAD = Node("h" * 8, "10.0.0.1", 8, 0, True)
GPU_A = Node("a" * 8, "10.0.0.2", 16, 4, False)
GPU_B = Node("b" * 8, "10.0.0.3", 16, 2, False)


def test_workers_fill_the_head_first_then_other_nodes_up_to_the_maximum():
    assert slots(HEAD, 2, 0) == 4 and slots(GPU_A, 2, 1) == 4 and slots(HEAD, 2, 1) == 0
    assert plan([GPU_B, GPU_A, HEAD], 2, 1, 10) == [GPU_A] * 4 + [GPU_B] * 2
    assert plan([GPU_B, GPU_A, HEAD], 4, 0, 3) == [HEAD, HEAD, GPU_A]


def test_an_excluded_node_gets_no_worker():
    assert plan([GPU_A, GPU_B], 1, 1, 8, exclude={GPU_A.node_id}) == [GPU_B] * 2
    assert plan([GPU_A], 1, 1, 8, exclude={GPU_A.node_id}) == []


# -- the command line -----------------------------------------------------------------------


def test_the_seeds_command_line_is_read():
    opts = cli.parse_args(["-u", "ray://head:10001", "-f", "code.py", "-m", "3", "--cpus", "4", "--gpus", "1",
                           "--", "-autoscale-bsz", "--lr", "0.1"])
    assert (opts.address, opts.file, opts.max_workers, opts.cpus, opts.gpus) == ("ray://head:10001", "code.py", 3, 4, 1)
    assert (opts.checkpoint_timeout, opts.cluster_rescale_timeout) == (120, 60)
    assert opts.script_args == ["-autoscale-bsz", "--lr", "0.1"]
    assert opts.checkpoint_every == 600
    assert cli.parse_args(["-f", "code.py", "-m", "1", "--checkpoint-every", "2"]).checkpoint_every == 2


def test_the_script_must_be_in_the_working_dir(tmp_path):
    (tmp_path / "work" / "sub").mkdir(parents=True)
    (tmp_path / "work" / "sub" / "main.py").write_text("")
    (tmp_path / "outside.py").write_text("")
    assert cli.locate_script("sub/main.py", str(tmp_path / "work")) == ((tmp_path / "work").resolve(), "sub/main.py")
    assert cli.locate_script(str(tmp_path / "outside.py"), None) == (tmp_path.resolve(), "outside.py")
    with pytest.raises(UserError, match="is not inside the working dir"):
        cli.locate_script("../outside.py", str(tmp_path / "work"))
    with pytest.raises(UserError, match="is not a file in the working dir"):
        cli.locate_script("main.py", str(tmp_path / "work"))


def adaptdl_ray(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "trialkit.ray.adaptdl_ray", *args], capture_output=True, text=True,
                          timeout=timeout)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("adaptdl-ray: error: ")
    return lines[0]


def test_usage_errors_are_one_line_and_exit_2(tmp_path):
    (tmp_path / "train.py").write_text("")
    line = one_error_line(adaptdl_ray("-f", "../x.py", "--working-dir", str(tmp_path), "-m", "2"))
    assert "-f/--file: ../x.py is not inside the working dir" in line
    line = one_error_line(adaptdl_ray("-f", str(tmp_path / "train.py"), "-m", "0"))
    assert "-m/--max-workers" in line
    line = one_error_line(adaptdl_ray("-f", str(tmp_path / "train.py"), "-m", "1", "-u", "head"))
    assert "cannot read Ray address 'head'" in line


def test_an_unreachable_cluster_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "train.py").write_text("")
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    line = one_error_line(adaptdl_ray("-u", f"ray://127.0.0.1:{port}", "-f", str(tmp_path / "train.py"), "-m", "1"))
    assert f"cannot reach the Ray cluster at ray://127.0.0.1:{port} (Connection refused)" in line
    assert time.monotonic() - started < 30


def test_rays_version_mismatch_message_becomes_one_line():
    message = ("Version mismatch: The cluster was started with:\n    Ray: 2.50.0\n    Python: 3.10.13\n"
               "This process on node 10.0.0.5 was started with:\n    Ray: 2.60.0\n    Python: 3.11.7\n")
    assert version_mismatch(message) == ("the cluster runs Python 3.10.13 with Ray 2.50.0, "
                                         "but this machine runs Python 3.11.7 with Ray 2.60.0")
    assert version_mismatch("some other RuntimeError") is None


# -- the spot-notice watcher ----------------------------------------------------------------


@pytest.fixture
def imds():
    stub = ImdsStub()
    yield stub
    stub.close()


def test_the_watcher_uses_an_imdsv2_token_and_sees_a_notice(imds):
    watcher = spot.SpotWatcher(imds.url("n1"))
    assert watcher.check() is None
    imds.notices["n1"] = {"action": "terminate", "time": "2026-11-22T10:00:00Z"}
    assert watcher.check() == {"action": "terminate", "time": "2026-11-22T10:00:00Z"}
    notice = ("GET", "/n1/latest/meta-data/spot/instance-action", True)  # True: with the valid token
    # One token, kept for the second poll rather than fetched per poll.
    assert imds.requests == [("PUT", "/n1/latest/api/token", False), notice, notice]


def test_without_a_token_the_watcher_falls_back_to_imdsv1(imds):
    imds.v2 = False
    imds.notices["n1"] = {"action": "stop"}
    assert spot.SpotWatcher(imds.url("n1")).check() == {"action": "stop"}
    assert imds.requests[0][0] == "PUT" and imds.requests[1][:2] == ("GET", "/n1/latest/meta-data/spot/instance-action")


def test_off_ec2_the_watcher_gives_up():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    watcher = spot.SpotWatcher(f"http://127.0.0.1:{port}")
    for _ in range(spot.GIVE_UP_AFTER - 1):
        assert watcher.check() is None
    with pytest.raises(spot.Unreachable):
        watcher.check()


# -- jobs on the cluster ------------------------------------------------------------------------


@dataclass
class Epoch:
    epoch: int
    loss: float
    replicas: int
    restarts: int
    samples: int


# The elasticity tests pin two workers (one a node): what they test is the job
# following the cluster, not the goodput model's choice (tested on its own below).
WORKERS = ("--workers", "2")


class Job:
    """adaptdl-ray running in the background; its output collected line by line."""

    def __init__(self, cluster, script: str, working_dir: Path, script_args: Sequence[str], *options: str,
                 workers: Sequence[str] = WORKERS, environ: Optional[dict] = None):
        self.lines: List[str] = []
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "trialkit.ray.adaptdl_ray", "-u", cluster.client_address, "-f", script, "--working-dir",
             str(working_dir), "-m", "2", "--cpus", "2", "--cluster-rescale-timeout", "2", *workers, *options,
             "--",
             *script_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(ANSI.sub("", line.rstrip("\n")))

    def epochs(self, restarts: Optional[int] = None) -> List[Epoch]:
        found = []
        for line in list(self.lines):
            match = EPOCH.search(line)
            if match:
                epoch = Epoch(int(match[1]), float(match[2]), int(match[3]), int(match[4]), int(match[5]))
                if restarts is None or epoch.restarts == restarts:
                    found.append(epoch)
        return found

    def wait_for_epoch(self, restarts: int, at_least: int = 0, timeout: float = START_TIMEOUT) -> Epoch:
        return self._until(lambda: next((e for e in self.epochs(restarts) if e.epoch >= at_least), None), timeout,
                           f"an epoch >= {at_least} under restart {restarts}")

    def wait_for_line(self, text: str, timeout: float = START_TIMEOUT) -> str:
        return self._until(lambda: next((line for line in list(self.lines) if text in line), None), timeout,
                           repr(text))

    def wait_for_match(self, pattern: re.Pattern, timeout: float = START_TIMEOUT) -> re.Match:
        return self._until(lambda: next(filter(None, map(pattern.search, list(self.lines))), None), timeout,
                           pattern.pattern)

    def _until(self, found, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            value = found()
            if value is not None:
                return value
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"no {what} (exit {self.proc.returncode}); {self.output()}")
            time.sleep(0.2)

    def wait(self, timeout: float = START_TIMEOUT) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"adaptdl-ray did not end; {self.output()}")
        self._reader.join(10)
        return code

    def output(self) -> str:
        return "output:\n" + "\n".join(self.lines[-60:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def cluster(ray_cluster):
    """The session's cluster with node2 up; afterwards nothing of the job is left on it."""
    if "node2" not in ray_cluster.nodes:
        ray_cluster.start_node("node2")
    yield ray_cluster
    ray_cluster.imds.notices.clear()
    ray_cluster.wait_clean()


@pytest.fixture
def start_job(cluster):
    """Job(cluster, ...) without the cluster; jobs still running at the end get Ctrl-C."""
    jobs: List[Job] = []

    def start(*args, **keys) -> Job:
        jobs.append(Job(cluster, *args, **keys))
        return jobs[-1]

    start.cluster = cluster
    yield start
    for job in jobs:
        job.stop()


@pytest.mark.slow
def test_a_failing_script_ends_the_job_with_its_code_and_leaves_nothing(start_job, tmp_path):
    (tmp_path / "fail.py").write_text("import sys\nprint('failing on purpose', flush=True)\nsys.exit(3)\n")
    job = start_job("fail.py", tmp_path, [])
    assert job.wait() == 3, job.output()
    assert any("rank 0 exited with code 3" in line or "rank 1 exited with code 3" in line
               for line in job.lines), job.output()
    assert any("failing on purpose" in line for line in job.lines), job.output()
    # the `cluster` fixture then checks: no actor alive, no keeper or script running on any node


@pytest.mark.slow
def test_losing_a_node_resumes_on_one_and_its_return_rescales_to_two(cluster, start_job, tmp_path):
    """With a shared dir (both nodes see tmp_path): the checkpoints stay there, nothing travels."""
    shared = tmp_path / "shared"
    job = start_job("train.py", EXAMPLE, ["--epochs", "1000", "--step-seconds", "0.02"], "--shared-dir", str(shared))
    first = job.wait_for_epoch(restarts=0, at_least=1)
    assert first.replicas == 2
    cluster.stop_node("node2")  # Ray drains it first: the job checkpoints before it goes
    job.wait_for_line("is being drained by Ray")
    job.wait_for_line("took rank 0's checkpoint of restart 0")
    resumed = job.wait_for_epoch(restarts=1)
    last = job.epochs(0)[-1]
    assert resumed.replicas == 1 and last.epoch <= resumed.epoch <= last.epoch + 2
    assert resumed.loss < job.epochs(0)[0].loss / 100
    cluster.start_node("node2")
    regrown = job.wait_for_epoch(restarts=2)
    assert regrown.replicas == 2 and regrown.epoch >= job.epochs(1)[-1].epoch
    assert [p.name for p in (shared / "checkpoint").iterdir()] == ["checkpoint-1"]  # adaptdl keeps the last
    job.stop()  # Ctrl-C: the workers checkpoint, the job ends
    assert job.proc.returncode == 130
    assert any("stopped by the user" in line for line in job.lines)


HANG = '''"""train.py, except that rank 0 hangs while saving under restart HANG_AT (the first argument)."""
import sys
import time

import adaptdl.checkpoint
import adaptdl.env

HANG_AT = int(sys.argv.pop(1))


class HangOnSave(adaptdl.checkpoint.State):
    def save(self, fileobj):
        if adaptdl.env.num_restarts() == HANG_AT:
            time.sleep(3600)


HangOnSave("hang-on-save")
import train  # noqa: E402  (a module beside the script: it travels with the working dir)

train.main()
'''


@pytest.mark.slow
def test_a_spot_notice_rescales_without_its_node_and_a_hung_checkpoint_falls_back(cluster, start_job, tmp_path):
    """Two rescales: the first takes a checkpoint, the second cannot and uses the first's."""
    shutil.copy(EXAMPLE / "train.py", tmp_path / "train.py")
    (tmp_path / "hang.py").write_text(HANG)
    job = start_job("hang.py", tmp_path, ["1", "--epochs", "1000", "--step-seconds", "0.02"],
                    "--checkpoint-timeout", "5")
    assert job.wait_for_epoch(restarts=0, at_least=1).replicas == 2

    # A spot notice for node2: rank 0 saves, and the job goes on without node2.
    cluster.imds.notices["node2"] = {"action": "terminate", "time": "2026-11-22T10:00:00Z"}
    job.wait_for_line("spot notice for node")
    job.wait_for_line("took rank 0's checkpoint of restart 0")
    job.wait_for_line("restart 1: 1 worker on 1 node (head), starting from the checkpoint of restart 0")
    resumed = job.wait_for_epoch(restarts=1)
    last = job.epochs(0)[-1]
    assert resumed.replicas == 1 and last.epoch <= resumed.epoch <= last.epoch + 2  # from the checkpoint
    assert resumed.loss < job.epochs(0)[0].loss / 100  # trained, not afresh
    job.wait_for_epoch(restarts=1, at_least=resumed.epoch + 2)

    # A fresh node2 comes (the noticed one stays out): the job grows, but rank 0 hangs
    # saving, so after the checkpoint timeout restart 0's checkpoint is used.
    cluster.stop_node("node2")
    cluster.imds.notices.clear()
    cluster.start_node("node2")
    job.wait_for_line("the cluster now holds 2 workers")
    started = time.monotonic()
    job.wait_for_line("rank 0 left no checkpoint within the 5 s checkpoint timeout: "
                      "resuming from the checkpoint of restart 0")
    assert time.monotonic() - started < 5 + 30  # "within the timeout": rank 0 was killed when it ran out
    again = job.wait_for_epoch(restarts=2)
    assert again.replicas == 2
    assert again.epoch == resumed.epoch  # restart 1's progress is lost, restart 0's is not
    job.stop()
    assert job.proc.returncode == 130, job.output()


@pytest.mark.slow
def test_a_cluster_of_another_python_is_one_line_and_exit_2(cluster, tmp_path):
    from ray._raylet import GcsClient

    (tmp_path / "train.py").write_text("")
    gcs = GcsClient(address=cluster.address)
    key, namespace = b"CLUSTER_METADATA", b"cluster"  # what Ray compares this process with
    original = gcs.internal_kv_get(key, namespace)
    started_by = dict(json.loads(original), python_version="3.10.13")
    gcs.internal_kv_put(key, json.dumps(started_by).encode(), True, namespace)
    try:
        result = adaptdl_ray("-u", cluster.address, "-f", str(tmp_path / "train.py"), "-m", "1")
    finally:
        gcs.internal_kv_put(key, original, True, namespace)
    mine = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    assert (f"-u/--address: the cluster runs Python 3.10.13 with Ray {started_by['ray_version']}, "
            f"but this machine runs Python {mine} with Ray") in one_error_line(result)


@pytest.mark.slow
def test_a_crashed_node_costs_at_most_one_checkpoint_interval(cluster, start_job):
    """Node2 dies without warning (every process SIGKILLed at once): no checkpoint can be
    taken then, but rank 0 (on the head) took one every 2 s: the job resumes from the
    newest, on the head alone, and finishes. The script is the example, unchanged."""
    epochs = 24
    job = start_job("train.py", EXAMPLE, ["--epochs", str(epochs), "--step-seconds", "0.02"],
                    "--checkpoint-every", "2")
    job.wait_for_match(SAVED)
    assert job.wait_for_epoch(restarts=0).replicas == 2
    cluster.crash_node("node2")
    saved = [int(m[1]) for m in map(SAVED.search, list(job.lines)) if m]  # printed before the crash
    resumed = job.wait_for_match(RESUMED)
    assert int(resumed[1]) == 0 and int(resumed[2]) >= saved[-1], job.output()
    assert job.wait() == 0, job.output()
    assert any(f"trialkit: resuming at step {resumed[2]}" in line for line in job.lines), job.output()
    after = job.epochs(restarts=1)
    assert after[0].replicas == 1 and after[-1].epoch == epochs - 1
    # Each epoch trained on every sample once: the one cut by the crash too, its
    # samples before the checkpoint (kept by its Accumulator) and after it.
    assert [e.samples for e in after] == [SAMPLES] * len(after), job.output()
    assert [e.epoch for e in after] == list(range(after[0].epoch, epochs))


SIZED = re.compile(r"sizing \(new hints\): (\d+): .*predicted speedup by workers: 1: 1\.00x, 2: ([0-9.]+)x")


@pytest.mark.slow
def test_the_trainers_hints_reach_the_controller_and_size_the_job(start_job):
    """-m 2 on two nodes and no pinned count: one worker until AdaptDL's unchanged trainer
    sends its hints (after 30 s of training, over HTTP, to ADAPTDL_SUPERVISOR_URL); then
    AdaptDL's goodput model sizes the job from them. Each step here waits 10 ms, standing
    in for compute, so a second worker pays: the job grows to two, through a checkpoint."""
    job = start_job("train.py", EXAMPLE, ["--epochs", "100000", "--step-seconds", "0.01", "--autoscale-bsz"],
                    workers=())
    decided = job.wait_for_match(SIZED, timeout=150)
    assert int(decided[1]) == 2 and float(decided[2]) > 1.0 + 0.3, job.output()
    assert all(e.replicas == 1 for e in job.epochs(restarts=0)), "one worker until the hints came"
    job.wait_for_match(re.compile(r"the goodput model chose 2 workers \(now 1\): rescaling"))
    assert job.wait_for_epoch(restarts=1).replicas == 2, job.output()


HINTED = '''"""train.py, whose rank 0 first sends the hints in hints.json beside it (if any), and no others;
when a file hints.gate names a path, not before that path exists."""
import json, os, runpy, sys, time
import adaptdl.env, adaptdl.sched_hints
import adaptdl.torch._metrics

if os.path.exists("hints.gate"):
    with open("hints.gate") as gate:
        gate = gate.read()
    while not os.path.exists(gate):
        time.sleep(0.1)
if os.path.exists("hints.json") and adaptdl.env.replica_rank() == 0:
    with open("hints.json") as hints:
        adaptdl.sched_hints.post_sched_hints(json.load(hints), adaptdl.env.job_id())
adaptdl.torch._metrics.post_sched_hints = lambda *args: None  # this job's hints are those above
sys.argv[0] = "train.py"
runpy.run_path("train.py", run_name="__main__")
'''


def autoscaler_request(cluster) -> list:
    """What Ray's autoscaler was last asked for (request_resources). A cluster of `ray start`
    runs autoscaler v1, which keeps the request in the GCS's key-value store."""
    import ray
    from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        return json.loads(_internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL) or b"[]")
    finally:
        ray.shutdown()


def hinted_job_dir(path: Path, hints: Optional[str]) -> Path:
    path.mkdir()
    shutil.copy(EXAMPLE / "train.py", path / "train.py")
    (path / "hinted.py").write_text(HINTED)
    if hints:
        shutil.copy(Path(__file__).parent / "fixtures" / "adaptdl_hints" / hints, path / "hints.json")
    return path


@pytest.mark.slow
def test_two_trials_of_one_experiment_share_the_cluster_by_the_goodput_policy(start_job, tmp_path):
    """Two slots (a worker of 2 CPUs on each node), two jobs of one experiment (its id in the
    environment, as a trial's keeper sets it). A's hints say a second worker pays: alone, it
    grows to two. B joins: each gets its minimum, one, so A gives one back, through a
    checkpoint, and B starts on the slot A freed. B's adaptdl-ray is killed (SIGKILL: its
    controller never says it leaves): A grows to two again. Every epoch of A trains on each
    sample once through all three rescales. (A job that ends well: the ray platform test below.)"""
    environ = dict(os.environ, TRIALKIT_EXPERIMENT_ID=f"shared-{tmp_path.name[-8:]}")
    a_dir = hinted_job_dir(tmp_path / "a", "compute_bound_edited.json")
    channel = tmp_path / "a-channel"  # as under a keeper: A's decisions become its trial's records
    a = start_job("hinted.py", a_dir, ["--epochs", "100000", "--step-seconds", "0.01"], workers=(),
                  environ=dict(environ, TRIALKIT_TRIAL_ID="trial-a", TRIALKIT_CHANNEL=str(channel),
                               TRIALKIT_KEEPER_PID=str(os.getpid())))
    a.wait_for_match(re.compile(r"the goodput model chose 2 workers \(now 1\): rescaling"))
    assert a.wait_for_epoch(restarts=1).replicas == 2, a.output()

    b = start_job("hinted.py", hinted_job_dir(tmp_path / "b", None), ["--epochs", "100000", "--step-seconds", "0.01"],
                  workers=(), environ=dict(environ, TRIALKIT_TRIAL_ID="trial-b"))
    a.wait_for_line("the experiment's plan changed (trial-b joined): 1 workers (now 2): rescaling")
    assert a.wait_for_epoch(restarts=2).replicas == 1, a.output()
    assert b.wait_for_epoch(restarts=0).replicas == 1, b.output()
    # Ray's autoscaler is asked for the two shares, one worker each, not for -m (2) of each.
    assert autoscaler_request(start_job.cluster) == [{"CPU": 2}, {"CPU": 2}]
    b.proc.kill()

    a.wait_for_line("the experiment's plan changed (trial-b ended): 2 workers (now 1): rescaling")
    assert a.wait_for_epoch(restarts=3).replicas == 2, a.output()
    a.stop()
    for restart in (0, 1, 2):
        assert any(f"took rank 0's checkpoint of restart {restart}" in line for line in a.lines), a.output()
    epochs = a.epochs()
    # Nothing lost: every epoch, those cut by a rescale too, trained on each sample once.
    assert [e.samples for e in epochs] == [SAMPLES] * len(epochs), a.output()
    assert [e.epoch for e in epochs] == list(range(len(epochs))), a.output()

    decisions = [record["value"] for record in map(json.loads, channel.read_text().split("\x1e")[1:])
                 if record["type"] == "ELASTIC"]
    rescales = [(d["workers"], d["reason"].split(":")[0]) for d in decisions]
    assert [step for i, step in enumerate(rescales) if step not in rescales[:i]] == [
        (1, "started"), (2, "the goodput model chose 2 workers (now 1)"),
        (1, "the experiment's plan changed (trial-b joined)"), (2, "the experiment's plan changed (trial-b ended)")]
    assert decisions[0]["predicted"] == {} and decisions[-1]["predicted"]["1"] == 1.0
    assert float(decisions[-1]["predicted"]["2"]) > 1.3


ELASTIC_TRIAL = """
import os, sys, trialkit
role = trialkit.get_next_parameter()["role"]
epochs = {{"a": "100000", "b": "3"}}[role]
os.execv(sys.executable, [sys.executable, "-m", "trialkit.ray.adaptdl_ray", "-u", {address!r}, "-f", "hinted.py",
                          "--working-dir", role, "-m", "2", "--cpus", "2", "--cluster-rescale-timeout", "2",
                          "--", "--epochs", epochs, "--step-seconds", "0.01"])
"""
GATED = '''"""train.py once {gate} exists: till then its worker holds its slot."""
import os, runpy, sys, time
while not os.path.exists({gate!r}):
    time.sleep(0.1)
runpy.run_path("train.py", run_name="__main__")
'''


def until(check, timeout: float, what: str):
    """check()'s first truthy value, looked for every half second; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.5)
    return value


def elastic_decisions(home: Path, experiment: str, trial: str) -> List[dict]:
    return [json.loads(value) for (value,) in stored(
        home, experiment, "SELECT value FROM records WHERE trial=? AND type='ELASTIC' ORDER BY seq", trial)]


@pytest.mark.slow
def test_an_experiments_adaptdl_trials_on_the_ray_platform_share_it_and_show_their_sizing(cluster, tmp_path,
                                                                                       monkeypatch):
    """Two adaptdl-ray trials of one experiment on the ray platform, two slots. Trial a's hints
    say a second worker pays, but b holds the other slot: a stays at one while b runs, and
    takes both once b ends. `trialkit trial show` prints a's sizing; stopping the experiment
    stops a's job through its checkpoint (adaptdl-ray takes the keeper's SIGTERM as Ctrl-C).
    Gates keep the order whatever the machine's load: a sends its hints once b runs, and b
    trains (three epochs) once a's sizing with those hints is stored."""
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    space = {"role": {"_type": "choice", "_value": ["a", "b"]}}
    config = experiment(tmp_path, space, ELASTIC_TRIAL.format(address=cluster.address), maxTrialNumber=2,
                        trialConcurrency=2, nniManagerIp="127.0.0.1", tuner={"name": "GridSearch"},
                        trainingService={"platform": "ray", "address": cluster.address, "cpusPerTrial": 0})
    (hinted_job_dir(config.parent / "a", "compute_bound_edited.json") / "hints.gate").write_text(
        str(tmp_path / "b-runs"))
    (hinted_job_dir(config.parent / "b", None) / "hinted.py").write_text(GATED.format(gate=str(tmp_path / "a-sized")))
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        roles = until(lambda: len(rows := stored(home, exp, "SELECT json_extract(parameters, '$.role'), id "
                                                            "FROM trials")) == 2 and dict(rows),
                      START_TIMEOUT, "two trials")
        a, b = roles["a"], roles["b"]
        until(lambda: elastic_decisions(home, exp, b), START_TIMEOUT, "trial b on its worker")
        (tmp_path / "b-runs").touch()
        until(lambda: any(d["predicted"] for d in elastic_decisions(home, exp, a)), START_TIMEOUT,
              "trial a's sizing from its hints")
        (tmp_path / "a-sized").touch()
        grown = until(lambda: next((d for d in elastic_decisions(home, exp, a) if d["workers"] == 2), None),
                      3 * START_TIMEOUT, "trial a on two workers")
        assert grown["reason"].startswith(f"the experiment's plan changed ({b} ended): 2 workers"), grown
        # b's job left the allocator as its script ended; its keeper's final status reaches the store after.
        until(lambda: trial_status(home, b) == "SUCCEEDED", START_TIMEOUT, "trial b's end in the store")
        decisions = elastic_decisions(home, exp, a)
        workers = [d["workers"] for d in decisions]
        # One, until b ended; two from then on (a sizing that comes news on two workers is a decision too: the full
        # suite once read [1, 1, 1, 2, 2] here).
        grew = workers.index(2)
        assert workers == [1] * grew + [2] * (len(workers) - grew) and decisions[grew] == grown, decisions
        # While b held the other slot, a stayed at one though its model predicted a gain from two.
        assert any(d["workers"] == 1 and d["predicted"].get("2", 0) > 1.3 for d in decisions), decisions
        shown = trialkit_cli("trial", "show", a)
        assert shown.returncode == 0, shown.stderr
        assert "elastic:\n  workers      2\n  predicted    1: 1.00x  2: 1.97x" in shown.stdout, shown.stdout
        assert f"({b} ended)" in shown.stdout
        assert trialkit_cli("experiment", "stop", exp).returncode == 0
        assert proc.wait(START_TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
    logs = trialkit_cli("trial", "logs", a)
    assert "adaptdl-ray: stopping: the workers get 120 s to checkpoint" in logs.stdout + logs.stderr, logs.stdout
    assert trial_status(home, a) == "PREEMPTED"  # stopped before its final result: `experiment resume` runs it again


# -- the AdaptDL-on-Ray guide's own commands and files ---------------------------------------------


def test_the_guides_files_are_in_the_example_and_its_cluster_config_is_rays():
    """The guide runs `python3 adaptdl_ray.py -f main.py ...` from the example's folder, brings the cluster
    up with its cluster config and installs its requirements file: each is there, the cluster config is
    valid for the Ray trialkit pins, and the requirements are trialkit's own extras."""
    import importlib.metadata

    import jsonschema
    import ray
    import yaml
    from packaging.requirements import Requirement

    assert {"adaptdl_ray.py", "main.py", "cluster.yaml", "requirements.txt"} <= {p.name for p in EXAMPLE.iterdir()}
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = yaml.safe_load((EXAMPLE / "cluster.yaml").read_text())
    jsonschema.validate(config, schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema is strict: a misspelt key is refused
        jsonschema.validate({**config, "max_worker": 3}, schema)
    assert (EXAMPLE / config["file_mounts"]["~/trialkit"]).resolve() == ROOT
    assert config["setup_commands"] == ["pip install -r ~/trialkit/examples/adaptdl_ray/requirements.txt ~/trialkit"]
    listed = sorted(str(Requirement(line)) for line in (EXAMPLE / "requirements.txt").read_text().splitlines()
                    if line.strip() and not line.startswith("#"))
    pinned = []
    for requirement in map(Requirement, importlib.metadata.requires("trialkit")):
        marker, requirement.marker = requirement.marker, None
        if marker and any(marker.evaluate({"extra": extra}) for extra in ("ray", "adaptdl", "torch")):
            pinned.append(str(requirement))
    assert listed == sorted(pinned)


@pytest.mark.slow
def test_the_guides_command_as_printed_runs_from_the_example(cluster):
    done = subprocess.run([PYTHON, "adaptdl_ray.py", "-f", "main.py", "-m", "3", "-u", cluster.client_address,
                           "--", "-autoscale-bsz", "--epochs", "3"], cwd=EXAMPLE, capture_output=True, text=True,
                          timeout=START_TIMEOUT)
    output = ANSI.sub("", done.stdout + done.stderr)
    assert done.returncode == 0, output[-4000:]
    assert [int(m[1]) for m in EPOCH.finditer(output)] == [0, 1, 2], output[-4000:]


@pytest.mark.slow
def test_a_job_waiting_for_the_cluster_says_what_it_waits_for(cluster, tmp_path):
    (tmp_path / "train.py").write_text("print('never started')\n")
    started = time.monotonic()
    done = adaptdl_ray("-u", cluster.client_address, "-f", str(tmp_path / "train.py"), "-m", "1", "--cpus", "64",
                       "--cluster-rescale-timeout", "3", timeout=START_TIMEOUT)
    output = ANSI.sub("", done.stdout + done.stderr)
    assert done.returncode == 1, output
    waiting = "waiting up to 3 s (--cluster-rescale-timeout) for the cluster to hold 1 worker of 64 CPUs and 0 GPUs: " \
              "it holds 0 now"
    assert output.count(waiting) == 1, output  # said once, when the wait starts
    assert "no node of the cluster can hold a worker of 64 CPUs and 0 GPUs (waited 3 s)" in output
    assert "never started" not in output and time.monotonic() - started < START_TIMEOUT
