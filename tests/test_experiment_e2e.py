"""Experiments end to end, through the `trialkit` command as a user runs it.

Real processes throughout: the control plane, its manager, and per trial
run.sh -> keeper -> a tiny Python script. Each test asserts what a user sees:
exit codes, output, the exported results, files written, and (conftest)
nothing left running.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import time
from pathlib import Path

import psutil
import pytest

from experiment_util import SDK_TRIAL, by_sequence, cli, experiment, experiment_id, export, start_cli

ROOT = Path(__file__).resolve().parent.parent
NNI_FIXTURES = ROOT / "tests" / "fixtures" / "nni" / "mnist-pytorch"
X_CHOICES = {"x": {"_type": "choice", "_value": [0.1, 0.3, 0.5, 0.7, 0.9]}}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def records_in_store(home: Path, exp: str, kind: str, earlier_runs: bool = False) -> int:
    """How many records of `kind` the store holds; `earlier_runs`: only those of a trial's runs before its last."""
    with sqlite3.connect(home / "experiments" / exp / "trialkit.db") as db:
        return db.execute("SELECT COUNT(*) FROM records r WHERE type=?" + (
            " AND run < (SELECT MAX(run) FROM records WHERE trial = r.trial)" if earlier_runs else ""),
            (kind,)).fetchone()[0]


@pytest.mark.parametrize("tuner", ["Random", "GridSearch", "TPE", "Evolution"])
def test_each_tuner_runs_a_few_trials(tmp_path, home, tuner):
    config = experiment(tmp_path, X_CHOICES, SDK_TRIAL.format(steps=3), maxTrialNumber=4,
                        tuner={"name": tuner, "classArgs": {"optimize_mode": "maximize"}})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    exp = experiment_id(lines[0])
    assert lines[1].startswith("manager: http://127.0.0.1:")
    rows = export(exp)
    assert [row["sequence"] for row in rows] == [0, 1, 2, 3]
    for row in rows:
        assert row["status"] == "SUCCEEDED" and row["exit_code"] == 0
        assert row["final"] == row["parameters"]["x"]
        assert row["intermediate"] == [row["parameters"]["x"]] * 3
    if tuner == "GridSearch":
        assert [row["parameters"]["x"] for row in rows] == [0.1, 0.3, 0.5, 0.7]  # each grid point once, in order
    best = max(row["final"] for row in rows)
    assert "best: " in done.stdout and f"final={best:.6g}" in done.stdout
    assert records_in_store(home, exp, "FINAL") == 4


def test_export_csv_and_plot(tmp_path):
    space = {"x": {"_type": "uniform", "_value": [0, 1]},
             "opt": {"_type": "choice", "_value": [{"_name": "sgd", "m": {"_type": "uniform", "_value": [0, 1]}},
                                                   {"_name": "adam"}]}}
    config = experiment(tmp_path, space, SDK_TRIAL.format(steps=4), maxTrialNumber=3)
    done = cli("run", config)
    assert done.returncode == 0, done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    csv_out = cli("experiment", "export", exp, "--format", "csv")
    assert csv_out.returncode == 0, csv_out.stderr
    header, *lines = csv_out.stdout.splitlines()
    assert header.startswith("trial_id,sequence,parameter_id,status,exit_code,reason,restart_count,")
    assert "param.x" in header and "param.opt" in header and len(lines) == 3
    assert all(",SUCCEEDED,0," in line for line in lines)
    png = tmp_path / "plot.png"
    plotted = cli("experiment", "plot", exp, "-o", png)
    assert plotted.returncode == 0, plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    listed = cli("experiment", "list")
    assert exp in listed.stdout and "DONE" in listed.stdout


def test_an_assessor_stops_a_bad_trial(tmp_path):
    # Grid order (the last parameter varies fastest): two equally good trials
    # complete, then the bad one reports below their median and would run for
    # 20 s if nobody stopped it.
    script = """
    import time, trialkit
    x = trialkit.get_next_parameter()["x"]
    for step in range(100):
        trialkit.report_intermediate_result(x)
        if x < 0.5:
            time.sleep(0.2)
    trialkit.report_final_result(x)
    """
    space = {"x": {"_type": "choice", "_value": [0.9, 0.1]}, "again": {"_type": "choice", "_value": [0, 1]}}
    config = experiment(tmp_path, space, script, maxTrialNumber=3, trialConcurrency=1, tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}},
                        assessor={"name": "Medianstop", "classArgs": {"start_step": 2}}, trialGraceSeconds=2)
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = by_sequence(export(experiment_id(done.stdout.splitlines()[0])))
    assert rows[0]["status"] == rows[1]["status"] == "SUCCEEDED"
    bad = rows[2]
    assert bad["status"] == "EARLY_STOPPED" and bad["final"] is None
    assert 2 <= len(bad["intermediate"]) < 100 and bad["duration"] < 12


def test_crash_timeout_nni_stdout_and_sdk_trials(tmp_path):
    script = r"""
    import json, os, sys, time, trialkit
    mode = trialkit.get_next_parameter()["mode"]
    if mode == "sdk":
        trialkit.report_intermediate_result(0.5)
        trialkit.report_final_result({"default": 0.75, "loss": 0.1})
    elif mode == "nni_stdout":
        # What NNI's SDK prints on platforms other than local: the value is JSON dumped again.
        for kind, seq, value in (("PERIODICAL", 0, 0.25), ("PERIODICAL", 1, 0.5), ("FINAL", 0, 0.6)):
            record = {"parameter_id": 0, "trial_job_id": os.environ["NNI_TRIAL_JOB_ID"], "type": kind,
                      "sequence": seq, "value": json.dumps(value)}
            print("NNISDK_MEb'%s'" % json.dumps(record), flush=True)
    elif mode == "crash":
        print("about to fail", file=sys.stderr)
        sys.exit(3)
    else:
        time.sleep(60)
    """
    space = {"mode": {"_type": "choice", "_value": ["sdk", "nni_stdout", "crash", "hang"]}}
    config = experiment(tmp_path, space, script, maxTrialNumber=4, maxTrialDuration="2s", trialGraceSeconds=1,
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr  # two trials succeeded
    exp = experiment_id(done.stdout.splitlines()[0])
    rows = {row["parameters"]["mode"]: row for row in export(exp)}
    assert rows["sdk"]["status"] == "SUCCEEDED" and rows["sdk"]["final"] == {"default": 0.75, "loss": 0.1}
    assert rows["nni_stdout"]["status"] == "SUCCEEDED"
    assert rows["nni_stdout"]["intermediate"] == [0.25, 0.5] and rows["nni_stdout"]["final"] == 0.6
    assert rows["crash"]["status"] == "FAILED" and rows["crash"]["exit_code"] == 3
    assert rows["hang"]["status"] == "FAILED" and "timeout" in rows["hang"]["reason"]
    assert rows["hang"]["duration"] < 10
    logs = cli("trial", "logs", rows["crash"]["trial_id"])
    assert "about to fail" in logs.stdout
    shown = cli("trial", "show", rows["hang"]["trial_id"])
    assert "FAILED: timeout" in shown.stdout


def test_the_keepers_warning_about_a_pipe_is_in_the_trials_logs(tmp_path):
    # The keeper's own stderr is trial.log on this platform, which `trial logs` shows only while the trial has
    # shipped no output: its warnings go into the trial's stderr too.
    config = experiment(tmp_path, X_CHOICES, "print('training')\n" + SDK_TRIAL.format(steps=1), maxTrialNumber=1,
                        trialCommand="python3 trial.py | cat")
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = export(experiment_id(done.stdout.splitlines()[0]))
    logs = cli("trial", "logs", row["trial_id"]).stdout
    said = [line for line in logs.splitlines() if line.startswith("[trialkit-keeper] warning: the command pipes")]
    assert "training" in logs and len(said) == 1 and "(... | cat)" in said[0], logs


def test_all_trials_failing_exits_non_zero(tmp_path):
    config = experiment(tmp_path, X_CHOICES, "raise SystemExit(1)\n", maxTrialNumber=2)
    done = cli("run", config)
    assert done.returncode == 1
    rows = export(experiment_id(done.stdout.splitlines()[0]))
    assert sorted((row["sequence"], row["status"], row["exit_code"]) for row in rows) == [(0, "FAILED", 1), (1, "FAILED", 1)]


def run_until_first_trial_ends(config):
    """`trialkit run` in the background, read until its first trial ended and two
    others run; (process, experiment id, the running keepers, oldest first)."""
    proc = start_cli("run", config)
    exp = experiment_id(proc.stdout.readline())
    for line in proc.stdout:
        if " SUCCEEDED " in line:
            break
    else:
        raise AssertionError("the experiment ended before a trial did: " + proc.stderr.read())
    control_plane = psutil.Process(proc.pid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        keepers = [p for p in control_plane.children() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if len(keepers) == 2:
            return proc, exp, sorted(keepers, key=lambda p: p.create_time())
        time.sleep(0.01)
    raise AssertionError("the next trial did not start")


def assert_complete(exp: str, home: Path, count: int):
    """Every trial SUCCEEDED with its two intermediate results and its final one, none stored twice. A lost trial
    that reported before it died keeps what its first run delivered (nothing reported is lost), and its restart,
    from scratch, reports them again after them."""
    rows = export(exp)
    assert sorted(row["sequence"] for row in rows) == list(range(count))
    earlier = records_in_store(home, exp, "PERIODICAL", earlier_runs=True)
    assert earlier <= 2 * sum(row["restart_count"] for row in rows)  # a first run's two at most, none twice
    for row in rows:
        assert row["status"] == "SUCCEEDED", row
        reported = 2 + (earlier if row["restart_count"] else 0)
        assert row["final"] == row["parameters"]["x"] and row["intermediate"] == [row["parameters"]["x"]] * reported
    assert records_in_store(home, exp, "FINAL") == count  # none twice
    assert records_in_store(home, exp, "PERIODICAL") == 2 * count + earlier
    return rows


def test_kill_9_of_the_control_plane_then_resume_reattaches(tmp_path, home):
    space = {"x": {"_type": "uniform", "_value": [0, 1]}, "sleep": {"_type": "choice", "_value": [1.0]}}
    config = experiment(tmp_path, space, SDK_TRIAL.format(steps=2), maxTrialNumber=6)
    proc, exp, _ = run_until_first_trial_ends(config)
    proc.kill()
    proc.wait()
    done = cli("experiment", "resume", exp)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"resumed experiment {exp}")
    rows = assert_complete(exp, home, 6)
    assert all(row["restart_count"] == 0 for row in rows)  # every running trial was reattached


def test_resume_restarts_lost_trials_and_collects_what_ended_meanwhile(tmp_path, home):
    space = {"x": {"_type": "uniform", "_value": [0, 1]}, "sleep": {"_type": "choice", "_value": [1.5]}}
    config = experiment(tmp_path, space, SDK_TRIAL.format(steps=2), maxTrialNumber=4)
    proc, exp, (survivor, lost) = run_until_first_trial_ends(config)
    proc.kill()
    proc.wait()
    lost.kill()  # the newest trial, not done yet, dies with its keeper (parent-death signal)
    # The survivor finishes with no manager to hear it; its keeper gives up
    # delivering after its flush time and leaves the records spooled.
    psutil.wait_procs([lost, survivor], timeout=30)
    done = cli("experiment", "resume", exp)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = assert_complete(exp, home, 4)
    assert sorted(row["restart_count"] for row in rows) == [0, 0, 0, 1]
    assert "restarting it" in done.stdout


def stopped_or_unstarted(row: dict) -> bool:
    """A trial a stop of the experiment found running, before its final result, is PAUSED, for `experiment
    resume` to run again; one whose command had not started yet did nothing, and waits for `experiment resume`
    with no exit code."""
    return (row["status"] == "PREEMPTED" and "`trialkit experiment resume` runs it again" in row["reason"]) or (
        row["status"] == "WAITING" and row["exit_code"] is None
        and "`trialkit experiment resume` starts it" in row["reason"])


def test_sigterm_to_the_control_plane_stops_trials_gracefully(tmp_path, home):
    config = experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]}}, "import time; time.sleep(60)\n",
                        maxTrialNumber=4, trialGraceSeconds=5)
    proc = start_cli("run", config)
    exp = experiment_id(proc.stdout.readline())
    trial_dirs = home / "experiments" / exp / "trials"
    deadline = time.monotonic() + 60
    while len(list(trial_dirs.glob("*/.trialkit/keeper.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 1  # no trial succeeded
    rows = export(exp)
    assert len(rows) == 2 and all(stopped_or_unstarted(row) for row in rows), rows
    assert "STOPPED" in cli("experiment", "show", exp).stdout


def test_detached_run_trial_kill_and_experiment_stop(tmp_path, home):
    script = """
    import time, trialkit
    trialkit.report_intermediate_result(1.0)
    time.sleep(60)
    """
    config = experiment(tmp_path, {"x": {"_type": "uniform", "_value": [0, 1]}}, script, maxTrialNumber=10)
    started = cli("run", config, "--detach")
    assert started.returncode == 0, started.stderr
    exp = experiment_id(started.stdout.splitlines()[0])
    assert "manager: http://127.0.0.1:" in started.stdout
    first = f"{exp}-00000"
    deadline = time.monotonic() + 60
    while "RUNNING" not in cli("trial", "show", first).stdout and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = cli("trial", "kill", first)
    assert killed.returncode == 0, killed.stderr
    stopped = cli("experiment", "stop", exp)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    rows = by_sequence(export(exp))
    assert rows[0]["status"] == "USER_CANCELED" and "trial kill" in rows[0]["reason"]
    assert all(stopped_or_unstarted(row) for sequence, row in rows.items() if sequence), rows
    assert "STOPPED" in cli("experiment", "show", exp).stdout
    assert (home / "experiments" / exp / "manager.log").read_text().startswith(f"started experiment {exp}")
    assert os.stat(home / "experiments" / exp / "manager.json").st_mode & 0o777 == 0o600
    gone = cli("experiment", "stop", exp)
    assert gone.returncode == 2 and "has ended (STOPPED): nothing of it runs now" in gone.stderr


def test_an_nni_example_config_and_search_space_unchanged(tmp_path):
    # NNI's own files as a user brings them; the trial speaks NNI's local-mode
    # wire format (parameter.cfg in, ME frames in .nni/metrics out), as the
    # real nni package does, so no nni install is needed here.
    folder = tmp_path / "mnist"
    folder.mkdir()
    for name in ("config_assessor.yml", "search_space.json"):
        shutil.copy(NNI_FIXTURES / name, folder / name)
    (folder / "mnist.py").write_text(
        "import json, os\n"
        "sys_dir = os.environ['NNI_SYS_DIR']\n"
        "cfg = json.load(open(os.path.join(sys_dir, 'parameter.cfg')))\n"
        "acc = cfg['parameters']['momentum']\n"
        "def send(kind, seq):\n"
        "    data = json.dumps({'parameter_id': cfg['parameter_id'], 'trial_job_id': os.environ['NNI_TRIAL_JOB_ID'],\n"
        "                       'type': kind, 'sequence': seq, 'value': json.dumps(acc)}).encode() + b'\\n'\n"
        "    with open(os.path.join(sys_dir, '.nni', 'metrics'), 'ab') as f:\n"
        "        f.write(b'ME%06d' % len(data) + data)\n"
        "for step in range(3):\n"
        "    send('PERIODICAL', step)\n"
        "send('FINAL', 0)\n")
    done = cli("run", folder / "config_assessor.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = export(experiment_id(done.stdout.splitlines()[0]))
    assert len(rows) == 20  # maxTrialNumber
    succeeded = [row for row in rows if row["status"] == "SUCCEEDED"]
    assert succeeded and all(row["final"] == row["parameters"]["momentum"] for row in succeeded)
    assert set(rows[0]["parameters"]) == {"batch_size", "hidden_size", "lr", "momentum"}


def test_the_python_api(tmp_path, capsys):
    from trialkit.experiment import Experiment

    code = tmp_path / "code"  # beside TRIALKIT_HOME: each trial copies it, so it must not hold the experiments
    code.mkdir()
    (code / "trial.py").write_text(SDK_TRIAL.format(steps=1))
    exp = Experiment("local")
    exp.config.search_space = {"x": {"_type": "uniform", "_value": [0, 1]}}
    exp.config.trial_command = "python3 trial.py"
    exp.config.trial_code_directory = str(code)
    exp.config.tuner.name = "TPE"
    exp.config.tuner.class_args["optimize_mode"] = "maximize"
    exp.config.max_trial_number = 3
    exp.config.trial_concurrency = 2
    assert exp.run(0) is True  # NNI's answer: it ended DONE (or STOPPED); 0: any free port
    assert exp.get_status() == "DONE"
    assert [job.status for job in exp.list_trial_jobs()] == ["SUCCEEDED"] * 3
    assert sorted(row.value for row in exp.export_data()) == sorted(
        row["final"] for row in export(exp.id))
    assert capsys.readouterr().out.startswith(f"started experiment {exp.id}")


@pytest.mark.parametrize("detach", [False, True])
def test_a_taken_port_is_one_line_and_leaves_no_experiment(tmp_path, home, detach):
    script = "import trialkit\ntrialkit.report_final_result(1.0)\n"
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, script, maxTrialNumber=1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli("run", config, "--port", port, *(["--detach"] if detach else []))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr
    assert "no experiments" in cli("experiment", "list").stdout  # none INTERRUPTED, never having run
    assert not any((home / "experiments").iterdir())
