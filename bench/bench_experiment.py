"""Local experiments: trialkit against NNI 3.0's local mode, measured in the same run.

    python bench/bench_experiment.py [--trials 200] [--nni-trials 200] [--skip-quickstart]

Both run the same trivial trial script on the same search space, 200 trials
two at a time with the Random tuner (the tuner is not what is measured). The
script imports `nni` where it is installed (NNI's venv, from
tools/nni_venv.sh) and `trialkit` otherwise, so each system runs with its own
SDK: it reads its parameters and reports one final result. A run is timed
from the command's start to its end, as a user waits for it: trials per
second, and trialkit's ratio to NNI (goal: at least 5x). Then the quickstart's
wall time (examples/quickstart, 10 torch trials, TPE), unless skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parent.parent
GOAL = 5.0
CONCURRENCY = 2
SPACE = {"x": {"_type": "uniform", "_value": [0, 1]}, "units": {"_type": "choice", "_value": [8, 16, 32]}}
TRIAL = """
try:
    import nni as sdk
except ImportError:
    import trialkit as sdk
params = sdk.get_next_parameter()
sdk.report_final_result(params["x"] * params["units"])
"""
# Runs in NNI's venv: NNI's own Python API, as its docs show it.
NNI_DRIVER = """
import json, sys, time
from nni.experiment import Experiment
code_dir, trials, port, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
exp = Experiment("local")
exp.config.trial_command = f"{sys.executable} trial.py"
exp.config.trial_code_directory = code_dir
exp.config.search_space = json.load(open(f"{code_dir}/search_space.json"))
exp.config.tuner.name = "Random"
exp.config.max_trial_number = trials
exp.config.trial_concurrency = %d
exp.config.experiment_working_directory = work
exp.run(port)
jobs = exp.list_trial_jobs()
exp.stop()
print(json.dumps({"succeeded": sum(job.status == "SUCCEEDED" for job in jobs)}))
""" % CONCURRENCY


def prepare(workdir: Path, trials: int) -> Path:
    """The trial script, search space and trialkit config, in `workdir`; the config's path."""
    (workdir / "trial.py").write_text(textwrap.dedent(TRIAL))
    (workdir / "search_space.json").write_text(json.dumps(SPACE))
    config = {"searchSpaceFile": "search_space.json", "trialCommand": "python3 trial.py",
              "trialConcurrency": CONCURRENCY, "maxTrialNumber": trials,
              "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}},
              "trainingService": {"platform": "local"}}
    path = workdir / "config.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def run_trialkit(config: Path, home: Path) -> float:
    env = dict(os.environ, TRIALKIT_HOME=str(home))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "trialkit.cli", "run", str(config)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"trialkit run failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return seconds


def nni_python() -> str:
    done = subprocess.run(["bash", str(ROOT / "tools" / "nni_venv.sh"), sys.executable], stdout=subprocess.PIPE,
                          text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_nni(python: str, code_dir: Path, trials: int, work: Path) -> float:
    started = time.monotonic()
    done = subprocess.run([python, "-c", NNI_DRIVER, str(code_dir), str(trials), str(free_port()), str(work)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.monotonic() - started
    result = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
    if result.get("succeeded") != trials:
        sys.exit(f"NNI's run did not finish its {trials} trials ({done.returncode}):\n{done.stdout[-3000:]}")
    return seconds


def run_quickstart(home: Path) -> float:
    return run_trialkit(ROOT / "examples" / "quickstart" / "config.yml", home)


def report(figures: Dict[str, float], trials: int, nni_trials: int) -> None:
    ours = trials / figures["trialkit"]
    print(f"trialkit : {trials} trials in {figures['trialkit']:.1f} s = {ours:.2f} trials/s")
    if "nni" in figures:
        theirs = nni_trials / figures["nni"]
        ratio = ours / theirs
        print(f"NNI 3.0  : {nni_trials} trials in {figures['nni']:.1f} s = {theirs:.3f} trials/s")
        print(f"ratio    : {ratio:.1f}x NNI's trials/s (goal >= {GOAL:g}x: {'met' if ratio >= GOAL else 'NOT met'})")
    if "quickstart" in figures:
        print(f"quickstart: {figures['quickstart']:.1f} s wall (10 trials, TPE, concurrency 2)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="trials for trialkit (default 200)")
    parser.add_argument("--nni-trials", type=int, default=200, help="trials for NNI; 0 skips NNI (default 200)")
    parser.add_argument("--skip-quickstart", action="store_true", help="do not time the quickstart")
    opts = parser.parse_args()
    figures: Dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-experiment-") as tmp:
        work = Path(tmp)
        print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start", flush=True)
        figures["trialkit"] = run_trialkit(prepare(work, opts.trials), work / "home")
        if opts.nni_trials:
            nni_dir = work / "nni"
            nni_dir.mkdir()
            prepare(nni_dir, opts.nni_trials)
            figures["nni"] = run_nni(nni_python(), nni_dir, opts.nni_trials, work / "nni-work")
        if not opts.skip_quickstart:
            figures["quickstart"] = run_quickstart(work / "home")
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
    report(figures, opts.trials, opts.nni_trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
