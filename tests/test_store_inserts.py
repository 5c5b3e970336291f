"""How the store inserts a keeper's batch (trialkit/manager/store.py): a few INSERTs of a power of two rows
each, so that batches of every length share nine statement texts (SQLite compiles each once), and every
record is stored once whatever the lengths and overlaps."""
from __future__ import annotations

from trialkit.manager.store import Store


def metric(seq):
    return {"seq": seq, "type": "PERIODICAL", "sequence": seq - 1, "value": seq / 3, "time": 1.0}


def test_batches_of_every_length_share_a_few_statements_and_store_each_record_once(tmp_path):
    store = Store.in_dir(tmp_path)
    store.create_experiment("exp")
    store.add_trial("exp", "t1", sequence=0, parameters={}, token=None)
    inserts = set()  # rows per INSERT (the callback sees each statement with its values filled in)
    store._db.set_trace_callback(lambda sql: sql.startswith("INSERT INTO records")
                                 and inserts.add(sql.count("),(") + 1))
    seq = 0
    for length in list(range(1, 70)) + [255, 256, 257, 1000]:
        batch = [metric(seq + n) for n in range(1, length + 1)]
        assert store.add_records("t1", batch) == batch
        seq += length
    # Sent again across what is stored (a lost ack): only the new part goes in, by the same statements.
    assert [rec["seq"] for rec in store.add_records("t1", [metric(n) for n in range(seq - 499, seq + 301)])] \
        == list(range(seq + 1, seq + 301))
    seq += 300
    store._db.set_trace_callback(None)
    assert inserts == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert store.acked_seq("t1") == seq == store.count_records("t1")
    assert [rec["value"] for rec in store.records_for("t1")] == [n / 3 for n in range(1, seq + 1)]
    store.close()
