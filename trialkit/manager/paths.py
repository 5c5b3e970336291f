"""Where experiments live on disk, and how ids name them.

    $TRIALKIT_HOME (default ~/.trialkit)/experiments/<experiment id>/
        trialkit.db          the store (SQLite, WAL)
        manager.json         the manager: pid, url, port, admin token (mode 0600)
        manager.log          a detached manager's output
        warm-start-cold.txt  why its trials started cold though warmStart was on (`experiment show`)
        trials/<trial id>/   each trial's dir (a local trial's TRIALKIT_TRIAL_DIR)
            trial.log        a local trial's keeper output, the trial's echoed in it (`trialkit trial logs`)

An experiment run with experimentWorkingDirectory lives there, and a link of
its id in the default root points at it, so every command finds it by id.
A trial id is "<experiment id>-<sequence, 5 digits>", so a trial can be found
from its id alone.
"""
from __future__ import annotations

import os
import re
import string
from pathlib import Path
from typing import List, Optional

from trialkit.manager.store import DB_NAME
from trialkit.errors import UserError

HOME_ENV = "TRIALKIT_HOME"
MANAGER_FILE = "manager.json"
MANAGER_LOG = "manager.log"
TRIAL_LOG = "trial.log"  # in a trial dir: a local keeper's output, what a container's log would hold
COLD_LINES = "warm-start-cold.txt"  # the local platform's lines of why trials start cold though warmStart is on
_ALPHABET = string.ascii_lowercase + string.digits


def home() -> Path:
    return Path(os.environ.get(HOME_ENV) or "~/.trialkit").expanduser()


def experiments_root(working_directory: Optional[str] = None) -> Path:
    return Path(working_directory) if working_directory else home() / "experiments"


def new_experiment_id() -> str:
    import secrets  # here, not at the top: the store's readers (`trialkit trial list`) start without it

    # A letter first: ids appear in Kubernetes names, which must not start with a digit.
    return secrets.choice(string.ascii_lowercase) + "".join(secrets.choice(_ALPHABET) for _ in range(7))


_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # new_experiment_id()'s, and room for ids given by hand


def check_experiment_id(experiment_id: str, where: str = "EXPERIMENT_ID") -> str:
    """An id that names one dir under the experiments' root: no path of its own (`../x`), no NUL, not too long."""
    if not _ID.fullmatch(experiment_id):
        shown = repr(experiment_id) if len(experiment_id) <= 40 else repr(experiment_id[:37]) + "..."
        raise UserError(f"{shown} is not an experiment id", where,
                        "ids are up to 64 letters, digits, '.', '_' or '-'; see `trialkit experiment list`")
    return experiment_id


def trial_id(experiment_id: str, sequence: int) -> str:
    return f"{experiment_id}-{sequence:05d}"


def experiment_of(trial: str) -> str:
    """The experiment of a trial id the user gave: its part before the last '-', an experiment of this home;
    UserError at TRIAL_ID (the argument they gave) when it is not a trial id or no such experiment is here."""
    experiment, _, sequence = trial.rpartition("-")
    if not experiment or not (sequence.isascii() and sequence.isdigit()) or not _ID.fullmatch(experiment):
        shown = repr(trial) if len(trial) <= 40 else repr(trial[:37]) + "..."
        raise UserError(f"{shown} is not a trial id", "TRIAL_ID",
                        "trial ids look like abcd1234-00003: see `trialkit trial list EXP`")
    experiment_dir(experiment, "TRIAL_ID")
    return experiment


def create_experiment_dir(experiment_id: str, working_directory: Optional[str] = None) -> Path:
    """An experiment's dir, made if new; under `working_directory` when given, linked from the default root."""
    check_experiment_id(experiment_id, "--experiment-id")
    default = experiments_root() / experiment_id
    path = experiments_root(working_directory) / experiment_id
    try:
        path.mkdir(parents=True, exist_ok=True)  # `run --detach` makes it before its background run
        if path != default and not default.is_symlink():
            default.parent.mkdir(parents=True, exist_ok=True)
            default.symlink_to(path.absolute(), target_is_directory=True)
    except OSError as err:
        where = "experimentWorkingDirectory" if working_directory else HOME_ENV
        raise UserError(f"cannot make the experiment's dir {err.filename or path}: {err.strerror or err}", where,
                        "point it at a directory you can write") from None
    return path


def experiment_dir(experiment_id: str, where: str = "EXPERIMENT_ID") -> Path:
    """The dir of an existing experiment; UserError at `where` (the argument the user gave) if there is none."""
    path = experiments_root() / check_experiment_id(experiment_id)
    if (path / DB_NAME).exists():
        return path
    raise UserError(f"no experiment {experiment_id!r} under {home() / 'experiments'}", where,
                    "see `trialkit experiment list`, or set TRIALKIT_HOME to where it was run")


def trial_dir(experiment_dir_: Path, trial: str) -> Path:
    return Path(experiment_dir_) / "trials" / trial


def all_experiment_dirs() -> List[Path]:
    root = experiments_root()
    if not root.is_dir():
        return []
    return [p for p in sorted(root.iterdir()) if (p / DB_NAME).exists()]


def cold_lines(experiment_dir_: Path) -> List[str]:
    """The lines of why an experiment's trials started cold with warmStart on (COLD_LINES), each once (a resumed
    run says its own again), in the order said; [] when all started warm or warmStart is off. Here, not in the
    local platform: `experiment show` reads it and loads no platform."""
    try:
        text = (Path(experiment_dir_) / COLD_LINES).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return list(dict.fromkeys(line for line in text.splitlines() if line))
