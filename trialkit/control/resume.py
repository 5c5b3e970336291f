"""Going on with an interrupted experiment: its loop rebuilt from the store, its trials found again.

    lost = restore(loop)          # before the manager listens: trials, queue, tuner, assessor
    ...                           # the manager listens, the platform starts
    resume_trials(loop, lost)     # each trial that was running: reattached, collected, or restarted

The tuner is told every trial as the store holds it (the same seed makes it
the same tuner), the assessor every ended trial's curve. A trial that the
stop of the experiment found saving a checkpoint (PREEMPTED, its reason ending
in queue.RESUMABLE, or STARTED_FROM where it holds just the copy it started from) queues again, to go on from
it, and so does one its tuner's
round or generation waits for, or whose checkpoint it hands on may be unsaved (queue.RUNS_AGAIN: it runs again
from the start; a trial that goes on from it waits for its end); one a user paused waits for
`activate`; one the stop found waiting is still queued, and starts first. A trial that was
running when the manager went away is watched again where the platform can
find it (`Platform.reattach`), given its status and undelivered records when
it ended meanwhile, and otherwise started again with its restart count + 1, its lost
run ended where it was last known to run (results.known_ends: what the faces counted it to
while the experiment was interrupted), so that the time the experiment was down counts in no
trial's duration.
"""
from __future__ import annotations

import time
from typing import List, Optional, Tuple

from trialkit import records
from trialkit.control.loop import Loop, Trial
from trialkit.control.queue import NO_CHECKPOINT, RESUMABLE, RUNS_AGAIN, STARTED_FROM
from trialkit.control.results import known_ends, metric_value
from trialkit.statuses import FAILED, FINAL_STATUSES, PREEMPTED, SUCCEEDED, WAITING

LOST = "lost while the manager was away"  # a lost run's end; then it waits, and is said, as RESTARTING
RESTARTING = "lost while the manager was away; restarting it"  # written whole: docs/troubleshooting.md quotes it
# A trial that was running: where its run is known to have ended, should it be found lost (None: not known).
Running = Tuple[Trial, Optional[float]]


def restore(loop: Loop) -> List[Running]:
    """Rebuild the loop's trials, tuner and assessor from its store; the trials that were running, each with
    where its run is known to have ended (read before the manager listens: manager.json is still the last run's)."""
    ends = known_ends(loop.store.open_runs(loop.experiment_id), loop.experiment_dir)
    running: List[Running] = []
    resumable: List[Tuple[Trial, str]] = []
    for row in loop.store.trials(loop.experiment_id):  # by sequence
        trial = Trial(row["id"], row["sequence"], row["parameter_id"], row["parameters"], row["status"],
                      row["restart_count"], ran=row["status"] == PREEMPTED and row["started"] is not None)
        queued = row["status"] == WAITING and row["position"] is not None
        loop.queue.track(trial.id, row["priority"], row["position"] if queued else None)
        metrics = loop.store.records_for(trial.id)
        finals = [rec["value"] for rec in metrics if rec["type"] == records.FINAL]
        trial.intermediate = [loop.step_value(rec["value"]) for rec in metrics if rec["type"] == records.PERIODICAL]
        numbers = [metric_value(rec["value"]) for rec in metrics if rec["type"] == records.PERIODICAL]
        trial.latest = next((number for number in reversed(numbers) if number is not None), None)
        trial.final, trial.has_final = (finals[0], True) if finals else (None, False)
        loop.trials[trial.id] = trial
        loop.next_sequence = max(loop.next_sequence, trial.sequence + 1)
        if not trial.ended and not queued:
            running.append((trial, ends.get(trial.id)))
        elif trial.paused and (row["reason"] or "").endswith((RESUMABLE, STARTED_FROM, RUNS_AGAIN)):
            resumable.append((trial, row["reason"]))
    loop.replay(loop.tuner)
    for trial in loop.trials.values():
        if trial.ended and not trial.paused and loop.assessor is not None:
            loop.assessor.trial_end(trial.id, trial.status == SUCCEEDED, trial.steps)
    for trial, reason in resumable:
        loop.requeue(trial, "resumed: " + ("it starts over: it saved no checkpoint" if reason.endswith(NO_CHECKPOINT)
                                          else "it runs again from the checkpoint it started from"
                                          if reason.endswith(STARTED_FROM) else "it goes on from its checkpoint"))
    return running


def resume_trials(loop: Loop, running: List[Running]) -> None:
    """Each trial that was running: reattach, collect what it left while nobody listened, or restart it."""
    reattach = loop.platform.reattach
    for trial, known_end in running:
        row = loop.store.trial(trial.id)
        elapsed = time.time() - (row["started"] or row["created"])
        if reattach is not None and reattach(trial.id):
            loop.watch(trial, trial.id, elapsed)
            continue
        status = loop.platform.status(trial.id) if reattach is not None else None
        if status is not None and status.status in FINAL_STATUSES:
            loop.collect_undelivered(trial)
            loop.finish(trial, status.status, status.reason, status.exit_code)
            continue
        if known_end is not None:  # its run ends where it was last known to run: the time down counts not
            loop.store.set_status(trial.id, FAILED, reason=LOST, when=known_end)
        trial.restart_count += 1
        loop.store.set_restart_count(trial.id, trial.restart_count)
        loop.store.set_status(trial.id, WAITING, reason=RESTARTING)
        loop.progress.say(f"trial {trial.id}: {RESTARTING}")
        loop.submit(trial)

