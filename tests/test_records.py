"""Record shapes and framing codecs: good input decodes, bad input is skipped and said once, never a crash."""
from __future__ import annotations

import collections
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trialkit import records


def seq_frames(*objs) -> bytes:
    return b"".join(records.frame(json.dumps(o)) for o in objs)


def nni_frame(obj) -> bytes:
    data = (json.dumps(obj) + "\n").encode()
    return b"ME%06d" % len(data) + data


def payloads(decoder_class, data: bytes, pieces: int = 1):
    bad = []
    decoder = decoder_class(lambda at, why: bad.append((at, why)))
    out = []
    step = max(1, len(data) // pieces)
    for start in range(0, len(data), step):
        out += decoder.feed(data[start:start + step])
    decoder.finish()
    return [p for p, _ in out], bad, decoder.offset


def decode_all(decoder_class, data: bytes, pieces: int = 1):
    found, bad, offset = payloads(decoder_class, data, pieces)
    return [json.loads(p) for p in found], bad, offset


@pytest.mark.parametrize("pieces", [1, 3, 1000])
def test_json_seq_round_trip_in_any_pieces(pieces):
    objs = [{"i": i, "s": "quote ' and \" and \n newline"} for i in range(50)]
    data = seq_frames(*objs)
    got, bad, offset = decode_all(records.SeqDecoder, data, pieces)
    assert got == objs and bad == [] and offset == len(data)


def test_json_seq_torn_last_frame_is_skipped_at_finish():
    data = seq_frames({"a": 1}) + b'\x1e{"a": 2'
    bad = []
    decoder = records.SeqDecoder(lambda at, why: bad.append((at, why)))
    got = decoder.feed(data)
    assert [json.loads(p) for p, _ in got] == [{"a": 1}]
    assert bad == []  # still being written, as far as the decoder knows
    assert decoder.offset == len(seq_frames({"a": 1}))  # a resume starts at the torn frame
    decoder.finish()
    assert len(bad) == 1 and "cut short" in bad[0][1]


def test_json_seq_torn_frame_followed_by_good_ones():
    data = seq_frames({"a": 1}) + b'\x1e{"torn": tr' + seq_frames({"a": 2}, {"a": 3})
    got, bad, _ = decode_all(records.SeqDecoder, data)
    assert got == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert len(bad) == 1


def test_json_seq_junk_between_frames_is_one_warning():
    data = seq_frames({"a": 1}) + b"garbage\nmore garbage\n" + seq_frames({"a": 2})
    got, bad, _ = decode_all(records.SeqDecoder, data, pieces=7)
    assert got == [{"a": 1}, {"a": 2}]
    assert len(bad) == 1 and "outside a frame" in bad[0][1]


def test_json_seq_oversized_frame_is_skipped():
    bad = []
    decoder = records.SeqDecoder(lambda at, why: bad.append(why), max_frame=100)
    got = decoder.feed(b"\x1e" + b"x" * 300 + b"\n" + seq_frames({"ok": True}))
    assert [json.loads(p) for p, _ in got] == [{"ok": True}]
    assert len(bad) == 1


def test_nni_frames_round_trip_in_pieces():
    objs = [{"type": "PERIODICAL", "value": json.dumps(i)} for i in range(30)]
    data = b"".join(nni_frame(o) for o in objs)
    for pieces in (1, 5, len(data)):
        got, bad, offset = decode_all(records.NniFrameDecoder, data, pieces)
        assert got == objs and bad == [] and offset == len(data)


def test_nni_torn_frame_then_good_frame_resyncs():
    good = nni_frame({"a": 2})
    torn = nni_frame({"a": 1, "pad": "x" * 20})[:-10]
    got, bad, _ = decode_all(records.NniFrameDecoder, torn + good + nni_frame({"a": 3}))
    assert got == [{"a": 2}, {"a": 3}]
    assert len(bad) == 1


def test_nni_torn_last_frame_and_bad_header():
    data = b"XX" + nni_frame({"a": 1}) + nni_frame({"a": 2})[:12]
    got, bad, _ = decode_all(records.NniFrameDecoder, data)
    assert got == [{"a": 1}]
    assert [why for _, why in bad] == ["not a frame header", "the last frame is cut short"]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=1, max_value=50))
def test_decoders_never_raise_on_any_bytes(noise, pieces):
    for decoder_class in (records.SeqDecoder, records.NniFrameDecoder):
        for payload in payloads(decoder_class, noise, pieces)[0]:
            try:  # as the keeper's collector does with each payload
                records.normalize(records.loads(payload), "channel")
            except records.BadRecord:
                pass


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=20), st.binary(max_size=30),
       st.integers(min_value=0, max_value=19))
def test_seq_decoder_loses_only_the_damaged_frame(values, noise, where):
    frames = [records.frame(json.dumps({"v": v})) for v in values]
    where = where % len(frames)
    damaged = frames[where][: len(frames[where]) // 2] + noise.replace(b"\x1e", b"").replace(b"\n", b"")
    data = b"".join(frames[:where]) + damaged + b"".join(frames[where + 1:])
    got, _, _ = decode_all(records.SeqDecoder, data)
    expected = [{"v": v} for i, v in enumerate(values) if i != where]
    assert [g for g in got if g in expected] == expected


def test_nni_stdout_line_with_quotes_of_both_kinds():
    record = {"parameter_id": 3, "trial_job_id": "abc", "type": "PERIODICAL", "sequence": 1,
              "value": json.dumps({"default": 0.5, "it's": "say \"hi\""})}
    line = b"NNISDK_MEb'" + json.dumps(record).encode() + b"'"
    rec = records.normalize(records.parse_nni_stdout(line), "stdout")
    assert rec["value"] == {"default": 0.5, "it's": 'say "hi"'}
    assert rec["parameter_id"] == 3 and rec["sequence"] == 1 and rec["source"] == "stdout"


def test_nni_stdout_line_in_bytes_repr_form():
    payload = json.dumps({"type": "FINAL", "sequence": 0, "value": "0.25", "note": "it's"}).encode()
    line = b"NNISDK_ME" + repr(payload).encode()
    assert records.normalize(records.parse_nni_stdout(line), "stdout")["value"] == 0.25


@pytest.mark.parametrize("line", [b"NNISDK_MEb'{not json}'", b"NNISDK_MEb'", b"NNISDK_MEb'[1, 2]'",
                                  b"NNISDK_MEb'" + b"[" * 100000 + b"'"])
def test_bad_nni_stdout_lines_raise_bad_record(line):
    with pytest.raises(records.BadRecord):
        records.normalize(records.parse_nni_stdout(line), "stdout")


def test_normalize_skips_parameter_requests_and_rejects_unknown_types():
    assert records.normalize({"type": "REQUEST_PARAMETER", "sequence": 0}, "nni") is None
    with pytest.raises(records.BadRecord):
        records.normalize({"type": "BOGUS", "value": 1}, "nni")
    with pytest.raises(records.BadRecord):
        records.normalize({"type": "FINAL"}, "nni")


def test_nan_and_infinity_survive_a_round_trip():
    text = records.dumps({"default": float("nan"), "hi": float("inf"), "lo": float("-inf")})
    back = json.loads(text)
    assert math.isnan(back["default"]) and back["hi"] == math.inf and back["lo"] == -math.inf


def test_numpy_and_torch_scalars_become_numbers():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    assert records.plain(np.float32(1.5)) == 1.5 and type(records.plain(np.float32(1.5))) is float
    assert records.plain(torch.tensor(2)) == 2
    assert json.loads(records.dumps({"default": np.int64(3), "t": torch.tensor(0.5)})) == {"default": 3, "t": 0.5}
    assert records.metric_number({"default": np.float64(0.1)}) == 0.1 and records.metric_number(np.float32(2)) == 2.0
    assert records.metric_number("high") is None and records.metric_number({"loss": 1.0}) is None


@pytest.mark.parametrize("value", [0.5, 3, True, "high", None, float("nan"), float("inf"), 10 ** 400, [1.0],
                                   {"default": 0.5, "loss": 2}, {"loss": 1.5}, {"default": "x", "acc": 1},
                                   collections.OrderedDict(default=0.25, loss=4.0),
                                   {"group": "validation", "steps_completed": 10, "metrics": {"loss": 0.3}},
                                   {"group": "training", "steps_completed": "x", "metrics": {"loss": 0.3}}])
def test_scalar_is_the_number_scalars_names(value):
    """records.scalar takes a plain number's "default" straight (a curve's reports, the page's answer): each name
    gives what scalars gives it, whatever the value."""
    named = dict(records.scalars(value))
    for name in ("default", "loss", "acc", "validation.loss", "training.loss", "nope"):
        assert records.scalar(value, name) == named.get(name), name


def test_wire_problem_names_what_is_wrong():
    good = {"seq": 1, "type": "PERIODICAL", "value": 0.5, "sequence": 0}
    assert records.wire_problem(good) is None
    assert records.wire_problem({**good, "seq": 0}) == "seq 0 is not a positive 64-bit integer"
    assert "unknown type" in records.wire_problem({**good, "type": "X"})
    assert "no value" in records.wire_problem({"seq": 1, "type": "FINAL"})
    assert "status" in records.wire_problem({"seq": 1, "type": "STATUS", "value": {"status": "DANCING"}})
    assert "parameter_id" in records.wire_problem({**good, "parameter_id": {"x": 1}})
    assert records.wire_problem({"seq": 2, "type": "STATUS", "value": {"status": "RUNNING"}}) is None


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["value", "sequence", "parameter_id", "trial_job_id", "time", "other"]), _json),
       st.sampled_from(records.TRIAL_TYPES))
def test_whatever_the_keeper_accepts_the_manager_accepts(obj, kind):
    # A record the manager refused would be retried forever: normalize must never let one through.
    try:
        rec = records.normalize({**obj, "type": kind}, "channel")
    except records.BadRecord:
        return
    wire = json.loads(records.dumps({"seq": 1, **rec}))
    assert records.wire_problem(wire) is None
