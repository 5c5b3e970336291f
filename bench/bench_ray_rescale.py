"""Rescale latency of adaptdl-ray on a local Ray cluster: from a node's loss to training resumed.

    python bench/bench_ray_rescale.py [--runs 5] [--kinds stop,spot,crash] [--checkpoint-every SECONDS]
                                      [--train-before SECONDS]

One cluster as the tests build it (tests/ray_cluster.py: a head and node2, 2
CPUs each) and one long adaptdl-ray job on examples/adaptdl_ray/train.py with
2-CPU workers, so 2 workers while node2 is there and 1 without it. Each run
takes node2 away one way, then brings a new node2 and waits for the job to be
back at 2 workers:
  stop:  SIGTERM to node2's `ray start` (as `ray stop` or a pod deletion does):
         Ray drains the node, the job checkpoints and goes on without it;
  spot:  the node's metadata service (a stub) posts a spot termination notice;
  crash: every process of node2 SIGKILLed at once; no checkpoint can be taken,
         the job resumes from rank 0's newest periodic one (--checkpoint-every,
         passed to adaptdl-ray), else from the one of its previous restart.
A sample is the time from the event to rank 0's "starting at epoch" line of
the next restart (AdaptDL has loaded the checkpoint; the first step follows),
as adaptdl-ray's output shows it (Ray's log forwarding included), and the time
until the job is back at the epoch it was in at the event ("caught up": the
work the event cost, redone). Printed: the median per kind and its stages.
Goal: under 15 s to resume (adaptdl-ray 0.2.11 waits 60 s after a failure).
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
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from ray_cluster import ImdsStub, RayCluster  # noqa: E402  (the tests' cluster, started the same way)

GOAL_SECONDS = 15.0
WAIT = 300.0  # for any one step, on a loaded machine
STARTING = re.compile(r"\(rank 0 .*starting at epoch (\d+)")
EPOCH = re.compile(r"\(rank 0 .*epoch (\d+) loss")
RESTART = re.compile(r"adaptdl-ray .*restart (\d+): (\d+) worker")
# Stages, by the controller's line that ends each (the last ends at STARTING).
STAGES = (("noticed", ("is being drained", "spot notice", "is gone", "was lost", "exited with code", "ended by")),
          ("checkpoint", ("took rank 0's checkpoint", "left no checkpoint")),
          ("restarted", ("starting afresh", "starting from the checkpoint")))


class Job:
    """adaptdl-ray in the background; every output line with the moment it arrived."""

    def __init__(self, cluster: RayCluster, checkpoint_every: Optional[float]):
        every = [] if checkpoint_every is None else ["--checkpoint-every", f"{checkpoint_every:g}"]
        command = [sys.executable, "-m", "trialkit.ray.adaptdl_ray", "-u", cluster.client_address, "-f", "train.py",
                   "--working-dir", str(ROOT / "examples" / "adaptdl_ray"), "-m", "2", "--workers", "2", "--cpus", "2",
                   "--checkpoint-timeout", "30", "--cluster-rescale-timeout", "2", *every,
                   "--", "--epochs", "1000000", "--step-seconds", "0.02"]
        self.lines: List[Tuple[float, str]] = []
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), re.sub(r"\x1b\[[0-9;]*m", "", line.rstrip())))

    def after(self, since: float, pattern: re.Pattern, what: str) -> Tuple[float, re.Match]:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                match = pattern.search(line) if at >= since else None
                if match:
                    return at, match
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = "\n".join(line for _, line in self.lines[-40:])
        raise RuntimeError(f"no {what} after the event; adaptdl-ray's last lines:\n{tail}")

    def first_line(self, since: float, texts: Tuple[str, ...]) -> Optional[float]:
        return next((at for at, line in list(self.lines) if at >= since and "adaptdl-ray" in line
                     and any(t in line for t in texts)), None)

    def last_epoch(self, before: float) -> int:
        return max((int(m[1]) for at, line in list(self.lines) if at < before for m in [EPOCH.search(line)] if m),
                   default=0)

    def resumed_with(self, since: float, workers: int) -> float:
        """When the first restart after `since` with `workers` workers began training."""
        while True:
            at, match = self.after(since, RESTART, f"restart with {workers} workers")
            if int(match[2]) == workers:
                return self.after(at, STARTING, "training resumed")[0]
            since = at + 1e-6

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def take_node2_away(kind: str, cluster: RayCluster) -> float:
    """Do it; return when it began."""
    began = time.monotonic()
    if kind == "stop":
        threading.Thread(target=cluster.stop_node, args=("node2",), daemon=True).start()
    elif kind == "spot":
        cluster.imds.notices["node2"] = {"action": "terminate", "time": "now"}
    else:
        cluster.crash_node("node2")
    return began


def bring_node2_back(kind: str, cluster: RayCluster) -> None:
    if kind == "stop":
        while "node2" in cluster.nodes:  # the stopping thread is still at it
            time.sleep(0.1)
    elif kind == "spot":
        cluster.stop_node("node2")  # excluded for good: a fresh node replaces it
        cluster.imds.notices.clear()
    cluster.start_node("node2")


def sample(kind: str, cluster: RayCluster, job: Job, train_before: float) -> Dict[str, float]:
    time.sleep(train_before)  # training on 2 workers since the last restart: what a crash can lose
    began = take_node2_away(kind, cluster)
    at_event = job.last_epoch(began)
    resumed = job.resumed_with(began, 1)
    stages, previous = {}, began
    for name, texts in STAGES:
        at = job.first_line(previous, texts)
        if at is not None:
            stages[name] = at - previous
            previous = at
    stages["resumed"] = resumed - previous
    stages["total"] = resumed - began
    since = resumed
    while True:  # back at the epoch of the event, in this restart
        at, match = job.after(since, EPOCH, f"epoch {at_event}")
        if int(match[1]) >= at_event:
            break
        since = at + 1e-6
    stages["caught up"] = at - began
    grown_from = time.monotonic()
    bring_node2_back(kind, cluster)
    job.resumed_with(grown_from, 2)
    return stages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="samples per kind (default %(default)s)")
    parser.add_argument("--kinds", default="stop,spot,crash", help="which losses to measure (default %(default)s)")
    parser.add_argument("--log", metavar="FILE", help="write adaptdl-ray's output there, each line timed")
    parser.add_argument("--checkpoint-every", type=float, metavar="SECONDS",
                        help="adaptdl-ray's periodic checkpoints (default: its own default)")
    parser.add_argument("--train-before", type=float, default=0.0, metavar="SECONDS",
                        help="training time before each event (default %(default)g)")
    opts = parser.parse_args()
    kinds = [k for k in opts.kinds.split(",") if k]
    os.environ.setdefault("TRIALKIT_TEST_TAG", "bench-ray-rescale")
    imds = ImdsStub()
    root = Path(tempfile.mkdtemp(prefix="tkbench-", dir="/tmp"))
    cluster = RayCluster(root, imds)
    results: Dict[str, List[Dict[str, float]]] = {kind: [] for kind in kinds}
    job = None
    try:
        cluster.start_head()
        cluster.start_node("node2")
        job = Job(cluster, opts.checkpoint_every)
        job.resumed_with(0.0, 2)
        for run in range(opts.runs):
            for kind in kinds:  # round-robin: the machine's load falls on every kind alike
                stages = sample(kind, cluster, job, opts.train_before)
                results[kind].append(stages)
                print(f"run {run + 1} {kind}: {stages['total']:.1f} s, caught up {stages['caught up']:.1f} s",
                      flush=True)
    finally:
        if job is not None:
            job.stop()
            if opts.log:
                Path(opts.log).write_text("".join(f"{at:.2f} {line}\n" for at, line in job.lines))
        cluster.shutdown()
        imds.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nnode gone -> training resumed, median of {opts.runs} (goal < {GOAL_SECONDS:g} s)")
    worst = 0.0
    for kind, samples in results.items():
        total = statistics.median(s["total"] for s in samples)
        worst = max(worst, total)
        stages = ", ".join(f"{name} {statistics.median(s.get(name, 0.0) for s in samples):.1f}"
                           for name in ("noticed", "checkpoint", "restarted", "resumed"))
        every = ", ".join(f"{s['total']:.1f}" for s in samples)
        caught = statistics.median(s["caught up"] for s in samples)
        print(f"  {kind:6s} {total:5.1f} s   ({stages}; all: {every}); back at the event's epoch: {caught:.1f} s")
    return 0 if worst < GOAL_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
