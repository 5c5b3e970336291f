"""The local platform: each trial a process tree on this machine."""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from trialkit import env, layout, process
from trialkit.manager import paths
from trialkit import schema
from trialkit.errors import UserError
from trialkit.keeper.spool import Spool
from trialkit.keeper.status import StatusFile
from trialkit.statuses import FAILED, FINAL_STATUSES, RUNNING, WAITING
from trialkit.platforms.base import PlatformStatus, TrialSpec

# ---------------------------------------------------------------- config
# The trainingService section (`platform: local`) and NNI v1's localConfig.

PLATFORM = "local"
# Local trials run the experiment's trialCommand; there is no per-role command.
TRIAL_COMMAND_REQUIRED = True


@dataclass(frozen=True)
class LocalConfig:
    """NNI's local options, plus `slots_per_trial`: the slots (TRIALKIT_SLOTS_PER_NODE) each trial gets."""

    use_active_gpu: bool = False
    max_trial_number_per_gpu: int = 1
    gpu_indices: Optional[Tuple[int, ...]] = None  # None: every GPU the machine has
    reuse_mode: bool = False
    slots_per_trial: int = 1
    platform: str = PLATFORM


def _gpu_indices(value: Any, where: str) -> Tuple[int, ...]:
    """NNI's forms: 0, [0, 1] or "0,1"."""
    if isinstance(value, str):
        try:
            value = [int(part) for part in value.split(",")]
        except ValueError:
            raise UserError(f"cannot read GPU indices {schema.show(value)}", where, 'write them like "0,1" or [0, 1]') from None
    items = value if isinstance(value, list) else [value]
    indices = tuple(schema.as_int(item, where, minimum=0) for item in items)
    if len(set(indices)) != len(indices):
        raise UserError(f"GPU indices repeat: {schema.show(value)}", where, "list each GPU once")
    return indices


def _at_least_one(value: Any, where: str) -> int:
    return schema.as_int(value, where, minimum=1)


# section key -> (LocalConfig field, checker)
_OPTIONS = {
    "useActiveGpu": ("use_active_gpu", schema.as_bool),
    "maxTrialNumberPerGpu": ("max_trial_number_per_gpu", _at_least_one),
    "gpuIndices": ("gpu_indices", _gpu_indices),
    "reuseMode": ("reuse_mode", schema.as_bool),
    "slotsPerTrial": ("slots_per_trial", _at_least_one),
}


def parse_section(section: Mapping[str, Any], where: str) -> LocalConfig:
    sec = schema.normalize_keys(section, ("platform",) + tuple(_OPTIONS), where)
    return LocalConfig(**{
        field: check(sec[key], schema.path(where, key))
        for key, (field, check) in _OPTIONS.items()
        if sec.get(key) is not None
    })


def from_v1(v1: Mapping[str, Any]) -> Dict[str, Any]:
    """NNI v1's `localConfig` as a v2 trainingService section."""
    # The experiment's loader takes trial.command, codeDir and gpuNum; a local
    # trial has nothing else (no image, no roles).
    schema.normalize_keys(v1.get("trial") or {}, ("command", "codeDir", "gpuNum"), "trial")
    local = schema.normalize_keys(v1.get("localConfig") or {}, ("gpuIndices", "maxTrialNumPerGpu", "useActiveGpu"),
                                  "localConfig")
    renames = {"gpuIndices": "gpuIndices", "maxTrialNumPerGpu": "maxTrialNumberPerGpu", "useActiveGpu": "useActiveGpu"}
    return {"platform": PLATFORM, **{renames[key]: value for key, value in local.items()}}


# ---------------------------------------------------------------- platform
# Each trial runs as it would in a container: scripts/run.sh -> keeper -> the
# trial command, in <experiment dir>/trials/<trial id>/, from its own copy of
# the code dir (trialkit.platforms.context: .trialignore honoured, 95 MB at
# most) in code/ there. The copy is made on the trial's first start; a
# restart (activate, resume) runs the code it started with. The handle of a
# trial is its id. The keepers are started apart from the control plane (their own
# session, no parent-death signal), so a control plane that dies leaves them
# running and `experiment resume` finds them again through their pidfiles.

LOG_NAME = "trial.log"  # the keeper's own output, the trial's echoed in it: what a container log holds
CODE_NAME = "code"  # the trial's copy of the code dir, in its trial dir
SPOOL_BATCH = 1000


def run_sh() -> str:
    return str(files("trialkit.scripts") / "run.sh")


def check_context(code_dir: str, experiment_dir: Path) -> None:
    """Refuse a code dir that trials cannot take along: one over the size limit, or one holding the experiment."""
    from trialkit.platforms import context  # pathspec comes with the control plane's extras

    _refuse_nesting(code_dir, experiment_dir)
    context.collect(code_dir)


def _refuse_nesting(code_dir: str, experiment_dir: Path) -> None:
    code, experiment = Path(os.path.realpath(code_dir)), Path(os.path.realpath(experiment_dir))
    if experiment == code or code in experiment.parents:
        raise UserError(f"the experiment dir {experiment_dir} is inside the trial code directory {code_dir}, so "
                        "each trial's copy of the code would hold the trials before it", "trialCodeDirectory",
                        "set experimentWorkingDirectory (or TRIALKIT_HOME) to a directory outside it")


def copy_code(code_dir: str, trial_dir: Path) -> Path:
    """The trial's copy of the code dir: made once, whole or not at all (a restart finds it as it was)."""
    from trialkit.platforms import context

    _refuse_nesting(code_dir, trial_dir)
    dest = trial_dir / CODE_NAME
    if not dest.is_dir():
        partial = trial_dir / (CODE_NAME + ".partial")
        shutil.rmtree(partial, ignore_errors=True)  # what a copy cut short left
        context.copy_into(code_dir, partial)
        os.replace(partial, dest)
    return dest


def trial_environ(config: LocalConfig, spec: TrialSpec, trial_dir: Path, code: Optional[Path]) -> Dict[str, str]:
    """The keeper's environment: ours, the spec's contract and this platform's part."""
    out = dict(os.environ)
    out.update(spec.env)
    out[env.TRIAL_DIR] = str(trial_dir)
    if code is not None:
        out[env.CODE_DIR] = str(code)  # run.sh runs the trial from there
    out[env.SLOTS_PER_NODE] = str(config.slots_per_trial)
    # The keeper runs on the control plane's interpreter, where trialkit is
    # installed; the trial's command resolves on the user's PATH, untouched, as
    # it would in their shell (NNI's way).
    out.setdefault(env.PYTHON, sys.executable)
    return out


@dataclass
class _Keeper:
    trial_id: str
    trial_dir: Path
    pid: int
    pidfd: int  # names this process for good: signals never reach a reused pid
    popen: Optional[subprocess.Popen] = None  # None when reattached (not our child)
    exit_code: Optional[int] = None
    ended: bool = False
    kill_timer: Optional[threading.Timer] = None


class Platform:
    """Local trials. `on_end(handle)` is called (from a waiter thread) when a keeper exits."""

    def __init__(self, config: LocalConfig, experiment_dir: Path):
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self.on_end: Callable[[str], None] = lambda handle: None
        self._keepers: Dict[str, _Keeper] = {}
        self._lock = threading.Lock()

    def submit(self, spec: TrialSpec) -> str:
        trial_dir = paths.trial_dir(self.experiment_dir, spec.trial_id)
        trial_dir.mkdir(parents=True, exist_ok=True)
        code = copy_code(spec.code_dir, trial_dir) if spec.code_dir is not None else None
        with open(trial_dir / LOG_NAME, "ab") as log:
            child = process.spawn(["/bin/sh", run_sh()], env=trial_environ(self.config, spec, trial_dir, code),
                                  cwd=str(trial_dir), stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, name=spec.trial_id, die_with_parent=False)
        # Not reaped before our waiter thread does it: the pid is still this child's.
        self._watch(_Keeper(spec.trial_id, trial_dir, child.pid, os.pidfd_open(child.pid), child.popen))
        return spec.trial_id

    def reattach(self, handle: str) -> bool:
        """Watch the trial's keeper again if it still runs (a control plane before us started it)."""
        trial_dir = paths.trial_dir(self.experiment_dir, handle)
        found = _read_pidfile(trial_dir)
        if found is None:
            return False
        pid, ticks = found
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return False
        # Checked after pidfd_open: the fd then holds the very process we checked.
        if not _is_keeper(pid, ticks):
            os.close(pidfd)
            return False
        self._watch(_Keeper(handle, trial_dir, pid, pidfd))
        return True

    def status(self, handle: str) -> PlatformStatus:
        """RUNNING while its keeper runs; then the final status the keeper recorded (FAILED if none).

        A trial that no keeper here runs and that never ended (its keeper died
        with the machine, say) is WAITING: to be started again.
        """
        keeper = self._keepers.get(handle)
        if keeper is not None and not keeper.ended:
            return PlatformStatus(RUNNING)
        data = StatusFile.previous(layout.status_path(paths.trial_dir(self.experiment_dir, handle))) or {}
        exit_code = data.get("exit_code", keeper.exit_code if keeper else None)
        if data.get("status") in FINAL_STATUSES:
            return PlatformStatus(data["status"], data.get("reason") or "", exit_code)
        if keeper is None:
            return PlatformStatus(WAITING, "no keeper runs it")
        how = process.describe_exit(keeper.exit_code) if keeper.exit_code is not None else "an unknown status"
        return PlatformStatus(FAILED, f"the keeper ended ({how}) before the trial did", keeper.exit_code)

    def stop(self, handle: str, grace: float) -> None:
        """SIGTERM to the keeper (it stops the trial within its grace and flushes); SIGKILL past that."""

        with self._lock:
            keeper = self._keepers.get(handle)
            if keeper is None or keeper.ended:
                return
            _send(keeper, signal.SIGTERM)
            if keeper.kill_timer is None:
                # Past the grace and the keeper's time to deliver records, with a second to spare.
                keeper.kill_timer = threading.Timer(grace + layout.FLUSH_SECONDS + 1.0, self.kill, (handle,))
                keeper.kill_timer.daemon = True
                keeper.kill_timer.start()

    def kill(self, handle: str) -> None:
        """SIGKILL the trial's process group, then its keeper."""
        with self._lock:
            keeper = self._keepers.get(handle)
            if keeper is None or keeper.ended:
                return
            # The keeper is alive, so the trial it started (its pid is the
            # trial's group) has not been reaped: the group is still the trial's.
            data = StatusFile.previous(layout.status_path(keeper.trial_dir)) or {}
            if isinstance(data.get("pid"), int):
                process.signal_group(data["pid"], signal.SIGKILL)
            _send(keeper, signal.SIGKILL)

    def undelivered_records(self, handle: str) -> List[Dict[str, Any]]:
        """What an ended keeper spooled but could not deliver (no manager listened), marked delivered."""
        spool_dir = layout.spool_dir(paths.trial_dir(self.experiment_dir, handle))
        if not spool_dir.is_dir():
            return []
        spool = Spool(spool_dir)
        out: List[Dict[str, Any]] = []
        try:
            while True:
                batch = spool.read(spool.acked, SPOOL_BATCH, 1 << 20)
                if not batch:
                    return out
                out.extend(json.loads(line) for _, line in batch)
                spool.ack(batch[-1][0])
        finally:
            spool.close()

    def _watch(self, keeper: _Keeper) -> None:
        self._keepers[keeper.trial_id] = keeper
        threading.Thread(target=self._wait, args=(keeper,), name=f"wait-{keeper.trial_id}", daemon=True).start()

    def _wait(self, keeper: _Keeper) -> None:
        if keeper.popen is not None:
            code = keeper.popen.wait()
            keeper.exit_code = code if code >= 0 else 128 - code
        else:
            select.select([keeper.pidfd], [], [])  # a pidfd turns readable when its process ends
        with self._lock:
            keeper.ended = True
            os.close(keeper.pidfd)
            if keeper.kill_timer is not None:
                keeper.kill_timer.cancel()
        self.on_end(keeper.trial_id)


def _send(keeper: _Keeper, signum: int) -> None:
    try:
        signal.pidfd_send_signal(keeper.pidfd, signum)
    except ProcessLookupError:
        pass  # exited; the waiter is about to say so


def _read_pidfile(trial_dir: Path) -> Optional[Tuple[int, int]]:
    """(pid, start ticks) from the keeper's pidfile; None when there is none to trust."""
    try:
        pid, ticks, _grace = layout.pidfile_path(trial_dir).read_text().split()
        return int(pid), int(ticks)
    except (OSError, ValueError):
        return None


def _is_keeper(pid: int, ticks: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        return process.start_ticks(pid) == ticks and b"trialkit.keeper" in cmdline
    except (OSError, IndexError, ValueError):
        return False
