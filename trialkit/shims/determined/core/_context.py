"""`det.core.init()` and its contexts, over trialkit's SDK session.

- train: each report is one PERIODICAL record `{"group", "steps_completed",
  "metrics"}`, with `"default"` the searcher metric when the report holds it
  (what trialkit's tuners, assessors and page read). Only rank 0 reports, as
  Determined has only the chief report; other ranks' reports are dropped.
  When the context closes unpreempted, rank 0 reports the trial's FINAL
  result: what `op.report_completed()` got, else the last validation's
  searcher metric.
- preempt: `should_preempt()` is true once the keeper was asked to stop (its
  stop file); in WorkersAskChief mode (the default) the chief asks and every
  rank gets its answer, so all ranks stop at the same step. A context that
  said "preempt" exits 143 when it closes: the keeper's "checkpointed,
  resume me", so a pause shows PAUSED and resumes from `latest_checkpoint`.
- checkpoint: storage ids are directories in the trial's checkpoint dir (_storage.py).
- searcher: one operation of the configured max_time (or max_length), as
  Determined 0.38 gives; for adaptive_asha on max_length (the legacy
  searcher's form) one operation per rung, each ending at the next rung's
  length, so a script that validates when an operation completes (Determined's
  Core API tutorial, stage 3) is judged at every rung. A trial resumed from a
  checkpoint gets the operations its checkpoint has not passed.
"""
import contextlib
import enum
import logging
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

from trialkit import env, records
from trialkit.sdk import Session, _show

from .. import _info, _storage
from ._distributed import DistributedContext, DummyDistributedContext

logger = logging.getLogger("determined.core")
CHECKPOINTED = 143  # the keeper's "stopped with a checkpoint, resume me" (AdaptDL's convention)


class PreemptMode(enum.Enum):
    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class SearcherMode(enum.Enum):
    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHEIF_ONLY"  # sic, Determined's spelling


class DownloadMode(enum.Enum):
    LocalWorkersShareDownload = "LocalWorkersShareDownload"
    NoSharedDownload = "NoSharedDownload"


class TensorboardMode(enum.Enum):
    AUTO = "AUTO"
    MANUAL = "MANUAL"


class Unit(enum.Enum):
    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


class EarlyExitReason(enum.Enum):
    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


class _Reports:
    """What the trial told: the records' writer, the searcher metric and the final result to report."""

    def __init__(self, session: Session, searcher: Dict[str, Any]):
        self.session = session
        # Training reports need not hold the searcher metric: the SDK's warning about a record without a
        # "default" number would be noise for every Determined script.
        session._warned.add("shape")
        self.metric = searcher.get("metric")
        self.final: Optional[Any] = None

    def report(self, group: str, steps_completed: int, metrics: Dict[str, Any], **extra: Any) -> None:
        """One record; `extra` (batch_metrics, epochs) is kept in it where given, as Determined keeps it."""
        value: Dict[str, Any] = {"group": group, "steps_completed": steps_completed, "metrics": metrics,
                                 **{key: v for key, v in extra.items() if v is not None}}
        searched = metrics.get(self.metric) if self.metric is not None else None
        if records.metric_number(searched) is not None:
            value["default"] = searched
            if group == "validation":
                self.final = searched
        self.session.report(records.PERIODICAL, value)


class TrainContext:
    def __init__(self, reports: _Reports, trial: env.TrialEnv):
        self._reports = reports
        self._trial = trial

    def report_training_metrics(self, steps_completed: int, metrics: Dict[str, Any],
                                batch_metrics: Optional[Any] = None, epochs: Optional[int] = None) -> None:
        _metrics_dict("report_training_metrics", metrics)
        logger.info(f"report_training_metrics(steps_completed={steps_completed}, metrics={_show(metrics, None)})")
        self._reports.report("training", steps_completed, metrics, batch_metrics=batch_metrics, epochs=epochs)

    def report_validation_metrics(self, steps_completed: int, metrics: Dict[str, Any]) -> None:
        _metrics_dict("report_validation_metrics", metrics)
        for name, value in metrics.items():
            if value is None:  # Determined fails the trial on a None metric too
                raise RuntimeError(f"Validation metric '{name}' returned an invalid scalar value: None")
        logger.info(f"report_validation_metrics(steps_completed={steps_completed}, metrics={_show(metrics, None)})")
        self._reports.report("validation", steps_completed, metrics)

    def report_metrics(self, group: str, steps_completed: int, metrics: Dict[str, Any]) -> None:
        _metrics_dict("report_metrics", metrics)
        self._reports.report(group, steps_completed, metrics)

    def report_progress(self, progress: float) -> None:
        # Determined's WebUI shows it; trialkit shows trials by their metrics and status only.
        logger.debug(f"report_progress({progress})")

    def set_status(self, status: str) -> None:
        logger.info(f"status: {status}")

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        logger.info(f"report_early_exit({reason})")

    def get_tensorboard_path(self) -> Path:
        return Path(self._trial.tensorboard_dir or self._trial.trial_dir / "tensorboard")

    def get_experiment_best_validation(self) -> Optional[float]:
        # A trial cannot read other trials' results from trialkit's manager (its token is for its own).
        return None


def _metrics_dict(call: str, metrics: Any) -> None:
    """Determined reads the metrics as a dict (`metrics.items()`), so anything else fails there with an
    AttributeError: the same type here, saying which call and argument."""
    if not isinstance(metrics, dict):
        raise AttributeError(f"core.train.{call}(metrics=...) takes a dict of metric names to values, got a "
                             f"{type(metrics).__name__}: {_show(metrics)}")


class PreemptContext:
    def __init__(self, session: Session, dist: DistributedContext, mode: PreemptMode):
        self._session = session
        self._dist = dist
        self._mode = PreemptMode(mode)
        self.preempted = False

    def should_preempt(self, auto_ack: bool = True) -> bool:
        if self._mode == PreemptMode.WorkersAskChief:
            answer = self._dist.broadcast(self._session.should_preempt() if self._dist.rank == 0 else None)
        elif self._mode == PreemptMode.ChiefOnly and self._dist.rank != 0:
            raise RuntimeError("should_preempt() in ChiefOnly mode is for the chief only")
        else:
            answer = self._session.should_preempt()
        self.preempted = self.preempted or bool(answer)
        return bool(answer)

    def acknowledge_preemption_signal(self) -> None:
        """Determined's master wants it to know the trial will exit; the keeper needs no word."""


class CheckpointContext:
    def __init__(self, root: Path, dist: DistributedContext):
        self._root = root
        self._dist = dist

    @contextlib.contextmanager
    def store_path(self, metadata: Dict[str, Any], *, shard: bool = False) -> Iterator[Tuple[Path, str]]:
        _metadata_dict("store_path", metadata)
        storage_id = self._new_id(shard)
        where = self._root / storage_id
        where.mkdir(parents=True, exist_ok=True)
        yield where, storage_id
        self._finish(storage_id, metadata, shard)

    def upload(self, ckpt_dir: Any, metadata: Dict[str, Any], *, shard: bool = False,
               selector: Optional[Callable[[str], bool]] = None) -> str:
        _metadata_dict("upload", metadata)
        if ckpt_dir is not None:
            _a_directory("upload", ckpt_dir)
        storage_id = self._new_id(shard)
        if ckpt_dir is not None:
            _copy(Path(ckpt_dir), self._root / storage_id, selector)
        else:
            (self._root / storage_id).mkdir(parents=True, exist_ok=True)
        self._finish(storage_id, metadata, shard)
        return storage_id

    @contextlib.contextmanager
    def restore_path(self, storage_id: str, download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
                     *, selector: Optional[Callable[[str], bool]] = None) -> Iterator[Path]:
        # The checkpoint is on this trial's disk already: its own dir is the path (read it, do not change it).
        yield _storage.path(self._root, storage_id)

    def download(self, storage_id: str, ckpt_dir: Any,
                 download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload, *,
                 selector: Optional[Callable[[str], bool]] = None) -> None:
        _copy(_storage.path(self._root, storage_id), Path(ckpt_dir), selector)

    def get_metadata(self, storage_id: str) -> Dict[str, Any]:
        return _storage.metadata(self._root, storage_id)

    def delete(self, storage_id: str) -> None:
        _storage.delete(self._root, storage_id)

    def _new_id(self, shard: bool) -> str:
        if not shard:
            if self._dist.rank != 0:
                raise RuntimeError("only the chief may store a checkpoint unless shard=True")
            return str(uuid.uuid4())
        return self._dist.broadcast(str(uuid.uuid4()) if self._dist.rank == 0 else None)

    def _finish(self, storage_id: str, metadata: Dict[str, Any], shard: bool) -> None:
        if shard:
            self._dist.gather(None)  # every rank has written its shard before the chief makes it whole
        if self._dist.rank == 0:
            _storage.finish(self._root, storage_id, dict(metadata))


def _metadata_dict(call: str, metadata: Any) -> None:
    """Determined refuses metadata that holds no 'steps_completed' item with a ValueError (a list has none):
    the same type here, before anything is stored."""
    if not isinstance(metadata, dict):
        raise ValueError(f"core.checkpoint.{call}(metadata=...) takes a dict (Determined's holds "
                         f"'steps_completed'), got a {type(metadata).__name__}: {_show(metadata)}")


def _a_directory(call: str, ckpt_dir: Any) -> None:
    """As Determined's storage lists what it uploads: a path that is not there, or not a directory, raises."""
    path = os.fspath(ckpt_dir)
    if not os.path.exists(path):
        raise FileNotFoundError(f"core.checkpoint.{call}(ckpt_dir={path!r}): no such directory")
    if not os.path.isdir(path):
        raise NotADirectoryError(f"core.checkpoint.{call}(ckpt_dir={path!r}): not a directory (a checkpoint is "
                                 "a directory of files)")


def _copy(src: Path, dest: Path, selector: Optional[Callable[[str], bool]]) -> None:
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        if path.is_file() and rel != _storage.METADATA and (selector is None or selector(rel)):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / rel)
    dest.mkdir(parents=True, exist_ok=True)


class SearcherOperation:
    """One operation: train to `length`, then report_completed(the searcher metric)."""

    def __init__(self, length: int, is_chief: bool, reports: Optional[_Reports]):
        self._length = length
        self._is_chief = is_chief
        self._reports = reports
        self._completed = False

    @property
    def length(self) -> int:
        return self._length

    def report_progress(self, length: float) -> None:
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_progress() from the chief worker")
        logger.debug(f"op.report_progress({length})")

    def report_completed(self, searcher_metric: Any) -> None:
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_completed() from the chief worker")
        if self._completed:
            raise RuntimeError("you may only call op.report_completed() once")
        self._completed = True
        self._reports.final = searcher_metric


class SearcherContext:
    def __init__(self, dist: DistributedContext, reports: _Reports, searcher: Dict[str, Any],
                 lengths: Sequence[int] = (), reached: int = 0):
        self._dist = dist
        self._reports = reports
        # The config's operations (settings "operations": each rung's length) or one of the whole length; those
        # a checkpoint at step `reached` has passed were completed before it, and Determined does not give a
        # completed operation again.
        lengths = list(lengths) or [_length(searcher)]
        self._lengths = [n for n in lengths if n >= reached] or lengths[-1:]
        length = searcher.get("max_length")
        self._units = Unit[next(iter(length)).upper()] if isinstance(length, dict) and len(length) == 1 else None

    def operations(self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief,
                   auto_ack: bool = True) -> Iterator[SearcherOperation]:
        mode = SearcherMode(searcher_mode)
        if self._dist.rank == 0:
            for length in self._lengths:
                op = SearcherOperation(length, True, self._reports)
                if mode == SearcherMode.WorkersAskChief:
                    self._dist.broadcast(op.length)
                yield op
                if not op._completed:
                    raise RuntimeError("you must call op.report_completed() on each operation")
            if mode == SearcherMode.WorkersAskChief:
                self._dist.broadcast(None)
            return
        if mode != SearcherMode.WorkersAskChief:
            raise RuntimeError("searcher.operations(searcher_mode=ChiefOnly) is for the chief only")
        while True:
            length = self._dist.broadcast(None)
            if length is None:
                return
            yield SearcherOperation(length, False, None)

    def acknowledge_out_of_ops(self) -> None:
        """Ignored in Determined 0.38 too."""

    def get_configured_units(self) -> Optional[Unit]:
        """The unit max_length was written in (`max_length: {epochs: 5}`), or None for a bare number."""
        return self._units


def _length(searcher: Dict[str, Any]) -> int:
    """searcher.max_length (a number, or {batches|epochs|records: N}), else max_time; 1 when neither is set
    (Determined's own fallback off-cluster)."""
    length = searcher.get("max_length", searcher.get("max_time"))
    if isinstance(length, dict):
        length = next(iter(length.values()), None)
    return int(length) if length is not None else 1


def _reached(root: Path) -> int:
    """steps_completed of the trial's latest checkpoint in `root` (Determined's metadata holds it); 0 when none."""
    storage_id = _storage.latest(root)
    if storage_id is None:
        return 0
    try:
        reached = _storage.metadata(root, storage_id).get("steps_completed", 0)
    except (OSError, ValueError, AttributeError):  # metadata not as store_path() writes it: from the start
        return 0
    return reached if isinstance(reached, int) else 0


class Context:
    """What `det.core.init()` returns: a context manager; its close() ends the trial's part of the API."""

    def __init__(self, distributed: DistributedContext, preempt_mode: PreemptMode):
        # The session speaks for rank 0 only (unless TRIALKIT_REPORT_ALL_RANKS): Determined's chief reports.
        trial = env.read()._replace(rank=distributed.rank)
        settings = _info.settings()
        searcher = settings.get("searcher") or {}
        self._session = Session(trial)
        self._reports = _Reports(self._session, searcher)
        self.info = _info.ClusterInfo(trial, env.topology(), settings) if trial.under_keeper else None
        self.distributed = distributed
        self.train = TrainContext(self._reports, trial)
        self.preempt = PreemptContext(self._session, distributed, preempt_mode)
        checkpoints = Path(self._session.directory(trial.checkpoint_dir))
        self.checkpoint = CheckpointContext(checkpoints, distributed)
        self.searcher = SearcherContext(distributed, self._reports, searcher, settings.get("operations") or (),
                                        _reached(checkpoints))

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._close(ended_well=exc_type is None)
        if exc_type is None and self.preempt.preempted:
            sys.exit(CHECKPOINTED)

    def close(self) -> None:
        self._close(ended_well=True)

    def _close(self, ended_well: bool) -> None:
        """The final result goes out only when training ended by itself: not after a preemption, nor an error."""
        if ended_well and not self.preempt.preempted and self._reports.final is not None:
            self._session.report(records.FINAL, self._reports.final)
            self._reports.final = None
        self.distributed.close()


def init(*, distributed: Optional[DistributedContext] = None, checkpoint_storage: Any = None,
         preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
         tensorboard_mode: TensorboardMode = TensorboardMode.AUTO, async_checkpointing: bool = False) -> Context:
    """Determined's core.init(). Checkpoints go to the trial's checkpoint dir (the experiment's
    checkpoint_storage is applied by trialkit's config); another storage given here is refused."""
    if checkpoint_storage is not None:
        raise ValueError("trialkit's determined stores checkpoints in the trial's checkpoint dir; set "
                         "checkpoint_storage in the experiment config (shared_fs), not in core.init()")
    return Context(distributed or DummyDistributedContext(), preempt_mode)
