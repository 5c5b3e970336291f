"""bench/bench_search.py runs: every method of the race, once, on a small budget (its figures mean nothing here;
the race is run whole by hand: `python bench/bench_search.py`)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from harness import ROOT


@pytest.mark.slow
def test_the_search_race_runs_every_method_and_says_met_or_missed():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_search.py"), "--quick"], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for method in ("trialkit Hyperband", "trialkit BOHB", "trialkit ASHA", "trialkit PBT", "Ray Tune ASHA",
                   "Ray Tune HyperBand", "Ray Tune PBT", "Optuna TPE+Hyperband"):
        seed_line = next(line for line in lines if line.startswith("seed 0") and f" {method} " in line)
        assert "(24 epochs counted)" in seed_line, seed_line  # each spent the budget, and no more counted
        best = float(seed_line.split(" best ")[1].split()[0])
        assert 0.1 <= best <= 1.0  # a held-out accuracy
    verdicts = [line for line in lines if line.startswith("trialkit ") and " vs " in line]
    assert len(verdicts) == 4 and all(line.endswith(("MET", "MISSED")) for line in verdicts), verdicts


def test_the_race_without_its_peers_installed_says_so_in_one_line():
    """A new user ran it in the demo's venv (no Ray Tune, no optuna) and got a traceback after minutes."""
    hide = ("import runpy, sys\n"
            "sys.modules['ray'] = sys.modules['optuna'] = None  # as a venv without them\n"
            "sys.argv = ['bench_search.py', '--quick']\n"
            f"runpy.run_path({str(ROOT / 'bench' / 'bench_search.py')!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "bench_search.py: the peers or the problem need ray.tune, optuna, which this Python lacks: run it with "
        "the venv that `./bootstrap.sh test` makes (.venv/bin/python)"], done.stderr
