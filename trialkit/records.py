"""Record shapes and the framing codecs the SDK, the keeper and the manager share.

A metric record is NNI-shaped, `{"parameter_id", "trial_job_id", "type",
"sequence", "value"}` plus the `time` it was reported; unlike NNI's wire form,
`value` is the metric itself (a number or a dict with a "default" key), not
the metric dumped to a string again. A status record is `{"type": "STATUS",
"value": {"status", ...}}`. On the way to the manager the keeper adds `seq`,
its own sequence number, which the manager dedupes on.

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
"""
from __future__ import annotations

import ast
import json
import math
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

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
METRIC_TYPES = (PERIODICAL, FINAL)
RECORD_TYPES = (PERIODICAL, FINAL, STATUS)
NNI_REQUEST_PARAMETER = "REQUEST_PARAMETER"  # NNI asks for parameters; the keeper wrote them before start
STATUSES = (WAITING, RUNNING, SUCCEEDED, FAILED, USER_CANCELED, SYS_CANCELED, EARLY_STOPPED, PREEMPTED)

RS = b"\x1e"
LF = b"\n"
NNI_STDOUT_PREFIX = b"NNISDK_MEb'"
MAX_FRAME = 1 << 20  # NNI refuses metrics of 1,000,000 bytes or more; so do we

OnBad = Callable[[int, str], None]  # (byte offset or line number, reason)


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


def dumps(obj: Any) -> str:
    """JSON with NaN and infinities kept (as NaN/Infinity, which Python's json reads back)."""
    return _encode(obj)


def is_metric(value: Any) -> bool:
    """A number, or a dict whose "default" is a number (what tuners read)."""
    value = plain(value.get("default") if isinstance(value, dict) else value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def scalars(value: Any) -> Iterator[Tuple[str, float]]:
    """The numeric parts of a metric, named: ("default", x) for a number; each numeric key of a dict."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                yield str(key), float(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield "default", float(value)


# -- records -----------------------------------------------------------------
def parameter_id(raw: Optional[str], fallback: int) -> Any:
    """NNI's parameter ids are integers; a trial started without one uses its sequence number."""
    if raw is None:
        return fallback
    try:
        return int(raw)
    except ValueError:
        return raw


def status_record(status: str, fields: Dict[str, Any], trial_id: str) -> Dict[str, Any]:
    return {"type": STATUS, "trial_job_id": trial_id, "time": time.time(), "value": {"status": status, **fields}}


def nni_parameter_cfg(pid: Any, parameters: Dict[str, Any]) -> Dict[str, Any]:
    """The content of NNI's parameter.cfg, which nni.get_next_parameter() waits for."""
    return {"parameter_id": pid, "parameter_source": "algorithm", "parameters": parameters, "parameter_index": 0}


_IDENT_TYPES = (type(None), int, str)


def _ident(value: Any) -> Any:
    return value if type(value) in _IDENT_TYPES else str(value)


def normalize(obj: Any, source: str) -> Optional[Dict[str, Any]]:
    """A decoded trialkit or NNI record in trialkit's shape, valid on the wire; None for NNI's parameter requests."""
    if type(obj) is not dict:
        raise BadRecord(f"expected a JSON object, got {type(obj).__name__}")
    kind = obj.get("type")
    if kind == NNI_REQUEST_PARAMETER:
        return None
    if kind not in METRIC_TYPES:
        raise BadRecord(f"unknown record type {kind!r}")
    if "value" not in obj:
        raise BadRecord("no value")
    value = obj["value"]
    if type(value) is str:
        # NNI dumps the metric a second time; trialkit's SDK does not.
        try:
            value = json.loads(value)
        except ValueError:
            pass  # a metric that is a plain string stays one
    sequence = obj.get("sequence")
    if sequence is not None and type(sequence) is not int:
        raise BadRecord(f"sequence {sequence!r} is not an integer")
    when = obj.get("time")
    return {
        "type": kind,
        "parameter_id": _ident(obj.get("parameter_id")),
        "trial_job_id": _ident(obj.get("trial_job_id")),
        "sequence": sequence,
        "value": value,
        "time": when if type(when) in (int, float) and math.isfinite(when) else time.time(),
        "source": source,
    }


_STATUS_FIELDS = {"exit_code": (type(None), int), "restart_count": (type(None), int), "reason": (type(None), str)}


def wire_problem(rec: Any) -> Optional[str]:
    """Why a record sent to the manager is unusable, or None when it is fine (exact type checks: hot path)."""
    if type(rec) is not dict:
        return "a record is not a JSON object"
    seq = rec.get("seq")
    if type(seq) is not int or seq < 1:
        return f"seq {seq!r} is not a positive integer"
    kind = rec.get("type")
    if kind not in RECORD_TYPES:
        return f"record {seq}: unknown type {kind!r}"
    if "value" not in rec:
        return f"record {seq}: no value"
    if kind == STATUS:
        value = rec["value"]
        if type(value) is not dict or value.get("status") not in STATUSES:
            return f"record {seq}: a STATUS value needs a status, one of {', '.join(STATUSES)}"
        for key, types in _STATUS_FIELDS.items():
            if type(value.get(key)) not in types:
                return f"record {seq}: {key} {value.get(key)!r:.40} has the wrong type"
    sequence = rec.get("sequence")
    if sequence is not None and type(sequence) is not int:
        return f"record {seq}: sequence {sequence!r} is not an integer"
    when = rec.get("time")
    if when is not None and type(when) not in (int, float):
        return f"record {seq}: time {when!r} is not a number"
    for key in ("parameter_id", "source", "trial_job_id"):
        if type(rec.get(key)) not in _IDENT_TYPES:
            return f"record {seq}: {key} {rec.get(key)!r:.40} is not a string or an integer"
    return None


# -- framing -----------------------------------------------------------------
def frame(payload: bytes) -> bytes:
    return RS + payload + LF


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
        return json.loads(body)
    except (ValueError, RecursionError):
        pass
    try:
        # Some writers print Python's repr of the bytes instead (escaped quotes, \\x.. bytes).
        return json.loads(ast.literal_eval("b'" + body.decode("ascii") + "'"))
    except (ValueError, SyntaxError, RecursionError) as err:
        raise BadRecord(f"not JSON: {err}") from None


def loads(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as err:  # RecursionError: nesting deeper than Python's stack
        raise BadRecord(f"not JSON: {err}") from None
