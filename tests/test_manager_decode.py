"""The manager's body decoder (trialkit/manager/server.py's decode): orjson where it reads a body as
records.loads does, records.loads for everything else, so that the keepers' records read the same either way."""
from __future__ import annotations

import json

import pytest

from trialkit import records
from trialkit.manager import server

BATCH = json.dumps({"records": [{"seq": n, "type": "PERIODICAL", "sequence": n - 1, "value": n / 7, "time": 1.5e9,
                                 "parameter_id": 0, "trial_job_id": None, "source": "trial", "run": 0}
                                for n in range(1, 51)]}).encode()

BODIES = [
    BATCH,
    b'{"records": [{"seq": 1, "value": NaN}, {"seq": 2, "value": -Infinity}]}',
    b'{"records": [{"seq": 1, "value": 1e400, "time": -1e400}]}',  # past a float: kept as written
    b'{"records": [{"seq": 1, "value": 18446744073709551616}]}',  # 2**64: past orjson's whole numbers
    b'{"records": [{"seq": 1, "value": -9223372036854775809}]}',  # one under int64
    b'{"records": [{"seq": 1, "value": 123456789012345678901234567890.0}]}',
    b'{"records": [{"seq": 1, "sequence": 9223372036854775807, "value": 18446744073709551615}]}',
    b'{"records": [{"seq": 1, "value": ' + b"7" * 5000 + b"}]}",  # past int()'s digits: kept as text
    b'{"records": [{"seq": 1, "value": "\\ud800"}]}',  # a lone surrogate: read, then refused by validation
    b'{"records": [{"seq": 1, "value": {"a": 1, "a": 2}}]}',
    b'{"records": [{"seq": 1, "value": ' + b"[" * 900 + b"]" * 900 + b"}]}",
    b'{"records": [{"seq": 1, "value": ' + b"[" * 5000 + b"]" * 5000 + b"}]}",  # past orjson's depth
    b'{"records": [{"seq": 1, "value": [0.1, -0.0, 5e-324, 1.7976931348623157e308, 1E5]}]}',
    b'{"records": [{"seq": 1, "value": "caf\xc3\xa9 \\u0000"}]}',
    b'{"records": [{"seq": 1, "value": 0.0012345678901234567890123, "time": 1.5000000000000000000001e9}]}',
    b'{"records": [{"seq": 1, "value": 1.5e0000000000000000000001}]}',  # an exponent of 22 digits
    b'{"records": [{"seq": 1, "value": [0.1234567890123456789012, 12345678901234567890]}]}',
]
LONG_FRACTION = BODIES[-3]  # 19 digits and more after a ".": read alike by both, so orjson's


def read(decoder, body):
    try:
        value = decoder(body)
    except records.BadRecord:
        return "BadRecord"
    return repr(value)  # repr tells 1 from 1.0, and nan from a string


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_a_body_decodes_as_records_loads_decodes_it(body):
    assert read(server.decode, body) == read(records.loads, body)


@pytest.mark.parametrize("body", [b'{"records": [', b'{"records": []} x', b"\xff", b"", b'{"records": [1,]}'])
def test_a_body_that_is_not_json_is_refused_as_records_loads_refuses_it(body):
    with pytest.raises(records.BadRecord):
        server.decode(body)


def test_an_ordinary_batch_takes_orjson_and_the_rest_records_loads(monkeypatch):
    pytest.importorskip("orjson", reason="orjson is not installed (setup.py's control extra brings it)")
    calls = []
    loads = records.loads
    monkeypatch.setattr(records, "loads", lambda body: calls.append(body) or loads(body))
    assert server.decode(BATCH)["records"][49]["value"] == 50 / 7
    server.decode(LONG_FRACTION)
    assert calls == []
    for body in BODIES[1:5] + BODIES[-2:]:
        server.decode(body)
    assert calls == BODIES[1:5] + BODIES[-2:]
