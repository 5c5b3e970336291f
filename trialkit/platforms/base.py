"""What every platform receives and answers, as the control plane sees it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional


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
    secret_env: frozenset = frozenset({"TRIALKIT_TOKEN"})
    code_dir: Optional[str] = None
    image: Optional[str] = None
    priority: int = 0

    def public_env(self) -> Dict[str, str]:
        return {k: v for k, v in self.env.items() if k not in self.secret_env}


@dataclass
class PlatformStatus:
    status: str  # one of the statuses above
    reason: str = ""
    exit_code: Optional[int] = None
