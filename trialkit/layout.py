"""The keeper's files inside a trial dir: one place that names them.

The keeper writes them; the local and Ray platforms read the status and the
spool; scripts/run.sh and scripts/cleanup.sh spell the same paths in shell
(tests/test_layering.py checks that they match these names).

    <trial dir>/.trialkit/status.json   the trial's status, replaced atomically
    <trial dir>/.trialkit/spool/        records not yet acknowledged by the manager
    <trial dir>/.trialkit/keeper.pid    `PID START_TICKS GRACE` of the running keeper
    <trial dir>/.trialkit/channel       the SDK's framed records
    <trial dir>/.trialkit/stop          present: the trial was asked to stop
    <trial dir>/.trialkit/.stop.ready   made by the keeper once the command runs, renamed to `stop` when one is asked
    <trial dir>/.trialkit/reserve       room the keeper keeps on the disk for its final status (keeper/spool.py)
    <trial dir>/.trialkit/fetch.out     run.sh's fetch of the code or trial side, while it runs (pods only)
    <trial dir>/.trialkit/imported      what a warm trial imported beside the zygote's preloads, until it reads it
"""
from __future__ import annotations

from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: the keeper loads this module (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Optional, Tuple

HOME = ".trialkit"
STATUS = "status.json"
SPOOL = "spool"
PIDFILE = "keeper.pid"
CHANNEL = "channel"
STOP = "stop"
RESERVE = "reserve"
TRIALSIDE = "trialside"  # a pod's cache of trialkit's trial side, fetched by run.sh when the image lacks trialkit
IMPORTED = "imported"  # keeper/warm.py writes it as a warm trial ends, keeper/zygote.py reads and removes it
FETCH_OUT = "fetch.out"  # run.sh's fetch.py output while it runs (its reason if the fetch fails), then removed
# How long the keeper tries to deliver records at exit by default; a platform
# that waits for a stopping keeper adds it to the trial's grace.
FLUSH_SECONDS = 5.0
# cleanup.sh (a pod's preStop hook) waits the keeper's grace plus this long for
# it to flush and exit; a pod's terminationGracePeriodSeconds must cover both.
CLEANUP_MARGIN_SECONDS = 6


def home(trial_dir: Path) -> Path:
    return Path(trial_dir) / HOME


def status_path(trial_dir: Path) -> Path:
    return home(trial_dir) / STATUS


def spool_dir(trial_dir: Path) -> Path:
    return home(trial_dir) / SPOOL


def stop_ready(stop_file: Path) -> Path:
    """Where the keeper makes the stop file ahead of time, beside it (rename(2) stays in one directory)."""
    return stop_file.with_name(f".{stop_file.name}.ready")


def nni_metrics_path(trial_dir: Path) -> Path:
    """NNI local mode's metrics file, which the keeper follows beside the channel (the child's NNI_SYS_DIR is the
    trial dir)."""
    return Path(trial_dir) / ".nni" / "metrics"


def pidfile_path(trial_dir: Path) -> Path:
    return home(trial_dir) / PIDFILE


def read_pidfile(trial_dir: Path) -> Optional[Tuple[int, int, float]]:
    """(pid, start ticks, grace seconds) from the keeper's pidfile; None when there is none to trust."""
    try:
        pid, ticks, grace = pidfile_path(trial_dir).read_text().split()
        return int(pid), int(ticks), float(grace)
    except (OSError, ValueError):
        return None


def checkpoint_dir(trial_dir: Path) -> Path:
    """The trial's checkpoint dir when TRIALKIT_CHECKPOINT_DIR names none (`trialkit.checkpoint_dir()`)."""
    return Path(trial_dir) / "checkpoint"
