"""A metric is whatever JSON allows; a field beyond its range is refused alone, at every edge.

Real parts: the manager as a process on loopback (or in-process over real
HTTP), real keepers running real trial scripts, the `trialkit` command as a
user runs it, SQLite on disk. Issue 16 points 1 and 2.
"""
from __future__ import annotations

import json
import math
import signal
import subprocess
from pathlib import Path

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from experiment_util import cli, experiment, experiment_id, export
from harness import PYTHON, Manager, start_keeper, wait_until
from trialkit import layout, records
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
from trialkit.control.results import trial_rows
from trialkit.web import install, queries
from trialkit.web.catalog import Database
from trialkit.web.address import page_token

BIG = 10 ** 400  # an integer JSON allows and no float holds
HUGE_TEXT = "9" * 5000  # more digits than Python reads into an int by default


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def server(t1_manager):
    return t1_manager


def post(server, body: bytes):
    return requests.post(f"{server.url}/api/v1/trials/t1/records", data=body,
                         headers={"Authorization": "Bearer token-1"}, timeout=30)


def record(seq: int, value: str = "0.5", **fields) -> str:
    """One record's JSON text, its value written as given (so any number JSON allows can be sent)."""
    rest = "".join(f',"{k}":{json.dumps(v)}' for k, v in fields.items())
    return '{"seq":%d,"type":"PERIODICAL","value":%s%s}' % (seq, value, rest)


# ---------------------------------------------------------------- one rule for a metric's number

_numbers = st.one_of(st.integers(min_value=-10 ** 500, max_value=10 ** 500), st.floats(), st.booleans(), st.none(),
                     st.text(max_size=4))
_metrics = st.one_of(_numbers, st.dictionaries(st.sampled_from(["default", "loss"]), _numbers, max_size=2),
                     st.lists(_numbers, max_size=2))
# Number texts a keeper may send that Python would not write: beyond a float, underflowing, over 4300 digits.
_number_texts = st.sampled_from(["1e400", "-1e400", "1e-400", "9" * 400, "-" + HUGE_TEXT, '{"default":1e999}', "-0"])


def test_the_page_and_the_export_agree_on_the_number_a_metric_stands_for(tmp_path):
    store = Store.in_dir(tmp_path / "exp")
    store.create_experiment("exp", {"searchSpace": {}})
    page = Database(store.path)
    count = 0

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.one_of(_metrics.map(records.dumps), _number_texts))
    def check(text):
        nonlocal count
        count += 1
        trial_id = f"t{count}"
        store.add_trial("exp", trial_id, sequence=count, parameters={}, token=None)
        answer = post_to(store, trial_id, '{"records":[{"seq":1,"type":"FINAL","value":%s}]}' % text)
        assert answer == {"acked": 1, "inserted": 1}
        final = [row for row in trial_rows(store, "exp") if row["trial_id"] == trial_id][0]["final"]
        with page.reading() as db:
            shown = queries.trial(db, "exp", trial_id)["metric"]
        number = records.metric_number(final)
        assert shown == number and (number is None or math.isfinite(number)), (text[:80], shown, number)

    try:
        check()
    finally:
        page.close()
        store.close()


def post_to(store: Store, trial_id: str, body: str):
    """The records route's own steps (parse, split, store), as the manager runs them, without a socket."""
    spool, batch, rejected = records.split_batch(records.loads(body))
    fresh, refused = store.add_batch(trial_id, batch, rejected, spool)
    return {"acked": store.acked_seq(trial_id, spool), "inserted": len(fresh)}


def test_numbers_json_allows_are_kept_without_loss_and_are_no_tuner_number():
    assert records.loads("1e400") == "1e400" and records.loads(HUGE_TEXT) == HUGE_TEXT
    assert records.loads(str(BIG)) == BIG and records.loads("1.5") == 1.5
    for value in (BIG, "1e400", HUGE_TEXT, float("nan"), float("inf"), {"default": BIG}, True, "0.5"):
        assert records.metric_number(value) is None, value
    assert records.metric_number({"default": 3}) == 3.0 and records.metric_number(2 ** 64) == float(2 ** 64)


# ---------------------------------------------------------------- the manager

def test_the_manager_stores_any_number_json_allows_and_gives_it_back(server):
    body = '{"records":[%s]}' % ",".join([record(1, str(BIG)), record(2, "1e400"), record(3, HUGE_TEXT),
                                          record(4, '{"default":%s,"loss":-1e999}' % BIG)])
    answer = post(server, body.encode())
    assert answer.status_code == 200 and answer.json() == {"acked": 4, "inserted": 4}
    values = [rec["value"] for rec in server.store.records_for("t1")]
    assert values == [BIG, "1e400", HUGE_TEXT, {"default": BIG, "loss": "-1e999"}]


def test_a_record_the_manager_cannot_store_is_refused_alone_and_kept_with_its_reason(server):
    batch = [record(1), record(2, sequence=2 ** 63), record(3, parameter_id=-2 ** 64),
             '{"seq":4,"type":"STATUS","value":{"status":"RUNNING","exit_code":%d}}' % 2 ** 70,
             record(5, time=2 ** 64), record(6, source="\ud800"), record(7, "1.25")]
    body = ('{"records":[%s]}' % ",".join(batch)).encode()
    answer = post(server, body)
    assert answer.status_code == 200, answer.text
    reply = answer.json()
    assert reply["acked"] == 7 and reply["inserted"] == 2
    reasons = {item["seq"]: item["reason"] for item in reply["rejected"]}
    assert sorted(reasons) == [2, 3, 4, 5, 6]
    for seq, name in ((2, "sequence"), (3, "parameter_id"), (4, "exit_code"), (5, "time"), (6, "source")):
        assert name in reasons[seq], reasons
    stored = server.store.records_for("t1")
    assert [(r["seq"], r["type"]) for r in stored] == [
        (1, "PERIODICAL"), (2, "REJECTED"), (3, "REJECTED"), (4, "REJECTED"), (5, "REJECTED"), (6, "REJECTED"),
        (7, "PERIODICAL")]
    assert stored[1]["reason"] == reasons[2] and stored[1]["value"]["sequence"] == 2 ** 63  # kept as sent
    assert server.store.trial("t1")["status"] == "WAITING"  # the refused STATUS changed nothing
    again = post(server, body).json()
    assert again == {"acked": 7, "inserted": 0}  # named once: a resent batch has nothing new to say


def test_values_nest_at_most_64_levels_at_the_keeper_and_at_the_manager(server):
    # A bound both edges share: what a keeper accepts, the manager can always parse inside a batch,
    # whatever its own stack holds; deeper is refused alone, with the reason.
    def nested(depth: int) -> str:
        return "[" * depth + "1" + "]" * depth

    assert records.normalize(records.loads('{"type":"FINAL","value":%s}' % nested(64)), "channel")
    with pytest.raises(records.BadRecord, match="deeper than 64 levels"):
        records.normalize(records.loads('{"type":"FINAL","value":%s}' % nested(65)), "channel")
    answer = post(server, ('{"records":[%s,%s]}' % (record(1, nested(500)), record(2))).encode())
    assert answer.status_code == 200, answer.text
    assert answer.json()["rejected"] == [{"seq": 1, "reason": "value nests deeper than 64 levels"}]
    assert [r["type"] for r in server.store.records_for("t1")] == ["REJECTED", "PERIODICAL"]


def test_a_seq_beyond_64_bits_gets_400_naming_it(server):
    answer = post(server, b'{"records":[{"seq":%d,"type":"FINAL","value":1}]}' % 2 ** 63)
    assert answer.status_code == 400 and "seq 9223372036854775808" in answer.json()["error"]
    assert server.store.count_records() == 0


# ---------------------------------------------------------------- a real keeper against a real manager

TRIAL = r"""
import trialkit
trialkit.report_intermediate_result(10 ** 400)
print("NNISDK_MEb'" + '{"type": "PERIODICAL", "sequence": %d, "value": "1"}' % 2 ** 70 + "'", flush=True)
print("NNISDK_MEb'" + '{"type": "PERIODICAL", "sequence": 5, "parameter_id": %d, "value": "1e400"}' % 2 ** 70
      + "'", flush=True)
for i in range(20):
    trialkit.report_intermediate_result(i)
trialkit.report_final_result(0.75)
"""


@pytest.fixture
def manager(tmp_path):
    m = Manager(tmp_path / "exp")
    m.register("t1", "token-1")
    m.start()
    yield m
    m.close()


def run_keeper(tmp_path: Path, manager: Manager, script: str) -> subprocess.CompletedProcess:
    path = tmp_path / "train.py"
    path.write_text(script)
    keeper = start_keeper(tmp_path / "trial", [PYTHON, str(path)], manager=manager)
    out, err = keeper.communicate(timeout=120)
    assert manager.proc.poll() is None, "the manager exited"
    return subprocess.CompletedProcess(keeper.args, keeper.returncode, out, err)


def test_huge_values_and_out_of_range_fields_from_a_trial_never_block_its_records(tmp_path, manager):
    done = run_keeper(tmp_path, manager, TRIAL)
    assert done.returncode == 0, done.stderr
    assert "not delivered" not in done.stderr
    stored = manager.store.records_for("t1")
    # The huge value is kept as reported; parameter_id beyond int64 is kept as its text.
    assert [(r["type"], r["value"]) for r in stored if r["source"] == "channel"] == [
        ("PERIODICAL", BIG)] + [("PERIODICAL", i) for i in range(20)] + [("FINAL", 0.75)]
    assert [r["value"] for r in stored if r["source"] == "stdout"] == ["1e400"]
    assert [r["parameter_id"] for r in stored if r["value"] == "1e400"] == [str(2 ** 70)]
    # The sequence beyond int64 is refused at the keeper, with its reason, once; the manager refuses nothing.
    malformed = [line for line in done.stderr.splitlines() if "skipped a malformed record" in line]
    assert len(malformed) == 1 and "sequence 1180591620717411303424 is out of range" in malformed[0], done.stderr
    assert "the manager refused" not in done.stderr
    assert manager.store.trial("t1")["status"] == "SUCCEEDED"


def spooled_batch(trial_dir: Path, recs) -> None:
    """A spool as an older keeper (or another version of the manager's rules) left it: records, then the cursor."""
    spool = layout.spool_dir(trial_dir)
    spool.mkdir(parents=True)
    lines = [records.frame(records.dumps({"seq": seq, **rec})) for seq, rec in enumerate(recs, 1)]
    lines.append(records.frame(records.dumps({"cursor": {}, "next": len(recs) + 1})))
    (spool / f"{1:012d}.log").write_bytes(b"".join(lines))


def test_the_keeper_logs_a_refused_record_once_and_delivers_every_other(tmp_path, manager):
    good = {"type": "PERIODICAL", "value": 1.0, "sequence": 0, "source": "channel"}
    spooled_batch(tmp_path / "trial", [good, {**good, "sequence": 2 ** 64}, {**good, "value": 3.0, "sequence": 2}])
    done = run_keeper(tmp_path, manager, "import trialkit\nfor i in range(5): trialkit.report_intermediate_result(i)\n"
                                         "trialkit.report_final_result(9)\n")
    assert done.returncode == 0, done.stderr
    assert "not delivered" not in done.stderr
    assert done.stderr.count("the manager refused record 2 (sequence 18446744073709551616 is out of range") == 1
    stored = manager.store.records_for("t1")
    assert manager.store.acked_seq("t1") == len(stored) == 3 + 5 + 1 + 2  # + RUNNING and SUCCEEDED
    assert [r["type"] for r in stored[:3]] == ["PERIODICAL", "REJECTED", "PERIODICAL"]
    assert "out of range" in stored[1]["reason"]
    assert [r["value"] for r in stored if r["type"] == "PERIODICAL"] == [1.0, 3.0, 0, 1, 2, 3, 4]
    assert manager.store.trial("t1")["status"] == "SUCCEEDED"


# ---------------------------------------------------------------- the whole experiment, and what users run after

HUGE_TRIAL = r"""
import trialkit
x = trialkit.get_next_parameter()["x"]
trialkit.report_intermediate_result(10 ** 400)
print("NNISDK_MEb'" + '{"type": "PERIODICAL", "sequence": 1, "value": "1e400"}' + "'", flush=True)
trialkit.report_intermediate_result(x)
trialkit.report_final_result(10 ** 400 if x < 0.5 else x)
"""


def test_a_huge_metric_never_takes_the_experiment_or_the_commands_down(tmp_path, home):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [0.1, 0.9]}}, HUGE_TRIAL, maxTrialNumber=2,
                        trialConcurrency=1, tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}},
                        assessor={"name": "Medianstop", "classArgs": {"start_step": 1}})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    rows = export(exp)
    assert [(row["status"], row["final"]) for row in rows] == [("SUCCEEDED", BIG), ("SUCCEEDED", 0.9)]
    assert sorted(map(str, rows[0]["intermediate"])) == sorted(map(str, [BIG, "1e400", 0.1]))  # stdout: any order
    assert f"final={0.9:.6g}" in done.stdout  # the best trial is the one with a number
    csv_out = cli("experiment", "export", exp, "--format", "csv")
    assert csv_out.returncode == 0, csv_out.stderr
    assert str(BIG) in csv_out.stdout  # shown as reported, not as an empty cell or inf
    for args in (["experiment", "show", exp], ["trial", "list", exp], ["experiment", "plot", exp, "-o",
                                                                        tmp_path / "plot.png"]):
        shown = cli(*args)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, (args, shown.stderr)
    resumed = cli("experiment", "resume", exp)
    assert "Traceback" not in resumed.stderr and "internal error" not in resumed.stderr, resumed.stderr
    assert resumed.returncode in (0, 2), resumed.stderr


# ---------------------------------------------------------------- ranges at the other edges

def test_a_priority_beyond_64_bits_is_one_line_and_exit_2_from_the_cli_and_the_config(tmp_path, home):
    done = cli("job", "update", "abcd1234-00001", "--priority", "99999999999999999999")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "priority 99999999999999999999 is out of range" in done.stderr
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, "print(1)\n", priority=2 ** 63)
    run = cli("run", config)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    assert "priority" in run.stderr and "too large" in run.stderr


def test_a_page_offset_beyond_64_bits_is_a_400(tmp_path):
    store = Store.in_dir(tmp_path / "exp")
    store.create_experiment("exp", {"searchSpace": {}})
    server = ManagerServer(store).start()
    install(server, store, admin_token="tok", read_only=True)
    try:
        answer = requests.get(f"{server.url}/api/ui/experiments/exp/trials", params={"offset": "9" * 30},
                              headers={"Authorization": f"Bearer {page_token('tok')}"}, timeout=10)
        assert answer.status_code == 400 and "offset" in answer.json()["error"]
    finally:
        server.stop()
        store.close()


# ---------------------------------------------------------------- runs of a restarted trial (issue 16 point 4)

def test_a_restarted_trial_keeps_its_runs_apart_and_shows_the_latest(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    m = Manager(home / "experiments" / "exp")
    m.register("t1", "token-1")
    m.start()
    try:
        # Run 0 is lost after 5 steps (the machine dies: kill -9 of its keeper, whose child dies with it);
        # run 1 (the keeper counts up on the same trial dir) starts from step 0 again.
        script = tmp_path / "lost.py"
        script.write_text("import time, trialkit\nfor i in range(5): trialkit.report_intermediate_result(100 + i)\n"
                          "time.sleep(600)\n")
        first = start_keeper(tmp_path / "trial", [PYTHON, str(script)], manager=m)
        wait_until(lambda: m.store.count_records("t1") >= 6, 60, "run 0's steps to arrive")  # RUNNING + 5
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
        again = run_keeper(tmp_path, m, "import trialkit\n"
                                        "for i in range(3): trialkit.report_intermediate_result(200 + i)\n"
                                        "print(\"NNISDK_MEb'\" + '{\"type\": \"FINAL\", \"value\": \"7\"}' + \"'\")\n")
        assert again.returncode == 0, again.stderr
        stored = [(r["run"], r["value"]) for r in m.store.records_for("t1") if r["type"] in records.METRIC_TYPES]
        # (sorted: the stdout line and the SDK's file reach the keeper by two paths, in either order)
        assert sorted(stored) == [(0, 100 + i) for i in range(5)] + [(1, 7)] + [(1, 200 + i) for i in range(3)]
        # One series: run 1's reports (which name no step, as NNI's) go on after run 0's, in the order they came.
        latest = export("exp")
        assert [(r["run"], r["intermediate"], r["steps"], r["final"]) for r in latest] == [
            (1, [100, 101, 102, 103, 104, 200, 201, 202], 8, 7)]
        every = json.loads(cli("experiment", "export", "exp", "--all-runs").stdout)
        assert [(r["run"], r["intermediate"], r["final"]) for r in every] == [
            (0, [100, 101, 102, 103, 104], None), (1, [200, 201, 202], 7)]
        csv_lines = cli("experiment", "export", "exp", "--all-runs", "--format", "csv").stdout.splitlines()
        run_column = csv_lines[0].split(",").index("run")
        assert [line.split(",")[run_column] for line in csv_lines[1:]] == ["0", "1"]
        page = Database(m.store.path)
        try:
            with page.reading() as db:
                curve = queries.curves(db, "exp", ["t1"])["series"][0]
                assert (curve["steps"], curve["values"]) == (list(range(1, 9)), [100, 101, 102, 103, 104, 200, 201, 202])
        finally:
            page.close()
    finally:
        m.close()


def test_the_sdk_never_raises_into_the_training_loop_for_a_huge_number(tmp_path):
    import io

    from trialkit import env
    from trialkit.sdk import Session

    err = io.StringIO()
    session = Session(env.read({env.TRIAL_DIR: str(tmp_path), env.UNDER_KEEPER: "1", env.TRIAL_ID: "t1"}), err=err)
    session.report("PERIODICAL", 10 ** 5000)  # more digits than JSON can be written with here: lost, said once
    session.report("PERIODICAL", 10 ** 400)  # kept as reported, said to be no number for a tuner
    session.report("FINAL", 0.5)
    frames = records.SeqDecoder(lambda at, why: None).feed((tmp_path / ".trialkit" / "channel").read_bytes())
    assert [records.loads(payload)["value"] for payload, _ in frames] == [BIG, 0.5]
    assert "cannot be written as JSON" in err.getvalue() and "do not see a number" in err.getvalue()
