"""What every platform receives and answers, as the control plane sees it.

`Platform` is the interface the experiment loop drives: four calls every
platform answers, and optional hooks. `PlatformBase` holds the hooks'
defaults (what the loop does without them); a platform inherits it and
overrides the hooks it can serve.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from trialkit import layout
from trialkit.env import SECRETS
from trialkit.manager import paths


@dataclass
class TrialSpec:
    """One trial to submit: an image and a command, with the environment contract.

    `env` is the full environment contract for the trial (trialkit.env names);
    the token in it is a secret: platforms must pass it without writing it
    into anything they render or log (`secret_env` names such keys).
    """

    experiment_id: str
    trial_id: str
    sequence: int
    command: str  # the user's trial command, a shell line of their own
    env: Dict[str, str] = field(default_factory=dict)
    secret_env: frozenset = SECRETS
    code_dir: Optional[str] = None
    image: Optional[str] = None
    priority: int = 0
    # Kubernetes Secrets whose every key the trial's containers get as a variable (a checkpoint store's
    # credentials, checkpointStorage.secretName): named here, never read by trialkit.
    env_from_secrets: Tuple[str, ...] = ()

    def public_env(self) -> Dict[str, str]:
        return {k: v for k, v in self.env.items() if k not in self.secret_env}


@dataclass
class PlatformStatus:
    status: str  # one of the statuses above
    reason: str = ""
    exit_code: Optional[int] = None
    # FAILED for a cause that is not the trial's own exit code (its node lost, its
    # pod evicted or OOM-killed, its keeper gone): maxTrialRestarts may start it again.
    retryable: bool = False
    # False for a final status of a run whose command never started (stopped while it waited, or before its
    # keeper got to it): the run did nothing, so a stop of the experiment leaves the trial waiting for resume.
    started: bool = True
    # Why the platform itself stopped it (a pool's preemption for a job of higher priority), "" where it did not:
    # the loop ends it as it ends a trial it stopped itself (Loop.finish), PREEMPTED and queued to resume.
    preempted: str = ""


class Platform(Protocol):
    def submit(self, spec: TrialSpec) -> str:
        """Start the trial; its handle, which names it in every later call."""

    def status(self, handle: str) -> PlatformStatus:
        """Where the trial is: WAITING, RUNNING, or a final status with its reason and exit code."""

    def stop(self, handle: str, grace: float) -> None:
        """The graceful stop: SIGTERM to the keeper, which gives the trial `grace` seconds to checkpoint."""

    def kill(self, handle: str) -> None:
        """Stop it now, no checkpoint."""

    # The optional hooks (defaults in PlatformBase).
    on_end: Callable[[str], None]
    """The loop sets it; a platform that can tell calls it (from any thread) the moment a trial ends.
    Without a call the loop finds the end by asking status() every few seconds."""
    reattach: Optional[Callable[[str], bool]]
    """On resume: watch again a trial that an earlier control plane started; False when it no longer runs
    (status() then says how it ended). None: the platform cannot find such trials, so they start again."""
    undelivered_records: Optional[Callable[[str], List[Dict[str, Any]]]]
    """For a trial that ended: the records its keeper could not deliver (no manager listened); usually none."""
    remove_experiment: Optional[Callable[[str, Sequence[str]], List[str]]]
    """(experiment id, trial ids) -> what it deleted: every object the platform made for the experiment
    (`trialkit experiment delete`). None: it leaves nothing behind the experiment dir holds."""
    seed_checkpoint: Optional[Callable[[str, str], None]]
    """(source trial id, trial id): before the trial's first start, its checkpoint dir gets a copy of the
    source trial's (PBT's exploit: it goes on from a better trial's checkpoint). None: the platform cannot
    reach one trial's checkpoint from another's (each pod's own claim)."""

    def experiment_ended(self, experiment_id: str, trial_ids: Sequence[str]) -> None:
        """The experiment is done or stopped: give back what only its trials' resumption needed (checkpoint claims)."""

    def check_ready(self) -> None:
        """Before the manager starts: raise a UserError if trials cannot be submitted at all (no cluster)."""

    def capacity_note(self, trial_concurrency: int, key: str = "trialConcurrency") -> str:
        """A line for the start of a run when fewer than `trial_concurrency` trials can run at once, which names
        the config's key as its user wrote it (`key`); "" if not."""

    checkpoint_survives_stop: bool
    """Whether a stopped trial's checkpoint dir is kept for its restart (else a pause loses its progress)."""
    holds_checkpoint: Optional[Callable[[str], bool]]
    """For a trial that ended: whether it left a checkpoint to go on from (it exited 143 after a stop, or its
    checkpoint dir holds one). None: the platform cannot see; the loop then takes exit 143 alone as one."""
    holds_only_seed: Optional[Callable[[str], bool]]
    """For a trial that ended: whether its checkpoint dir holds just the copy of another's that seed_checkpoint
    gave it (it saved none of its own), which a restart goes on from. None: the platform cannot tell."""

    def manager_url_told(self, handle: str) -> Optional[str]:
        """The manager's URL as the trial's keeper was told it (a cluster's pods reach it at another address);
        None: the manager's own. Named when its keeper has not reached the manager."""
    on_waiting: Callable[[str, str], None]
    """The loop sets it; a platform that holds a submitted trial back (local: until its GPUs are free) calls
    it from submit() with the trial's id and why, before the trial can start."""
    trials_at_once: Callable[[], int]
    """The loop sets it: how many of the experiment's trials it runs at once now (trialConcurrency, which
    `experiment update` may change). The local platform shares the machine's cores among them."""


def _nobody_listens(handle: str) -> None:
    """on_end until the experiment loop sets its own."""


def _nobody_asks(trial_id: str, why: str) -> None:
    """on_waiting until the experiment loop sets its own."""


def _one_at_once() -> int:
    """trials_at_once until the experiment loop sets its own."""
    return 1


class PlatformBase:
    """The optional hooks of `Platform` as a platform without them has them."""

    on_end: Callable[[str], None] = staticmethod(_nobody_listens)
    on_waiting: Callable[[str, str], None] = staticmethod(_nobody_asks)
    trials_at_once: Callable[[], int] = staticmethod(_one_at_once)
    reattach: Optional[Callable[[str], bool]] = None
    undelivered_records: Optional[Callable[[str], List[Dict[str, Any]]]] = None
    remove_experiment: Optional[Callable[[str, Sequence[str]], List[str]]] = None
    holds_checkpoint: Optional[Callable[[str], bool]] = None
    seed_checkpoint: Optional[Callable[[str, str], None]] = None
    holds_only_seed: Optional[Callable[[str], bool]] = None
    checkpoint_survives_stop: bool = True  # the trial dir, checkpoint included, stays where the restart runs

    def experiment_ended(self, experiment_id: str, trial_ids: Sequence[str]) -> None:
        """Nothing outlives a trial here."""

    def capacity_note(self, trial_concurrency: int, key: str = "trialConcurrency") -> str:
        """A line for the start of a run when the platform runs fewer than `trial_concurrency` trials at once
        (a resource pool's declared slots); "" when it holds none back."""
        return ""

    def check_ready(self) -> None:
        """Ready as soon as it exists."""

    def manager_url_told(self, handle: str) -> Optional[str]:
        """The manager's URL as the trial's keeper was told it; None: the manager's own."""
        return None


def copy_checkpoint(experiment_dir: Path, source: str, trial_id: str) -> None:
    """seed_checkpoint of a platform whose trials' dirs are in the experiment dir (local; Ray, whose nodes see
    it): a copy, not links, since training may rewrite a checkpoint's files in place."""
    origin = layout.checkpoint_dir(paths.trial_dir(experiment_dir, source))
    if origin.is_dir():
        shutil.copytree(origin, layout.checkpoint_dir(paths.trial_dir(experiment_dir, trial_id)), symlinks=True,
                        dirs_exist_ok=True)
