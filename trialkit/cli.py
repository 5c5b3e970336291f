"""The `trialkit` command.

    trialkit run CONFIG [CONTEXT_DIR] [--port P] [--detach]
    trialkit render CONFIG [CONTEXT_DIR] [--port P] [--tls-cert F --tls-key F] [--trial N] [-o DIR]
    trialkit experiment list | show ID | stop ID | resume ID [--port P] [--detach] | pause ID | activate ID
                        | export ID [--format json|csv] [-o FILE] [--all-runs] | plot ID -o FILE.png [--metric NAME]
                        | update ID [--trial-concurrency N] [--max-trial-number N] [--max-experiment-duration D]
                                    [--search-space FILE]
                        | import ID -f FILE
    trialkit trial list|ls EXPERIMENT_ID | show TRIAL_ID | logs TRIAL_ID [-f] | kill TRIAL_ID
                   | pause TRIAL_ID | activate TRIAL_ID
    trialkit job list [--experiment ID | --pool] [--json|--csv]
                 | update TRIAL_ID (--priority N | --ahead-of TRIAL_ID | --behind-of TRIAL_ID)
                 | update EXPERIMENT_ID (--priority N | --ahead-of EXPERIMENT_ID | --behind-of EXPERIMENT_ID)
                 | update-batch TRIAL_ID.priority=N|TRIAL_ID.ahead-of=ID|TRIAL_ID.behind-of=ID ...
    trialkit checkpoint list ID [--json] | show ID UUID | download ID UUID [-o DIR] | delete ID UUID...
    trialkit ui [EXPERIMENT_ID] [--port P] [--host H]

Each subcommand is one function of the parsed options returning the exit
status. A user's mistake is a UserError: one line on stderr, exit 2. A
command imports what only it needs inside its function: the commands that
read (`experiment list/show`, `trial list/show/logs`, `job list`, `--help`:
scripts and users run them while an experiment runs) start without the HTTP
server and client, TLS, the action table, the control loop and any engine
that the commands talking to a manager need (tests/test_start_imports.py),
and the modules on their path import only what reading needs: records are
NamedTuples, not dataclasses (which load inspect), and subprocess, socket,
secrets, hashlib and csv wait for the functions that use them.
bench/bench_cli.py races them against `python -c "import trialkit.cli"`
(`experiment list` of 20 experiments, alternated with the code that loaded
aiohttp for it: 508 -> 192 ms at load 3.8; `job list` 496 -> 152 ms).
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from trialkit import gpus, records
from trialkit.manager import paths
from trialkit.control.progress import (INTERRUPTED_NOTE, Interrupted, duration, gpu_list, gpu_use, number, page_again,
                                       table, trial_why, trials_table, when)
from trialkit.control.queue import PRIORITY_RANGE, Move, jobs, label
from trialkit.control.results import (ENDED_UNWATCHED, UNWATCHED_WORDS, best_row, experiment_ran, metric_value,
                                      optimize_mode, saves_into, setting, shown_values, to_csv, to_json, trial_rows,
                                      unwatched, unwatched_word, went_on_from)
from trialkit.manager.store import Store, StoreUnwritable
from trialkit.errors import ArgumentParser, UserError, report_and_exit
from trialkit.statuses import (EARLY_STOPPED, FAILED, FINAL_STATUSES, PREEMPTED, RUNNING, SUCCEEDED, SYS_CANCELED,
                               USER_CANCELED, WAITING)

PROG = "trialkit"
DETACH_WAIT = 30.0  # how long `--detach` waits to show the background manager's URL
FOLLOW_PAUSE = 0.2  # `trial logs -f`: a file has no "new data" event; a short pause between reads
STOP_WAIT_MARGIN = 30.0  # `experiment stop`: past the trials' grace and flush, how long to wait for the manager
REDACTED = "<redacted>"
RENDER_EXPERIMENT_ID = "render"  # `trialkit render` names trials as a real run would, under this id
RENDER_LIMIT = 1000  # `render --trial N` asks the tuner N+1 times (TPE: ~20 ms each here)
RENDER_PORT = 8080  # the manager's port in what render prints, where --port does not give the run's


# -- run and render ---------------------------------------------------------------------


def _load_for_run(opts: argparse.Namespace):
    """The config as `run` (and `render`, showing what a run sends) reads it with the run's options."""
    import dataclasses

    from trialkit.control.config import load_config, manager_tls
    from trialkit.manager.server import tls_pair

    # A Determined config's context dir: `""` is refused there. Its code is checked with its other keys.
    config = load_config(opts.config, opts.context_dir, check_code=True)
    tls = tls_pair(opts.tls_cert, opts.tls_key)
    if tls is not None:
        config = dataclasses.replace(config, manager_tls=manager_tls(
            {"certFile": tls[0], "keyFile": tls[1]}, Path.cwd(), "--tls-cert/--tls-key"))
    return config


def cmd_run(opts: argparse.Namespace) -> int:
    from trialkit.control.run import run_experiment
    from trialkit.web import attach_page

    if opts.experiment_id is not None:  # a detached run's, chosen by its parent: a name, never a path
        paths.check_experiment_id(opts.experiment_id, "--experiment-id")
    config = _load_for_run(opts)
    if opts.detach:
        from trialkit.control.run import check_startable, forget_unstarted

        experiment_id = paths.new_experiment_id()
        experiment_dir = paths.create_experiment_dir(experiment_id, config.experiment_working_directory)
        try:  # refused here, before the line that names the experiment: nothing of it is left
            check_startable(config, experiment_dir)
        except UserError:
            forget_unstarted(experiment_dir)
            raise
        context = [] if opts.context_dir is None else [config.trial_code_directory]  # made absolute
        argv = ["run", os.path.abspath(opts.config), *context, "--experiment-id", experiment_id]
        argv += _port_args(opts.port)
        if config.manager_tls:
            argv += ["--tls-cert", config.manager_tls["certFile"], "--tls-key", config.manager_tls["keyFile"]]
        return _detach(argv, experiment_id, experiment_dir, "started")
    return run_experiment(config, opts.port, opts.experiment_id, page=attach_page).exit_code


def cmd_render(opts: argparse.Namespace) -> int:
    import yaml

    from trialkit import platforms
    from trialkit.control.config import trials_experiment_dir
    from trialkit.control.specs import build_spec
    from trialkit.control.tuners import build_tuner
    from trialkit.platforms.kubernetes import kueue
    from trialkit.platforms.kubernetes.render import render_notes, render_trial

    config = _load_for_run(opts)
    if not hasattr(platforms.load(config.platform), "render"):
        raise UserError(f"platform {config.platform} runs processes, not Kubernetes objects: there is nothing to render",
                        "trainingService.platform", "render a config for kubeflow, frameworkcontroller or adaptdl")
    if opts.trial >= min(config.max_trial_number or RENDER_LIMIT, RENDER_LIMIT):
        raise UserError(f"trial {opts.trial} is past what render proposes (the tuner is asked once a trial up to it)",
                        "--trial", f"pick a number below {min(config.max_trial_number or RENDER_LIMIT, RENDER_LIMIT)}")
    experiment_dir = paths.experiments_root(config.experiment_working_directory) / RENDER_EXPERIMENT_ID
    tuner = build_tuner(config.tuner.name, config.tuner.class_args, config.search_space, seed=0,
                        experiment_dir=trials_experiment_dir(config, experiment_dir))
    asked = None
    for _ in range(opts.trial + 1):
        asked = tuner.ask()
        if asked is None:
            raise UserError(f"the tuner proposes fewer than {opts.trial + 1} trials", "--trial", "pick a lower number")
    port = opts.port or RENDER_PORT
    url = f"{'https' if config.manager_tls else 'http'}://127.0.0.1:{port}"  # its host: managerAddress, in the pods
    spec = build_spec(config, RENDER_EXPERIMENT_ID, opts.trial, asked[0], asked[1], url, REDACTED)
    queue = kueue.for_namespace(config.training_service.common.namespace)  # the pool a run's jobs join
    objects = kueue.into_queue(render_trial(config.training_service, spec), queue)
    notes = [f"trial {opts.trial} as a run submits it, but for these placeholders:",
             f"  experiment id {RENDER_EXPERIMENT_ID!r}: a run's own id, so its objects are tk-<experiment id>-<trial id>",
             "  the trial's token: a run puts it in the trial's Secret",
             *([] if opts.port else [f"  manager port {RENDER_PORT}: a run listens on any free port unless given "
                                     "--port (render --port P shows that one)"]),
             *render_notes(config.training_service), *([kueue.note(queue)] if queue else [])]
    text = "".join(f"# {note}\n" for note in notes) + yaml.safe_dump_all(objects, sort_keys=False)
    if opts.output is None:
        sys.stdout.write(text)
    else:
        out = Path(opts.output) / f"{spec.trial_id}.yaml"
        try:
            out.parent.mkdir(parents=True, exist_ok=True)  # as `helm template --output-dir` does
        except OSError as err:
            raise UserError(f"cannot make the directory {opts.output!r}: {err.strerror}", "-o", "check the path") from None
        _write(out, text, "-o")
        print(out)
    return 0


# -- experiments ------------------------------------------------------------------------


def cmd_experiment_list(opts: argparse.Namespace) -> int:
    from trialkit.control import background

    rows = []  # (created, row): newest first, as the page lists them; one it cannot read last (the page's 0)
    for experiment_dir in paths.all_experiment_dirs():
        try:
            with _store(experiment_dir) as store:
                experiment = store.experiment(experiment_dir.name)
                if experiment is None:
                    continue
                trials = store.trials(experiment_dir.name)
                status = background.status(experiment_dir, experiment)
                interrupted = _interrupted(experiment_dir, experiment, store)
        except StoreUnwritable as err:  # its disk refuses even a reader: the store itself may well be intact
            rows.append((0.0, (experiment_dir.name, "", f"UNREADABLE (its disk: {err.reason})", "-", "-")))
            continue
        except (sqlite3.DatabaseError, DamagedStore) as err:
            # One damaged store (garbage bytes, a cut-off copy) is one line: the others still list.
            rows.append((0.0, (experiment_dir.name, "",
                               f"DAMAGED ({paths.DB_NAME}: {getattr(err, 'reason', err)})", "-", "-")))
            continue
        rows.append((experiment["created"], (
            experiment_dir.name, experiment["config"].get("experimentName") or "",
            status, _trials_made(trials, interrupted), when(experiment["created"]))))
    if not rows:
        print(f"no experiments under {paths.home() / 'experiments'}")
        return 0
    rows.sort(key=lambda created_row: created_row[0], reverse=True)  # stable: equal times keep the ids' order
    print(table(("id", "name", "status", "trials", "created"), [row for _, row in rows]))
    return 0


# Every status `experiment list` counts beside the trials made, by the word it says: the counts add up to the
# trials made, so that a lone canceled trial reads "1 (1 canceled)", not a bare "1".
_COUNTED = ((SUCCEEDED, "succeeded"), (FAILED, "failed"), (EARLY_STOPPED, "early-stopped"), (PREEMPTED, "paused"),
            (USER_CANCELED, "canceled"), (SYS_CANCELED, "canceled by trialkit"), (RUNNING, "running"),
            (WAITING, "waiting"))


def _trials_made(trials: List[Dict[str, Any]], interrupted: Interrupted = None) -> str:
    """The trials the experiment made (the page's "Trials"), and the non-zero counts of _COUNTED's statuses:
    "4 (3 failed)", "10 (8 succeeded, 2 failed)"; "0" for none. The runs of an interrupted one that the store
    holds no end of are counted by what is known of them (`interrupted`, as trial list says it beside each):
    "running unwatched", "lost" (its keeper is gone, as a resume will say), "ended unwatched" (its keeper
    wrote its end)."""
    def word(trial: Dict[str, Any]) -> str:
        state = interrupted.get(trial["id"]) if interrupted is not None else None
        if state and trial["status"] not in FINAL_STATUSES:  # trial list says it in full beside each
            return unwatched_word(state)
        return dict(_COUNTED).get(trial["status"], "")

    said = [word(t) for t in trials]
    words = dict.fromkeys([w for _, w in _COUNTED] + list(UNWATCHED_WORDS.values()) + [ENDED_UNWATCHED])
    counts = [f"{said.count(w)} {w}" for w in words if said.count(w)]
    return f"{len(trials)} ({', '.join(counts)})" if counts else str(len(trials))


def cmd_experiment_show(opts: argparse.Namespace) -> int:
    from trialkit.control import admin, background

    experiment_dir = paths.experiment_dir(opts.experiment_id)
    with _store(experiment_dir) as store:
        experiment = _experiment(store, opts.experiment_id)
        rows = trial_rows(store, opts.experiment_id)
        ran = experiment_ran(experiment_dir, experiment["status"], store.open_runs(opts.experiment_id))
        interrupted = _interrupted(experiment_dir, experiment, store)
    config = experiment["config"]
    info = admin.read_info(experiment_dir)
    mode = optimize_mode(config)
    # What the store holds, as it holds it: a store another program wrote may lack a setting ("-").
    name, most = setting(config, "experimentName"), setting(config, "maxTrialNumber")
    status = background.status(experiment_dir, experiment)
    lines = [
        f"experiment  {opts.experiment_id}" + (f" ({name})" if name else ""),
        f"status      {status}"
        + (f": {experiment['reason']}" if experiment.get("reason") else ""),
        f"created     {when(experiment['created'])}",
        f"elapsed     {duration(ran)}",
        f"dir         {experiment_dir}",
        f"platform    {setting(config, 'trainingService', 'platform') or '-'}",
        *(f"warm start  {line}" for line in paths.cold_lines(experiment_dir)),  # else only in a detached run's log
        f"tuner       {setting(config, 'tuner', 'name') or '-'} ({'; '.join([mode, *_class_args(config)])})",
        f"trials      {len(rows)}" + (f" of {most}" if most else ""),
    ]
    if info is not None and info.running():
        from trialkit.web import page_url

        lines.append(f"manager     {info.url} (pid {info.pid})")
        lines.append(f"page        {page_url(info.url, info.token, opts.experiment_id)}")  # the bare address asks for it
    elif info is not None:  # a detached run's user reads here what the run's last line said
        lines.append(f"page        {page_again(opts.experiment_id)}")
    best = best_row(rows, mode)
    if best is not None:
        lines.append(f"best        {best['trial_id']} final={number(metric_value(best['final']))} "
                     f"parameters={records.dumps(shown_values(setting(config, 'searchSpace'), best['parameters']))}")
    print("\n".join(lines))
    if rows:
        print("\n" + trials_table(rows, interrupted, setting(config, "searchSpace")))
        _say_interrupted(opts.experiment_id, rows, interrupted)
    if status == "STOPPED":  # the loop's STOPPED (not imported: it loads the control loop)
        print(f"\nstopped: `trialkit experiment resume {opts.experiment_id}` takes it up again")
    return 0


def cmd_experiment_stop(opts: argparse.Namespace) -> int:
    from trialkit.control import admin

    info = admin.running_manager(opts.experiment_id)
    admin.act(opts.experiment_id, "experiment", "stop")
    print(f"stopping experiment {opts.experiment_id}: its trials get their grace to finish")
    with _store(paths.experiment_dir(opts.experiment_id)) as store:
        grace = _experiment(store, opts.experiment_id)["config"].get("trialGraceSeconds", 25)
    deadline = time.monotonic() + grace + STOP_WAIT_MARGIN
    while info.running() and time.monotonic() < deadline:
        time.sleep(FOLLOW_PAUSE)  # not our child: nothing to wait on but its pid
    if info.running():
        print(f"the manager (pid {info.pid}) is still stopping; see `trialkit experiment show {opts.experiment_id}`")
        return 1
    print(f"experiment {opts.experiment_id} stopped")
    return 0


def cmd_experiment_pause(opts: argparse.Namespace) -> int:
    from trialkit.control import admin

    answer = admin.act(opts.experiment_id, "experiment", "pause")
    print(f"pausing experiment {opts.experiment_id}: its trials checkpoint and stop, and nothing starts until "
          f"`trialkit experiment activate {opts.experiment_id}`")
    _warn(answer)
    return 0


def cmd_experiment_update(opts: argparse.Namespace) -> int:
    from trialkit.control import admin
    from trialkit.schema import read_data_file

    changes = {key: value for key, value in (("trialConcurrency", opts.trial_concurrency),
                                             ("maxTrialNumber", opts.max_trial_number),
                                             ("maxExperimentDuration", opts.max_experiment_duration)) if value is not None}
    if opts.search_space is not None:
        changes["searchSpace"] = read_data_file(Path(opts.search_space), "--search-space")
    if not changes and opts.priority is None and opts.weight is None:
        raise UserError("nothing to update", "experiment update",
                        "give --trial-concurrency, --max-trial-number, --max-experiment-duration, --search-space, "
                        "--priority or --weight")
    if changes and opts.priority is None and opts.weight is None and admin.ended_status(opts.experiment_id):
        # An ended experiment's config changes are kept for its resume (nnictl's `update trialnum` and a
        # resume: more trials for a DONE one). An interrupted one's manager died mid-run: it is resumed first.
        before = _store_config_update(opts.experiment_id, changes)
        said = [key if key == "searchSpace" else f"{key} {before.get(key, '-')} -> {value}"
                for key, value in changes.items()]
        print(f"updated experiment {opts.experiment_id}: {', '.join(said)}; its resume goes on with it "
              f"(`trialkit experiment resume {opts.experiment_id}`)")
        return 0
    if changes:  # the config's changes need its manager: none running, the pool's job is not changed either
        admin.running_manager(opts.experiment_id)
        _check_config_update(opts.experiment_id, changes)
    done = _update_pool_job(opts.experiment_id, opts)  # its job in the resource pool: all or none, first
    answer = admin.act(opts.experiment_id, "experiment", "update", body=changes) if changes else {}
    print(f"updated experiment {opts.experiment_id}: {', '.join(list(changes) + done)}")
    if answer.get("note"):
        print(f"note: {answer['note']}")
    return 0


def _check_config_update(experiment_id: str, changes: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Check config changes as its manager will (Loop.update_config), before the pool's job changes: an update
    applies all or none, and the manager's refusal would come after the pool's change. (The stored config, the
    config with them.)"""
    from trialkit.control.config import parse_config

    experiment_dir = paths.experiment_dir(experiment_id)
    with _store(experiment_dir) as store:
        config = _experiment(store, experiment_id)["config"]
    return config, parse_config({**config, **changes}, experiment_dir,
                                source=f"the update of experiment {experiment_id}").to_dict()


def _store_config_update(experiment_id: str, changes: Dict[str, Any]) -> Dict[str, Any]:
    """An ended experiment's config with `changes`, checked and stored, as its resume will read it; the config
    it had."""
    before, config = _check_config_update(experiment_id, changes)
    store = Store.in_dir(paths.experiment_dir(experiment_id))
    try:
        store.set_experiment_config(experiment_id, config)
    finally:
        store.close()
    return before


def cmd_experiment_import(opts: argparse.Namespace) -> int:
    from trialkit.control import admin
    from trialkit.schema import read_data_file

    data = read_data_file(Path(opts.file), "--file")
    results = [result for result in map(_imported, data if isinstance(data, list) else [None]) if result is not None]
    if not results:
        raise UserError(f"{opts.file} holds no results", "--file",
                        'give nnictl\'s list of {"parameter": {...}, "value": ...} or a trialkit JSON export')
    answer = admin.act(opts.experiment_id, "experiment", "import", body={"results": results})
    print(f"imported {answer['imported']} results into experiment {opts.experiment_id}'s tuner")
    return 0


def _imported(entry: Any) -> Optional[Dict[str, Any]]:
    """One result to import: nnictl's {"parameter", "value" (maybe JSON text)} or a trialkit export row
    {"parameters", "final"}; None for one without a number (NaN and the infinities are none: the manager
    refuses them)."""
    if not isinstance(entry, dict):
        return None
    parameters = entry.get("parameter", entry.get("parameters"))
    value = entry.get("value", entry.get("final"))
    if isinstance(value, str):
        try:
            value = records.loads(value)
        except ValueError:
            return None
    number = metric_value(value)
    if not isinstance(parameters, dict) or number is None or number != number or number in (float("inf"), -float("inf")):
        return None
    return {"parameters": parameters, "value": number}


def cmd_experiment_activate(opts: argparse.Namespace) -> int:
    from trialkit.control import admin

    answer = admin.act(opts.experiment_id, "experiment", "activate")
    print(f"activated experiment {opts.experiment_id}: its paused trials are queued to resume")
    _warn(answer)
    return 0


def cmd_experiment_resume(opts: argparse.Namespace) -> int:
    from trialkit.control import admin
    from trialkit.control.run import resume_experiment
    from trialkit.web import attach_page

    if opts.detach:
        from trialkit.control.run import done_already

        experiment_dir = paths.experiment_dir(opts.experiment_id)
        if admin.ended_status(opts.experiment_id) == "DONE":  # nothing to start in the background
            print(done_already(opts.experiment_id))
            return 0
        info = admin.read_info(experiment_dir)
        if info is not None and info.running():
            raise UserError(f"experiment {opts.experiment_id} is running (manager pid {info.pid})", "EXPERIMENT_ID")
        argv = ["experiment", "resume", opts.experiment_id] + _port_args(opts.port)
        return _detach(argv, opts.experiment_id, experiment_dir, "resumed",
                       info.port if info is not None and opts.port is None else None)
    return resume_experiment(opts.experiment_id, opts.port, page=attach_page).exit_code


def cmd_experiment_delete(opts: argparse.Namespace) -> int:
    from trialkit.control.run import delete_experiment

    experiment_dir = paths.experiment_dir(opts.experiment_id)
    if not opts.yes and not _confirmed(f"delete experiment {opts.experiment_id}: its store, its dir "
                                       f"{experiment_dir}, its checkpoints and what its platform made for it "
                                       "(jobs, claims)?"):
        return 1
    removed = delete_experiment(opts.experiment_id)
    for name in removed:
        print(f"deleted {name}")
    print(f"experiment {opts.experiment_id} deleted")
    return 0


def _confirmed(question: str) -> bool:
    """The user's yes to deleting (y/N on the terminal); UserError without a terminal to ask on."""
    if not sys.stdin.isatty():
        raise UserError("deleting asks for a confirmation and there is no terminal to ask on", "--yes",
                        "add --yes to delete without asking")
    if input(f"{question} [y/N] ").strip().lower() in ("y", "yes"):
        return True
    print("nothing deleted")
    return False


def cmd_experiment_tensorboard(opts: argparse.Namespace) -> int:
    from trialkit import platforms
    from trialkit.control.config import parse_config

    experiment_dir = paths.experiment_dir(opts.experiment_id)
    with _store(experiment_dir) as store:
        stored = store.experiment(opts.experiment_id)
    if stored is None:
        raise UserError(f"the store in {experiment_dir} holds no experiment {opts.experiment_id}", "EXPERIMENT_ID")
    config = parse_config(stored["config"], experiment_dir, source=f"experiment {opts.experiment_id}'s stored config")
    platform = platforms.create(config.platform, config.training_service, experiment_dir)
    start = getattr(platform, "start_tensorboard", None)
    if start is None:
        raise UserError(f"experiment {opts.experiment_id} runs on {config.platform}: TensorBoard is served for adaptdl "
                        "and local experiments", "EXPERIMENT_ID",
                        "run tensorboard --logdir over its trials' TensorBoard dirs")
    print(start(opts.experiment_id))
    return 0


def cmd_experiment_export(opts: argparse.Namespace) -> int:
    with _store(paths.experiment_dir(opts.experiment_id)) as store:
        _experiment(store, opts.experiment_id)
        rows = trial_rows(store, opts.experiment_id, all_runs=opts.all_runs)
    text = to_json(rows) if opts.format == "json" else to_csv(rows)
    if opts.output is None:
        sys.stdout.write(text)
    else:
        _write(Path(opts.output), text, "-o")
    return 0


def cmd_experiment_plot(opts: argparse.Namespace) -> int:
    try:
        from trialkit.control.plot import nothing_to_plot, plot_experiment, reported_metrics
        from trialkit.control.results import find_metric
        import matplotlib  # noqa: F401 - said here, where the fix can be named
    except ImportError:
        raise UserError("plotting needs matplotlib", "plot", "pip install 'trialkit[control]'") from None
    with _store(paths.experiment_dir(opts.experiment_id)) as store:
        space = _experiment(store, opts.experiment_id)["config"].get("searchSpace")
        rows = trial_rows(store, opts.experiment_id)
    why = nothing_to_plot(rows)
    if why is not None:
        raise UserError(f"nothing to plot for experiment {opts.experiment_id}: {why}", "EXPERIMENT_ID",
                        f"`trialkit trial list {opts.experiment_id}` shows each trial's status and reason")
    known = reported_metrics(rows)
    for name in opts.metric or ():
        if find_metric(known, name) is None:
            groups = [metric.name for metric in known if metric.group and metric.name.endswith(f".{name}")]
            raise UserError(f"experiment {opts.experiment_id}'s trials report {name!r} in {len(groups)} groups"
                            if len(groups) > 1 else f"experiment {opts.experiment_id}'s trials report no metric {name!r}",
                            "--metric", f"name one of: {', '.join(metric.shown for metric in known)}" if known
                            else "its trials reported final results only")
    output = Path(opts.output)
    try:  # is_dir() raises for a name too long, as the write does
        if output.is_dir():
            output = output / f"{opts.experiment_id}.png"  # -o DIR: the plot goes inside it, as `render -o DIR` does
        if not output.parent.is_dir():
            raise UserError(f"no directory {str(output.parent)!r} to write into", "-o", "create it first")
        if output.suffix.lower() not in ("", ".png"):
            raise UserError(f"the plot is a PNG, not {output.suffix!r}", "-o", f"name it {output.stem}.png")
        plot_experiment(rows, f"experiment {opts.experiment_id}", output, opts.metric or (),
                        space if isinstance(space, dict) else None)
    except OSError as err:
        raise UserError(f"cannot write {str(output)!r}: {err.strerror}", "-o", "check the path") from None
    print(output)
    return 0


# -- checkpoints ----------------------------------------------------------------------------


def _checkpoint_scope(ident: str) -> Tuple[str, Optional[str]]:
    """(experiment id, trial id or None) of an experiment's or a trial's id (<experiment id>-<sequence>)."""
    try:
        return paths.experiment_of(ident), ident
    except UserError:
        return ident, None


def _catalog(ident: str) -> Tuple[Dict[str, Any], List[Any]]:
    """The experiment's config and the catalog of its (or its trial's) checkpoints."""
    from trialkit.control import checkpoints

    experiment_id, trial_id = _checkpoint_scope(ident)
    with _store(paths.experiment_dir(experiment_id)) as store:
        config = _experiment(store, experiment_id)["config"]
        if trial_id is not None:
            _trial(store, trial_id)
        return config, checkpoints.catalog(store, experiment_id, config, trial_id)


def _one_checkpoint(ident: str, uuid: str) -> Tuple[Dict[str, Any], Any]:
    """The checkpoint whose uuid is `uuid` or begins with it (at least 4 characters), as `list` shows them."""
    config, entries = _catalog(ident)
    found = [e for e in entries if e.checkpoint.uuid == uuid]
    if not found and len(uuid) < 4:
        raise UserError(f"{uuid!r} is too short to name a checkpoint", "UUID",
                        f"give at least 4 characters of its uuid: `trialkit checkpoint list {ident}` lists them")
    found = found or [e for e in entries if e.checkpoint.uuid.startswith(uuid)]
    if len(found) != 1:
        what = "no checkpoint" if not found else f"{len(found)} checkpoints begin with"
        raise UserError(f"{what} {uuid!r} in {ident}", "UUID", f"see `trialkit checkpoint list {ident}`")
    return config, found[0]


def _kept_by(rules: List[str]) -> str:
    return " + ".join(rules) if rules else "nothing (deleted once its trial stops)"


def cmd_checkpoint_list(opts: argparse.Namespace) -> int:
    _, entries = _catalog(opts.id)
    if opts.json:
        print(json.dumps([{**e.checkpoint.manifest(), "where": e.checkpoint.where, "metric": e.metric,
                           "kept_by": e.rules} for e in entries], indent=2))
        return 0
    if not entries:
        print(f"{opts.id} has no checkpoints")
        return 0
    rows = [[e.checkpoint.uuid, e.checkpoint.trial, "-" if e.checkpoint.steps is None else str(e.checkpoint.steps),
             number(e.metric) if e.metric is not None else "-", _size(e.checkpoint.size), _kept_by(e.rules),
             e.checkpoint.where] for e in entries]
    print(table(["uuid", "trial", "steps", "metric", "size", "kept by", "where"], rows))
    return 0


def cmd_checkpoint_show(opts: argparse.Namespace) -> int:
    _, entry = _one_checkpoint(opts.id, opts.uuid)
    ckpt = entry.checkpoint
    lines = [
        f"uuid       {ckpt.uuid}",
        f"trial      {ckpt.trial} (run {ckpt.run})",
        f"steps      {'-' if ckpt.steps is None else ckpt.steps}",
        f"metric     {'-' if entry.metric is None else number(entry.metric)}",
        f"saved      {when(ckpt.time)}",
        f"size       {_size(ckpt.size)} in {len(ckpt.files)} files",
        f"where      {ckpt.where}",
        f"kept by    {_kept_by(entry.rules)}",
        f"metadata   {records.dumps(ckpt.metadata)}",
        "files:",
        *(f"  {size:>12,}  {name}" for name, size in sorted(ckpt.files.items())),
    ]
    print("\n".join(lines))
    return 0


def cmd_checkpoint_download(opts: argparse.Namespace) -> int:
    from trialkit.control import checkpoints

    config, entry = _one_checkpoint(opts.id, opts.uuid)
    ckpt = entry.checkpoint
    dest = Path(opts.output or ckpt.uuid).absolute()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserError(f"{dest} exists and is not an empty directory", "--output",
                        "name a new or an empty directory")
    checkpoints.download(checkpoints.storage_of(config), ckpt, dest)
    print(f"checkpoint {ckpt.uuid} ({_size(ckpt.size)}) -> {dest}")
    return 0


def cmd_checkpoint_delete(opts: argparse.Namespace) -> int:
    from trialkit.control import checkpoints

    chosen = [_one_checkpoint(opts.id, uuid) for uuid in opts.uuids]  # every uuid checked before any goes
    experiment_id, _ = _checkpoint_scope(opts.id)
    listed = ", ".join(f"{entry.checkpoint.uuid} of {entry.checkpoint.trial}" for _, entry in chosen)
    where = checkpoints.where_kept(checkpoints.storage_of(chosen[0][0]))
    if not opts.yes and not _confirmed(f"delete checkpoint{'s' * (len(chosen) > 1)} {listed} from {where}?"):
        return 1
    with _store(paths.experiment_dir(experiment_id)) as store:
        dirs = {t["id"]: t.get("trial_dir") for t in store.trials(experiment_id)}
    for config, entry in chosen:
        ckpt = entry.checkpoint
        checkpoints.delete(checkpoints.storage_of(config), ckpt, dirs.get(ckpt.trial))
        print(f"deleted checkpoint {ckpt.uuid} of {ckpt.trial}")
    return 0


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    return str(count)


# -- trials -----------------------------------------------------------------------------


def cmd_trial_list(opts: argparse.Namespace) -> int:
    experiment_dir = paths.experiment_dir(opts.experiment_id)
    with _store(experiment_dir) as store:
        experiment = _experiment(store, opts.experiment_id)
        rows = trial_rows(store, opts.experiment_id)
        interrupted = _interrupted(experiment_dir, experiment, store)
    if not rows:
        print(f"experiment {opts.experiment_id} has no trials yet")
        return 0
    print(trials_table(rows, interrupted, setting(experiment["config"], "searchSpace")))
    _say_interrupted(opts.experiment_id, rows, interrupted)
    return 0


def _interrupted(experiment_dir: Path, experiment: Dict[str, Any], store: Store) -> Interrupted:
    """None while the experiment's manager runs or it ended; once it is gone while the store says it runs
    (`experiment list`'s INTERRUPTED), what the store says of its unfinished trials is no longer so: what is
    known of each (results.unwatched's state, by trial id), its store's open runs read only then."""
    from trialkit.control import background

    if background.status(experiment_dir, experiment) != background.INTERRUPTED:
        return None
    runs = store.open_runs(experiment_dir.name)
    return {trial_id: seen.state for trial_id, seen in unwatched(runs, experiment_dir).items()}


def _say_interrupted(experiment_id: str, rows: List[Dict[str, Any]], interrupted: Interrupted) -> None:
    """Under a trials table: why some of them say INTERRUPTED, and how to go on."""
    if interrupted is not None and any(row["status"] not in FINAL_STATUSES for row in rows):
        print(f"\n{INTERRUPTED_NOTE}: {_gone(experiment_id)}")


def _gone(experiment_id: str) -> str:
    return ("its manager is gone, so what the store says of its unfinished trials is what it last heard (they "
            f"stopped, or run unwatched); `trialkit experiment resume {experiment_id}` takes them up")


def _class_args(config: Dict[str, Any]) -> List[str]:
    """The tuner's classArgs as the stored config holds them, which shape the trials the table shows (Hyperband's
    R and eta, PBT's population_size), but its optimize mode (said apart) and its dirs (PBT's all_checkpoint_dir:
    where, not how, and a long path no face shows)."""
    args = setting(config, "tuner", "classArgs")
    shown = {key: value for key, value in args.items() if key != "optimize_mode" and not key.endswith("_dir")
             } if isinstance(args, dict) else {}
    return [", ".join(f"{key}={value if isinstance(value, str) else records.dumps(value)}"
                      for key, value in shown.items())] if shown else []


def cmd_trial_show(opts: argparse.Namespace) -> int:
    experiment_dir = paths.experiment_dir(paths.experiment_of(opts.trial_id))
    with _store(experiment_dir) as store:
        trial = _trial(store, opts.trial_id)
        experiment = _experiment(store, trial["experiment"])
        rows = trial_rows(store, trial["experiment"])
        row = next(r for r in rows if r["trial_id"] == opts.trial_id)
        history = store.status_history(opts.trial_id)
        elastic = store.records_for(opts.trial_id, type=records.ELASTIC)[-1:]
        lost = _lost(store.records_for(opts.trial_id, type=records.STATUS))
        interrupted = _interrupted(experiment_dir, experiment, store)
    why = trial_why(row, interrupted)  # what is known of it, once its experiment is interrupted
    source = went_on_from(row["parameters"], ((r["trial_id"], r["parameters"], r["reason"]) for r in rows),
                          setting(experiment["config"], "tuner", "name"))  # PBT's exploit, Hyperband's rounds
    lines = [
        f"trial          {opts.trial_id} (sequence {row['sequence']}, parameter id {row['parameter_id']})",
        f"status         {label(row['status'])}" + (
            f" ({why}{'; ' if why != INTERRUPTED_NOTE else ': '}{_gone(trial['experiment'])})"
            if interrupted is not None and row["status"] not in FINAL_STATUSES
            else f": {row['reason']}" if row["reason"] else ""),
        f"exit code      {'-' if row['exit_code'] is None else row['exit_code']}",
        f"restarts       {row['restart_count']}",
        f"started        {when(row['started'])}",
        f"ended          {when(row['ended'])}",
        f"duration       {duration(row['duration'])}",
        f"parameters     {records.dumps(row['parameters'])}",
        *([f"{source[0]:<15}{source[1]}"] if source else []),
        *([f"saves into     {saves} (its save_checkpoint_dir: NNI's PBT; no checkpoint store lists it)"]
          if (saves := saves_into(row["parameters"])) else []),
        f"final          {records.dumps(row['final'])}",
        f"intermediate   {records.dumps(row['intermediate'])}",
        *([f"lost           {lost} records (its disk was full when it ended: never written)"] if lost else []),
        f"dir            {row['trial_dir']}",
        *(_elastic_block(rec) for rec in elastic),
        "history:",
    ]
    if row["gpus"] is not None:
        samples = gpus.read_samples(row["trial_dir"])
        lines.insert(4, f"gpus           {gpu_list(row['gpus'])}")
        if samples:
            lines.insert(5, f"gpu use        {gpu_use(samples[-1])} ({len(samples)} samples)")
    lines += [f"  {when(h['time'])}  {label(h['status']):<13} {h['source']:<7} "  # PAUSED, as the page says it
              + (f"exit {h['exit_code']} " if h["exit_code"] is not None else "") + (h["reason"] or "")
              for h in history]
    print("\n".join(line.rstrip() for line in lines))
    return 0


def _lost(statuses: List[Dict[str, Any]]) -> int:
    """The records a trial reported and never wrote, as its keepers' final statuses count them (one a run)."""
    return sum(rec["value"]["lost"] for rec in statuses
               if isinstance(rec["value"], dict) and type(rec["value"].get("lost")) is int)


def _elastic_block(rec: Dict[str, Any]) -> str:
    """An elastic job's last sizing decision (adaptdl-ray's ELASTIC record), as trial show prints it."""
    value = rec["value"]
    predicted = sorted((int(count), speedup) for count, speedup in value["predicted"].items())
    return "\n".join([
        "elastic:",
        f"  workers      {value['workers']}",
        "  predicted    " + ("  ".join(f"{count}: {speedup:.2f}x" for count, speedup in predicted)
                             + " (speedup over one worker)" if predicted else "- (no hints yet)"),
        f"  last         {when(rec['time'])}  {value['reason']}",
    ])


def cmd_trial_logs(opts: argparse.Namespace) -> int:
    """What the trial's keeper shipped (every platform alike), else its log file on this machine."""
    experiment_dir = paths.experiment_dir(paths.experiment_of(opts.trial_id))
    with _store(experiment_dir) as store:
        _trial(store, opts.trial_id)
        shipped = store.records_for(opts.trial_id, type=records.LOG)
    if opts.rank is not None and not opts.follow:
        from trialkit.manager import replica_logs

        replica = replica_logs.read(experiment_dir, opts.trial_id, opts.rank)  # another pod of a multi-pod trial
        if replica is not None:
            sys.stdout.write(replica)
            return 0
        if replica_logs.reporting_rank(experiment_dir, opts.trial_id) == opts.rank:
            opts.rank = None  # the reporting pod: its output is what the trial shipped to the store
    if shipped or opts.rank is not None:
        return _print_shipped_logs(experiment_dir, opts, shipped)
    return _print_log_file(experiment_dir, opts)


def _print_shipped_logs(experiment_dir: Path, opts: argparse.Namespace, shipped: List[Dict[str, Any]]) -> int:
    import re

    keep = f"[rank={opts.rank}] " if opts.rank is not None else None
    last, printed, ranks = 0, 0, set()
    sent: Dict[str, List[str]] = {}  # stream -> the texts shipped of it

    def show(text: str) -> None:
        nonlocal printed
        ranks.update(int(rank) for rank in re.findall(r"^\[rank=(\d+)\] ", text, re.M))
        if keep is not None:
            text = "".join(line for line in text.splitlines(keepends=True) if line.startswith(keep))
        printed += len(text)
        sys.stdout.write(text)

    while True:
        for rec in shipped:
            last = rec["seq"]
            sent.setdefault(rec["value"].get("stream"), []).append(rec["value"]["text"])
            show(rec["value"]["text"])
        done = not opts.follow or _trial_over(experiment_dir, opts.trial_id)
        if done:
            show(_unshipped(paths.trial_dir(experiment_dir, opts.trial_id), sent))
        sys.stdout.flush()
        if done:
            if opts.rank is not None and opts.rank not in ranks and _trial_over(experiment_dir, opts.trial_id):
                shown = (f"ranks {min(ranks)} to {max(ranks)} ({len(ranks)} workers)" if ranks
                         else "no ranks: it was not a distributed trial")
                raise UserError(f"trial {opts.trial_id} has no rank {opts.rank}: its output has {shown}", "--rank",
                                "leave --rank out for every line" + (f", or pick one of {sorted(ranks)}" if ranks else ""))
            if not printed:
                _say_silent(experiment_dir, opts.trial_id)
            return 0
        time.sleep(FOLLOW_PAUSE)
        with _store(experiment_dir) as store:
            shipped = store.records_for(opts.trial_id, type=records.LOG, after_seq=last)


def _unshipped(trial_dir: Path, sent: Dict[str, List[str]]) -> str:
    """What the trial's log files on this machine hold past what its keeper shipped (`sent`: stream -> texts): the
    lines its keeper wrote there and never shipped (SIGKILLed by a second Ctrl-C with them in its buffer or spool).
    Nothing of a file that does not start with what was shipped of it (lines cut by the log rate, a restart
    elsewhere), nor of one that is not here (a pod's)."""
    tails = []
    for stream in ("stdout", "stderr"):
        shipped = "".join(sent.get(stream, ())).encode("utf-8")
        try:
            with open(trial_dir / f"{stream}.log", "rb") as f:
                if f.read(len(shipped)) == shipped:
                    tails.append(f.read())
        except OSError:
            continue
    return b"".join(tails).decode("utf-8", "replace")


def _print_log_file(experiment_dir: Path, opts: argparse.Namespace) -> int:
    log = paths.trial_dir(experiment_dir, opts.trial_id) / paths.TRIAL_LOG
    if not log.exists():
        raise UserError(f"no log of trial {opts.trial_id} on this machine ({log})", "TRIAL_ID",
                        "a trial on a cluster logs there, for kubectl logs; a local trial not started yet has none")
    with open(log, "rb") as f:
        printed = 0
        while True:
            chunk = f.read(1 << 16)
            if chunk:
                printed += len(chunk)
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                continue
            if not opts.follow or _trial_over(experiment_dir, opts.trial_id):
                if not printed:
                    _say_silent(experiment_dir, opts.trial_id)
                return 0
            time.sleep(FOLLOW_PAUSE)


def _say_silent(experiment_dir: Path, trial_id: str) -> None:
    # On stderr: stdout stays the trial's output, empty, for whoever pipes it.
    print(f"trial {trial_id} printed nothing (its stdout and stderr are empty)" + _sent_to(experiment_dir, trial_id),
          file=sys.stderr)


def _sent_to(experiment_dir: Path, trial_id: str) -> str:
    """Where the trial's command sent its output, when it sends it to a file (`python3 train.py > train.log`, as
    the keeper's warning about a pipe tells to write): ": its command sent its output to train.log in DIR" (the
    trial's copy of the code dir on this machine, else its code dir where it ran); "" where it does not."""
    from trialkit.process import output_file, shell_line_argv

    with _store(experiment_dir) as store:
        config = _experiment(store, experiment_dir.name)["config"]
    command = setting(config, "trialCommand")
    target = output_file(shell_line_argv(command)) if isinstance(command, str) else None
    if target is None:
        return ""
    if os.path.isabs(target):
        return f": its command sent its output to {target}"
    from trialkit.platforms.local import CODE_NAME  # here: only a silent trial's redirect loads the platform

    copy = paths.trial_dir(experiment_dir, trial_id) / CODE_NAME  # a local trial's; a pod's is in the pod
    code = copy if copy.is_dir() else "its code directory where it ran ($TRIALKIT_CODE_DIR)"
    return f": its command sent its output to {target} in {code}"


def cmd_trial_kill(opts: argparse.Namespace) -> int:
    from trialkit.control import admin

    experiment_id = paths.experiment_of(opts.trial_id)
    answer = admin.act(experiment_id, "trial", "kill", opts.trial_id)
    already = answer.get("already") if isinstance(answer, dict) else None
    # A kill during a stop's grace does not restart its clock: say so, and when it ends.
    print(f"trial {opts.trial_id} is {already}" if already else f"stopping trial {opts.trial_id}")
    return 0


def cmd_trial_pause(opts: argparse.Namespace) -> int:
    from trialkit.control import admin

    answer = admin.act(paths.experiment_of(opts.trial_id), "trial", "pause", opts.trial_id)
    activate = f"`trialkit trial activate {opts.trial_id}`"
    checkpoint = answer.get("checkpoint") if isinstance(answer, dict) else None
    if isinstance(answer, dict) and answer.get("waiting"):
        print(f"paused trial {opts.trial_id}: it was waiting, not running: it does not start until {activate}"
              + (", which goes on from its latest checkpoint" if checkpoint else ""))
    elif checkpoint:
        print(f"pausing trial {opts.trial_id}: it stops, and {activate} goes on from its latest checkpoint")
    elif checkpoint is False:
        print(f"pausing trial {opts.trial_id}: it is asked to save a checkpoint as it stops; it holds none yet: if it "
              f"saves none, its progress restarts from the beginning when {activate} runs it again")
    else:
        print(f"pausing trial {opts.trial_id}: it is asked to save a checkpoint and stop; {activate} goes on from "
              f"it, or restarts it from the beginning if it saved none (`trialkit trial show {opts.trial_id}` "
              "says which)")
    _warn(answer)
    return 0


def _warn(answer: Any) -> None:
    if isinstance(answer, dict) and answer.get("warning"):
        print(f"warning: {answer['warning']}")


def cmd_trial_activate(opts: argparse.Namespace) -> int:
    from trialkit.control import admin

    answer = admin.act(paths.experiment_of(opts.trial_id), "trial", "activate", opts.trial_id)
    if isinstance(answer, dict) and answer.get("warning"):  # no checkpoint: never saved, or never started
        print(f"activated trial {opts.trial_id}: queued to start from the beginning (it holds no checkpoint)")
    else:
        print(f"activated trial {opts.trial_id}: queued to resume from its checkpoint")
    return 0


# -- the job queue ------------------------------------------------------------------------

JOB_COLUMNS = ("position", "id", "type", "experiment", "name", "priority", "submitted", "slots_acquired",
               "slots_needed", "status", "user")
POOL_JOB_COLUMNS = JOB_COLUMNS[:6] + ("weight",) + JOB_COLUMNS[6:]  # a resource pool's jobs have a weight too
# A Kueue pool's: its LocalQueue's workloads (kubernetes/kueue.py), their priority class and admission.
KUEUE_JOB_COLUMNS = JOB_COLUMNS[:5] + ("priority_class",) + JOB_COLUMNS[5:] + ("admission",)


def cmd_job_list(opts: argparse.Namespace) -> int:
    from trialkit.platforms import pools

    rows: List[Dict[str, Any]] = []
    gone: List[Tuple[str, List[Dict[str, Any]], Interrupted]] = []  # interrupted experiments, for _say_interrupted
    order = "priority"  # the column the order is by: a fair share pool's is its jobs' weights
    if opts.pool is not None and _kueue_pool(opts.pool):
        return _kueue_job_list(opts)
    if opts.pool is not None:  # --pool "": no such pool, not every experiment's trials
        rows = pools.jobs(opts.pool)
        if pools.pool_spec(opts.pool, pools.read_config(paths.home())).scheduler == pools.FAIR_SHARE:
            order = "weight"
    else:
        from trialkit.control import background

        experiment_dirs = ([paths.experiment_dir(opts.experiment)] if opts.experiment
                           else [d for d in paths.all_experiment_dirs() if background.manager_runs(d)])
        # Experiments in the order their pools give them slots (those of no pool of this home last), then
        # each one's trials in its own order; # counts across them all.
        keys = pools.order_keys()
        for experiment_dir in sorted(experiment_dirs, key=lambda d: (d.name not in keys, keys.get(d.name, ()))):
            with _store(experiment_dir) as store:
                experiment = _experiment(store, experiment_dir.name)
                rows += jobs(store, experiment_dir.name)
                # One named by --experiment may be interrupted: said under the table, as `trial list` says it.
                interrupted = _interrupted(experiment_dir, experiment, store)
                if interrupted is not None:
                    gone.append((experiment_dir.name, store.trials(experiment_dir.name), interrupted))
        for position, row in enumerate(rows):
            row["position"] = position
    if opts.format == "json":
        print(json.dumps(rows, indent=2))
    elif opts.format == "csv":
        import csv
        import io

        out = io.StringIO()
        writer = csv.DictWriter(out, POOL_JOB_COLUMNS if opts.pool else JOB_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        sys.stdout.write(out.getvalue())
    elif rows:
        print(table(("#", "id", "type", "experiment", "name", order, "submitted", "slots", "status", "user"),
                    [(r["position"], r["id"], r["type"], r["experiment"], r["name"], r[order], when(r["submitted"]),
                      f"{r['slots_acquired']}/{r['slots_needed']}", r["status"], r["user"]) for r in rows]))
        for experiment_id, trials, interrupted in gone:
            _say_interrupted(experiment_id, trials, interrupted)
    else:
        print("no jobs: no trial runs, waits or is paused" + ("" if opts.experiment else " in a running experiment"))
    return 0


def _kueue_pool(name: str) -> bool:
    from trialkit.platforms import pools

    return bool(pools.pool_spec(name, pools.read_config(paths.home())).local_queue)


def _kueue_job_list(opts: argparse.Namespace) -> int:
    """A Kueue pool's workloads, from the cluster, in Kueue's order with their admission."""
    from trialkit.platforms.kubernetes import kueue
    from trialkit.platforms.kubernetes.client import KubeClient

    queue = kueue.named(opts.pool)
    rows = kueue.jobs(queue, KubeClient.from_environment())
    if opts.format == "json":
        print(json.dumps(rows, indent=2))
    elif opts.format == "csv":
        import csv
        import io

        out = io.StringIO()
        writer = csv.DictWriter(out, KUEUE_JOB_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        sys.stdout.write(out.getvalue())
    elif rows:
        print(table(("#", "id", "experiment", "workload", "priority", "submitted", "pods", "status", "admission"),
                    [(r["position"], r["id"], r["experiment"], r["name"],
                      f"{r['priority']} ({r['priority_class']})" if r["priority_class"] else r["priority"],
                      when(r["submitted"]), f"{r['slots_acquired']}/{r['slots_needed']}", r["status"], r["admission"])
                     for r in rows]))
    else:
        print(f"no workloads in Kueue's LocalQueue {queue.local_queue} (namespace {queue.namespace})")
    return 0


def _kueue_priority(opts: argparse.Namespace) -> int:
    """`job update TRIAL --priority CLASS`: the trial's job's WorkloadPriorityClass in its Kueue LocalQueue."""
    import yaml

    from trialkit.platforms.kubernetes import kueue
    from trialkit.platforms.kubernetes.client import KubeClient, ObjectRef

    # A name where no Kubernetes job can take it is most likely a mistyped number.
    if opts.trial_id and _names_experiment(opts.trial_id):
        raise UserError("not a whole number", f"--priority {opts.priority}",
                        f"{PRIORITY_RANGE}; a Kueue priority class name applies to a trial's Kubernetes job, "
                        f"and {opts.trial_id} is an experiment")
    submitted = paths.trial_dir(paths.experiment_dir(paths.experiment_of(opts.trial_id)), opts.trial_id) / \
        "kubernetes.yaml"
    if not submitted.exists():
        raise UserError("not a whole number", f"--priority {opts.priority}",
                        f"{PRIORITY_RANGE}; a Kueue priority class name applies to a Kubernetes job, and trial "
                        f"{opts.trial_id} has none")
    job = list(yaml.safe_load_all(submitted.read_text()))[-1]
    kueue.set_priority(ObjectRef.of(job), opts.priority, KubeClient.from_environment())
    print(f"updated {opts.trial_id}: priority class {opts.priority}")
    return 0


def _priority(text: str) -> Any:
    """--priority: a number (trialkit's queues), or a Kueue WorkloadPriorityClass's name."""
    try:
        return int(text)
    except ValueError:
        if not text or not text.replace("-", "").replace(".", "").isalnum() or not text.islower():
            raise argparse.ArgumentTypeError(f"{text!r} is neither a whole number nor a WorkloadPriorityClass "
                                             "name") from None
        return text


def cmd_job_update(opts: argparse.Namespace) -> int:
    if isinstance(opts.priority, str):
        return _kueue_priority(opts)
    if _names_experiment(opts.trial_id):
        return _update_experiment_job(opts)
    move = Move(opts.trial_id, priority=opts.priority, ahead_of=opts.ahead_of, behind_of=opts.behind_of)  # values first
    try:
        paths.experiment_of(opts.trial_id)
    except UserError:
        shown = repr(opts.trial_id) if len(opts.trial_id) <= 40 else repr(opts.trial_id[:37]) + "..."
        raise UserError(f"{shown} is neither a trial id nor an experiment id of this home", "TRIAL_ID",
                        f"give an id that `trialkit job list` shows, a trial's like abcd1234-00003 or an "
                        f"experiment's like abcd1234, from this home: {paths.home()}") from None
    if opts.weight is not None or opts.resource_pool is not None:
        raise UserError(f"a trial's job has no {'weight' if opts.weight is not None else 'resource pool'} of its "
                        "own", opts.trial_id, "update its experiment's job: `trialkit job update EXPERIMENT_ID`")
    _move([move])
    print(f"updated {opts.trial_id}")
    return 0


def _names_experiment(job_id: str) -> bool:
    try:
        paths.experiment_dir(job_id)
    except UserError:
        return False
    return True


def _update_experiment_job(opts: argparse.Namespace) -> int:
    """An experiment's job in the home's resource pool (platforms/pools.py): a priority, a weight, another pool,
    or a place next to another experiment's job."""
    print(f"updated {opts.trial_id}: {', '.join(_update_pool_job(opts.trial_id, opts))}")
    return 0


def _update_pool_job(experiment_id: str, opts: argparse.Namespace) -> List[str]:
    """Apply the options of `job update` or `experiment update` that change the experiment's job in its resource
    pool (--priority, --weight, ...), all or none; the options given, [] when none."""
    from trialkit.platforms import pools

    changes = [(experiment_id, what, getattr(opts, what)) for what in pools.CHANGES
               if getattr(opts, what, None) is not None]
    if changes:
        _update_pool(changes)
    return [what.replace("_", "-") for _, what, _ in changes]


def _update_pool(changes: List[Any]) -> None:
    """pools.update, refusing a DONE experiment's job: nothing of it runs again, so a change would apply to
    nothing (an interrupted one's job keeps it for its resume)."""
    from trialkit.control import admin
    from trialkit.platforms import pools

    for experiment_id in dict.fromkeys(experiment for experiment, _, _ in changes):
        if admin.ended_status(experiment_id) == "DONE":
            raise UserError(f"experiment {experiment_id} is DONE: its job has left the resource pool and nothing of "
                            "it runs again", experiment_id, "update a running experiment's job: `trialkit job list "
                            "--pool` lists them")
    pools.update(changes)


def cmd_job_update_batch(opts: argparse.Namespace) -> int:
    targets = [text.partition("=")[0].rpartition(".")[0] for text in opts.updates]
    experiments = [_names_experiment(target) for target in targets]
    if any(experiments):
        from trialkit.platforms import pools

        changes = [pools.parse_change(text) for text in opts.updates]  # every one read before any applies
        if not all(experiments):
            raise UserError("a batch changes either experiments' jobs or trials, not both", "update-batch",
                            "run one update-batch for the experiments and one for the trials")
        _update_pool(changes)
    else:
        _move([Move.parse(text) for text in opts.updates])
    print(f"updated {', '.join(dict.fromkeys(targets))}")
    return 0


def _move(moves: List[Move]) -> None:
    """Send moves to their experiments' managers: one request per experiment, all or none there."""
    from trialkit.control import admin

    by_experiment: Dict[str, List[Move]] = {}
    for move in moves:
        experiment_id = paths.experiment_of(move.trial_id)
        if move.other is not None and paths.experiment_of(move.other) != experiment_id:
            raise UserError(f"{move.trial_id} and {move.other} are in different experiments", move.trial_id,
                            "each experiment schedules its own trials: move a trial next to one of its experiment")
        by_experiment.setdefault(experiment_id, []).append(move)
    for experiment_id, group in by_experiment.items():
        admin.act(experiment_id, "queue", "moves", body={"moves": [m.to_json() for m in group]}, where="TRIAL_ID")


# -- the page -----------------------------------------------------------------------------


def cmd_ui(opts: argparse.Namespace) -> int:
    import socket

    from trialkit.web import serve_ui

    try:
        return serve_ui(opts.experiment_id, opts.port or 0, opts.host)
    except OSError as err:
        name_unknown = isinstance(err, socket.gaierror)  # --host no.such.host
        if err.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES) and not name_unknown:
            raise
        if err.errno == errno.EADDRNOTAVAIL or name_unknown:
            raise UserError(f"cannot listen on {opts.host}: {err.strerror}", "--host",
                            "give an address of this machine, or leave --host out for 127.0.0.1") from None
        raise UserError(f"cannot listen on {opts.host}:{opts.port or 0}: {err.strerror}", "--port",
                        "pick a free port, or leave --port out for any free one") from None


# -- helpers ----------------------------------------------------------------------------


class DamagedStore(UserError):
    def __init__(self, experiment_dir: Path, err: sqlite3.DatabaseError):
        self.reason = str(err)
        super().__init__(f"its store is damaged ({paths.DB_NAME}: {err})", f"experiment {experiment_dir.name}",
                         f"restore {experiment_dir / paths.DB_NAME} from a copy, or remove {experiment_dir}")


def _store(experiment_dir: Path) -> "closing[Store]":
    """The store for reading: read only when its disk takes no writes (StoreUnwritable, a UserError, when it
    cannot be read at all); DamagedStore only when the file itself is no intact store."""
    try:
        return closing(Store.reader(experiment_dir / paths.DB_NAME))
    except sqlite3.DatabaseError as err:
        raise DamagedStore(experiment_dir, err) from None


def _experiment(store: Store, experiment_id: str) -> Dict[str, Any]:
    experiment = store.experiment(experiment_id)
    if experiment is None:
        raise UserError(f"no experiment {experiment_id!r} in its store", "EXPERIMENT_ID", "see `trialkit experiment list`")
    return experiment


def _trial(store: Store, trial_id: str) -> Dict[str, Any]:
    trial = store.trial(trial_id)
    if trial is None:
        raise UserError(f"no trial {trial_id!r}", "TRIAL_ID", f"see `trialkit trial list {paths.experiment_of(trial_id)}`")
    return trial


def _trial_over(experiment_dir: Path, trial_id: str) -> bool:
    with _store(experiment_dir) as store:
        return store.trial(trial_id)["status"] in FINAL_STATUSES


def _write(path: Path, text: str, where: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UserError(f"cannot write {str(path)!r}: {err.strerror}", where, "check the path") from None


def _port_args(port: Optional[int]) -> List[str]:
    return [] if port is None else ["--port", str(port)]


def _detach(argv: List[str], experiment_id: str, experiment_dir: Path, title: str,
            last_port: Optional[int] = None) -> int:
    """Run `trialkit ARGV` in the background (own session, output to manager.log); return once it listens.
    `last_port`: the port of the experiment's earlier run, which the resume goes back to; where it listens on
    another (that one was taken), the line that says so, as a resume in the foreground prints it."""
    from trialkit.control import background
    from trialkit.manager import ports
    from trialkit.web import page_url

    child = background.start(argv, experiment_dir)
    log_path = background.log_path(experiment_dir)
    print(f"{title} experiment {experiment_id}", flush=True)
    info = background.wait_listening(child, experiment_dir, DETACH_WAIT)
    if info is not None:
        if last_port is not None and info.port != last_port:
            print(ports.moved(last_port, ports.holder(last_port), info.url))
        print(f"manager: {info.url}   pid {child.pid}   log: {log_path}")
        print(f"page: {page_url(info.url, info.token, experiment_id)}")
        return 0
    if child.popen.poll() is None:
        print(f"the manager (pid {child.pid}) is still starting; its output goes to {log_path}")
        return 0
    sys.stderr.write(log_path.read_text(errors="replace")[-2000:])
    if title == "started":  # its manager never listened, so no trial ran: no experiment is left to list
        from trialkit.control.run import forget_unstarted

        log_path.unlink(missing_ok=True)
        forget_unstarted(experiment_dir)
    return child.popen.returncode or 1


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"{text!r} is not a number", "--port", "give a port number, 1-65535") from None
    if not 0 < value < 65536:
        raise UserError(f"{value} is out of range", "--port", "give a port number, 1-65535")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise UserError(f"{text!r} is not a trial number", "--trial", "give 0 for the first trial, 1, 2, ...")
    return value


# -- the parser -------------------------------------------------------------------------


class _CommandParser(ArgumentParser):
    """A parser whose own unknown options it refuses itself, pointing at its --help: argparse leaves them to the
    top parser, whose error says "see trialkit --help" for `trialkit experiment list --bogus`. Its
    subcommands' parsers are of its class too (add_subparsers' default)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Tuple[argparse.Namespace, List[str]]:
        namespace, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return namespace, unknown


def build_parser() -> ArgumentParser:
    from trialkit.control.plot import CURVE_PANELS  # light: matplotlib waits for the plot itself

    parser = _CommandParser(
        prog=PROG,
        description="Run hyperparameter experiments: trials on this machine or a cluster, "
        "their metrics kept in the experiment's store.",
        epilog="Exit status: 0 on success (run and resume: at least one trial succeeded, whether the experiment "
        "ended DONE or was stopped), 1 when an experiment ends without a successful trial, 2 for a mistake in the "
        "command or config, 130 for a Ctrl-C before an experiment was made (none is left).",
    )
    parser.add_argument("-V", "--version", action=_Version, nargs=0,
                        help="print trialkit's version and the engines installed beside it, and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, help="one of:")

    run = _command(commands, "run", cmd_run, "run an experiment from its config until it ends",
                   "Start the manager, run the experiment's trials and show their progress; a summary table at the "
                   "end. The first line of output ends with the experiment id.")
    _run_options(run)
    _detach_option(run)
    run.add_argument("--experiment-id", help=argparse.SUPPRESS)  # the detached run's id, chosen by its parent

    render = _command(commands, "render", cmd_render, "print the objects one trial would create on a cluster",
                      "Render what submitting a trial creates on the config's Kubernetes platform, as YAML, "
                      "read as `run` reads it with the same options. Tokens are left out; parameters are what the "
                      "tuner would propose; comments above the objects say what a run fills in otherwise.")
    _run_options(render)
    render.add_argument("--trial", type=_count, default=0, metavar="N",
                        help="which trial to render: 0 for the first (default), 1 for the second, ...")
    render.add_argument("-o", "--output", metavar="DIR", help="write DIR/<trial id>.yaml instead of printing (DIR is made if missing)")

    experiment = _command(commands, "experiment", None, "list, inspect, stop, resume, export or plot experiments",
                          "Commands on experiments, found by id under $TRIALKIT_HOME/experiments.")
    sub = experiment.add_subparsers(dest="action", metavar="ACTION", required=True, help="one of:")
    _command(sub, "list", cmd_experiment_list, "list the experiments", "One line per experiment: id, name, status, "
             "trials (how many it made so far, then each count that is not 0 of those that succeeded, failed, "
             "stopped early, are paused, were canceled, run or wait: 10 (8 succeeded, 2 failed)), creation time; "
             "newest first, as the page lists them. INTERRUPTED: its manager is gone; resume it (its trials "
             "that were running are counted as what is known of them: running unwatched, lost, ended unwatched).")
    _experiment_id(_command(sub, "show", cmd_experiment_show, "show an experiment and its trials",
                            "The experiment's settings, status, best trial and a table of its trials; for a "
                            "STOPPED one, last, the `experiment resume` that takes it up again."))
    _experiment_id(_command(sub, "stop", cmd_experiment_stop, "stop a running experiment",
                            "Ask the experiment's manager to stop: its trials are stopped gracefully and the "
                            "manager exits; waits until it has. A trial that saved a checkpoint, or that a round of "
                            "Hyperband or BOHB or a generation of PBT waits for or goes on from (its checkpoint "
                            "perhaps unsaved), is PAUSED, and `experiment resume` runs it again; any other is "
                            "USER_CANCELED."))
    resume = _experiment_id(_command(sub, "resume", cmd_experiment_resume,
                                     "go on with a stopped or interrupted experiment",
                                     "Rebuild the tuner from the stored results, reattach to trials still running, "
                                     "run again the trials a stop paused or left waiting, restart lost ones, and go "
                                     "on until the experiment ends (a DONE one has nothing left to run: it is said)."))
    _port_option(resume, "the manager's port (default: the port it had, where running trials deliver)")
    _detach_option(resume)
    _experiment_id(_command(sub, "pause", cmd_experiment_pause, "pause a running experiment",
                            "Pause every running trial the graceful way (SIGTERM: it checkpoints and exits 143; "
                            "shown as PAUSED) and start nothing, not even new trials from the tuner, until activated."))
    _experiment_id(_command(sub, "activate", cmd_experiment_activate, "go on with a paused experiment",
                            "Queue its paused trials again (each restarts from its checkpoint, in the same dirs, with "
                            "the restart count + 1) and start trials again."))
    update = _experiment_id(_command(sub, "update", cmd_experiment_update,
                                     "change an experiment's limits, running or ended",
                                     "nnictl update's set: the trials run at once, the most trials, the longest run, "
                                     "the search space (its tuner starts over on it, told every trial so far). "
                                     "Checked as the config is, and kept for a resume. An ended (DONE, STOPPED, "
                                     "ERROR) experiment's are kept for its resume, which goes on while they leave "
                                     "it room (a DONE one given a larger --max-trial-number runs the trials it "
                                     "adds); an interrupted one is resumed first. --priority and --weight change a "
                                     "running or waiting experiment's job."))
    update.add_argument("--trial-concurrency", type=int, metavar="N", help="trials that run at once")
    update.add_argument("--max-trial-number", type=int, metavar="N", help="the most trials the experiment runs")
    update.add_argument("--max-experiment-duration", metavar="D", help="how long it may run in all: 30m, 2h, 1d")
    update.add_argument("--search-space", metavar="FILE", help="a new search space (JSON or YAML file)")
    update.add_argument("--priority", type=int, metavar="N",
                        help="its job's priority in its resource pool, as `job update --priority` (smaller first)")
    update.add_argument("--weight", type=float, metavar="W",
                        help="its job's weight in a fair_share resource pool, as `job update --weight`")
    imports = _experiment_id(_command(sub, "import", cmd_experiment_import, "teach a running experiment's tuner "
                                      "results from elsewhere",
                                      "Results from an earlier experiment (`trialkit experiment export` JSON, or "
                                      "nnictl's export) go to the tuner as if its own trials had found them. They "
                                      "are not kept over a resume."))
    imports.add_argument("-f", "--file", required=True, metavar="FILE", help="the results, a JSON list")
    delete = _experiment_id(_command(sub, "delete", cmd_experiment_delete, "delete a stopped experiment",
                                     "Remove what the experiment's platform made for it (a cluster's jobs, "
                                     "ConfigMaps, Secrets, checkpoint and TensorBoard claims; a local one's job in "
                                     "the home's resource pools, pools.db), its checkpoints "
                                     "in an object store (checkpointStorage), then its dir and store. Asks first; "
                                     "a running experiment is refused, as is an interrupted one whose trials "
                                     "still run unwatched (resume it, then stop it)."))
    delete.add_argument("--yes", action="store_true", help="delete without asking")
    _experiment_id(_command(sub, "tensorboard", cmd_experiment_tensorboard,
                            "serve an AdaptDL experiment's TensorBoard (a local one's: print how)",
                            "AdaptDL: start TensorBoard (a Deployment and a Service) over the experiment's TensorBoard "
                            "claim, where each trial writes its dir, as NNI's adl mode does, and print how to reach "
                            "it. Asked again, it keeps what runs; it goes when the experiment ends. Local: print the "
                            "tensorboard command over the dir its trials wrote theirs in (DIR/EXPERIMENT_ID/TRIAL_ID, "
                            "DIR from TRIALKIT_TENSORBOARD_DIR in the environment of the run, or of its latest resume that set it)."))
    export = _experiment_id(_command(sub, "export", cmd_experiment_export, "export every trial's results",
                                     "Every trial with its parameters, status, exit code, steps, intermediate and "
                                     "final metrics, as JSON (a list of trials) or CSV (a line per trial, flat: a "
                                     "column per metric of its latest reports, latest.NAME)."))
    # nnictl's spellings too (--type, -f/--filename): an NNI user's muscle memory works as written.
    export.add_argument("--format", "--type", choices=("json", "csv"), default="json",
                        help="output format (default json; --type is nnictl's spelling)")
    export.add_argument("-o", "--output", "-f", "--filename", metavar="FILE",
                        help="write to FILE instead of standard output (-f/--filename: nnictl's spelling)")
    export.add_argument("--all-runs", action="store_true",
                        help="a row per run of each trial (a restarted trial starts a new run), each with that run's "
                             "own status and reports as they came; default: a row per trial, its runs as one series "
                             "(a later run's report at a step replacing an earlier one's)")
    plot = _experiment_id(_command(sub, "plot", cmd_experiment_plot, "plot an experiment's metrics to a PNG",
                                   "Each trial's intermediate results against their step (Determined's "
                                   "steps_completed: batches), every run of a trial as one curve, a panel per "
                                   "metric; then the final metric against each parameter, on its search space's "
                                   "axis (log for loguniform and lognormal, the options of a choice), in one PNG."))
    plot.add_argument("-o", "--output", metavar="FILE.png", required=True,
                      help="the PNG file to write (a directory: <experiment id>.png inside it)")
    plot.add_argument("--metric", action="append", metavar="NAME",
                      help=f"a metric to draw, by the name the trials report it: default, a key of a dict "
                           f"metric (loss), a Determined metric (accuracy; validation.loss or training.loss where "
                           f"two groups report loss); again for more (default: the first {CURVE_PANELS} the trials "
                           f"report, default or the first validation metric first)")

    trial = _command(commands, "trial", None, "list, inspect, follow or kill trials",
                     "Commands on trials, found by id (<experiment id>-<sequence>).")
    sub = trial.add_subparsers(dest="action", metavar="ACTION", required=True, help="one of:")
    _experiment_id(_command(sub, "list", cmd_trial_list, "list an experiment's trials",
                            "One line per trial: status, final metric, steps (the last step reported, where the "
                            "trial reports steps, as Determined's steps_completed; else how many results it "
                            "reported), duration (the time its runs ran, summed, a run still going counted to now: the "
                            "time it stood paused or its experiment stopped counts not, as in the export and on the "
                            "page), parameters, and why where a trial says (what it waits for, why it "
                            "failed; cut to the terminal's width, whole in `trial show`). A restarted trial's runs "
                            "count as one.",
                            aliases=["ls"]))
    _trial_id(_command(sub, "show", cmd_trial_show, "show one trial",
                       "The trial's status, exit code, parameters (and the trial whose checkpoint it went on from: "
                       "PBT's, with its member and step; Hyperband's and BOHB's, its configuration's round before), "
                       "metrics, dir and status history; for an elastic "
                       "AdaptDL job (adaptdl-ray), its workers now, the speedup the goodput model predicts for each "
                       "count and why it last rescaled."))
    logs = _trial_id(_command(sub, "logs", cmd_trial_logs, "print a trial's output",
                              "The trial's output as its keeper shipped it to the manager, on every platform "
                              "(stdout and stderr, in chunks of whole lines; each distributed worker's lines "
                              "start with [rank=N]); for a trial whose keeper shipped nothing, its log file on "
                              "this machine. A trial that printed nothing is said so on stderr, with the file its "
                              "command sent its output to (`python3 train.py > train.log`) and where it is."))
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the trial ends")
    logs.add_argument("--rank", type=int, metavar="N", help="only the lines of rank N ([rank=N] ...), or what pod N of a "
                      "multi-pod Kubernetes trial shipped (its rank: Master 0 then Workers; task roles in order)")
    _trial_id(_command(sub, "kill", cmd_trial_kill, "stop a running trial",
                       "Stop the trial gracefully (SIGTERM path, USER_CANCELED). It counts toward maxTrialNumber; "
                       "the slot it frees goes to the tuner's next trial, if there is one (a PBT generation goes on "
                       "without it, the killed member ranked last; one killed after its final result keeps it, and "
                       "the trials that go on from it start from what it left, with a warning). A waiting or paused "
                       "trial ends without starting again."))
    _trial_id(_command(sub, "pause", cmd_trial_pause, "pause a trial, keeping its progress",
                       "Stop the trial the graceful way (SIGTERM: it saves a checkpoint and exits 143) and free its "
                       "slot; it is PAUSED, its dirs kept, until activated (trials that go on from its checkpoint wait "
                       "for its end, saying so). A waiting trial leaves the queue."))
    _trial_id(_command(sub, "activate", cmd_trial_activate, "queue a paused trial to resume",
                       "Put a paused trial back in the job queue; it restarts in the same trial and checkpoint dirs "
                       "with TRIALKIT_RESTART_COUNT one higher, and resumes from its checkpoint."))

    job = _command(commands, "job", None, "see and reorder the job queue",
                   "The job queue: trials that run, wait for a slot (in the order they will start: smaller priority "
                   "first, then position) or are paused. A trial's id is its job id.")
    sub = job.add_subparsers(dest="action", metavar="ACTION", required=True, help="one of:")
    listing = _command(sub, "list", cmd_job_list, "list the jobs in scheduling order",
                       "Position, id, experiment, name, priority, submitted, slots (acquired/needed) and status "
                       "(RUNNING, SCHEDULED: being started, QUEUED, PAUSED) of the trials of every running experiment.", aliases=["ls"])
    which = listing.add_mutually_exclusive_group()
    which.add_argument("--experiment", metavar="EXPERIMENT_ID", help="only this experiment's jobs")
    which.add_argument("--pool", "--resource-pool", dest="pool", nargs="?", const="default", metavar="NAME",
                       help="the jobs of this TRIALKIT_HOME's resource pool (default: default): its local "
                            "experiments, in the order its free slots go to them (by its scheduler: priority, "
                            "smaller first, then submitted; fair_share: the fewest slots for its weight first)")
    shape = listing.add_mutually_exclusive_group()
    shape.add_argument("--json", dest="format", action="store_const", const="json", help="print JSON")
    shape.add_argument("--csv", dest="format", action="store_const", const="csv", help="print CSV")
    update = _trial_id(_command(sub, "update", cmd_job_update, "change a waiting job's priority or place",
                                "Change the priority of a waiting or paused trial, or move a waiting trial just "
                                "ahead of or behind another waiting trial of its experiment (it takes that one's "
                                "priority). A running trial cannot be moved."))
    how = update.add_mutually_exclusive_group(required=True)
    how.add_argument("--priority", type=_priority, metavar="N",
                     help="the new priority, smaller starts first: a trial's within its experiment; an experiment's "
                          "(its id as TRIAL_ID) in the resource pool, whose next free slots go to the smallest "
                          "(default 42); in a Kueue pool, a trial's WorkloadPriorityClass by name, changed while its "
                          "job waits")
    how.add_argument("--weight", type=float, metavar="W",
                     help="an experiment's fair share weight in a fair_share resource pool (default 1): the pool's "
                          "slots are divided among the jobs that want them in proportion to their weights")
    how.add_argument("--resource-pool", metavar="NAME",
                     help="move an experiment's job to this pool of pools.yml: its next trials take their slots "
                          "there; running trials keep theirs until they end")
    how.add_argument("--ahead-of", metavar="TRIAL_ID",
                     help="start just before this waiting trial (an experiment: just before that experiment's job)")
    how.add_argument("--behind-of", metavar="TRIAL_ID",
                     help="start just after this waiting trial (an experiment: just after that experiment's job)")
    batch = _command(sub, "update-batch", cmd_job_update_batch, "change several jobs at once",
                     "Each update is TRIAL_ID.priority=N, TRIAL_ID.ahead-of=TRIAL_ID or TRIAL_ID.behind-of=TRIAL_ID; "
                     "an experiment's updates are applied in order, all or none. With experiment ids instead, they "
                     "change the experiments' jobs in the resource pool (smaller priority first), in order, all or "
                     "none; there ID.weight=W and ID.resource-pool=NAME too.")
    batch.add_argument("updates", nargs="+", metavar="UPDATE",
                       help="ID.priority=N, ID.ahead-of=ID2 or ID.behind-of=ID2; an experiment's ID.weight=W, "
                            "ID.resource-pool=NAME")

    checkpoint = _command(commands, "checkpoint", None, "list, inspect, fetch or delete checkpoints",
                          "The checkpoints of an experiment or of one trial (ID: either id), wherever the "
                          "experiment keeps them (checkpointStorage: the trials' checkpoint dirs, or an object "
                          "store, read with the credentials of this environment). A checkpoint is listed once "
                          "whole. UUID may be the first characters of one (at least 4).")
    sub = checkpoint.add_subparsers(dest="action", metavar="ACTION", required=True, help="one of:")
    listing = _checkpoint_id(_command(sub, "list", cmd_checkpoint_list, "list checkpoints",
                                      "One line per checkpoint, oldest first: uuid, trial, steps (Determined's "
                                      "steps_completed), the metric it is judged by, size, the retention rules "
                                      "that keep it (checkpointStorage's saveTrialLatest, saveTrialBest, "
                                      "saveExperimentBest) and where it lives.", aliases=["ls"]))
    listing.add_argument("--json", action="store_true", help="print JSON: each checkpoint's manifest, metric, "
                         "where and kept_by")
    _checkpoint_uuid(_checkpoint_id(_command(sub, "show", cmd_checkpoint_show, "show one checkpoint",
                                             "Its trial and run, steps, metric, when it was saved, size, where "
                                             "it lives, what keeps it, its metadata and its files.",
                                             aliases=["describe"])))
    download = _checkpoint_uuid(_checkpoint_id(_command(sub, "download", cmd_checkpoint_download,
                                                        "copy a checkpoint's files to a directory",
                                                        "Every file of the checkpoint, sizes checked, into a new "
                                                        "directory (made whole beside it, then moved there).")))
    download.add_argument("-o", "--output", metavar="DIR", help="where to put it (default: ./UUID)")
    delete = _checkpoint_id(_command(sub, "delete", cmd_checkpoint_delete, "delete checkpoints",
                                     "Delete checkpoints from where they are kept (and a trial's local copy on "
                                     "this machine); their manifest goes first, so none is ever half listed. "
                                     "Every UUID is checked before any is deleted. Asks first (y/N), unless --yes."))
    delete.add_argument("uuids", nargs="+", metavar="UUID", help="the checkpoints to delete")
    delete.add_argument("--yes", action="store_true", help="delete without asking")

    ui = _command(commands, "ui", cmd_ui, "serve the web page over stored experiments",
                  "Serve the page (read-only) over one experiment or every one under $TRIALKIT_HOME, after their "
                  "managers ended; prints its URL with a token. A running experiment's manager serves its own page "
                  "(`trialkit run` prints its URL): `trialkit ui ID` of one prints that live page's address and "
                  "exits, serving no copy.")
    ui.add_argument("experiment_id", metavar="EXPERIMENT_ID", nargs="?", help="only this experiment (default: all)")
    _port_option(ui, "the port to serve on (default: any free one)")
    ui.add_argument("--host", default="127.0.0.1", metavar="H",
                    help="the address to listen on (default 127.0.0.1: this machine only)")
    return parser


ENGINES = ("torch", "deepspeed", "horovod", "adaptdl", "ray", "kubernetes", "optuna", "obstore")


def version_text() -> str:
    """trialkit's version, then each engine's as its installed distribution says (none is imported)."""
    from importlib import metadata

    from trialkit import __version__

    lines = [f"{PROG} {__version__} (Python {sys.version.split()[0]}, {sys.executable})"]
    for name in ENGINES:
        try:
            lines.append(f"  {name:<11} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            lines.append(f"  {name:<11} not installed")
    return "\n".join(lines)


class _Version(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        print(version_text())
        parser.exit()


def _command(commands: Any, name: str, func: Optional[Callable[[argparse.Namespace], int]], summary: str,
             description: str, aliases: Sequence[str] = ()) -> ArgumentParser:
    parser = commands.add_parser(name, help=summary, description=description, aliases=list(aliases))
    parser.set_defaults(func=func)
    return parser


def _experiment_id(parser: ArgumentParser) -> ArgumentParser:
    parser.add_argument("experiment_id", metavar="EXPERIMENT_ID", help="the experiment's id (see `trialkit experiment list`)")
    return parser


def _trial_id(parser: ArgumentParser) -> ArgumentParser:
    parser.add_argument("trial_id", metavar="TRIAL_ID", help="the trial's id, like abcd1234-00003 (see `trialkit trial list`)")
    return parser


def _checkpoint_id(parser: ArgumentParser) -> ArgumentParser:
    parser.add_argument("id", metavar="ID", help="an experiment's id, or a trial's (abcd1234-00003) for its own")
    return parser


def _checkpoint_uuid(parser: ArgumentParser) -> ArgumentParser:
    parser.add_argument("uuid", metavar="UUID", help="the checkpoint's uuid (see `trialkit checkpoint list ID`)")
    return parser


def _port_option(parser: ArgumentParser, text: str = "the manager's port (default: any free one)") -> None:
    parser.add_argument("--port", type=_port, metavar="P", help=text)


def _run_options(parser: ArgumentParser) -> None:
    """The config and the manager's address options: `run`'s, and `render`'s to show what that run sends."""
    parser.add_argument("config", metavar="CONFIG", help="the experiment's config file (NNI's v2 or v1 YAML, or "
                        "a Determined experiment config)")
    parser.add_argument("context_dir", metavar="CONTEXT_DIR", nargs="?",
                        help="a Determined config's context directory, as `det experiment create CONFIG CONTEXT_DIR` "
                        "takes it (default: the config's directory)")
    _port_option(parser)
    parser.add_argument("--tls-cert", metavar="FILE", help="serve the manager over HTTPS with this PEM certificate "
                        "(chain), for trials and the page (config: managerTls.certFile); needs --tls-key")
    parser.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert (managerTls.keyFile)")


def _detach_option(parser: ArgumentParser) -> None:
    parser.add_argument("--detach", action="store_true",
                        help="run in the background (output to the experiment's manager.log) and return at once")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        opts = parser.parse_args(sys.argv[1:] if argv is None else argv)
        return opts.func(opts)
    except UserError as err:
        report_and_exit(PROG, err)
    except sqlite3.DatabaseError as err:  # found while reading an open store (a row that is not what it should be)
        report_and_exit(PROG, UserError(f"the experiment's store cannot be read: {err}", fix="see `trialkit experiment list`"))
    except KeyboardInterrupt:  # `trial logs -f`, a wait: the user is done watching
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly as Unix tools do, and
        # point stdout at /dev/null so the interpreter's final flush cannot fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as err:
        cluster_said(err)
        raise


def cluster_said(err: Exception) -> None:
    """A Kubernetes API server that refused or did not answer a command (job list of a Kueue pool, job update,
    experiment tensorboard, ...): one line and exit 2, as `trialkit run` says it. client.py is in sys.modules
    whenever its ClusterError was raised: no command that reaches no cluster imports it here."""
    client = sys.modules.get("trialkit.platforms.kubernetes.client")
    if client is not None and isinstance(err, client.ClusterError):
        report_and_exit(PROG, UserError(str(err), "KUBECONFIG",
                                        "check the cluster in your kubeconfig, and that it is up"))


if __name__ == "__main__":
    sys.exit(main())
