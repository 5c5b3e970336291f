"""The benchmarks' own faces: bench_search.py runs every method of the race once on a small budget (its figures
mean nothing here; the race is run whole by hand: `python bench/bench_search.py`), its verdict follows its rule,
and it and bench_web.py say in one line what a Python without their engines lacks."""
from __future__ import annotations

import subprocess
import sys

import pytest

from harness import ROOT


@pytest.mark.slow
def test_the_search_race_runs_every_method_and_gives_no_verdict_on_the_quick_budget():
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
    assert len(verdicts) == 4 and all(line.endswith(": no verdict (--quick)") for line in verdicts), verdicts


def test_the_verdict_is_met_only_at_least_as_good_and_sooner_and_says_never_for_a_best_not_reached():
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_search as race

    def runs(*reports):  # one Outcome a seed, from (seconds, accuracy) reports
        return [race.outcome(list(r), 100) for r in reports]

    peer = runs([(1.0, 0.90), (4.0, 0.95)], [(2.0, 0.96)])  # its best 0.95 at 4 s, 0.96 at 2 s: median 3 s
    outcomes = {name: peer for name in race.PEERS["ASHA"] + race.PEERS["PBT"]}
    outcomes.update({
        "trialkit Hyperband": runs([(1.0, 0.95)], [(1.5, 0.97)]),  # better, sooner: MET
        "trialkit BOHB": runs([(5.0, 0.95)], [(6.0, 0.97)]),  # better, later: MISSED
        "trialkit ASHA": runs([(1.0, 0.90)], [(1.0, 0.91)]),  # never as good: MISSED, never reached
        "trialkit PBT": runs([(0.5, 0.955)], [(1.0, 0.95)]),  # sooner, a lower mean best: MISSED
    })
    outcomes["Ray Tune HyperBand"] = outcomes["Optuna TPE+Hyperband"] = peer
    lines = race.table(outcomes).splitlines()
    said = {line.split(" vs ")[0]: line for line in lines if line.startswith("trialkit ") and " vs " in line}
    assert said["trialkit Hyperband"].endswith(": MET"), said
    assert said["trialkit BOHB"].endswith(": MISSED") and "5.5 s vs its 3.0 s" in said["trialkit BOHB"], said
    assert said["trialkit ASHA"].endswith("never reached the peer's best (it took 3.0 s): MISSED"), said
    assert said["trialkit PBT"].endswith(": MISSED"), said
    # The resolution beside it: each mean best's standard error over the seeds (Hyperband's bests 0.95, 0.97: a
    # spread of 0.0141, over the root of 2 seeds; the peer's 0.95, 0.96: 0.0050), and their difference's.
    rows = {line[:26].strip(): line.split() for line in lines if line.startswith(("trialkit ", "Ray ", "Optuna "))
            and " vs " not in line}
    assert rows["trialkit Hyperband"][-2:] == ["0.0100", "1.2"] and rows["Ray Tune ASHA"][-2] == "0.0050", rows
    assert "best 0.9600 vs 0.9550 (s.e. of the difference 0.0112);" in said["trialkit Hyperband"], said


@pytest.mark.parametrize("script, hidden, said", [
    ("bench_search.py", ("ray", "optuna"), "bench_search.py: the peers or the problem need ray.tune, optuna, which this "
     "Python lacks: run it with the venv that `./bootstrap.sh test` makes (.venv/bin/python)"),
    ("bench_web.py", ("selenium",), "bench_web.py: the page's race needs selenium (and Debian's chromium), which this "
     "Python lacks: run it with the venv that `./bootstrap.sh test` makes (.venv/bin/python)"),
])
def test_a_race_without_what_it_drives_says_so_in_one_line(script, hidden, said):
    """A new user ran them in the demo's venv (no Ray Tune, no optuna, no selenium) and got a traceback."""
    hide = ("import runpy, sys\n"
            f"sys.modules.update(dict.fromkeys({hidden!r}))  # None: as a venv without them\n"
            f"sys.argv = [{script!r}, '--quick' if {script!r} == 'bench_search.py' else '--samples=1']\n"
            f"runpy.run_path({str(ROOT / 'bench' / script)!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [said], done.stderr


