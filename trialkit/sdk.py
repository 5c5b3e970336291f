"""The one object behind trialkit's public functions: a trial's session.

It reads the environment contract once, then serves parameters, encodes each
metric into one channel frame (one write, no lock, no network) and answers
should_preempt() from the stop file the keeper creates on SIGTERM/SIGINT.
`report_elastic` is not training code's: adaptdl-ray tells the trial's
manager, through the same channel, how it sized its elastic job.

Outside a keeper (a script run by hand) it works standalone: parameters come
from TRIALKIT_PARAMETERS or are empty, and each metric is printed and appended
to a local file, whose place is said once. Nothing here raises into the
training loop: a metric that cannot be kept is reported on stderr instead.
"""
from __future__ import annotations

import atexit
import os
import sys
import time

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Set, TextIO

from trialkit import env, records
from trialkit.channel import LOST, ChannelWriter

HELD_BYTES = 64 << 20  # records a disk that takes no writes holds back in memory, at most
_KIND_NAMES = {records.PERIODICAL: "intermediate result", records.FINAL: "final result"}


class Session:
    def __init__(self, trial: env.TrialEnv, out: Optional[TextIO] = None, err: Optional[TextIO] = None):
        self.trial = trial
        self._out = out  # None: sys.stdout/stderr as they are when printing (a script may replace them)
        self._err = err
        self.standalone = not trial.under_keeper
        # Only one rank speaks for a distributed job, unless told otherwise.
        self.reporting = trial.rank == 0 or trial.report_all_ranks
        self._channel = ChannelWriter(trial.channel)
        self._stop_path = str(trial.stop_file)
        self._stopping = False
        self._parameters: Optional[Dict[str, Any]] = None
        self._next_sequence = 0
        self._warned: Set[str] = set()
        self._held: List[bytes] = []  # frames the disk refused, in order (see _write)
        self._held_bytes = 0
        self._held_at_exit = False
        self._dropped = 0  # frames refused past HELD_BYTES
        if trial.rank_problem:
            self._warn("rank", f"{trial.rank_problem}; this process reports as rank 0")
        # The parts of a record that never change, encoded once.
        ident = {"parameter_id": records.parameter_id(trial.parameter_id, trial.sequence),
                 "trial_job_id": trial.trial_id, "run": trial.restart_count}
        if trial.report_all_ranks:
            ident["rank"] = trial.rank
        self._ident = ident
        self._tail = records.dumps(ident)[1:]

    @classmethod
    def from_environ(cls) -> "Session":
        return cls(env.read())

    # -- parameters ---------------------------------------------------------
    def parameters(self) -> Dict[str, Any]:
        if self._parameters is None:
            try:
                self._parameters = self.trial.parameters()
            except (OSError, ValueError) as err:
                self._warn("parameters", f"cannot read the trial's parameters ({err}); using none")
                self._parameters = {}
        return self._parameters

    # -- metrics --------------------------------------------------------------
    def report(self, kind: str, metric: Any) -> None:
        """Append one metric record to the channel (PERIODICAL or FINAL)."""
        if not self.reporting:
            return
        if type(metric) is float and metric - metric == 0.0:  # finite: the common case, kept cheap
            value = float.__repr__(metric)
        else:
            value = self._value_json(metric)
            if value is None:
                return
        if kind == records.PERIODICAL:
            sequence = self._next_sequence
            self._next_sequence += 1
        else:
            sequence = 0  # NNI numbers only intermediate results
        frame = records.metric_frame(kind, sequence, time.time(), value, self._tail)
        if len(frame) > records.MAX_FRAME:
            self._warn("size", f"a metric of {len(frame)} bytes is over the {records.MAX_FRAME} bytes a record may "
                       "hold (as NNI's); it is lost")
            return
        if self.standalone:
            print(f"trialkit: {_KIND_NAMES[kind]} {sequence}: {_show(metric, None)}", file=self._out or sys.stdout,
                  flush=True)
        self._write(frame, "metrics")
        if self.standalone:
            self._warn("where", f"no trialkit keeper here: metrics are printed and appended to "
                       f"{os.path.abspath(self.trial.channel)} (JSON text sequence, RFC 7464)")

    def _value_json(self, metric: Any) -> Optional[str]:
        """Any metric but a finite float: its JSON text (None when it cannot be written), said once if no number."""
        try:
            metric = records.plain_metric(metric)
            text = records.dumps(metric)
        except (records.BadRecord, ValueError, MemoryError) as err:  # ValueError: what json refuses besides
            # Said once per kind of refusal: a loop repeats its one mistake, but two different ones are two lines.
            self._warn("encode " + str(err).split(":")[0][:60],
                       f"a metric cannot be written as JSON ({str(err)[:100]}); it is lost")
            return None
        if records.metric_number(metric) is None:
            self._warn("shape", f"a metric should be a number (finite, within a float's range) or a dict "
                       f"with a numeric 'default' (got {_show(metric)}); it is kept as it is, but tuners and "
                       f"assessors do not see a number in it")
        return text

    # -- the channel, and what a disk that takes no writes holds back ---------------------------------
    def _write(self, frame: bytes, what: str) -> None:
        """Append a frame; while the disk refuses (full, read-only) frames wait in memory, in order, bounded,
        and go first at the next write that passes (or at exit). Outside a keeper a refused one is only printed."""
        if self._held:
            self._hold(frame)
            self._write_held()
            return
        try:
            if self._channel.write(frame) == len(frame):
                return
            problem = "the disk is full"  # a short write: the torn frame is skipped by the keeper, sent again whole
        except OSError as err:
            problem = err.strerror or str(err)
        if self.standalone:
            self._warn("write", f"cannot write {what} to {self.trial.channel} ({problem}); it is only printed")
            return
        self._warn("write", f"cannot write {what} to {self.trial.channel} ({problem}); they wait in memory "
                   f"(up to {HELD_BYTES >> 20} MiB) and are written once the disk takes them")
        if not self._held_at_exit:
            self._held_at_exit = True
            atexit.register(self._at_exit)
        self._hold(frame)

    def _hold(self, frame: bytes) -> None:
        if self._held_bytes + len(frame) > HELD_BYTES:
            self._dropped += 1
            self._warn("held", f"over {HELD_BYTES >> 20} MiB of records wait for the disk; newer ones are lost "
                       "until it takes writes again")
            return
        self._held.append(frame)
        self._held_bytes += len(frame)

    def _write_held(self) -> None:
        """Write the held frames, as many as the disk takes, joined in writes of up to 1 MiB."""
        held = self._held
        while held:
            count, size = 0, 0
            while count < len(held) and (count == 0 or size + len(held[count]) <= 1 << 20):
                size += len(held[count])
                count += 1
            try:
                written = self._channel.write(b"".join(held[:count]))
            except OSError:
                return
            done = 0
            while done < count and written >= len(held[done]):  # a frame cut by a short write goes again
                written -= len(held[done])
                self._held_bytes -= len(held[done])
                done += 1
            del held[:done]
            if done < count:
                return

    def _at_exit(self) -> None:
        """The trial ends: what the disk still refuses goes to the keeper on stdout (NNI's record lines, which
        it reads as records), with the count of those past the bound, which its final status then carries;
        outside a keeper it is lost, and said with its count."""
        self._write_held()
        if (self._held or self._dropped) and not self.standalone:
            try:
                out = self._out or sys.__stdout__  # fd 1, the keeper's pipe, even if the script replaced sys.stdout
                for frame in self._held:
                    out.write("NNISDK_MEb'" + frame[1:-1].decode() + "'\n")
                if self._dropped:  # the keeper's final status counts them
                    out.write("NNISDK_MEb'" + records.dumps({"type": LOST, "value": self._dropped}) + "'\n")
                out.flush()
                self._held = []
            except (OSError, ValueError, AttributeError):
                pass
        lost = self._dropped + len(self._held)
        if lost:
            self._warn("lost", f"{lost} records could not be written to {self.trial.channel} before the trial "
                       "ended (the disk took no writes); they are lost")

    # -- an elastic job's sizing -------------------------------------------------------
    def report_elastic(self, workers: int, predicted: Mapping[int, float], reason: str) -> None:
        """Append one ELASTIC record to the channel; outside a keeper nothing (adaptdl-ray prints its decisions).

        Whatever rank the environment names: the controller, not a worker, speaks for the job here.
        """
        if self.standalone:
            return
        try:
            value = {"workers": int(workers), "predicted": {str(int(n)): float(x) for n, x in predicted.items()},
                     "reason": str(reason)}
        except Exception as err:  # noqa: BLE001 - None, text, inf, an object that raises: never into the caller
            self._warn("elastic", f"a sizing decision is not a count, speedups and a reason ({_show(err)}); it is lost")
            return
        rec = {"type": records.ELASTIC, "time": time.time(), "value": value, **self._ident}
        self._write(records.frame(records.dumps(rec)), "a sizing decision")

    # -- stopping ---------------------------------------------------------------
    def should_preempt(self) -> bool:
        """True once a stop was asked: one stat(2) a call until then, nothing after."""
        if not self._stopping and os.path.exists(self._stop_path):
            self._stopping = True
        return self._stopping

    # -- dirs ---------------------------------------------------------------------
    def directory(self, path: Optional[os.PathLike]) -> Optional[str]:
        if path is None:
            return None
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as err:
            self._warn(f"dir {path}", f"cannot create {path} ({err.strerror})")
        return str(path)

    def _warn(self, key: str, message: str) -> None:
        """Say a thing once per session (a training loop may hit it a million times)."""
        if key in self._warned:
            return
        self._warned.add(key)
        try:
            print(f"trialkit: {message}", file=self._err or sys.stderr, flush=True)
        except (OSError, ValueError):
            pass  # stderr closed: nothing left to tell


_one: Optional[Session] = None


def session() -> Session:
    """The process's one session, made on first use: the SDK face's functions, Trial.should_stop and
    report_elastic share its channel writer."""
    global _one
    if _one is None:
        _one = Session.from_environ()
    return _one


def report_elastic(workers: int, predicted: Mapping[int, float], reason: str) -> None:
    """An elastic job's sizing now: its workers, the predicted speedup over one worker by count, why.

    Shown by `trialkit trial show` and the page; never raises, never a metric.
    """
    session().report_elastic(workers, predicted, reason)


def _show(value: Any, limit: Optional[int] = 60) -> str:
    """A repr for a line, never raising (an int of over 4300 digits, a deep nest, a user's __repr__ may raise),
    short unless limit is None (long ones drown the line)."""
    try:
        text = repr(value)
    except Exception as err:  # noqa: BLE001 - whatever the object's repr raises
        if type(value) is int:
            return f"an integer of {value.bit_length()} bits"
        return f"a {type(value).__name__} whose repr raises {type(err).__name__}"
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."
