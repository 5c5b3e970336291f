"""trialkit.experiment.Experiment against running experiments: NNI 3.0's members, NNI's calls.

Every experiment here is real: a manager process started by `start()`, trials
run by keepers, the store on disk. Trials wait for a gate file, so the test
decides when they end.
"""
from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from experiment_util import TIMEOUT, cli
from harness import ROOT
from trialkit.errors import UserError
from trialkit.experiment import Experiment, RunMode, TrialJob, TrialMetricData, TrialResult

GATED_TRIAL = """
import os, time, trialkit
p = trialkit.get_next_parameter()
trialkit.report_intermediate_result({{"default": p["x"] / 10, "loss": 1.0}})
while not os.path.exists({gate!r}):
    time.sleep(0.05)
trialkit.report_final_result({{"default": p["x"], "loss": 1.0 / p["x"]}})
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def until(what, check, timeout: float = TIMEOUT):
    """check()'s first truthy value; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def gated_experiment(tmp_path: Path, **config) -> Experiment:
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(GATED_TRIAL.format(gate=str(tmp_path / "gate")))
    exp = Experiment("local")
    exp.config.search_space = {"x": {"_type": "choice", "_value": [1, 2, 3]}}  # a point each: none is tried twice
    exp.config.trial_command = "python3 trial.py"
    exp.config.trial_code_directory = code  # a Path, as NNI's examples pass
    exp.config.tuner.name = "Random"
    exp.config.tuner.class_args["optimize_mode"] = "maximize"
    exp.config.trial_concurrency = 1
    exp.config.max_trial_number = 3
    for key, value in config.items():
        setattr(exp.config, key, value)
    return exp


def statuses(exp: Experiment):
    return [job.status for job in exp.list_trial_jobs()]


def test_every_member_against_a_running_experiment(tmp_path):
    exp = gated_experiment(tmp_path)
    port = free_port()
    exp.start(port)
    try:
        assert (exp.port, exp.url) == (port, f"http://127.0.0.1:{port}")
        assert exp.get_status() == "RUNNING"
        until("the first trial to run", lambda: statuses(exp) == ["RUNNING"])

        same = Experiment.connect(port)
        assert (same.id, same.get_status(), same.config.trial_concurrency) == (exp.id, "RUNNING", 1)

        exp.update_trial_concurrency(2)
        until("a second trial", lambda: statuses(exp) == ["RUNNING", "RUNNING"])
        first, second = [job.trialJobId for job in exp.list_trial_jobs()]
        exp.kill_trial_job(second)
        until("the kill and a third trial", lambda: statuses(exp) == ["RUNNING", "USER_CANCELED", "RUNNING"])

        exp.update_search_space({"x": {"_type": "choice", "_value": [5]}})
        exp.update_max_trial_number(4)
        exp.update_max_experiment_duration("1h")
        params = exp.get_experiment_profile()["params"]
        assert (params["searchSpace"], params["maxTrialNumber"], params["maxExperimentDuration"]) == (
            {"x": {"_type": "choice", "_value": [5]}}, 4, 3600)
        with pytest.raises(UserError, match="the manager refused: .*trialConcurrency"):
            exp.update_trial_concurrency(0)

        (tmp_path / "gate").touch()
        until("the end", lambda: exp.get_status() == "DONE")
    finally:
        exp.stop()
    assert exp.port is None

    jobs = exp.list_trial_jobs()
    assert [job.status for job in jobs] == ["SUCCEEDED", "USER_CANCELED", "SUCCEEDED", "SUCCEEDED"]
    assert jobs[3].hyperParameters[0].parameters == {"x": 5}  # the tuner's new space
    job = exp.get_trial_job(first)
    assert isinstance(job, TrialJob) and job.sequenceId == 0 and job.endTime >= job.startTime > 0
    assert [m.data for m in job.finalMetricData] == [{"default": job.hyperParameters[0].parameters["x"],
                                                       "loss": 1.0 / job.hyperParameters[0].parameters["x"]}]
    assert Path(job.logPath).is_file() and Path(job.stderrPath).is_file()
    assert sorted((s["trialJobStatus"], s["trialJobNumber"]) for s in exp.get_job_statistics()) == [
        ("SUCCEEDED", 3), ("USER_CANCELED", 1)]

    metrics = exp.get_job_metrics()
    # Trials with metrics, as NNI's: the killed one may have died before its first report.
    assert set(metrics) - {second} == {job.trialJobId for job in jobs if job.status == "SUCCEEDED"}
    assert [(m.type, m.sequence, m.trialJobId) for m in metrics[first]] == [
        ("PERIODICAL", 0, first), ("FINAL", 0, first)]
    assert all(isinstance(m, TrialMetricData) and m.timestamp > 0 for m in metrics[first])
    assert list(exp.get_job_metrics(first)) == [first]

    exported = exp.export_data()
    assert all(isinstance(row, TrialResult) for row in exported)
    assert sorted(row.trialJobId for row in exported) == sorted(j.trialJobId for j in jobs if j.status == "SUCCEEDED")
    assert {row.trialJobId: (row.parameter["x"], row.value["default"]) for row in exported}[jobs[3].trialJobId] == (5, 5)

    profile = exp.get_experiment_profile()
    assert (profile["id"], profile["nextSequenceId"], profile["endTime"] >= profile["startTime"] > 0) == (exp.id, 4, True)
    meta = exp.get_experiment_metadata(exp.id)
    assert (meta["status"], meta["platform"], meta["port"]) == ("DONE", "local", None)
    assert exp.get_experiment_metadata("nosuchid") == {}

    # A stored experiment: resume (nothing left to do: DONE at once), then view its page.
    again = Experiment(None, id=exp.id)
    assert again.has_checkpoint() and again.resume(free_port()) is True
    assert again.config.max_trial_number == 4  # load_checkpoint took the stored (updated) config
    viewed = Experiment.view(exp.id, port=free_port(), non_blocking=True)
    try:
        with urllib.request.urlopen(viewed.url, timeout=30) as page:
            assert page.status == 200
    finally:
        viewed.stop()


def test_stop_ends_a_page_that_does_not_end_on_ctrl_c(monkeypatch):
    import trialkit.experiment as experiment_module
    monkeypatch.setattr(experiment_module, "ENDING_WAIT", 0.5)
    exp = Experiment(None, id="viewed")
    exp._viewer = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                               "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert exp._viewer.stdout.readline() == "ready\n"
    viewer = exp._viewer
    exp.stop()
    assert viewer.returncode == -9 and exp._viewer is None


LISTENS_AND_ENDS = """
import sys
from trialkit.control import admin
admin.write_info(sys.argv[1], admin.ManagerInfo.for_this_process("quick", "http://127.0.0.1:1", 1, 0.0))
"""


def test_a_manager_that_listened_and_already_ended_counts_as_started(tmp_path):
    # A resumed experiment with nothing left to do writes manager.json and ends within milliseconds:
    # CI caught `resume()` calling that a failed start when the exit was seen before the file.
    from trialkit import process
    from trialkit.control import background
    quick = process.spawn([sys.executable, "-c", LISTENS_AND_ENDS, str(tmp_path)])
    assert quick.popen.wait(timeout=TIMEOUT) == 0
    info = background.wait_listening(quick, tmp_path, timeout=TIMEOUT)
    assert info is not None and (info.pid, info.experiment_id) == (quick.pid, "quick")

    silent = process.spawn([sys.executable, "-c", "pass"])
    silent.popen.wait(timeout=TIMEOUT)
    started = time.monotonic()
    assert background.wait_listening(silent, tmp_path / "elsewhere", timeout=TIMEOUT) is None
    assert time.monotonic() - started < TIMEOUT / 2  # an exit ends the wait, not the timeout


def test_run_waits_and_returns_true_and_the_context_manager_stops_a_running_experiment(tmp_path):
    (tmp_path / "gate").touch()
    exp = gated_experiment(tmp_path, max_trial_number=2)
    assert exp.run(free_port()) is True
    assert [job.status for job in exp.list_trial_jobs()] == ["SUCCEEDED", "SUCCEEDED"]

    (tmp_path / "gate").unlink()
    (tmp_path / "code").rename(tmp_path / "code1")
    with gated_experiment(tmp_path) as running:
        assert running.run(free_port(), wait_completion=False) is None
        until("a trial to run", lambda: statuses(running) == ["RUNNING"])
    assert running.get_status() == "STOPPED"
    assert statuses(running) == ["PREEMPTED"]  # cut short before its result: a resume runs it again


def test_csv_export_gives_each_key_of_a_dict_metric_a_column_as_nnictl_does(tmp_path):
    (tmp_path / "gate").touch()
    exp = gated_experiment(tmp_path, max_trial_number=2)
    assert exp.run(free_port()) is True
    done = cli("experiment", "export", exp.id, "--format", "csv")
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0].split(",")
    at = header.index("final")
    assert header[at - 1:at + 4] == ["steps", "final", "final.loss", "latest", "latest.loss"]  # flat: no JSON list
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert len(rows) == 2
    for row in rows:
        x = float(row["param.x"])  # final {"default": x, "loss": 1/x}; intermediate {"default": x/10, "loss": 1.0}
        assert (float(row["final"]), float(row["final.loss"]), float(row["latest"]), float(row["latest.loss"])) == (
            x, 1 / x, x / 10, 1.0)


def test_members_that_make_no_sense_here_say_so(tmp_path):
    with pytest.raises(UserError, match="hybrid"):
        Experiment(["local", "remote"])
    exp = gated_experiment(tmp_path)
    with pytest.raises(UserError, match="no debug mode"):
        exp.run(free_port(), debug=True)
    with pytest.raises(UserError, match="finds no experiment"):
        Experiment(None, id="nosuchid").resume()
    with pytest.raises(UserError, match="finds no running experiment"):
        Experiment.connect(free_port())


def test_an_unknown_key_and_a_misspelt_script_are_refused_in_one_error_as_the_cli_refuses_them(tmp_path, home):
    exp = gated_experiment(tmp_path, trial_command="python3 trail.py", trial_concurency=2)
    for check in (exp.config.validate, lambda: exp.start(free_port())):
        with pytest.raises(UserError) as refused:
            check()
        said = str(refused.value)
        assert said.startswith("2 problems: ") and "unknown key 'trial_concurency' (did you mean " \
            "'trialConcurrency'?)" in said and "trail.py is not in the trial code directory" in said and \
            "(did you mean trial.py?)" in said, said
    assert not (home / "experiments").exists() or not any((home / "experiments").iterdir()), "it started"


# NNI 3.0's HPO quickstart (examples/tutorials/hpo_quickstart_pytorch/main.py), its
# calls as written, and those of its notebooks after the run; only the import differs
# (and the port: 8080 may be taken on a shared machine).
NNI_QUICKSTART = """
from pathlib import Path

search_space = {
    'features': {'_type': 'choice', '_value': [128, 256, 512, 1024]},
    'lr': {'_type': 'loguniform', '_value': [0.0001, 0.1]},
    'momentum': {'_type': 'uniform', '_value': [0, 1]},
}

from trialkit.experiment import Experiment
experiment = Experiment('local')

experiment.config.trial_command = 'python model.py'
experiment.config.trial_code_directory = Path(__file__).parent
experiment.config.search_space = search_space
experiment.config.tuner.name = 'TPE'
experiment.config.tuner.class_args['optimize_mode'] = 'maximize'
experiment.config.max_trial_number = 10
experiment.config.trial_concurrency = 2

experiment.run(PORT)

print('status', experiment.get_status())
print('exported', len(experiment.export_data()))
print('metrics', len(experiment.get_job_metrics()))
experiment.stop()
"""

# The quickstart's model.py, its NNI calls kept and the training left out (no dataset here).
NNI_MODEL = """
import nni
params = {'features': 512, 'lr': 0.001, 'momentum': 0}
optimized_params = nni.get_next_parameter()
params.update(optimized_params)
accuracy = 0.0
for t in range(3):
    accuracy = min(1.0, accuracy + params['lr'] * 10 + params['momentum'] / 10)
    nni.report_intermediate_result(accuracy)
nni.report_final_result(accuracy)
"""


def test_nnis_quickstart_runs_with_only_the_import_changed(tmp_path):
    nni_python = subprocess.run(["bash", str(ROOT / "tools" / "nni_venv.sh")], capture_output=True, text=True,
                                timeout=900, check=True).stdout.split()[-1]
    project = tmp_path / "hpo_quickstart"
    project.mkdir()
    (project / "main.py").write_text(NNI_QUICKSTART.replace("PORT", str(free_port())))
    (project / "model.py").write_text(textwrap.dedent(NNI_MODEL))
    environ = dict(os.environ)
    # The user's shell: nni's environment first, so the trials' `python` is its Python.
    environ["PATH"] = os.path.dirname(nni_python) + os.pathsep + environ["PATH"]
    done = subprocess.run([sys.executable, "main.py"], cwd=project, env=environ, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-3:] == ["status DONE", "exported 10", "metrics 10"]
    experiment_id = done.stdout.split()[2]
    config = json.loads((Path(os.environ["TRIALKIT_HOME"]) / "experiments" / experiment_id /
                         "experiment-config.json").read_text())
    assert config["trialCodeDirectory"] == str(project)


# A program that starts an experiment from a config object and exits at once.
DRIVER = """
import sys
from trialkit.control.config import load_config
from trialkit.experiment import Experiment, RunMode
experiment_id, config, port, mode = sys.argv[1:]
Experiment(load_config(config), id=experiment_id).start(int(port), run_mode=RunMode[mode])
"""


@pytest.mark.parametrize("mode, after_exit", [("Detach", "RUNNING"), ("Background", "STOPPED")])
def test_a_detached_experiment_outlives_its_program_and_a_background_one_stops_with_it(tmp_path, mode, after_exit):
    exp = gated_experiment(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(exp.config.validate().to_dict()))
    done = subprocess.run([sys.executable, "-c", DRIVER, exp.id, str(config), str(free_port()), mode],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    try:
        assert exp.get_status() == after_exit
        if after_exit == "RUNNING":
            assert Experiment.connect(exp.id).get_status() == "RUNNING"
    finally:
        exp.stop()
    assert exp.get_status() == "STOPPED"


@pytest.mark.parametrize("mode", ["Foreground", "Background"])
def test_foreground_shows_the_managers_output_here_and_background_keeps_it_in_manager_log(tmp_path, mode):
    exp = gated_experiment(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(exp.config.validate().to_dict()))
    driver = DRIVER + "Experiment(None, id=experiment_id).stop()\n"  # another object stops it: connect's way
    done = subprocess.run([sys.executable, "-c", driver, exp.id, str(config), str(free_port()), mode],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert exp.get_status() == "STOPPED"
    log_file = Path(os.environ["TRIALKIT_HOME"]) / "experiments" / exp.id / "manager.log"
    log = log_file.read_text() if log_file.exists() else ""
    # The manager's own line naming its page, here or in its log; the API prints the page's URL either way.
    shown_here = sum(line.startswith("page: http://127.0.0.1:") for line in done.stdout.splitlines())
    in_log = any(line.startswith("page: http://127.0.0.1:") for line in log.splitlines())
    assert (shown_here, in_log) == ((2, False) if mode == "Foreground" else (1, True))
