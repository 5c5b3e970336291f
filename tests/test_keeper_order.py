"""The order a keeper spools in: what an earlier keeper on the dir left, then the run's start, then the run's records.

The keeper starts the command before it loads its reporting side (keeper/main.py), so a fast trial's first
results may be in the channel before the keeper reads it. They still come after the RUNNING status that says
the trial started, and they reach everything fed from the spool (Kubeflow Trainer's status poster); what an
earlier keeper left unspooled comes before RUNNING, numbered as keeper/leftover.py numbers it for the control
plane. The race is replayed here step by step with the keeper's own parts on real files; a real keeper checks
the whole.
"""
from __future__ import annotations

import json
import subprocess
import time

from harness import PYTHON, child_environ
from test_trainer_status import Endpoint
from trialkit import env, layout, records
from trialkit.keeper import leftover
from trialkit.keeper.main import followed_sizes
from trialkit.keeper.reporter import Reporter
from trialkit.keeper.spool import Spool
from trialkit.process import EventLoop
from trialkit.sdk import Session
from trialkit.statuses import RUNNING, SUCCEEDED


def spooled(trial_dir) -> list:
    """(seq, type, the status or the value) of every record in the trial dir's spool, in order."""
    spool = Spool(layout.spool_dir(trial_dir))
    try:
        recs = [(seq, json.loads(data)) for seq, data in spool.read(0, 1000, 1 << 20)]
    finally:
        spool.close()
    return [(seq, r["type"], r["value"]["status"] if r["type"] == records.STATUS else r["value"]) for seq, r in recs]


def intermediate(payload: dict) -> str:
    """The count of intermediate results a Trainer status post gives."""
    return {m["name"]: m["value"] for m in payload["trainerStatus"]["metrics"]}["intermediateResults"]


def trial_env(trial_dir, run: int) -> env.TrialEnv:
    return env.read({env.TRIAL_DIR: str(trial_dir), env.RESTART_COUNT: str(run), env.UNDER_KEEPER: "1"})


def report(trial: env.TrialEnv, kind: str, value: float) -> None:
    """What the trial's SDK writes for one result."""
    session = Session(trial)
    session.report(kind, value)
    session._channel.close()


def test_the_runs_first_results_read_late_come_after_its_running_and_an_earlier_keepers_before(tmp_path,
                                                                                               monkeypatch):
    trial_dir = tmp_path / "trial"
    # An earlier keeper died with results of its run 0 unread: one in the channel, one in NNI's metrics file.
    report(trial_env(trial_dir, 0), records.PERIODICAL, 0.1)
    nni = layout.nni_metrics_path(trial_dir)
    nni.parent.mkdir(parents=True)
    data = b'{"type": "PERIODICAL", "sequence": 1, "value": "0.2"}\n'
    nni.write_bytes(b"ME%06d" % len(data) + data)
    left = leftover.undelivered(trial_dir)  # as the control plane delivers them
    assert [(r["seq"], r["value"]) for r in left] == [(1, 0.1), (2, 0.2)]

    trial = trial_env(trial_dir, 1)
    ends = followed_sizes(trial)  # the new keeper, before it starts the command
    report(trial, records.PERIODICAL, 0.5)  # the command reports at once: before the keeper reads
    endpoint = Endpoint(tmp_path)
    monkeypatch.setenv(env.TRAINER_SERVER_URL, endpoint.url)
    monkeypatch.setenv(env.TRAINER_SERVER_CA_CERT, endpoint.cert)
    loop = EventLoop()
    reporter = Reporter(trial, layout.home(trial_dir))
    try:
        reporter.attach(loop, ends)
        reporter.status(RUNNING, pid=1, started=time.time(), restart_count=1)
        # Read as the run's start is said: written before the files were watched, it raised no event.
        assert intermediate(reporter.trainer_status.payload()) == "1"
        report(trial, records.FINAL, 0.75)
        reporter.trial_ended()
        reporter.status(SUCCEEDED, exit_code=0, ended=time.time(), reason="")
        reporter.finish(time.monotonic() + 10)
    finally:
        loop.close()
        endpoint.close()
    assert spooled(trial_dir) == [(1, "PERIODICAL", 0.1), (2, "PERIODICAL", 0.2), (3, records.STATUS, RUNNING),
                                  (4, "PERIODICAL", 0.5), (5, "FINAL", 0.75), (6, records.STATUS, SUCCEEDED)]
    # Trainer's status counts this run's results, the one read late too, and not the earlier run's.
    assert intermediate(endpoint.posts[-1][2]) == "1"



def test_a_real_keeper_spools_what_an_earlier_one_left_before_its_running_and_its_runs_records_after(tmp_path):
    trial_dir = tmp_path / "trial"
    report = "import trialkit\nfor i in range({}): trialkit.report_intermediate_result(i)"
    environ = child_environ(TRIALKIT_TRIAL_DIR=str(trial_dir))
    # What an earlier keeper left: the results of a trial it never read (it died before its reporting side started).
    done = subprocess.run([PYTHON, "-c", report.format(3)], env=environ, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([PYTHON, "-m", "trialkit.keeper", "--", PYTHON, "-c", report.format(2)], env=environ,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [rec[1:] for rec in spooled(trial_dir)] == [
        ("PERIODICAL", 0), ("PERIODICAL", 1), ("PERIODICAL", 2), (records.STATUS, RUNNING),
        ("PERIODICAL", 0), ("PERIODICAL", 1), (records.STATUS, SUCCEEDED)]
