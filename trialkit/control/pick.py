"""The tuner as the experiment loop asks it: each proposal is computed on a thread of its own.

A model-based tuner may think for seconds (a Gaussian process fitted, its
acquisition maximized from hundreds of starts). The loop's thread meanwhile
goes on handling what comes (a Ctrl-C, a trial's end, the page's actions);
the finished proposal wakes it. Only one thread touches the tuner at a time:
what the loop tells it during a proposal (results, ends, imported data) is
held and told, in the same order, once the proposal is done, which is what
the tuner saw when the loop waited for it. A tuner's proposals are thus the
same as a loop that waits would get, and `replay` after a resume gives them
again. When the run ends, a proposal in progress is abandoned (the tuner
stops at its next check) and its thread joined: nothing was handed out, so
nothing is half recorded.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from trialkit.control.tuners.base import Abandoned, History, Tuner

# A proposal done this soon is taken in the same pass (Random, TPE): only a slow one waits for its wake-up.
QUICK_SECONDS = 0.05
THINKING = "thinking"  # ask()'s answer while the proposal is being computed
Proposal = Optional[Tuple[int, Dict[str, Any]]]


class Picker:
    """Wraps a tuner for the loop: ask() starts a proposal (or hands over a finished one); the tell_* calls
    and the tuner's properties are the tuner's, told in order once no proposal runs."""

    def __init__(self, tuner: Tuner, wake: Callable[[], None]):
        self.tuner = tuner
        self.wake = wake  # called from the proposal's thread once it is done
        self._thread: Optional[threading.Thread] = None
        self._done = threading.Event()  # the proposal's work is over (its thread may not have returned yet)
        self._answer: Proposal = None
        self._ready = False  # _answer is a finished proposal not yet handed over
        self._error: Optional[BaseException] = None
        self._held: List[Tuple[Callable[..., None], tuple]] = []
        tuner.warm_up()

    def ask(self) -> Any:
        """The tuner's next proposal (None: none now or ever, as Tuner.ask), or THINKING while it computes it."""
        if self._thread is None and not self._ready:
            self._done.clear()
            self._thread = threading.Thread(target=self._propose, name="trialkit-tuner", daemon=True)
            self._thread.start()
        if self._thread is not None:
            if not self._done.wait(QUICK_SECONDS):
                return THINKING
            self.settle()
        answer, self._answer, self._ready = self._answer, None, False
        return answer

    def settle(self) -> None:
        """Once the proposal's thread is done: tell the tuner what was held for it; a tuner's error is raised
        here, on the loop's thread, as a proposal computed there would raise it."""
        if self._thread is None or not self._done.is_set():
            return
        self._thread.join()  # at once: its work is over
        self._thread = None
        held, self._held = self._held, []
        for call, args in held:
            call(*args)
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """The run ends: a proposal in progress is abandoned and its thread joined."""
        if self._thread is not None:
            self.tuner.abandon()
            self._thread.join()
        self.tuner.close()
        self._thread, self._answer, self._ready, self._error, self._held = None, None, False, None, []

    def _propose(self) -> None:
        try:
            self._answer, self._ready = self.tuner.ask(), True
        except Abandoned:
            pass
        except BaseException as err:  # noqa: BLE001 - raised on the loop's thread (settle)
            self._error = err
        self._done.set()
        self.wake()

    def _tell(self, call: Callable[..., None], *args: Any) -> None:
        if self._thread is None:
            call(*args)
        else:
            self._held.append((call, args))

    def tell(self, parameter_id: int, final_value: float) -> None:
        self._tell(self.tuner.tell, parameter_id, final_value)

    def tell_failed(self, parameter_id: int) -> None:
        self._tell(self.tuner.tell_failed, parameter_id)

    def tell_intermediate(self, parameter_id: int, value: float) -> None:
        self._tell(self.tuner.tell_intermediate, parameter_id, value)

    def replay(self, history: History) -> None:
        self._tell(self.tuner.replay, list(history))

    def import_results(self, results: List[Tuple[Dict[str, Any], float]]) -> None:
        self._tell(self.tuner.import_results, results)

    # read by the loop between proposals
    @property
    def waiting(self) -> bool:
        return self.tuner.waiting

    @property
    def points_tried(self) -> int:
        return self.tuner.points_tried

    @property
    def HANDS_ON_CHECKPOINTS(self) -> bool:  # noqa: N802 - the tuner class's flag, by its name
        return self.tuner.HANDS_ON_CHECKPOINTS

    @property
    def ROUND(self) -> Optional[str]:  # noqa: N802 - the tuner class's word, by its name
        return self.tuner.ROUND

    def continues_from(self, parameter_id: int) -> Optional[int]:
        return self.tuner.continues_from(parameter_id)
