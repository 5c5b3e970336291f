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

import os
import sys
import time

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Optional, Set, TextIO

from trialkit import env, records
from trialkit.channel import ChannelWriter

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
        if self.standalone:
            print(f"trialkit: {_KIND_NAMES[kind]} {sequence}: {metric!r}", file=self._out or sys.stdout, flush=True)
        try:
            self._channel.write(frame)
        except OSError as err:
            lost = "it is only printed" if self.standalone else "it is lost"
            self._warn("write", f"cannot write metrics to {self.trial.channel} ({err.strerror}); {lost}")
            return
        if self.standalone:
            self._warn("where", f"no trialkit keeper here: metrics are printed and appended to "
                       f"{os.path.abspath(self.trial.channel)} (JSON text sequence, RFC 7464)")

    def _value_json(self, metric: Any) -> Optional[str]:
        """Any metric but a finite float: its JSON text (None when it cannot be written), said once if no number."""
        metric = records.plain(metric)
        if records.metric_number(metric) is None:
            self._warn("shape", f"a metric should be a number (finite, within a float's range) or a dict "
                       f"with a numeric 'default' (got {_show(metric)}); it is kept as it is, but tuners and "
                       f"assessors do not see a number in it")
        try:
            return records.dumps(metric)
        except (ValueError, RecursionError) as err:  # an int of over 4300 digits, a cycle, a deep nest
            self._warn("encode", f"a metric cannot be written as JSON ({_show(err)}); it is lost")
            return None

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
        except (AttributeError, TypeError, ValueError, OverflowError) as err:  # None, text, inf: the caller's slip
            self._warn("elastic", f"a sizing decision is not a count, speedups and a reason ({_show(err)}); it is lost")
            return
        rec = {"type": records.ELASTIC, "time": time.time(), "value": value, **self._ident}
        try:
            self._channel.write(records.frame(records.dumps(rec)))
        except OSError as err:
            self._warn("write", f"cannot write to {self.trial.channel} ({err.strerror}); a sizing decision is lost")

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


def report_elastic(workers: int, predicted: Mapping[int, float], reason: str) -> None:
    """An elastic job's sizing now: its workers, the predicted speedup over one worker by count, why.

    Shown by `trialkit trial show` and the page; never raises, never a metric.
    """
    import trialkit  # its one session: the channel writer that the SDK face shares

    (trialkit._session or trialkit._start()).report_elastic(workers, predicted, reason)


def _show(value: Any, limit: int = 60) -> str:
    """A short repr for a warning (repr of an int of over 4300 digits raises, and long ones drown the line)."""
    try:
        text = repr(value)
    except ValueError:
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= limit else text[:limit - 3] + "..."
