"""An experiment's checkpoints as the control plane sees them: where they are kept, which are kept, and why.

    storage = parse_storage(section)               # the config's checkpointStorage (NNI form; Determined's
                                                   # checkpoint_storage is translated to it)
    entries = catalog(store, experiment_id, config)   # each checkpoint, its metric, the rules that keep it
    deleted = collect(store, experiment_id, config)   # what no rule keeps, of trials not running, deleted

The retention policy is Determined's: `saveTrialLatest` newest of each
trial, `saveTrialBest` best of each trial and `saveExperimentBest` best of the
experiment, by the searcher's metric (the trial's `default`) of the
validation reported at the checkpoint's steps (a checkpoint of a trial that
is not Core API's, its whole dir at a run's end: the last metric reported
before it). A checkpoint no rule keeps is deleted, once its trial is not
running (a running trial's validation may still come). A checkpoint without
a metric is never "best". Without checkpointStorage every checkpoint is kept.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Set, Tuple

from trialkit import records, schema
from trialkit.checkpoints import OBJECT_TYPES, Checkpoint, local_checkpoints, store_url
from trialkit.control.results import run_starts
from trialkit.errors import UserError
from trialkit.statuses import PREEMPTED, RUNNING, WAITING

SECTION = "checkpointStorage"
TYPES = ("local",) + OBJECT_TYPES
KEYS = ("type", "bucket", "container", "prefix", "endpointUrl", "region", "accountUrl", "secretName",
        "saveExperimentBest", "saveTrialBest", "saveTrialLatest")
NEEDS = {"s3": "bucket", "gcs": "bucket", "azure": "container"}
ALLOWED = {"local": (), "s3": ("bucket", "prefix", "endpointUrl", "region"), "gcs": ("bucket", "prefix"),
           "azure": ("container", "prefix", "accountUrl")}
KEEP_ALL = "kept: no retention policy"
LOCAL_ONLY = "not stored: only in its trial's checkpoint dir"
# A paused or preempted trial starts again from its latest checkpoint: no rule of Determined's takes that from it
# (Determined collects a trial's checkpoints once it ended, and a paused trial has not).
RESUMES_FROM = "paused trial's latest: it goes on from it"


class Retention(NamedTuple):
    experiment_best: int
    trial_best: int
    trial_latest: int


DETERMINED_DEFAULT = Retention(0, 1, 1)  # Determined's save_experiment_best, save_trial_best, save_trial_latest


@dataclass(frozen=True)
class CheckpointStorage:
    type: str  # "local" (the trial's own checkpoint dir) or one of OBJECT_TYPES
    store: Optional[Dict[str, str]]  # the object store as TRIALKIT_CHECKPOINT_STORE carries it; None for local
    secret_name: Optional[str]  # a Kubernetes Secret whose keys the trial's pods get as variables (credentials)
    retention: Retention

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"type": self.type}
        for key, value in (self.store or {}).items():
            if key != "type":
                out[schema.camel(key)] = value
        if self.secret_name:
            out["secretName"] = self.secret_name
        out.update(saveExperimentBest=self.retention.experiment_best, saveTrialBest=self.retention.trial_best,
                   saveTrialLatest=self.retention.trial_latest)
        return out


def parse_storage(section: Any, where: str = SECTION) -> CheckpointStorage:
    """checkpointStorage; a missing save key is Determined's default. Credentials are never keys here."""
    sec = schema.normalize_keys(section, KEYS, where,
                                hint="credentials come from the environment or secretName's Secret; the section can ")
    kind = schema.as_choice(sec.get("type", "local"), TYPES, schema.path(where, "type"))
    for key in sec:
        if key not in ("type", "secretName") and not key.startswith("save") and key not in ALLOWED[kind]:
            raise UserError(f"{key} is not a key of {kind} checkpoint storage", schema.path(where, key),
                            f"use {', '.join(ALLOWED[kind]) or 'only the save keys'} for type {kind}")
    store = None
    if kind != "local":
        needed = NEEDS[kind]
        if sec.get(needed) is None:
            raise UserError(f"{needed} is missing", schema.path(where, needed), f"name the {needed} to keep them in")
        store = {"type": kind}
        for key in ALLOWED[kind]:
            if sec.get(key) is not None:
                store[_snake(key)] = schema.as_str(sec[key], schema.path(where, key))
        if store.get("endpoint_url") and not store["endpoint_url"].startswith(("http://", "https://")):
            raise UserError(f"{store['endpoint_url']!r} is not an http(s) URL", schema.path(where, "endpointUrl"),
                            "write the S3-compatible store's address, e.g. https://minio.example:9000")
    secret = sec.get("secretName")
    if secret is not None:
        secret = schema.as_str(secret, schema.path(where, "secretName"))
        if kind == "local":
            raise UserError("secretName gives an object store's credentials", schema.path(where, "secretName"),
                            "remove it: local checkpoints need none")
    counts = [schema.as_int(sec.get(key, default), schema.path(where, key), minimum=0)
              for key, default in zip(("saveExperimentBest", "saveTrialBest", "saveTrialLatest"), DETERMINED_DEFAULT)]
    return CheckpointStorage(kind, store, secret, Retention(*counts))


def _snake(key: str) -> str:
    return {"endpointUrl": "endpoint_url", "accountUrl": "account_url"}.get(key, key)



# ---------------------------------------------------------------- which are kept


def kept(checkpoints: List[Checkpoint], metric: Callable[[Checkpoint], Optional[float]], policy: Retention,
         smaller_is_better: bool) -> Dict[str, List[str]]:
    """uuid -> the rules that keep it (none: it goes), as Determined's checkpoint GC applies them."""
    rules: Dict[str, List[str]] = {c.uuid: [] for c in checkpoints}
    scored = [(m, c) for c in checkpoints for m in [metric(c)] if m is not None]

    def best(group: List[Any]) -> List[Checkpoint]:
        return [c for _, c in sorted(group, key=lambda mc: (mc[0] if smaller_is_better else -mc[0], -mc[1].time))]

    by_trial: Dict[str, List[Checkpoint]] = {}
    for ckpt in checkpoints:
        by_trial.setdefault(ckpt.trial, []).append(ckpt)
    for trial, own in by_trial.items():
        for ckpt in sorted(own, key=saved_order, reverse=True)[:policy.trial_latest]:
            rules[ckpt.uuid].append("trial latest")
        for ckpt in best([mc for mc in scored if mc[1].trial == trial])[:policy.trial_best]:
            rules[ckpt.uuid].append("trial best")
    for ckpt in best(scored)[:policy.experiment_best]:
        rules[ckpt.uuid].append("experiment best")
    return rules


def saved_order(ckpt: Checkpoint) -> Tuple[float, str]:
    """A checkpoint's place among its trial's: the later saved, the greater."""
    return ckpt.time, ckpt.uuid


def metric_of(ckpt: Checkpoint, metrics: List[Dict[str, Any]]) -> Optional[float]:
    """The searcher's metric a checkpoint is judged by: the validation at its steps (Core API's), else the
    last metric reported before it."""
    if ckpt.steps is not None:
        for rec in reversed(metrics):
            value = rec["value"]
            if (isinstance(value, dict) and value.get("group") == "validation"
                    and value.get("steps_completed") == ckpt.steps):
                return records.metric_number(value)
        return None
    before = [rec for rec in metrics if (rec.get("time") or 0) <= ckpt.time]
    for rec in reversed(before):
        number = records.metric_number(rec["value"])
        if number is not None:
            return number
    return None


# ---------------------------------------------------------------- the catalog


class Entry(NamedTuple):
    checkpoint: Checkpoint
    metric: Optional[float]
    rules: List[str]  # what keeps it; [] once it is to go


def storage_of(config: Mapping[str, Any]) -> Optional[CheckpointStorage]:
    """The stored config's checkpointStorage, or None (every checkpoint kept in the trials' dirs)."""
    section = config.get(SECTION)
    return None if section is None else parse_storage(section)


def open_store(storage: Optional[CheckpointStorage]) -> Any:
    """The experiment's object store (loads the cloud library), or None for checkpoints in the trials' dirs."""
    if storage is None or storage.store is None:
        return None
    from trialkit.checkpoints.store import ObjectStore, StoreError

    try:
        return ObjectStore(storage.store)
    except StoreError as err:
        raise _store_error(err, "check the store's address and the credentials in the environment")


def _store_error(err: Any, fix: str) -> UserError:
    """A store's StoreError for the user: its own fix where it has one (a refused endpoint), else `fix`."""
    return UserError(err.what, SECTION, err.fix or fix)


def check_store(storage: Optional[CheckpointStorage]) -> None:
    """Refuse, before anything starts, an object store this machine cannot use (no credentials, no such
    bucket, no answer): trials would each fail to restore or store their checkpoints. A store whose
    credentials come from secretName's Secret is the pods' to read, not this machine's: not checked."""
    if storage is None or storage.store is None or storage.secret_name:
        return
    from trialkit.checkpoints.store import StoreError

    try:
        open_store(storage).check()
    except StoreError as err:
        raise _store_error(err, "fix the store's address, its bucket or the credentials in this "
                           "environment, then run again") from None


def checkpoints(db: Any, experiment_id: str, storage: Optional[CheckpointStorage],
                trial_id: Optional[str] = None) -> List[Checkpoint]:
    """The experiment's (or one trial's) whole checkpoints, wherever they are kept, oldest first."""
    found: List[Checkpoint] = []
    for trial in db.trials(experiment_id):
        if trial_id is not None and trial["id"] != trial_id or not trial.get("trial_dir"):
            continue
        here = local_checkpoints(Path(trial["trial_dir"]) / "checkpoint", experiment_id, trial["id"])
        if here:
            starts = sorted(run_starts(db.records_for(trial["id"], type=records.STATUS)).items(), key=lambda rs: rs[1])
            found += [ckpt._replace(run=_run_at(ckpt.time, starts)) for ckpt in here]
    store = open_store(storage)
    if store is not None:
        from trialkit.checkpoints.store import StoreError

        try:
            stored = store.checkpoints(experiment_id, trial_id)
        except StoreError as err:
            raise _store_error(err, "check the store's address and the credentials in the environment")
        # Besides the stored ones: those its uploader never stored (it failed, or ran out of time), still here.
        uuids = {c.uuid for c in stored}
        found = stored + [c for c in found if c.uuid not in uuids]
    return sorted(found, key=lambda c: (c.time, c.uuid))


def _run_at(when: float, starts: List[Tuple[int, float]]) -> int:
    """The run that was going at `when` (a checkpoint in a trial's own dir says only when it became whole): the
    last to start before it, by its keeper's first status (an uploaded one's manifest names its run itself)."""
    return next((run for run, begin in reversed(starts) if begin <= when), 0)


def local_only(storage: Optional[CheckpointStorage], ckpt: Checkpoint) -> bool:
    """Whether an experiment with an object store has this checkpoint only in its trial's dir (never stored)."""
    return storage is not None and storage.store is not None and not ckpt.where.startswith(store_url(storage.store))


def catalog(db: Any, experiment_id: str, config: Mapping[str, Any],
            trial_id: Optional[str] = None) -> List[Entry]:
    """Every checkpoint of the experiment (or one trial) with its metric and the rules that keep it."""
    storage = storage_of(config)
    every = checkpoints(db, experiment_id, storage)
    smaller = (config.get("tuner") or {}).get("classArgs", {}).get("optimize_mode", "minimize") == "minimize"
    metrics: Dict[str, List[Dict[str, Any]]] = {}
    for trial in {c.trial for c in every}:
        metrics[trial] = [rec for kind in (records.PERIODICAL, records.FINAL)
                          for rec in db.records_for(trial, type=kind)]
        metrics[trial].sort(key=lambda rec: rec["seq"])
    scores = {c.uuid: metric_of(c, metrics.get(c.trial, [])) for c in every}
    if storage is None:
        rules = {c.uuid: [KEEP_ALL] for c in every}
    else:
        # One never stored is the user's only copy: no rule weighs it, and nothing deletes it but the user.
        rules = kept([c for c in every if not local_only(storage, c)], lambda c: scores[c.uuid], storage.retention,
                     smaller)
        rules.update({c.uuid: [LOCAL_ONLY] for c in every if local_only(storage, c)})
        for trial in {t["id"] for t in db.trials(experiment_id, PREEMPTED)}:
            own = [c for c in every if c.trial == trial]
            if own:
                rules[max(own, key=saved_order).uuid].append(RESUMES_FROM)
    return [Entry(c, scores[c.uuid], rules[c.uuid]) for c in every if trial_id is None or c.trial == trial_id]


def delete(storage: Optional[CheckpointStorage], ckpt: Checkpoint, trial_dir: Optional[str]) -> None:
    """One checkpoint gone from its store, and its local copy in a trial dir on this machine."""
    store = None if local_only(storage, ckpt) else open_store(storage)
    if store is not None:
        store.delete(ckpt)
    if trial_dir:
        local = Path(trial_dir) / "checkpoint" / ckpt.uuid
        if local.is_dir():
            shutil.rmtree(local, ignore_errors=True)


def download(storage: Optional[CheckpointStorage], ckpt: Checkpoint, dest: Path) -> None:
    """A copy of the checkpoint's files in dest, a new or empty dir."""
    store = None if local_only(storage, ckpt) else open_store(storage)
    if store is not None:
        from trialkit.checkpoints.store import StoreError

        try:
            store.download(ckpt, dest)
        except StoreError as err:
            raise _store_error(err, "check the store's address and the credentials in the environment")
        return
    shutil.copytree(ckpt.where, dest, dirs_exist_ok=True)


def collect(db: Any, experiment_id: str, config: Mapping[str, Any]) -> List[Checkpoint]:
    """Delete what the policy does not keep, of trials that are not running; returns what went."""
    storage = storage_of(config)
    if storage is None:
        return []
    trials = {t["id"]: t for t in db.trials(experiment_id)}
    gone = []
    for entry in catalog(db, experiment_id, config):
        trial = trials.get(entry.checkpoint.trial) or {}
        if entry.rules or trial.get("status") in (RUNNING, WAITING):
            continue
        delete(storage, entry.checkpoint, trial.get("trial_dir"))
        gone.append(entry.checkpoint)
    return gone


def where_kept(storage: Optional[CheckpointStorage]) -> str:
    return "the trials' checkpoint dirs" if storage is None or storage.store is None else store_url(storage.store)


class Collector:
    """The retention policy applied off the experiment loop's thread: a request runs one pass (those made while
    one runs make one more), so a slow or unreachable store never holds the experiment."""

    def __init__(self, db: Any, experiment_id: str, config: Mapping[str, Any], say: Callable[[str], None]):
        import threading

        self._db, self._experiment_id, self._config, self._say = db, experiment_id, dict(config), say
        self._gone: List[Checkpoint] = []  # said once, at the end: a line per pass would flood the run's terminal
        self._warned: Set[str] = set()  # each failure said once: a store that stays down fails every pass alike
        self._wanted = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="checkpoint-retention", daemon=True)
        self._thread.start()

    def request(self) -> None:
        self._wanted.set()

    def close(self, timeout: float) -> None:
        """One last pass (every trial has ended), waited for up to `timeout` seconds."""
        if not self._closing:
            self._closing = True
            self._wanted.set()
            self._thread.join(timeout)

    def abandon(self) -> None:
        """No more passes, and nothing more said: the store failed (the experiment stops saying so), and a pass
        under way, which waits for the same store, is left to end with the process rather than hold the end."""
        self._closing = True
        self._say = lambda line: None

    def _serve(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            closing = self._closing
            try:
                self._gone += collect(self._db, self._experiment_id, self._config)
            except Exception as err:  # noqa: BLE001 - a store that fails (UserError, OSError, ...) is said, not raised
                line = f"warning: checkpoints were not collected: {getattr(err, 'line', lambda: err)()}"
                if line not in self._warned:
                    self._warned.add(line)
                    self._say(line)
            if closing:
                self._said_gone()
                return

    def _said_gone(self) -> None:
        if self._gone:
            trials = len({ckpt.trial for ckpt in self._gone})
            self._say(f"checkpoints: {len(self._gone)} deleted over the run, of {trials} trial"
                      f"{'' if trials == 1 else 's'} (no retention rule kept them: "
                      f"`trialkit checkpoint list {self._experiment_id}` shows what is kept)")
