"""The real manager under a cluster's keepers: 1,000 simulated keepers shipping over loopback.

    python bench/bench_manager.py [--keepers 1000] [--rate 50] [--seconds 30] [--processes 4]
                                  [--burners 1] [--store-dir DIR] [--baseline REV --rounds 2]

Starts `python -m trialkit.manager.server` on loopback (its own process, its
store on disk), registers one trial and token per keeper, and runs the
keepers in a few load processes (not 1,000 threads in this one): each keeper
is the real shipper (trialkit.keeper.shipper.Shipper, its own thread and
keep-alive connection) over a real Spool in a temp dir, fed by a driver that
appends `--rate` records a second in one batch every `--tick` seconds, at a
random phase per keeper, as a trial's keeper loop would. After `--seconds`
of load the drivers stop appending and the shippers deliver what is left
(bounded by `--drain`); then the store is counted.

Reported: records/s acknowledged while the load ran (against what was
offered), the acknowledgement latency of each record (from its append to the
spool to the manager's answer that covers it: p50/p99/max), the manager's
threads, RSS and CPU (psutil on its pid; also per request and per record
acknowledged, with the records a request carried on average: a manager that
falls behind gets bigger batches, so its CPU per record compares with
another's only at like batch sizes), the load processes' own CPU (what
the generator costs this machine), failed requests by kind (refused, reset,
timed out, non-200), and whether the store holds every record exactly once.
Beside the keepers runs a probe: one more keeper, alone in a process of its
own, that sends a batch of 50 every 0.1 s. Its acknowledgement p50/p99 is
what a keeper on another node would see of the manager, without the load
processes' crowd of threads (250 shippers under one GIL each) in the way.

The figures are set against the goal of issues 19 and 30, 1,000 keepers at
50 records/s each, p99 acknowledgement < 100 ms, all records/s accepted
(95% or more) and 0 lost, printed MET or MISSED, with the machine's load
average beside them: on a shared machine the generator and every other
process compete with the manager for the cores. `--burners N` is the loaded
mode: N processes that only burn CPU run beside the manager for the whole
run. `--baseline REV` races the manager of git revision REV (its trialkit/,
checked out to a temp dir; the keepers are this tree's) against this tree's,
`--rounds` rounds, the order reversed every other round: each run prints its
figures, then the manager CPU per record of each (median of its runs) and
their ratio against issue 30's goal (5x less).
Spools live on /dev/shm when there is one, so that the generator's fsyncs do
not count against the manager's disk; the store is on the temp dir's disk, or
in `--store-dir` (/dev/shm there shows what the disk costs the manager).
"""
from __future__ import annotations

import argparse
import collections
import heapq
import multiprocessing
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from trialkit import records  # noqa: E402
from trialkit.keeper.shipper import Shipper  # noqa: E402
from trialkit.keeper.spool import Spool  # noqa: E402
from trialkit.manager.store import Store, new_token  # noqa: E402

GOAL_KEEPERS, GOAL_RATE, GOAL_P99_MS = 1000, 50, 100.0
GOAL_CPU_RATIO = 5.0  # issue 30: the manager's CPU per record, 5x less than before
PROBE_TICK, PROBE_RATE = 0.1, 500  # the probe keeper (see above): a batch of 50 every 0.1 s, 1% more records


class TimedSpool(Spool):
    """A real spool that notes when each appended batch is first covered by an ack."""

    def __init__(self, directory: Path):
        super().__init__(directory)
        self.pending: collections.deque = collections.deque()  # (last seq, records, append time)
        self.latencies: List[Tuple[float, int]] = []  # (seconds, records)

    def append(self, recs: List[Dict[str, Any]], cursor: Dict[str, Any]) -> None:
        start = time.monotonic()
        super().append(recs, cursor)
        with self.cond:
            self.pending.append((self.last_seq, len(recs), start))

    def ack(self, seq: int) -> None:
        super().ack(seq)
        now = time.monotonic()
        with self.cond:
            while self.pending and self.pending[0][0] <= seq:
                _, count, start = self.pending.popleft()
                self.latencies.append((now - start, count))


class CountingShipper(Shipper):
    """The real shipper, counting each failed request by kind (it logs only changes of state)."""

    def __init__(self, *args: Any, failures: collections.Counter, **kwargs: Any):
        super().__init__(*args, log=lambda message: None, **kwargs)
        self.failures = failures
        self.requests = 0  # answered or not

    def _post(self, connection, batch):
        self.requests += 1
        try:
            status, answer = super()._post(connection, batch)
        except Exception as err:
            self.failures[type(err).__name__] += 1
            raise
        if status != 200:
            self.failures[f"HTTP {status}"] += 1
        return status, answer


def load_process(url: str, trials: List[Tuple[str, str]], spool_root: str, rate: int, tick: float,
                 start_at: float, seconds: float, drain: float, results: Any) -> None:
    """One load process: its share of the keepers, driven from one thread, shipped by one thread each."""
    failures: collections.Counter = collections.Counter()
    keepers = []
    for trial_id, token in trials:
        spool = TimedSpool(Path(spool_root) / trial_id)
        keepers.append((trial_id, spool, CountingShipper(spool, url, trial_id, token, failures=failures).start()))
    per_tick = max(1, round(rate * tick))
    template = records.normalize({"type": records.PERIODICAL, "value": 0.5, "sequence": 0, "time": time.time(),
                                  "parameter_id": 0}, "trial", 0)
    rng = random.Random(os.getpid())
    time.sleep(max(0.0, start_at - time.time()))
    begin = time.monotonic()
    end = begin + seconds
    due = [(begin + rng.uniform(0, tick), index, 0) for index in range(len(keepers))]
    heapq.heapify(due)
    behind = 0
    while due:
        when, index, sequence = heapq.heappop(due)
        if when >= end:
            continue
        delay = when - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -tick:
            behind += 1  # the generator itself could not keep the pace
        recs = [dict(template, sequence=sequence + i, value=rng.random(), time=time.time()) for i in range(per_tick)]
        keepers[index][1].append(recs, {"offset": sequence + per_tick})
        heapq.heappush(due, (when + tick, index, sequence + per_tick))
    load_end = time.monotonic()
    acked_in_load = sum(sum(count for lat, count in spool.latencies) for _, spool, _ in keepers)
    requests_in_load = sum(shipper.requests for _, _, shipper in keepers)
    left = sum(shipper.close(time.monotonic() + drain) for _, _, shipper in keepers)
    results.put({
        "appended": {trial_id: spool.last_seq for trial_id, spool, _ in keepers},
        "latencies": [item for _, spool, _ in keepers for item in spool.latencies],
        "acked_in_load": acked_in_load, "requests_in_load": requests_in_load, "load_seconds": load_end - begin,
        "left": left,
        "failures": dict(failures), "behind": behind,
    })
    for _, spool, _ in keepers:
        spool.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(samples: List[Tuple[float, int]], fraction: float) -> float:
    """The value below which `fraction` of the weighted samples lie."""
    samples = sorted(samples)
    total = sum(count for _, count in samples)
    seen = 0
    for value, count in samples:
        seen += count
        if seen >= fraction * total:
            return value
    return samples[-1][0] if samples else float("nan")


class Sampler(threading.Thread):
    """The manager's threads, RSS and CPU, and the load processes' CPU, once a second."""

    def __init__(self, manager: psutil.Process):
        super().__init__(daemon=True)
        self.manager = manager
        self.threads: List[int] = []
        self.rss: List[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                self.threads.append(self.manager.num_threads())
                self.rss.append(self.manager.memory_info().rss)
            except psutil.Error:
                return


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def burn() -> None:
    """A process that only burns CPU (the loaded mode), until it is terminated."""
    while True:
        pass


def checkout(revision: str) -> Path:
    """trialkit/ of a git revision in a temp dir (the baseline's manager runs from there)."""
    root = Path(tempfile.mkdtemp(prefix="bench-manager-baseline-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "trialkit"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keepers", type=int, default=GOAL_KEEPERS)
    parser.add_argument("--rate", type=int, default=GOAL_RATE, help="records a second per keeper")
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between a keeper's appends")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of load")
    parser.add_argument("--drain", type=float, default=30.0, help="seconds to deliver what is left after the load")
    parser.add_argument("--processes", type=int, default=4, help="load processes the keepers are spread over")
    parser.add_argument("--burners", type=int, default=0, help="CPU-burning processes beside the manager (loaded)")
    parser.add_argument("--store-dir", help="where the manager's store is made (default: the temp dir; /dev/shm "
                                            "leaves the disk out)")
    parser.add_argument("--baseline", metavar="REV", help="race the manager of this git revision, alternating")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the race with --baseline")
    opts = parser.parse_args()
    if opts.store_dir is not None and not os.path.isdir(opts.store_dir):
        parser.error(f"--store-dir {opts.store_dir}: no such directory; give one that exists (e.g. /dev/shm)")
    burners = [multiprocessing.get_context("fork").Process(target=burn, daemon=True) for _ in range(opts.burners)]
    for burner in burners:
        burner.start()
    baseline = checkout(opts.baseline) if opts.baseline else None
    try:
        if baseline is None:
            run(opts, ROOT)
            return 0
        per_record: Dict[str, List[float]] = {"baseline": [], "this tree": []}
        sizes: Dict[str, List[float]] = {"baseline": [], "this tree": []}
        for r in range(opts.rounds):
            order = [("baseline", baseline), ("this tree", ROOT)]
            for name, root in order if r % 2 == 0 else reversed(order):
                print(f"-- round {r + 1}: {name} ({opts.baseline if root is baseline else 'working tree'})",
                      flush=True)
                cpu, size = run(opts, root)
                per_record[name].append(cpu)
                sizes[name].append(size)
        before, after = (statistics.median(per_record[name]) for name in ("baseline", "this tree"))
        ratio = before / after
        runs = ", ".join(f"{b:.2f}/{a:.2f}" for b, a in zip(per_record["baseline"], per_record["this tree"]))
        batches = ", ".join(f"{b:.0f}/{a:.0f}" for b, a in zip(sizes["baseline"], sizes["this tree"]))
        print(f"manager CPU per record, median of {opts.rounds} runs each: {opts.baseline} {before:.2f} us, "
              f"this tree {after:.2f} us; {ratio:.2f}x less (runs: {runs}; records a request: {batches}); "
              f"goal >= {GOAL_CPU_RATIO:g}x: {'MET' if ratio >= GOAL_CPU_RATIO else 'MISSED'}")
        return 0
    finally:
        for burner in burners:
            burner.terminate()
            burner.join()
        if baseline is not None:
            shutil.rmtree(baseline, ignore_errors=True)


def run(opts: argparse.Namespace, manager_root: Path) -> Tuple[float, float]:
    """One run against the manager of `manager_root`; prints its figures and returns its CPU per record (us) and
    the records acknowledged a request."""
    work = Path(tempfile.mkdtemp(prefix="bench-manager-", dir=opts.store_dir))
    spool_root = Path(tempfile.mkdtemp(prefix="bench-manager-spools-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                       else None))
    manager = None
    try:
        store = Store.in_dir(work)
        store.create_experiment("exp")
        trials = [(f"trial-{i:05d}", new_token()) for i in range(opts.keepers)]
        probe = ("probe", new_token())
        for sequence, (trial_id, token) in enumerate(trials + [probe]):
            store.add_trial("exp", trial_id, sequence=sequence, parameters={}, token=token)
        store.close()

        environ = dict(os.environ, PYTHONPATH=str(manager_root))
        port = free_port()
        manager = subprocess.Popen([sys.executable, "-m", "trialkit.manager.server", "--experiment-dir", str(work),
                                    "--port", str(port)], env=environ, cwd=manager_root, stdout=subprocess.PIPE,
                                   text=True, start_new_session=True)
        line = manager.stdout.readline()
        if not line.startswith("listening on"):
            raise SystemExit(f"the manager did not start: {line!r}")
        url = line.split()[-1]
        proc = psutil.Process(manager.pid)
        rss_idle = proc.memory_info().rss

        context = multiprocessing.get_context("fork")
        results = context.Queue()
        start_at = time.time() + 3.0 + opts.keepers / 500  # every process has built its keepers by then
        workers = [context.Process(target=load_process, args=(url, trials[i::opts.processes], str(spool_root),
                                                               opts.rate, opts.tick, start_at, opts.seconds,
                                                               opts.drain, results))
                   for i in range(opts.processes)]
        workers.append(context.Process(target=load_process, args=(url, [probe], str(spool_root), PROBE_RATE,
                                                                   PROBE_TICK, start_at, opts.seconds, opts.drain,
                                                                   results)))
        for worker in workers:
            worker.start()
        time.sleep(max(0.0, start_at - time.time()))
        load_before = os.getloadavg()
        manager_cpu = cpu_seconds(proc)
        worker_procs = [psutil.Process(worker.pid) for worker in workers]
        worker_cpu = sum(cpu_seconds(p) for p in worker_procs)
        psutil.cpu_percent()
        sampler = Sampler(proc)
        sampler.start()
        time.sleep(opts.seconds)
        manager_cpu = cpu_seconds(proc) - manager_cpu
        worker_cpu = sum(cpu_seconds(p) for p in worker_procs) - worker_cpu
        machine_busy = psutil.cpu_percent()
        load_after = os.getloadavg()
        sampler.stop.set()
        parts = [results.get(timeout=opts.drain + 120) for _ in workers]
        for worker in workers:
            worker.join()

        appended: Dict[str, int] = {}
        for part in parts:
            appended.update(part["appended"])
        probe_part = next(part for part in parts if probe[0] in part["appended"])
        parts.remove(probe_part)
        store = Store.in_dir(work)
        stored = store.count_records()
        short = [t for t, last in appended.items() if store.acked_seq(t) != last or store.count_records(t) != last]
        store.close()
        offered = sum(appended.values())
        probe_p50, probe_p99 = (percentile(probe_part["latencies"], f) * 1e3 for f in (0.50, 0.99))
        latencies = [item for part in parts for item in part["latencies"]]
        load_seconds = max(part["load_seconds"] for part in parts)
        accepted = sum(part["acked_in_load"] for part in parts) / load_seconds
        failures: collections.Counter = collections.Counter()
        for part in parts:
            failures.update(part["failures"])
        p50, p99 = percentile(latencies, 0.50) * 1e3, percentile(latencies, 0.99) * 1e3
        worst = max(value for value, _ in latencies) * 1e3 if latencies else float("nan")
        lost = offered - stored

        acked_records = accepted * load_seconds + probe_part["acked_in_load"]
        requests = max(1, sum(part["requests_in_load"] for part in parts + [probe_part]))
        per_record = manager_cpu / max(1.0, acked_records) * 1e6
        print(f"machine: {os.cpu_count()} cores, load average {load_before[0]:.1f} before, {load_after[0]:.1f} "
              f"after; cores busy {machine_busy:.0f}% during the load; {opts.burners} CPU burners beside")
        print(f"keepers: {opts.keepers} in {opts.processes} load processes, {opts.rate} records/s each in batches "
              f"of {max(1, round(opts.rate * opts.tick))} every {opts.tick:g} s, {opts.seconds:g} s of load")
        print(f"load processes: {worker_cpu / load_seconds:.2f} cores "
              f"({sum(part['behind'] for part in parts)} appends over a tick late)")
        print(f"accepted: {accepted:,.0f} records/s acknowledged during the load "
              f"(offered {opts.keepers * opts.rate:,})")
        print(f"ack latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {worst:.1f} ms")
        print(f"the probe (a keeper alone in its process, {round(PROBE_RATE * PROBE_TICK)} records every "
              f"{PROBE_TICK:g} s): ack p50 {probe_p50:.1f} ms, p99 {probe_p99:.1f} ms")
        print(f"manager: threads max {max(sampler.threads, default=0)}, RSS {rss_idle / 2**20:.0f} MiB idle, "
              f"max {max(sampler.rss, default=0) / 2**20:.0f} MiB, CPU {manager_cpu / load_seconds:.2f} cores "
              f"({manager_cpu / requests * 1e3:.2f} ms a request, {acked_records / requests:.1f} records acked "
              f"a request, {per_record:.2f} us a record)")
        print("failed requests: " + (", ".join(f"{kind} {n}" for kind, n in sorted(failures.items())) or "none"))
        print(f"stored: {stored:,} of {offered:,} records appended, {lost:,} lost; "
              f"trials not acked to their last record: {len(short)}; left unacked after the drain: "
              f"{sum(part['left'] for part in parts)}")
        met = (opts.keepers >= GOAL_KEEPERS and opts.rate >= GOAL_RATE and p99 < GOAL_P99_MS and lost == 0
               and not short and accepted >= 0.95 * opts.keepers * opts.rate)
        print(f"goal: {GOAL_KEEPERS} keepers at {GOAL_RATE} records/s each, p99 ack < {GOAL_P99_MS:.0f} ms, "
              f"95% accepted, 0 lost: {'MET' if met else 'MISSED'}", flush=True)
        return per_record, acked_records / requests
    finally:
        if manager is not None and manager.poll() is None:
            os.killpg(manager.pid, signal.SIGTERM)
            try:
                manager.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(manager.pid, signal.SIGKILL)
                manager.wait()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(spool_root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
