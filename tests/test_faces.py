"""Every face tells the truth (issue 31.4): the CLI, the page's data, the exports, the plot and the
Python API say the same thing about the same experiment, and nothing that is not so. Real `trialkit`
commands over real experiments (local trials, the store on disk); the page's data through its
queries and, where the page's script decides, its HTTP answers.
"""
from __future__ import annotations

import csv
import io
import json
import sqlite3
import sys
import time
from contextlib import closing
from datetime import datetime
from pathlib import Path

import pytest
import requests

from experiment_util import cli, experiment, experiment_id, export, start_cli, trial_status
from harness import wait_until
from trialkit.control.progress import Progress, Snapshot, duration
from trialkit.web import queries

pytestmark = pytest.mark.usefixtures("home")  # conftest's: TRIALKIT_HOME in the test's tmp_path

X = {"x": {"_type": "choice", "_value": [1, 2]}}
FINAL_ONLY = "import trialkit\ntrialkit.report_final_result(trialkit.get_next_parameter()['x'])\n"
# Prints, reports at every step and runs until stopped (a SIGTERM ends it: no checkpoint).
SLOW = "import time, trialkit\np = trialkit.get_next_parameter()\nfor i in range(100000):\n" \
       "    trialkit.report_intermediate_result(i)\n    time.sleep(0.2)\n"


@pytest.fixture
def done_experiment(tmp_path):
    """An experiment run to its end (DONE): two trials that report only a final result."""
    config = experiment(tmp_path, X, FINAL_ONLY, maxTrialNumber=2, maxExperimentDuration="10m",
                        tuner={"name": "GridSearch"})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    return experiment_id(done.stdout.splitlines()[0]), done.stdout


def page_data(home: Path, exp: str, what=queries.experiment, *args):
    with closing(sqlite3.connect(home / "experiments" / exp / "trialkit.db")) as db:
        db.row_factory = sqlite3.Row
        queries.register(db)
        return what(db, exp, *args)


def test_a_done_experiment_has_no_time_or_trials_left_on_its_overview(done_experiment, home):
    exp, _ = done_experiment
    overview = page_data(home, exp)
    assert overview["status"] == "DONE" and overview["live"] is False
    assert overview["remaining_duration"] is None and overview["remaining_trials"] is None  # was "9m 10s left"


def test_a_finished_experiment_is_not_resumed_stopped_paused_or_changed(done_experiment, home):
    exp, _ = done_experiment
    store = home / "experiments" / exp / "trialkit.db"
    before = (store.stat().st_mtime_ns, (home / "experiments" / exp / "manager.json").read_text())
    resumed = cli("experiment", "resume", exp)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(f"experiment {exp} is DONE: it has nothing left to run")
    assert "resumed" not in resumed.stdout and "manager:" not in resumed.stdout
    assert (store.stat().st_mtime_ns, (home / "experiments" / exp / "manager.json").read_text()) == before
    trial = f"{exp}-00000"
    for args in (["experiment", "stop", exp], ["experiment", "pause", exp], ["trial", "kill", trial],
                 ["job", "update", trial, "--priority", "1"]):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        named = "TRIAL_ID" if trial in args else "EXPERIMENT_ID"  # the argument the user gave, not another
        assert f"{named}: experiment {exp} has ended (DONE): nothing of it runs now" in done.stderr, (args, done.stderr)
        assert "resume" not in done.stderr, (args, done.stderr)  # a DONE experiment has nothing to resume
    # Its config is kept for a resume (tests/test_nnictl_commands.py: more trials); one that leaves it nothing
    # more to run leaves its resume nothing to start.
    assert cli("experiment", "update", exp, "--trial-concurrency", "2").returncode == 0
    assert cli("experiment", "resume", exp).stdout.startswith(f"experiment {exp} is DONE: it has nothing left")
    from trialkit.experiment import Experiment

    assert Experiment(None, id=exp).resume() is True  # NNI's: it ends DONE; here nothing starts


def test_the_cli_and_the_page_round_a_duration_alike():
    # The page's fmtDuration rounds (Math.round): 5.6 s is "6s" there and must be 00:06 here, not 00:05.
    assert (duration(5.6), duration(5.4), duration(59.5), duration(3599.6)) == ("00:06", "00:05", "01:00", "1:00:00")


def test_the_csv_export_writes_readable_times(done_experiment):
    exp, _ = done_experiment
    done = cli("experiment", "export", exp, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert len(rows) == 2
    for row in rows:
        started, ended = datetime.fromisoformat(row["started"]), datetime.fromisoformat(row["ended"])
        assert started.tzinfo is not None and started <= ended
        assert abs(started.timestamp() - time.time()) < 600
        assert float(row["duration"]) == pytest.approx((ended - started).total_seconds(), abs=0.002)
    # The JSON export keeps the epoch seconds, for programs.
    assert all(isinstance(row["started"], float) for row in export(exp))


def test_nnictls_spelling_of_the_export_writes_the_same_file(done_experiment, tmp_path):
    exp, _ = done_experiment
    ours = cli("experiment", "export", exp, "--format", "csv").stdout
    done = cli("experiment", "export", exp, "--filename", tmp_path / "e.csv", "--type", "csv")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "e.csv").read_text() == ours and ours.startswith("trial_id,")


def test_the_progress_line_has_its_limits_and_keeps_the_best_trial_within_80_columns(done_experiment):
    exp, output = done_experiment
    ends = [line for line in output.splitlines() if line.startswith(f"trial {exp}-")]
    assert len(ends) == 2 and ends[-1].split(" | ", 1)[1].startswith("[")
    assert " 2 of 2 ended: 2 done, 0 running, 0 failed, 0 early-stopped" in ends[-1]
    assert ", " in ends[0].split("]")[0] and " left]" in ends[0]  # 10m of maxExperimentDuration: time left
    # On an 80-column terminal the live line keeps the best trial (it was cut off at the end before).
    snapshot = Snapshot(9, 0, 1, 0, 0, 65.0, 0.987654, "abcd1234-00007",
                        {"learning_rate": 0.0123, "batch_size": 64, "optimizer": "adam"}, max_trials=10,
                        time_left=3535.0)
    out = io.StringIO()
    progress = Progress(out, tty=True)
    progress.width = lambda: 80
    progress.update(snapshot)
    drawn = out.getvalue().rpartition("\x1b[K")[2]
    assert len(drawn) < 80 and "best 0.987654 (abcd1234-00007)" in drawn and "58:55 left" in drawn, drawn
    assert "10 of 10 ended: 9 done, 1" in drawn, drawn  # the counts are what a cut takes


def test_paused_trials_are_counted_apart_from_the_ended_ones():
    # A newcomer's stopped run with two trials PAUSED ended on "0 of 6 ended: 0 done, 0 running, 0 failed,
    # 0 early-stopped": the two were counted nowhere.
    line = Snapshot(1, 0, 0, 0, 1, 12.0, max_trials=6, paused=2).line()
    assert " 2 of 6 ended: 1 done, 0 running, 0 failed, 0 early-stopped, 1 canceled, 2 paused" in line, line


def test_a_final_only_experiment_plots_with_a_word_why_and_an_all_failed_one_does_not(done_experiment, tmp_path):
    exp, _ = done_experiment
    out = tmp_path / "plot.png"
    done = cli("experiment", "plot", exp, "-o", out)
    assert done.returncode == 0 and out.stat().st_size > 0, done.stderr
    from trialkit.control import plot

    drawn = []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots()
    plot._curves(ax, export(exp), "default")
    drawn = [text.get_text() for text in ax.texts]
    plt.close(figure)
    assert drawn == ["no intermediate results:\nthe trials reported final results only"]
    curves = page_data(tmp_path / "home", exp, queries.curves, [])
    assert all(series["steps"] == [] for series in curves["series"])  # what the page's script annotates

    config = experiment(tmp_path, X, "raise SystemExit(3)\n", name="failing", maxTrialNumber=2)
    failing = experiment_id(cli("run", config).stdout.splitlines()[0])
    refused = cli("experiment", "plot", failing, "-o", tmp_path / "failing.png")
    assert refused.returncode == 2 and not (tmp_path / "failing.png").exists()
    assert f"nothing to plot for experiment {failing}: none of its 2 trials reported a metric (2 failed)" in \
        refused.stderr


def test_trial_logs_says_a_silent_trial_printed_nothing_and_refuses_a_rank_it_never_had(tmp_path):
    config = experiment(tmp_path, X, "", maxTrialNumber=1)
    silent = experiment_id(cli("run", config).stdout.splitlines()[0])
    done = cli("trial", "logs", f"{silent}-00000")
    assert (done.returncode, done.stdout) == (0, "")
    assert done.stderr == f"trial {silent}-00000 printed nothing (its stdout and stderr are empty)\n"
    # Two workers' output as wrap_rank prefixes it (trialkit/launch/prefix.py).
    two = "print('[rank=0] zero', flush=True)\nprint('[rank=1] one', flush=True)\n"
    config = experiment(tmp_path, X, two, name="two", maxTrialNumber=1)
    exp = experiment_id(cli("run", config).stdout.splitlines()[0])
    assert cli("trial", "logs", f"{exp}-00000", "--rank", "1").stdout == "[rank=1] one\n"
    refused = cli("trial", "logs", f"{exp}-00000", "--rank", "5")
    assert refused.returncode == 2 and refused.stdout == ""
    assert f"trial {exp}-00000 has no rank 5: its output has ranks 0 to 1 (2 workers)" in refused.stderr


def test_a_running_experiment_job_list_show_page_and_a_pause_tell_the_same_story(tmp_path, home):
    config = experiment(tmp_path, X, SLOW, maxTrialNumber=1, trialConcurrency=1)
    runner = start_cli("run", config)
    try:
        exp = experiment_id(runner.stdout.readline())
        trial = f"{exp}-00000"
        wait_until(lambda: trial_status(home, trial) == "RUNNING", 60, "the trial to run")
        jobs = json.loads(cli("job", "list", "--experiment", exp, "--json").stdout)
        assert [(job["id"], job["status"]) for job in jobs] == [(trial, "RUNNING")]  # as trial list says
        assert "RUNNING" in cli("trial", "list", exp).stdout
        shown = cli("experiment", "show", exp).stdout
        page = next(line.split()[1] for line in shown.splitlines() if line.startswith("page "))
        base, token = page.split("/?token=")[0], page.split("?token=")[1].split("#")[0]
        answer = requests.get(f"{base}/api/ui/experiments", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert answer.status_code == 200 and exp in answer.text  # the printed page's token opens it
        bare = requests.get(f"{base}/", timeout=10)
        assert bare.status_code == 200 and "askToken" in requests.get(f"{base}/static/app.js", timeout=10).text
        assert cli("trial", "pause", trial).returncode == 0
        wait_until(lambda: trial_status(home, trial) == "PREEMPTED", 60, "the pause")
        history = [line.split()[2] for line in cli("trial", "show", trial).stdout.split("history:")[1].splitlines()
                   if line.strip()]
        # Not USER_CANCELED (the keeper's word) first; PAUSED as the status line above and the page's history say
        # it (docs/concepts.md: PREEMPTED, shown as PAUSED).
        # The second RUNNING: its stop sent, who asked and when its grace ends (queue.stopping).
        assert history == ["WAITING", "RUNNING", "RUNNING", "PAUSED"]
    finally:
        cli("experiment", "stop", exp)
        runner.wait(60)


def test_the_python_apis_run_prints_the_pages_url_with_its_token(tmp_path, capsys, monkeypatch):
    from trialkit.experiment import Experiment

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "trial.py").write_text(FINAL_ONLY)
    monkeypatch.chdir(tmp_path / "code")
    exp = Experiment("local")
    exp.config.search_space = X
    exp.config.trial_command = f"{sys.executable} trial.py"
    exp.config.tuner.name = "GridSearch"
    exp.config.max_trial_number = 2
    exp.start(0)
    try:
        printed = capsys.readouterr().out
        page = next(line.split()[1] for line in printed.splitlines() if line.startswith("page: "))
        assert page.startswith(exp.url + "/?token=") and page.endswith(f"#/exp/{exp.id}")
        token = page.split("?token=")[1].split("#")[0]
        answer = requests.get(f"{exp.url}/api/ui/experiments", headers={"Authorization": f"Bearer {token}"},
                              timeout=10)
        assert answer.status_code == 200 and exp.id in answer.text
    finally:
        exp.stop()


def test_the_live_line_is_written_again_only_when_it_changes():
    """The loop updates the line on every batch of events: a new user counted 1,749 redraws in 78 s, most of them
    the same line, which filled a terminal that was not being read (and stalled the run writing to it)."""
    out = io.StringIO()
    progress = Progress(out, tty=True)
    progress.width = lambda: 100
    for _ in range(50):
        progress.update(Snapshot(1, 1, 0, 0, 0, 5.0))
    assert out.getvalue().count("\x1b[K") == 1
    progress.update(Snapshot(2, 0, 0, 0, 0, 6.0))  # something seen changed: drawn again
    assert out.getvalue().count("\x1b[K") == 2 and "2 done" in out.getvalue().rpartition("\x1b[K")[2]
