"""Where the keeper puts what it learns about the trial.

Every record, metric or status change, takes one path: into the durable
spool (spool.py) first, then to TensorBoard (when a dir is set) and to the
manager (shipper.py, when a manager URL is set). Records come from the
followed files (collector.py), from NNI's stdout lines, and from the keeper
itself (status changes). The status file in the trial dir is kept as well,
for people and for the local platform. The spool's order: what the followed
files held before the command started (an earlier keeper's), the run's first
status, then the run's records, each later status after what the trial wrote
before it.

A disk that refuses writes (full, read-only) loses nothing already spooled:
records the followed files hold are read again later, and the keeper's own
records (status changes, stdout lines), which no file holds, wait in memory
in order and are spooled before anything newer, for up to half the flush.
A trial that ends while its disk is still full loses what it could not
write: the keeper then frees the room it reserved as the trial started
(spool.Reserve) and spools its statuses, the final one saying how many of
the trial's records were lost (`"lost": N`, also in the status file); the
SDK's own count of what it could not even hold comes on stdout (channel.LOST).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: 2 of the 5.6 ms the reporting side imports beside the trial's start
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

from trialkit import layout, records
from trialkit.channel import LOST
from trialkit.env import (TRAINER_SERVER_CA_CERT, TRAINER_SERVER_TOKEN, TRAINER_SERVER_URL, TrialEnv,
                          is_reporting_replica, replica_rank)
from trialkit.keeper.collector import Collector, FileSource
from trialkit.keeper.spool import Reserve, Spool
from trialkit.keeper.status import StatusFile, say, warn
from trialkit.keeper.tensorboard import Scalars
from trialkit.process import EventLoop
from trialkit.statuses import FINAL_STATUSES


HELD_RETRY_SECONDS = 0.2


class Reporter:
    def __init__(self, trial: TrialEnv, home: Path):
        self.trial = trial
        self.home = home
        self.status_file = StatusFile(home / layout.STATUS)
        self.spool = Spool(home / layout.SPOOL)
        self.malformed = 0
        self.held: List[Dict[str, Any]] = []  # records no file holds that the spool could not take yet
        self.lost = 0  # the trial's records that were never written (a full disk at its end)
        self.reserve: Optional[Reserve] = None
        self.collector: Optional[Collector] = None
        self.shipper = None  # a Shipper when there is a manager to send to
        self.log_streams: List[Any] = []  # keeper.logship.LogStream, when there is a manager
        self.scalars = Scalars(trial.tensorboard_dir, warn) if trial.tensorboard_dir else None
        self.trainer_status = None  # a TrainerStatus where Kubeflow Trainer gives its progress endpoint
        self.start_said = False  # whether the run's first status (RUNNING, or why it did not start) was said

    def attach(self, loop: EventLoop, ends: Dict[str, int]) -> None:
        """As the trial starts: the followed files, the shipper. `ends`: the followed files' sizes (by source
        name) before the command started; what lies before them an earlier keeper on this dir left unspooled."""
        nni_metrics = layout.nni_metrics_path(self.trial.trial_dir)  # its dir made before the command (main)
        self.reserve = Reserve(self.home / layout.RESERVE)
        cursor = self.spool.cursor
        sources = [
            FileSource("channel", self.trial.channel, records.SeqDecoder, cursor.get("channel"), self._bad, warn),
            FileSource("nni", nni_metrics, records.NniFrameDecoder, cursor.get("nni"), self._bad, warn),
        ]
        self.collector = Collector(loop, sources, self._ingest, self._bad, warn, self.trial.restart_count)
        # What an earlier keeper left goes first, numbered as keeper/leftover.py numbers it for the control plane;
        # what this run wrote already goes after its first status (see status).
        self.collector.collect(drain=True, ends=ends)
        # The reporting replica ships everything; another pod of the trial ships to its rank's route,
        # where the manager keeps its output (trialkit/manager/replica_logs.py).
        route = "records" if is_reporting_replica() else None
        if route is None and replica_rank() is not None:
            route = f"replicas/{replica_rank()}/records"
        if self.trial.manager_url and route:
            # Imported here: http.client (with ssl and email) costs a keeper
            # without a manager ~20 ms of start-up for nothing.
            from trialkit.keeper.shipper import Shipper

            self.shipper = Shipper(self.spool, self.trial.manager_url, self.trial.trial_id, self.trial.token,
                                   log=say, route=route).start()
        # Made after the earlier keeper's records are spooled, before this run's: it counts this run's results.
        if os.environ.get(TRAINER_SERVER_URL) and route == "records":  # one keeper a TrainJob speaks for it
            from trialkit.keeper.trainer_status import TrainerStatus

            self.trainer_status = TrainerStatus(os.environ[TRAINER_SERVER_URL], os.environ.get(TRAINER_SERVER_CA_CERT),
                                                os.environ.get(TRAINER_SERVER_TOKEN), say)

    def status(self, status: str, **fields: Any) -> None:
        if status in FINAL_STATUSES and self.lost:
            fields["lost"] = self.lost
        self.status_file.update(status, **fields)
        first, self.start_said = not self.start_said, True
        if self.collector and not first:
            self.collector.collect(drain=True)  # metrics reported before the change come before it
        self._ingest_one(records.status_record(status, fields, self.trial.trial_id, self.trial.restart_count))
        if self.collector and first:
            # What the trial wrote between its start and attach comes after the status that says it started
            # (RUNNING), and its writes before the files were watched raised no event: read now.
            self.collector.collect(drain=True)
        if status not in FINAL_STATUSES:
            self.status_file.ready_next()  # for the final one, written on the keeper's way out

    def log_chunk(self, stream: str, text: str) -> None:
        """Whole lines of the trial's output, for the manager (keeper.logship decides what and when)."""
        self._ingest_one(records.log_record(stream, text, self.trial.trial_id, self.trial.restart_count))

    def trial_ended(self) -> None:
        """The trial's whole tree is gone: stop watching its files (see DirWatch.stop); its last
        output goes out before its final status."""
        if self.collector:
            self.collector.stop_watching()
        for stream in self.log_streams:
            stream.flush(final=True)

    def nni_stdout_line(self, line: bytes) -> None:
        """A `NNISDK_MEb'...'` line from the trial's stdout."""
        try:
            obj = records.parse_nni_stdout(line)
            if type(obj) is dict and obj.get("type") == LOST and records.in_int64(obj.get("value")):
                self.lost += max(0, obj["value"])  # the SDK's count of what it could not hold: never a record
                return
            rec = records.normalize(obj, "stdout", self.trial.restart_count)
        except records.BadRecord as err:
            self._bad("an NNISDK line on stdout", f"{err}: {line[:80]!r}")
            return
        if rec:
            self._ingest_one(rec)

    def finish(self, deadline: float) -> None:
        """Deliver what is pending until the deadline (monotonic seconds), then say what is left."""
        # A disk that refuses writes gets half the flush to take them again; the manager the rest.
        self._spool_refused(time.monotonic() + max(0.0, deadline - time.monotonic()) / 2)
        if self.held:
            self._last_word()
        if self.collector:
            self.collector.finish()
        if self.scalars:
            self.scalars.close()
        if self.malformed:
            self.status_file.update(malformed_records=self.malformed)
        if self.trainer_status:
            self.trainer_status.close(deadline)
        # Without a manager the spool is the record of the trial: nothing to say.
        left = self.shipper.close(deadline) if self.shipper else 0
        self.spool.close()
        if left:
            say(f"{left} records were not delivered to {self.trial.manager_url}; they stay in "
                 f"{self.spool.dir} and go out with the next keeper on this trial dir")

    def _last_word(self) -> None:
        """The trial ended and the disk still refuses: the trial's held records are lost and counted; in the
        room the reserve gives back go what the followed files still hold, then the statuses, the final one
        with the count."""
        statuses = [rec for rec in self.held if rec["type"] == records.STATUS]
        lost = sum(rec["type"] in records.TRIAL_TYPES for rec in self.held)
        self.lost += lost
        if self.lost and statuses and statuses[-1]["value"]["status"] in FINAL_STATUSES:
            statuses[-1]["value"]["lost"] = self.lost
        self.held = []
        if self.reserve:
            self.reserve.release()
        if self.collector:
            self.collector.collect(drain=True)  # records the trial wrote come before the status that follows them
        self.held = statuses
        if self.lost:
            self.status_file.update(lost=self.lost)
        if lost:
            say(f"{lost} of the trial's records could not be written (its disk was full when it ended) and are "
                "lost; its final status says how many")
        if self.held and not self._spool_held():
            say(f"{len(self.held)} status records could not be written to the spool either and are lost; "
                "the trial's exit code is the keeper's")

    def _spool_refused(self, deadline: float) -> None:
        """What the spool refused (a full or read-only disk), tried again until the flush's deadline."""
        while time.monotonic() < deadline:
            if self.collector:
                self.collector.collect(drain=True)
            if self.held:
                self._spool_held()
            if not self.held and not (self.collector and self.collector.spool_failing):
                return
            time.sleep(HELD_RETRY_SECONDS)  # the disk may take writes again before the flush ends

    def _ingest(self, recs: List[Dict[str, Any]], cursor: Dict[str, Any]) -> None:
        """Spool, then the rest. Raises OSError: the collector reads again what was not spooled."""
        if self.held and not self._spool_held():
            raise OSError(0, "earlier records wait for the spool")  # they go first: order is kept
        self._spool(recs, cursor)

    def _spool(self, recs: List[Dict[str, Any]], cursor: Dict[str, Any]) -> None:
        self.spool.append(recs, cursor)
        if self.scalars:
            for rec in recs:
                self.scalars.add(rec)
        if self.trainer_status:
            for rec in recs:
                self.trainer_status.note(rec)

    def _ingest_one(self, rec: Dict[str, Any]) -> None:
        """A record that no file holds (a status change, a stdout line): held in memory until spooled."""
        self.held.append(rec)
        self._spool_held()

    def _spool_held(self) -> bool:
        """Spool the held records; False (said once) while the disk refuses them."""
        try:
            self._spool(self.held, self.spool.cursor)  # the files' cursor has not moved
        except OSError as err:
            if len(self.held) == 1:
                warn(f"cannot write the spool ({err.strerror}); the keeper's own records wait in memory")
            return False
        self.held = []
        return True

    def _bad(self, where: str, reason: str) -> None:
        self.malformed += 1
        warn(f"skipped a malformed record ({where}): {reason}")
