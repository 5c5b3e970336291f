"""The GP tuner's pick (NNI's GPTuner defaults) against NNI's way of making the same pick.

    python bench/bench_gp_pick.py [--samples 3] [--results 13]

A 3-parameter space (log-uniform, uniform, a choice of three), `--results`
results told (13: the pick of a 14-trial experiment's last trial), NNI's
classArgs (selection_num_warm_up 100000, selection_num_starting_points 250):
  - trialkit: GPTuner.ask() as the loop calls it (samplers.py: the fitted
    GP's posterior in one numpy pass, L-BFGS-B given its gradient from one
    call on the point and its neighbours, BLAS in one thread);
  - NNI's: the same fit, then what NNI's gp_tuner/util.acq_max does: the
    warm-up points through GaussianProcessRegressor.predict, then L-BFGS-B
    from each start with scipy's own finite differences, predict() on one
    point per call (trialkit's pick until this benchmark).
Both draw from the same seed, so they must pick the same point (printed).
Alternating which goes first, --samples times: medians, the ratio, and the
goal: trialkit's pick under 1 s (MET/MISSED). Say the load (uptime) beside it.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trialkit.control.searchspace import parse_space  # noqa: E402
from trialkit.control.tuners import build_tuner  # noqa: E402
from trialkit.control.tuners.base import derived_seed  # noqa: E402
from trialkit.control.tuners.samplers import _acquisition, flat_units, from_units, unit_vector  # noqa: E402

GOAL = 1.0  # seconds, trialkit's pick
SPACE = parse_space({"lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]},
                     "momentum": {"_type": "uniform", "_value": [0, 1]},
                     "batch": {"_type": "choice", "_value": [16, 32, 64]}})


def objective(p: Dict[str, Any]) -> float:
    return -(p["momentum"] - 0.3) ** 2 - (p["lr"] - 0.01) ** 2 + p["batch"] / 1000


def told(results: int) -> Any:
    tuner = build_tuner("GPTuner", {"optimize_mode": "maximize"}, SPACE, 1)
    for _ in range(results):
        parameter_id, params = tuner.ask()
        tuner.tell(parameter_id, objective(params))
    return tuner


def trialkit_pick(tuner: Any) -> Dict[str, Any]:
    return tuner.ask()[1]


def nnis_pick(tuner: Any) -> Dict[str, Any]:
    """The same pick, NNI's acq_max's way (sklearn's predict per point, scipy's numerical gradient)."""
    import numpy
    from scipy.optimize import minimize
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import Matern

    rng = random.Random(derived_seed(tuner.seed, tuner._next_id))
    state = numpy.random.RandomState(rng.getrandbits(32))
    ids = sorted(tuner._results)
    x = numpy.array([unit_vector(SPACE, tuner._params[pid]) for pid in ids])
    y = numpy.array([tuner._results[pid] for pid in ids])
    gp = GaussianProcessRegressor(kernel=Matern(nu=2.5), alpha=1e-6, normalize_y=True, n_restarts_optimizer=25,
                                  random_state=state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gp.fit(x, y)
    acquisition = _acquisition(tuner.args, gp, float(y.max()))
    tries = state.uniform(size=(100000, 3))
    values = acquisition(tries)
    best, best_value = tries[values.argmax()], float(values.max())
    for start in state.uniform(size=(250, 3)):
        found = minimize(lambda p: -acquisition(p.reshape(1, -1))[0], start, bounds=[(0.0, 1.0)] * 3,
                         method="L-BFGS-B")
        if found.success and -float(found.fun) >= best_value:
            best, best_value = found.x, -float(found.fun)
    return from_units(SPACE, flat_units(SPACE, numpy.clip(best, 0.0, 1.0)))


def timed(pick: Callable[[Any], Dict[str, Any]], results: int) -> tuple:
    """The pick alone, of a tuner told `results` results (its earlier picks, trialkit's, not timed)."""
    tuner = told(results)
    start = time.perf_counter()
    point = pick(tuner)
    return time.perf_counter() - start, point


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--results", type=int, default=13)
    args = parser.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, {os.cpu_count()} cores")
    times: Dict[str, List[float]] = {"trialkit": [], "NNI": []}
    picks: Dict[str, Dict[str, Any]] = {}
    for sample in range(args.samples):
        order = [("trialkit", trialkit_pick), ("NNI", nnis_pick)]
        for name, pick in order if sample % 2 == 0 else order[::-1]:
            seconds, picks[name] = timed(pick, args.results)
            times[name].append(seconds)
            print(f"sample {sample} {name:8} pick {seconds:.3f} s")
    ours, theirs = statistics.median(times["trialkit"]), statistics.median(times["NNI"])
    same = picks["trialkit"] == picks["NNI"]
    print(f"picked: trialkit {picks['trialkit']}, NNI's {picks['NNI']}: {'the same' if same else 'DIFFERENT'}")
    print(f"median pick: trialkit {ours:.3f} s, NNI's {theirs:.3f} s: {theirs / ours:.1f}x faster; "
          f"goal under {GOAL:g} s: {'MET' if ours < GOAL else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
