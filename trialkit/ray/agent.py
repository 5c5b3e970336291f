"""The node agent: one long-lived Ray actor a node and experiment that starts its trials' keepers as processes.

A Ray actor a trial costs a Ray worker process a trial (~1.5 starts a second
on the tests' 2-core cluster); the agent is one worker for all of the node's
trials, and a start is a new process, run.sh -> keeper (tens a second). The ray
platform places each trial first (a placement group of one bundle: its CPUs
and GPUs, so Ray still counts them and a trial waits while no node has
them), then asks the agent of the bundle's node to run it. The agent holds a
TrialRunner a trial (trialkit/ray/trial_actor.py: start, wait, stop, kill,
collect), all on its one event loop; a trial's GPUs are the ones Ray gives
its bundle, asked of Ray by a task in that bundle.

Like the trial actors it replaces, the agent is detached and named (after
the experiment's dir and its node), so a control plane killed and resumed
finds it, and its trials, again. It runs in the experiment's runtime
environment, so its keepers start in the code Ray shipped (the experiment's
context), and it is pinned to its node (node affinity, no CPU of its own). It
leaves when it has held no trial for IDLE_SECONDS, or at once when its
experiment ended (`leave_when_idle`). Its idle clock runs from its start, in a
thread of its own: an agent whose first call never came (its control plane
went while Ray was still starting it) leaves too. An ended trial it holds until a
control plane collects it, at most LINGER_SECONDS; then it gives its
placement group back itself.

The class is plain Python; the platform wraps it with ray.remote, so importing
this module does not import ray.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Mapping, Optional

from trialkit import env
from trialkit.ray.trial_actor import RunResult, TrialRunner

IDLE_SECONDS = 5.0  # with no trial held and no call, before the agent's worker exits
IDLE_CHECK_SECONDS = 0.5


def gpu_ids() -> List[str]:
    """The GPUs Ray gave the task running this (in the trial's bundle: the trial's GPUs)."""
    import ray

    return [str(gpu) for gpu in ray.get_gpu_ids()]


class NodeAgent:
    def __init__(self, label: str):
        self.label = label
        self._runners: Dict[str, TrialRunner] = {}
        self._groups: Dict[str, Any] = {}  # handle -> the trial's placement group
        self._last_call = time.monotonic()
        self._leaving = False
        threading.Thread(target=self._exit_when_idle, name="agent-idle", daemon=True).start()

    def __repr__(self) -> str:
        return self.label

    def _touch(self) -> None:
        self._last_call = time.monotonic()

    def _idle(self) -> bool:
        return not self._runners and (self._leaving or time.monotonic() - self._last_call >= IDLE_SECONDS)

    def _exit_when_idle(self) -> None:
        """Once idle, ask the actor itself to leave (`leave_if_idle`): Ray's own exit for an actor, so Ray takes
        the worker's end for the one it intended. A worker that ends itself (os._exit) Ray takes for one that
        died, and says so on the driver's terminal (`(raylet) A worker died ... SYSTEM_ERROR ... OOM killer`)."""
        import ray

        while True:
            while not self._idle():
                time.sleep(IDLE_CHECK_SECONDS)
            try:  # returns only when a call came in between: not idle after all
                ray.get(ray.get_runtime_context().current_actor.leave_if_idle.remote())
            except ray.exceptions.RayActorError:
                return  # it left (this thread goes with its worker)

    async def leave_if_idle(self) -> None:
        """The idle thread's: the actor exits, unless a call came since the thread saw it idle. A call that comes
        as it exits fails with the actor gone, and the platform asks a new agent."""
        if self._idle():
            import ray

            ray.actor.exit_actor()  # the worker goes once this call ends, and with it the actor and its name

    def _runner(self, handle: str) -> TrialRunner:
        self._touch()
        try:
            return self._runners[handle]
        except KeyError:
            raise LookupError(f"trial {handle} does not run here") from None

    async def start(self, handle: str, environ: Mapping[str, str], group: Any, gpus: float) -> int:
        """Start the trial's keeper with `environ` (its GPUs those of `group`'s bundle, when it asks for
        any); its pid, 0 if it did not start. An ended run of the same trial here is forgotten first."""
        await self.discard(handle)
        if handle in self._runners:
            raise RuntimeError(f"trial {handle} runs here already")
        if gpus:
            environ = {**environ, env.CUDA_VISIBLE_DEVICES: ",".join(await self._gpus_of(group, gpus))}
        runner = self._runners[handle] = TrialRunner(f"trial {handle}", leave=lambda: self._forget(handle))
        self._groups[handle] = group
        return await runner.start([], environ)

    async def _gpus_of(self, group: Any, gpus: float) -> List[str]:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # A task with no CPU in the bundle: Ray gives it the bundle's GPUs. max_calls=0 lets a worker serve
        # it again (Ray's default for GPU tasks is a fresh worker each time: the very cost the agent avoids).
        probe = ray.remote(num_cpus=0, num_gpus=gpus, max_calls=0)(gpu_ids).options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, 0))
        return await probe.remote()

    async def hello(self) -> None:
        """Answered once the agent runs (a call: its idle clock starts again)."""
        self._touch()

    async def started(self, handle: str) -> int:
        return await self._runner(handle).started()

    async def wait(self, handle: str) -> RunResult:
        return await self._runner(handle).wait()

    async def ended(self, handle: str) -> Optional[bool]:
        """Whether the trial's keeper has exited; None when the trial is not held here."""
        self._touch()
        runner = self._runners.get(handle)
        return None if runner is None else await runner.ended()

    async def stop(self, handle: str, grace: float) -> bool:
        return await self._runner(handle).stop(grace)

    async def kill(self, handle: str) -> None:
        await self._runner(handle).kill()

    async def collect(self, handle: str) -> List[Dict[str, Any]]:
        """The control plane has the ended trial's result: what its keeper could not deliver; the trial is
        forgotten here and its placement group given back."""
        records = await self._runner(handle).collect()
        self._forget(handle)
        return records

    async def discard(self, handle: str, running_too: bool = False) -> None:
        """Forget an ended run of the trial that no control plane collected (its control plane went), and
        give its group back: the trial starts again. `running_too`: a control plane starts the trial afresh
        and found this run's group in its way, so a run still here is a stale one (its result in, its keeper
        not yet gone, or one no control plane will collect): killed first. Kept, it would hold this agent (and
        its worker) for ever once the new run starts on another node, or refuse the new run's start here."""
        self._touch()
        runner = self._runners.get(handle)
        if runner is None:
            return
        if running_too:
            await runner.kill()
        if await runner.ended():
            self._forget(handle)

    async def leave_when_idle(self) -> None:
        """The experiment ended: go as soon as no trial is held, not IDLE_SECONDS later."""
        self._touch()
        self._leaving = True

    def _forget(self, handle: str) -> None:
        from ray.util.placement_group import remove_placement_group

        self._runners.pop(handle, None)
        group = self._groups.pop(handle, None)
        if group is not None:
            remove_placement_group(group)  # a group removed already stays removed
