"""The page's routes on the manager's server.

    GET  /                                   the page (index.html)
    GET  /oview, /detail                     NNI's page addresses: 302 to the matching view (NNI_PAGES)
    GET  /static/<name>                      app.js, app.css, plotly-<hash>.min.js
    GET  /api/ui/info                        {"read_only", "actions": [offered actions]}
    GET  /api/ui/events                      server-sent events: `change` when a store was written
    GET  /api/ui/experiments                 [{id, name, status, trials, counts, best, elapsed, ...}]
    GET  /api/ui/experiments/<exp>           overview: counts by status, budget, best trial, search space, config
    GET  /api/ui/experiments/<exp>/trials    one page of trials: ?status=A,B&metric=EXPR&p:NAME=EXPR
                                             &sort=sequence|id|status|metric|restarts|duration|p:NAME
                                             &order=asc|desc&offset=N&limit=N (EXPR: a..b, >=x, <x, =x, text)
                                             [&with=curves&trials=ID,ID&curve=NAME: with "curves", the curves
                                             route's answer for those trials and metric, of the same state];
                                             and the experiment's {name, status}, as /hyper and /queue
    GET  /api/ui/experiments/<exp>/curves    ?trials=ID,ID (else the 10 best)&metric=NAME: one metric's values per
                                             step, every run of a trial as one series; the names reported
    GET  /api/ui/experiments/<exp>/hyper     parameters and final metric of finished trials, column-wise
    GET  /api/ui/experiments/<exp>/queue     {trials: running, waiting (scheduling order), paused; experiment}
    GET  /api/ui/experiments/<exp>/pool      the jobs of the home's resource pool it is in, every experiment's:
                                             {"pool", "scheduler", "jobs": [`job list --pool`'s rows +
                                             experiment_name], "can_update"}
    POST /api/ui/experiments/<exp>/pool      {"updates": [{"job": EXPERIMENT_ID, "priority": N | "ahead_of": ID
                                             | "behind_of": ID | "weight": W | "top": true}]}: `job update`'s
                                             changes (top: Move to Top), in order, all or none; answers as GET
    GET  /api/ui/experiments/<exp>/trials/<trial>       one trial: parameters, history, dirs, logs, elastic sizing
    GET  /api/ui/experiments/<exp>/trials/<trial>/log   ?name=stdout|stderr|trial&offset=N: the log from N
    POST /api/ui/experiments/<exp>/trials/<trial>/<action>   kill | pause | activate | priority {"priority": N}

Every /api/ui route needs `Authorization: Bearer <the page's token>` (derived
from the admin token, good for these routes only: trialkit.web.guard) and
refuses cross-site requests, both on the headers before a body is read. A
read-only page (`trialkit ui`) has no action route at all. Answers are strict
JSON (NaN and infinities as strings); /api/ui/info also says what is wrong
with the manager's disk, if anything (`disk`).
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Tuple, Union
from urllib.parse import quote, urlencode

try:
    import orjson  # the control extra installs it (setup.py); without it, answers are json's
except ImportError:  # pragma: no cover - depends on the install
    orjson = None

from trialkit.control import actions, checkpoints
from trialkit.control.actions import Performer
from trialkit.errors import UserError
from trialkit.manager import paths
from trialkit.manager.server import HttpError, ManagerServer, Raw, Request, Stream
from trialkit.manager.store import DB_NAME, Store
from trialkit.web import address, events, guard, logtail, queries
from trialkit.web.assets import Assets
from trialkit.web.catalog import Catalog

Answer = Tuple[int, Any]
# NNI's web portal addresses (its printed links, users' bookmarks) -> the view of this page that shows the same,
# after `#/exp/<id>` when the page holds one experiment (a running manager's), else the list of experiments.
NNI_PAGES = {"/oview": "", "/detail": "/trials"}


def install(server: ManagerServer, store: Union[Store, Catalog], *, admin_token: str, read_only: bool,
            performer: Optional[Performer] = None) -> Catalog:
    """Add the page and its API to the server, opened by the page's token for `admin_token`.

    `store`: the manager's own, or a Catalog of stored experiments.
    """
    catalog = store if isinstance(store, Catalog) else Catalog(lambda: [store.path])
    _Routes(server, catalog, address.page_token(admin_token), read_only, performer).add()
    return catalog


class _Routes:
    def __init__(self, server: ManagerServer, catalog: Catalog, token: str, read_only: bool,
                 performer: Optional[Performer]):
        self.server = server
        self.catalog = catalog
        self.token = token
        self.read_only = read_only
        self.performer = performer  # the experiment loop, where trials can be acted on
        self.assets = Assets()

    def add(self) -> None:
        add = self.server.router.add
        # The page and its small files (uPlot: the cold page waits for both) are answered on the server's loop: the
        # pool's two thread switches took longer than the answer. The plotly bundles go on in the pool (the full one
        # is gzipped at its first request, ~0.2 s, which the keepers' batches would wait for on the loop).
        for path, handler in [("/", lambda r: self.assets.page(r.headers)),
                              *[(f"/static/{name}", lambda r, name=name: self.assets.file(name, r.headers))
                                for name in self.assets.small()]]:
            add("GET", path, handler)
            self.server.on_loop(handler)
        add("GET", "/static/<name>", lambda r: self.assets.file(r.params["name"], r.headers))
        for path, view in NNI_PAGES.items():
            add("GET", path, lambda r, view=view: self._nni_page(r, view))
        exp = "/api/ui/experiments/<exp>"
        for method, pattern, handler in [
            ("GET", "/api/ui/info", self._info),
            ("GET", "/api/ui/events", self._events),
            ("GET", "/api/ui/experiments", self._experiments),
            ("GET", exp, self._experiment),
            ("GET", exp + "/trials", self._trials),
            ("GET", exp + "/curves", self._curves),
            ("GET", exp + "/hyper", self._hyper),
            ("GET", exp + "/queue", self._queue),
            ("GET", exp + "/pool", self._pool),
            ("GET", exp + "/trials/<trial>", self._trial),
            ("GET", exp + "/trials/<trial>/log", self._log),
            ("GET", exp + "/trials/<trial>/checkpoints", self._checkpoints),
        ] + ([] if self.read_only else [("POST", exp + "/trials/<trial>/<action>", self._action),
                                         ("POST", exp + "/pool", self._pool)]):
            add(method, pattern, self._answered(handler), lambda request: guard.check(request, self.token))

    def _nni_page(self, request: Request, view: str) -> Tuple[int, Raw]:
        """A redirect to the view NNI's page address names; the query (the page's token) goes along."""
        ids = self.catalog.experiment_ids()
        target = "/" + (f"?{urlencode(request.query)}" if request.query else "")
        if len(ids) == 1:
            target += f"#/exp/{quote(ids[0], safe='')}{view}"
        return 302, Raw(b"", "text/plain", {"Location": target})

    @staticmethod
    def _answered(handler: Callable[[Request], Any]) -> Callable[[Request], Answer]:
        def serve(request: Request) -> Answer:
            answer = handler(request)
            return (200, answer) if isinstance(answer, Stream) else (200, _json(answer))
        return serve

    # -- reads -------------------------------------------------------------------------
    def _info(self, request: Request) -> Any:
        return {"read_only": self.read_only, "actions": [] if self.read_only or self.performer is None else actions.names("trial"),
                "disk": self.server.disk.problem}

    def _events(self, request: Request) -> Stream:
        return Stream(events.changes(self.catalog, self.server.stopping), "text/event-stream",
                      {"Cache-Control": "no-store"})

    def _experiments(self, request: Request) -> Any:
        out = []
        for experiment_id in self.catalog.experiment_ids():
            try:
                with self._reading(experiment_id) as db:
                    out.append(queries.summary(db, experiment_id))
            except HttpError as err:  # a store that cannot be read is a line of the list, as `experiment list` says
                out.append({"id": experiment_id, "name": None, "status": "UNREADABLE", "reason": err.reason,
                            "created": 0, "updated": 0, "elapsed": 0, "trials": 0, "counts": {},
                            "optimize_mode": "maximize", "best": None})
        return sorted(out, key=lambda e: e["created"], reverse=True)

    @contextmanager
    def _reading(self, experiment_id: str) -> Iterator[Any]:
        """The experiment's store to read; 409 with the reason when it is no store or its disk refuses it."""
        try:
            with self.catalog.database(experiment_id).reading() as db:
                yield db
        except sqlite3.DatabaseError as err:
            raise HttpError(409, f"experiment {experiment_id}'s store cannot be read: {err}") from None

    def _read(self, request: Request, query: Callable[..., Any], *args: Any) -> Any:
        experiment_id = request.params["exp"]
        with self._reading(experiment_id) as db:
            return query(db, experiment_id, *args)

    def _experiment(self, request: Request) -> Any:
        return self._read(request, queries.experiment)

    def _trials(self, request: Request) -> Any:
        """A page of trials; with=curves adds the trials view's curves: its data in one answer, which a cold page
        waits for once (each request to a loaded machine's manager waits its turn: bench/bench_web.py)."""
        q = queries.TrialQuery.from_query(request.query)
        extra = request.query.get("with")
        if extra not in (None, "curves"):
            raise HttpError(400, f"with={extra!r}: only with=curves adds to a page of trials")
        with self._reading(request.params["exp"]) as db:
            page = queries.trials_page(db, request.params["exp"], q)
            if extra == "curves":
                page["curves"] = _curves_of(db, request.params["exp"], request.query.get("trials", ""),
                                            request.query.get("curve", ""))
        return page

    def _curves(self, request: Request) -> Any:
        return self._read(request, _curves_of, request.query.get("trials", ""), request.query.get("metric", ""))

    def _hyper(self, request: Request) -> Any:
        return self._read(request, queries.hyperparameters)

    def _queue(self, request: Request) -> Any:
        order = None
        if self.performer is not None:
            order = self.performer.perform(actions.find("queue", "order"), None, {})["queue"]
        with self._reading(request.params["exp"]) as db:
            return {"trials": queries.queue(db, request.params["exp"], order),
                    "experiment": queries.heading(db, request.params["exp"])}

    def _pool(self, request: Request) -> Any:
        """The pool's jobs (GET), or changes to them (POST), through the action table: the loop knows its pool."""
        with self._reading(request.params["exp"]):
            pass  # 404 unless the experiment is this page's
        if self.performer is None:
            raise HttpError(501, "the resource pool's jobs are shown by a running experiment's page")
        if request.method == "POST":
            answer = self.performer.perform(actions.find("pool", "update"), None, request.json())
        else:
            answer = self.performer.perform(actions.find("pool", "jobs"), None, {})
        for job in answer["jobs"]:
            job["experiment_name"] = queries.experiment_name(paths.experiments_root() / job["experiment"] / DB_NAME,
                                                             job["experiment"])
        return {**answer, "can_update": not self.read_only}

    def _trial(self, request: Request) -> Any:
        return self._read(request, queries.trial, request.params["trial"])

    def _checkpoints(self, request: Request) -> Any:
        """The trial's checkpoints wherever its experiment keeps them, with the rules that keep each (what
        `trialkit checkpoint list TRIAL` prints); an object store that cannot be read is 502, saying why."""
        experiment_id, trial_id = request.params["exp"], request.params["trial"]
        with self._reading(experiment_id) as db:
            queries.trial(db, experiment_id, trial_id)  # 404 unless it is this experiment's trial
        store = Store.reader(self.catalog.database(experiment_id).path)
        try:
            config = store.experiment(experiment_id)["config"]
            entries = checkpoints.catalog(store, experiment_id, config, trial_id)
        except UserError as err:
            raise HttpError(502, err.what) from None
        finally:
            store.close()
        return {"where": checkpoints.where_kept(checkpoints.storage_of(config)),
                "checkpoints": [{"uuid": e.checkpoint.uuid, "run": e.checkpoint.run, "steps": e.checkpoint.steps,
                                 "metric": e.metric, "size": e.checkpoint.size, "time": e.checkpoint.time,
                                 "where": e.checkpoint.where, "kept_by": e.rules} for e in entries]}

    def _log(self, request: Request) -> Any:
        """The trial's log file where this machine has it, else what its keeper shipped (cluster trials)."""
        trial, name = request.params["trial"], request.query.get("name", "stdout")
        path = self._read(request, queries.trial_log_path, trial, name)
        offset, rank = _count(request, "offset"), _count(request, "rank")
        if path and os.path.exists(path):
            part = logtail.read(path, offset)
        else:
            part = logtail.read_shipped(self._read(request, queries.shipped_log, trial, name, offset or 0), offset)
        if rank is not None:
            part["text"] = logtail.only_rank(part["text"], rank)
        return part

    # -- actions -------------------------------------------------------------------------
    def _action(self, request: Request) -> Any:
        trial_id = request.params["trial"]
        self._read(request, queries.trial, trial_id)  # 404 unless the trial is this experiment's
        name, offered = request.params["action"], actions.names("trial")
        if name not in offered:
            raise HttpError(404, f"no action {name!r} (one of {', '.join(offered)})")
        if self.performer is None:
            raise HttpError(501, f"{name} is not available in this manager")
        body = request.json() if request.body else {}
        if not isinstance(body, dict):
            raise HttpError(400, "expected a JSON object")
        # Marked as the page's, so that a trial it kills says so (not `trialkit trial kill`).
        self.performer.perform(actions.find("trial", name), trial_id, {**body, "by": "page"})
        return {"ok": True, "at": time.time()}


def _curves_of(db: sqlite3.Connection, experiment_id: str, chosen: str, metric: str) -> Any:
    """The curves of the trials in `chosen` (ID,ID; none: the best): the curves route's answer, and the trials'."""
    return queries.curves(db, experiment_id, [t for t in chosen.split(",") if t], queries.CURVE_TOP, metric)


def _json(answer: Any) -> Raw:
    if orjson is not None and _all_finite(answer):
        try:  # the trials view's answer in 0.16 ms, not json's 0.55 (its curves' thousand floats), the check included
            return Raw(orjson.dumps(answer, option=_ORJSON_REFUSES), "application/json", {"Cache-Control": "no-store"})
        except TypeError:  # orjson.JSONEncodeError: a whole number past 64 bits, a key that is no string, ...
            pass  # json's way, which writes them or refuses as before
    try:
        body = json.dumps(answer, allow_nan=False, separators=(",", ":"))
    except ValueError:  # NaN or an infinity somewhere (a trial's own values): strict JSON has no such numbers
        body = json.dumps(_finite(answer), separators=(",", ":"))
    return Raw(body.encode(), "application/json", {"Cache-Control": "no-store"})


# Only the plain JSON types go orjson's way; it refuses the rest, which json's way then writes or refuses as before:
# subclasses of them (a NaN inside one would pass _all_finite), dataclasses and dates (json refuses both).
_ORJSON_REFUSES = (orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
                   if orjson is not None else 0)


def _all_finite(value: Any) -> bool:
    """Whether no float in the answer is NaN or an infinity, which orjson would write as null."""
    kind = type(value)
    if kind is float:
        return value - value == 0.0
    if kind is dict:
        return all(map(_all_finite, value.values()))
    if kind is list or kind is tuple:
        return all(map(_all_finite, value))
    return True


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _count(request: Request, key: str) -> Optional[int]:
    """A whole-number query parameter (ASCII digits, within int64), or None when absent."""
    raw = request.query.get(key)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise HttpError(400, f"{key} is a whole number")
    return int(raw)
