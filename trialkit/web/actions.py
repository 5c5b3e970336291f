"""The page's actions on trials, and what carries them out.

The experiment loop owns the trials: it hands the page an `Admin` whose
callables do the work (the same ones behind its command-line actions). An
action left None is not offered: the page hides it and its route answers 501.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

from trialkit.manager.server import HttpError
from trialkit.errors import UserError

ACTIONS = ("kill", "pause", "activate", "priority")


@dataclass
class Admin:
    kill: Optional[Callable[[str], None]] = None  # trial id: stop it now, no checkpoint
    pause: Optional[Callable[[str], None]] = None  # trial id: stop it with a checkpoint, keep it to resume
    activate: Optional[Callable[[str], None]] = None  # trial id: queue a paused trial again
    set_priority: Optional[Callable[[str, int], None]] = None  # trial id, new priority
    queue_order: Optional[Callable[[str], Sequence[str]]] = None  # experiment id -> waiting trial ids, next first

    def offered(self) -> List[str]:
        return [name for name in ACTIONS if self._callable(name) is not None]

    def _callable(self, action: str) -> Optional[Callable[..., None]]:
        return self.set_priority if action == "priority" else getattr(self, action)

    def perform(self, action: str, trial_id: str, body: Any) -> None:
        """Run one action; HttpError for an unknown or unoffered one, a bad body, or a move the loop refuses."""
        if action not in ACTIONS:
            raise HttpError(404, f"no action {action!r} (one of {', '.join(ACTIONS)})")
        function = self._callable(action)
        if function is None:
            raise HttpError(501, f"{action} is not available in this manager")
        args: List[Any] = [trial_id]
        if action == "priority":
            priority = body.get("priority") if isinstance(body, dict) else None
            if not isinstance(priority, int) or isinstance(priority, bool):
                raise HttpError(400, 'expected {"priority": <a whole number>}')
            args.append(priority)
        try:
            function(*args)
        except UserError as err:
            raise HttpError(409, err.line()) from None
