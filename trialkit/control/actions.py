"""The action table: what a user can do to a running experiment, defined once.

    experiment  stop | pause | activate | update {any of UPDATABLE: new values}
                | import {"results": [{"parameters", "value"}, ...]} (the tuner learns them)
    trial       kill | pause | activate | priority {"priority": N}
    queue       moves {"moves": [{"trial_id", one of "priority", "ahead_of", "behind_of"}, ...]} (all or none)
                order (GET: the waiting trials, the next to start first)
    pool        jobs (GET: the jobs of the home's resource pool this experiment is in, every experiment's)
                | update {"updates": [{"job": EXPERIMENT_ID, one of "priority": N, "weight": W, "resource_pool":
                  NAME, "ahead_of": ID, "behind_of": ID, "top": true}, ...]} (in order, all or none: `job
                  update-batch` of experiments; "top" is the page's Move to Top)

Each action is one function `(loop, trial_id, body) -> JSON answer` that
checks the request against the experiment loop's state and carries it out
through the loop's primitives (stop_trial, cancel, requeue, ...). It runs on
the loop's thread, never beside it: whoever holds the table hands an action to
a `Performer` (the loop: `loop.perform(action, trial_id, body)`).

One table, three ways in, all alike:
  - the admin routes, `<method> /api/v1/admin/<on>/<name>` (a trial's:
    `/api/v1/admin/trials/<trial_id>/<name>`), behind the admin token
    (trialkit.control.manager_http installs them);
  - the CLI, which calls those routes (trialkit.control.admin.act);
  - the page, whose buttons are the trial actions (trialkit.web.routes).
A request the loop refuses answers 404 (no such trial) or 409 (not in a state
for it) with one line saying why; a malformed body, or a value the CLI would
refuse (a UserError: a priority past int64, a config value out of range),
answers 400 with its line (the server's one boundary for it). Add an action
by writing its function and listing it in ACTIONS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Protocol, Tuple

from trialkit import schema
from trialkit.control.queue import NO_CHECKPOINT, Move, label
from trialkit.manager.routes import HttpError
from trialkit.statuses import PREEMPTED, USER_CANCELED

if TYPE_CHECKING:
    from trialkit.control.loop import Loop, Trial

ADMIN_PREFIX = "/api/v1/admin"

# Why a trial is stopped -> the status it ends with.
KILL_STOP = (USER_CANCELED, "killed by `trialkit trial kill`")
PAGE_KILL_STOP = (USER_CANCELED, "killed from the page")  # the page's route marks its actions {"by": "page"}
PAUSE_STOP = (PREEMPTED, "paused")
USER_STOP = (USER_CANCELED, "stopped by `trialkit experiment stop`")


@dataclass(frozen=True)
class Action:
    on: str  # what it acts on: "experiment", "trial", "queue" or "pool"
    name: str  # its name there: the route's last part, the page's button
    run: Callable[["Loop", Optional[str], Any], Any]  # (loop, trial id for a trial's, JSON body) -> JSON answer
    method: str = "POST"

    @property
    def route(self) -> str:
        where = "trials/<trial_id>" if self.on == "trial" else self.on
        return f"{ADMIN_PREFIX}/{where}/{self.name}"

    def path(self, trial_id: Optional[str] = None) -> str:
        """The route for one request: a trial's with its id filled in."""
        return self.route.replace("<trial_id>", trial_id) if self.on == "trial" else self.route


class Performer(Protocol):
    def perform(self, action: Action, trial_id: Optional[str], body: Any) -> Any:
        """Run the action where the experiment's state lives and return its answer (HttpError when refused)."""


# -- the experiment ----------------------------------------------------------------------


def stop_experiment(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    loop.stop_experiment(USER_STOP)
    return {"stopping": True}


def pause_experiment(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    """Its running trials stop with a checkpoint; nothing starts and the tuner is not asked until activated."""
    _not_stopping(loop)
    loop.set_paused(True)
    for trial in list(loop.active.values()):
        if trial.stop is None:
            loop.stop_trial(trial, PAUSE_STOP)
    return {"paused": True, **_progress_warning(loop)}


def activate_experiment(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    """Its paused trials queue again, in sequence order; it goes on."""
    _not_stopping(loop)
    loop.set_paused(False)
    paused = [trial for trial in sorted(loop.trials.values(), key=lambda t: t.sequence) if trial.paused]
    warning = _restarts(loop, paused)
    for trial in paused:
        loop.requeue(trial, "activated")
    return {"paused": False, **warning}


# What an experiment may change while it runs (nnictl update's set), as config v2 keys.
UPDATABLE = ("trialConcurrency", "maxTrialNumber", "maxExperimentDuration", "searchSpace")


def update_experiment(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    if not isinstance(body, dict) or not body or not set(body) <= set(UPDATABLE):
        raise HttpError(400, f"expected an object with some of {', '.join(UPDATABLE)}")
    loop.update_config(body)
    made, limit = len(loop.trials), loop.config.max_trial_number
    if "maxTrialNumber" in body and limit is not None and made > limit:  # else `experiment show` reads "36 of 5"
        return {"updated": sorted(body), "note": f"{made} trials are made already, more than maxTrialNumber "
                                                 f"{limit}: no more start, and the experiment ends once those "
                                                 "running end"}
    return {"updated": sorted(body)}


def import_results(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    """{"results": [{"parameters": {...}, "value": number}, ...]}: the tuner learns them (not kept over a resume)."""
    results = body.get("results") if isinstance(body, dict) else None
    if not isinstance(results, list) or not all(
            isinstance(r, dict) and isinstance(r.get("parameters"), dict) and isinstance(r.get("value"), (int, float))
            and not isinstance(r.get("value"), bool) for r in results):
        raise HttpError(400, 'expected {"results": [{"parameters": {...}, "value": number}, ...]}')
    values = [schema.as_number(r["value"], f"results[{i}].value") for i, r in enumerate(results)]  # 10**400, NaN
    loop.tuner.import_results([(r["parameters"], value) for r, value in zip(results, values)])
    return {"imported": len(results)}


# -- one trial ---------------------------------------------------------------------------


def kill_trial(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    """Stop a running trial for good; a waiting or paused one ends without starting again."""
    trial = _known(loop, trial_id)
    why = PAGE_KILL_STOP if isinstance(body, dict) and body.get("by") == "page" else KILL_STOP
    if trial.id in loop.active and trial.stop is not None:
        if trial.stop != why:  # already stopping (a pause, say): it ends canceled instead, and says so meanwhile
            trial.stop = why
            loop.say_stopping(trial)
        return {"stopping": trial.id, "already": loop.running_reason(trial)}  # its grace goes on: said so
    if trial.id in loop.active:
        loop.stop_trial(trial, why)
    elif trial.id in loop.queue or trial.paused:
        loop.cancel(trial, why)
    else:
        raise HttpError(409, f"trial {trial_id} is not running")
    return {"stopping": trial.id}


def pause_trial(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    """A running trial stops with a checkpoint (PREEMPTED) and frees its slot; a waiting one leaves the queue."""
    trial = _known(loop, trial_id)
    holds = loop.platform.holds_checkpoint
    # Whether it holds a checkpoint as the pause finds it (None: its platform cannot tell): what `trial pause` says.
    checkpoint = holds(trial.handle or trial.id) if holds is not None else None
    # A trial in the queue, or one its platform holds back, is not running: nothing stops, it just does not start.
    waiting = trial.id in loop.queue or bool(trial.held)
    if trial.id in loop.active:
        if trial.stop is not None:
            raise HttpError(409, f"trial {trial_id} is already stopping")
        loop.stop_trial(trial, PAUSE_STOP)
    elif trial.id in loop.queue:
        loop.queue.remove(trial.id)
        trial.stop = PAUSE_STOP
        loop.finish(trial, *PAUSE_STOP, None)
    else:
        raise HttpError(409, f"trial {trial_id} is {_state(loop, trial)}: only a running or waiting trial pauses")
    return {"pausing": trial.id, "checkpoint": checkpoint, "waiting": waiting, **_progress_warning(loop)}


def _progress_warning(loop: "Loop") -> dict:
    """What a pause answers when the platform keeps no checkpoint over it (a cluster without checkpoint storage)."""
    if loop.platform.checkpoint_survives_stop:
        return {}
    return {"warning": "this platform keeps no checkpoint over a pause (configure checkpoint storage): "
                       "an activated trial starts from the beginning"}


def activate_trial(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    """A paused trial queues again, to restart in the same dirs."""
    trial = _known(loop, trial_id)
    if not trial.paused:
        raise HttpError(409, f"trial {trial_id} is {_state(loop, trial)}: only a paused trial activates")
    _not_stopping(loop)
    warning = _restarts(loop, [trial])
    loop.requeue(trial, "activated")
    return {"queued": trial.id, **warning}


def _restarts(loop: "Loop", paused: List["Trial"]) -> dict:
    """What an activation answers when some of the trials it queues hold no checkpoint: as their platform sees
    their checkpoint dirs, else as their reasons say (a pause's reason ends NO_CHECKPOINT when it found none)."""
    holds = loop.platform.holds_checkpoint
    lost = [trial.id for trial in paused
            if (not holds(trial.handle or trial.id) if holds is not None else trial.reason.endswith(NO_CHECKPOINT))]
    if not lost:
        return {}
    return {"warning": f"{', '.join(lost)} {'holds' if len(lost) == 1 else 'hold'} no checkpoint: "
                       f"{'it starts' if len(lost) == 1 else 'they start'} from the beginning"}


def set_priority(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    priority = body.get("priority") if isinstance(body, dict) else None
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise HttpError(400, 'expected {"priority": <a whole number>}')
    return _move(loop, [Move(_known(loop, trial_id).id, priority=priority)])


# -- the queue ---------------------------------------------------------------------------


def move_jobs(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    if not isinstance(body, dict) or not isinstance(body.get("moves"), list):
        raise HttpError(400, 'expected {"moves": [...]}')
    try:
        moves = [Move.from_json(item) for item in body["moves"]]
    except ValueError as err:
        raise HttpError(400, str(err)) from None
    return _move(loop, moves)


def queue_order(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    return {"queue": loop.queue.order()}


def _move(loop: "Loop", moves: List[Move]) -> Any:
    """Apply queue moves, all or none: each is checked before any is made."""
    for move in moves:
        _check_move(loop, move)
    for move in moves:
        loop.queue.apply(move)
    return queue_order(loop, None, None)


def _check_move(loop: "Loop", move: Move) -> None:
    trial = _known(loop, move.trial_id)
    if trial.paused and move.other is None:
        return  # a paused trial's priority counts once it is activated
    if trial.id not in loop.queue:
        raise HttpError(409, f"trial {trial.id} is {_state(loop, trial)}: only a waiting trial moves "
                             "(a paused one may change its priority)")
    if move.other is not None:
        other = _known(loop, move.other)
        if other.id == trial.id:
            raise HttpError(409, f"trial {trial.id} cannot move ahead of or behind itself")
        if other.id not in loop.queue:
            raise HttpError(409, f"trial {other.id} is {_state(loop, other)}, not waiting: nothing to move next to")


# -- the resource pool: the jobs of every local experiment of this home (platforms/pools.py) -----------


def pool_jobs(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    """{"pool", "scheduler", "jobs"}: `trialkit job list --pool`'s rows, in the order the pool's free slots go
    to them, and how it orders them (pools.yml's scheduler: priority, priority_descending or fair_share)."""
    from trialkit.manager import paths
    from trialkit.platforms import pools

    name = _pool(loop)
    return {"pool": name, "scheduler": pools.pool_spec(name, pools.read_config(paths.home())).scheduler,
            "jobs": pools.jobs(name)}


def update_pool(loop: "Loop", trial_id: Optional[str], body: Any) -> Any:
    """Changes to jobs of this experiment's pool through `job update`'s own path (pools.update); "top" is the
    page's Move to Top. Answers as pool_jobs, after them."""
    from trialkit.platforms import pools

    name = _pool(loop)
    updates = body.get("updates") if isinstance(body, dict) else None
    if not isinstance(updates, list) or not updates:
        raise HttpError(400, 'expected {"updates": [{"job": EXPERIMENT_ID, and one change}, ...]}')
    changes = [_pool_change(item, (*pools.CHANGES, "top")) for item in updates]
    for job, _, _ in changes:
        if pools.pool_of(job) != name:
            raise HttpError(404, f"experiment {job} has no job in resource pool {name}")
    pools.update(changes)
    return pool_jobs(loop, trial_id, None)


def _pool_change(item: Any, offered: Tuple[str, ...]) -> Tuple[str, str, Any]:
    """One update of a request as pools.update takes it: (experiment, what, value); HttpError 400 says what is
    wrong (a priority out of range is Move's UserError, 400 too)."""
    if not isinstance(item, dict) or not isinstance(item.get("job"), str):
        raise HttpError(400, f'each update is {{"job": EXPERIMENT_ID, and one of {", ".join(offered)}}}')
    schema.as_str(item["job"], "job")  # a lone surrogate (JSON's \ud800) is a 400, not SQLite's encode error
    given = [key for key in item if key != "job"]
    if len(given) != 1 or given[0] not in offered:
        raise HttpError(400, f"an update changes one of {', '.join(offered)} (got {sorted(given)})")
    what, value = given[0], item[given[0]]
    if what == "top":
        if value is not True:
            raise HttpError(400, 'Move to Top is {"job": ID, "top": true}')
        return item["job"], what, None
    if what not in ("priority", "weight"):  # ahead_of, behind_of: an experiment; resource_pool: a pool
        if not isinstance(value, str):
            raise HttpError(400, f"{what} is a name")
        return item["job"], what, value
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (what == "priority" and
                                                                        not isinstance(value, int)):
        raise HttpError(400, f"{what} is a {'whole ' if what == 'priority' else ''}number")
    if what == "priority":
        Move(item["job"], priority=value)  # its range check: the CLI's line
    return item["job"], what, value  # a weight's range: pools.update's check


def _pool(loop: "Loop") -> str:
    from trialkit.platforms import pools

    name = pools.pool_of(loop.experiment_id)
    if name is None:
        raise HttpError(409, f"experiment {loop.experiment_id} has no job in this machine's resource pools: only "
                             "local experiments take their slots from them")
    return name


# -- the table ---------------------------------------------------------------------------

ACTIONS: List[Action] = [
    Action("experiment", "stop", stop_experiment),
    Action("experiment", "pause", pause_experiment),
    Action("experiment", "activate", activate_experiment),
    Action("experiment", "update", update_experiment),
    Action("experiment", "import", import_results),
    Action("trial", "kill", kill_trial),
    Action("trial", "pause", pause_trial),
    Action("trial", "activate", activate_trial),
    Action("trial", "priority", set_priority),
    Action("queue", "moves", move_jobs),
    Action("queue", "order", queue_order, method="GET"),
    Action("pool", "jobs", pool_jobs, method="GET"),
    Action("pool", "update", update_pool),
]


def names(on: str) -> List[str]:
    """The actions on one kind of thing, in the table's order."""
    return [action.name for action in ACTIONS if action.on == on]


def find(on: str, name: str) -> Action:
    """The action; KeyError when the table has none by that name."""
    for action in ACTIONS:
        if action.on == on and action.name == name:
            return action
    raise KeyError(f"{on} {name}")


def _known(loop: "Loop", trial_id: Optional[str]) -> "Trial":
    trial = loop.trials.get(trial_id or "")
    if trial is None:
        raise HttpError(404, f"no trial {trial_id} in experiment {loop.experiment_id}")
    return trial


def _state(loop: "Loop", trial: "Trial") -> str:
    if trial.id in loop.active:
        return "running"
    return "waiting" if trial.id in loop.queue else label(trial.status)


def _not_stopping(loop: "Loop") -> None:
    if loop.stopping is not None:
        raise HttpError(409, f"experiment {loop.experiment_id} is stopping")
