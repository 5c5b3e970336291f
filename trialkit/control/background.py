"""Experiments run in the background, as `trialkit run --detach` and the Python API start them.

    child = start(["run", CONFIG, "--experiment-id", ID], experiment_dir)
    info = wait_listening(child, experiment_dir, 30.0)   # its manager.json, once it listens
    status(experiment_dir, store.experiment(ID))         # RUNNING, DONE, ..., INTERRUPTED

The background run is `python -P -m trialkit.cli ARGV` (process.own_module_argv) in its own session, with
no parent-death signal: it outlives the program that started it, and its
output goes to the experiment's manager.log (or, when asked, to ours).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from trialkit import process
from trialkit.control import admin
from trialkit.manager import paths

INTERRUPTED = "INTERRUPTED"  # an experiment stored as running or paused whose manager is gone
_POLL = 0.05  # a one-off wait for the child to write manager.json: no event to wait on


def start(argv: List[str], experiment_dir: Path, to_log: bool = True) -> process.Child:
    """Start `trialkit ARGV` apart from us; its output to manager.log, or to our own stdout and stderr."""
    import subprocess  # here: `experiment list` reads status() and starts nothing

    if not to_log:
        return process.spawn(process.own_module_argv("trialkit.cli", *argv), stdin=subprocess.DEVNULL,
                             die_with_parent=False)
    # 0600: the log holds the page's URL, and the URL the admin token.
    with os.fdopen(os.open(log_path(experiment_dir), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
        return process.spawn(process.own_module_argv("trialkit.cli", *argv), stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, die_with_parent=False)


def log_path(experiment_dir: Path) -> Path:
    return Path(experiment_dir) / paths.MANAGER_LOG


def wait_listening(child: process.Child, experiment_dir: Path, timeout: float) -> Optional[admin.ManagerInfo]:
    """The child's manager.json once its manager listens; None if it exited without listening or is still
    starting. A manager that listened and has already ended (a resumed experiment with nothing left to do)
    counts: its exit is checked before its file, so the file it wrote just before is still seen."""
    deadline = time.monotonic() + timeout
    while True:
        exited = child.popen.poll() is not None
        info = admin.read_info(experiment_dir)
        if info is not None and info.pid == child.pid:
            return info
        if exited or time.monotonic() >= deadline:
            return None
        time.sleep(_POLL)


def status(experiment_dir: Path, experiment: Dict[str, Any]) -> str:
    """The stored status; INTERRUPTED for one stored as running whose manager is gone."""
    if experiment["status"] not in ("RUNNING", "PAUSED"):
        return experiment["status"]
    return experiment["status"] if manager_runs(experiment_dir) else INTERRUPTED


def manager_runs(experiment_dir: Path) -> bool:
    info = admin.read_info(experiment_dir)
    return info is not None and info.running()
