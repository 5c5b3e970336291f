"""Hypothesis against the manager's records route and the keeper's decoders (issue 16's fuzz check).

The manager runs as its own process on loopback (`python -m trialkit.manager.server`):
whatever a client sends, it answers 200 or 400, never 500, and never exits;
every valid record sent is stored as sent; whatever the keeper's decoders let
through, the manager stores as a record (never refuses it). Each test prints
how many cases ran (pytest -s shows them).
"""
from __future__ import annotations

import json

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import Manager
from trialkit import records

INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1  # SQLite's INTEGER
INT64 = st.integers(min_value=INT64_MIN, max_value=INT64_MAX)


def usable_seq(rec) -> bool:
    """A seq the manager can acknowledge a record by."""
    seq = rec.get("seq") if isinstance(rec, dict) else None
    return type(seq) is int and 1 <= seq <= INT64_MAX
# Numbers of every size: small, beyond int64, beyond a float, and float edge cases.
NUMBERS = st.one_of(st.integers(), INT64, st.integers(min_value=-10 ** 4000, max_value=10 ** 4000),
                    st.floats(), st.sampled_from([2 ** 63, -2 ** 63 - 1, 2 ** 64, 10 ** 400, 5e-324, -0.0]))
TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["\ud800", "x\udfffy", "\x00", "\x1e", "\n", "'", '"']))
LEAVES = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                      max_leaves=10)


def nested(depth: int, leaf=1):
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"default": value}
    return value


DEEP = st.integers(min_value=0, max_value=200).map(nested)
ANY = st.one_of(VALUES, DEEP)
FIELDS = ("type", "value", "sequence", "parameter_id", "time", "source", "trial_job_id", "rank", "run")
TYPES = st.one_of(st.sampled_from(records.RECORD_TYPES), ANY)
STATUS_VALUES = st.fixed_dictionaries({"status": st.one_of(st.sampled_from(records.STATUSES), ANY)},
                                      optional={"exit_code": ANY, "restart_count": ANY, "reason": ANY})
# Anything a client may send as one record: right or wrong types, any sizes, any nesting.
WILD = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), ANY, max_size=6).flatmap(
        lambda rec: TYPES.map(lambda kind: {**rec, "type": kind})),
    st.fixed_dictionaries({"type": st.just(records.STATUS), "value": STATUS_VALUES}),
    ANY)
# Records a good keeper sends: these must all be stored, as sent.
VALID = st.fixed_dictionaries(
    {"type": st.sampled_from(records.METRIC_TYPES),
     "value": st.recursive(st.one_of(st.none(), st.booleans(), st.floats(), st.text(max_size=8),
                                     st.integers(min_value=-10 ** 300, max_value=10 ** 300)),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3), max_leaves=8)},
    optional={"sequence": st.one_of(st.none(), INT64), "parameter_id": st.one_of(st.none(), INT64, st.text()),
              "time": st.floats(allow_nan=False, allow_infinity=False), "source": st.text(max_size=8)})


@pytest.fixture
def manager(tmp_path):
    m = Manager(tmp_path / "exp")
    m.register("t1", "token-1")
    m.start()
    yield m
    m.close()


class Client:
    """Posts batches to one trial's records route on one keep-alive connection; keeps the count."""

    def __init__(self, manager: Manager):
        self.manager = manager
        self.http = requests.Session()
        self.url = f"{manager.url}/api/v1/trials/t1/records"
        self.next_seq = 1
        self.sent = {}  # seq -> a valid record sent, which must be stored as sent
        self.answers = {}

    def seq(self) -> int:
        self.next_seq += 1
        return self.next_seq - 1

    def post(self, body: bytes) -> requests.Response:
        answer = self.http.post(self.url, data=body, headers={"Authorization": "Bearer token-1"}, timeout=60)
        self.answers[answer.status_code] = self.answers.get(answer.status_code, 0) + 1
        assert answer.status_code in (200, 400), (answer.status_code, answer.text, body[:300])
        assert self.manager.proc.poll() is None, "the manager exited"
        return answer

    def check_stored(self) -> None:
        stored = {rec["seq"]: rec for rec in self.manager.store.records_for("t1")}
        assert self.manager.store.acked_seq("t1") == self.next_seq - 1  # every seq sent is held: none blocks
        for seq, rec in self.sent.items():
            got = stored[seq]
            assert got["type"] == rec["type"] and records.dumps(got["value"]) == records.dumps(rec["value"]), seq


def encode(recs) -> bytes:
    return ('{"records":[%s]}' % ",".join(records.dumps(rec) for rec in recs)).encode()


def test_the_records_route_never_answers_500_never_exits_and_loses_no_valid_record(manager, capsys):
    client = Client(manager)
    cases = {"batches": 0, "records": 0, "refused": 0, "whole batch 400": 0}

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.booleans(), VALID, WILD, st.sampled_from(["fresh", "wild"]), ANY), max_size=6))
    def check(picks):
        cases["batches"] += 1
        batch, valid = [], []
        for is_valid, good, wild, seq_kind, wild_seq in picks:
            if is_valid:
                rec = {"seq": client.seq(), **good}
                valid.append(rec)
            elif seq_kind == "fresh" and isinstance(wild, dict):
                rec = {**wild, "seq": client.seq()}
            else:  # no usable seq: the whole batch is refused
                bad_seq = "no seq" if usable_seq({"seq": wild_seq}) else wild_seq
                rec = {**wild, "seq": bad_seq} if isinstance(wild, dict) else wild
            batch.append(rec)
        cases["records"] += len(batch)
        answer = client.post(encode(batch))
        if answer.status_code == 200:
            cases["refused"] += len(answer.json().get("rejected", []))
        else:
            cases["whole batch 400"] += 1
            # Nothing of a refused batch is stored: send its records that have a usable seq again, alone.
            kept = [rec for rec in batch if usable_seq(rec) and rec["seq"] < client.next_seq]
            assert client.post(encode(kept)).status_code == 200
        client.sent.update((rec["seq"], rec) for rec in valid)
        client.check_stored()

    check()
    for raw in (b"", b"{", b"[" * 100000, b'{"records":[' + b"[" * 5000 + b"]",
                "\ud800".encode("utf-8", "surrogatepass"),
                b'{"records":[{"seq":1,"type":"FINAL","value":' + b"9" * 100000 + b"}]}"):
        client.post(raw)
    with capsys.disabled():
        print(f"\nrecords route fuzz: {cases}; answers by status {client.answers}; manager alive, "
              f"{len(client.sent)} valid records all stored as sent")
    assert client.answers.get(500, 0) == 0 and cases["batches"] >= 300


PLAUSIBLE = st.fixed_dictionaries({"type": st.sampled_from(records.METRIC_TYPES), "value": ANY},
                                  optional={f: st.one_of(st.none(), INT64, LEAVES) for f in FIELDS[2:]})
FRAME_OBJECTS = st.one_of(WILD, PLAUSIBLE, PLAUSIBLE.map(lambda rec: {**rec, "value": records.dumps(rec["value"])}))


def frames(objs, noise: bytes, nni: bool) -> bytes:
    out = b""
    for obj in objs:
        data = records.dumps(obj)
        out += (b"ME%06d" % (len(data) + 1) + data.encode() + b"\n") if nni else b"\x1e" + data.encode() + b"\n"
    return out[: len(out) // 2] + noise + out[len(out) // 2:]


def test_what_the_keepers_decoders_let_through_the_manager_stores(manager, capsys):
    client = Client(manager)
    cases = {"inputs": 0, "records decoded": 0, "malformed": 0}

    def decode(payload: bytes, source: str):
        try:
            return records.normalize(records.loads(payload), source)
        except records.BadRecord:
            cases["malformed"] += 1
            return None

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(FRAME_OBJECTS, max_size=5), st.binary(max_size=20), st.sampled_from(["channel", "nni", "stdout"]),
           st.integers(min_value=1, max_value=7))
    def check(objs, noise, source, pieces):
        cases["inputs"] += 1
        if source == "stdout":
            lines = [records.NNI_STDOUT_PREFIX + json.dumps(obj, allow_nan=True).encode() + b"'" for obj in objs]
            found = []
            for line in lines + [records.NNI_STDOUT_PREFIX + noise + b"'"]:
                try:
                    found.append(records.normalize(records.parse_nni_stdout(line), "stdout"))
                except records.BadRecord:
                    cases["malformed"] += 1
        else:
            decoder = (records.NniFrameDecoder if source == "nni" else records.SeqDecoder)(lambda at, why: None)
            data = frames(objs, noise, source == "nni")
            step = max(1, len(data) // pieces)
            payloads = []
            for start in range(0, len(data), step):
                payloads += decoder.feed(data[start:start + step])
            decoder.finish()
            found = [decode(payload, source) for payload, _ in payloads]
        recs = [rec for rec in found if rec]
        cases["records decoded"] += len(recs)
        batch = [{"seq": client.seq(), **rec} for rec in recs]
        answer = client.post(encode(batch)).json()
        assert answer["inserted"] == len(batch) and "rejected" not in answer, answer
        client.sent.update((rec["seq"], rec) for rec in batch)

    check()
    client.check_stored()
    with capsys.disabled():
        print(f"\nkeeper decoders fuzz: {cases}; every decoded record stored by the manager "
              f"({len(client.sent)}), answers by status {client.answers}")
