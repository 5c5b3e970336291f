"""The ray platform: each trial a keeper on a Ray worker node.

    trainingService:
      platform: ray
      address: ray://HEAD:10001 | HEAD:6379 | auto   (default auto: a cluster on this machine)
      cpusPerTrial: 1
      gpusPerTrial: 0            (or the top-level trialGpuNumber)
      workingDir: ./code         (optional, default trialCodeDirectory: shipped to the nodes; trials run in it)
      runtimeEnv: {pip: [...]}   (optional: Ray's runtime_env for the trials' workers)

A trial is a keeper on one node: run.sh -> keeper -> the trial command with
the environment contract, and the keeper reports to the manager as on every
platform. Ray holds the trial's CPUs and GPUs as a placement group of one
bundle (so a trial waits while no node has them, and the cluster's other
users see them taken); once Ray has placed it, the node's agent
(trialkit.ray.agent: one actor a node and experiment) starts the keeper as a
process of its own. A start is then a new process on the node, not a new Ray worker
process a trial, as when each trial was an actor of its own (~1.5 starts a
second on the tests' cluster; docs/scaling.md has the figures). stop() goes
through the keeper (SIGTERM: the trial may checkpoint, then its grace),
kill() does not wait. ray is imported on first use, so configs load without
it.

The trials' code travels as local trials' does: the experiment's context
(trialkit.platforms.context: .trialignore, the size limit, startup-hook.sh
kept) is copied once into the experiment dir and handed to Ray's own runtime
environment as the working dir, which Ray packs and ships to every node; the
experiment's agents run in it, and their keepers start there. All of that is
check_ready's, before the manager starts (the code dir is trialCodeDirectory
unless workingDir names one), so the first trial starts as the next ones do. A resumed
experiment ships the same copy: a restarted trial runs the code it started
with.

The groups and the agents are detached and named (in Ray's namespace
"trialkit"; groups after their trials, agents after their experiment's dir
and node): a control plane killed and resumed finds a trial's group by name,
the group's node, that node's agent and the trial in it (`reattach`), rather
than through object references that died with it (the Ray Jobs API would
run a trial as a job of its own, with its own driver and working dir: more
per trial, and nothing it would add here). A trial that is still running is
watched again; one that ended meanwhile gives its result and the records its
keeper could not deliver, and its group goes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import ipaddress
import math
import os
import queue
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trialkit import env, layout
from trialkit.keeper import leftover
from trialkit.keeper.status import StatusFile
from trialkit.manager import paths
from trialkit import schema
from trialkit.errors import UserError
from trialkit.statuses import FAILED, FINAL_STATUSES, RUNNING, USER_CANCELED, WAITING
from trialkit.platforms import ray_pool
from trialkit.platforms.base import PlatformBase, PlatformStatus, TrialSpec, copy_checkpoint
from trialkit.ray import cluster, connect
from trialkit.ray.agent import NodeAgent

PLATFORM = "ray"
TRIAL_COMMAND_REQUIRED = True
KILL_WAIT = 5.0  # for the agent to SIGKILL the trial and its keeper
CONTEXT_NAME = "ray-context"  # in the experiment dir: the code as the trials get it
ACTOR_CALL_TIMEOUT = 30.0  # for an agent to answer
START_TRIES, START_RETRY_WAIT = 50, 0.2  # when its agent had left (Ray frees the name in ms) or its node went


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


def with_code_dir(config: RayConfig, code_dir: str) -> RayConfig:
    """The config with the experiment's trialCodeDirectory as the working dir, unless workingDir names one:
    known before the first trial, so check_ready ships it."""
    return config if config.working_dir else dataclasses.replace(config, working_dir=code_dir)


def trials_see_this_machine(config: RayConfig) -> bool:
    """Whether the trials' nodes see this machine's files at their paths (their trial dirs are paths here, and
    so are PBT's checkpoints by default): a cluster on this machine (auto, a loopback address). A remote
    cluster's nodes write to their own disks, where seed_checkpoint's copy finds nothing (the config layer's
    hook: control/config.py's checkpoint_handover)."""
    host = connect.parse_address(config.address, "trainingService.address").host
    if host is None or host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: another machine, as far as a path can tell


def actor_options(config: RayConfig) -> Dict[str, float]:
    """What a trial asks Ray for: its placement group's one bundle, in Ray's task options' terms."""
    return {"num_cpus": config.cpus_per_trial, "num_gpus": config.gpus_per_trial}


def bundle(config: RayConfig) -> Dict[str, float]:
    """The trial's bundle: its CPUs and GPUs, held for it on one node while it runs."""
    options = actor_options(config)
    asked = {name: amount for name, amount in (("CPU", options["num_cpus"]), ("GPU", options["num_gpus"])) if amount}
    # Ray refuses an empty bundle. A trial that asks for nothing holds one byte of a node's memory resource:
    # any CPU at all would keep a task that asks for all of a node's CPUs off that node.
    return asked or {"memory": 1}


@dataclass
class _Trial:
    handle: str
    group: Any  # its placement group: the CPUs and GPUs Ray holds for it, on the node it runs on
    environ: Dict[str, str]
    agent: Any = None  # its node's agent, once it runs there
    done: Any = None  # ObjectRef: the RunResult, once the keeper exited; None until the agent started it
    starting: bool = False  # the starter thread is handing it to its agent
    start_tries: int = 0  # its agent was gone when asked
    cancelled: bool = False  # stopped before it started
    failed: str = ""  # why it could not be started
    stop_asked: bool = False
    kill_asked: bool = False
    grace: float = env.DEFAULT_GRACE_SECONDS
    released: bool = False  # its agent forgot it and gave its group back
    undelivered: List[Dict[str, Any]] = field(default_factory=list)  # what its keeper could not deliver


class Platform(PlatformBase):
    """Trials on a Ray cluster. `on_end(handle)` is called (from a Ray thread) when a trial ends."""

    def __init__(self, config: RayConfig, experiment_dir: Path):
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        # The agents' names say whose they are: each experiment's run in its own runtime environment.
        self._key = hashlib.sha1(str(self.experiment_dir.resolve()).encode()).hexdigest()[:12]
        self._trials: Dict[str, _Trial] = {}
        self._agents: Dict[str, Any] = {}  # node id -> its agent
        self._lock = threading.Lock()  # _Trial's state, between the loop's calls and the starter thread
        self._placed: "queue.Queue[Tuple[_Trial, Optional[tuple]]]" = queue.Queue()  # (trial, start's answer)
        self._agent_class: Any = None
        self._shipped: Optional[str] = None  # the context dir Ray ships, once connected
        pool = ray_pool.for_address(config.address)  # the cluster's resource pool of pools.yml, if it declares one
        # Trials that wait for its slots: each placed (_submit_placed) once leased.
        self._queue = ray_pool.Queue(pool, max(1, math.ceil(config.gpus_per_trial)), self._submit_placed,
                                     actor_name) if pool is not None else None

    def _connect(self, code_dir: Optional[str] = None) -> Any:
        import ray

        if self._agent_class is None:
            if not ray.is_initialized():
                where = "trainingService.address"
                made = not (self.experiment_dir / CONTEXT_NAME).is_dir()
                # The trials' output stays in their dirs and Ray's logs, not on the control plane's terminal.
                # Ray ships a local working dir only at this level (for the whole connection). The trials'
                # placement groups are named in trialkit's namespace, where a resumed control plane finds them.
                self._shipped = self._context(code_dir)
                try:
                    connect.connect(connect.parse_address(self.config.address, where), where, log_to_driver=False,
                                    namespace=cluster.NAMESPACE,
                                    runtime_env=connect.runtime_env(self._shipped, self.config.runtime_env))
                except BaseException:
                    if made and self._shipped:  # a run refused before it started leaves no dir behind
                        shutil.rmtree(self._shipped, ignore_errors=True)
                        with contextlib.suppress(OSError):
                            self.experiment_dir.rmdir()
                    raise
            self._agent_class = ray.remote(NodeAgent)
            threading.Thread(target=self._start_placed, name="ray-trial-starter", daemon=True).start()
            # Each agent's worker starts now, beside Ray placing the first trials, not after; one that
            # gets no trial leaves IDLE_SECONDS after it started.
            for node in cluster.alive_nodes():
                if node.cpus >= self.config.cpus_per_trial and node.gpus >= self.config.gpus_per_trial:
                    self._agent(node.node_id)
        return self._agent_class

    def check_ready(self) -> None:
        """Before the manager starts: connect, ship the code and start the agents (their workers set up the
        shipped code: seconds), so that the first trial starts as fast as the next ones. A cluster that
        cannot be reached is one line now, not every trial failed later."""
        import ray

        self._connect(self.config.working_dir)
        hellos = [agent.hello.remote() for agent in self._agents.values()]
        if hellos:  # an agent that cannot start (its runtime env) fails the trials sent to it, as before
            ray.wait(hellos, num_returns=len(hellos), timeout=ACTOR_CALL_TIMEOUT)

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
        """Ask Ray for the trial's bundle (once the cluster's pool, if any, leases its slots); the starter
        thread hands it to its node's agent once Ray placed it."""
        self._connect(spec.code_dir)
        if self._queue is not None:
            self._queue.submit(spec)
        else:
            self._submit_placed(spec)
        return spec.trial_id

    def _submit_placed(self, spec: TrialSpec) -> None:
        trial = _Trial(spec.trial_id, self._place(spec.trial_id), self._environ(spec))
        with self._lock:
            self._trials[spec.trial_id] = trial
        # Ray answers this when the GCS has placed the group: no task, no worker.
        trial.group.ready().future().add_done_callback(lambda _: self._placed.put((trial, None)))

    def _place(self, handle: str) -> Any:
        import ray

        try:
            return _group(handle, bundle(self.config))
        except ray.exceptions.RaySystemError as err:
            # Ray (2.60) has no exception of its own for a name in use: only its message says so.
            if "already exists" not in str(err):
                raise
            # An earlier run of this trial left it (it ended while no control plane listened, or is ending): it goes.
            group, agent = self._held(handle)
            if agent is not None:
                with contextlib.suppress(ray.exceptions.RayError):
                    ray.get(agent.discard.remote(handle, True), timeout=ACTOR_CALL_TIMEOUT)
            _remove(group)
            return _group(handle, bundle(self.config))

    def _held(self, handle: str) -> Tuple[Any, Any]:
        """The trial's placement group, if Ray holds one (made by this control plane or an earlier one),
        and the agent of the group's node, if one lives."""
        from ray.util.placement_group import placement_group_table

        group = _find_group(handle)
        node = placement_group_table(group)["bundles_to_node_id"].get(0) if group is not None else None
        return group, _find(agent_name(self._key, node)) if node else None

    def _start_placed(self) -> None:
        """The starter thread: each placed trial to its node's agent. It waits on no agent: a start is sent,
        and its answer comes back through the same queue, so a slow agent (a new one starting its worker)
        holds up no other node's trials."""
        while True:
            trial, answer = self._placed.get()
            if answer is None:
                self._send_start(trial)
            else:
                self._started(trial, *answer)

    def _send_start(self, trial: _Trial) -> None:
        from ray.util.placement_group import placement_group_table

        with self._lock:
            if trial.cancelled or self._trials.get(trial.handle) is not trial:
                return
            trial.starting = True
        node = placement_group_table(trial.group)["bundles_to_node_id"].get(0) or ""
        if not node:  # its node went since Ray placed it, and Ray places it again
            self._retry(trial, "Ray holds its bundle on no node")
            return
        agent = self._agent(node)
        started = agent.start.remote(trial.handle, trial.environ, trial.group, self.config.gpus_per_trial)
        # Ray calls back from its own thread: the answer goes to the starter thread, which may call Ray.
        started.future().add_done_callback(lambda _: self._placed.put((trial, (node, agent, started))))

    def _started(self, trial: _Trial, node: str, agent: Any, started: Any) -> None:
        import ray

        try:
            ray.get(started, timeout=0)
        except ray.exceptions.RayActorError as err:
            # The agent left (idle) as this trial came, or its node went: a new one takes its name.
            self._agents.pop(node, None)
            self._retry(trial, f"its node's agent is gone: {_first_line(err)}")
            return
        except ray.exceptions.RayError as err:
            # A RayTaskError's own first line names only the call; its cause says what went wrong.
            cause = getattr(err, "cause", None) or err
            self._start_failed(trial, f"its node's agent could not start it: {type(cause).__name__}: "
                                      f"{_first_line(cause)}")
            return
        with self._lock:
            trial.starting = False
            trial.agent, trial.done = agent, agent.wait.remote(trial.handle)
        self._follow(trial)
        if trial.kill_asked:  # asked while it was being started
            agent.kill.remote(trial.handle)
        elif trial.stop_asked:
            agent.stop.remote(trial.handle, trial.grace)

    def _retry(self, trial: _Trial, why: str) -> None:
        trial.start_tries += 1
        if trial.start_tries > START_TRIES:
            self._start_failed(trial, why)
        else:
            threading.Timer(START_RETRY_WAIT, self._placed.put, ((trial, None),)).start()

    def _start_failed(self, trial: _Trial, why: str) -> None:
        with self._lock:
            trial.starting, trial.failed = False, why
        _remove(trial.group)
        self.on_end(trial.handle)

    def _agent(self, node: str) -> Any:
        """The experiment's agent on `node`: the one that runs there, or a new one."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        agent = self._agents.get(node)
        if agent is None:
            agent = self._agents[node] = self._agent_class.options(
                name=agent_name(self._key, node), namespace=cluster.NAMESPACE, lifetime="detached",
                get_if_exists=True, num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(f"trialkit agent {node[:8]}")
            agent.hello.remote()
        return agent

    def _follow(self, trial: _Trial) -> None:
        # Ray calls back (from its own thread) when the keeper has exited.
        trial.done.future().add_done_callback(lambda _: self.on_end(trial.handle))

    def reattach(self, handle: str) -> bool:
        """Follow a trial an earlier control plane started, if its node's agent still runs it; False when
        none does, or its keeper ended meanwhile (status() then has its result, undelivered_records its records)."""
        import ray

        self._connect()
        group, agent = self._held(handle)
        if group is None:
            return False
        ended = None
        if agent is not None:
            try:
                ended = ray.get(agent.ended.remote(handle), timeout=ACTOR_CALL_TIMEOUT)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
        if ended is None:  # placed but never started, or its agent went and its keeper with it
            _remove(group)
            return False
        trial = self._trials[handle] = _Trial(handle, group, {}, agent=agent, done=agent.wait.remote(handle))
        if ended:
            ray.wait([trial.done], timeout=ACTOR_CALL_TIMEOUT)  # ready at once: status() answers from it
            return False
        self._follow(trial)
        return True

    def seed_checkpoint(self, source: str, trial_id: str) -> None:
        copy_checkpoint(self.experiment_dir, source, trial_id)

    def undelivered_records(self, handle: str) -> List[Dict[str, Any]]:
        """What the ended trial's keeper spooled and could not deliver (its manager was away), once."""
        trial = self._trials.get(handle)
        if trial is None:
            return leftover.undelivered(paths.trial_dir(self.experiment_dir, handle))
        self._release(trial)
        out, trial.undelivered = trial.undelivered, []
        return out

    def _environ(self, spec: TrialSpec) -> Dict[str, str]:
        environ = dict(spec.env)
        environ[env.TRIAL_DIR] = str(paths.trial_dir(self.experiment_dir, spec.trial_id))
        environ[env.COMMAND] = spec.command
        environ[env.PLATFORM] = PLATFORM
        if self.config.trial_gpu_number == 0:
            # Ray (2.60) leaves a GPU-less worker's CUDA_VISIBLE_DEVICES as the node's: a CPU trial
            # must not take a GPU by accident.
            environ[env.CUDA_VISIBLE_DEVICES] = ""
        if self._shipped:
            # The code travelled: it is the agent's working dir there, not this machine's path.
            environ.pop(env.CODE_DIR, None)
            environ.pop(env.NNI["code_dir"], None)
        return environ

    def status(self, handle: str) -> PlatformStatus:
        import ray

        waiting = self._queue.status(handle) if self._queue is not None else None
        if waiting is not None:  # for its pool's slots, or stopped while it waited
            return waiting
        trial = self._trials.get(handle)
        if trial is None:
            # No agent runs it (its node is gone): what its keeper last wrote, where this machine can read it.
            data = StatusFile.previous(layout.status_path(paths.trial_dir(self.experiment_dir, handle))) or {}
            if data.get("status") in FINAL_STATUSES:
                return PlatformStatus(data["status"], data.get("reason") or "", data.get("exit_code"))
            return PlatformStatus(WAITING, "no agent runs it")
        with self._lock:
            done, cancelled, failed = trial.done, trial.cancelled, trial.failed
        if done is None:
            if failed:
                return PlatformStatus(FAILED, failed, retryable=True)
            return PlatformStatus(USER_CANCELED, "stopped before it started", started=False) if cancelled \
                else PlatformStatus(WAITING)
        if not _ready(done):
            return PlatformStatus(RUNNING)
        self._release(trial)
        try:
            result = ray.get(done)
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
        self._stop(handle, kill=False, grace=env.DEFAULT_GRACE_SECONDS if grace is None else grace)

    def kill(self, handle: str) -> None:
        """SIGKILL the trial and its keeper."""
        self._stop(handle, kill=True, grace=0.0)

    def _stop(self, handle: str, kill: bool, grace: float) -> None:
        import ray

        if self._queue is not None and self._queue.stop(handle):
            self.on_end(handle)
            return
        trial = self._trials.get(handle)
        if trial is None:
            return
        with self._lock:
            if trial.cancelled or trial.failed or (trial.done is not None and _ready(trial.done)):
                return
            trial.stop_asked, trial.grace = True, grace
            trial.kill_asked = trial.kill_asked or kill
            # Not started yet: it is cancelled here, or by the starter thread once its agent has it.
            cancel = trial.done is None and not trial.starting
            trial.cancelled = cancel
        if cancel:
            _remove(trial.group)
            self.on_end(handle)
        elif trial.done is not None and kill:
            ray.wait([trial.agent.kill.remote(handle)], timeout=KILL_WAIT)
        elif trial.done is not None:
            trial.agent.stop.remote(handle, grace)

    def _release(self, trial: _Trial) -> None:
        """The trial ended: take what its keeper could not deliver; its agent forgets it and gives its
        group back, and with it the CPUs and GPUs it held."""
        import ray

        if not trial.released:
            trial.released = True
            try:
                trial.undelivered = ray.get(trial.agent.collect.remote(trial.handle), timeout=ACTOR_CALL_TIMEOUT)
            except ray.exceptions.RayError:  # its agent is gone, and the spool with it, or never had it
                _remove(trial.group)

    def experiment_ended(self, experiment_id: str, trial_ids: Sequence[str]) -> None:
        """The agents go as soon as they hold no trial."""
        for agent in list(self._agents.values()):
            agent.leave_when_idle.remote()


def actor_name(handle: str) -> str:
    """The trial's name in Ray: its placement group's."""
    return f"trialkit-trial-{handle}"


def agent_name(key: str, node: str) -> str:
    return f"trialkit-agent-{key}-{node}"


def _group(handle: str, resources: Dict[str, float]) -> Any:
    from ray.util.placement_group import placement_group

    # Detached: the group outlives the control plane, as the trial does.
    return placement_group([resources], strategy="STRICT_PACK", name=actor_name(handle), lifetime="detached")


def _find_group(handle: str) -> Any:
    """The trial's placement group, if Ray holds one (made by this control plane or an earlier one)."""
    from ray.util.placement_group import get_placement_group

    try:
        return get_placement_group(actor_name(handle))
    except ValueError:
        return None


def _remove(group: Any) -> None:
    from ray.util.placement_group import remove_placement_group

    if group is not None:
        remove_placement_group(group)


def _find(name: str) -> Any:
    """The named actor, if one lives."""
    import ray

    try:
        return ray.get_actor(name, namespace=cluster.NAMESPACE)
    except ValueError:
        return None


def _ready(ref: Any) -> bool:
    import ray

    return bool(ray.wait([ref], timeout=0)[0])


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
