"""trialkit as a user drives it: the `trialkit` command, an experiment run in the background, waits with bounds.

    run = Run(step_dir, config)           # `trialkit run CONFIG`, its id read from its first line
    rows = run.export()                    # `trialkit experiment export ID` (JSON)
    cli("trial", "kill", run.trial(0))     # any command; a non-zero exit is Failed with its output
    run.finish(60)                         # its exit code, waited for; stop() ends it if it still runs
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, TypeVar


T = TypeVar("T")
LOG_LINES = 30  # of each log, into the check's log when an experiment ends
WORKLOADS = Path(__file__).resolve().parent / "workloads"


class Failed(Exception):
    """The check's verdict: what went wrong, in one line (figures measured so far may ride along)."""

    def __init__(self, reason: str, figures: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.figures = figures


def trialkit_command() -> List[str]:
    """The `trialkit` command on PATH (the one installed with trialkit), else this Python's module."""
    found = shutil.which("trialkit")
    return [found] if found else [sys.executable, "-m", "trialkit.cli"]


def cli(*args: Any, timeout: float = 60) -> str:
    """`trialkit ARGS...`: its output; Failed when it exits non-zero."""
    argv = trialkit_command() + [str(arg) for arg in args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise Failed(f"`trialkit {' '.join(map(str, args))}` exited {done.returncode}: {said[-1] if said else ''}")
    return done.stdout


def wait_until(what: str, condition: Callable[[], Optional[T]], seconds: float, every: float = 0.1) -> T:
    """condition()'s first true value; Failed naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"{what}: not within {seconds:g} s")
        time.sleep(every)


def write_config(folder: Path, **keys: Any) -> Path:
    """An NNI v2 config in `folder` whose trials run a script of workloads/ (a search space of one choice)."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    space = folder / "search_space.json"
    space.write_text(json.dumps({"seed": {"_type": "choice", "_value": [0, 1, 2, 3]}}))
    config = {"searchSpaceFile": str(space), "trialCodeDirectory": str(WORKLOADS), "trialConcurrency": 1,
              "maxTrialNumber": 1, "trialGpuNumber": 1, "trialGraceSeconds": 10,
              "tuner": {"name": "Random", "classArgs": {"optimize_mode": "minimize"}},
              "trainingService": {"platform": "local"}}
    config.update(keys)
    path = folder / "config.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class Run:
    """`trialkit run CONFIG` in the background, its output in run.log beside the config."""

    def __init__(self, config: Path, start_seconds: float = 60):
        self.log = config.parent / "run.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(trialkit_command() + ["run", str(config)], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        line = wait_until("`trialkit run` to print its experiment's id", self._first_line, start_seconds)
        self.id = line.split()[-1]

    def _first_line(self) -> Optional[str]:
        text = self.log.read_text()
        if "\n" in text:
            line = text.splitlines()[0]
            if line.startswith("trialkit: error"):
                raise Failed(line)
            return line
        if self.proc.poll() is not None:
            raise Failed(f"`trialkit run` exited {self.proc.returncode}: {text.strip()[-200:]}")
        return None

    def trial(self, sequence: int) -> str:
        return f"{self.id}-{sequence:05d}"

    def export(self, all_runs: bool = False) -> List[Dict[str, Any]]:
        return json.loads(cli("experiment", "export", self.id, *(["--all-runs"] if all_runs else [])))

    def row(self, sequence: int) -> Optional[Dict[str, Any]]:
        """The trial's row in the export (its latest run); None before it exists."""
        return next((row for row in self.export() if row["sequence"] == sequence), None)

    def status(self, sequence: int) -> Optional[str]:
        row = self.row(sequence)
        return row["status"] if row else None

    def finish(self, seconds: float) -> int:
        """Wait for `trialkit run` to end by itself; its exit code."""
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            raise Failed(f"`trialkit run` did not end within {seconds:g} s (its trials: {self.summary()})") from None

    def summary(self) -> str:
        try:
            return ", ".join(f"{row['sequence']} {row['status']}" for row in self.export()) or "none yet"
        except Failed as err:
            return err.reason

    def stop(self, log: Callable[[str], None]) -> None:
        """End the experiment if it still runs (`trialkit experiment stop`, then a kill); log the ends of its logs."""
        if self.proc.poll() is None:
            try:
                cli("experiment", "stop", self.id, timeout=30)
                self.proc.wait(timeout=30)
            except (Failed, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        trials = Path(os.environ["TRIALKIT_HOME"]) / "experiments" / self.id / "trials"
        for path in [self.log, *sorted(trials.glob("*/trial.log"))]:
            lines = path.read_text(errors="replace").splitlines()[-LOG_LINES:]
            log(f"{path} (its last {len(lines)} lines):\n" + "\n".join(f"    {line}" for line in lines))


def step_env(step_dir: Path) -> Dict[str, str]:
    """The environment a step's commands run in: their own TRIALKIT_HOME (a pool of 4 slots), markers in step_dir."""
    home = step_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    # Slots are not what these checks measure: 4 whatever the machine's cores, so the GPU alone makes trials wait.
    (home / "pools.yml").write_text("pools:\n  default: {slots: 4}\n")
    return {"TRIALKIT_HOME": str(home), "GPU_CHECK_SHARED": str(step_dir), "PYTHONUNBUFFERED": "1",
            # Trials run `python3` from PATH, as a user's do: this Python's, which has trialkit.
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", os.defpath)}
