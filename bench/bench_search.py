"""The search race: trialkit's Hyperband, BOHB, ASHA and PBT against Ray Tune's and Optuna's, in one run.

    python bench/bench_search.py [--budget 300] [--seeds 3] [--concurrency 2] [--epoch-scale 1] [--quick]
                                 [--methods Hyperband,BOHB,ASHA,PBT]

Every method searches the same small real training (bench/search_problem.py:
a network learning the digits, one epoch a unit of budget, its held-out
accuracy maximized, at most 27 epochs a configuration) with the same budget of
trial-epochs and the same trials at once:

  trialkit   `trialkit run` of a config on the local platform with `warmStart: true` (`--cold`: off), each
             trial a process (forked from the experiment's warm process, numpy imported there once) that
             keeps its model in trialkit.checkpoint_dir():
             Hyperband (R 27, eta 3), BOHB (1 to 27, eta 3), ASHA (the ASHA assessor,
             Determined's adaptive_asha, aggressive: rungs at 1, 3, 9, 27 epochs, beside Random),
             PBT (population 8, each trial 3 epochs from the checkpoint PBT gives it; asynchronous,
             `synchronous: false`, as Ray's PBT is by default)
  Ray Tune   Tuner.fit() of a function trainable with random search, on a local Ray cluster of
             `--concurrency` CPUs (its trials at once) started before the clock runs: ASHAScheduler
             (max_t 27, grace 1, factor 3), HyperBandScheduler (max_t 27, factor 3),
             PopulationBasedTraining (8, every 3 epochs); a trial checkpoints only where its
             scheduler reads one; `reuse_actors=True`, so that a trial starts in an idle actor
  Optuna     study.optimize() with TPESampler and HyperbandPruner (1 to 27, factor 3), n_jobs threads

Each method's clock starts when it is started (trialkit: its command, the
manager's start included; Ray: fit(); Optuna: optimize()). Every epoch any
trial trains is one unit of the budget: a method is stopped once it has
reported `--budget` epochs, and only its first `--budget` reports (in time)
count. Figures: the best accuracy among them, and the time of the first report
that reached it. Seeds alternate which system goes first, so the load of a
shared machine falls on each alike.

MET/MISSED, per trialkit method, against the best of its peers (the highest
mean best; Hyperband, BOHB: Ray's HyperBand and Optuna; ASHA: Ray's ASHA and
Optuna; PBT: Ray's PBT): MET when its mean best is at least the peer's and, seed
by seed, it reached the peer's best sooner than the peer did (the median over
seeds of its time to the peer's best, never reached counting as forever, below
the median of the peer's time to its own best). Beside each mean best the table prints its
standard error over the seeds, and beside each verdict that of the two means'
difference: the resolution the seeds give, which the verdict does not weigh.
`--methods PBT` races only the trialkit methods named and their peers.
`--quick` runs every method once on a budget of 24 epochs: it checks the race
runs (tests/test_bench_search.py); its figures mean nothing, and it gives no
verdict.

Set OMP_NUM_THREADS=1 for the race (`OMP_NUM_THREADS=1 python bench/...`) to
race each peer tuned: Optuna's threads then share numpy's one-thread BLAS, as
Ray's workers and trialkit's trials run at 2 at once (both set it themselves);
without it, Optuna's two threads each run numpy with a thread per core.

History. Session 7 timed one trial's way on the local platform (a probe, not kept): of 406 ms from its keeper's
spawn to its first epoch (medians, load 10), the keeper's Python ~75, the trial's Python ~67 and numpy's and the
problem's imports ~154; from its exit to its reaping, 70 (the interpreter's teardown). Session 8 made the local
platform's warm start (docs/platforms.md, warmStart): each trial's keeper forked from a process that has imported
it and the script's numpy, the trial's Python forked from its keeper. Per trial, from the store, run_trialkit
warm and cold alternating, twice each (2 at once, OMP_NUM_THREADS=1, load 3.1 to 3.4), median ms, cold -> warm:
  Hyperband, budget 300: created -> the keeper's RUNNING 66, 57 -> 20, 32; created -> first epoch 180, 157 ->
  59, 90; FINAL -> ended 22, 22 -> 4, 9; 300 epochs in 10.7, 10.9 s -> 5.0, 7.8 s
  PBT, budget 300: 50, 53 -> 26, 36; 140, 140 -> 67, 93; 19, 19 -> 5, 7; 11.4, 12.1 s -> 6.8, 10.4 s
The race, warm, `--budget 300 --seeds 2`, OMP_NUM_THREADS=1, twice (uptime before and after: 17:20:15 load
7.69 -> 17:29:19 load 11.11; 17:35:19 load 5.28 -> 17:41:54 load 1.99), best and time to best (means):
  trialkit Hyperband 0.9917 at 7.2 s | 0.9917 at 3.9 s       Ray Tune ASHA      0.9908 at 16.4 s | 0.9908 at 18.8 s
  trialkit BOHB      0.9917 at 4.0 s | 0.9917 at 3.3 s       Ray Tune HyperBand 0.9767 at 9.4 s  | 0.9767 at 5.1 s
  trialkit ASHA      0.9933 at 5.4 s | 0.9933 at 5.5 s       Ray Tune PBT       0.9783 at 4.6 s  | 0.9783 at 3.3 s
  trialkit PBT       0.9758 at 8.5 s | 0.9783 at 3.8 s       Optuna TPE+HB      0.9858 at 3.8 s  | 0.9892 at 4.6 s
ASHA MET both times (0.33x, 0.29x Ray's time). Hyperband and BOHB MISSED: the first run on time (to Optuna's best
1.83x and 1.04x its time), the second by a seed whose best (0.9900) is under that seed's Optuna (0.9917), though
their mean best is higher. PBT MISSED on a seed's best both times (0.9667, then 0.9750, under Ray's 0.9783). The
start is no longer what decides: what is left of a warm trial's ~60 to 90 ms to its first epoch is its own work
(its data and checkpoint loaded, an epoch), and the verdicts turn on which configurations a seed's search finds.
Cold then warm in one session (--methods Hyperband,PBT --seeds 2; 17:47:20 load 1.07 -> 17:51:43 4.89 -> end):
Hyperband 0.9917 at 8.1 s cold (1.55x Optuna's time to its best), 0.9917 at 5.5 s warm (1.28x); PBT 0.9842 at
12.9 s cold (1.32x Ray's), 0.9758 at 7.3 s warm (a seed's best 0.9683 under Ray's 0.9783): all MISSED.
Three seeds, quiet, warm, twice (18:25 load 2.13 -> 1.71; 18:55 load 0.45 -> 1.96): Hyperband MET 0.72, 0.63;
BOHB MET 0.71, 0.64; ASHA MET 0.30, 0.31; PBT MET 0.86, then MISSED on its mean best (0.9750 against Ray's
0.9778): trialkit's seeded searches find the same bests from run to run, its asynchronous PBT does not (seed 1:
0.9817, then 0.9633). docs/searches.md has the tables.
Session 9: asynchronous PBT ranks each member at the progress of the member that steps (a low run had lost its best
lineage to members that had trained more). trialkit's PBT alone, before and after in one harness, alternating
(load 1.3 to 23): a seed's best over 9 to 10 runs, seeds 0, 1, 2: 0.9667-0.9867, 0.9617-0.9833, 0.9717-0.9867 ->
0.9767-0.9800, 0.9767-0.9850, 0.9833-0.9883; the mean of all runs alike (0.9800, 0.9805). The race once, `--seeds 3
--methods PBT` (load 7.19 -> 8.82): 0.9794 against Ray's 0.9750, to Ray's best 4.3 s against 9.7 s (0.45): MET.
The whole race twice more, warm, three seeds (20:37, load 4.89 -> 2.30; 21:46, 2.48 -> 1.73): Hyperband MET
0.54, 0.64; BOHB MET 0.54, 0.61; ASHA MET 0.26, then MISSED on its mean best (0.9900 against Ray's 0.9906); PBT
MISSED on time (1.54: seed 0's best 0.9767 under Ray's 0.9783), then MET 0.86. Each miss is one held-out image in
600 (docs/searches.md).
Session 10, ASHA alone, seeds 0 to 10 (load 1.3 to 5.3, then 3 to 13): both stop trials at rungs 1, 3, 9, 27
(no promotion of paused ones); trialkit's rule is Determined's (the best max(floor(n/3), 1) of a rung go on), Ray's
the 67th percentile of the rung's earlier results. Seeds 0, 1, 2: trialkit tried 95, 47, 61 configurations, Ray 112,
49, 70. Ray's trials stop at the rung; trialkit's train on until the stop arrives (47 ms median from the judged
report, epochs of 7 to 56 ms): 15 to 35 of the 300 epochs past a stop at load 1 to 3, 34 to 66 at 10 to 13. A
simulation on the real curves, seeds 0 to 30: the same best with and without it on 30 (one higher with). Seed 2's
0.9833 is its draw: none of its 61 configurations, trained all 27 epochs after, passes 0.9850. Over seeds 0 to 10,
trialkit 0.9883 (sd 0.0043), Ray 0.9889 (sd 0.0024): the s.e. of a 3-seed mean's difference is 0.0029, the misses
were 0.0006 and 0.0017; for equal searches "at least the peer's mean" misses 48% of races with 3 seeds, 49% with 5.
The table prints each mean best's s.e. and each difference's.
Five seeds, loaded (load 10 to 11.5): ASHA MET 0.9887 (s.e. 0.0021) vs Ray's 0.9883 (0.0015), 0.69, in 13.7
minutes; PBT MET 0.9800 vs 0.9600 (Ray's falling with the load), 0.79. trialkit PBT's way to Ray's best (seeds 0 to
2, load 6.8 to 8.4): its trials' starts take as many slot-seconds as its epochs (3.2/3.3, 9.9/8.4, 1.9/1.9); Ray's
first epoch comes 3.6 to 6.4 s after fit(), then 21 to 75 a second: trialkit is first where Ray's best takes ~65
epochs, Ray where it takes 271.
The whole race once more on the session's last head, quiet (00:35, load 1.65 -> 1.78), three seeds: Hyperband MET
0.9883 vs Optuna's 0.9861, 0.61; BOHB MET 0.9917, 0.61; ASHA MET 0.9900 vs Ray's 0.9900, 0.32; PBT MISSED on time,
0.9794 vs Ray's 0.9778 but seed 1's best 0.9767 under Ray's 0.9783 (never reached: 1.27).
Session 11, trialkit's PBT alone, before and after in one harness, alternating, seeds 0 to 5 (load 1.5 to 10.6): a
seed's best over 7 runs, in images of 600, 586-590, 586-589, 588-590, 589-590, 587-593, 583-593 (Ray's seed 1 best:
587). Each run's best comes from a lineage at a high lr that an exploit's step cut to an annealing one; the low runs
got that drop late or never. Tried, not kept: ranking a member never above its latest result (no exploit into a
checkpoint wrecked since: mean best 0.9815 -> 0.9799, seed 1 582-585), a Latin hypercube first population (0.9812
-> 0.9758, seed 5 575 twice; seeds 6 to 17 once each: worse on 11, level on 1). The race once (load 5.08 -> 6.68):
0.9794 vs Ray's 0.9761, 0.64: MET.
Session 11, Ray tuned: every race before ran Ray with reuse_actors=False (Ray's default; its PBT warns), each trial and
each resumed one a new actor. With reuse_actors=True (load 6-10), a seed's whole run: PBT 2.0-2.4x, HyperBand 5.6-7.2x,
ASHA 4.6-19x faster. Quiet pace (load 1-2): Ray's first epoch 1.1-3.2 s after fit() (trialkit 0.24-0.31 s), then
ASHA and HyperBand at trialkit's pace (52-65 epochs/s), PBT faster (74-127 against 55-58: each trialkit step a trial).
The race with Ray tuned (load 3.6): Hyperband MISSED (Ray's HyperBand 0.9867, never reached on seeds 0 and 2), BOHB
MISSED 2.32, ASHA MET 0.93, PBT MISSED 1.82; every trialkit mean best still at least the peer's. Again, quiet (load
1.83 -> 3.33): all four MISSED on time, ratios 1.08 (BOHB), 1.19 (ASHA), 1.00 (PBT), Hyperband never reaching Ray
HyperBand's 0.9917 and 0.9883 on seeds 0 and 2. PBT at --epoch-scale 5, Ray tuned (load 1.4 -> 3.3): MET 0.96. Ray's ResultGrid
fails with reuse_actors when the budget stopped a trial that never started: the race reads each epoch from its
Budget stopper instead.
Session 12 trimmed a trial's way (docs/searches.md, "A trial's way trimmed"): BOHB's libraries imported beside its
first bracket and its candidates weighed as arrays, the keeper's 20 ms read delay gone, the zygote preloading what
trials imported. The race, quiet (load 0.77 -> 2.22): Hyperband MET 0.51, BOHB MET 0.47, ASHA MISSED 1.18, PBT
MISSED 1.12; ASHA and PBT again (1.88 -> 2.59): ASHA MISSED on its mean best against Optuna's (0.9900, 0.9911; 0.28),
PBT MET 0.89. The whole race on the last head (1.28 -> 2.31): Hyperband and BOHB MISSED (never reaching Ray HyperBand's
0.9917 and 0.9883 on seeds 0 and 2), ASHA MET 0.98, PBT MISSED 1.01.
Session 13, `--seeds 5`, quiet, twice (load 0.81 -> 2.14, 2.14 -> 2.31): all four MET both times. Hyperband 0.79,
0.46; BOHB 0.76, 0.41; ASHA 0.93, 0.96 (mean best 0.9887 against Ray's 0.9880: within its s.e.); PBT 0.43, 0.42 (its
best margin from Ray PBT's 0.8700 on seed 3). docs/searches.md, "Five seeds".
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import search_problem as problem  # noqa: E402  (beside this file)

R, ETA, POPULATION, INTERVAL = problem.MAX_EPOCHS, 3, 8, 3
# Epochs between a Ray trial's checkpoints, by scheduler: HyperBand may pause a trial after any epoch, PBT
# exploits at each perturbation interval, ASHA never reads one.
CHECKPOINT_EVERY = {"HyperBand": 1, "PBT": INTERVAL, "ASHA": 0}
Reports = List[Tuple[float, float]]  # (seconds since the method started, held-out accuracy), one an epoch


class Outcome(NamedTuple):
    best: float
    time_to_best: float
    epochs: int
    reports: Reports  # the first `budget` reports, in time


def outcome(reports: Reports, budget: int) -> Outcome:
    """The best of the first `budget` reports, and when it was first reached."""
    first = sorted(reports)[:budget]
    best = max(value for _, value in first)
    return Outcome(best, reached(first, best), len(first), first)


def reached(reports: Reports, value: float) -> float:
    """When the reports first held `value` or better (infinity: never)."""
    return min((t for t, v in reports if v >= value), default=float("inf"))


# ---------------------------------------------------------------- trialkit

TRIAL = """
import os, sys
import numpy
import trialkit
sys.path.insert(0, {bench!r})
import search_problem as problem

params = trialkit.get_next_parameter()
data = problem.load_data({data!r})
path = os.path.join(trialkit.checkpoint_dir(), "model.npz")
state = problem.load(path) if os.path.exists(path) else problem.init(params)  # PBT's and Hyperband's copy
mode = {mode!r}
target = {{"budget": params.get("TRIAL_BUDGET"), "full": {r}, "step": state["epochs"] + {interval}}}[mode]
accuracy = problem.accuracy(state, data)
while state["epochs"] < target:
    problem.train_epoch(state, params, data)
    accuracy = problem.accuracy(state, data)
    trialkit.report_intermediate_result(accuracy)
problem.save(state, path)
trialkit.report_final_result(accuracy)
"""

TRIALKIT_METHODS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "Hyperband": ("budget", {"tuner": {"name": "Hyperband", "classArgs": {"R": R, "eta": ETA}}}),
    "BOHB": ("budget", {"tuner": {"name": "BOHB", "classArgs": {"min_budget": 1, "max_budget": R, "eta": ETA}}}),
    "ASHA": ("full", {"tuner": {"name": "Random", "classArgs": {}},
                      "assessor": {"name": "ASHA", "classArgs": {"max_time": R, "max_trials": 1000, "divisor": ETA,
                                                                 "mode": "aggressive"}}}),
    "PBT": ("step", {"tuner": {"name": "PBT", "classArgs": {"population_size": POPULATION, "fraction": 0.25,
                                                                  "synchronous": False}}}),
}


def run_trialkit(method: str, seed: int, budget: int, concurrency: int, data: Path, work: Path,
                 warm_start: bool = True) -> Reports:
    mode, keys = TRIALKIT_METHODS[method]
    folder = work / f"trialkit-{method}-{seed}{'' if warm_start else '-cold'}"
    folder.mkdir()
    (folder / "trial.py").write_text(textwrap.dedent(TRIAL.format(bench=str(BENCH), data=str(data), mode=mode, r=R,
                                                                   interval=INTERVAL)))
    keys = json.loads(json.dumps(keys))
    keys["tuner"]["classArgs"].update(optimize_mode="maximize", seed=seed)
    config = {"searchSpace": problem.PBT_SPACE if method == "PBT" else problem.SPACE,
              "trialCommand": f"{sys.executable} trial.py", "trialConcurrency": concurrency,
              "trainingService": {"platform": "local", "warmStart": warm_start}, **keys}
    (folder / "config.yml").write_text(json.dumps(config))
    home = work / f"home-{folder.name.partition('-')[2]}"  # outside the code dir, which each trial gets a copy of
    # As installed (pip compiles every module): bytecode cached, here beside the sources (gitignored), so that no
    # trial's keeper and SDK compiles trialkit's sources again at its start. This checkout's shells set
    # PYTHONDONTWRITEBYTECODE, which cost every trial ~40 ms of CPU (twice that at load 10) that an installed
    # trialkit never pays; Ray's workers and Optuna's threads compile theirs once, not once a trial.
    environ = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "trialkit.cli", "run", "config.yml"], cwd=folder,
                            env=dict(environ, TRIALKIT_HOME=str(home)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first = proc.stdout.readline()
    if not first.startswith("started experiment"):
        raise RuntimeError(f"trialkit run did not start: {first}{proc.communicate()[0]}")
    experiment = first.split()[-1]
    store = home / "experiments" / experiment / "trialkit.db"
    drain = threading.Thread(target=proc.stdout.read, daemon=True)  # its progress lines, unread
    drain.start()
    while proc.poll() is None and _epochs(store) < budget:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # the budget is spent: stop it as a user would (Ctrl-C)
    proc.wait(timeout=120)
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT COALESCE(time, received), value FROM records WHERE type='PERIODICAL'").fetchall()
    return [(when - started, float(json.loads(value))) for when, value in rows]


def _epochs(store: Path) -> int:
    if not store.exists():
        return 0
    try:
        with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            return db.execute("SELECT COUNT(*) FROM records WHERE type='PERIODICAL'").fetchone()[0]
    except sqlite3.OperationalError:  # made but not yet holding its tables
        return 0


# ---------------------------------------------------------------- Ray Tune


def ray_space(space: Dict[str, Any]) -> Dict[str, Any]:
    from ray import tune

    kinds = {"loguniform": tune.loguniform, "uniform": tune.uniform}
    return {key: tune.choice(spec["_value"]) if spec["_type"] == "choice" else kinds[spec["_type"]](*spec["_value"])
            for key, spec in space.items()}


def ray_trainable(config: Dict[str, Any]) -> None:
    """One configuration, epoch after epoch, each reported with its wall time; every `checkpoint_every` epochs
    (0: never) with a checkpoint too, where its scheduler uses one (HyperBand resumes paused trials from it, PBT
    clones it at each perturbation; ASHA only stops trials, and Ray need not pay for checkpoints it never reads,
    as trialkit's ASHA trials write none)."""
    from ray import tune

    data = problem.load_data(Path(config["data"]))
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = problem.load(Path(folder) / "model.npz")
    else:
        state = problem.init(config)
    every = int(config["checkpoint_every"])
    while True:
        problem.train_epoch(state, config, data)
        metrics = {"accuracy": problem.accuracy(state, data), "wall": time.time()}
        if not every or state["epochs"] % every:
            tune.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as folder:
            problem.save(state, Path(folder) / "model.npz")
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))


def run_ray(method: str, seed: int, budget: int, concurrency: int, data: Path, work: Path) -> Reports:
    import random

    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler, PopulationBasedTraining
    from ray.tune.search.basic_variant import BasicVariantGenerator

    class Budget(tune.Stopper):
        """Every trial's every epoch spends the budget, and is kept as a report; all stop once it is spent."""

        def __init__(self) -> None:
            self.left = budget
            self.walls: List[Tuple[float, float]] = []  # (wall time, accuracy), one an epoch

        def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
            self.left -= 1
            self.walls.append((result["wall"], result["accuracy"]))
            return False

        def stop_all(self) -> bool:
            return self.left <= 0

    spent = Budget()
    random.seed(seed)  # PBT's explore draws from `random`
    space = ray_space(problem.PBT_SPACE if method == "PBT" else problem.SPACE)
    samples = POPULATION if method == "PBT" else 10_000
    scheduler = {
        "ASHA": lambda: ASHAScheduler(max_t=R, grace_period=1, reduction_factor=ETA),
        "HyperBand": lambda: HyperBandScheduler(max_t=R, reduction_factor=ETA),
        "PBT": lambda: PopulationBasedTraining(perturbation_interval=INTERVAL, quantile_fraction=0.25,
                                               hyperparam_mutations={k: v for k, v in space.items()}),
    }[method]()
    tuner = tune.Tuner(
        ray_trainable, param_space={**space, "data": str(data), "checkpoint_every": CHECKPOINT_EVERY[method]},
        tune_config=tune.TuneConfig(metric="accuracy", mode="max", scheduler=scheduler, num_samples=samples,
                                    # The cluster's CPUs are the limit: Ray ignores max_concurrent_trials beside a
                                    # SearchGenerator, and the generator's own limit would leave Ray no pending trial
                                    # to reuse a finished trial's actor for (each trial a new worker: measured ~5 s).
                                    search_alg=BasicVariantGenerator(random_state=seed),
                                    # Ray tuned, as its own warning advises for PBT: a trial that starts, or resumes
                                    # after a pause, takes an idle actor rather than a new one (Ray's default is
                                    # False). Measured: a seed's whole run 2.5x (PBT) to 19x (ASHA) faster.
                                    reuse_actors=True),
        run_config=tune.RunConfig(storage_path=str(work / f"ray-{method}-{seed}"), stop=spent, verbose=0))
    # Its INFO lines (where it wrote its state) among ours, and a warning for each trial still PENDING when the
    # budget stops them (200 lines: they have no results) are not the race's.
    logging.getLogger("ray.tune").setLevel(logging.WARNING)
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    # Nor are its logger's "Remote file not found: .../result.json", one a trial (seen under HyperBand, reusing
    # actors).
    logging.getLogger("ray.tune.logger.logger").setLevel(logging.ERROR)
    started = time.time()
    try:
        tuner.fit()
    except RuntimeError as err:
        # With reuse_actors, Ray 2.60 cannot build fit()'s ResultGrid when the budget stopped a trial before it
        # ever started ("Should not access `trial_fs_path` without setting `trial_dir_name`"): the race reads
        # the epochs as they came (Budget), not the grid.
        if "trial_dir_name" not in str(err):
            raise
    return [(wall - started, accuracy) for wall, accuracy in spent.walls]


# ---------------------------------------------------------------- Optuna


def run_optuna(method: str, seed: int, budget: int, concurrency: int, data: Path, work: Path) -> Reports:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    loaded = problem.load_data(data)
    reports: Reports = []
    lock = threading.Lock()
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed),
                                pruner=optuna.pruners.HyperbandPruner(min_resource=1, max_resource=R,
                                                                      reduction_factor=ETA))
    started = time.time()

    def objective(trial: Any) -> float:
        params = {}
        for key, spec in problem.SPACE.items():
            if spec["_type"] == "choice":
                params[key] = trial.suggest_categorical(key, spec["_value"])
            else:
                params[key] = trial.suggest_float(key, *spec["_value"], log=spec["_type"] == "loguniform")
        state = problem.init(params)
        accuracy = 0.0
        for epoch in range(1, R + 1):
            with lock:
                if len(reports) >= budget:
                    study.stop()
                    raise optuna.TrialPruned()
            problem.train_epoch(state, params, loaded)
            accuracy = problem.accuracy(state, loaded)
            with lock:
                reports.append((time.time() - started, accuracy))
            trial.report(accuracy, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return accuracy

    study.optimize(objective, n_jobs=concurrency)
    return reports


# ---------------------------------------------------------------- the race

Runner = Callable[[str, int, int, int, Path, Path], Reports]
METHODS: List[Tuple[str, str, Runner]] = [
    ("trialkit", "Hyperband", run_trialkit), ("trialkit", "BOHB", run_trialkit), ("trialkit", "ASHA", run_trialkit),
    ("trialkit", "PBT", run_trialkit), ("Ray Tune", "ASHA", run_ray), ("Ray Tune", "HyperBand", run_ray),
    ("Ray Tune", "PBT", run_ray), ("Optuna", "TPE+Hyperband", run_optuna),
]
PEERS = {"Hyperband": ["Ray Tune HyperBand", "Optuna TPE+Hyperband"],
         "BOHB": ["Ray Tune HyperBand", "Optuna TPE+Hyperband"],
         "ASHA": ["Ray Tune ASHA", "Optuna TPE+Hyperband"], "PBT": ["Ray Tune PBT"]}


def _importable(name: str) -> bool:
    """Whether `import name` would find it, and its parents (ray.tune needs ray's tune extra's packages too)."""
    import importlib.util

    try:
        if importlib.util.find_spec(name) is None:
            return False
        if name == "ray.tune":
            import pyarrow  # noqa: F401  (ray.tune's import fails without it: ray[tune])
        return True
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules (as the test hides one)
        return False


def _methods(value: str) -> List[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in PEERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{value!r}: name some of {', '.join(PEERS)}, comma-separated")
    return names


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=300, help="trial-epochs each method spends (default 300)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2, help="trials at once, for every method")
    parser.add_argument("--epoch-scale", type=int, default=1,
                        help="train on this many noisy copies of the images: epochs that cost that much more")
    parser.add_argument("--quick", action="store_true", help="every method once on 24 epochs: the race runs")
    parser.add_argument("--methods", type=_methods, default=list(PEERS),
                        help="the trialkit methods to race, with their peers (default Hyperband,BOHB,ASHA,PBT)")
    parser.add_argument("--cold", action="store_true", help="trialkit's trials start cold (warmStart off)")
    opts = parser.parse_args(argv)
    racing = {f"trialkit {m}" for m in opts.methods} | {peer for m in opts.methods for peer in PEERS[m]}
    methods = [(system, name, functools.partial(runner, warm_start=False) if opts.cold and runner is run_trialkit
                else runner) for system, name, runner in METHODS if f"{system} {name}" in racing]
    if opts.quick:
        opts.budget, opts.seeds = 24, 1
    lacking = [name for name in ("ray.tune", "optuna", "sklearn", "statsmodels") if not _importable(name)]
    if lacking:
        parser.exit(2, f"{parser.prog}: the peers or the problem need {', '.join(lacking)}, which this Python "
                       "lacks: run it with the venv that `./bootstrap.sh test` makes (.venv/bin/python)\n")
    work = Path(tempfile.mkdtemp(prefix="bench-search-"))
    # Ray 2.60 turns token authentication on for a new local cluster and writes a token to ~/.ray: this race's
    # cluster is its own, on this machine; leave other clusters' settings alone.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # its reporter, silent at verbose=0: no boxes among our lines
    import ray

    ray.init(address="local", num_cpus=opts.concurrency, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(BENCH)}})
    try:
        data = work / "digits.npz"
        problem.prepare_data(data, opts.epoch_scale)
        outcomes: Dict[str, List[Outcome]] = {f"{system} {name}": [] for system, name, _ in methods}
        print(f"budget {opts.budget} trial-epochs, {opts.concurrency} at once, seeds {opts.seeds}, "
              f"epoch scale {opts.epoch_scale}, trialkit {'cold' if opts.cold else 'warm (warmStart)'}, "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
        for seed in range(opts.seeds):
            for system, name, runner in (methods if seed % 2 == 0 else methods[::-1]):
                reports = runner(name, seed, opts.budget, opts.concurrency, data, work)
                result = outcome(reports, opts.budget)
                outcomes[f"{system} {name}"].append(result)
                print(f"seed {seed}  {system + ' ' + name:24s} best {result.best:.4f} at {result.time_to_best:6.1f} s"
                      f"  ({result.epochs} epochs counted)", flush=True)
        print(table(outcomes, verdicts=not opts.quick))
        return 0
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def standard_error(values: List[float]) -> float:
    """The standard error of the values' mean (the seeds' spread over the root of their number; nan for one)."""
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")


def table(outcomes: Dict[str, List[Outcome]], verdicts: bool = True) -> str:
    """The mean figures of every method, then each trialkit method against its best peer: MET or MISSED, or
    without `verdicts` (--quick, whose budget is too small to judge) the figures alone. Beside each mean best,
    its standard error over the seeds, and in each verdict the standard error of the two means' difference: the
    resolution the seeds give the comparison, which the verdict itself does not weigh."""
    lines = ["", f"{'method':26s} {'best (mean)':>12s} {'s.e.':>7s} {'time to best (mean s)':>22s}"]
    means = {name: (statistics.mean(o.best for o in runs), statistics.mean(o.time_to_best for o in runs))
             for name, runs in outcomes.items()}
    errors = {name: standard_error([o.best for o in runs]) for name, runs in outcomes.items()}
    lines += [f"{name:26s} {best:12.4f} {errors[name]:7.4f} {seconds:22.1f}" for name, (best, seconds) in means.items()]
    lines.append("")
    for method, peers in PEERS.items():
        if f"trialkit {method}" not in outcomes:
            continue  # not raced (--methods)
        ours = outcomes[f"trialkit {method}"]
        peer = max(peers, key=lambda name: means[name][0])
        theirs = outcomes[peer]
        to_their_best = statistics.median(reached(o.reports, p.best) for o, p in zip(ours, theirs))
        their_time = statistics.median(p.time_to_best for p in theirs)
        best, peer_best = means[f"trialkit {method}"][0], means[peer][0]
        if to_their_best == float("inf"):
            reaching = f"never reached the peer's best (it took {their_time:.1f} s)"
        else:
            reaching = (f"to the peer's best {to_their_best:.1f} s vs its {their_time:.1f} s "
                        f"(ratio {to_their_best / max(their_time, 1e-9):.2f})")
        verdict = ("MET" if best >= peer_best and to_their_best < their_time else "MISSED") if verdicts \
            else "no verdict (--quick)"
        spread = (errors[f"trialkit {method}"] ** 2 + errors[peer] ** 2) ** 0.5
        lines.append(f"trialkit {method} vs {peer}: best {best:.4f} vs {peer_best:.4f} (s.e. of the difference "
                     f"{spread:.4f}); {reaching}: {verdict}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
