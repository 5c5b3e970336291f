"""The experiment loop: ask the tuner, submit trials, act on what they report.

    result = run_experiment(config, port=8080)     # a new experiment, until it ends
    result = resume_experiment("abcd1234")         # an interrupted one, from its store

One thread owns every piece of state (tuner, assessor, trials, platform
calls); the rest reaches it through one queue:
  - the manager's HTTP threads put the records they stored (FINAL -> tuner,
    PERIODICAL -> assessor -> a graceful stop through the platform);
  - the platform's waiter threads put trial ends (local: the keeper exited);
  - signal handlers put SIGTERM/SIGINT; admin routes put calls to run here.
A trial's end is seen the moment its keeper exits and the next trial is
submitted in the same pass. A platform status sweep every few seconds is only
a backstop, for platforms that cannot tell and for a lost notice.

Slots: trialConcurrency trials run at once. When one frees, the next to start
is the job queue's head (trialkit.control.queue: activated and preempted
trials, by priority) or, when none waits at the experiment's priority or
above, a new trial from the tuner. Pausing stops a trial the graceful way
(SIGTERM: it checkpoints, exits 143, ends PREEMPTED, shown as PAUSED) and
frees its slot; activating queues it again, to restart in the same dirs with
the restart count + 1. A paused experiment starts nothing and asks the tuner
nothing. The experiment ends when nothing runs, waits or is paused and the
tuner has nothing more (or it was stopped: paused trials then stay paused).
"""
from __future__ import annotations

import hashlib
import queue
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, TextIO, Tuple

from trialkit import platforms, records, web
from trialkit.control import admin
from trialkit.manager import paths
from trialkit.control.assessors import build_assessor
from trialkit.control.config import ExperimentConfig, parse_config
from trialkit.control.progress import TICK_SECONDS, Progress, Snapshot, trials_table
from trialkit.control.queue import JobQueue, Move, label
from trialkit.control.results import ExperimentResult, best_row, metric_value, trial_rows
from trialkit.manager.server import HttpError, ManagerServer
from trialkit.control.specs import build_spec
from trialkit.manager.store import Store, new_token
from trialkit.control.tuners import build_tuner
from trialkit.errors import UserError
from trialkit.platforms.base import Platform
from trialkit.statuses import (
    EARLY_STOPPED,
    FAILED,
    FINAL_STATUSES,
    PREEMPTED,
    SUCCEEDED,
    SYS_CANCELED,
    USER_CANCELED,
    WAITING,
)
from trialkit.web.catalog import Catalog

BACKSTOP_SECONDS = 5.0
CALL_TIMEOUT = 10.0  # an admin call waits this long for the loop
MAX_SUBMIT_FAILURES = 3  # in a row: the platform cannot start trials at all

# Experiment statuses.
RUNNING = "RUNNING"
PAUSED = "PAUSED"
DONE = "DONE"
STOPPED = "STOPPED"
ERROR = "ERROR"

# Why a trial is stopped -> the status it ends with.
ASSESSOR_STOP = (EARLY_STOPPED, "stopped early by the assessor")
TIMEOUT_STOP = (FAILED, "timeout: ran past maxTrialDuration")
DURATION_STOP = (SYS_CANCELED, "maxExperimentDuration reached")
KILL_STOP = (USER_CANCELED, "killed by `trialkit trial kill`")
PAUSE_STOP = (PREEMPTED, "paused")


@dataclass
class Trial:
    id: str
    sequence: int
    parameter_id: int
    parameters: Dict[str, Any]
    status: str = WAITING
    restart_count: int = 0
    ran: bool = False  # submitted since it last joined the queue: its next start is a restart
    handle: Optional[str] = None
    deadline: Optional[float] = None  # monotonic: when maxTrialDuration runs out
    stop: Optional[Tuple[str, str]] = None  # (status, reason) once a stop was sent
    reason: str = ""  # why it ended as it did
    exit_code: Optional[int] = None
    intermediate: List[Optional[float]] = field(default_factory=list)
    final: Any = None
    has_final: bool = False

    @property
    def ended(self) -> bool:
        """Not running and not to be started (paused trials too, until activated)."""
        return self.status in FINAL_STATUSES

    @property
    def paused(self) -> bool:
        return self.status == PREEMPTED


class _Reply:
    def __init__(self):
        self.done = threading.Event()
        self.value: Any = None
        self.error: Optional[BaseException] = None


def experiment_seed(experiment_id: str) -> int:
    """The tuner's seed: fixed by the id, so a resumed experiment's tuner is the same tuner."""
    return int.from_bytes(hashlib.sha256(experiment_id.encode()).digest()[:4], "big")


class Runner:
    def __init__(self, config: ExperimentConfig, experiment_id: str, experiment_dir: Path, store: Store,
                 out: Optional[TextIO] = None, elapsed: float = 0.0):
        self.config = config
        self.experiment_id = experiment_id
        self.experiment_dir = Path(experiment_dir)
        self.store = store
        self.progress = Progress(out)
        self.events: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()  # put() is safe in a signal handler
        self.tuner = build_tuner(config.tuner.name, config.tuner.class_args, config.search_space,
                                 seed=experiment_seed(experiment_id))
        self.assessor = build_assessor(config.assessor.name, config.assessor.class_args) if config.assessor else None
        self.trials: Dict[str, Trial] = {}
        self.active: Dict[str, Trial] = {}  # submitted and not ended: each holds a slot
        self.queue = JobQueue(store)
        self.paused = False  # the experiment: start nothing, ask the tuner nothing
        self.by_handle: Dict[str, Trial] = {}
        self.next_sequence = 0
        self.exhausted = False  # the tuner has nothing more to propose
        self.stopping: Optional[Tuple[str, str]] = None  # the experiment ends early: (trial status, why)
        self.interrupts = 0
        self.submit_failures = 0
        self.error: Optional[str] = None  # why the experiment could not go on
        self.elapsed_before = elapsed
        self.started = time.monotonic()
        self.best: Optional[Trial] = None
        self.platform: Platform  # made in run(), once the manager listens
        self.server: Optional[ManagerServer] = None
        self.catalog: Optional[Catalog] = None
        self.info: Optional[admin.ManagerInfo] = None
        self.manager_url = ""
        self._to_resume: List[Trial] = []

    # -- the life of an experiment ---------------------------------------------------------
    def run(self, port: Optional[int], title: str) -> ExperimentResult:
        self.start_manager(port)
        self.progress.say(f"{title} experiment {self.experiment_id}")
        self.progress.say(f"manager: {self.manager_url}   dir: {self.experiment_dir}")
        self.progress.say(f"page: {web.page_url(self.manager_url, self.info.token, self.experiment_id)}")
        previous = self._install_signal_handlers()
        status = ERROR
        try:
            self.platform = platforms.load(self.config.platform).Platform(self.config.training_service,
                                                                          self.experiment_dir)
            self.platform.on_end = lambda handle: self.events.put(("end", handle))
            self.resume_trials()
            self.serve()
            status = self._final_status()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.server.stop()
            self.catalog.close()
            self.store.set_experiment_status(self.experiment_id, status)
            self._save_info()
            self.progress.close()
        rows = trial_rows(self.store, self.experiment_id)
        result = ExperimentResult(self.experiment_id, status, self.config.optimize_mode, rows)
        self._summary(result)
        return result

    def _final_status(self) -> str:
        if self.error is not None:
            return ERROR
        return STOPPED if self.stopping is not None and self.stopping[0] == USER_CANCELED else DONE

    def start_manager(self, port: Optional[int]) -> None:
        local = self.config.platform == "local"
        host = "127.0.0.1" if local else "0.0.0.0"
        try:
            self.server = ManagerServer(self.store, host, port or 0)
        except OSError as err:
            raise UserError(f"cannot listen on {host}:{port}: {err.strerror}", "--port",
                            "pick a free port, or leave --port out for any free one") from None
        bound = self.server.url.rsplit(":", 1)[1]
        self.manager_url = self.server.url if local else f"http://{self._advertised_host()}:{bound}"
        self.info = admin.ManagerInfo.for_this_process(self.experiment_id, self.manager_url, int(bound),
                                                       self.elapsed_before)
        admin.install(self.server, self.info.token, self)
        self.catalog = web.install(self.server, self.store, admin_token=self.info.token, read_only=False,
                                   admin=self._page_actions())
        self.server.add_listener(lambda trial_id, fresh: self.events.put(("records", trial_id, fresh)))
        self.server.start()
        self._save_info()

    def _page_actions(self) -> web.Admin:
        """The page's actions: the admin actions, run on the loop's thread like the CLI's."""
        return web.Admin(kill=lambda trial_id: self.call(self.kill_trial, trial_id),
                         pause=lambda trial_id: self.call(self.pause_trial, trial_id),
                         activate=lambda trial_id: self.call(self.activate_trial, trial_id),
                         set_priority=lambda trial_id, n: self.call(self.move_jobs, [Move(trial_id, priority=n)]),
                         queue_order=lambda experiment_id: self.call(self.queue.order))

    def _advertised_host(self) -> str:
        common = getattr(self.config.training_service, "common", None)
        return getattr(common, "manager_address", None) or self.config.nni_manager_ip or socket.gethostname()

    def serve(self) -> None:
        """Submit and listen until no trial runs and none is left to start."""
        last_backstop = time.monotonic()
        while True:
            self._check_limits()
            self._fill()
            if self._over():
                return
            try:
                event = self.events.get(timeout=self._wait_time(last_backstop))
            except queue.Empty:
                event = None
            while event is not None:
                self._handle(event)
                try:
                    event = self.events.get_nowait()
                except queue.Empty:
                    event = None
            if time.monotonic() - last_backstop >= BACKSTOP_SECONDS:
                last_backstop = time.monotonic()
                self._backstop()
            self.progress.update(self.snapshot())

    def _over(self) -> bool:
        if self.active or self.queue:
            return False
        if self.stopping is not None:
            return True
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

    # -- events --------------------------------------------------------------------------
    def _handle(self, event: tuple) -> None:
        kind = event[0]
        if kind == "records":
            self.on_records(event[1], event[2])
        elif kind == "end":
            trial = self.by_handle.get(event[1])
            if trial is not None and trial.id in self.active:
                self._check_ended(trial)
        elif kind == "signal":
            self._on_signal(event[1])
        elif kind == "call":
            _, fn, args, reply = event
            try:
                reply.value = fn(*args)
            except Exception as err:  # noqa: BLE001 - handed to the HTTP thread, which answers with it
                reply.error = err
            reply.done.set()

    def on_records(self, trial_id: str, fresh: List[Dict[str, Any]]) -> None:
        trial = self.trials.get(trial_id)
        if trial is None:
            return
        for rec in fresh:
            if rec["type"] == records.FINAL and not trial.has_final:
                trial.final, trial.has_final = rec["value"], True
                value = metric_value(rec["value"])
                if value is not None:
                    self.tuner.tell(trial.parameter_id, value)
                    self._note_best(trial, value)
            elif rec["type"] == records.PERIODICAL:
                trial.intermediate.append(metric_value(rec["value"]))
                self._assess(trial)
            elif rec["type"] == records.STATUS and trial.id not in self.active:
                # A keeper's late word (delivered after its exit was seen) must not undo ours.
                self.store.set_status(trial.id, trial.status, exit_code=trial.exit_code, reason=trial.reason)

    def _assess(self, trial: Trial) -> None:
        if self.assessor is None or trial.stop is not None or trial.ended:
            return
        steps = [value for value in trial.intermediate if value is not None]
        if steps and self.assessor.should_stop(trial.id, steps):
            self._stop_trial(trial, ASSESSOR_STOP)

    def _note_best(self, trial: Trial, value: float) -> None:
        best = None if self.best is None else metric_value(self.best.final)
        if best is None or self.tuner.better(value, best):
            self.best = trial

    def _check_ended(self, trial: Trial) -> None:
        try:
            status = self.platform.status(trial.handle)
        except Exception as err:  # noqa: BLE001 - a platform's hiccup (an API call) waits for the next sweep
            self.progress.say(f"warning: cannot read the status of {trial.id}: {err}")
            return
        if status.status in FINAL_STATUSES:
            self._finish(trial, status.status, status.reason, status.exit_code)

    def _finish(self, trial: Trial, status: str, reason: str, exit_code: Optional[int]) -> None:
        # A stop that came too late to matter (the trial finished with its result) changes nothing.
        if trial.stop is not None and not (status == SUCCEEDED and trial.has_final):
            status, reason = trial.stop
        self.store.set_status(trial.id, status, exit_code=exit_code, reason=reason)
        trial.status, trial.reason, trial.exit_code = status, reason, exit_code
        self.active.pop(trial.id, None)
        self._save_info()
        self.progress.trial_ended(trial.id, label(status), trial.final, reason, self.snapshot())
        if trial.paused:
            if trial.stop is None and self.stopping is None:
                # Stopped with a checkpoint by someone else (a pod deleted, a spot notice): it resumes.
                self._requeue(trial, "preempted: queued to resume")
            return  # not done: the tuner and the assessor wait for its result
        self.tuner.tell_failed(trial.parameter_id)  # ignored when its final result was told
        if self.assessor is not None:
            self.assessor.trial_end(trial.id, status == SUCCEEDED)

    def _backstop(self) -> None:
        for trial in list(self.active.values()):
            if trial.handle is not None:
                self._check_ended(trial)

    def _on_signal(self, signum: int) -> None:
        self.interrupts += 1
        name = signal.Signals(signum).name
        if self.interrupts == 1:
            self.progress.say(f"{name}: stopping the trials gracefully (again to kill them now)")
            self.stop_experiment_by_user(f"experiment stopped ({name})")
        else:
            self.progress.say(f"{name}: killing the trials")
            for trial in self.active.values():
                self.platform.kill(trial.handle)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the loop's thread and return its value (admin routes, from HTTP threads)."""
        reply = _Reply()
        self.events.put(("call", fn, args, reply))
        if not reply.done.wait(CALL_TIMEOUT):
            raise HttpError(503, "the experiment loop did not answer in time")
        if reply.error is not None:
            raise reply.error
        return reply.value

    # -- stopping ----------------------------------------------------------------------
    def stop_experiment_by_user(self, reason: str) -> None:
        self._stop_experiment((USER_CANCELED, reason))

    def kill_trial(self, trial_id: str) -> None:
        """Stop a running trial for good; a waiting or paused one ends without starting again."""
        trial = self._known(trial_id)
        if trial.id in self.active and trial.stop is not None:
            trial.stop = KILL_STOP  # already stopping (a pause, say): it ends canceled instead
        elif trial.id in self.active:
            self._stop_trial(trial, KILL_STOP)
        elif trial.id in self.queue or trial.paused:
            self._cancel(trial, KILL_STOP)
        else:
            raise HttpError(409, f"trial {trial_id} is not running")

    def _stop_experiment(self, why: Tuple[str, str]) -> None:
        if self.stopping is None:
            self.stopping = why
        for trial in list(self.active.values()):
            self._stop_trial(trial, why)
        for trial_id in self.queue.order():
            self._cancel(self.trials[trial_id], why)

    def _cancel(self, trial: Trial, why: Tuple[str, str]) -> None:
        """End a trial that holds no slot (waiting or paused)."""
        if trial.id in self.queue:
            self.queue.remove(trial.id)
        trial.stop = why  # over a pause's: this is how it ends
        self._finish(trial, *why, None)

    def _stop_trial(self, trial: Trial, why: Tuple[str, str]) -> None:
        if trial.stop is not None or trial.ended:
            return
        trial.stop = why
        try:
            self.platform.stop(trial.handle, self.config.trial_grace_seconds)
        except Exception as err:  # noqa: BLE001 - a platform's hiccup (an API call) must not end the experiment
            self.progress.say(f"warning: cannot stop {trial.id}: {err}")

    def _check_limits(self) -> None:
        now = time.monotonic()
        for trial in list(self.active.values()):
            if trial.deadline is not None and now >= trial.deadline:
                self._stop_trial(trial, TIMEOUT_STOP)
        limit = self.config.max_experiment_duration
        if limit is not None and self.stopping is None and self.elapsed() >= limit:
            self._stop_experiment(DURATION_STOP)

    # -- starting trials -----------------------------------------------------------------
    def _may_create(self) -> bool:
        limit = self.config.max_trial_number
        return not self.exhausted and (limit is None or len(self.trials) < limit)

    def _fill(self) -> None:
        while self.stopping is None and not self.paused and len(self.active) < self.config.trial_concurrency:
            trial = self._next()
            if trial is None:
                return
            self._submit(trial)

    def _next(self) -> Optional[Trial]:
        """The trial to start: the queue's head, unless the tuner's next one goes first.

        The tuner's next trial counts as waiting at the back of the
        experiment's priority: queued trials of a lower priority wait for it.
        """
        head = self.queue.head()
        if (head is None or self.queue.priority(head) < self.config.priority) and self._may_create():
            asked = self.tuner.ask()
            if asked is not None:
                return self._create(*asked)
            self.exhausted = True
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

    def _submit(self, trial: Trial) -> None:
        token = new_token()  # each start its own: a keeper of an earlier start can no longer deliver
        self.store.replace_token(trial.id, token)
        spec = build_spec(self.config, self.experiment_id, trial.sequence, trial.parameter_id, trial.parameters,
                          self.manager_url, token, trial.restart_count)
        spec.priority = self.queue.priority(trial.id)
        try:
            handle = self.platform.submit(spec)
        except Exception as err:  # noqa: BLE001 - a trial the platform cannot start fails; the experiment goes on
            self.submit_failures += 1
            self._finish(trial, FAILED, f"the platform could not start it: {err}", None)
            if self.submit_failures >= MAX_SUBMIT_FAILURES:
                self.error = f"{self.submit_failures} trials in a row could not start: {err}"
                self._stop_experiment((SYS_CANCELED, self.error))
            return
        self.submit_failures = 0
        trial.ran = True
        self._watch(trial, handle, 0.0)

    def _watch(self, trial: Trial, handle: str, elapsed: float) -> None:
        trial.handle = handle
        self.by_handle[handle] = trial
        self.active[trial.id] = trial
        if self.config.max_trial_duration is not None:
            trial.deadline = time.monotonic() + self.config.max_trial_duration - elapsed

    def _requeue(self, trial: Trial, why: str) -> None:
        """Back to the queue: it starts again in the same dirs, with the restart count + 1 if it ran."""
        if trial.ran:
            trial.ran = False
            trial.restart_count += 1
            self.store.set_restart_count(trial.id, trial.restart_count)
        trial.status, trial.stop, trial.reason, trial.exit_code = WAITING, None, why, None
        self.store.set_status(trial.id, WAITING, reason=why)
        self.queue.push(trial.id)

    # -- pause, activate, the queue (admin actions, on the loop's thread) ---------------
    def pause_trial(self, trial_id: str) -> None:
        trial = self._known(trial_id)
        if trial.id in self.active:
            if trial.stop is not None:
                raise HttpError(409, f"trial {trial_id} is already stopping")
            self._stop_trial(trial, PAUSE_STOP)
        elif trial.id in self.queue:
            self.queue.remove(trial.id)
            trial.stop = PAUSE_STOP
            self._finish(trial, *PAUSE_STOP, None)
        else:
            raise HttpError(409, f"trial {trial_id} is {self._state(trial)}: only a running or waiting trial pauses")

    def activate_trial(self, trial_id: str) -> None:
        trial = self._known(trial_id)
        if not trial.paused:
            raise HttpError(409, f"trial {trial_id} is {self._state(trial)}: only a paused trial activates")
        if self.stopping is not None:
            raise HttpError(409, f"experiment {self.experiment_id} is stopping")
        self._requeue(trial, "activated")

    def pause_experiment(self) -> None:
        if self.stopping is not None:
            raise HttpError(409, f"experiment {self.experiment_id} is stopping")
        self.paused = True
        self.store.set_experiment_status(self.experiment_id, PAUSED)
        for trial in list(self.active.values()):
            if trial.stop is None:
                self._stop_trial(trial, PAUSE_STOP)

    def activate_experiment(self) -> None:
        if self.stopping is not None:
            raise HttpError(409, f"experiment {self.experiment_id} is stopping")
        self.paused = False
        self.store.set_experiment_status(self.experiment_id, RUNNING)
        for trial in sorted(self.trials.values(), key=lambda t: t.sequence):
            if trial.paused:
                self._requeue(trial, "activated")

    def move_jobs(self, moves: List[Move]) -> None:
        """Apply queue moves, all or none: each is checked before any is made."""
        for move in moves:
            self._check_move(move)
        for move in moves:
            self.queue.apply(move)

    def _check_move(self, move: Move) -> None:
        trial = self._known(move.trial_id)
        if trial.paused and move.other is None:
            return  # a paused trial's priority counts once it is activated
        if trial.id not in self.queue:
            raise HttpError(409, f"trial {trial.id} is {self._state(trial)}: only a waiting trial moves "
                                 "(a paused one may change its priority)")
        if move.other is not None:
            other = self._known(move.other)
            if other.id == trial.id:
                raise HttpError(409, f"trial {trial.id} cannot move ahead of or behind itself")
            if other.id not in self.queue:
                raise HttpError(409, f"trial {other.id} is {self._state(other)}, not waiting: nothing to move next to")

    def _known(self, trial_id: str) -> Trial:
        trial = self.trials.get(trial_id)
        if trial is None:
            raise HttpError(404, f"no trial {trial_id} in experiment {self.experiment_id}")
        return trial

    def _state(self, trial: Trial) -> str:
        if trial.id in self.active:
            return "running"
        return "waiting" if trial.id in self.queue else label(trial.status)

    # -- resuming ---------------------------------------------------------------------------
    def restore(self) -> None:
        """Rebuild trials, tuner and assessor from the store (before the manager listens)."""
        history = []
        for row in self.store.trials(self.experiment_id):
            trial = Trial(row["id"], row["sequence"], row["parameter_id"], row["parameters"], row["status"],
                          row["restart_count"], ran=row["status"] == PREEMPTED and row["started"] is not None)
            queued = row["status"] == WAITING and row["position"] is not None
            self.queue.track(trial.id, row["priority"], row["position"] if queued else None)
            metrics = self.store.records_for(trial.id)
            finals = [rec["value"] for rec in metrics if rec["type"] == records.FINAL]
            trial.intermediate = [metric_value(rec["value"]) for rec in metrics if rec["type"] == records.PERIODICAL]
            trial.final, trial.has_final = (finals[0], True) if finals else (None, False)
            self.trials[trial.id] = trial
            self.next_sequence = max(self.next_sequence, trial.sequence + 1)
            history.append((trial.parameter_id, trial.parameters, metric_value(trial.final)))
            if trial.has_final and metric_value(trial.final) is not None:
                self._note_best(trial, metric_value(trial.final))
            if not trial.ended and not queued:
                self._to_resume.append(trial)
        self.tuner.replay(history)
        for trial in self.trials.values():
            if trial.ended and not trial.paused:
                self.tuner.tell_failed(trial.parameter_id)  # ignored when it has a final result
                if self.assessor is not None:
                    steps = [value for value in trial.intermediate if value is not None]
                    self.assessor.trial_end(trial.id, trial.status == SUCCEEDED, steps)

    def resume_trials(self) -> None:
        """Each trial that was running: reattach, collect what it left while nobody listened, or restart it."""
        for trial in self._to_resume:
            row = self.store.trial(trial.id)
            elapsed = time.time() - (row["started"] or row["created"])
            reattach = self.platform.reattach
            if reattach is not None and reattach(trial.id):
                self._watch(trial, trial.id, elapsed)
                continue
            status = self.platform.status(trial.id) if reattach is not None else None
            if status is not None and status.status in FINAL_STATUSES:
                self._collect_undelivered(trial)
                self._finish(trial, status.status, status.reason, status.exit_code)
                continue
            trial.restart_count += 1
            self.store.set_restart_count(trial.id, trial.restart_count)
            self.progress.say(f"trial {trial.id}: lost while the manager was away; restarting it")
            self._submit(trial)
        self._to_resume = []

    def _collect_undelivered(self, trial: Trial) -> None:
        undelivered = self.platform.undelivered_records
        left = undelivered(trial.id) if undelivered is not None else []
        batch = [rec for rec in left if records.wire_problem(rec) is None]
        fresh = self.store.add_records(trial.id, batch)
        self.on_records(trial.id, fresh)

    # -- output --------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        counts: Dict[str, int] = {}
        for trial in self.trials.values():
            counts[trial.status] = counts.get(trial.status, 0) + 1
        best = self.best
        return Snapshot(
            done=counts.get(SUCCEEDED, 0),
            running=len(self.active),
            failed=counts.get(FAILED, 0),
            early_stopped=counts.get(EARLY_STOPPED, 0),
            canceled=counts.get(USER_CANCELED, 0) + counts.get(SYS_CANCELED, 0),
            elapsed=self.elapsed(),
            best_value=metric_value(best.final) if best else None,
            best_trial=best.id if best else None,
            best_parameters=best.parameters if best else None,
        )

    def _summary(self, result: ExperimentResult) -> None:
        say = self.progress.say
        say(f"\nexperiment {self.experiment_id} {result.status} after {self.snapshot().line()}")
        if result.trials:
            say(trials_table(result.trials))
        best = best_row(result.trials, self.config.optimize_mode)
        if best is not None:
            say(f"best: {best['trial_id']} final={metric_value(best['final']):.6g} "
                f"parameters={records.dumps(best['parameters'])}")
        if self.error is not None:
            say(f"error: {self.error}")

    def _save_info(self) -> None:
        if self.info is not None:
            self.info.elapsed = self.elapsed()
            admin.write_info(self.experiment_dir, self.info)

    def _install_signal_handlers(self) -> Dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}  # signals reach only the main thread; an embedding program keeps its own
        return {signum: signal.signal(signum, self._signal_handler) for signum in (signal.SIGINT, signal.SIGTERM)}

    def _signal_handler(self, signum: int, frame: Any) -> None:
        self.events.put(("signal", signum))


# -- entry points ------------------------------------------------------------------------


def run_experiment(config: ExperimentConfig, port: Optional[int] = None, experiment_id: Optional[str] = None,
                   out: Optional[TextIO] = None) -> ExperimentResult:
    """Create the experiment and run it until it ends (the CLI's `run`, the Python API's `Experiment.run`)."""
    experiment_id = experiment_id or paths.new_experiment_id()
    _check_context(config, paths.experiments_root(config.experiment_working_directory) / experiment_id)
    experiment_dir = paths.create_experiment_dir(experiment_id, config.experiment_working_directory)
    store = Store.in_dir(experiment_dir)
    try:
        store.create_experiment(experiment_id, config=config.to_dict())
        return Runner(config, experiment_id, experiment_dir, store, out).run(port, "started")
    finally:
        store.close()


def resume_experiment(experiment_id: str, port: Optional[int] = None, out: Optional[TextIO] = None) -> ExperimentResult:
    """Go on with an interrupted experiment: same id, same store, same manager port unless told otherwise."""
    experiment_dir = paths.experiment_dir(experiment_id)
    info = admin.read_info(experiment_dir)
    if info is not None and info.running():
        raise UserError(f"experiment {experiment_id} is running (manager pid {info.pid})", "EXPERIMENT_ID",
                        f"stop it first with `trialkit experiment stop {experiment_id}`")
    store = Store.in_dir(experiment_dir)
    try:
        stored = store.experiment(experiment_id)
        if stored is None:
            raise UserError(f"the store in {experiment_dir} holds no experiment {experiment_id}", "EXPERIMENT_ID")
        config = parse_config(stored["config"], experiment_dir, source=f"experiment {experiment_id}'s stored config")
        _check_context(config, experiment_dir)
        runner = Runner(config, experiment_id, experiment_dir, store, out, elapsed=info.elapsed if info else 0.0)
        runner.paused = stored["status"] == PAUSED  # it stays paused until activated
        if not runner.paused:
            store.set_experiment_status(experiment_id, RUNNING)
        runner.restore()
        return runner.run(port or (info.port if info else None), "resumed")
    finally:
        store.close()


def _check_context(config: ExperimentConfig, experiment_dir: Path) -> None:
    """Refuse, before anything starts, a code dir the platform cannot take with each trial (local: too big)."""
    check = getattr(platforms.load(config.platform), "check_context", None)
    if check is not None:
        check(config.trial_code_directory, experiment_dir)
