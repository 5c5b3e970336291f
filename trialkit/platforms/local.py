"""The local platform: each trial a process tree on this machine."""
from __future__ import annotations

import dataclasses
import os
import select
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple


from trialkit import env, gpus, layout, process
from trialkit.manager import paths
from trialkit import schema
from trialkit.checkpoints import noted_stored
from trialkit.errors import UserError
from trialkit.keeper import leftover, warm, zygote
from trialkit.keeper.status import StatusFile
from trialkit.statuses import FAILED, FINAL_STATUSES, PREEMPTED, RUNNING, SUCCEEDED, USER_CANCELED, WAITING
from trialkit.platforms import pool_events, pools, preempt
from trialkit.platforms.base import PlatformBase, PlatformStatus, TrialSpec, copy_checkpoint

# ---------------------------------------------------------------- config
# The trainingService section (`platform: local`) and NNI v1's localConfig.

PLATFORM = "local"
# Local trials run the experiment's trialCommand; there is no per-role command.
TRIAL_COMMAND_REQUIRED = True


@dataclass(frozen=True)
class LocalConfig:
    """NNI's local options, plus `slots_per_trial`: the slots (TRIALKIT_SLOTS_PER_NODE) each trial gets.

    `trial_gpu_number` is the experiment's top-level trialGpuNumber (NNI too
    hands it to its training service): None leaves the trial's devices as
    the control plane's; a number schedules GPUs (trialkit.gpus).
    """

    use_active_gpu: bool = False
    max_trial_number_per_gpu: int = 1
    gpu_indices: Optional[Tuple[int, ...]] = None  # None: every GPU the machine has
    slots_per_trial: Optional[int] = None  # None: one per GPU the trial gets, at least one
    trial_gpu_number: Optional[int] = None
    resource_pool: str = "default"  # the home's pool its trials take slots from (platforms/pools.py)
    pool_priority: Optional[int] = None  # the experiment's job's there (smaller first); None: `priority`'s
    priority: Optional[int] = None  # the experiment's one priority (with_priority): its job's in the pool
    pool_weight: Optional[float] = None  # its fair share weight, in a fair_share pool; None: 1
    preemptible: bool = True  # its running trials pause (checkpoint) for a job of higher priority that waits
    warm_start: bool = False  # eligible trials' keepers fork from a warm process (keeper/zygote.py)
    platform: str = PLATFORM

    @property
    def slots(self) -> int:
        return gpus.trial_slots(self.slots_per_trial, self.trial_gpu_number)

    @property
    def pool_slots(self) -> float:
        """What a trial takes of the home's resource pool (platforms/pools.py): its slots, shared, for a GPU
        trial, by the trials a GPU takes (maxTrialNumberPerGpu: 2 runs two 1-GPU trials on one slot)."""
        return self.slots / self.max_trial_number_per_gpu if self.trial_gpu_number else self.slots


def with_trial_gpus(config: LocalConfig, trial_gpu_number: Optional[int]) -> LocalConfig:
    """The config with the experiment's trialGpuNumber, which this platform applies; GPU options without it
    would schedule nothing, so they are refused, but for useActiveGpu: NNI's own examples set it with no GPU
    number, and NNI runs them (config.py notes that no GPU is scheduled)."""
    if trial_gpu_number is None:
        unused = [key for key, given in (("gpuIndices", config.gpu_indices is not None),
                                         ("maxTrialNumberPerGpu", config.max_trial_number_per_gpu != 1)) if given]
        if unused:
            raise UserError(f"trainingService.{unused[0]} is set but trialGpuNumber is not, so no GPU is scheduled",
                            "trialGpuNumber", "add trialGpuNumber: 1, the GPUs each trial gets, or remove "
                            f"{unused[0]}")
    return dataclasses.replace(config, trial_gpu_number=trial_gpu_number)


def with_priority(config: LocalConfig, priority: Optional[int], default: int) -> Tuple[LocalConfig, int]:
    """(the config, the experiment's one priority): its job's in the resource pool and its trials' in its queue,
    from the config's top-level `priority`, else trainingService.poolPriority (a Determined config's
    resources.priority), else `default`. Two different numbers would order it two ways: refused."""
    if priority is not None and config.pool_priority is not None and config.pool_priority != priority:
        raise UserError(f"priority {priority} and trainingService.poolPriority {config.pool_priority} differ",
                        "priority", "an experiment has one priority, smaller first: keep one of the two keys")
    chosen = next(p for p in (priority, config.pool_priority, default) if p is not None)
    return dataclasses.replace(config, priority=chosen), chosen


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


def _positive(value: Any, where: str) -> float:
    return schema.as_number(value, where, positive=True)


# section key -> (LocalConfig field, checker)
_OPTIONS = {
    "useActiveGpu": ("use_active_gpu", schema.as_bool),
    "maxTrialNumberPerGpu": ("max_trial_number_per_gpu", _at_least_one),
    "gpuIndices": ("gpu_indices", _gpu_indices),
    "slotsPerTrial": ("slots_per_trial", _at_least_one),
    "resourcePool": ("resource_pool", schema.as_str),
    "poolPriority": ("pool_priority", schema.as_int),
    "poolWeight": ("pool_weight", _positive),
    "preemptible": ("preemptible", schema.as_bool),
    "warmStart": ("warm_start", schema.as_bool),
}


def parse_section(section: Mapping[str, Any], where: str) -> LocalConfig:
    sec = schema.normalize_keys(section, ("platform", "reuseMode") + tuple(_OPTIONS), where)
    # NNI's reuse mode runs trials one after another in a kept environment; a
    # local trial here always runs in its own dir and keeper.
    if sec.get("reuseMode") is not None and schema.as_bool(sec["reuseMode"], schema.path(where, "reuseMode")):
        raise UserError("reuseMode: true is not supported", schema.path(where, "reuseMode"),
                        "remove it: every local trial runs as its own process tree")
    return LocalConfig(**{
        field: check(sec[key], schema.path(where, key))
        for key, (field, check) in _OPTIONS.items()
        if sec.get(key) is not None
    })


# A v1 config's errors name its keys.
V1_WHERE = [("trainingService.maxTrialNumberPerGpu", "localConfig.maxTrialNumPerGpu"), ("trainingService", "localConfig")]


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

CODE_NAME = "code"  # the trial's copy of the code dir, in its trial dir
GPU_POLL_SECONDS = 5.0  # while GPU trials run or wait: how often nvidia-smi is asked (starts, samples)


def run_sh() -> str:
    return str(files("trialkit.scripts") / "run.sh")


def check_context(code_dir: str, experiment_dir: Path, command: Optional[str] = None) -> None:
    """Refuse a code dir that trials cannot take along (one holding the experiment, or check_code's)."""
    _refuse_nesting(code_dir, experiment_dir)
    check_code(code_dir, command)


def check_code(code_dir: str, command: Optional[str]) -> None:
    """Refuse a code dir over the size limit and a `python SCRIPT.py` command whose script it does not hold. A new
    experiment's config checks it with its other keys (config.py, determined.py), so that one refusal lists
    every mistake in it, the script's with the rest."""
    from trialkit.platforms import context  # pathspec comes with the control plane's extras

    context.check_script(command, context.collect(code_dir), code_dir)


def _refuse_nesting(code_dir: str, experiment_dir: Path) -> None:
    code, experiment = Path(os.path.realpath(code_dir)), Path(os.path.realpath(experiment_dir))
    if experiment == code or code in experiment.parents:
        raise UserError(f"the experiment dir {experiment_dir} is inside the trial code directory {code_dir}, so "
                        "each trial's copy of the code would hold the trials before it", "trialCodeDirectory",
                        "set experimentWorkingDirectory or TRIALKIT_HOME to a directory outside it")


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


# Read by OpenMP, OpenBLAS, MKL and PyTorch to size their thread pools, each to every core by default.
THREADS = "OMP_NUM_THREADS"


def trial_threads(cores: int, at_once: float, slots: int) -> Optional[int]:
    """The threads each of a trial's processes (`slots` of them) may use so that the trials running at once
    share the machine's cores: None for a trial that runs alone, which has them all. Trials that each spin
    a pool as wide as the machine slow one another down many times over (OpenBLAS's threads spin while they
    wait: two such numpy trials on 2 cores trained 40x slower), which is why Ray and torchrun set it too."""
    if at_once <= 1:
        return None
    return max(1, int(cores // (at_once * slots)))


# In the experiment dir: the dir its trials' TensorBoard dirs are in (`experiment tensorboard` names it, and a
# resume without the variable gives its trials theirs there).
TENSORBOARD_NOTE = "tensorboard-dir"
TENSORBOARD_NAMES = (env.TENSORBOARD_DIR, env.ADAPTDL["tensorboard_dir"], env.ADAPTDL_OLD_TENSORBOARD)


def tensorboard_dir(environ: Mapping[str, str], spec: TrialSpec, remembered: Optional[str]) -> Optional[str]:
    """The trial's own TensorBoard dir, where `trialkit run`'s environment names one (TRIALKIT_TENSORBOARD_DIR, or
    AdaptDL's names): DIR/EXPERIMENT_ID/TRIAL_ID, as an AdaptDL job's is its experiment's claim/JOB; one dir for
    every trial mixed their event files, and TensorBoard showed one trial's scalars. Where none is named (an
    `experiment resume` in another shell), the one the experiment ran with (`remembered`: its DIR/EXPERIMENT_ID),
    so that a restarted trial's series goes on; a DIR named wins over it. None where neither is."""
    base = next((environ[name] for name in TENSORBOARD_NAMES if environ.get(name)), None)
    if base is not None:
        return str(Path(base).absolute() / spec.experiment_id / spec.trial_id)
    return None if remembered is None else str(Path(remembered) / spec.trial_id)


def trial_environ(config: LocalConfig, spec: TrialSpec, trial_dir: Path, code: Optional[Path],
                  gpu_indices: Sequence[int] = (), threads: Optional[int] = None,
                  tensorboard_root: Optional[str] = None) -> Dict[str, str]:
    """The keeper's environment: ours, the spec's contract and this platform's part (its GPUs among it, its
    threads unless the user's environment sets them, its TensorBoard dir: tensorboard_dir)."""
    out = dict(os.environ)
    out.update(spec.env)
    tensorboard = tensorboard_dir(out, spec, tensorboard_root)
    for name in TENSORBOARD_NAMES:  # the keeper gives the trial AdaptDL's names from trialkit's
        out.pop(name, None)
    if tensorboard is not None:
        out[env.TENSORBOARD_DIR] = tensorboard
    if threads is not None:
        out.setdefault(THREADS, str(threads))
    out[env.TRIAL_DIR] = str(trial_dir)
    if code is not None:
        out[env.CODE_DIR] = str(code)  # run.sh runs the trial from there
    out[env.SLOTS_PER_NODE] = str(config.slots)
    if config.trial_gpu_number is not None:
        out.update(gpus.trial_environ(gpu_indices))
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
    grace: float = env.DEFAULT_GRACE_SECONDS  # the trial's, to checkpoint when stopped
    popen: Optional[subprocess.Popen] = None  # None when reattached (not our child)
    exit_code: Optional[int] = None
    ended: bool = False
    kill_timer: Optional[threading.Timer] = None
    # The trial as submitted and its status file as the keeper found it (_identity), when we started it; None for
    # one a control plane before us started. A keeper that leaves the file as it found it said nothing of this run.
    submitted: Optional["_Held"] = None
    status_before: Optional[Tuple[int, ...]] = None
    zygote: Optional[zygote.Zygote] = None  # the warm process that forked it (its parent: it knows its exit code)


@dataclass
class _Held:
    """A submitted trial that waits for its slots of the pool, or its GPUs."""

    spec: TrialSpec
    code: Optional[Path]
    reason: str


def _identity(path: Path) -> Tuple[int, ...]:
    """Which status file is there: the keeper replaces it whole at each write (a new inode); () when none is."""
    try:
        found = os.stat(path)
    except OSError:
        return ()
    return found.st_ino, found.st_mtime_ns, found.st_size


class Platform(PlatformBase):
    """Local trials. `on_end(handle)` is called (from a waiter thread) when a keeper exits.

    Each trial leases its slots from the home's resource pool (platforms/pools.py), which every
    local experiment of this TRIALKIT_HOME shares, and with trialGpuNumber set its GPUs too. A
    trial whose slots or GPUs are not free is held here (WAITING, `on_waiting(handle, reason)` says
    why) and started, in the order submitted, as soon as they are: when a keeper ends, at the next
    look at the lease table (another experiment's trial ended) or at nvidia-smi (other processes
    leave GPUs without telling us).
    """

    def __init__(self, config: LocalConfig, experiment_dir: Path):
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self._keepers: Dict[str, _Keeper] = {}
        self._lock = threading.RLock()
        self._held: Dict[str, _Held] = {}  # in submission order
        self._unstarted: Dict[str, PlatformStatus] = {}  # stopped, or failed to start, while held
        self._watcher: Optional[threading.Thread] = None  # asks nvidia-smi while GPU trials run or wait
        self._slot_waiter: Optional[threading.Thread] = None  # asks the lease table while trials wait
        self._slots = pools.open_pool(config.resource_pool)
        self._pool: Optional[gpus.Pool] = None
        if config.trial_gpu_number:
            found = gpus.inventory()
            self._pool = gpus.Pool(config.trial_gpu_number, config.max_trial_number_per_gpu,
                                   _pool_gpu_indices(config, self._slots, found), config.use_active_gpu)
            self._pool.check(found)  # before any trial: a config that can never run is refused
        self._slots.check(config.pool_slots)
        # A fair share pool goes by weights: a priority set for it is refused there, the default one not given.
        priority = config.pool_priority if self._slots.scheduler == pools.FAIR_SHARE else config.priority
        self._slots.join(self.experiment_dir.name, priority, config.preemptible, config.pool_weight, config.pool_slots)
        self._preempted: Dict[str, str] = {}  # trials paused for a job of higher priority -> why
        self._zygote: Optional[zygote.Zygote] = None  # warm start's, once an eligible trial started
        self._warm_off: str = "" if config.warm_start else "warmStart is off"
        self._said_cold: Set[str] = set()  # why trials start cold though warmStart is on: each said once
        # Trials seed_checkpoint gave a copy of another's checkpoint -> what their checkpoint dir held after it.
        self._seeded: Dict[str, List[Tuple[str, int, int]]] = {}
        if self._pool is not None:
            self._adopt_running()

    def submit(self, spec: TrialSpec) -> str:
        trial_dir = paths.trial_dir(self.experiment_dir, spec.trial_id)
        trial_dir.mkdir(parents=True, exist_ok=True)
        code = copy_code(spec.code_dir, trial_dir) if spec.code_dir is not None else None
        with self._lock:
            self._unstarted.pop(spec.trial_id, None)
            self._preempted.pop(spec.trial_id, None)  # a preempted trial back: it resumes
            # Trials start in the order submitted: none passes one that waits (and it waits for the same).
            taken, found, reason = (None, [], next(iter(self._held.values())).reason) if self._held \
                else self._take(spec.trial_id)
            if taken is not None:
                self._launch(spec, code, taken, found)
                return spec.trial_id
            self._hold(_Held(spec, code, reason))
        return spec.trial_id

    def _hold(self, held: _Held, first: bool = False) -> None:
        """The trial waits for its slots (and GPUs), after those held before it, or before them all (`first`);
        it says why (called under the lock)."""
        trial_id = held.spec.trial_id
        self._held[trial_id] = held
        if first:
            self._held = {trial_id: held, **self._held}
        if self._pool is not None:
            gpus.forget_assignment(paths.trial_dir(self.experiment_dir, trial_id))
            self._watch_gpus()
        self._watch_slots()
        self._slots.set_queued(self.experiment_dir.name, len(self._held) * self.config.pool_slots)
        self.on_waiting(trial_id, held.reason)

    def _take(self, trial_id: str, found: Optional[List[gpus.Gpu]] = None
              ) -> Tuple[Optional[Tuple[int, ...]], List[gpus.Gpu], str]:
        """(its GPU indices, nvidia-smi's answer, "") when the trial's GPUs (if it takes any) are free and its
        slots are leased to it now; (None, ..., why) when it waits (nvidia-smi asked unless `found`)."""
        ask: Optional[pools.GpuAsk] = None
        if self._pool is not None:
            found = gpus.inventory() if found is None else found
            free = self._pool.free(found, self._ours)
            if len(free) < self._pool.gpus_per_trial:
                return None, found, self._pool.waiting_reason(found, self._ours)
            # The home's pool picks among them: other experiments' trials lease GPUs by index there.
            ask = pools.GpuAsk(self._pool.gpus_per_trial, 1 / self.config.max_trial_number_per_gpu, tuple(free))
        indices = self._slots.grant(trial_id, self.experiment_dir.name, self.config.pool_slots, ask)
        if indices is None:
            return None, found or [], self._slots.waiting_reason(self.experiment_dir.name, self.config.pool_slots,
                                                                 ask)
        if self._pool is not None:
            self._pool.hold(trial_id, indices)
        return indices, found or [], ""

    def _launch(self, spec: TrialSpec, code: Optional[Path], indices: Sequence[int],
                found: Sequence[gpus.Gpu] = ()) -> None:
        """Start the trial's keeper with these GPUs (the pool already counts them as the trial's)."""
        trial_dir = paths.trial_dir(self.experiment_dir, spec.trial_id)
        status_before = _identity(layout.status_path(trial_dir))
        try:
            if self._pool is not None:
                gpus.write_assignment(trial_dir, indices)  # before the keeper: a restarted control plane reads it
                gpus.append_sample(trial_dir, found, indices)  # its GPUs as it found them
                self._watch_gpus()
            environ = trial_environ(self.config, spec, trial_dir, code, indices, self._threads(),
                                    self._tensorboard_root())
            if env.TENSORBOARD_DIR in environ:
                (self.experiment_dir / TENSORBOARD_NOTE).write_text(str(Path(environ[env.TENSORBOARD_DIR]).parent))
            with open(trial_dir / paths.TRIAL_LOG, "ab") as log:
                forked = self._fork_keeper(environ, trial_dir, log.fileno())
                if forked is not None:
                    (pid, pidfd), popen, parent = forked, None, self._zygote
                else:
                    child = process.spawn(["/bin/sh", run_sh()], env=environ, cwd=str(trial_dir),
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          name=spec.trial_id, in_child=False)
                    # Not reaped before our waiter thread does it: the pid is still this child's.
                    pid, pidfd, popen, parent = child.pid, os.pidfd_open(child.pid), child.popen, None
            # The keeper holds the lease from now on: it outlives a control plane that crashes.
            self._slots.hand_over(spec.trial_id, pid)
        except BaseException:
            with self._lock:
                self._slots.release(spec.trial_id)
                if self._pool is not None:
                    self._pool.release(spec.trial_id)
            raise
        self._watch(_Keeper(spec.trial_id, trial_dir, pid, pidfd,
                            float(spec.env.get(env.GRACE_SECONDS, env.DEFAULT_GRACE_SECONDS)), popen,
                            submitted=_Held(spec, code, ""), status_before=status_before, zygote=parent))

    def _fork_keeper(self, environ: Dict[str, str], trial_dir: Path, log: int) -> Optional[Tuple[int, int]]:
        """(pid, pidfd) of the trial's keeper forked by the experiment's zygote, started at the first eligible
        trial; None when the trial starts cold (not eligible: see _warm_ineligible). A zygote that fails turns
        warm start off for the experiment, with one line that says why (called under the lock)."""
        cwd = environ.get(env.CODE_DIR) or environ.get(env.NNI["code_dir"]) or str(trial_dir)  # run.sh's
        if self._warm_off:
            return None
        cold = _warm_ineligible(self.config, environ, cwd)
        try:
            if cold is None and self._zygote is None:
                self._zygote = zygote.Zygote(environ, environ.get(env.CODE_DIR) or cwd, str(self.experiment_dir),
                                             self.experiment_dir / ZYGOTE_LOG)
            if cold is None:
                differs = sorted(set(warm.shared_environ(environ).items()) ^ set(self._zygote.environ.items()))
                if differs:  # trialConcurrency changed its threads, say
                    cold = (f"its environment is not the warm process's ({', '.join(dict(differs))} differ: the "
                            "interpreter reads them as it starts)")
            if cold is not None:
                # Parsed and not applied to this trial: said, once a reason, where the run's user reads.
                if cold not in self._said_cold:
                    self._said_cold.add(cold)
                    self._say_cold("warmStart: ", f"trial {environ.get(env.TRIAL_ID)} starts cold: {cold}")
                return None
            return self._zygote.fork(environ, cwd, log)
        except (zygote.WarmStartError, process.LaunchError, OSError, ValueError) as err:
            self._warm_off = f"{err}"
            self._say_cold("warm start is ", f"off for this experiment, its trials start cold: {err}")
            self._close_zygote()
            return None

    def _say_cold(self, topic: str, line: str) -> None:
        """Why trials start cold though warmStart is on: on the run's stderr (after `topic`), and kept in the
        experiment dir for `experiment show` (paths.cold_lines: its "warm start" lines), where a detached run's user looks
        (its stderr is manager.log)."""
        sys.stderr.write(f"trialkit: {topic}{line}\n")
        try:
            with open(self.experiment_dir / paths.COLD_LINES, "a", encoding="utf-8") as kept:
                kept.write(line + "\n")
        except OSError:
            pass  # a full disk: the run's stderr said it

    def _close_zygote(self) -> None:
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    def experiment_ended(self, experiment_id: str, trial_ids: Sequence[str]) -> None:
        """The experiment's zygote goes (the keepers it forked run on until their trials end)."""
        with self._lock:
            self._close_zygote()

    def reattach(self, handle: str) -> bool:
        """Watch the trial's keeper again if it still runs (a control plane before us started it)."""
        with self._lock:
            keeper = self._keepers.get(handle)
        if keeper is not None:  # found when the GPUs were counted
            return not keeper.ended
        keeper = _find_keeper(handle, paths.trial_dir(self.experiment_dir, handle))
        if keeper is None:
            return False
        self._slots.hold(handle, self.experiment_dir.name, self.config.pool_slots, keeper.pid)
        self._watch(keeper)
        return True

    def _adopt_running(self) -> None:
        """Count the GPUs of trials whose keepers outlived an earlier control plane, before giving any out."""
        for path in sorted((self.experiment_dir / "trials").glob(f"*/{gpus.ASSIGNMENT_NAME}")):
            keeper = _find_keeper(path.parent.name, path.parent)
            if keeper is not None:
                indices = gpus.read_assignment(str(path.parent)) or ()
                with self._lock:
                    self._slots.hold(keeper.trial_id, self.experiment_dir.name, self.config.pool_slots, keeper.pid,
                                     indices, 1 / self.config.max_trial_number_per_gpu)
                    self._pool.hold(keeper.trial_id, indices)
                    self._watch_gpus()
                self._watch(keeper)

    def status(self, handle: str) -> PlatformStatus:
        """WAITING while held for GPUs; RUNNING while its keeper runs; then the final status the keeper
        recorded (FAILED if none), with why it was paused for a job of higher priority (`preempted`) for one
        that was: the loop ends it as it ends one it stopped itself (whatever it made of the SIGTERM, exit 0
        included: it is not lost, it resumes; only one that reported its final result finished).

        A trial that no keeper here runs and that never ended (its keeper died
        with the machine, say) is WAITING: to be started again.
        """
        found = self._status(handle)
        with self._lock:
            why = self._preempted.get(handle)
        if why is not None and found.status in FINAL_STATUSES:
            return dataclasses.replace(found, preempted=why)
        return found

    def _pool_capacity(self) -> float:
        """How many of these trials the pool's declared slots run at once (inf: a pool with no limit, the
        default one without pools.yml)."""
        return self._slots.slots / self.config.pool_slots + pools.ROUNDING

    def _threads(self) -> Optional[int]:
        """trial_threads for the trials this experiment runs at once, as few as its pool allows."""
        at_once = min(float(self.trials_at_once()), self._pool_capacity() // 1)  # whole trials
        return trial_threads(len(os.sched_getaffinity(0)), at_once, self.config.slots)

    def capacity_note(self, trial_concurrency: int, key: str = "trialConcurrency") -> str:
        """What the pool's declared slots allow of trialConcurrency (`key`, as the config wrote it), when that is
        fewer (a pool with no limit allows all)."""
        at_once = self._pool_capacity()
        if at_once >= trial_concurrency:
            return ""
        slots = self._slots.slots
        return (f"pool {self._slots.name} has {slots:g} slot{'' if slots == 1 else 's'} and each trial takes "
                f"{self.config.pool_slots:g}: at most {int(at_once)} of the {trial_concurrency} trials "
                f"{key} asks for run at once ({paths.home() / pools.CONFIG_NAME} sets its slots)")

    def seed_checkpoint(self, source: str, trial_id: str) -> None:
        copy_checkpoint(self.experiment_dir, source, trial_id)
        copied = _listing(layout.checkpoint_dir(paths.trial_dir(self.experiment_dir, trial_id)))
        if copied:  # the source had a checkpoint: else the trial started from nothing
            self._seeded[trial_id] = copied

    def start_tensorboard(self, experiment_id: str) -> str:
        """`trialkit experiment tensorboard`: the command that serves the dir its trials' TensorBoard dirs are in
        (a run per trial); UserError when they got none."""
        where = self._tensorboard_root()
        if where is None:
            raise UserError(f"experiment {experiment_id}'s trials got no TensorBoard dir", "EXPERIMENT_ID",
                            f"set {env.TENSORBOARD_DIR}=DIR in the environment of `trialkit run` or of `trialkit "
                            f"experiment resume`: each trial then writes DIR/{experiment_id}/TRIAL_ID")
        return f"TensorBoard of experiment {experiment_id}: tensorboard --logdir {shlex.quote(where)} (a run per trial)"

    def _tensorboard_root(self) -> Optional[str]:
        """The dir this experiment's trials got their TensorBoard dirs in (DIR/EXPERIMENT_ID), as its latest
        launch noted it; None when none got one."""
        try:
            return (self.experiment_dir / TENSORBOARD_NOTE).read_text().strip() or None
        except OSError:
            return None

    def holds_only_seed(self, handle: str) -> bool:
        """Whether the ended trial's checkpoint dir holds just the copy seed_checkpoint gave it, as it was (no file
        added, removed or rewritten): it saved no checkpoint of its own."""
        seeded = self._seeded.get(handle)
        return seeded is not None and seeded == \
            _listing(layout.checkpoint_dir(paths.trial_dir(self.experiment_dir, handle)))

    def remove_experiment(self, experiment_id: str, trial_ids: Sequence[str]) -> List[str]:
        """`experiment delete`: its job's row in pools.db (the table keeps it past its end for a resume, and
        this platform's start joined it again); its trials left nothing else outside its dir."""
        self._slots.leave(experiment_id)
        return []

    def holds_checkpoint(self, handle: str) -> bool:
        """Whether the ended trial left a checkpoint: it exited 143 after the stop (its keeper's PREEMPTED),
        its uploader stored one in the experiment's object store (the keeper restores it, local copy gone or
        not), or its checkpoint dir holds anything (a checkpoint of an earlier step, one a Determined trial
        saved before exiting 0)."""
        trial_dir = paths.trial_dir(self.experiment_dir, handle)
        if (StatusFile.previous(layout.status_path(trial_dir)) or {}).get("status") == PREEMPTED \
                or noted_stored(trial_dir):
            return True
        try:
            with os.scandir(layout.checkpoint_dir(trial_dir)) as entries:
                return next(entries, None) is not None
        except OSError:  # none made (a trial that never started) or unreadable: nothing to go on from
            return False

    def _status(self, handle: str) -> PlatformStatus:
        with self._lock:
            if handle in self._held:
                return PlatformStatus(WAITING, self._held[handle].reason)
            if handle in self._unstarted:
                return self._unstarted[handle]
            keeper = self._keepers.get(handle)
        if keeper is not None and not keeper.ended:
            return PlatformStatus(RUNNING)
        data = self._this_run(keeper) if keeper is not None else \
            StatusFile.previous(layout.status_path(paths.trial_dir(self.experiment_dir, handle))) or {}
        exit_code = data.get("exit_code", keeper.exit_code if keeper else None)
        if data.get("status") in FINAL_STATUSES:
            return PlatformStatus(data["status"], data.get("reason") or "", exit_code)
        if keeper is None:
            return PlatformStatus(WAITING, "no keeper runs it")
        if keeper.exit_code == 0:
            # The keeper exits with the trial's code: its status file lags (a full disk refused it).
            return PlatformStatus(SUCCEEDED, "", 0)
        how = process.describe_exit(keeper.exit_code) if keeper.exit_code is not None else "an unknown status"
        if not data:  # it wrote nothing of this run: its command never started
            return PlatformStatus(FAILED, f"the keeper ended ({how}) before it started the trial's command",
                                  retryable=True, started=False)
        return PlatformStatus(FAILED, f"the keeper ended ({how}) before the trial did", keeper.exit_code,
                              retryable=True)

    def stop(self, handle: str, grace: float) -> None:
        """SIGTERM to the keeper (it stops the trial within its grace and flushes); SIGKILL past that. The
        experiment's stop ends the trial, preempted or not: it does not wait again."""
        with self._lock:
            self._preempted.pop(handle, None)
        self._stop(handle, grace)

    def _stop(self, handle: str, grace: float) -> None:
        if self._drop_held(handle):
            return
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
            self._preempted.pop(handle, None)
        if self._drop_held(handle):
            return
        with self._lock:
            keeper = self._keepers.get(handle)
            if keeper is None or keeper.ended:
                return
            # The keeper is alive, so the trial it started (its pid is the
            # trial's group) has not been reaped: the group is still the trial's.
            data = self._this_run(keeper)
            if isinstance(data.get("pid"), int):
                process.signal_group(data["pid"], signal.SIGKILL)
            _send(keeper, signal.SIGKILL)

    @staticmethod
    def _this_run(keeper: _Keeper) -> Dict[str, Any]:
        """The status file as the keeper left it; {} while it holds what an earlier run left (the keeper has
        said nothing yet: stopped before it got to its command)."""
        path = layout.status_path(keeper.trial_dir)
        if keeper.status_before is not None and _identity(path) == keeper.status_before:
            return {}
        return StatusFile.previous(path) or {}

    def _drop_held(self, handle: str) -> bool:
        """A stop for a trial still waiting for GPUs: it ends without starting."""
        with self._lock:
            if self._held.pop(handle, None) is None:
                return False
            self._slots.set_queued(self.experiment_dir.name, len(self._held) * self.config.pool_slots)
            self._unstarted[handle] = PlatformStatus(USER_CANCELED, "stopped while it waited for its slots or GPUs",
                                                     started=False)
        self.on_end(handle)
        return True

    def undelivered_records(self, handle: str) -> List[Dict[str, Any]]:
        """What an ended keeper spooled but could not deliver (no manager listened), and what the trial
        wrote that it had not spooled (a keeper killed): keeper/leftover.py."""
        return leftover.undelivered(paths.trial_dir(self.experiment_dir, handle))

    def _watch(self, keeper: _Keeper) -> None:
        with self._lock:
            self._keepers.pop(keeper.trial_id, None)  # a restart is the newest start (preemption takes it first)
            self._keepers[keeper.trial_id] = keeper
            if self.config.preemptible:
                self._watch_slots()  # a job of higher priority may come to wait for its slots
        threading.Thread(target=self._wait, args=(keeper,), name=f"wait-{keeper.trial_id}", daemon=True).start()

    def _wait(self, keeper: _Keeper) -> None:
        if keeper.popen is not None:
            code = keeper.popen.wait()
            keeper.exit_code = code if code >= 0 else 128 - code
        else:
            select.select([keeper.pidfd], [], [])  # a pidfd turns readable when its process ends
        with self._lock:
            if keeper.zygote is not None:  # its parent, which alone reaps it (None once it is closed)
                keeper.exit_code = keeper.zygote.exit_code(keeper.pid)
            keeper.ended = True
            os.close(keeper.pidfd)
            if keeper.kill_timer is not None:
                keeper.kill_timer.cancel()
            self._slots.release(keeper.trial_id)
            if self._pool is not None:
                # The keeper's children die with it (parent-death signal): its GPUs are free,
                # however it ended (kill -9 included).
                self._pool.release(keeper.trial_id)
            waits_again = self._wait_again(keeper)
        self._start_held()
        if not waits_again:
            self.on_end(keeper.trial_id)

    def _wait_again(self, keeper: _Keeper) -> bool:
        """A trial preempted before its keeper said a word of this run (its slots came free for a moment, the job
        they were owed to took them back before the command started) never ran: no run ended, no restart to
        count. It waits again, before the others held, as it was submitted (called under the lock)."""
        if keeper.trial_id not in self._preempted or keeper.submitted is None or self._this_run(keeper):
            return False
        del self._preempted[keeper.trial_id]
        spec, code = keeper.submitted.spec, keeper.submitted.code
        self._hold(_Held(spec, code, self._slots.waiting_reason(self.experiment_dir.name, self.config.pool_slots)),
                   first=True)
        return True

    # -- slots and GPUs ----------------------------------------------------------------------
    def _start_held(self, found: Optional[List[gpus.Gpu]] = None) -> None:
        """Start the held trials whose slots (and GPUs) are free now (`found`: nvidia-smi's answer, else
        asked here when needed), first submitted first. The others wait, and say why when that changes."""
        failed: List[str] = []
        with self._lock:
            if not self._held:
                return
            reason = ""
            for trial_id, held in list(self._held.items()):
                try:
                    indices, found, reason = self._take(trial_id, found)
                except UserError as err:  # asked again at the next look; the trials wait and say why
                    indices, reason = None, f"waiting for GPUs: {err.line()}"
                if indices is None:
                    break
                del self._held[trial_id]
                try:
                    self._launch(held.spec, held.code, indices, found)
                except Exception as err:  # noqa: BLE001 - this trial fails; the others go on
                    self._unstarted[trial_id] = PlatformStatus(FAILED, f"the platform could not start it: {err}")
                    failed.append(trial_id)
            self._say_why(reason)
            self._slots.set_queued(self.experiment_dir.name, len(self._held) * self.config.pool_slots)
        for trial_id in failed:
            self.on_end(trial_id)

    def _say_why(self, reason: str) -> None:
        """The held trials wait for `reason` now: each says so when it changed."""
        with self._lock:
            for trial_id, held in self._held.items():
                if held.reason != reason:
                    held.reason = reason
                    self.on_waiting(trial_id, reason)

    def _watch_slots(self) -> None:
        """Start the slot waiter unless it runs (called under the lock)."""
        if self._slot_waiter is None:
            self._slot_waiter = threading.Thread(target=self._wait_for_slots, name="slot-wait", daemon=True)
            self._slot_waiter.start()

    def _wait_for_slots(self) -> None:
        """While trials wait, look at the lease table each time it may give them slots: another experiment's
        trial that ends (or a holder that died) frees slots without a word to us, so pools.py's changes and
        the holders' ends wake us (platforms/pool_events.py; our own trials' ends start the held at once).
        While preemptible trials run, look for a job of higher priority that waits for their slots."""
        listener = pool_events.Listener(self._slots.db_path.parent)
        failed = False
        try:
            while True:
                with self._lock:
                    held = bool(self._held)
                    running = self.config.preemptible and any(not k.ended for k in self._keepers.values())
                    if not held and not running:
                        self._slot_waiter = None
                        return
                holders: List[Tuple[int, int]] = []
                try:
                    # Else nothing to start (and nvidia-smi not asked for nothing), unless the last look failed:
                    # the refusal then says the waiting's reason again.
                    if held and (failed or self._slots.could_take(self.experiment_dir.name, self.config.pool_slots)):
                        self._start_held()
                    failed = False
                    if running:
                        self._give_back()
                    holders = self._slots.holders()
                except (OSError, sqlite3.Error, UserError) as err:
                    # The home's disk, a damaged pools.db, a lock held past BUSY_SECONDS: this look failed and
                    # the next may not. The waiter must outlive it, or its trials would wait for ever.
                    why = err.line() if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
                    self._say_why(f"waiting for slots: pool {self._slots.name} could not be read ({why})")
                    failed = True
                listener.wait(holders)  # listening since before the look: nothing told is missed
        finally:
            listener.close()

    def _give_back(self) -> None:
        """Pause the newest running trials, through their checkpoint, for the slots a job of higher priority
        waits for (platforms/preempt.py); they end PREEMPTED and their experiment queues them to resume."""
        # Under the lock: our keepers' ends release their leases under it, so the table and `running` agree.
        with self._lock:
            due, to = preempt.owed(self.experiment_dir.name, self._slots.free(), self._slots.claims(),
                                   self._slots.scheduler)
            if to is None:
                return
            running = [k for k in self._keepers.values() if not k.ended]
            due -= sum(self.config.pool_slots for k in running if k.kill_timer is not None)  # stopping already
            why = f"preempted for experiment {to.experiment} (priority {to.priority}), which waits for slots of " \
                  f"pool {self._slots.name}"
            for trial_id in preempt.choose([k.trial_id for k in running if k.kill_timer is None],
                                           self.config.pool_slots, due):
                self._preempted[trial_id] = why
                self._stop(trial_id, self._keepers[trial_id].grace)

    def _watch_gpus(self) -> None:
        """Start the watcher unless it runs (called under the lock)."""
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._look_at_gpus, name="gpu-watch", daemon=True)
            self._watcher.start()

    def _look_at_gpus(self) -> None:
        """While GPU trials run or wait, ask nvidia-smi now and then: start the waiting trials another
        process made room for, and add a sample of its GPUs' use to each running trial's file."""
        while True:
            time.sleep(GPU_POLL_SECONDS)
            with self._lock:
                if not self._held and not self._pool.held:
                    self._watcher = None
                    return
            try:
                found = gpus.inventory()
            except UserError:
                found = None  # _start_held says why to the waiting trials; the samples skip this look
            self._start_held(found)
            if found is not None:
                with self._lock:
                    running = dict(self._pool.held)
                for trial_id, indices in running.items():
                    gpus.append_sample(paths.trial_dir(self.experiment_dir, trial_id), found, indices)

    def _ours(self, pid: int) -> bool:
        """Whether a process on a GPU is one of this experiment's trials (a keeper of ours is its ancestor)."""
        import psutil  # here: GPU trials alone ask, and a control plane's start does not wait for it

        keepers = {keeper.pid for keeper in self._keepers.values() if not keeper.ended}
        try:
            return pid in keepers or any(parent.pid in keepers for parent in psutil.Process(pid).parents())
        except psutil.Error:
            return False


def _pool_gpu_indices(config: LocalConfig, pool: pools.Pool, found: Sequence[gpus.Gpu]
                      ) -> Optional[Tuple[int, ...]]:
    """The GPUs the experiment may take: its gpuIndices, which must be among its resource pool's GPUs
    (pools.yml), else the pool's; None: any of the machine's."""
    if pool.gpus is None:
        return config.gpu_indices
    where = f"{paths.home() / pools.CONFIG_NAME}: pools.{pool.name}.gpus"
    missing = [index for index in pool.gpus if index not in {gpu.index for gpu in found}]
    if missing:
        raise UserError(f"resource pool {pool.name!r} names GPU {','.join(map(str, missing))}, which is not among "
                        "this machine's usable GPUs", where, "list GPUs that nvidia-smi shows and "
                        "CUDA_VISIBLE_DEVICES allows, or write gpus: all")
    outside = [index for index in config.gpu_indices or () if index not in pool.gpus]
    if outside:
        raise UserError(f"gpuIndices names GPU {','.join(map(str, outside))}, which resource pool {pool.name!r} "
                        f"does not hold (its gpus: {','.join(map(str, pool.gpus))})", "trainingService.gpuIndices",
                        f"list GPUs among the pool's, or add them to its gpus in {where.split(': ')[0]}")
    return config.gpu_indices if config.gpu_indices is not None else pool.gpus


ZYGOTE_LOG = "warm-start.log"  # the zygote's output, in the experiment dir


def _warm_ineligible(config: LocalConfig, environ: Dict[str, str], cwd: str) -> Optional[str]:
    """Why a trial starts cold even with warm start on (None: it may start warm): GPUs asked, a startup hook,
    AdaptDL, or a command that is not `python[3] [-u] SCRIPT.py ...` or `... -m MODULE ...` in the keeper's own
    Python."""
    if config.trial_gpu_number:
        return "it asks for GPUs (trialGpuNumber), whose state a fork would share"
    if environ.get(env.PLATFORM) == env.ADAPTDL_PLATFORM:
        return "AdaptDL trials start as AdaptDL starts them"
    if os.path.exists(os.path.join(cwd, "startup-hook.sh")):
        return "its code dir has a startup-hook.sh, which a shell runs before the command"
    argv = process.shell_line_argv(environ.get(env.COMMAND, ""))
    if warm.python_command(argv, environ, cwd, environ[env.PYTHON]) is None:
        found = warm.interpreter(argv[0], environ, cwd) if argv else None
        if found is not None and warm.python_command([environ[env.PYTHON], *argv[1:]], environ, cwd,
                                                     environ[env.PYTHON]) is not None:
            # The command's form is right; its python is another one (an environment not activated).
            where = found if "/" in argv[0] else f"{argv[0]} on the trial's PATH: {found}"
            return (f"its Python ({where}) is not trialkit's own ({environ[env.PYTHON]}): activate trialkit's "
                    "environment before `trialkit run`, or name trialkit's Python in trialCommand")
        return (f"its command is not `python3 SCRIPT.py ...` or `python3 -m MODULE ...` (-u allowed) run by "
                f"trialkit's own Python ({environ[env.PYTHON]})")
    return None


def _find_keeper(trial_id: str, trial_dir: Path) -> Optional[_Keeper]:
    """The trial's keeper if it still runs (started by a control plane before us), from its pidfile."""
    found = layout.read_pidfile(trial_dir)
    if found is None:
        return None
    pid, ticks, grace = found
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    # Checked after pidfd_open: the fd then holds the very process we checked.
    if not _is_keeper(pid, ticks):
        os.close(pidfd)
        return None
    return _Keeper(trial_id, trial_dir, pid, pidfd, grace)


def _send(keeper: _Keeper, signum: int) -> None:
    try:
        signal.pidfd_send_signal(keeper.pidfd, signum)
    except ProcessLookupError:
        pass  # exited; the waiter is about to say so


def _is_keeper(pid: int, ticks: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        return process.start_ticks(pid) == ticks and b"trialkit.keeper" in cmdline
    except (OSError, IndexError, ValueError):
        return False


def _listing(folder: Path) -> List[Tuple[str, int, int]]:
    """Each file under `folder`: (its path within it, size, modification time in ns), sorted; [] when none."""
    found = []
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            try:
                info = os.lstat(path)
            except OSError:  # gone meanwhile: not there
                continue
            found.append((os.path.relpath(path, folder), info.st_size, info.st_mtime_ns))
    return sorted(found)
