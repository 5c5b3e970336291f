"""The ray platform: each trial a keeper on a Ray worker node.

    trainingService:
      platform: ray
      address: ray://HEAD:10001 | HEAD:6379 | auto   (default auto: a cluster on this machine)
      cpusPerTrial: 1
      gpusPerTrial: 0            (or the top-level trialGpuNumber)
      workingDir: ./code         (optional, default trialCodeDirectory: shipped to the nodes; trials run in it)
      runtimeEnv: {pip: [...]}   (optional: Ray's runtime_env for the trials' workers)

A trial is a TrialRunner actor holding the trial's CPUs and GPUs; it runs
run.sh -> keeper -> the trial command with the environment contract, and the
keeper reports to the manager as on every platform. stop() goes through the
keeper (SIGTERM: the trial may checkpoint, then its grace), kill() does not
wait. ray is imported on first use, so configs load without it.

The trials' code travels as local trials' does: the experiment's context
(trialkit.platforms.context: .trialignore, the size limit, startup-hook.sh
kept) is copied once into the experiment dir and handed to Ray's own runtime
environment as the working dir, which Ray packs and ships to every node. A
resumed experiment ships the same copy: a restarted trial runs the code it
started with.

The actors are detached and named after their trials (in Ray's namespace
"trialkit"): a control plane killed and resumed finds them again by name
(`reattach`), rather than through object references that died with it (the
Ray Jobs API would run a trial as a job of its own, with its own driver and
working dir: more per trial, and nothing it would add here). A trial that is
still running is watched again; one that ended meanwhile gives its result
and the records its keeper could not deliver, and its actor goes.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from trialkit import env, layout
from trialkit.keeper import spool
from trialkit.keeper.status import StatusFile
from trialkit.manager import paths
from trialkit import schema
from trialkit.errors import UserError
from trialkit.statuses import FAILED, FINAL_STATUSES, RUNNING, USER_CANCELED, WAITING
from trialkit.platforms.base import PlatformBase, PlatformStatus, TrialSpec
from trialkit.ray import cluster, connect
from trialkit.ray.trial_actor import TrialRunner

PLATFORM = "ray"
TRIAL_COMMAND_REQUIRED = True
KILL_WAIT = 5.0  # for the runner to SIGKILL the trial before its worker is killed too
CONTEXT_NAME = "ray-context"  # in the experiment dir: the code as the trials get it
ACTOR_CALL_TIMEOUT = 30.0  # for an actor found again to answer


@dataclass(frozen=True)
class RayConfig:
    address: str = "auto"
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    working_dir: Optional[str] = None
    runtime_env: Dict[str, Any] = field(default_factory=dict)
    trial_gpu_number: Optional[int] = None  # the experiment's trialGpuNumber; 0 hides every GPU
    platform: str = PLATFORM


def _address(value: Any, where: str) -> str:
    return connect.parse_address(schema.as_str(value, where), where).text


def _resources(value: Any, where: str) -> float:
    return schema.as_number(value, where, minimum=0)


def _working_dir(value: Any, where: str) -> str:
    path = Path(schema.as_str(value, where)).expanduser()
    if not path.is_dir():
        raise UserError(f"{value} is not a directory", where, "give the directory the trials' code lives in")
    return str(path.resolve())


def _runtime_env(value: Any, where: str) -> Dict[str, Any]:
    return dict(schema.mapping(value, where))


# section key -> (RayConfig field, checker)
_OPTIONS = {
    "address": ("address", _address),
    "cpusPerTrial": ("cpus_per_trial", _resources),
    "gpusPerTrial": ("gpus_per_trial", _resources),
    "workingDir": ("working_dir", _working_dir),
    "runtimeEnv": ("runtime_env", _runtime_env),
}


def parse_section(section: Mapping[str, Any], where: str) -> RayConfig:
    sec = schema.normalize_keys(section, ("platform",) + tuple(_OPTIONS), where)
    config = RayConfig(**{
        field_: check(sec[key], schema.path(where, key))
        for key, (field_, check) in _OPTIONS.items()
        if sec.get(key) is not None
    })
    if config.working_dir and "working_dir" in config.runtime_env:
        raise UserError("the working dir is given twice (workingDir and runtimeEnv.working_dir)",
                        schema.path(where, "runtimeEnv"), "keep workingDir")
    return config


def with_trial_gpus(config: RayConfig, trial_gpu_number: Optional[int]) -> RayConfig:
    """The config with the experiment's trialGpuNumber: the GPUs each trial's actor asks Ray for."""
    if trial_gpu_number is None:
        return config
    if config.gpus_per_trial and config.gpus_per_trial != trial_gpu_number:
        raise UserError(f"trialGpuNumber {trial_gpu_number} and trainingService.gpusPerTrial "
                        f"{config.gpus_per_trial:g} disagree", "trialGpuNumber", "keep one of them")
    return dataclasses.replace(config, gpus_per_trial=float(trial_gpu_number), trial_gpu_number=trial_gpu_number)


def actor_options(config: RayConfig) -> Dict[str, float]:
    """What a trial's actor asks Ray for; Ray sets the actor's CUDA_VISIBLE_DEVICES to the GPUs it gives."""
    return {"num_cpus": config.cpus_per_trial, "num_gpus": config.gpus_per_trial}


@dataclass
class _Trial:
    actor: Any
    started: Any  # ObjectRef: the keeper's pid, once it runs
    done: Any  # ObjectRef: the RunResult, once the keeper exited
    stop_asked: bool = False
    kill_asked: bool = False
    released: bool = False  # the actor was killed
    undelivered: List[Dict[str, Any]] = field(default_factory=list)  # what its keeper could not deliver


class Platform(PlatformBase):
    """Trials on a Ray cluster. `on_end(handle)` is called (from a Ray thread) when a trial ends."""

    def __init__(self, config: RayConfig, experiment_dir: Path):
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self._trials: Dict[str, _Trial] = {}
        self._runner_class: Any = None
        self._shipped: Optional[str] = None  # the context dir Ray ships, once connected

    def _connect(self, code_dir: Optional[str] = None) -> Any:
        import ray

        if self._runner_class is None:
            if not ray.is_initialized():
                where = "trainingService.address"
                # The trials' output stays in their dirs and Ray's logs, not on the control plane's terminal.
                # Ray ships a local working dir only at this level (for the whole connection).
                self._shipped = self._context(code_dir)
                connect.connect(connect.parse_address(self.config.address, where), where, log_to_driver=False,
                                runtime_env=connect.runtime_env(self._shipped, self.config.runtime_env))
            self._runner_class = ray.remote(TrialRunner)
        return self._runner_class

    def _context(self, code_dir: Optional[str]) -> Optional[str]:
        """The experiment's trial context, made once: what Ray ships as the trials' working dir."""
        from trialkit.platforms import context  # pathspec comes with the control plane's extras

        dest = self.experiment_dir / CONTEXT_NAME
        if dest.is_dir():
            return str(dest)
        source = self.config.working_dir or code_dir
        if not source:
            return None
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        context.copy_into(source, partial)
        os.replace(partial, dest)  # a crash half-way leaves no half context to ship later
        return str(dest)

    def submit(self, spec: TrialSpec) -> str:
        import ray

        runner_class = self._connect(spec.code_dir)
        try:
            actor = self._create(runner_class, spec.trial_id)
        except ray.exceptions.ActorAlreadyExistsError:  # by an actor an earlier run of this trial left
            self._forget_stale(spec.trial_id)
            actor = self._create(runner_class, spec.trial_id)
        actor.start.remote([], self._environ(spec))
        self._follow(spec.trial_id, actor)
        return spec.trial_id

    def _create(self, runner_class: Any, handle: str) -> Any:
        # Ray registers a named actor with the GCS before it returns, refusing a name in use
        # (ActorAlreadyExistsError): one round trip a submit, where looking the name up first took two.
        return runner_class.options(name=actor_name(handle), namespace=cluster.NAMESPACE, lifetime="detached",
                                    **actor_options(self.config)).remote(f"trial {handle}")

    def _follow(self, handle: str, actor: Any) -> _Trial:
        trial = self._trials[handle] = _Trial(actor, actor.started.remote(), actor.wait.remote())
        # Ray calls back (from its own thread) when the keeper has exited.
        trial.done.future().add_done_callback(lambda _: self.on_end(handle))
        return trial

    def _forget_stale(self, handle: str) -> None:
        """An actor left by an earlier run of this trial (one that ended while no control
        plane listened) holds its name: it goes before the trial starts again."""
        import ray

        actor = _find(handle)
        if actor is not None:
            ray.kill(actor)
            deadline = time.monotonic() + ACTOR_CALL_TIMEOUT
            while _find(handle) is not None and time.monotonic() < deadline:
                time.sleep(0.05)  # Ray frees the name once the GCS has the actor dead: no event to wait on

    def reattach(self, handle: str) -> bool:
        """Follow a trial an earlier control plane started, if its actor still runs it; False when there
        is none, or its keeper ended meanwhile (status() then has its result, undelivered_records its records)."""
        import ray

        self._connect()
        actor = _find(handle)
        if actor is None:
            return False
        try:
            ended = ray.get(actor.ended.remote(), timeout=ACTOR_CALL_TIMEOUT)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False
        if ended:
            trial = self._trials[handle] = _Trial(actor, actor.started.remote(), actor.wait.remote())
            ray.wait([trial.done], timeout=ACTOR_CALL_TIMEOUT)  # ready at once: status() answers from it
            return False
        self._follow(handle, actor)
        return True

    def undelivered_records(self, handle: str) -> List[Dict[str, Any]]:
        """What the ended trial's keeper spooled and could not deliver (its manager was away), once."""
        trial = self._trials.get(handle)
        if trial is None:
            return spool.unacknowledged(layout.spool_dir(paths.trial_dir(self.experiment_dir, handle)))
        self._release(trial)
        out, trial.undelivered = trial.undelivered, []
        return out

    def _environ(self, spec: TrialSpec) -> Dict[str, str]:
        environ = dict(spec.env)
        environ[env.TRIAL_DIR] = str(paths.trial_dir(self.experiment_dir, spec.trial_id))
        environ[env.COMMAND] = spec.command
        environ[env.PLATFORM] = PLATFORM
        if self.config.trial_gpu_number == 0:
            # Ray (2.60) leaves a GPU-less actor's CUDA_VISIBLE_DEVICES as the node's: a CPU trial
            # must not take a GPU by accident.
            environ[env.CUDA_VISIBLE_DEVICES] = ""
        if self._shipped:
            # The code travelled: it is the worker's working dir there, not this machine's path.
            environ.pop(env.CODE_DIR, None)
            environ.pop(env.NNI["code_dir"], None)
        return environ

    def status(self, handle: str) -> PlatformStatus:
        import ray

        trial = self._trials.get(handle)
        if trial is None:
            # No actor runs it (its node is gone): what its keeper last wrote, where this machine can read it.
            data = StatusFile.previous(layout.status_path(paths.trial_dir(self.experiment_dir, handle))) or {}
            if data.get("status") in FINAL_STATUSES:
                return PlatformStatus(data["status"], data.get("reason") or "", data.get("exit_code"))
            return PlatformStatus(WAITING, "no actor runs it")
        if not _ready(trial.done):
            return PlatformStatus(RUNNING if _ready(trial.started) else WAITING)
        self._release(trial)
        try:
            result = ray.get(trial.done)
        except ray.exceptions.RayActorError as err:
            status = USER_CANCELED if trial.stop_asked else FAILED
            return PlatformStatus(status, f"its Ray worker is gone: {_first_line(err)}", retryable=True)
        if trial.kill_asked:
            return PlatformStatus(USER_CANCELED, "killed", result.exit_code)
        if result.status is None:  # the keeper itself was killed
            return PlatformStatus(USER_CANCELED if trial.stop_asked else FAILED, result.reason, result.exit_code,
                                  retryable=True)
        return PlatformStatus(result.status, result.reason, result.exit_code)

    def stop(self, handle: str, grace: Optional[float] = None) -> None:
        """SIGTERM to the trial's keeper, which gives the trial its grace; a trial
        still waiting for resources is cancelled."""
        import ray

        trial = self._trials.get(handle)
        if trial is None or _ready(trial.done):
            return
        trial.stop_asked = True
        if not _ready(trial.started):
            ray.kill(trial.actor)
            return
        trial.actor.stop.remote(env.DEFAULT_GRACE_SECONDS if grace is None else grace)

    def kill(self, handle: str) -> None:
        """SIGKILL the trial and its keeper, then the actor."""
        import ray

        trial = self._trials.get(handle)
        if trial is None or _ready(trial.done):
            return
        trial.stop_asked = trial.kill_asked = True
        ray.wait([trial.actor.kill.remote()], timeout=KILL_WAIT)
        ray.kill(trial.actor)

    def _release(self, trial: _Trial) -> None:
        """The trial ended: take what its keeper could not deliver, then its actor goes,
        and with it the CPUs and GPUs it held."""
        import ray

        if not trial.released:
            trial.released = True
            try:
                trial.undelivered = ray.get(trial.actor.collect.remote(), timeout=ACTOR_CALL_TIMEOUT)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass  # its worker is gone, and the spool with it
            ray.kill(trial.actor)


def actor_name(handle: str) -> str:
    return f"trialkit-trial-{handle}"


def _find(handle: str) -> Any:
    """The trial's actor, if one lives (started by this control plane or an earlier one)."""
    import ray

    try:
        return ray.get_actor(actor_name(handle), namespace=cluster.NAMESPACE)
    except ValueError:
        return None


def _ready(ref: Any) -> bool:
    import ray

    return bool(ray.wait([ref], timeout=0)[0])


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
