"""Record shapes and the framing codecs the SDK, the keeper and the manager share.

A metric record is NNI-shaped, `{"parameter_id", "trial_job_id", "type",
"sequence", "value"}` plus the `time` it was reported and the `run` it belongs
to (the trial's restart count: a restarted trial numbers its steps from 0
again, and runs are kept apart); unlike NNI's wire form,
`value` is the metric itself (a number or a dict with a "default" key), not
the metric dumped to a string again. A status record is `{"type": "STATUS",
"value": {"status", ...}}`; an ELASTIC record (an elastic job's sizing
decision) is shaped as a metric but shown, never fed to tuners, assessors or
metric views. On the way to the manager the keeper adds `seq`,
its spool's sequence number, and names the spool in the batch
(`{"spool": id, "records": [...]}`): the manager dedupes on (trial, spool,
seq), so a fresh spool numbering from 1 again (a trial restarted on a new
pod or node) never meets the seqs of an earlier one.

Three framings reach the keeper:
- trialkit's channel and spool: RFC 7464 JSON text sequences, each record
  `RS + JSON + LF`. JSON escapes control characters, so RS never occurs inside a
  record: a record cut short by a crash (no LF before the next RS or the end)
  is found and skipped, and the next record is still read.
- NNI local mode: `b"ME%06d" % len(data) + data` with data = JSON + LF, in
  `$NNI_SYS_DIR/.nni/metrics`.
- NNI's other platforms: stdout lines `NNISDK_MEb'<json>'`; the JSON is not
  escaped, so it may hold quotes of either kind.
Decoders never raise on bad input: they report each malformed piece once
(to `on_bad`) and go on with the next good frame.

Values. A metric is whatever JSON allows. Read through `loads`, a number that
Python cannot hold without loss (a float literal beyond +-1.8e308, an integer
of more than 4300 digits) becomes the string of its JSON text, so it is kept
and shown as written instead of turning into infinity or an error; values nest
at most MAX_DEPTH levels. `metric_number` is the one rule for "the number a
metric stands for" (tuners, assessors, the best trial, export, the page).

Ranges. Integer fields the store keeps (seq, sequence, a numeric parameter_id,
exit_code, restart_count, time) must fit SQLite's 64-bit integer; the keeper
refuses a record where one does not (`normalize`), the manager refuses it alone
(`record_problem`) and the rest of its batch is stored.
"""
from __future__ import annotations

import json
import sys
import time

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

    OnBad = Callable[[int, str], None]  # (byte offset or line number, reason)

from trialkit.statuses import (
    EARLY_STOPPED,
    FAILED,
    PREEMPTED,
    RUNNING,
    SUCCEEDED,
    SYS_CANCELED,
    USER_CANCELED,
    WAITING,
)

PERIODICAL = "PERIODICAL"
FINAL = "FINAL"
STATUS = "STATUS"
LOG = "LOG"  # a chunk of the trial's output: {"stream": "stdout"|"stderr", "text": whole lines}
# An elastic job's sizing decision (adaptdl-ray): {"workers": N, "predicted": {"N": speedup over one
# worker, ...}, "reason": "..."}. For people (trial show, the page): never a metric.
ELASTIC = "ELASTIC"
REJECTED = "REJECTED"  # the store's type for a record the manager refused (never sent as one)
METRIC_TYPES = (PERIODICAL, FINAL)
TRIAL_TYPES = (PERIODICAL, FINAL, ELASTIC)  # what a trial writes itself (the keeper makes STATUS and LOG)
RECORD_TYPES = (PERIODICAL, FINAL, STATUS, LOG, ELASTIC)
LOG_STREAMS = ("stdout", "stderr")
NNI_REQUEST_PARAMETER = "REQUEST_PARAMETER"  # NNI asks for parameters; the keeper wrote them before start
STATUSES = (WAITING, RUNNING, SUCCEEDED, FAILED, USER_CANCELED, SYS_CANCELED, EARLY_STOPPED, PREEMPTED)

RS = b"\x1e"
LF = b"\n"
NNI_STDOUT_PREFIX = b"NNISDK_MEb'"
MAX_FRAME = 1 << 20  # NNI refuses metrics of 1,000,000 bytes or more; so do we
MAX_DEPTH = 64  # nesting of a value: every JSON reader on the way (keeper, manager, SQLite) can parse it
MAX_WARNINGS = 8  # a STATUS value's `warnings`: the keeper's lines at its start (keeper/keep.py stop_warnings)
# A spool numbers its records from 1 to below SPOOL_SEQS: the store keeps each spool of a trial in a range of seqs
# this wide (manager/store.py).
SPOOL_SEQS = 1 << 40
MAX_SPOOL_ID = 64
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # SQLite's INTEGER


class BadRecord(ValueError):
    """A frame or line that decodes but is not a record we can use."""


# -- values -----------------------------------------------------------------
def plain(value: Any) -> Any:
    """numpy/torch scalars (anything with .item()) as Python numbers, without importing them."""
    item = getattr(value, "item", None)
    if item is not None and not isinstance(value, (dict, list, str, int, float)):
        try:
            return item()
        except (TypeError, ValueError):  # an array of many elements has .item() too
            pass
    return value


def _default(value: Any) -> Any:
    converted = plain(value)
    if converted is value:
        return repr(value)  # unknown object: keep something readable rather than fail the trial
    return converted


_encode = json.JSONEncoder(allow_nan=True, separators=(",", ":"), default=_default).encode
_JSON_LEAVES = (str, int, float, bool, type(None))


def plain_metric(metric: Any) -> Any:
    """A metric as plain JSON values, as the SDK writes it; BadRecord says why it cannot be.

    Taken as they stand for: numpy and torch values (a scalar as its number, an
    array as its nested list), tuples as lists, keys that are numbers as JSON
    writes them (text), any other object as its repr. Refused: keys that are no
    text or number, nesting deeper than MAX_DEPTH (a cycle too), an object whose
    conversion or repr raises. Whatever a user's object raises is caught: the
    SDK never raises into training.
    """
    try:
        return _plain_tree(metric, MAX_DEPTH)
    except BadRecord:
        raise
    except Exception as err:  # noqa: BLE001 - a user object's .item(), .tolist() or __repr__ raised
        raise BadRecord(f"converting it raised {type(err).__name__}: {str(err)[:80]}") from None


def _plain_tree(value: Any, depth: int) -> Any:
    """`value` as plain JSON values (see metric_json), at most `depth` levels of lists and objects."""
    kind = type(value)
    if kind is int:
        return _writable_int(value)
    if kind in _JSON_LEAVES:
        return value
    if isinstance(value, (dict, list, tuple)):
        if depth == 0:
            raise BadRecord(f"it nests deeper than {MAX_DEPTH} levels (or holds itself)")
        if isinstance(value, dict):
            return {_plain_key(key): _plain_tree(item, depth - 1) for key, item in value.items()}
        return [_plain_tree(item, depth - 1) for item in value]
    converted = _array_or_scalar(value)
    if converted is not value:
        return _plain_tree(converted, depth)
    for leaf in (bool, int, float, str):  # subclasses (an IntEnum, numpy's float64) as the value they hold
        if isinstance(value, leaf):
            return _writable_int(leaf(value)) if leaf is int else leaf(value)
    return repr(value)  # an unknown object: kept readable rather than lost


def _writable_int(value: int) -> int:
    """An int JSON text can hold here: Python writes none past sys.get_int_max_str_digits() digits, and its own
    error advises changing that setting, which a user's trial should not need to hear."""
    limit = sys.get_int_max_str_digits()
    if limit and value.bit_length() > 3 * limit and abs(value) >= 10 ** limit:  # 10**d takes over 3.3*d bits
        raise BadRecord(f"a whole number of more than {limit:,} digits (report it as a float or as text)")
    return value


def _plain_key(key: Any) -> str:
    """A key as JSON writes it: text as it is, a number (numpy's too), true, false or null as its JSON text."""
    if type(key) is str:
        return key
    key = _array_or_scalar(key)
    if isinstance(key, _JSON_LEAVES) and not isinstance(key, str):
        return _encode(_writable_int(key) if type(key) is int else key)
    if isinstance(key, str):
        return str(key)
    raise BadRecord(f"a key of type {type(key).__name__} is not text or a number (JSON's keys are text)")


def _array_or_scalar(value: Any) -> Any:
    """numpy's and torch's values as Python's: a scalar by .item(), an array by .tolist(); others as they are."""
    if getattr(value, "tolist", None) is not None and getattr(value, "shape", None) is not None:
        return value.tolist()  # an array of any size (of one element too, as a list of one)
    return plain(value)


def dumps(obj: Any) -> str:
    """JSON with NaN and infinities kept (as NaN/Infinity, which Python's json reads back)."""
    if type(obj) is float and obj - obj == 0.0:  # a finite float, most metrics: json's own text, 5x sooner
        return float.__repr__(obj)
    return _encode(obj)


def metric_number(value: Any) -> Optional[float]:
    """The number a metric stands for: the metric itself, or a dict's "default"; None when there is none.

    The one rule: only a finite number that a float holds counts. A string, a
    bool, a list, NaN, an infinity, or a number beyond a float's range (10**400,
    kept as reported) is not a number here: tuners and assessors get nothing
    for it, the best trial ignores it, the page shows no metric
    (web/queries.py's SQL follows the same rule).
    """
    if type(value) is dict:
        value = value.get("default")
    value = plain(value)
    if type(value) is float:
        return value if value - value == 0.0 else None  # inf - inf and NaN - NaN are NaN
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            return None
        return number if number - number == 0.0 else None
    return None


def report_step(value: Any) -> Optional[Tuple[str, int]]:
    """The (group, step) a report names itself: Determined's reports (`{"group", "steps_completed",
    "metrics"}`, as trialkit's determined package writes them); None for NNI's, which name no step."""
    if type(value) is dict and type(value.get("group")) is str and type(value.get("metrics")) is dict:
        step = value.get("steps_completed")
        if type(step) is int:
            return value["group"], step
    return None


def scalars(value: Any) -> Iterator[Tuple[str, float]]:
    """The numeric parts of a metric, named: ("default", x) for a number; each numeric key of a dict, "default"
    first; each metric of a Determined report as GROUP.NAME (`validation.loss`), the searcher's first."""
    for group, key, number in grouped_scalars(value):
        yield (key if group is None else f"{group}.{key}"), number


def scalar(value: Any, name: str) -> Optional[float]:
    """scalars' number named `name` in the metric, None where it holds none; a plain number's without a walk
    through its parts (a curve's hundred reports, bench/bench_web.py)."""
    if not isinstance(value, dict):
        return metric_number(value) if name == "default" else None
    return dict(scalars(value)).get(name)


def grouped_scalars(value: Any) -> Iterator[Tuple[Optional[str], str, float]]:
    """scalars' parts as (group, the name as its user wrote it, number): the group of a Determined report
    (training, validation), None for the rest."""
    if report_step(value) is not None:
        metrics, searched = value["metrics"], value.get("default")
        keys = sorted(metrics, key=lambda key: searched is None or metrics[key] != searched)  # stable: as written
        for key in keys:
            number = metric_number(metrics[key])
            if number is not None:
                yield value["group"], str(key), number
    elif isinstance(value, dict):
        for key in sorted(value, key=lambda key: key != "default"):
            number = metric_number(value[key])
            if number is not None:
                yield None, str(key), number
    else:
        number = metric_number(value)
        if number is not None:
            yield None, "default", number


def in_int64(value: Any) -> bool:
    """An int (not a bool) that SQLite can store as an INTEGER."""
    return type(value) is int and INT64_MIN <= value <= INT64_MAX


def depth_ok(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests at most `limit` levels of lists and objects."""
    if type(value) is dict:
        return limit > 0 and all(depth_ok(item, limit - 1) for item in value.values())
    if type(value) is list:
        return limit > 0 and all(depth_ok(item, limit - 1) for item in value)
    return True


# -- records -----------------------------------------------------------------
def parameter_id(raw: Optional[str], fallback: int) -> Any:
    """NNI's parameter ids are integers; a trial started without one uses its sequence number."""
    if raw is None:
        return fallback
    try:
        number = int(raw)
    except ValueError:
        return raw
    return number if in_int64(number) else raw  # beyond SQLite's integers: kept as the text it is


def status_record(status: str, fields: Dict[str, Any], trial_id: str, run: Optional[int] = None) -> Dict[str, Any]:
    return {"type": STATUS, "trial_job_id": trial_id, "time": time.time(), "run": run,
            "value": {"status": status, **fields}}


def log_record(stream: str, text: str, trial_id: str, run: Optional[int] = None) -> Dict[str, Any]:
    return {"type": LOG, "trial_job_id": trial_id, "time": time.time(), "run": run,
            "value": {"stream": stream, "text": text}}


def nni_parameter_cfg(pid: Any, parameters: Dict[str, Any]) -> Dict[str, Any]:
    """The content of NNI's parameter.cfg, which nni.get_next_parameter() waits for."""
    return {"parameter_id": pid, "parameter_source": "algorithm", "parameters": parameters, "parameter_index": 0}


_IDENT_TYPES = (type(None), int, str)


def _ident(value: Any) -> Any:
    """An id as the store keeps it: None, a 64-bit integer or text (anything else as its text)."""
    kind = type(value)
    if kind is str or value is None or (kind is int and INT64_MIN <= value <= INT64_MAX):
        return value
    return str(value)


def normalize(obj: Any, source: str, run: Optional[int] = None) -> Optional[Dict[str, Any]]:
    """A decoded trialkit or NNI record in trialkit's shape, valid on the wire; None for NNI's parameter requests.

    `run` is the keeper's run number, for records that do not carry one (NNI's SDK writes none).
    """
    if type(obj) is not dict:
        raise BadRecord(f"expected a JSON object, got {type(obj).__name__}")
    kind = obj.get("type")
    if kind == NNI_REQUEST_PARAMETER:
        return None
    if kind not in TRIAL_TYPES:
        raise BadRecord(f"unknown record type {kind!r:.40}")
    if "value" not in obj:
        raise BadRecord("no value")
    value = obj["value"]
    if type(value) is str:
        # NNI dumps the metric a second time; trialkit's SDK does not.
        try:
            value = loads(value)
        except BadRecord:
            pass  # a metric that is a plain string stays one
    when = obj.get("time")
    rec = {
        "type": kind,
        "parameter_id": _ident(obj.get("parameter_id")),
        "trial_job_id": _ident(obj.get("trial_job_id")),
        "sequence": obj.get("sequence"),
        "value": value,
        "time": _seconds(when),
        "source": source,
        "run": obj.get("run", run),
    }
    problem = record_problem(rec)
    if problem:
        raise BadRecord(problem)
    return rec


def _seconds(when: Any) -> float:
    """A record's time as a finite float; now when it has none that is one."""
    if type(when) in (int, float):
        try:
            when = float(when)
        except OverflowError:
            return time.time()
        if when - when == 0.0:
            return when
    return time.time()


_STATUS_FIELDS = {"exit_code": int, "restart_count": int, "reason": str}


def _bad_text(text: str) -> bool:
    """Text SQLite cannot take: JSON's \\ud800-style escapes can make lone surrogates, which are not UTF-8."""
    if text.isascii():
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _field_problem(name: str, value: Any, kind: type) -> Optional[str]:
    """Why one optional field cannot be stored, or None: of type `kind`, 64-bit when an integer, UTF-8 when text."""
    if value is None:
        return None
    if kind is int and type(value) is int:
        if INT64_MIN <= value <= INT64_MAX:
            return None
        return f"{name} {value!r:.40} is out of range (a 64-bit integer)"
    if type(value) is str and kind is str:
        return f"{name} is not valid Unicode text" if _bad_text(value) else None
    return f"{name} {value!r:.40} has the wrong type ({'an integer' if kind is int else 'text'} or null)"


def _elastic_problem(value: Any) -> Optional[str]:
    """Why an ELASTIC value cannot be shown, or None: a worker count, speedups by count, a reason."""
    if (type(value) is not dict or not in_int64(value.get("workers")) or value["workers"] < 0
            or type(value.get("predicted")) is not dict or type(value.get("reason")) is not str):
        return 'an ELASTIC value is {"workers": N, "predicted": {"N": speedup, ...}, "reason": "..."}'
    for count, speedup in value["predicted"].items():
        if not (count.isascii() and count.isdigit()) or type(speedup) not in (int, float) or speedup - speedup != 0:
            return f"predicted {count!r:.20}: {speedup!r:.20} is not a worker count and a finite speedup"
    if _bad_text(value["reason"]):
        return "the reason is not valid Unicode text"
    return None


def record_problem(rec: Dict[str, Any]) -> Optional[str]:
    """Why a record (with or without its seq) cannot be stored, or None when it can. Exact type checks: hot path."""
    kind = rec.get("type")
    if kind not in RECORD_TYPES:
        return f"unknown type {kind!r:.40}"
    if "value" not in rec:
        return "no value"
    value = rec["value"]
    if kind == STATUS:
        if type(value) is not dict or value.get("status") not in STATUSES:
            return f"a STATUS value needs a status, one of {', '.join(STATUSES)}"
        for key, field_type in _STATUS_FIELDS.items():
            problem = _field_problem(key, value.get(key), field_type)
            if problem:
                return problem
        said = value.get("warnings")
        if said is not None and (type(said) is not list or len(said) > MAX_WARNINGS
                                 or any(type(line) is not str or _bad_text(line) for line in said)):
            return f"warnings is a list of at most {MAX_WARNINGS} lines of text"
    elif kind == LOG:
        if type(value) is not dict or value.get("stream") not in LOG_STREAMS or type(value.get("text")) is not str:
            return 'a LOG value is {"stream": "stdout" or "stderr", "text": "..."}'
        if _bad_text(value["text"]):
            return "the log text is not valid Unicode"
    elif kind == ELASTIC:
        problem = _elastic_problem(value)
        if problem:
            return problem
    elif type(value) in (dict, list) and not depth_ok(value):
        return f"value nests deeper than {MAX_DEPTH} levels"
    # The fields each record has are checked inline for what they nearly always are (a 64-bit integer, ASCII
    # text, null), _field_problem only for the rest: a function call per field was a tenth of the manager's time.
    for key in ("sequence", "run"):
        number = rec.get(key)
        if number is not None and not (type(number) is int and INT64_MIN <= number <= INT64_MAX):
            problem = _field_problem(key, number, int)
            if problem:
                return problem
    when = rec.get("time")
    if when is not None and type(when) is not float:
        problem = _field_problem("time", when, int)  # an int time must fit the column too
        if problem:
            return problem if type(when) is int else f"time {when!r:.40} is not a number"
    for key in ("parameter_id", "source", "trial_job_id"):
        ident = rec.get(key)
        if ident is None or (type(ident) is int and INT64_MIN <= ident <= INT64_MAX):
            continue
        if type(ident) is not str:
            problem = _field_problem(key, ident, int)
            if problem:
                return problem if type(ident) is int else f"{key} {ident!r:.40} is not a string or an integer"
        elif not ident.isascii() and _bad_text(ident):
            return f"{key} is not valid Unicode text"
    return None


def seq_problem(rec: Any) -> Optional[str]:
    """Why a record sent to the manager cannot even be acknowledged (no usable seq), or None."""
    if type(rec) is not dict:
        return "a record is not a JSON object"
    seq = rec.get("seq")
    if type(seq) is not int or not 1 <= seq <= INT64_MAX:
        return f"seq {seq!r:.40} is not a positive 64-bit integer"
    return None


def spool_problem(spool: Any) -> Optional[str]:
    """Why a batch's spool id is unusable, or None. It names files of the manager's (replica_logs.py)."""
    if type(spool) is not str or not 0 < len(spool) <= MAX_SPOOL_ID or not (spool.isascii() and spool.isalnum()):
        return f"spool {spool!r:.40} is not 1 to {MAX_SPOOL_ID} ASCII letters and digits"
    return None


def split_batch(body: Any) -> Tuple[str, List[Dict[str, Any]], List[Tuple[Dict[str, Any], str]]]:
    """A keeper's `{"spool": id, "records": [...]}` as (its spool id, records to store, [(record, why it is
    refused)]). The id is "" where the batch names none (a keeper from before spools had ids).

    Raises BadRecord when the batch as a whole is unusable: not that shape, a
    spool id that is no id, or a record without a seq to acknowledge it by.
    """
    if type(body) is not dict or type(body.get("records")) is not list:
        raise BadRecord('expected {"records": [...]}')
    spool = body.get("spool", "")
    problem = spool_problem(spool) if spool != "" else None
    if problem:
        raise BadRecord(problem)
    good, refused = [], []
    for rec in body["records"]:
        problem = seq_problem(rec)
        if not problem and spool and rec["seq"] >= SPOOL_SEQS:
            problem = f"seq {rec['seq']} is past a spool's last ({SPOOL_SEQS - 1})"
        if problem:
            raise BadRecord(problem)
        problem = record_problem(rec)
        if problem:
            refused.append((rec, problem))
        else:
            good.append(rec)
    return spool, good, refused


def wire_problem(rec: Any) -> Optional[str]:
    """Why a record sent to the manager is unusable, or None when it is fine."""
    problem = seq_problem(rec)
    if problem:
        return problem
    problem = record_problem(rec)
    return f"record {rec['seq']}: {problem}" if problem else None


# -- framing -----------------------------------------------------------------
_FRAME = "\x1e%s\n"  # RS + one JSON text + LF


def frame(text: str) -> bytes:
    """One RFC 7464 frame of one JSON text (which, escaped as dumps writes it, never holds RS or LF)."""
    return (_FRAME % text).encode()


# A metric record's frame in one format: the SDK's hot path (no dict, no encoder, one %, one encode).
_METRIC_FRAME = _FRAME % '{"type":"%s","sequence":%d,"time":%r,"value":%s,%s'


def metric_frame(kind: str, sequence: int, when: float, value_json: str, ident_json: str) -> bytes:
    """The frame of one metric record from its parts' JSON texts.

    `ident_json` is the constant rest of the record: a JSON object's members
    without its opening brace, as `dumps(ident)[1:]` gives them.
    """
    return (_METRIC_FRAME % (kind, sequence, when, value_json, ident_json)).encode()


class _Decoder:
    """What the framed-file decoders share: where they are, and reporting bad stretches once."""

    def __init__(self, on_bad: OnBad, offset: int = 0):
        self.on_bad = on_bad
        self.offset = offset  # where the next unread frame starts
        self._buf = b""
        self._junk = False  # inside a bad stretch already reported

    def finish(self) -> None:
        """No more data will come: a partial frame left over was torn by a crash."""
        if self._buf:
            self._bad(self.offset, "the last frame is cut short")
            self.offset += len(self._buf)
            self._buf = b""

    def _bad(self, offset: int, reason: str) -> None:
        if not self._junk:
            self.on_bad(offset, reason)
        self._junk = True


class SeqDecoder(_Decoder):
    """Incremental RFC 7464 decoder."""

    def __init__(self, on_bad: OnBad, offset: int = 0, max_frame: int = MAX_FRAME):
        super().__init__(on_bad, offset)
        self.max_frame = max_frame

    def feed(self, data: bytes) -> List[Tuple[bytes, int]]:
        """Good payloads in `data` (after what was fed before), each with the offset just past it."""
        buf = self._buf + data if self._buf else data
        out: List[Tuple[bytes, int]] = []
        pos = 0
        while pos < len(buf):
            if buf[pos:pos + 1] != RS:
                nxt = buf.find(RS, pos)
                self._bad(self.offset + pos, "bytes outside a frame")
                pos = len(buf) if nxt < 0 else nxt
                continue
            end = buf.find(LF, pos + 1)
            nxt = buf.find(RS, pos + 1)
            if nxt >= 0 and (end < 0 or nxt < end):
                self._bad(self.offset + pos, "a frame cut short (no end before the next frame)")
                pos = nxt
                continue
            if (end < 0 and len(buf) - pos > self.max_frame) or end - pos > self.max_frame:
                self._bad(self.offset + pos, f"a frame longer than {self.max_frame} bytes")
                pos = len(buf) if end < 0 else end + 1
                continue
            if end < 0:
                break  # the rest of this frame is not written yet
            out.append((buf[pos + 1:end], self.offset + end + 1))
            self._junk = False
            pos = end + 1
        self.offset += pos
        self._buf = buf[pos:]
        return out

class NniFrameDecoder(_Decoder):
    """Incremental decoder of NNI's `ME%06d` + data frames (local mode's metrics file)."""

    HEADER = 8

    def feed(self, data: bytes) -> List[Tuple[bytes, int]]:
        buf = self._buf + data if self._buf else data
        out: List[Tuple[bytes, int]] = []
        pos = 0
        while len(buf) - pos >= self.HEADER:
            head = buf[pos:pos + self.HEADER]
            if head[:2] != b"ME" or not head[2:].isdigit():
                self._bad(self.offset + pos, "not a frame header")
                pos = self._resync(buf, pos)
                continue
            end = pos + self.HEADER + int(head[2:])
            if end > len(buf):
                break  # the rest of this frame is not written yet
            data_ = buf[pos + self.HEADER:end]
            if not data_.endswith(LF):
                # A frame cut short and followed by the next one: look for that one's header inside.
                self._bad(self.offset + pos, "a frame cut short")
                pos = self._resync(buf, pos)
                continue
            out.append((data_, self.offset + end))
            self._junk = False
            pos = end
        if pos < len(buf) and not b"ME".startswith(buf[pos:pos + 2]):
            self._bad(self.offset + pos, "not a frame header")
            pos = self._resync(buf, pos)
        self.offset += pos
        self._buf = buf[pos:]
        return out

    @staticmethod
    def _resync(buf: bytes, pos: int) -> int:
        """The next place a header may start after `pos` (keeping a trailing "M" that may begin one)."""
        nxt = buf.find(b"ME", pos + 1)
        if nxt >= 0:
            return nxt
        return len(buf) - 1 if buf.endswith(b"M") else len(buf)


def parse_nni_stdout(line: bytes) -> Any:
    """The record in a `NNISDK_MEb'<json>'` line (its JSON is raw, quotes and all)."""
    if not line.startswith(NNI_STDOUT_PREFIX) or not line.endswith(b"'"):
        raise BadRecord("not an NNISDK_MEb'...' line")
    body = line[len(NNI_STDOUT_PREFIX):-1]
    try:
        return loads(body)
    except BadRecord:
        pass
    import ast  # here, for the rare repr-style line: not on every keeper's and trial's start

    try:
        # Some writers print Python's repr of the bytes instead (escaped quotes, \\x.. bytes).
        return loads(ast.literal_eval("b'" + body.decode("ascii") + "'"))
    except (ValueError, SyntaxError, RecursionError, MemoryError) as err:
        raise BadRecord(f"not JSON: {err}") from None


def _lossless_float(text: str) -> Any:
    value = float(text)
    return value if value - value == 0.0 else text  # 1e400 would read as inf: keep what was written


def _lossless_int(text: str) -> Any:
    try:
        return int(text)
    except ValueError:  # over Python's 4300 digits for int(str): kept as what was written
        return text


_decode = json.JSONDecoder(parse_float=_lossless_float, parse_int=_lossless_int).decode


def loads(payload: Any) -> Any:
    """JSON (bytes or text) as trialkit reads every record: numbers kept without loss (see the module's doc)."""
    try:
        return _decode(payload.decode() if type(payload) is bytes else payload)
    except (ValueError, RecursionError) as err:  # RecursionError: nesting deeper than Python's stack
        raise BadRecord(f"not JSON: {str(err)[:200]}") from None
