"""The experiment loop: ask the tuner, submit trials, act on what they report.

One thread owns every piece of state (tuner, assessor, trials, platform
calls; the tuner computes a proposal on a thread of its own, trialkit.control.pick,
while the loop holds what it tells it); the rest reaches it through one queue:
  - the manager's server (its loop) puts the records it stored (`stored`:
    FINAL -> tuner, PERIODICAL -> assessor -> a graceful stop through the platform);
  - the platform's threads put trial ends (`on_end`; local: the keeper exited);
  - signal handlers put SIGTERM/SIGINT; a finished proposal wakes the loop; the admin routes and the page put
    actions of the table (trialkit.control.actions) to run here (`perform`).
A trial's end is seen the moment its keeper exits and the next trial is
submitted in the same pass. A platform status sweep every few seconds is only
a backstop, for platforms that cannot tell and for a lost notice.

Slots: trialConcurrency trials run at once. When one frees, the next to start
is the job queue's head (trialkit.control.queue: activated and preempted
trials, smaller priority first) or, when none waits at the experiment's
priority or a smaller one, a new trial from the tuner. A tuner that runs in rounds (Hyperband's, PBT's
generations) may have nothing until a running trial ends: it is asked again then. A paused experiment
starts nothing and asks the tuner nothing. The experiment ends when nothing runs, waits or is paused
and the tuner has nothing more (or it was stopped: paused trials then stay
paused, and after a user's stop waiting ones wait, for `experiment resume`).

Named for what it is, the loop alone: the manager's HTTP is
trialkit.control.manager_http, what users can do is trialkit.control.actions,
resuming is trialkit.control.resume, and a run from start to summary is
trialkit.control.run.
"""
from __future__ import annotations

import hashlib
import queue
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Set, TextIO, Tuple

from trialkit import __version__, env, records, schema, statuses
from trialkit.checkpoints import STORE_FAILED_EXIT
from trialkit.control import determined
from trialkit.control.assessors import build_assessor
from trialkit.control.checkpoints import Collector, open_store
from trialkit.control.config import ExperimentConfig, parse_config, trials_experiment_dir
from trialkit.control.pick import THINKING, Picker
from trialkit.control.progress import TICK_SECONDS, Progress, Snapshot
from trialkit.control.queue import (NO_CHECKPOINT, RESAVE, RESUMABLE, STARTED_FROM, JobQueue, goes_before, label,
                                   requeued, rerun, stopping)
from trialkit.control.results import LEFT_NO_CHECKPOINT, left_no_checkpoint, metric_value, rank, shown_values
from trialkit.control.specs import build_spec
from trialkit.control.tuners import build_tuner
from trialkit.errors import UserError
from trialkit.manager import paths
from trialkit.manager.routes import HttpError
from trialkit.manager.store import Store, new_token
from trialkit.platforms.base import Platform, PlatformStatus
from trialkit.statuses import (  # DONE, ERROR, PAUSED, STOPPED (and RUNNING): the experiment's, named here too
    DONE,
    EARLY_STOPPED,
    ERROR,
    FAILED,
    FINAL_STATUSES,
    PAUSED,
    PREEMPTED,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    SYS_CANCELED,
    USER_CANCELED,
    WAITING,
)

if TYPE_CHECKING:
    from trialkit.control.actions import Action
    from trialkit.control.manager_http import Manager

BACKSTOP_SECONDS = 5.0
# A trial its platform says runs, whose keeper has not reached the manager this long, is said to be unheard.
KEEPER_SILENCE_SECONDS = 30
CALL_TIMEOUT = 10.0  # an action waits this long for the loop
MAX_SUBMIT_FAILURES = 3  # in a row: the platform cannot start trials at all


# Why the loop stops a trial -> the status it ends with (a user's reasons: trialkit.control.actions).
ASSESSOR_STOP = (EARLY_STOPPED, "stopped early by the assessor")
TIMEOUT_STOP = (FAILED, "timeout: ran past maxTrialDuration")
DURATION_STOP = (SYS_CANCELED, "maxExperimentDuration reached")
UNHEARD = "its keeper has not reached the manager"
# Said once (_warn_once): a trial without a final result teaches the tuner nothing, and none can be the best.
NO_FINAL = ("it ended without a final result, so the tuner learns nothing from it and it cannot be the best trial: "
            "report one with nni.report_final_result or trialkit.report_final_result; Determined code reports the "
            "validation metric its Determined config's searcher.metric names (run that config)")
# Said once: a PBT step that left nothing for the steps that go on from it (NNI's example code does save).
NO_PBT_SAVE = ("a PBT step ended without leaving its checkpoint (its save_checkpoint_dir and its checkpoint dir are "
               "empty): the steps that go on from it load nothing, so each generation repeats the one before; save "
               "the model into save_checkpoint_dir (NNI's PBT) or trialkit.checkpoint_dir()")
# The reason of a trial that waited when a user stopped the experiment: it ran nothing, and waits still.
# A second SIGINT/SIGTERM sooner than this is the first one delivered twice (no hand presses Ctrl-C twice so
# fast); only a later one is "again": kill now.
SAME_SIGNAL_SECONDS = 0.3
UNSTARTED_AT_STOP = "the experiment stopped before it started: `trialkit experiment resume` starts it"
# Said once: a Determined trial's validation without its searcher's metric is judged by nothing.
UNSEARCHED = ("its validation metrics ({}) hold no number named by the Determined config's searcher.metric: the "
              "searcher judges none of its validations (ASHA stops no trial) and no checkpoint is its best; name one "
              "of them in searcher.metric")
# Said once: ASHA on a time_metric places a validation at a rung by it (assessors.ASHA.step_value); one without
# it reaches no rung, so ASHA stops no trial.
UNTIMED = ("its validation metrics ({}) hold no number named by the Determined config's searcher.time_metric "
           "({metric}): ASHA places none of its validations at a rung, so it stops no trial; report {metric} with "
           "each validation, or name one of its metrics in searcher.time_metric")


@dataclass
class Trial:
    id: str
    sequence: int
    parameter_id: int
    parameters: Dict[str, Any]
    status: str = WAITING
    restart_count: int = 0
    ran: bool = False  # submitted since it last joined the queue: its next start is a restart
    held: str = ""  # submitted, and held back by its platform until its resource pool has room: why
    handle: Optional[str] = None
    deadline: Optional[float] = None  # monotonic: when maxTrialDuration runs out
    stop: Optional[Tuple[str, str]] = None  # (status, reason) once a stop was sent
    stop_sent: Optional[float] = None  # wall clock: when the stop was sent (its grace runs from then)
    reason: str = ""  # why it ended as it did
    exit_code: Optional[int] = None
    intermediate: List[Any] = field(default_factory=list)  # what the assessor judges of each (step_value)
    latest: Optional[float] = None  # the number of its latest intermediate result (the tuner's, for Hyperband)
    final: Any = None
    has_final: bool = False
    retries: int = 0  # restarts after failures not its own (maxTrialRestarts)
    note: str = ""  # a warning that stays with it as its reason when nothing else explains its end
    running_since: Optional[float] = None  # monotonic: when its platform first said it runs, this start
    heard: bool = False  # its keeper has reached the manager since this start
    shown_running: bool = False  # the store says RUNNING on its platform's word, its keeper unheard

    @property
    def ended(self) -> bool:
        """Not running and not to be started (paused trials too, until activated)."""
        return self.status in FINAL_STATUSES

    @property
    def paused(self) -> bool:
        return self.status == PREEMPTED

    @property
    def steps(self) -> List[Any]:
        """What the assessor judges: its intermediate results it could read a value of."""
        return [value for value in self.intermediate if value is not None]


class _Reply:
    def __init__(self):
        self.done = threading.Event()
        self.value: Any = None
        self.error: Optional[BaseException] = None


def experiment_seed(experiment_id: str) -> int:
    """The tuner's seed: fixed by the id, so a resumed experiment's tuner is the same tuner."""
    return int.from_bytes(hashlib.sha256(experiment_id.encode()).digest()[:4], "big")


class Loop:
    def __init__(self, config: ExperimentConfig, experiment_id: str, experiment_dir: Path, store: Store,
                 out: Optional[TextIO] = None, elapsed: float = 0.0):
        self.config = config
        self.experiment_id = experiment_id
        self.experiment_dir = Path(experiment_dir)
        self.store = store
        self.progress = Progress(out)
        self.events: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()  # put() is safe in a signal handler
        # asked on a thread of its own: a tuner that thinks for seconds holds up no Ctrl-C or trial end
        self.tuner = Picker(build_tuner(config.tuner.name, config.tuner.class_args, config.search_space,
                                        seed=experiment_seed(experiment_id),
                                        experiment_dir=trials_experiment_dir(config, self.experiment_dir)),
                            lambda: self.events.put(("picked",)))
        self.assessor = build_assessor(config.assessor.name, config.assessor.class_args) if config.assessor else None
        # What a trial's steps hold: what its assessor judges of each intermediate result.
        self.step_value = self.assessor.step_value if self.assessor else metric_value
        self.trials: Dict[str, Trial] = {}
        self.active: Dict[str, Trial] = {}  # submitted and not ended: each holds a slot
        self.queue = JobQueue(store)
        self.paused = False  # the experiment: start nothing, ask the tuner nothing
        self.by_handle: Dict[str, Trial] = {}
        self.next_sequence = 0
        self.exhausted = False  # the tuner has nothing more to propose
        self.stopping: Optional[Tuple[str, str]] = None  # the experiment ends early: (trial status, why)
        self.interrupts = 0
        self.last_interrupt = 0.0  # time.monotonic() of the last counted signal
        self.signal_at = -SAME_SIGNAL_SECONDS  # time.monotonic() when the last SIGINT or SIGTERM came
        self.submit_failures = 0
        self.error: Optional[str] = None  # why the experiment could not go on
        self.elapsed_before = elapsed
        self.started = time.monotonic()
        self.unseeded_said = False  # the note that this platform cannot copy checkpoints was given
        self.warned: set = set()  # the warnings printed on the console (_warn_once): each once
        self.checkpoint_store: Any = None  # the object store of checkpoints, opened for a first copy (_seed_in_store)
        # Which checkpoints stay (checkpointStorage's retention), applied as each trial run ends.
        self.retention = (Collector(store, experiment_id, config.to_dict(), self.progress.say)
                          if config.checkpoint_storage is not None else None)
        # Set by trialkit.control.run before serve(): the manager listens first, then the platform starts.
        self.manager: Manager
        self.platform: Platform

    # -- the loop ----------------------------------------------------------------------------
    def serve(self) -> None:
        """Submit and listen until no trial runs and none is left to start."""
        try:
            self._serve()
        finally:
            self.tuner.close()  # a proposal in progress is abandoned: the run needs it no more

    def _serve(self) -> None:
        last_backstop = time.monotonic()
        disk = self.manager.server.disk
        while True:
            self._check_limits()
            if disk.problem is None:  # a disk that takes no writes starts no trial
                self._survive(self._fill)
            self.progress.update(self.snapshot())  # after the decisions on the last events: a replaced trial no dip
            if self._over():
                return
            try:
                event = self.events.get(timeout=self._wait_time(last_backstop))
            except queue.Empty:
                event = None
            while event is not None:
                self._survive(self._handle, event)
                try:
                    event = self.events.get_nowait()
                except queue.Empty:
                    event = None
            if time.monotonic() - last_backstop >= BACKSTOP_SECONDS:
                last_backstop = time.monotonic()
                self._survive(self._backstop)

    def _survive(self, step: Callable[..., None], *args: Any) -> None:
        """One step of the loop; a store write the disk refuses stops the step, not the experiment.

        What the step did not record is taken again: a trial whose end could not be stored stays
        active, and the backstop sweep ends it once the disk takes writes (trialkit.manager.disk).
        """
        try:
            step(*args)
        except Exception as err:
            if not self.manager.server.disk.failed(err, "the store"):
                raise

    def final_status(self) -> str:
        if self.error is not None:
            return ERROR
        return STOPPED if self.stopping is not None and self.stopping[0] == USER_CANCELED else DONE

    def ended_why(self) -> Optional[str]:
        """Why it ended, as the run's end, `experiment show` and the page say it: its error, what stopped it, the
        limit it reached or its search space used up; None where none of those (a tuner that proposes no more)."""
        if self.error is not None:
            return self.error
        if self.stopping is not None:
            return self.stopping[1]
        limit, made = self.config.max_trial_number, len(self.trials)
        if limit is not None and made >= limit:
            return f"{self.as_written('maxTrialNumber')} ({limit}) reached" + (
                f"; {made} trials were made before it was lowered" if made > limit else "")
        if self.exhausted:
            return f"search space exhausted: each of its {self.tuner.points_tried} points was tried"
        return None

    def as_written(self, key: str) -> str:
        """A config key as its user wrote it: a Determined config's own name for the key it was translated into."""
        return schema.rename_path(key, determined.V2_WHERE) if determined.translated(self.config.trial_command) \
            else key

    def _over(self) -> bool:
        if self.active:
            return False
        if self.stopping is not None:
            return True  # what is still queued waits for `experiment resume` (stop_experiment)
        if self.queue:
            return False
        # A paused experiment or trial waits for `activate`.
        return not self.paused and not any(t.paused for t in self.trials.values()) and not self._may_create()

    def _wait_time(self, last_backstop: float) -> float:
        now = time.monotonic()
        until = [last_backstop + BACKSTOP_SECONDS]
        until += [t.deadline for t in self.active.values() if t.deadline is not None and t.stop is None]
        if self.config.max_experiment_duration is not None and self.stopping is None:
            until.append(now + self.config.max_experiment_duration - self.elapsed())
        if self.progress.tty:
            until.append(now + TICK_SECONDS)
        return max(0.0, min(until) - now)

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    # -- what other threads hand the loop ----------------------------------------------------
    def stored(self, trial_id: str, fresh: List[Dict[str, Any]]) -> None:
        """The manager's listener: records it stored (called on its loop: only queued here)."""
        self.events.put(("records", trial_id, fresh))

    def ended(self, handle: str) -> None:
        """The platform's on_end: a trial ended (from the platform's thread)."""
        self.events.put(("end", handle))

    def waiting(self, trial_id: str, why: str) -> None:
        """The platform's on_waiting: it holds a submitted trial back, and why (from any of its threads). The
        store says so at once; the loop counts it as waiting, not running, until it reports running."""
        self.store.set_status(trial_id, WAITING, reason=why)
        self.events.put(("waiting", trial_id, why))

    def perform(self, action: "Action", trial_id: Optional[str], body: Any) -> Any:
        """Run an action of the table on the loop's thread and return its answer (admin routes, the page)."""
        reply = _Reply()
        self.events.put(("action", action, trial_id, body, reply))
        if not reply.done.wait(CALL_TIMEOUT):
            raise HttpError(503, "the experiment loop did not answer in time")
        if reply.error is not None:
            raise reply.error
        return reply.value

    @contextmanager
    def signals_handled(self) -> Iterator[None]:
        """SIGINT and SIGTERM stop the experiment gracefully (a second one kills the trials) while inside."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach only the main thread; an embedding program keeps its own
            return
        previous = {signum: signal.signal(signum, self._signal_handler) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            # A stop delivered twice may have its second copy still on its way when a quick stop has ended the loop:
            # ours to drop, where the handler put back would end the run's summary with a KeyboardInterrupt.
            time.sleep(max(0.0, self.signal_at + SAME_SIGNAL_SECONDS - time.monotonic()))
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _signal_handler(self, signum: int, frame: Any) -> None:
        self.signal_at = time.monotonic()  # when it came, not when a busy loop gets to it
        self.events.put(("signal", signum, self.signal_at))

    def _handle(self, event: tuple) -> None:
        kind = event[0]
        if kind == "records":
            self.on_records(event[1], event[2])
        elif kind == "end":
            trial = self.by_handle.get(event[1])
            if trial is not None and trial.id in self.active:
                self._check_ended(trial)
        elif kind == "waiting":
            self._on_waiting(self.trials.get(event[1]), event[2])
        elif kind == "signal":
            self._on_signal(event[1], event[2])
        elif kind == "picked":
            self.tuner.settle()  # what it was told meanwhile; the proposal waits for the next _fill
        elif kind == "action":
            _, action, trial_id, body, reply = event
            try:
                reply.value = action.run(self, trial_id, body)
            except Exception as err:  # noqa: BLE001 - handed to the HTTP thread, which answers with it
                reply.error = err
            reply.done.set()

    def _on_waiting(self, trial: Optional[Trial], why: str) -> None:
        """Its platform holds it back (on_waiting): counted as waiting until it runs. A word queued by a platform's
        thread that had not seen it start (Kueue's admissions watcher) may come after its keeper's RUNNING or its
        platform's: stale, it changes nothing, and the store, which waiting() set at once, says RUNNING again."""
        if trial is None or trial.id not in self.active:
            return
        if trial.heard or trial.running_since is not None:
            self.store.set_status(trial.id, statuses.RUNNING, reason=self.running_reason(trial))
            return
        trial.held = why

    # -- records and trial ends -----------------------------------------------------------
    def on_records(self, trial_id: str, fresh: List[Dict[str, Any]]) -> None:
        trial = self.trials.get(trial_id)
        if trial is None:
            return
        final_here = any(rec["type"] == records.FINAL for rec in fresh)
        if fresh and not trial.heard and trial.id in self.active:
            self._heard(trial)
        for rec in fresh:
            if rec["type"] == records.FINAL and not trial.has_final:
                trial.final, trial.has_final = rec["value"], True
                value = metric_value(rec["value"])
                if value is not None:
                    self.tuner.tell(trial.parameter_id, value)
            elif rec["type"] == records.PERIODICAL:
                if determined.translated(self.config.trial_command):
                    self._check_validation(trial, rec["value"])
                trial.intermediate.append(self.step_value(rec["value"]))
                number = metric_value(rec["value"])
                if number is not None:
                    trial.latest = number
                    self.tuner.tell_intermediate(trial.parameter_id, number)
                self._assess(trial, final_here)
            elif rec["type"] == records.STATUS and trial.id not in self.active and trial.status != statuses.RUNNING:
                # A keeper's late word (delivered after its exit was seen) must not undo ours. One restored
                # RUNNING (a resume collecting what it left) has no word of ours yet: its keeper's stands.
                self.store.set_status(trial.id, trial.status, exit_code=trial.exit_code, reason=trial.reason)
            elif rec["type"] == records.STATUS and rec["value"].get("status") == statuses.RUNNING:
                trial.held = ""  # it got its place: the platform called on_waiting before it started it
                self._check_keeper_version(trial, rec["value"].get("keeper_version"))
                self._keeper_warnings(trial, rec["value"].get("warnings") or ())
                self._started(trial)
                if trial.stop is not None:  # its keeper's word came after the stop: the store says it is stopping
                    self.say_stopping(trial)

    def _started(self, trial: Trial) -> None:
        """maxTrialDuration counts from the start (its keeper's word or its platform's, the first), not the
        submission: a trial may wait for its GPUs (or a pod for its node) first."""
        if self.config.max_trial_duration is not None and trial.deadline is None:
            trial.deadline = time.monotonic() + self.config.max_trial_duration

    def _heard(self, trial: Trial) -> None:
        """Its keeper reached the manager: a warning that it had not goes from its reason."""
        trial.heard = True
        if trial.note.startswith(UNHEARD):
            trial.note = ""
            self.progress.say(f"trial {trial.id}: its keeper reached the manager")
            self.store.set_status(trial.id, statuses.RUNNING, reason=self.running_reason(trial))

    def _runs(self, trial: Trial) -> None:
        """Its platform says it runs: so does the store, whether or not its keeper has reached the manager (from
        the next look on: a keeper that starts with its process says so itself first); one that has not within
        KEEPER_SILENCE_SECONDS is said, with the address it was told, in the trial's reason (`trial show`, the
        page) and the progress lines."""
        now = time.monotonic()
        trial.held = ""  # it got its place, said or not by its keeper
        if trial.running_since is None:
            trial.running_since = now
            self._started(trial)
            return
        ran = now - trial.running_since
        if trial.heard or trial.note.startswith(UNHEARD):
            return
        if ran >= KEEPER_SILENCE_SECONDS:
            url = self.platform.manager_url_told(trial.handle) or self.manager.url
            trial.note = f"{UNHEARD} at {url} in {int(ran)} s of running: check that its pods reach that address (managerAddress)"
            self.progress.say(f"trial {trial.id}: warning: {trial.note}")
            self.store.set_status(trial.id, statuses.RUNNING, reason=self.running_reason(trial), source="platform")
        elif not trial.shown_running:
            trial.shown_running = True
            self.store.set_status(trial.id, statuses.RUNNING, reason=self.running_reason(trial), source="platform")

    def _check_keeper_version(self, trial: Trial, theirs: Any) -> None:
        """A keeper of another trialkit (an image built long ago) may speak an older record format:
        the trial's status says so in one line, from the start."""
        if theirs is None or theirs == __version__:
            return
        trial.note = (f"its keeper is trialkit {theirs}, this manager trialkit {__version__}: "
                      "install the same version in the trial's image")
        self.progress.say(f"trial {trial.id}: warning: {trial.note}")
        self.store.set_status(trial.id, statuses.RUNNING, reason=self.running_reason(trial))

    def _check_validation(self, trial: Trial, value: Any) -> None:
        """A Determined trial's validation that lacks what its searcher reads, said once each: its metric (the Core
        API's report carries it as "default" where it found one) and the time_metric a config may set."""
        if not (isinstance(value, dict) and value.get("group") == "validation"):
            return
        metrics = value.get("metrics") if isinstance(value.get("metrics"), dict) else {}
        names = ", ".join(map(str, metrics)) or "none"
        if "default" not in value:
            self._warn_once(trial, UNSEARCHED.format(names))
        time_metric = self.config.assessor.class_args.get("time_metric") if self.config.assessor else None
        if time_metric is not None and metric_value(metrics.get(time_metric)) is None:
            self._warn_once(trial, UNTIMED.format(names, metric=time_metric))

    def _keeper_warnings(self, trial: Trial, said: List[str]) -> None:
        """What its keeper warned of at its start (a pipe in the command, a grace the runtime cuts short)."""
        for line in said:
            self._warn_once(trial, line)

    def _warn_once(self, trial: Trial, line: str) -> None:
        """A warning on the experiment's console, where the user looks, once: the first trial that gives cause names
        it, the hundred after it with the same cause say nothing more."""
        if line not in self.warned:
            self.warned.add(line)
            self.progress.say(f"trial {trial.id}: warning: {line}")

    def _assess(self, trial: Trial, final_here: bool) -> None:
        """The assessor sees the trial's steps; it stops the trial unless its final result is in, or came with
        these steps (`final_here`): a trial that reported its final result is done, whatever its curve."""
        if self.assessor is None or trial.stop is not None or trial.ended:
            return
        steps = trial.steps
        if steps and self.assessor.should_stop(trial.id, steps) and not (final_here or trial.has_final):
            self.stop_trial(trial, ASSESSOR_STOP)

    def _check_ended(self, trial: Trial) -> None:
        try:
            status = self.platform.status(trial.handle)
        except Exception as err:  # noqa: BLE001 - a platform's hiccup (an API call) waits for the next sweep
            self.progress.say(f"warning: cannot read the status of {trial.id}: {err}")
            return
        if status.status == statuses.RUNNING:
            self._runs(trial)
        elif status.status in FINAL_STATUSES:
            self.collect_undelivered(trial)
            if not status.started and self._waits_for_resume(trial):
                self.active.pop(trial.id, None)
                trial.ran = False  # this start did nothing: not a restart
                self.requeue(trial, UNSTARTED_AT_STOP)
            elif not self._retried(trial, status):
                self.finish(trial, status.status, status.reason, status.exit_code, status.preempted)

    def _retried(self, trial: Trial, status: PlatformStatus) -> bool:
        """A trial that failed for a cause not its own starts again from its checkpoint, up to maxTrialRestarts."""
        limit = self.config.max_trial_restarts
        if not (status.status == FAILED and status.retryable and trial.stop is None and self.stopping is None
                and trial.retries < limit):
            return False
        trial.retries += 1
        self.active.pop(trial.id, None)
        why = f"restart {trial.retries} of {limit} after: {status.reason or 'a failure not its own'}"
        self.progress.say(f"trial {trial.id}: {why}")
        self.requeue(trial, why)
        return True

    def collect_undelivered(self, trial: Trial) -> None:
        """Store what the trial's keeper spooled and could not deliver (its manager was
        away when it ended); usually nothing. Stored once: the store dedupes by sequence."""
        undelivered = self.platform.undelivered_records
        left = undelivered(trial.handle or trial.id) if undelivered is not None else []
        batch = [rec for rec in left if records.wire_problem(rec) is None]
        if batch:
            self.on_records(trial.id, self.store.add_records(trial.id, batch))

    def finish(self, trial: Trial, status: str, reason: str, exit_code: Optional[int], preempted: str = "") -> None:
        """Record the trial's end as its platform saw it (`status`), or, where the control plane stopped it (the
        loop's stop, or its platform's preemption: `preempted` says why), as that stop's status."""
        stop = trial.stop or ((PREEMPTED, preempted) if preempted else None)
        # Its checkpoint could not be restored for a reason of the store (STORE_FAILED_EXIT): it keeps its
        # place, for `experiment resume` once the store is fixed, and the experiment stops (below) saying why.
        store_failed = status == PREEMPTED and exit_code == STORE_FAILED_EXIT
        why_store = reason
        if store_failed:
            reason = f"{reason}; {RESUMABLE}"
        # A stop that came too late to matter (the trial finished with its result) changes nothing.
        elif stop is not None and not (status == SUCCEEDED and trial.has_final):
            # The keeper's, kept after who stopped it; its grace is the config's, which reached it as a variable.
            killed = (statuses.grace_set_by(reason, env.GRACE_SECONDS, "trialGraceSeconds")
                      if statuses.is_grace_killed(reason) else "")
            status, reason = self._stopped(trial, stop, status, killed)
        elif status == PREEMPTED and not self._checkpointed(trial, status):  # a pod deleted, a pool's preemption
            reason = f"{reason}; {NO_CHECKPOINT}" if reason else NO_CHECKPOINT
        if status == SUCCEEDED and not trial.has_final:
            self._warn_once(trial, NO_FINAL)
            if not reason:
                reason = "; ".join(filter(None, ("ended without reporting a final result", trial.note)))
        reason = reason or trial.note
        empty = self._left_no_checkpoint(trial, status)
        if empty is not None:
            self._warn_once(trial, NO_PBT_SAVE)
            said = f"{LEFT_NO_CHECKPOINT}: nothing in its save_checkpoint_dir {empty}"
            reason = "; ".join(filter(None, (reason, said)))
        self.store.set_status(trial.id, status, exit_code=exit_code, reason=reason)
        trial.status, trial.reason, trial.exit_code = status, reason, exit_code
        self.active.pop(trial.id, None)
        if store_failed and self.retention is not None:  # its passes would wait for the failed store, then fail
            self.retention.abandon()
            self.retention = None
        if self.retention is not None:
            self.retention.request()
        self.manager.save(self.elapsed())
        self.progress.trial_ended(trial.id, label(status), trial.final, reason, self.snapshot())
        if trial.paused:
            if store_failed:
                if self.stopping is None:
                    self.error = (f"trial {trial.id}: {why_store} (fix the store, then `trialkit experiment resume "
                                  f"{self.experiment_id}`: every trial goes on where it was)")
                    self.stop_experiment((USER_CANCELED, "experiment stopped: its checkpoint store failed"))
            elif trial.stop is None and self.stopping is None:
                # Stopped by someone else (a pod deleted, a spot notice, a job of higher priority): it resumes.
                lost = f"; {NO_CHECKPOINT}" if reason.endswith(NO_CHECKPOINT) else ""
                self.requeue(trial, f"preempted: queued to resume{lost}")
            return  # not done: the tuner and the assessor wait for its result
        self.tuner.tell_failed(trial.parameter_id)  # ignored when its final result was told
        if self.assessor is not None:
            self.assessor.trial_end(trial.id, status == SUCCEEDED)
        if status == FAILED:
            self._check_first_failures()

    def _stopped(self, trial: Trial, stop: Tuple[str, str], status: str, killed: str = "") -> Tuple[str, str]:
        """(status, reason) of a trial that ended after the control plane stopped it (`stop`: trial.stop, or its
        platform's preemption), given how the platform saw it end (`status`, SUCCEEDED for one that exited 0
        without its final result). A user's stop of the whole experiment (Ctrl-C, SIGTERM, `experiment stop`)
        that finds it holding a checkpoint leaves it PREEMPTED, for `experiment resume`, and so does one that
        finds it without one before its final result, under every tuner (it runs again from the start: the search
        gets the results maxTrialNumber asked for, and a round that waits for it is ranked on it); a pause or a
        preemption that finds it with none says that its progress restarts; the assessor's stop met a trial
        whose final result was in already: it succeeded. `killed`, the keeper's reason when the grace ran out,
        follows who stopped it."""
        wanted, why = stop
        why = f"{why}; {killed}" if killed else why
        if stop == ASSESSOR_STOP and trial.has_final:
            return SUCCEEDED, "its final result came before the assessor's stop"
        if wanted == USER_CANCELED and stop == self.stopping and self._checkpointed(trial, status):
            only_seed = self.platform.holds_only_seed
            seeded = only_seed is not None and only_seed(trial.handle or trial.id)
            return PREEMPTED, f"{why}; {STARTED_FROM if seeded else RESUMABLE}"
        if wanted == USER_CANCELED and stop == self.stopping and not trial.has_final:
            return PREEMPTED, f"{why}; {rerun(self.tuner.ROUND)}"
        if wanted == USER_CANCELED and stop == self.stopping and self.tuner.HANDS_ON_CHECKPOINTS:
            return PREEMPTED, f"{why}; {RESAVE}"
        if wanted == PREEMPTED and trial.ran and not self._checkpointed(trial, status):
            return PREEMPTED, f"{why}; {NO_CHECKPOINT}"
        return wanted, why

    def _checkpointed(self, trial: Trial, status: str) -> bool:
        """Whether the trial that ended as `status` holds a checkpoint to go on from: as its platform sees it,
        else whether it exited 143 after a stop (its keeper's PREEMPTED)."""
        holds = self.platform.holds_checkpoint
        return holds(trial.handle or trial.id) if holds is not None else status == PREEMPTED

    def _left_no_checkpoint(self, trial: Trial, status: str) -> Optional[str]:
        """A PBT step that ended with its result (others may go on from it) leaving nothing: its empty
        save_checkpoint_dir, where its platform tells (its trials' dirs are on this machine) that its checkpoint
        dir is empty too; else None."""
        if status == PREEMPTED or not trial.has_final or self.platform.holds_checkpoint is None:
            return None
        empty = left_no_checkpoint(trial.parameters)
        return None if empty is None or self._checkpointed(trial, status) else empty

    def _check_first_failures(self) -> None:
        """Stop when the first trials (stopWhenFirstTrialsFail) all failed the same way: the rest would too."""
        count = self.config.stop_when_first_trials_fail
        first = sorted(self.trials.values(), key=lambda t: t.sequence)[:count]
        if not count or self.stopping is not None or len(first) < count:
            return
        # A trial's own id (its dir, its copy of the code) in a reason differs from trial to trial alone.
        ways = {((t.reason or "").replace(t.id, "{trial}"), t.exit_code) for t in first}
        if any(t.status != FAILED for t in first) or len(ways) != 1:
            return
        why = first[0].reason or f"exit {first[0].exit_code}"
        self.error = (f"the first {count} trials all failed the same way: {why} (see `trialkit trial show "
                      f"{first[0].id}`; stopWhenFirstTrialsFail: 0 in the config runs every trial, as NNI does)")
        self.stop_experiment((SYS_CANCELED, f"experiment stopped: its first {count} trials all failed"))

    def _backstop(self) -> None:
        for trial in list(self.active.values()):
            if trial.handle is not None:
                self._check_ended(trial)

    def _on_signal(self, signum: int, at: float) -> None:
        if self.interrupts and at - self.last_interrupt < SAME_SIGNAL_SECONDS:
            return  # one stop sent twice: GNU timeout signals its child, then the child's group
        self.interrupts += 1
        self.last_interrupt = at
        name = signal.Signals(signum).name
        if self.interrupts == 1:
            self.progress.say(f"{name}: stopping the trials gracefully (again to kill them now)")
            self.stop_experiment((USER_CANCELED, f"experiment stopped ({name})"))
        else:
            self.progress.say(f"{name}: killing the trials")
            for trial in self.active.values():
                self.platform.kill(trial.handle)

    # -- stopping ----------------------------------------------------------------------
    def stop_experiment(self, why: Tuple[str, str]) -> None:
        """End early: running trials stop gracefully, waiting ones end; `why` is (their status, the reason).
        A user's stop (Ctrl-C, SIGTERM, `experiment stop`) ends only what runs: a trial that waits (queued, or
        submitted and not started: _check_ended) keeps waiting, with its parameters, for `experiment resume`,
        as NNI's resume runs the rest of maxTrialNumber."""
        if self.stopping is None:
            self.stopping = why
        for trial in list(self.active.values()):
            self.stop_trial(trial, why)
        for trial_id in self.queue.order():
            if not self._waits_for_resume(self.trials[trial_id]):
                self.cancel(self.trials[trial_id], why)

    def _waits_for_resume(self, trial: Trial) -> bool:
        """Whether a trial that is not running keeps waiting through the experiment's stop: a user's stop."""
        return self.stopping is not None and self.stopping[0] == USER_CANCELED and trial.stop in (None, self.stopping)

    def cancel(self, trial: Trial, why: Tuple[str, str]) -> None:
        """End a trial that holds no slot (waiting or paused)."""
        if trial.id in self.queue:
            self.queue.remove(trial.id)
        trial.stop = why  # over a pause's: this is how it ends
        self.finish(trial, *why, None)

    def stop_trial(self, trial: Trial, why: Tuple[str, str]) -> None:
        """The graceful stop through the platform; the trial ends as `why` says once the platform reports it."""
        if trial.stop is not None or trial.ended:
            return
        trial.stop, trial.stop_sent = why, time.time()
        try:
            self.platform.stop(trial.handle, self.config.trial_grace_seconds)
        except Exception as err:  # noqa: BLE001 - a platform's hiccup (an API call) must not end the experiment
            self.progress.say(f"warning: cannot stop {trial.id}: {err}")
        self.say_stopping(trial)

    def say_stopping(self, trial: Trial) -> None:
        """Until a stopped trial ends (a script that ignores SIGTERM takes its whole grace), its reason in the store
        says who stopped it and when its grace ends (queue.stopping), beside the status it has: RUNNING, or
        WAITING for one its platform had not started. `trial list`, `trial show` and the page read it."""
        row = self.store.trial(trial.id)
        if row is not None and row["status"] not in FINAL_STATUSES:
            self.store.set_status(trial.id, row["status"], reason=self.running_reason(trial))

    def running_reason(self, trial: Trial) -> str:
        """The reason the store gives a trial that has not ended: that it is stopping, else its note (if any)."""
        if trial.stop is not None and trial.stop_sent is not None:
            return stopping(trial.stop[1], trial.stop_sent, self.config.trial_grace_seconds)
        return trial.note

    def _check_limits(self) -> None:
        now = time.monotonic()
        for trial in list(self.active.values()):
            if trial.deadline is not None and now >= trial.deadline:
                self.stop_trial(trial, TIMEOUT_STOP)
        limit = self.config.max_experiment_duration
        if limit is not None and self.stopping is None and self.elapsed() >= limit:
            self.stop_experiment(DURATION_STOP)

    def set_paused(self, paused: bool) -> None:
        """A paused experiment starts nothing and asks the tuner nothing; the store says so."""
        self.paused = paused
        self.store.set_experiment_status(self.experiment_id, PAUSED if paused else RUNNING)

    # -- starting trials -----------------------------------------------------------------
    def _may_create(self) -> bool:
        limit = self.config.max_trial_number
        return not self.exhausted and (limit is None or len(self.trials) < limit)

    def _fill(self) -> None:
        held: Set[str] = set()  # queued trials that wait for the end of the trial they go on from
        while self.stopping is None and not self.paused and len(self.active) < self.config.trial_concurrency:
            trial = self._next(held)
            if trial is None:
                return
            origin = self._origin(trial)
            if origin is not None and (not origin.ended or origin.paused):
                # Its final result came (the tuner's cue) before its end: its last checkpoint may still be on its
                # way (written after the result, or uploading), or, cut short by a stop or a pause, run again. The
                # copy waits for its end; meanwhile the slot goes to another trial (one running ends soon).
                self._hold_for(trial, origin)
                if origin.id in self.active:
                    return
                held.add(trial.id)
                continue
            if origin is not None:
                if origin.has_final and origin.status != SUCCEEDED:  # said of each trial that goes on from it
                    self.progress.say(f"trial {trial.id}: warning: it goes on from {origin.id}, which ended "
                                      f"{label(origin.status)} after its final result, before its end: what it saved "
                                      "last may be missing")
                self._seed_checkpoint(trial, origin)
            self.submit(trial)

    def _hold_for(self, trial: Trial, origin: Trial) -> None:
        """Back in the queue, saying (once) what it waits for."""
        self.queue.push(trial.id)
        why = f"waits for {origin.id}'s end: it goes on from its checkpoint"
        if trial.held != why:
            trial.held = why
            self.store.set_status(trial.id, WAITING, reason=why)

    def _next(self, held: Set[str]) -> Optional[Trial]:
        """The trial to start: the queue's head (the first not `held`), unless the tuner's next one goes first.

        The tuner's next trial counts as waiting at the back of the
        experiment's priority: queued trials of a bigger priority number wait for it.
        """
        head = next((trial_id for trial_id in self.queue.order() if trial_id not in held), None)
        if (head is None or goes_before(self.config.priority, self.queue.priority(head))) and self._may_create():
            asked = self.tuner.ask()
            if asked is THINKING:
                return None  # its proposal wakes the loop ("picked"); the queue's head waits behind it
            if asked is not None:
                return self._create(*asked)
            if not self.tuner.waiting:  # else it proposes again once a running trial ends (a round, a generation)
                self.exhausted = True
                self.progress.say(f"search space exhausted: each of its {self.tuner.points_tried} points was "
                                  "tried; no new trial starts")
        if head is None:
            return None
        self.queue.remove(head)
        return self.trials[head]

    def _create(self, parameter_id: int, parameters: Dict[str, Any]) -> Trial:
        sequence = self.next_sequence
        self.next_sequence += 1
        trial = Trial(paths.trial_id(self.experiment_id, sequence), sequence, parameter_id, parameters)
        trial_dir = paths.trial_dir(self.experiment_dir, trial.id)
        self.store.add_trial(self.experiment_id, trial.id, sequence=sequence, parameters=parameters, token=None,
                             parameter_id=parameter_id, priority=self.config.priority, trial_dir=str(trial_dir),
                             stdout_path=str(trial_dir / "stdout.log"), stderr_path=str(trial_dir / "stderr.log"))
        self.trials[trial.id] = trial
        self.queue.track(trial.id, self.config.priority)
        return trial

    def _origin(self, trial: Trial) -> Optional[Trial]:
        """The trial whose checkpoint this one starts from (PBT's exploit, a configuration Hyperband sends on),
        for its first start only: a restart goes on from its own."""
        if trial.ran or trial.restart_count:
            return None
        source = self.tuner.continues_from(trial.parameter_id)
        return None if source is None else next(t for t in self.trials.values() if t.parameter_id == source)

    def _seed_checkpoint(self, trial: Trial, origin: Trial) -> None:
        """A trial the tuner continues from another's checkpoint starts with a copy of it."""
        storage = self.config.checkpoint_storage
        if storage is not None and storage.store is not None:
            # The store is where a trial's keeper fetches its checkpoint from before it starts, on any platform
            # (a pod on a node that never held the source's dir).
            self._seed_in_store(origin.id, trial.id)
            return
        if self.platform.seed_checkpoint is None:
            if not self.unseeded_said:
                self.unseeded_said = True
                self.progress.say(f"note: the {self.config.platform} platform cannot copy one trial's checkpoint dir "
                                  "into another's: a trial the tuner continues from another's checkpoint (PBT, a "
                                  "configuration Hyperband sends on) starts with an empty one; PBT's "
                                  "load_checkpoint_dir works on a volume every trial mounts (all_checkpoint_dir)")
            return
        self.platform.seed_checkpoint(origin.id, trial.id)

    def _seed_in_store(self, source: str, trial_id: str) -> None:
        from trialkit.checkpoints.store import StoreError

        try:
            if self.checkpoint_store is None:
                self.checkpoint_store = open_store(self.config.checkpoint_storage)
            copied = self.checkpoint_store.copy_latest(self.experiment_id, source, trial_id)
        except (StoreError, UserError) as err:
            self.progress.say(f"trial {trial_id} starts without {source}'s checkpoint: {err}")
            return
        if copied is None:
            self.progress.say(f"trial {trial_id} starts without a checkpoint: {source} stored none")

    def submit(self, trial: Trial) -> None:
        token = new_token()  # each start its own: a keeper of an earlier start can no longer deliver
        self.store.replace_token(trial.id, token)
        spec = build_spec(self.config, self.experiment_id, trial.sequence, trial.parameter_id, trial.parameters,
                          self.manager.url, token, trial.restart_count)
        spec.priority = self.queue.priority(trial.id)
        try:
            handle = self.platform.submit(spec)
        except Exception as err:  # noqa: BLE001 - a trial the platform cannot start fails; the experiment goes on
            self.submit_failures += 1
            self.finish(trial, FAILED, f"the platform could not start it: {err}", None)
            if self.submit_failures >= MAX_SUBMIT_FAILURES:
                self.error = f"{self.submit_failures} trials in a row could not start: {err}"
                self.stop_experiment((SYS_CANCELED, self.error))
            return
        self.submit_failures = 0
        trial.ran = True
        self.watch(trial, handle, None)

    def watch(self, trial: Trial, handle: str, elapsed: Optional[float]) -> None:
        """A submitted trial holds a slot; `elapsed`: how long it has run already (a reattached one), None for
        one just submitted, whose maxTrialDuration starts when its keeper reports it running (on_records)."""
        trial.handle = handle
        self.by_handle[handle] = trial
        self.active[trial.id] = trial
        # One an earlier control plane started (elapsed) was heard by it: its keeper may have nothing to say now.
        trial.held = ""
        trial.deadline, trial.running_since, trial.heard, trial.shown_running = None, None, elapsed is not None, False
        if trial.note.startswith(UNHEARD):
            trial.note = ""
        if self.config.max_trial_duration is not None and elapsed is not None:
            trial.deadline = time.monotonic() + self.config.max_trial_duration - elapsed

    def requeue(self, trial: Trial, why: str) -> None:
        """Back to the queue: it starts again in the same dirs, with the restart count + 1 if it ran. Its reason:
        `why`, and what it waits for there (queue.requeued), except in a stop: then it waits for `experiment
        resume`, which its `why` says."""
        if trial.ran:
            trial.ran = False
            trial.restart_count += 1
            self.store.set_restart_count(trial.id, trial.restart_count)
        if self.stopping is None:
            why = requeued(why, self.experiment_id, self.config.trial_concurrency,
                           len(self.active) + len(self.queue), self.paused, self.as_written("trialConcurrency"))
        trial.status, trial.stop, trial.stop_sent, trial.reason, trial.exit_code = WAITING, None, None, why, None
        self.store.set_status(trial.id, WAITING, reason=why)
        self.queue.push(trial.id)

    # -- the tuner ---------------------------------------------------------------------------
    def replay(self, tuner: Any) -> None:
        """Tell a fresh tuner every trial so far: results, latest intermediate results, running ones, failures."""
        tuner.replay([(t.parameter_id, t.parameters, metric_value(t.final)) for t in self.trials.values()])
        for trial in self.trials.values():
            if trial.latest is not None:
                tuner.tell_intermediate(trial.parameter_id, trial.latest)
        for trial in self.trials.values():
            if trial.ended and not trial.paused:
                tuner.tell_failed(trial.parameter_id)  # ignored when it has a final result

    def update_config(self, changes: Dict[str, Any]) -> None:
        """New values for some of the config's v2 keys, checked as a config file's are; stored for a resume.

        A new search space gets a new tuner that has been told every trial so far.
        """
        try:
            config = parse_config({**self.config.to_dict(), **changes}, self.experiment_dir,
                                  source=f"the update of experiment {self.experiment_id}")
        except UserError as err:
            raise HttpError(400, str(err)) from None
        if "searchSpace" in changes:
            tuner = build_tuner(config.tuner.name, config.tuner.class_args, config.search_space,
                                seed=experiment_seed(self.experiment_id),
                                experiment_dir=trials_experiment_dir(config, self.experiment_dir))
            self.replay(tuner)
            self.tuner.close()  # a proposal of the old space is not wanted
            self.tuner, self.exhausted = Picker(tuner, self.tuner.wake), False
        self.config = config
        self.store.set_experiment_config(self.experiment_id, config.to_dict())

    # -- output --------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The live line's figures, all from the trials as they are now: the best is of the trials that no longer
        run (a trial that reported its final result and still runs is not yet one; one paused with it keeps it, as
        its resume does), by rank's rule: once nothing runs (a run's end, a stopped one's too), the summary's and
        `experiment show`'s best (results.best_row)."""
        counts: Dict[str, int] = {}
        for trial in self.trials.values():
            counts[trial.status] = counts.get(trial.status, 0) + 1
        mode = self.config.optimize_mode
        best = min((t for t in self.trials.values() if t.id not in self.active),
                   key=lambda t: rank(metric_value(t.final), t.sequence, mode), default=None)
        best = best if best is not None and metric_value(best.final) is not None else None
        # Waiting: held back by the platform, or queued for the end of the trial they go on from (_hold_for),
        # which may be paused: the line says why nothing starts.
        queued = [self.trials[trial_id] for trial_id in self.queue.order()]
        held = sorted((t for t in [*self.active.values(), *queued] if t.held), key=lambda t: t.sequence)
        return Snapshot(
            done=counts.get(SUCCEEDED, 0),
            running=sum(1 for t in self.active.values() if not t.held),
            waiting=len(held),
            waiting_for=held[0].held if held else "",
            failed=counts.get(FAILED, 0),
            early_stopped=counts.get(EARLY_STOPPED, 0),
            canceled=counts.get(USER_CANCELED, 0) + counts.get(SYS_CANCELED, 0),
            paused=counts.get(PREEMPTED, 0),
            elapsed=self.elapsed(),
            best_value=metric_value(best.final) if best else None,
            best_trial=best.id if best else None,
            best_parameters=shown_values(self.config.search_space.params, best.parameters) if best else None,
            disk=self.manager.server.disk.problem,
            max_trials=self.config.max_trial_number,
            time_left=(None if self.config.max_experiment_duration is None or self._over()
                       else max(0.0, self.config.max_experiment_duration - self.elapsed())),
        )
