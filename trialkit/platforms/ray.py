"""The ray platform: each trial a keeper on a Ray worker node.

    trainingService:
      platform: ray
      address: ray://HEAD:10001 | HEAD:6379 | auto   (default auto: a cluster on this machine)
      cpusPerTrial: 1
      gpusPerTrial: 0            (or the top-level trialGpuNumber)
      workingDir: ./code         (optional: shipped to the nodes; trials run in it)
      runtimeEnv: {pip: [...]}   (optional: Ray's runtime_env for the trials' workers)

A trial is a TrialRunner actor holding the trial's CPUs and GPUs; it runs
run.sh -> keeper -> the trial command with the environment contract, and the
keeper reports to the manager as on every platform. stop() goes through the
keeper (SIGTERM: the trial may checkpoint, then its grace), kill() does not
wait. ray is imported on first use, so configs load without it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from trialkit import env
from trialkit.manager import paths
from trialkit import schema
from trialkit.errors import UserError
from trialkit.statuses import FAILED, RUNNING, SYS_CANCELED, USER_CANCELED, WAITING
from trialkit.platforms.base import PlatformBase, PlatformStatus, TrialSpec
from trialkit.ray import connect
from trialkit.ray.trial_actor import TrialRunner

PLATFORM = "ray"
TRIAL_COMMAND_REQUIRED = True
KILL_WAIT = 5.0  # for the runner to SIGKILL the trial before its worker is killed too


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
    released: bool = False  # the actor was killed


class Platform(PlatformBase):
    """Trials on a Ray cluster. `on_end(handle)` is called (from a Ray thread) when a trial ends."""

    def __init__(self, config: RayConfig, experiment_dir: Path):
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self._trials: Dict[str, _Trial] = {}
        self._runner_class: Any = None

    def _connect(self) -> Any:
        import ray

        if self._runner_class is None:
            if not ray.is_initialized():
                where = "trainingService.address"
                # The trials' output stays in their dirs and Ray's logs, not on the control plane's terminal.
                # Ray ships a local working dir only at this level (for the whole connection).
                connect.connect(connect.parse_address(self.config.address, where), where, log_to_driver=False,
                                runtime_env=connect.runtime_env(self.config.working_dir, self.config.runtime_env))
            self._runner_class = ray.remote(TrialRunner)
        return self._runner_class

    def submit(self, spec: TrialSpec) -> str:
        runner_class = self._connect()
        actor = runner_class.options(**actor_options(self.config)).remote(f"trial {spec.trial_id}")
        trial = self._trials[spec.trial_id] = _Trial(actor, actor.start.remote([], self._environ(spec)),
                                                     actor.wait.remote())
        # Ray calls back (from its own thread) when the keeper has exited.
        trial.done.future().add_done_callback(lambda _: self.on_end(spec.trial_id))
        return spec.trial_id

    def _environ(self, spec: TrialSpec) -> Dict[str, str]:
        environ = dict(spec.env)
        environ[env.TRIAL_DIR] = str(paths.trial_dir(self.experiment_dir, spec.trial_id))
        environ[env.COMMAND] = spec.command
        environ[env.PLATFORM] = PLATFORM
        if self.config.trial_gpu_number == 0:
            # Ray (2.60) leaves a GPU-less actor's CUDA_VISIBLE_DEVICES as the node's: a CPU trial
            # must not take a GPU by accident.
            environ[env.CUDA_VISIBLE_DEVICES] = ""
        if self.config.working_dir:
            # The code travelled: it is the worker's working dir there, not this machine's path.
            environ.pop(env.CODE_DIR, None)
            environ.pop(env.NNI["code_dir"], None)
        return environ

    def status(self, handle: str) -> PlatformStatus:
        import ray

        trial = self._trials.get(handle)
        if trial is None:
            return PlatformStatus(SYS_CANCELED, "this control plane did not start it (its actor died with the "
                                                "experiment that did)")
        if not _ready(trial.done):
            return PlatformStatus(RUNNING if _ready(trial.started) else WAITING)
        self._release(trial)
        try:
            result = ray.get(trial.done)
        except ray.exceptions.RayActorError as err:
            status = USER_CANCELED if trial.stop_asked else FAILED
            return PlatformStatus(status, f"its Ray worker is gone: {_first_line(err)}")
        if result.status is None:  # the keeper itself was killed
            return PlatformStatus(USER_CANCELED if trial.stop_asked else FAILED, result.reason, result.exit_code)
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
        trial.stop_asked = True
        ray.wait([trial.actor.kill.remote()], timeout=KILL_WAIT)
        ray.kill(trial.actor)

    def _release(self, trial: _Trial) -> None:
        """The trial ended: its actor goes, and with it the CPUs and GPUs it held."""
        import ray

        if not trial.released:
            trial.released = True
            ray.kill(trial.actor)


def _ready(ref: Any) -> bool:
    import ray

    return bool(ray.wait([ref], timeout=0)[0])


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
