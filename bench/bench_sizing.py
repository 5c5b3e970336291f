"""Sizing elastic jobs by AdaptDL's goodput model, against greedy and fixed sizes.

    .venv/bin/python bench/bench_sizing.py [--nodes 16] [--slots 4] [--jobs 160] [--samples 5]

A simulated cluster of --nodes nodes with --slots GPUs each, and a stream of
--jobs AdaptDL jobs arriving at random (Poisson, busy enough that jobs queue).
Each job's scaling comes from hints in AdaptDL's own format: the profile a real
trainer sent (tests/fixtures/adaptdl_hints/linear_2replicas.json: a model that
barely scales) and edited versions of it from compute-bound to network-bound;
its speedup on N workers over K nodes is AdaptDL's adaptdl.goodput. Its work is
a number of one-worker hours (log-uniform, 0.2 to 4 h). Every policy sees the
same jobs in the same order, and a rescale costs each job --restart seconds.

Policies, all re-planned when a job arrives or ends and every minute:
  goodput  trialkit.ray.sizing.plan: Pollux's goodput-weighted allocation, with hysteresis
  greedy   adaptdl-ray before issue 22: in arrival order each job takes up to -m (8) workers
  fixed    every job gets 2 workers, in arrival order

Printed per policy: the median over --samples streams of the average job
completion time (JCT, arrival to end) and of the GPU-hours used; then the
ratio goodput/greedy and the goal (at least 30% lower average JCT) MET/MISSED.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trialkit.ray.sizing import Demand, Hints, Hysteresis, Speedup, nodes_for, plan  # noqa: E402

HINTS = ROOT / "tests" / "fixtures" / "adaptdl_hints" / "linear_2replicas.json"
MAX_WORKERS = 8  # adaptdl-ray's -m in the greedy policy, and every policy's cap
STEP = 10.0  # simulated seconds per step
REPLAN = 60.0


def profiles() -> List[Speedup]:
    """The real profile and edits of it, from network-bound to compute-bound."""
    base = json.loads(HINTS.read_text())
    out = [Speedup(Hints.parse(base))]
    for beta_c, var in ((0.0008, 0.05), (0.001, 0.1), (0.002, 0.1), (0.02, 0.5)):
        data = copy.deepcopy(base)
        data["perfParams"]["beta_c"], data["gradParams"]["var"] = beta_c, var
        data["maxBatchSize"], data["localBszBounds"], data["maxProfiledReplicas"] = 1024, [8, 64], 4
        out.append(Speedup(Hints.parse(data)))
    return out


@dataclass
class SimJob:
    name: str
    arrival: float
    work: float  # one-worker seconds
    speedup: Speedup
    done: float = 0.0
    workers: int = 0
    restarting_until: float = 0.0
    end: float = math.nan
    gpu_seconds: float = 0.0


@dataclass
class Result:
    avg_jct_hours: float
    gpu_hours: float
    makespan_hours: float = 0.0
    rescales: int = 0


def stream(seed: int, count: int, models: List[Speedup], mean_gap: float) -> List[SimJob]:
    rng = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(count):
        t += rng.expovariate(1.0 / mean_gap)
        work = math.exp(rng.uniform(math.log(0.2 * 3600), math.log(4 * 3600)))
        jobs.append(SimJob(f"job{i}", t, work, rng.choice(models)))
    return jobs


def goodput_policy(active: List[SimJob], node_slots: List[int], hysteresis: Hysteresis) -> Dict[str, int]:
    demands = [Demand(j.name, j.speedup, max_workers=MAX_WORKERS, current=j.workers) for j in active]
    return plan(demands, node_slots, hysteresis).workers


def greedy_policy(active: List[SimJob], node_slots: List[int], _: Hysteresis) -> Dict[str, int]:
    free, out = sum(node_slots), {}
    for job in active:  # running ones keep theirs first, then arrivals in order
        out[job.name] = min(job.workers, free) if job.workers else 0
        free -= out[job.name]
    for job in active:
        grow = min(MAX_WORKERS - out[job.name], free)
        out[job.name] += grow
        free -= grow
    return out


def fixed_policy(active: List[SimJob], node_slots: List[int], _: Hysteresis) -> Dict[str, int]:
    free, out = sum(node_slots), {}
    for job in active:
        out[job.name] = 2 if free >= 2 else 0
        free -= out[job.name]
    return out


def simulate(jobs: List[SimJob], node_slots: List[int], policy: Callable, restart: float) -> Result:
    jobs = [copy.copy(j) for j in jobs]
    hysteresis = Hysteresis(restart_seconds=restart)
    t, next_plan, pending, rescales = 0.0, 0.0, list(jobs), 0
    active: List[SimJob] = []
    while pending or active:
        changed = False
        while pending and pending[0].arrival <= t:
            active.append(pending.pop(0))
            changed = True
        if changed or t >= next_plan:
            for name, count in policy(active, node_slots, hysteresis).items():
                job = next(j for j in active if j.name == name)
                if count != job.workers:
                    if job.workers and count:
                        rescales += 1
                    job.restarting_until = t + restart
                    job.workers = count
            next_plan = t + REPLAN
        ended = False
        for job in active:
            job.gpu_seconds += job.workers * STEP
            if job.workers and t >= job.restarting_until:
                job.done += job.speedup(nodes_for(job.workers, node_slots), job.workers) * STEP
            if job.done >= job.work:
                job.end, job.workers, ended = t + STEP, 0, True
        if ended:
            active = [j for j in active if math.isnan(j.end)]
            next_plan = t + STEP  # re-plan at once: workers are free
        t += STEP
    return Result(avg_jct_hours=statistics.mean(j.end - j.arrival for j in jobs) / 3600,
                  gpu_hours=sum(j.gpu_seconds for j in jobs) / 3600,
                  makespan_hours=max(j.end for j in jobs) / 3600, rescales=rescales)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=160)
    parser.add_argument("--mean-gap", type=float, default=120.0, help="seconds between arrivals, on average")
    parser.add_argument("--restart", type=float, default=30.0, help="seconds a rescale costs a job")
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    models = profiles()
    print("profiles (speedup on 1..8 workers, one node):")
    for model in models:
        print("  " + " ".join(f"{model(1, n):.2f}" for n in range(1, 9)))
    node_slots = [args.slots] * args.nodes
    policies = {"goodput": goodput_policy, "greedy": greedy_policy, "fixed": fixed_policy}
    results: Dict[str, List[Result]] = {name: [] for name in policies}
    for sample in range(args.samples):
        jobs = stream(sample, args.jobs, models, args.mean_gap)
        order = list(policies) if sample % 2 == 0 else list(reversed(policies))
        for name in order:
            results[name].append(simulate(jobs, node_slots, policies[name], args.restart))
    print(f"\n{args.nodes} nodes x {args.slots} GPUs, {args.jobs} jobs, median of {args.samples} streams:")
    print(f"{'policy':8} {'avg JCT h':>10} {'GPU-hours':>10} {'makespan h':>11} {'rescales':>9}")
    med = {}
    for name, runs in results.items():
        med[name] = Result(*(statistics.median(getattr(r, f) for r in runs)
                             for f in ("avg_jct_hours", "gpu_hours", "makespan_hours", "rescales")))
        m = med[name]
        print(f"{name:8} {m.avg_jct_hours:10.2f} {m.gpu_hours:10.1f} {m.makespan_hours:11.2f} {m.rescales:9.0f}")
    ratio = med["goodput"].avg_jct_hours / med["greedy"].avg_jct_hours
    print(f"\ngoodput/greedy average JCT: {ratio:.2f} ({(1 - ratio) * 100:.0f}% lower); "
          f"goal: at least 30% lower: {'MET' if ratio <= 0.7 else 'MISSED'}")
    print(f"goodput/fixed average JCT: {med['goodput'].avg_jct_hours / med['fixed'].avg_jct_hours:.2f}; "
          f"GPU-hours goodput/greedy: {med['goodput'].gpu_hours / med['greedy'].gpu_hours:.2f}")


if __name__ == "__main__":
    main()
