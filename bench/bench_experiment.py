"""Small trials: trialkit against NNI 3.0's local mode, raced in the same run.

    python bench/bench_experiment.py [--trials 40] [--samples 3] [--poll 0.05] [--quickstart]

Both run the same trivial trial script on the same search space, 40 trials two
at a time with the Random tuner (the tuner is not what is measured). The
script imports `nni` where it is installed (NNI's venv, from
tools/nni_venv.sh) and `trialkit` otherwise, so each system runs with its own
SDK: it reads its parameters and reports one final result.

Each system is driven as its users drive it from a shell and timed from the
command's start until the last trial's end is known:
  trialkit: `trialkit run config.yml`, which returns when the experiment is
            done (it hears each trial's end at once, from a pidfd);
  NNI:      `nnictl create --config config.yml`, then NNI's REST API
            (/api/v1/nni/trial-jobs) polled every --poll seconds until every
            trial has ended; then `nnictl stop` (not timed).
Samples alternate which system goes first, so that the load of a shared
machine falls on both alike. Figure: trials per second, median over samples;
goal (issue 18): trialkit at least 12x NNI's. With --quickstart, the
quickstart's wall time too (examples/quickstart, 10 torch trials, TPE).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional

import requests

ROOT = Path(__file__).resolve().parent.parent
GOAL = 12.0
CONCURRENCY = 2
FINAL = {"SUCCEEDED", "FAILED", "USER_CANCELED", "SYS_CANCELED", "EARLY_STOPPED"}
SPACE = {"x": {"_type": "uniform", "_value": [0, 1]}, "units": {"_type": "choice", "_value": [8, 16, 32]}}
TRIAL = """
try:
    import nni as sdk
except ImportError:
    import trialkit as sdk
params = sdk.get_next_parameter()
sdk.report_final_result(params["x"] * params["units"])
"""


def load_now() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def prepare(workdir: Path, trials: int, trial_python: str, **extra: str) -> Path:
    """The trial script, search space and config (the same keys serve both systems), in `workdir`; the config."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "trial.py").write_text(textwrap.dedent(TRIAL))
    (workdir / "search_space.json").write_text(json.dumps(SPACE))
    config = {"searchSpaceFile": "search_space.json", "trialCommand": f"{trial_python} trial.py",
              "trialCodeDirectory": ".", "trialConcurrency": CONCURRENCY, "maxTrialNumber": trials,
              "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}},
              "trainingService": {"platform": "local"}, **extra}
    path = workdir / "config.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def run_trialkit(config: Path, trials: Optional[int], home: Path) -> float:
    """Seconds from `trialkit run` to its end; with `trials`, each of them must have succeeded."""
    env = dict(os.environ, TRIALKIT_HOME=str(home))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "trialkit.cli", "run", str(config)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.monotonic() - started
    summary = re.findall(r"experiment \S+ DONE after .* (\d+) done, 0 running, 0 failed", done.stdout)
    if done.returncode != 0 or (trials is not None and summary != [str(trials)]):
        sys.exit(f"trialkit run did not succeed in all {trials} trials ({done.returncode}):\n{done.stdout[-3000:]}")
    return seconds


def nni_python() -> str:
    done = subprocess.run(["bash", str(ROOT / "tools" / "nni_venv.sh"), sys.executable], stdout=subprocess.PIPE,
                          text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_nni(nnictl: str, config: Path, trials: int, poll: float) -> float:
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/v1/nni"
    # NNI keeps a registry of experiments under ~/nni-experiments: this run's goes in its own dir.
    env = dict(os.environ, HOME=str(config.parent))
    started = time.monotonic()
    created = subprocess.run([nnictl, "create", "--config", str(config), "--port", str(port)], cwd=config.parent,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if created.returncode != 0:
        sys.exit(f"nnictl create failed ({created.returncode}):\n{created.stdout[-3000:]}")
    session = requests.Session()
    try:
        while True:
            jobs = session.get(f"{api}/trial-jobs", timeout=30).json()
            ended = [job for job in jobs if job["status"] in FINAL]
            if len(ended) >= trials:
                seconds = time.monotonic() - started
                break
            time.sleep(poll)
        experiment = session.get(f"{api}/experiment", timeout=30).json()["id"]
    finally:
        session.close()
    subprocess.run([nnictl, "stop", experiment], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    succeeded = sum(job["status"] == "SUCCEEDED" for job in jobs)
    if succeeded != trials:
        sys.exit(f"NNI ran {trials} trials but only {succeeded} succeeded: {[job['status'] for job in jobs]}")
    return seconds


def report(times: Dict[str, List[float]], trials: int) -> bool:
    rates = {name: trials / statistics.median(seconds) for name, seconds in times.items()}
    for name, seconds in times.items():
        spread = ", ".join(f"{s:.1f}" for s in seconds)
        print(f"{name:9s}: {trials} trials, median {statistics.median(seconds):.2f} s ({spread}) = "
              f"{rates[name]:.2f} trials/s")
    ratio = rates["trialkit"] / rates["NNI 3.0"]
    met = ratio >= GOAL
    print(f"ratio    : trialkit {ratio:.1f}x NNI's trials/s (goal >= {GOAL:g}x: {'MET' if met else 'MISSED'}), "
          f"{load_now()}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40, help="trials per run (default 40)")
    parser.add_argument("--samples", type=int, default=3, help="runs of each system, alternating (default 3)")
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between NNI status polls (default 0.05)")
    parser.add_argument("--quickstart", action="store_true", help="time the quickstart too")
    opts = parser.parse_args()
    nni = nni_python()
    nnictl = str(Path(nni).parent / "nnictl")
    times: Dict[str, List[float]] = {"trialkit": [], "NNI 3.0": []}
    with tempfile.TemporaryDirectory(prefix="bench-experiment-") as tmp:
        work = Path(tmp)
        print(f"{opts.trials} trials, concurrency {CONCURRENCY}, {opts.samples} samples each; {os.cpu_count()} CPUs; "
              f"{load_now()}", flush=True)
        races = {
            "trialkit": lambda i: run_trialkit(prepare(work / f"tk{i}", opts.trials, sys.executable), opts.trials,
                                              work / "home"),
            "NNI 3.0": lambda i: run_nni(nnictl, prepare(work / f"nni{i}", opts.trials, nni,
                                                         experimentWorkingDirectory=str(work / "nni-work")),
                                         opts.trials, opts.poll),
        }
        for i in range(opts.samples):
            order = list(races) if i % 2 == 0 else list(races)[::-1]
            for name in order:
                times[name].append(races[name](i))
                print(f"  sample {i + 1} {name}: {times[name][-1]:.2f} s, {load_now()}", flush=True)
        met = report(times, opts.trials)
        if opts.quickstart:
            seconds = run_trialkit(ROOT / "examples" / "quickstart" / "config.yml", None, work / "home")
            print(f"quickstart: {seconds:.1f} s wall (10 trials, TPE, concurrency 2)")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
