"""What the experiment tests share: the `trialkit` command run as a user runs it, and tiny trials.

Every test gets its own TRIALKIT_HOME (the `home` fixture sets it in the
environment the commands inherit). Trials are trivial Python scripts (no
torch): the machine is small and shared.
"""
from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import yaml

from harness import wait_until

PYTHON = sys.executable
TIMEOUT = 120.0  # an upper bound for a loaded machine; never waited for on success

# A trial using trialkit's SDK: STEPS intermediate results, then the final one;
# parameter x is the metric. `sleep` (seconds) waits before the final result.
SDK_TRIAL = """
import time, trialkit
p = trialkit.get_next_parameter()
for step in range({steps}):
    trialkit.report_intermediate_result(p["x"])
time.sleep(p.get("sleep", 0))
trialkit.report_final_result(p["x"])
"""


def cli(*args: Any, timeout: float = TIMEOUT, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """`trialkit ARGS...`, to completion, output captured as text."""
    return subprocess.run([PYTHON, "-m", "trialkit.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def start_cli(*args: Any, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """`trialkit ARGS...` in the background, its stdout a pipe of text lines."""
    return subprocess.Popen([PYTHON, "-m", "trialkit.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def experiment(tmp_path: Path, space: Dict[str, Any], script: str, name: str = "exp", **keys: Any) -> Path:
    """Write <tmp>/<name>/trial.py and config.yml (NNI v2 keys); return the config's path."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "trial.py").write_text(textwrap.dedent(script))
    (folder / "search_space.json").write_text(json.dumps(space))
    config = {"searchSpaceFile": "search_space.json", "trialCommand": "python3 trial.py",
              "trialConcurrency": 2, "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}},
              "trainingService": {"platform": "local"}}
    config.update(keys)
    path = folder / "config.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def experiment_id(first_line: str) -> str:
    """The id the first line of `trialkit run` ends with."""
    return first_line.split()[-1]


GATED = ("import os, time, trialkit\np = trialkit.get_next_parameter()\nwhile not os.path.exists({go!r}):\n"
         "    time.sleep(0.05)\ntrialkit.report_final_result(p['x'])\n")


def gated_run(tmp_path: Path) -> Tuple[Path, subprocess.Popen]:
    """`trialkit run` of two trials (x: 0.25, 0.75) that end once the file it returns exists, and the run."""
    go = tmp_path / "go"
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [0.25, 0.75]}}, GATED.format(go=str(go)),
                        maxTrialNumber=2)
    return go, start_cli("run", config)


def printed_page(proc: subprocess.Popen) -> Tuple[str, str]:
    """The experiment id and the page's URL (with its token) that a run prints first."""
    exp = experiment_id(proc.stdout.readline())
    proc.stdout.readline()  # manager: ...
    return exp, proc.stdout.readline().split()[-1]


def export(experiment: str) -> List[Dict[str, Any]]:
    done = cli("experiment", "export", experiment)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def by_sequence(rows: List[Dict[str, Any]]) -> Dict[int, Dict[str, Any]]:
    return {row["sequence"]: row for row in rows}


def stored(home: Path, experiment: str, sql: str, *args: Any) -> List[tuple]:
    """Rows from an experiment's store, read beside its running manager as the CLI reads it (WAL)."""
    with closing(sqlite3.connect(f"file:{home / 'experiments' / experiment / 'trialkit.db'}?mode=ro", uri=True)) as db:
        return db.execute(sql, args).fetchall()


def trial_status(home: Path, trial_id: str) -> Optional[str]:
    """Its status in the store; None before the trial exists."""
    rows = stored(home, trial_id.rpartition("-")[0], "SELECT status FROM trials WHERE id=?", trial_id)
    return rows[0][0] if rows else None


def reported(home: Path, trial_id: str) -> int:
    """How many intermediate results a trial has delivered."""
    return stored(home, trial_id.rpartition("-")[0], "SELECT COUNT(*) FROM records WHERE trial=? AND type=?",
                  trial_id, "PERIODICAL")[0][0]


def interrupted_after(config: Path, ended: int, status: str = "SUCCEEDED", env: Optional[Dict[str, str]] = None,
                      out: Optional[list] = None, marker: Optional[Path] = None) -> str:
    """`trialkit run CONFIG`, Ctrl-C (SIGINT) once `ended` trials ended as `status` and then, with `marker`, once
    that file exists (a trial's sign that it is where the test wants it stopped); the experiment's id. `out` gets
    the lines printed after the Ctrl-C."""
    proc = start_cli("run", config, env=env)
    try:
        exp = experiment_id(proc.stdout.readline())
        seen = 0
        while seen < ended:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("trial ") and f" {status} " in line:
                seen += 1
        if marker is not None:
            wait_until(lambda: marker.exists() or proc.poll() is not None, 120, f"{marker} (or the run's end)")
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        if out is not None:
            out.extend(rest.splitlines())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return exp


def sigkilled_while_running(config: Path, home: Path, reports: int = 1,
                            before_kill: Callable[[str, str], Any] = lambda exp, trial: None) -> Tuple[str, str]:
    """`trialkit run CONFIG`, SIGKILLed once its first trial delivered `reports` intermediate results (and
    `before_kill(experiment, trial)` returned): its keeper outlives it. The experiment's and the trial's ids."""
    run = start_cli("run", config)
    try:
        exp = experiment_id(run.stdout.readline())
        trial = f"{exp}-00000"
        wait_until(lambda: reported(home, trial) >= reports, 120, "the trial's first results")
        before_kill(exp, trial)
        run.send_signal(signal.SIGKILL)
        run.wait(60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    return exp, trial


def runs_as_stored(home: Path, trial_id: str) -> Tuple[List[Tuple[int, str]], List[Tuple[Any, ...]]]:
    """A trial's (run, status) of each STATUS record in the store's order, and `experiment export --all-runs`'s
    (run, status, intermediate results, final result) of each run: every run's records, as the store kept them."""
    exp = trial_id.rpartition("-")[0]
    statuses = [(run, json.loads(value)["status"]) for value, run in stored(
        home, exp, "SELECT value, run FROM records WHERE trial=? AND type='STATUS' ORDER BY seq", trial_id)]
    done = cli("experiment", "export", exp, "--all-runs")
    assert done.returncode == 0, done.stderr
    runs = [(row["run"], row["status"], row["intermediate"], row["final"])
            for row in json.loads(done.stdout) if row["trial_id"] == trial_id]
    return statuses, runs


def paused_and_activated(home: Path, run_args: List[Any], reports: int = 2,
                         while_paused: Callable[[str, str], Any] = lambda exp, trial: None,
                         timeout: float = TIMEOUT) -> Tuple[str, Any]:
    """`trialkit run RUN_ARGS` in the background; its trial 0 paused (`trialkit trial pause`) once it delivered
    `reports` intermediate results, and stopped with its checkpoint (PREEMPTED); `while_paused(experiment, trial)`;
    the trial activated and the run to its end (exit 0). Returns (the experiment's id, what while_paused
    returned)."""
    proc = start_cli("run", *run_args)
    try:
        exp = experiment_id(proc.stdout.readline())
        trial = f"{exp}-00000"
        wait_until(lambda: reported(home, trial) >= reports, timeout, f"{reports} intermediate results")
        assert cli("trial", "pause", trial).returncode == 0
        wait_until(lambda: trial_status(home, trial) == "PREEMPTED", timeout, "the trial to stop with its checkpoint")
        seen = while_paused(exp, trial)
        assert cli("trial", "activate", trial).returncode == 0
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, out + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return exp, seen


# Counts steps from its checkpoint dir (trialkit.checkpoint_dir()); on SIGTERM saves the step there and exits 143
# (AdaptDL's convention). A first run holds at step 10 until it is stopped; a resumed one goes on to 30 and reports
# x. It prints where each run starts: "restart N from step S".
RESUMABLE = """
import os, pathlib, signal, sys, time, trialkit
saved = pathlib.Path(trialkit.checkpoint_dir()) / "step"
step = int(saved.read_text()) if saved.exists() else 0
print(f"restart {os.environ.get('ADAPTDL_NUM_RESTARTS', os.environ.get('TRIALKIT_RESTART_COUNT'))} from step {step}",
      flush=True)
def checkpoint(signum, frame):
    saved.write_text(str(step))
    print(f"checkpoint at step {step}", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, checkpoint)
x = trialkit.get_next_parameter()["x"]
resumed = saved.exists()
while step < 30:
    if step == 10 and not resumed:
        time.sleep(0.1)
        continue
    step += 1
    if step % 5 == 0:
        trialkit.report_intermediate_result(step)
    time.sleep(0.05)
trialkit.report_final_result(x)
"""
