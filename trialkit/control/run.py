"""An experiment from start to summary: the control plane's entry points.

    result = run_experiment(config, port=8080)     # a new experiment, until it ends
    result = resume_experiment("abcd1234")         # an interrupted one, from its store

A run: the manager listens (trialkit.control.manager_http), the platform
starts, trials left running by an earlier run are found again
(trialkit.control.resume), the loop serves until the experiment ends
(trialkit.control.loop), and the summary is printed. A face that shows the
page passes `page=trialkit.web.attach_page`: the control plane does not
import the page.
"""
from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path
from typing import List, Optional, TextIO, Tuple

from trialkit import platforms, records, schema
from trialkit.control import admin, checkpoints, determined
from trialkit.control.config import ExperimentConfig, parse_config
from trialkit.control.loop import DONE, ERROR, PAUSED, RUNNING, STOPPED, Loop
from trialkit.control.manager_http import Listening, Manager, PageHook
from trialkit.control.progress import page_again, trials_table
from trialkit.control.results import (RUNS_UNWATCHED, ExperimentResult, best_row, experiment_ran, metric_value,
                                      shown_values, trial_rows, unwatched)
from trialkit.control.resume import Running, restore, resume_trials
from trialkit.errors import UserError
from trialkit.manager import paths
from trialkit.manager.store import Store, StoreUnwritable
from trialkit.platforms.base import Platform
from trialkit.statuses import WAITING

RETENTION_SECONDS = 120.0  # the experiment's end waits this long for the last retention pass
SUMMARY_ROWS = 20  # the end's trial table: a screenful (a Hyperband run makes hundreds); `trial list` has them all


def run_experiment(config: ExperimentConfig, port: Optional[int] = None, experiment_id: Optional[str] = None,
                   out: Optional[TextIO] = None, page: Optional[PageHook] = None) -> ExperimentResult:
    """Create the experiment and run it until it ends (the CLI's `run`, the Python API's `Experiment.run`)."""
    experiment_id = experiment_id or paths.new_experiment_id()
    planned_dir = paths.experiments_root(config.experiment_working_directory) / experiment_id
    platform = _platform(config, planned_dir)
    experiment_dir = paths.create_experiment_dir(experiment_id, config.experiment_working_directory)
    try:
        store = Store.in_dir(experiment_dir)
    except StoreUnwritable:
        forget_unstarted(experiment_dir)  # else `experiment list` would find an empty file where a store should be
        raise
    try:
        try:
            try:
                store.create_experiment(experiment_id, config=config.to_dict())
            except sqlite3.OperationalError as err:
                raise store.refusing(err) from None
            loop = Loop(config, experiment_id, experiment_dir, store, out)
        except KeyboardInterrupt:  # a Ctrl-C before the loop could take it: no experiment is left half-made
            store.close()
            forget_unstarted(experiment_dir)
            raise
        # From here a Ctrl-C is the loop's: a stop, said and recorded (one as the manager starts left the
        # experiment RUNNING in its store, listed INTERRUPTED with no trial and no word).
        with loop.signals_handled():
            try:
                manager = Manager.start(loop, Listening.on(store, config, port), page)
            except UserError:  # a taken --port: no trial ran, so no experiment is left to list as INTERRUPTED
                store.close()
                forget_unstarted(experiment_dir)
                raise
            return _run(loop, manager, platform, "started", [])
    finally:
        store.close()


def forget_unstarted(experiment_dir: Path) -> None:
    """Remove what a start that failed before its manager listened left (the store files it made, and the dir
    if nothing else is in it), so that no experiment that never ran is listed."""
    for path in experiment_dir.glob(paths.DB_NAME + "*"):
        try:
            path.unlink()
        except OSError:
            pass
    try:
        experiment_dir.rmdir()
    except OSError:
        pass  # not empty (run --detach made it with its log: the parent removes that) or the disk refuses even that


def resume_experiment(experiment_id: str, port: Optional[int] = None, out: Optional[TextIO] = None,
                      page: Optional[PageHook] = None) -> ExperimentResult:
    """Go on with an interrupted experiment: same id, same store, same manager port unless told otherwise, same
    admin token (and so the same page token: the page address of any run works again).
    A DONE one whose limits leave it nothing more (none raised by `experiment update` since) has nothing left to
    run: it is said, and nothing starts or changes."""
    experiment_dir, info, store, stored, config = _stopped_experiment(experiment_id)
    try:
        # As the faces said it: an interrupted run counts to the last moment anything was known of it.
        elapsed = experiment_ran(experiment_dir, stored["status"], store.open_runs(experiment_id)) or 0.0
        if stored["status"] == DONE and not _room_left(config, len(store.trials(experiment_id)), elapsed):
            print(done_already(experiment_id), file=out or sys.stdout, flush=True)
            return ExperimentResult(experiment_id, DONE, config.optimize_mode, trial_rows(store, experiment_id))
        platform = _platform(config, experiment_dir)
        loop = Loop(config, experiment_id, experiment_dir, store, out, elapsed=elapsed)
        with loop.signals_handled():  # a Ctrl-C from here is the loop's: a stop, said and recorded
            # Bound before the store is written: a taken --port leaves the experiment as it was.
            listening = Listening.on(store, config, port, info.port if info else None)
            try:
                loop.paused = stored["status"] == PAUSED  # it stays paused until activated
                if not loop.paused:
                    try:
                        store.set_experiment_status(experiment_id, RUNNING)
                    except sqlite3.OperationalError as err:  # the first write: a disk that takes none is one line
                        raise store.refusing(err) from None
                running = restore(loop)
            except BaseException:
                listening.server.stop()
                raise
            manager = Manager.start(loop, listening, page, info.token if info else None)
            return _run(loop, manager, platform, "resumed", running)
    finally:
        store.close()


def _room_left(config: ExperimentConfig, made: int, elapsed: float) -> bool:
    """Whether a DONE experiment's limits, raised since (`experiment update`), leave it more to run; not one that
    has none: it ended of its own (its search space tried, its tuner done)."""
    limit, duration = config.max_trial_number, config.max_experiment_duration
    if limit is None and duration is None:
        return False
    return (limit is None or made < limit) and (duration is None or elapsed < duration)


def done_already(experiment_id: str) -> str:
    return (f"experiment {experiment_id} is DONE: it has nothing left to run, and a resume changes nothing "
            f"(its results: `trialkit experiment show {experiment_id}`; its page: `trialkit ui {experiment_id}`; "
            f"more trials: `trialkit experiment update {experiment_id} --max-trial-number N`, then resume it)")


def delete_experiment(experiment_id: str) -> List[str]:
    """Remove a stopped experiment: the objects its platform made for it (a cluster's jobs and claims), its
    checkpoints in an object store, then its dir and store. What was deleted besides the dir, by name."""
    experiment_dir, _, store, _, config = _stopped_experiment(experiment_id)
    try:
        _refuse_unwatched(experiment_id, experiment_dir, store)
        trial_ids = [row["id"] for row in store.trials(experiment_id)]
        stored = checkpoints.checkpoints(store, experiment_id, config.checkpoint_storage) \
            if config.checkpoint_storage is not None and config.checkpoint_storage.store is not None else []
    finally:
        store.close()
    platform = platforms.create(config.platform, config.training_service, experiment_dir)
    removed = platform.remove_experiment(experiment_id, trial_ids) if platform.remove_experiment else []
    for ckpt in stored:
        checkpoints.delete(config.checkpoint_storage, ckpt, None)
        removed.append(f"checkpoint {ckpt.uuid} ({ckpt.where})")
    shutil.rmtree(experiment_dir)
    return removed


def _refuse_unwatched(experiment_id: str, experiment_dir: Path, store: Store) -> None:
    """UserError when trials of an INTERRUPTED experiment still run unwatched (their keepers outlived its manager):
    deleting would leave them running, holding their pool's slots, with no store to say whose they are. Refused as
    a running experiment is, rather than stopped here: a resume takes them up, and its stop gives them their grace
    to checkpoint, as for any running trial."""
    running = [trial_id for trial_id, seen in unwatched(store.open_runs(experiment_id), experiment_dir).items()
               if seen.state == RUNS_UNWATCHED]
    if running:
        raise UserError(f"experiment {experiment_id} is interrupted and {len(running)} of its trials run unwatched "
                        f"({', '.join(running)})", "EXPERIMENT_ID",
                        f"take them up with `trialkit experiment resume {experiment_id} --detach`, stop them with "
                        f"`trialkit experiment stop {experiment_id}`, then delete it")


def _stopped_experiment(experiment_id: str) -> Tuple[Path, Optional[admin.ManagerInfo], Store, dict, ExperimentConfig]:
    """(dir, last manager, store, stored row, config) of an experiment no manager runs; the caller closes the store."""
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
    except BaseException:
        store.close()
        raise
    return experiment_dir, info, store, stored, config


def _platform(config: ExperimentConfig, experiment_dir: Path) -> Platform:
    """The platform, ready to take trials (a cluster platform checked its cluster answers), after the code dir and
    the checkpoint store were checked; a refusal names the key as the config wrote it (an NNI v1 config's
    `trial.gpuNum`, not `trialGpuNumber`)."""
    check_startable(config, experiment_dir)
    try:
        platform = platforms.create(config.platform, config.training_service, experiment_dir)
        platform.check_ready()
    except UserError as err:
        raise config.as_written(err) from None
    return platform


def check_startable(config: ExperimentConfig, experiment_dir: Path) -> None:
    """Refuse the code dir (too big, without its script, holding experiment_dir) or the checkpoint store before
    anything starts, in the keys the config wrote: `run --detach` asks it before it says the experiment started."""
    try:
        _check_context(config, experiment_dir)
        checkpoints.check_store(config.checkpoint_storage)
    except UserError as err:
        raise config.as_written(err) from None


def _run(loop: Loop, manager: Manager, platform: Platform, title: str, running: List[Running]) -> ExperimentResult:
    loop.manager = manager
    loop.progress.say(f"{title} experiment {loop.experiment_id}")
    if manager.moved is not None:
        loop.progress.say(manager.moved)
    loop.progress.say(f"manager: {manager.url}   dir: {loop.experiment_dir}")
    if manager.page is not None:
        loop.progress.say(f"page: {manager.page.url}")
    for note in loop.config.notes:
        loop.progress.say(f"note: {note}")
    status = ERROR
    try:
        loop.platform = platform
        loop.platform.on_end = loop.ended
        loop.platform.on_waiting = loop.waiting
        loop.platform.trials_at_once = lambda: loop.config.trial_concurrency
        capacity = platform.capacity_note(loop.config.trial_concurrency, loop.as_written("trialConcurrency"))
        if capacity:
            loop.progress.say(f"note: {capacity}")
        resume_trials(loop, running)
        loop.serve()
        if loop.retention is not None:
            loop.retention.close(RETENTION_SECONDS)
        status = loop.final_status()
        if status in (DONE, STOPPED):
            platform.experiment_ended(loop.experiment_id, list(loop.trials))
    finally:
        # Recorded while the manager still serves: a tab open on the page shows the end before its server goes.
        why = loop.error if status == ERROR else loop.ended_why()  # an exception's ERROR: its traceback says
        try:
            loop.store.set_experiment_status(loop.experiment_id, status, why)  # the page and `experiment show` say it
            manager.save(loop.elapsed())
        finally:
            manager.close(f"the run ended; `trialkit ui {loop.experiment_id}` serves this page again")
        loop.progress.close()
    result = ExperimentResult(loop.experiment_id, status, loop.config.optimize_mode,
                              trial_rows(loop.store, loop.experiment_id))
    _summary(loop, result)
    if manager.page is not None:  # its address went with the manager: say how to open it again
        loop.progress.say(f"page: {page_again(loop.experiment_id)}, at the address above")
    return result


def _summary(loop: Loop, result: ExperimentResult) -> None:
    say = loop.progress.say
    # How long it ran as `experiment show` and the page say it: what the run's end wrote in manager.json.
    ran = experiment_ran(loop.experiment_dir, result.status, [])
    space = loop.config.search_space.params
    snapshot = loop.snapshot()
    snapshot = snapshot._replace(elapsed=loop.elapsed() if ran is None else ran)
    say(f"\nexperiment {loop.experiment_id} {result.status} after {snapshot.line()}")
    why = loop.ended_why()
    if loop.error is None and why is not None:  # as `experiment show` says it (an error: below)
        say(f"why: {why}")
    if result.trials:
        say(trials_table(result.trials[-SUMMARY_ROWS:], space=space))
    if len(result.trials) > SUMMARY_ROWS:
        say(f"(the last {SUMMARY_ROWS} of {len(result.trials)} trials; "
            f"`trialkit trial list {loop.experiment_id}` lists them all)")
    best = best_row(result.trials, loop.config.optimize_mode)
    if best is not None:
        say(f"best: {best['trial_id']} final={metric_value(best['final']):.6g} "
            f"parameters={records.dumps(shown_values(space, best['parameters']))}")
    if loop.error is not None:
        say(f"error: {loop.error}")
    waiting = [trial.id for trial in sorted(loop.trials.values(), key=lambda t: t.sequence) if trial.status == WAITING]
    if result.status == STOPPED and waiting:  # a user's stop leaves them waiting (Loop.stop_experiment)
        one = len(waiting) == 1
        say(f"{len(waiting)} trial{'' if one else 's'} still wait{'s' if one else ''} ({', '.join(waiting)}): "
            f"`trialkit experiment resume {loop.experiment_id}` runs {'it' if one else 'them'}")


def _check_context(config: ExperimentConfig, experiment_dir: Path) -> None:
    """Refuse, before anything starts, a code dir the platform cannot take with each trial (local: too big, or
    without the script its command runs)."""
    check = getattr(platforms.load(config.platform), "check_context", None)
    if check is None:
        return
    try:
        check(config.trial_code_directory, experiment_dir, config.trial_command)
    except UserError as err:  # in the keys its user wrote: a Determined config's entrypoint, not trialCommand
        raise (schema.renamed(err, determined.V2_WHERE) if determined.translated(config.trial_command) else err) \
            from None
