"""How long the read-only CLI takes to answer, raced against the import floor in the same run.

    python bench/bench_cli.py [--samples 30] [--experiments 20] [--trials 10]

A fresh TRIALKIT_HOME holds --experiments stored experiments of --trials
trials each (tests/web_util.py's fill: intermediate and final metrics, one
trial still running). Four commands, each a fresh process as a user's shell
starts it, run in turn, their order shuffled every round so that none always
runs first or last after another:

    trialkit experiment list                 (every experiment's store opened)
    trialkit trial list <an experiment>      (one store, its trials' records)
    python -c "import trialkit.cli"          (the import floor: the interpreter and the CLI's modules)
    python -c pass                           (the interpreter alone)

Printed: each one's median and p90 wall time, the commands' ratio to the
import floor, and MET/MISSED for the goals of issue 40 (within 1.5x the
import floor, and under 150 ms). The machine's load average is printed too:
on a busy machine every figure grows, the ratios less.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from trialkit.manager.store import Store  # noqa: E402
from web_util import fill  # noqa: E402  (the tests' stores: the same trials the page's benchmark reads)

RATIO_GOAL = 1.5  # the commands' median, over the import floor's
MS_GOAL = 150.0  # the commands' median


def stored_home(home: Path, experiments: int, trials: int) -> List[str]:
    """Fill a TRIALKIT_HOME with stored experiments; their ids."""
    ids = [f"bench{number:03d}" for number in range(experiments)]
    for number, experiment_id in enumerate(ids):
        store = Store.in_dir(home / "experiments" / experiment_id)
        fill(store, experiment_id, trials=trials, steps=20, seed=number, running=1)
        store.close()
    return ids


def timed(argv: List[str], env: Dict[str, str]) -> float:
    """One run's wall time in ms; the run must succeed."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = (time.perf_counter() - start) * 1000
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30, help="rounds of the four (default 30)")
    parser.add_argument("--experiments", type=int, default=20, help="stored experiments (default 20)")
    parser.add_argument("--trials", type=int, default=10, help="trials per experiment (default 10)")
    opts = parser.parse_args()
    trialkit = str(Path(sys.executable).with_name("trialkit"))
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as work:
        ids = stored_home(Path(work), opts.experiments, opts.trials)
        env = dict(os.environ, TRIALKIT_HOME=work)
        runs = {
            "experiment list": [trialkit, "experiment", "list"],
            "trial list": [trialkit, "trial", "list", ids[0]],
            "import trialkit.cli": [sys.executable, "-c", "import trialkit.cli"],
            "python -c pass": [sys.executable, "-c", "pass"],
        }
        for argv in runs.values():  # warm the page cache and the bytecode once, untimed
            timed(argv, env)
        times: Dict[str, List[float]] = {name: [] for name in runs}
        order = list(runs)
        rng = random.Random(0)
        for _ in range(opts.samples):
            rng.shuffle(order)
            for name in order:
                times[name].append(timed(runs[name], env))
    load = os.getloadavg()
    print(f"{opts.samples} samples each, {opts.experiments} experiments of {opts.trials} trials, "
          f"load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    median = {name: statistics.median(values) for name, values in times.items()}
    floor = median["import trialkit.cli"]
    for name, values in times.items():
        p90 = statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]
        print(f"  {name:<22} median {median[name]:7.1f} ms   p90 {p90:7.1f} ms   "
              f"{median[name] / floor:.2f}x the import floor")
    met_all = True
    for name in ("experiment list", "trial list"):
        ratio = median[name] / floor
        met = ratio <= RATIO_GOAL and median[name] < MS_GOAL
        met_all &= met
        print(f"{name}: {ratio:.2f}x the import floor (goal <= {RATIO_GOAL:g}x: {'MET' if ratio <= RATIO_GOAL else 'MISSED'}), "
              f"{median[name]:.0f} ms (goal < {MS_GOAL:g} ms: {'MET' if median[name] < MS_GOAL else 'MISSED'})")
    print(f"the interpreter alone is {median['python -c pass']:.1f} ms of the floor's {floor:.1f}")
    return 0 if met_all else 1


if __name__ == "__main__":
    sys.exit(main())
