"""A platform's word that it holds a trial back (on_waiting, from any of its threads) and the trial's keeper's word
that it runs reach the experiment loop as two events, in the order they were queued: a waiting queued by a
thread of the platform that had not yet seen the trial start (Kueue's admissions watcher) can come after the
RUNNING record. The loop then counted the trial as waiting (0 running on the progress line) until the next look
at its platform, and the store said WAITING for a trial that runs. A waiting that comes after the trial was
heard running this start is stale: it changes nothing.

The loop is driven by its own event handler, events delivered in the order under test; no platform runs.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from trialkit import records
from trialkit.control.config import parse_config
from trialkit.control.loop import Loop
from trialkit.manager.store import Store
from trialkit.statuses import RUNNING, WAITING

EXP = "abcd1234"
HELD = "queued in Kueue's LocalQueue team-queue: Pending: couldn't assign flavors"


@pytest.fixture
def loop(tmp_path):
    config = parse_config({"searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}}, "trialCommand": "python3 t.py",
                           "trialConcurrency": 1, "tuner": {"name": "GridSearch"},
                           "trainingService": {"platform": "local"}}, tmp_path)
    store = Store(tmp_path / "store.db")
    store.create_experiment(EXP, config.to_dict())
    made = Loop(config, EXP, tmp_path / EXP, store)
    made.manager = SimpleNamespace(server=SimpleNamespace(disk=SimpleNamespace(problem=None)))  # what snapshot reads
    yield made
    made.tuner.close()
    store.close()


def submitted(loop: Loop) -> str:
    """A trial submitted as the loop submits one (its platform left out): the store has it, the loop watches it."""
    trial = loop._create(0, {"x": 1})
    loop.watch(trial, trial.id, None)
    return trial.id


def keeper_says_running(loop: Loop, trial_id: str) -> None:
    """Its keeper's RUNNING record, stored by the manager, then handed to the loop (Loop.stored's event)."""
    fresh = loop.store.add_records(trial_id, [{"seq": 1, "type": records.STATUS, "time": time.time(),
                                               "value": {"status": RUNNING}}])
    loop._handle(("records", trial_id, fresh))


def platform_says_waiting(loop: Loop, trial_id: str) -> None:
    """on_waiting from the platform's thread: the store at once, the loop when it gets to the event."""
    loop.waiting(trial_id, HELD)
    loop._handle(loop.events.get_nowait())


def test_a_waiting_that_comes_after_the_trial_runs_leaves_it_running(loop):
    trial = submitted(loop)
    keeper_says_running(loop, trial)
    platform_says_waiting(loop, trial)  # queued before the trial started, handled after its RUNNING
    snapshot = loop.snapshot()
    assert (snapshot.running, snapshot.waiting) == (1, 0), snapshot
    assert loop.store.trial(trial)["status"] == RUNNING


def test_a_waiting_before_the_trial_runs_holds_it_until_it_runs(loop):
    trial = submitted(loop)
    platform_says_waiting(loop, trial)
    snapshot = loop.snapshot()
    assert (snapshot.running, snapshot.waiting, snapshot.waiting_for) == (0, 1, HELD), snapshot
    assert (loop.store.trial(trial)["status"], loop.store.trial(trial)["reason"]) == (WAITING, HELD)
    keeper_says_running(loop, trial)
    snapshot = loop.snapshot()
    assert (snapshot.running, snapshot.waiting) == (1, 0), snapshot
    assert loop.store.trial(trial)["status"] == RUNNING
