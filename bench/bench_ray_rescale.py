"""A node crash during elastic training: trialkit's adaptdl-ray raced against Ray Train's elastic mode.

    python bench/bench_ray_rescale.py [--runs 3] [--train-before 10] [--checkpoint-every 2] [--log FILE]

One cluster as the tests build it (tests/ray_cluster.py: a head and node2, 2
CPUs each, each `ray start` its own process group), and the same job on it
for both systems: examples/adaptdl_ray/train.py's model and data (a linear
regression, 512 samples, global batch 32, 20 ms of work a step), 2 workers of
2 CPUs, so one on each node:
  trialkit:  `adaptdl-ray -m 2 --workers 2 --checkpoint-every N` running train.py
             unchanged (AdaptDL checkpoints through trialkit's hook);
  Ray Train: a TorchTrainer (Ray Train V2, the default in Ray 2.60) with
             `ScalingConfig(num_workers=(1, 2))`, its elastic range, and
             `FailureConfig(max_failures=10)`, whose loop trains the same model on
             the same data in the same global batches (DDP over gloo) and reports
             a checkpoint with `ray.train.report(checkpoint=...)` every N seconds,
             at a step that rank 0 picks and broadcasts (as AdaptDL's replicas
             agree on theirs); after a restart it resumes at the checkpoint's
             batch. `--checkpoint-every 0`: neither system checkpoints.
A sample: a fresh job; once it trains on 2 workers (Ray Train may start on 1
while the node2 just started is not in its view yet, and grows at its next
resize check, 60 s), --train-before seconds of training; then every process
of node2 SIGKILLed at once. Measured from the
kill, as each system's own output shows it (Ray's log forwarding included):
  - training again: rank 0's "starting at epoch" of the restart on 1 worker
    (the checkpoint is loaded; the first step follows);
  - back at the step of the kill: rank 0's line for the epoch that was in
    progress at the kill (an epoch is 16 steps, about 0.4 s).
Then the job is stopped, the cluster checked clean and node2 started again.
Samples alternate which system goes first. Printed: each sample, the medians,
the ratios trialkit / Ray Train, and the goals: training again in <= 0.5x Ray
Train's time (issue 18), back at the step of the kill in <= 0.15x (issue 21).
Exit status 0 when both are MET.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "adaptdl_ray"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from trialkit.process import spawn  # noqa: E402

GOAL_AGAIN = 0.5  # of Ray Train's time, issue 18
GOAL_BACK = 0.15  # of Ray Train's time, issue 21
WAIT = 300.0  # for any one event, on a loaded machine
STOP_WAIT = 60.0
SAMPLES, BATCH, STEP_SECONDS = 512, 32, 0.02
MAX_FAILURES = 10
EPOCH = re.compile(r"\bepoch (\d+) loss")
TRIALKIT_RESTART = re.compile(r"adaptdl-ray .*restart (\d+): (\d+) worker")
TRIALKIT_STARTING = re.compile(r"\(rank 0 .*starting at epoch (\d+)")
RAY_TRAIN_STARTING = re.compile(r"rank 0 starting at epoch (\d+) step \d+ with (\d+) worker")


class Job:
    """One system's job in the background, in its own process group; every output line with its arrival time."""

    def __init__(self, command: List[str]):
        self.lines: List[Tuple[float, str]] = []
        # Should the bench die, the job is told to stop as a user's Ctrl-C would.
        self.proc = spawn(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          parent_death_signal=signal.SIGTERM).popen
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            line = re.sub(r"\x1b\[[0-9;]*m", "", raw.decode(errors="replace").rstrip())
            self.lines.append((time.monotonic(), line))

    def after(self, since: float, pattern: re.Pattern, what: str) -> Tuple[float, re.Match]:
        """The first line at or after `since` that matches."""
        deadline = time.monotonic() + WAIT
        seen = 0
        while time.monotonic() < deadline:
            lines = self.lines[seen:]
            for at, line in lines:
                match = pattern.search(line) if at >= since else None
                if match:
                    return at, match
            seen += len(lines)
            if self.proc.poll() is not None and seen == len(self.lines):
                break
            time.sleep(0.05)
        tail = "\n".join(line for _, line in self.lines[-40:])
        raise RuntimeError(f"no {what}; the job's last lines:\n{tail}")

    def last_epoch(self, before: float) -> int:
        return max((int(m[1]) for at, line in list(self.lines) if at < before for m in [EPOCH.search(line)] if m),
                   default=-1)

    def stop(self) -> None:
        """SIGINT (each system's own graceful stop), then SIGKILL to its process group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(STOP_WAIT)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its session: whatever it left behind
        except ProcessLookupError:
            pass
        self.proc.wait()


class System:
    name = ""

    def __init__(self, every: float):
        self.every = every
        self.log: List[Tuple[float, str]] = []  # every job's lines, for --log


class Trialkit(System):
    name = "trialkit"

    def start(self, cluster, root: Path) -> Job:
        return Job([sys.executable, "-m", "trialkit.ray.adaptdl_ray", "-u", cluster.client_address, "-f", "train.py",
                    "--working-dir", str(EXAMPLE), "-m", "2", "--workers", "2", "--cpus", "2",
                    "--checkpoint-timeout", "30", "--cluster-rescale-timeout", "2",
                    "--checkpoint-every", f"{self.every:g}",
                    "--", "--epochs", "1000000", "--samples", str(SAMPLES), "--step-seconds", f"{STEP_SECONDS:g}"])

    def training(self, job: Job, since: float, workers: int) -> float:
        """When the first restart after `since` on `workers` workers began training."""
        while True:
            at, match = job.after(since, TRIALKIT_RESTART, f"restart on {workers} workers")
            if int(match[2]) == workers:
                return job.after(at, TRIALKIT_STARTING, "training after the restart")[0]
            since = at + 1e-6


class RayTrain(System):
    name = "Ray Train"

    def start(self, cluster, root: Path) -> Job:
        return Job([sys.executable, __file__, "--ray-train-driver", cluster.address, "--checkpoint-every",
                    f"{self.every:g}", "--storage", str(root / "ray-train")])

    def training(self, job: Job, since: float, workers: int) -> float:
        while True:
            at, match = job.after(since, RAY_TRAIN_STARTING, f"training on {workers} workers")
            if int(match[2]) == workers:
                return at
            since = at + 1e-6


def ray_train_loop(config: dict) -> None:
    """Ray Train's worker: train.py's model on the same global batches, checkpointed every config["every"] s."""
    import math
    import tempfile
    import time

    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    from train import FEATURES, synthetic  # examples/adaptdl_ray/train.py, Ray's working dir

    context = ray.train.get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(0)
    net = torch.nn.Linear(FEATURES, 1)  # train.py's model
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)  # train.py's default
    state = {"epoch": 0, "batch": 0, "step": 0, "loss": 0.0, "samples": 0}
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            saved = torch.load(os.path.join(directory, "state.pt"))
        net.load_state_dict(saved.pop("model"))
        optimizer.load_state_dict(saved.pop("optimizer"))
        state.update(saved)
    net = ray.train.torch.prepare_model(net)  # DDP across the workers (none on one)
    data = synthetic(SAMPLES)
    batches = SAMPLES // BATCH
    if rank == 0:
        print(f"rank 0 starting at epoch {state['epoch']} step {state['step']} with {size} workers", flush=True)
    def next_due() -> float:  # 0: no checkpoints, as TRIALKIT_CHECKPOINT_EVERY=0 for trialkit
        return time.monotonic() + config["every"] if config["every"] > 0 else math.inf

    due = torch.zeros(1)
    checkpoint_at = next_due()
    while True:
        # The same global batches whatever the number of workers: a restart on
        # another number resumes at the checkpoint's batch, as AdaptDL does.
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(state["epoch"]))
        while state["batch"] < batches:
            indices = order[state["batch"] * BATCH:(state["batch"] + 1) * BATCH][rank::size]
            x, y = data[indices]
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            optimizer.step()
            time.sleep(STEP_SECONDS)
            state["loss"] += loss.item() * len(x)
            state["samples"] += len(x)
            state["batch"] += 1
            state["step"] += 1
            due[0] = float(rank == 0 and time.monotonic() >= checkpoint_at)
            if size > 1:
                dist.broadcast(due, 0)  # rank 0's clock decides: all workers report at the same step
            if due[0]:
                totals = torch.tensor([state["loss"], float(state["samples"])])
                with tempfile.TemporaryDirectory() as directory:
                    saved = None
                    if rank == 0:
                        module = net.module if hasattr(net, "module") else net
                        torch.save(dict(state, model=module.state_dict(), optimizer=optimizer.state_dict()),
                                   os.path.join(directory, "state.pt"))
                        saved = ray.train.Checkpoint.from_directory(directory)
                    ray.train.report({"step": state["step"], "samples": float(totals[1])}, checkpoint=saved)
                checkpoint_at = next_due()
        totals = torch.tensor([state["loss"], float(state["samples"])])
        if size > 1:
            dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {state['epoch']} loss {totals[0] / totals[1]:.6f} replicas {size} "
                  f"samples {int(totals[1])}", flush=True)
        state.update(epoch=state["epoch"] + 1, batch=0, loss=0.0, samples=0)


def ray_train_driver(address: str, every: float, storage: str) -> None:
    """The Ray Train job, run as its own driver on the head node (`ray.init` prefers the head on a shared host)."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=address, runtime_env={"working_dir": str(EXAMPLE)})
    trainer = TorchTrainer(
        ray_train_loop, train_loop_config={"every": every},
        scaling_config=ScalingConfig(num_workers=(1, 2), resources_per_worker={"CPU": 2}),
        run_config=RunConfig(name=f"bench-{os.getpid()}", storage_path=storage,
                             failure_config=FailureConfig(max_failures=MAX_FAILURES),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)))
    trainer.fit()


def wait_clean(cluster, timeout: float = 120.0) -> None:
    """Until no live actor holds CPUs: the last job's are gone, the next finds the cluster as it was.
    (Ray Train leaves a detached actor of no resources, its autoscaling coordinator, for good.)"""
    from ray.util.state import list_actors

    deadline = time.monotonic() + timeout
    while True:
        left = [f"{a.class_name} {a.state}" for a in list_actors(address=cluster.dashboard_url, detail=True,
                                                                 filters=[("state", "!=", "DEAD")])
                if a.required_resources.get("CPU")]
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("left on the Ray cluster after the job stopped: " + "; ".join(left))
        time.sleep(1.0)


def sample(system, cluster, root: Path, train_before: float) -> Dict[str, float]:
    if "node2" not in cluster.nodes:
        cluster.start_node("node2")
    job = system.start(cluster, root)
    try:
        system.training(job, 0.0, 2)
        time.sleep(train_before)
        killed = time.monotonic()
        load = os.getloadavg()[0]
        cluster.crash_node("node2")
        at_kill = job.last_epoch(killed) + 1  # the epoch in progress when node2 died
        again = system.training(job, killed, 1)
        since = again
        while True:
            at, match = job.after(since, EPOCH, f"epoch {at_kill} after the restart")
            if int(match[1]) >= at_kill:
                break
            since = at + 1e-6
        return {"again": again - killed, "back": at - killed, "load": load, "epoch": at_kill}
    finally:
        job.stop()
        system.log.extend(job.lines)
        wait_clean(cluster)


def verdict(ratio: float, goal: float) -> str:
    return "MET" if ratio <= goal else "MISSED"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="samples of each system (default %(default)s)")
    parser.add_argument("--train-before", type=float, default=10.0, metavar="SECONDS",
                        help="training on 2 workers before node2 is killed (default %(default)g)")
    parser.add_argument("--checkpoint-every", type=float, default=2.0, metavar="SECONDS",
                        help="both systems' checkpoint interval; 0: none (default %(default)g)")
    parser.add_argument("--log", metavar="FILE", help="write both jobs' output there, each line timed")
    parser.add_argument("--ray-train-driver", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--storage", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.ray_train_driver:
        ray_train_driver(opts.ray_train_driver, opts.checkpoint_every, opts.storage)
        return 0

    from ray_cluster import ImdsStub, RayCluster  # the tests' cluster, started and crashed the same way

    # SIGTERM unwinds like Ctrl-C, so the jobs and the cluster are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("TRIALKIT_TEST_TAG", "bench-ray-rescale")
    # Ray 2.60 turns token auth on when ~/.ray/auth_token exists (a local `ray.init()` writes
    # one); here node2 was then refused by the head (InvalidAuthToken). Neither system needs it.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    systems = [Trialkit(opts.checkpoint_every), RayTrain(opts.checkpoint_every)]
    results: Dict[str, List[Dict[str, float]]] = {system.name: [] for system in systems}
    imds = ImdsStub()
    root = Path(tempfile.mkdtemp(prefix="tkbench-", dir="/tmp"))  # short: Ray's socket paths live under it
    cluster = RayCluster(root, imds)
    try:
        cluster.start_head()
        for run in range(opts.runs):
            for system in systems if run % 2 == 0 else systems[::-1]:  # alternating which goes first
                figures = sample(system, cluster, root, opts.train_before)
                results[system.name].append(figures)
                print(f"run {run + 1} {system.name:9s}: training again {figures['again']:5.1f} s, back at the "
                      f"step of the kill {figures['back']:5.1f} s (epoch {figures['epoch']:.0f}; "
                      f"load {figures['load']:.1f})", flush=True)
    finally:
        if opts.log:
            Path(opts.log).write_text("".join(f"{at:.2f} {system.name}: {line}\n" for system in systems
                                              for at, line in system.log))
        cluster.shutdown()
        imds.close()
        shutil.rmtree(root, ignore_errors=True)
    return report(results, opts)


def report(results: Dict[str, List[Dict[str, float]]], opts: argparse.Namespace) -> int:
    def median(name: str, key: str) -> float:
        return statistics.median(s[key] for s in results[name])

    def every(name: str, key: str) -> str:
        return ", ".join(f"{s[key]:.1f}" for s in results[name])

    loads = [s["load"] for samples in results.values() for s in samples]
    checkpoints = f"checkpoints every {opts.checkpoint_every:g} s" if opts.checkpoint_every > 0 else "no checkpoints"
    print(f"\nnode2 SIGKILLed after {opts.train_before:g} s on 2 workers, {checkpoints};"
          f" medians of {opts.runs} (1-min load at the kills {min(loads):.1f}-{max(loads):.1f}, 2 cores)")
    met = True
    for key, what, goal, issue in (("again", "node loss -> training again", GOAL_AGAIN, 18),
                                   ("back", "node loss -> back at the step of the kill", GOAL_BACK, 21)):
        ours, theirs = median("trialkit", key), median("Ray Train", key)
        ratio = ours / theirs
        met = met and ratio <= goal
        print(f"  {what}: trialkit {ours:.1f} s ({every('trialkit', key)}), Ray Train {theirs:.1f} s "
              f"({every('Ray Train', key)}): {ratio:.3f}x (goal <= {goal:g}x, issue {issue}): {verdict(ratio, goal)}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
