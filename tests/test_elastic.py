"""An elastic job's sizing decisions are visible, and never metrics (issue 22, item 4).

adaptdl-ray, running as the trial's command, calls `trialkit.sdk.report_elastic`
at each decision; the record goes the metrics' way (channel, keeper, spool,
manager, store). Here a real `trialkit run` on the local platform runs a trial
that reports two decisions among its metrics: `trialkit trial show` prints the
newest, the page's trial route serves it, and the metric views (the control
loop's best, export, the Python API's get_job_metrics, the page's curves) hold
the metrics alone. A malformed decision is refused alone, by the keeper and by
the manager; outside a keeper the SDK writes and prints nothing.
"""
from __future__ import annotations

import subprocess

import pytest
import requests

from experiment_util import cli, experiment, experiment_id, export
from harness import PYTHON, channel_records, child_environ, start_keeper
from trialkit import env, records
from trialkit.experiment import Experiment
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
from trialkit.web import install
from trialkit.web.address import page_token

NEWEST = "the goodput model chose 2 workers (now 1): rescaling"
TRIAL = f"""
import trialkit, trialkit.sdk
trialkit.get_next_parameter()
trialkit.sdk.report_elastic(1, {{}}, "no hints yet: one worker")
trialkit.report_intermediate_result(0.5)
trialkit.sdk.report_elastic(2, {{1: 1.0, 2: 1.83, 3: 2.4}}, {NEWEST!r})
trialkit.report_final_result(0.9)
"""


def test_trial_show_and_the_page_give_the_newest_decision_and_metric_views_only_metrics(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    done = cli("run", experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, TRIAL, maxTrialNumber=1))
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    (row,) = export(exp)
    trial = row["trial_id"]
    assert (row["status"], row["intermediate"], row["final"]) == ("SUCCEEDED", [0.5], 0.9)
    # The control loop's view (the tuner was told, the best noted) was the final result, not a decision.
    assert f"| best 0.9 ({trial}: x=1)" in next(line for line in done.stdout.splitlines() if " DONE after " in line)

    shown = cli("trial", "show", trial)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    at = lines.index("elastic:")
    assert lines[at + 1:at + 3] == ["  workers      2",
                                    "  predicted    1: 1.00x  2: 1.83x  3: 2.40x (speedup over one worker)"]
    assert lines[at + 3].startswith("  last         ") and lines[at + 3].endswith(f"  {NEWEST}")
    assert "no hints yet" not in shown.stdout

    metrics = Experiment(None, id=exp).get_job_metrics()[trial]
    assert [(m.type, m.data) for m in metrics] == [("PERIODICAL", 0.5), ("FINAL", 0.9)]

    store = Store.in_dir(home / "experiments" / exp)
    server = ManagerServer(store).start()
    try:
        assert [r["value"]["workers"] for r in store.records_for(trial, type=records.ELASTIC)] == [1, 2]
        install(server, store, admin_token="tok", read_only=True)
        base, auth = f"{server.url}/api/ui/experiments/{exp}", {"Authorization": f"Bearer {page_token('tok')}"}
        detail = requests.get(f"{base}/trials/{trial}", headers=auth, timeout=10).json()
        elastic = detail.pop("elastic")
        assert {k: v for k, v in elastic.items() if k != "time"} == \
            {"workers": 2, "predicted": {"1": 1.0, "2": 1.83, "3": 2.4}, "reason": NEWEST}
        assert detail["intermediate"] == 1
        curves = requests.get(f"{base}/curves", params={"trials": trial}, headers=auth, timeout=10).json()
        assert [s["values"] for s in curves["series"]] == [[0.5]]
    finally:
        server.stop()
        store.close()


def test_a_trial_without_decisions_shows_none(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    done = cli("run", experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}},
                                 "import trialkit\ntrialkit.report_final_result(1)\n", maxTrialNumber=1))
    assert done.returncode == 0, done.stdout + done.stderr
    trial = export(experiment_id(done.stdout.splitlines()[0]))[0]["trial_id"]
    shown = cli("trial", "show", trial)
    assert shown.returncode == 0 and "elastic" not in shown.stdout


def test_outside_a_keeper_a_decision_is_neither_written_nor_printed(tmp_path):
    # adaptdl-ray run by hand prints its decisions itself; the SDK must not raise, print or leave a file.
    code = "import trialkit.sdk; trialkit.sdk.report_elastic(2, {1: 1.0, 2: 1.8}, 'hints')"
    done = subprocess.run([PYTHON, "-c", code], cwd=tmp_path, env=child_environ(), capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert list(tmp_path.iterdir()) == []


def test_a_decision_that_is_no_count_warns_once_and_never_raises(tmp_path):
    code = ("import trialkit.sdk\n"
            "for _ in range(3): trialkit.sdk.report_elastic('many', {1: 1.0}, 'x')\n"
            "trialkit.sdk.report_elastic(1, {'one': 1.0}, 'x')\n"
            "trialkit.sdk.report_elastic(1, None, 'x')\n"
            "trialkit.sdk.report_elastic(2, {1: 1.0, 2: 1.5}, 'good')\n")
    environ = child_environ(**{env.UNDER_KEEPER: "1", env.TRIAL_DIR: str(tmp_path)})
    done = subprocess.run([PYTHON, "-c", code], env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr.count("trialkit: a sizing decision is not") == 1, done.stderr
    (written,) = channel_records(tmp_path / ".trialkit" / "channel")
    assert (written["type"], written["value"]) == ("ELASTIC", {"workers": 2, "predicted": {"1": 1.0, "2": 1.5},
                                                              "reason": "good"})


# A decision the keeper cannot pass on (a speedup that is not a number), one written by hand in a
# wrong shape, and good ones around them.
MALFORMED = """
import os, trialkit.sdk
trialkit.sdk.report_elastic(1, {}, "first")
trialkit.sdk.report_elastic(2, {1: 1.0, 2: float("nan")}, "a NaN speedup")
with open(os.environ["TRIALKIT_CHANNEL"], "ab") as channel:
    channel.write(b'\\x1e{"type": "ELASTIC", "value": {"workers": "two", "predicted": {}, "reason": "x"}}\\n')
trialkit.sdk.report_elastic(3, {3: 2.5}, "last")
"""


@pytest.fixture
def manager(t1_manager):
    return t1_manager


def test_a_malformed_decision_is_refused_alone_by_the_keeper(tmp_path, manager):
    script = tmp_path / "sizing.py"
    script.write_text(MALFORMED)
    keeper = start_keeper(tmp_path / "trial", ["python3", str(script)], manager=manager)
    _, err = keeper.communicate(timeout=60)
    assert keeper.returncode == 0, err
    assert err.count("skipped a malformed record") == 2, err
    stored = manager.store.records_for("t1", type=records.ELASTIC)
    assert [r["value"]["reason"] for r in stored] == ["first", "last"]


def test_a_malformed_decision_is_refused_alone_by_the_manager(manager):
    good = {"type": "ELASTIC", "value": {"workers": 2, "predicted": {"1": 1.0, "2": 1.8}, "reason": "hints"}}
    bad = [{"workers": -1, "predicted": {}, "reason": "x"}, {"workers": 1, "predicted": {"one": 1.0}, "reason": "x"},
           {"workers": 1, "predicted": {"1": "fast"}, "reason": "x"}, {"workers": 1, "predicted": []},
           {"workers": 1, "predicted": {"1": 1.0}, "reason": "\ud800"}]
    batch = [{"seq": 1, **good}] + [{"seq": i + 2, "type": "ELASTIC", "value": v} for i, v in enumerate(bad)] \
        + [{"seq": len(bad) + 2, **good}]
    answer = requests.post(f"{manager.url}/api/v1/trials/t1/records", data=records.dumps({"records": batch}),
                           headers={"Authorization": "Bearer token-1"}, timeout=10)
    assert answer.status_code == 200 and answer.json()["acked"] == len(batch)
    kinds = [(r["type"], r["reason"]) for r in manager.store.records_for("t1")]
    assert [k for k, _ in kinds] == ["ELASTIC"] + ["REJECTED"] * len(bad) + ["ELASTIC"]
    assert all(why for k, why in kinds if k == "REJECTED")
