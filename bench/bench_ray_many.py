"""Many trials at once on Ray, raced against the local platform: 200 trials of 12 s, 50 running at once.

    python bench/bench_ray_many.py [--trials 200] [--concurrency 50] [--seconds 12] [--cpus 0.08] [--rounds 1]

One Ray cluster as the tests build it (tests/ray_cluster.py: a head and
node2, 2 CPUs each), stopped at the end even on failure (each node by its
process group). The same experiment runs through `trialkit run` as a user
runs it, on the ray platform and on the local platform (this machine), one
after the other, --rounds times (ray, local, ray, local, ...): every trial
sleeps --seconds and reports its parameter as its final result, asking Ray
for --cpus CPUs (0.08: 25 trials a node, 50 on the cluster). While each
runs, every 0.5 s the bench counts the trials running (the store's status,
which each keeper sets) and times the trial table three ways: `trialkit
trial list` as the in-process call (trialkit.cli.main), the page's trials
route (with the page's token), and, every 2 s, `trialkit trial list` as a
command (a fresh process), beside the same command for an experiment that
does not exist (its start-up alone) and a bare `python -c pass` (the
interpreter alone). At the end of each: every trial SUCCEEDED once (each
parameter once, restart count 0), and on Ray no actor alive and no keeper or
trial left on the cluster.

Printed for each run: how long the experiment took (`trialkit run` in all,
and from the first trial created to the last trial ended), the start rate
(--concurrency keepers RUNNING, counted from the first trial's creation: all
starts, no ends), peak and median running at once, the trial table's
latencies, the load average; then each goal with MET or MISSED, on the
slowest Ray run, with Ray's ratio to the local platform beside it. Goals
(issue 30): Ray starts >= 10 trials a second; the trials are done within 75
s of the first one's creation (both at the defaults: 200 of 12 s at 50); the
trial table in under 100 ms (p90).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from ray_cluster import ImdsStub, RayCluster  # noqa: E402  (the tests' cluster, started the same way)
from trialkit.cli import main as trialkit_main  # noqa: E402  (imported once: the in-process call is timed alone)

LIST_GOAL_MS = 100.0
START_GOAL = 10.0  # trials started a second, on Ray
DONE_GOAL_S = 75.0  # the 200 trials of 12 s at 50, from the first created to the last ended
SAMPLE_EVERY = 0.5
COMMAND_EVERY = 2.0  # a command costs a process start on a 2-core machine: fewer of them
CLEAN_WAIT = 60.0
TRIAL = """
import time, trialkit
p = trialkit.get_next_parameter()
time.sleep(p["seconds"])
trialkit.report_final_result(p["x"])
"""


def write_experiment(folder: Path, service: Dict[str, object], opts: argparse.Namespace) -> Path:
    folder.mkdir()
    (folder / "trial.py").write_text(TRIAL)
    space = {"x": {"_type": "choice", "_value": list(range(opts.trials))},
             "seconds": {"_type": "choice", "_value": [opts.seconds]}}
    (folder / "search_space.json").write_text(json.dumps(space))
    config = {"experimentName": "ray-many", "searchSpaceFile": "search_space.json", "trialCommand": "python3 trial.py",
              "trialCodeDirectory": ".", "trialConcurrency": opts.concurrency, "maxTrialNumber": opts.trials,
              "nniManagerIp": "127.0.0.1", "tuner": {"name": "GridSearch"},
              "trainingService": service}
    path = folder / "config.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def query(db_path: Path, sql: str) -> List[tuple]:
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)) as db:
        return db.execute(sql).fetchall()


def list_in_process(experiment: str) -> float:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = trialkit_main(["trial", "list", experiment])
    elapsed = time.perf_counter() - start
    assert code == 0, f"trial list exited {code}"
    return elapsed * 1000


def list_command(*args: str) -> float:
    start = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("trialkit")), "trial", "list", *args],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return (time.perf_counter() - start) * 1000


def page_trials(experiment_dir: Path, experiment: str) -> Optional[float]:
    """The page's trial table as the page asks for it (its token, its route); None while no manager listens."""
    from trialkit.control.admin import read_info
    from trialkit.web import address

    info = read_info(experiment_dir)
    if info is None:
        return None
    request = urllib.request.Request(f"{info.url}/api/ui/experiments/{experiment}/trials",
                                     headers={"Authorization": f"Bearer {address.page_token(info.token)}"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
    except OSError:
        return None  # the experiment ended and its manager with it
    return (time.perf_counter() - start) * 1000


def bare_interpreter() -> float:
    """The floor under any command: this Python starting and doing nothing, on the machine as loaded."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=False)
    return (time.perf_counter() - start) * 1000


class Sampler:
    """Counts running trials and times trial list, in a thread, until stopped."""

    def __init__(self, db_path: Path, experiment: str):
        self.db_path, self.experiment = db_path, experiment
        self.running: List[tuple] = []  # (time, running, submitted)
        self.in_process: List[float] = []
        self.page: List[float] = []
        self.command: List[float] = []
        self.startup: List[float] = []
        self.interpreter: List[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_command = 0.0
        while not self._stop.wait(SAMPLE_EVERY):
            if not self.db_path.exists():
                continue
            try:
                counts = dict(query(self.db_path, "SELECT status, COUNT(*) FROM trials GROUP BY status"))
            except sqlite3.Error:
                continue  # not created yet
            self.running.append((time.monotonic(), counts.get("RUNNING", 0), sum(counts.values())))
            self.in_process.append(list_in_process(self.experiment))
            page = page_trials(self.db_path.parent, self.experiment)
            if page is not None:
                self.page.append(page)
            if time.monotonic() >= next_command:
                self.command.append(list_command(self.experiment))
                self.startup.append(list_command(self.experiment + "-nosuch"))
                self.interpreter.append(bare_interpreter())
                next_command = time.monotonic() + COMMAND_EVERY

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def p90(values: List[float]) -> float:
    ordered = sorted(values) or [float("inf")]
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def spread(values: List[float]) -> str:
    if not values:
        return "no samples"
    return (f"median {statistics.median(values):.0f} ms, p90 {p90(values):.0f} ms, max {max(values):.0f} ms "
            f"(n={len(values)})")


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def check_trials(db_path: Path, trials: int) -> List[str]:
    """What is wrong with the trials: each parameter once, SUCCEEDED, never restarted."""
    rows = query(db_path, "SELECT parameters, status, restart_count FROM trials")
    xs = sorted(json.loads(parameters)["x"] for parameters, _, _ in rows)
    problems = []
    if xs != list(range(trials)):
        problems.append(f"{len(rows)} trials, parameters {'duplicated' if len(set(xs)) < len(xs) else 'missing'}")
    bad = [(status, restarts) for _, status, restarts in rows if (status, restarts) != ("SUCCEEDED", 0)]
    if bad:
        problems.append(f"{len(bad)} trials not SUCCEEDED once: {bad[:5]}")
    return problems


def start_rate(db_path: Path, first: int) -> Optional[tuple]:
    """(seconds, trials/s, the first start's seconds, trials/s after it): from the first trial's creation
    until `first` trials' keepers said RUNNING; None if fewer ever did. The ramp is all starts, no ends:
    it is the platform's start rate here. The first start is one keeper's start while the next ones start beside
    it (Ray connects, ships the code and starts its agents before the first trial is created)."""
    created = query(db_path, "SELECT MIN(created) FROM trials")[0][0]
    running = sorted(row[0] for row in query(db_path, "SELECT MIN(time) FROM statuses WHERE status = 'RUNNING' "
                                                      "GROUP BY trial"))
    if len(running) < first:
        return None
    took = running[first - 1] - created
    return took, first / took, running[0] - created, (first - 1) / max(running[first - 1] - running[0], 1e-9)


def left_on(cluster: RayCluster) -> List[str]:
    deadline = time.monotonic() + CLEAN_WAIT
    while True:
        left = cluster.live_actors() + cluster.training_processes()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def took_trials(db_path: Path) -> float:
    """From the first trial's creation to the last trial's end, on the store's clock."""
    created = query(db_path, "SELECT MIN(created) FROM trials")[0][0]
    ended = query(db_path, "SELECT MAX(time) FROM statuses WHERE status IN ('SUCCEEDED', 'FAILED', "
                           "'USER_CANCELED', 'EARLY_STOPPED', 'SYS_CANCELED')")[0][0]
    return ended - created


def run(opts: argparse.Namespace, root: Path, name: str, service: Dict[str, object],
        cluster: Optional[RayCluster]) -> Dict[str, object]:
    """One experiment on one platform; what it measured, and what went wrong ("problems")."""
    home = root / f"home-{name}"
    home.mkdir()
    # The local platform's trials take slots of the home's default pool, one a CPU unless pools.yml says:
    # the peer runs --concurrency at once, as Ray does.
    (home / "pools.yml").write_text(yaml.safe_dump({"pools": {"default": {"slots": opts.concurrency}}}))
    environ = dict(os.environ, TRIALKIT_HOME=str(home))
    os.environ["TRIALKIT_HOME"] = str(home)  # the in-process trial list reads the same experiments
    config = write_experiment(root / f"exp-{name}", service, opts)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "trialkit.cli", "run", str(config)], env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    sampler: Optional[Sampler] = None
    try:
        experiment = proc.stdout.readline().split()[-1]
        db_path = home / "experiments" / experiment / "trialkit.db"
        sampler = Sampler(db_path, experiment)
        out, err = proc.communicate(timeout=opts.timeout)
    finally:
        if sampler is not None:
            sampler.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    took = time.monotonic() - started
    load = os.getloadavg()[0]
    problems = check_trials(db_path, opts.trials)
    if proc.returncode != 0:
        problems.append(f"trialkit run exited {proc.returncode}:\n{out[-2000:]}\n{err[-2000:]}")
    left = left_on(cluster) if cluster is not None else []
    if left:
        problems.append("left on the cluster: " + "; ".join(left[:5]))

    counts = [running for _, running, _ in sampler.running]
    peak = max(counts, default=0)
    reached = next((i for i, c in enumerate(counts) if c >= opts.concurrency), None)
    last_submit = max((i for i, (_, _, submitted) in enumerate(sampler.running) if submitted < opts.trials),
                      default=len(counts) - 1)
    window = counts[reached:last_submit + 1] if reached is not None and reached <= last_submit else counts
    ramp = start_rate(db_path, opts.concurrency)
    span = took_trials(db_path)
    print(f"{name}: {opts.trials} trials of {opts.seconds:g} s, trialConcurrency {opts.concurrency}: "
          f"trialkit run {took:.1f} s, first trial created to last ended {span:.1f} s, load average {load:.1f}")
    print(f"  trials: {'every one SUCCEEDED once' if not problems else '; '.join(problems)}")
    print(f"  start: {opts.concurrency} keepers RUNNING " + (f"{ramp[0]:.1f} s after the first trial was created "
          f"({ramp[1]:.2f} trials started a second; the first RUNNING after {ramp[2]:.1f} s, then {ramp[3]:.2f} a second)"
          if ramp else "never"))
    print(f"  running at once: peak {peak}, median {statistics.median(window) if window else 0:g}")
    print(f"  trial list in process:      {spread(sampler.in_process)}")
    print(f"  the page's trial table:     {spread(sampler.page)}")
    print(f"  trial list as a command:    {spread(sampler.command)}")
    print(f"  of which the start-up:      {spread(sampler.startup)} (`trialkit trial list` of no experiment)")
    print(f"  of which the interpreter:   {spread(sampler.interpreter)} (`python -c pass`)")
    return {"rate": ramp[1] if ramp else 0.0, "span": span, "problems": problems,
            "list_p90": max(p90(sampler.in_process), p90(sampler.page))}


def goals(opts: argparse.Namespace, ray_runs: List[Dict[str, object]], local_runs: List[Dict[str, object]]) -> bool:
    """Each goal on the slowest Ray run, with Ray's ratio to the local platform's slowest beside it."""
    rate = min(r["rate"] for r in ray_runs)
    span = max(r["span"] for r in ray_runs)
    local_rate = min(r["rate"] for r in local_runs)
    local_span = max(r["span"] for r in local_runs)
    listing = max(r["list_p90"] for r in ray_runs)
    print(f"goals, on the slowest of {len(ray_runs)} Ray run(s), beside the local platform's slowest:")
    print(f"  start rate: ray {rate:.2f}/s, local {local_rate:.2f}/s (ray/local {rate / local_rate:.2f}x) "
          f"(goal >= {START_GOAL:g}/s: {verdict(rate >= START_GOAL)})")
    met_rate, met_span = rate >= START_GOAL, span <= DONE_GOAL_S
    print(f"  {opts.trials} trials of {opts.seconds:g} s at {opts.concurrency}: ray {span:.1f} s, local {local_span:.1f} s "
          f"(ray/local {span / local_span:.2f}x) (goal <= {DONE_GOAL_S:g} s: {verdict(met_span)})")
    print(f"  trial table, in process and the page's: p90 {listing:.0f} ms "
          f"(goal < {LIST_GOAL_MS:g} ms: {verdict(listing < LIST_GOAL_MS)})")
    return met_rate and met_span


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=12.0, help="how long each trial runs")
    parser.add_argument("--cpus", type=float, default=0.08, help="cpusPerTrial")
    parser.add_argument("--rounds", type=int, default=1, help="ray then local, this many times")
    parser.add_argument("--timeout", type=float, default=1200.0, help="for each experiment")
    opts = parser.parse_args()
    imds = ImdsStub()
    # Short: Ray's socket paths live under it and must fit a Unix socket name.
    root = Path(tempfile.mkdtemp(prefix="tkbench-", dir="/tmp"))
    cluster = RayCluster(root, imds)
    runs: Dict[str, List[Dict[str, object]]] = {"ray": [], "local": []}
    try:
        cluster.start_head()
        cluster.start_node("node2")
        for round_ in range(opts.rounds):
            ray_service = {"platform": "ray", "address": cluster.address, "cpusPerTrial": opts.cpus}
            runs["ray"].append(run(opts, root, f"ray-{round_ + 1}", ray_service, cluster))
            runs["local"].append(run(opts, root, f"local-{round_ + 1}", {"platform": "local"}, None))
        ok = goals(opts, runs["ray"], runs["local"])
    finally:
        nodes = list(cluster.nodes.values())
        try:
            cluster.shutdown()
        finally:
            for node in nodes:  # each `ray start` leads its own session: whatever shutdown left goes with it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGKILL)
            imds.close()
            shutil.rmtree(root, ignore_errors=True)
    return 0 if ok and not any(r["problems"] for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
