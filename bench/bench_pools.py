"""Many experiments on one resource pool (issue 33, item 5), and how fast a freed slot is taken again.

    python bench/bench_pools.py [--experiments 50] [--trials 20] [--slots 4] [--hold 0.1]
    python bench/bench_pools.py --wake [--experiments 8]

Scale (the default): EXPERIMENTS real `trialkit run` processes, started one after another in a temp
TRIALKIT_HOME whose pools.yml has one pool of SLOTS slots, each TRIALS trivial trials (trialConcurrency =
SLOTS, so any one of them could fill the pool; experiment i has poolPriority 60 - i, so the later started go
first, and preemptible: false, so a trial runs once: preemption would pause and resume it). Each trial notes its keeper's start (from the keeper's pidfile: the fork that follows its slot's
grant), its own start and its own end. Checked from those notes:
  - no slot oversubscribed: at no instant more than SLOTS trials between their own start and end;
  - every trial run once: EXPERIMENTS x TRIALS notes, one per trial id, every trial SUCCEEDED in its store;
  - the queue's order: no trial of a job was granted while a job ahead of it (smaller priority, or the
    same and joined earlier, from pools.db) had a trial refused and still waiting. Waiting is from that
    trial's "waiting for ... slot" status in its store to its keeper's next start; a grant is a keeper's
    start. A case counts only when both sides hold by more than MARGIN (the fork after a grant, and the
    status written after a refusal, are late by at most that on this machine).
While it runs, `trialkit job list --pool` races its floor, `python -c 'import trialkit.cli'` (the
interpreter and the CLI's imports, nothing run), alternating: wall time of each, p50/p99/max, and the
CPU time each used. Goal: job list < 200 ms (p50 and p99 printed MET/MISSED), and its ratio to the floor.
Every command runs with Python's bytecode cache on (in the bench's temp dir), as an installed trialkit.

--wake: EXPERIMENTS experiments of one trial each on a pool of one slot, started together: each trial
after the first waits for the slot the one before it frees. Figure: for each hand-over, the next
trial's keeper start minus the previous trial's own end (the keeper's exit, the release, the waiting
control plane's wake-up, its grant and fork), median and max.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import closing
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
GOAL_SECONDS = 0.2
MARGIN = 1.0  # seconds: see the order check above
TRIAL = """
import os, time, trialkit
p = trialkit.get_next_parameter()
start = time.time()
boot = start - time.clock_gettime(time.CLOCK_BOOTTIME)  # /proc's start ticks count from boot
pidfile = os.path.join(os.environ["TRIALKIT_TRIAL_DIR"], ".trialkit", "keeper.pid")
_pid, ticks, _grace = open(pidfile).read().split()
forked = boot + int(ticks) / os.sysconf("SC_CLK_TCK")
time.sleep({hold})
end = time.time()
trialkit.report_final_result(p["x"])
fd = os.open({log!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, f"{{os.environ['TRIALKIT_TRIAL_ID']}} {{forked}} {{start}} {{end}}\\n".encode())  # one write: whole
os.close(fd)
"""


def cli(*args: str) -> List[str]:
    return [PYTHON, "-m", "trialkit.cli", *args]


def write_experiment(folder: Path, log: Path, trials: int, concurrency: int, hold: float, priority: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "trial.py").write_text(textwrap.dedent(TRIAL.format(log=str(log), hold=hold)))
    (folder / "search_space.json").write_text(json.dumps({"x": {"_type": "uniform", "_value": [0, 1]}}))
    config = {"searchSpaceFile": "search_space.json", "trialCommand": f"{PYTHON} trial.py",
              "trialConcurrency": concurrency, "maxTrialNumber": trials,
              "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}},
              "trainingService": {"platform": "local", "poolPriority": priority, "preemptible": False}}
    path = folder / "config.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def start_experiments(work: Path, count: int, trials: int, concurrency: int, hold: float) -> Tuple[Path, List]:
    log = work / "notes"
    procs = []
    for i in range(count):
        config = write_experiment(work / f"e{i:02d}", log, trials, concurrency, hold, priority=60 - i)
        procs.append(subprocess.Popen(cli("run", str(config)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return log, procs


def timed(argv: List[str]) -> Tuple[float, float]:
    """(wall, CPU) seconds of the command (its output dropped; its errors shown)."""
    began = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, os.environ,
                         file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])
    _, status, usage = os.wait4(pid, 0)  # its own CPU time, not the experiments' (children reaped elsewhere)
    took = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed")
    return took, usage.ru_utime + usage.ru_stime


def race_job_list(procs: List) -> Dict[str, List[Tuple[float, float]]]:
    """`job list --pool` and its floor, alternating, while any experiment runs."""
    out: Dict[str, List[Tuple[float, float]]] = {"job list --pool": [], "floor": []}
    while any(proc.poll() is None for proc in procs):
        out["job list --pool"].append(timed(cli("job", "list", "--pool")))
        out["floor"].append(timed([PYTHON, "-c", "import trialkit.cli"]))
    return out


def finish(procs: List) -> List[str]:
    ids = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"an experiment failed (exit {proc.returncode}): {err.strip()[-2000:]}")
        ids.append(out.splitlines()[0].split()[-1])
    return ids


def notes(log: Path) -> List[Dict]:
    rows = []
    for line in log.read_text().splitlines():
        trial, forked, start, end = line.split()
        rows.append({"trial": trial, "experiment": trial.rpartition("-")[0], "forked": float(forked),
                     "start": float(start), "end": float(end)})
    return rows


def most_at_once(spans: List[Dict]) -> int:
    events = sorted([(s["start"], 1) for s in spans] + [(s["end"], -1) for s in spans], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:  # an end at the same instant as a start goes first
        now += step
        most = max(most, now)
    return most


def stored(home: Path, experiment: str, sql: str) -> List[tuple]:
    with closing(sqlite3.connect(f"file:{home / 'experiments' / experiment / 'trialkit.db'}?mode=ro", uri=True)) as db:
        return db.execute(sql).fetchall()


def check_once(home: Path, ids: List[str], rows: List[Dict], trials: int) -> List[str]:
    """What breaks 'every trial run once' (empty when it holds)."""
    problems = []
    seen: Dict[str, int] = {}
    for row in rows:
        seen[row["trial"]] = seen.get(row["trial"], 0) + 1
    again = sorted(trial for trial, count in seen.items() if count > 1)
    if again:
        history = stored(home, again[0].rpartition("-")[0], f"SELECT status, reason, source FROM statuses "
                                                           f"WHERE trial = '{again[0]}' ORDER BY id")
        problems.append(f"{len(again)} trials noted more than once, e.g. {again[:3]}; {again[0]}'s statuses: "
                        f"{history}")
    for experiment in ids:
        statuses = [status for (status,) in stored(home, experiment, "SELECT status FROM trials")]
        if len(statuses) != trials or set(statuses) != {"SUCCEEDED"}:
            problems.append(f"{experiment}: {len(statuses)} trials, statuses {sorted(set(statuses))}")
        missing = [f"{experiment}-{n:05d}" for n in range(trials) if f"{experiment}-{n:05d}" not in seen]
        if missing:
            problems.append(f"{experiment}: no note from {missing[:3]}")
    return problems


def order_breaks(home: Path, ids: List[str], rows: List[Dict]) -> List[str]:
    """Grants to a job while a job ahead of it waited (see the module's docstring)."""
    with closing(sqlite3.connect(str(home / "pools.db"))) as db:
        place = {experiment: (priority, submitted) for experiment, priority, submitted
                 in db.execute("SELECT experiment, priority, submitted FROM jobs")}
    forks: Dict[str, List[float]] = {}
    for row in rows:
        forks.setdefault(row["trial"], []).append(row["forked"])
    waits = []  # (experiment, trial, from, until)
    for experiment in ids:
        for trial, since in stored(home, experiment, "SELECT trial, time FROM statuses WHERE status = 'WAITING' "
                                                     "AND reason LIKE 'waiting for % slot%'"):
            until = min((when for when in forks.get(trial, ()) if when > since), default=None)
            if until is not None:  # else a status the control plane wrote after the trial started (a late look)
                waits.append((experiment, trial, since, until))
    breaks = []
    for row in rows:
        mine = place[row["experiment"]]
        for experiment, trial, since, until in waits:
            if place[experiment] < mine and since + MARGIN < row["forked"] < until - MARGIN:
                breaks.append(f"{row['trial']} started at {row['forked']:.2f} while {trial} (ahead) waited "
                              f"{since:.2f}..{until:.2f}")
    return breaks


def quantiles(values: List[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, " \
           f"max {ordered[-1] * 1000:.0f} ms ({len(ordered)} runs)"


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def scale(work: Path, home: Path, opts: argparse.Namespace) -> bool:
    began = time.time()
    log, procs = start_experiments(work, opts.experiments, opts.trials, opts.slots, opts.hold)
    latencies = race_job_list(procs)
    ids = finish(procs)
    took = time.time() - began
    rows = notes(log)
    print(f"{opts.experiments} experiments x {opts.trials} trials on {opts.slots} slots: {took:.0f} s, "
          f"{len(rows)} trials noted, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    most = most_at_once(rows)
    once = check_once(home, ids, rows, opts.trials)
    breaks = order_breaks(home, ids, rows)
    print(f"never oversubscribed: most trials at once {most} of {opts.slots} slots: {verdict(most <= opts.slots)}")
    print(f"every trial run once: {verdict(not once)}" + "".join(f"\n  {line}" for line in once[:10]))
    print(f"the queue's order: {len(breaks)} grants past a waiting job ahead (margin {MARGIN:g} s): "
          f"{verdict(not breaks)}" + "".join(f"\n  {line}" for line in breaks[:10]))
    job_list, floor = [wall for wall, _ in latencies["job list --pool"]], [wall for wall, _ in latencies["floor"]]
    print(f"job list --pool : {quantiles(job_list)}; CPU p50 "
          f"{statistics.median(cpu for _, cpu in latencies['job list --pool']) * 1000:.0f} ms")
    print(f"floor (python -c 'import trialkit.cli'): {quantiles(floor)}; CPU p50 "
          f"{statistics.median(cpu for _, cpu in latencies['floor']) * 1000:.0f} ms")
    p50, p99 = statistics.median(job_list), sorted(job_list)[min(len(job_list) - 1, int(len(job_list) * 0.99))]
    print(f"job list / floor (p50): {p50 / statistics.median(floor):.2f}x; job list < {GOAL_SECONDS * 1000:.0f} ms: "
          f"p50 {verdict(p50 < GOAL_SECONDS)}, p99 {verdict(p99 < GOAL_SECONDS)}")
    return most <= opts.slots and not once and not breaks and p50 < GOAL_SECONDS


def wake(work: Path, opts: argparse.Namespace) -> bool:
    log, procs = start_experiments(work, opts.experiments, 1, 1, opts.hold)
    finish(procs)
    rows = sorted(notes(log), key=lambda row: row["forked"])
    gaps = [after["forked"] - before["end"] for before, after in zip(rows, rows[1:])]
    print(f"hand-overs of one slot between experiments: {len(gaps)}; previous trial's end -> next keeper's start: "
          f"median {statistics.median(gaps) * 1000:.0f} ms, max {max(gaps) * 1000:.0f} ms, "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return min(gaps) >= -0.01  # the next started after the previous ended (to the ticks' 10 ms)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--hold", type=float, default=0.1, help="seconds each trial holds its slot")
    parser.add_argument("--wake", action="store_true", help="measure the wake-up of a waiting experiment")
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_pools_"))
    home = work / "home"
    home.mkdir()
    os.environ["TRIALKIT_HOME"] = str(home)
    # Bytecode cached, as an installed trialkit has it (this checkout's shells set PYTHONDONTWRITEBYTECODE:
    # each command then compiles trialkit's sources, ~40 ms of CPU more), apart from the checkout's.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    (home / "pools.yml").write_text(f"pools:\n  default: {{slots: {1 if opts.wake else opts.slots}}}\n")
    opts.experiments = opts.experiments or (8 if opts.wake else 50)
    met = wake(work, opts) if opts.wake else scale(work, home, opts)
    if met:
        shutil.rmtree(work)
    else:
        print(f"kept {work} (the experiments' stores, the trials' notes) for a look")
    return 0 if met else 1

if __name__ == "__main__":
    sys.exit(main())
