"""A trial that fails says why where the user looks, and an experiment whose first
trials all fail the same way stops and says so (stopWhenFirstTrialsFail; 0 runs
on, as NNI does). Real `trialkit run`, real keepers, the store on disk.
"""
from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from experiment_util import cli, experiment, experiment_id, export
from trialkit.platforms import context
from trialkit.web import queries

MISSING = "ModuleNotFoundError: No module named 'no_such_module_here'"
X = {"x": {"_type": "choice", "_value": [1, 2, 3, 4, 5, 6]}}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_the_first_trials_failing_alike_stop_the_experiment_and_every_face_says_why(tmp_path, home):
    config = experiment(tmp_path, X, "import no_such_module_here\n", maxTrialNumber=20, trialConcurrency=1)
    done = cli("run", config)
    assert done.returncode == 1, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    ended = [line for line in done.stdout.splitlines() if line.startswith("trial ") and "FAILED" in line]
    assert len(ended) == 3 and all(MISSING in line for line in ended), done.stdout  # the terminal's progress
    assert "the trial's command ran on " in ended[0]  # which Python could not import it
    assert f"error: the first 3 trials all failed the same way: {MISSING}" in done.stdout
    assert "stopWhenFirstTrialsFail: 0" in done.stdout
    rows = export(exp)
    assert [row["status"] for row in rows] == ["FAILED"] * 3  # 3 of 20 ran
    listed = cli("trial", "list", exp).stdout
    # The status column holds the word; why, a last column (whole when piped, as here; cut to a terminal's width).
    header, _, *lines = listed.splitlines()
    assert all(line[header.index("status"):header.index("final")].strip() == "FAILED" for line in lines), listed
    assert all(line[header.index("why"):].startswith(MISSING) for line in lines), listed
    trial = rows[0]["trial_id"]
    shown = cli("trial", "show", trial).stdout.splitlines()
    assert f"status         FAILED: {MISSING}" in "\n".join(shown)
    history = shown[shown.index("history:") + 1:]
    assert [line.split()[2] for line in history] == ["WAITING", "RUNNING", "FAILED"], history  # each end once
    assert MISSING in history[-1]
    with closing(sqlite3.connect(home / "experiments" / exp / "trialkit.db")) as db:  # what the page's table gets
        db.row_factory = sqlite3.Row
        queries.register(db)
        page = queries.trials_page(db, exp, queries.TrialQuery())
    assert all(row["reason"].startswith(MISSING) for row in page["rows"]), page["rows"]


def test_a_misspelt_script_is_refused_before_any_trial_runs(tmp_path, home):
    # It ran three trials to the first-failures stop, each naming its own copy of the code (newcomer13).
    config = experiment(tmp_path, X, "print('never run')\n", maxTrialNumber=20, trialCommand="python3 -u trail.py")
    done = cli("run", config)
    assert done.returncode == 2 and re.fullmatch(
        rf"trialkit: error: {re.escape(str(config))}:\d+: trialCommand: trail.py is not in the trial code directory "
        rf"{re.escape(str(config.parent))} \(did you mean trial.py\?\)\n", done.stderr), done.stdout + done.stderr
    assert not (home / "experiments").exists() or not any((home / "experiments").iterdir())
    # The script a command runs, where it is a plain `python SCRIPT.py`; no check of any other command.
    assert [context._script_of(command) for command in (
        "python3 trial.py", "python3 -W ignore ./sub/trial.py --lr 1", "python3.11 -u x.py", "python3 -m trial",
        "python3 -c 'print(1)'", "cd sub && python3 x.py", "torchrun train.py", "python3 'unclosed",
        "env A=1 B='x y' python3 trail.py", "A=1 python3 t.py", "env -u A python3 t.py", "env A=1 env B=2 python3 t.py")
    ] == ["trial.py", "sub/trial.py", "x.py", None, None, None, None, None, "trail.py", "t.py", None, "t.py"]


def test_a_launchers_misspelt_script_is_refused_before_any_trial_runs(tmp_path, home):
    # It started, and each trial FAILED some seconds later: "rank 0 failed with exit code 2 running ..." (newcomer19).
    command = "python3 -m trialkit.launch.torch_distributed --max_restarts 1 -- trail.py --lr 0.1"
    config = experiment(tmp_path, X, "print('never run')\n", maxTrialNumber=20, trialCommand=command)
    done = cli("run", config)
    assert done.returncode == 2 and re.fullmatch(
        rf"trialkit: error: {re.escape(str(config))}:\d+: trialCommand: trail.py is not in the trial code directory "
        rf"{re.escape(str(config.parent))} \(did you mean trial.py\?\)\n", done.stderr), done.stdout + done.stderr
    assert not (home / "experiments").exists() or not any((home / "experiments").iterdir())
    # The script a launcher's workers run, its arguments split as the launcher splits them; nothing where it is
    # no .py script, a trial class, or arguments the launcher refuses itself.
    launch = "python3 -m trialkit.launch."
    assert [context._script_of(launch + rest) for rest in (
        "deepspeed train.py", "horovod ./sub/train.py -- --lr 1", "torch_distributed --nnodes 2 -- t.py",
        "deepspeed -- x.py", "torch_distributed --trial model:Trial", "horovod train.sh", "deepspeed --nnodes 2 t.py",
        "wrap_rank RANK -- t.py")
    ] == ["train.py", "sub/train.py", "t.py", "x.py", None, None, None, None]


def test_a_determined_entrypoints_misspelt_script_module_or_class_is_refused_in_its_own_words(tmp_path, home):
    """Determined's entrypoint runs behind `env TRIALKIT_DETERMINED=...`: its script is checked as an NNI
    command's, and refused naming `entrypoint` (newcomer17: three trials failed first); a legacy trial class's
    module too, and its class, read from the module's source (every trial failed on `model_def:MyTrail`)."""
    code = tmp_path / "code"  # beside the home, not holding it
    code.mkdir()
    (code / "train.py").write_text("print('never run')\n")
    (code / "model_def.py").write_text("from determined import pytorch\n\n\nclass MyTrial(pytorch.PyTorchTrial):\n"
                                       "    pass\n")
    for entrypoint, said in (("python3 tran.py", "entrypoint: tran.py is not in the trial code directory "
                                                 f"{code} (did you mean train.py?)"),
                             ("modeldef:LinRegTrial", "entrypoint: modeldef is not a module in the context "
                                                      f"directory {code} (did you mean model_def?)"),
                             ("model_def:MyTrail", f"entrypoint: model_def has no class MyTrail ({code}/model_def.py "
                                                   "binds no such name at its top level) (did you mean MyTrial?)")):
        (code / "exp.yaml").write_text(f"entrypoint: {entrypoint}\nsearcher: {{name: single, metric: loss}}\n")
        done = cli("run", code / "exp.yaml", code)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert not (home / "experiments").exists() or not any((home / "experiments").iterdir())


def test_a_misspelt_script_is_refused_with_the_configs_other_problems_at_once(tmp_path, home):
    # With an unknown key as well, the user fixed that, ran again, and only then learnt of the script (newcomer,
    # session 11): a config's refusal lists every problem it finds, the script's with the rest.
    config = experiment(tmp_path, X, "print('never run')\n", trialCommand="python3 trail.py", maxTrialNumbr=2)
    done = cli("run", config)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "2 problems: " in done.stderr and "trialCommand: trail.py is not in the trial code directory" in \
        done.stderr and "maxTrialNumbr: unknown key 'maxTrialNumbr'" in done.stderr, done.stderr
    code = tmp_path / "code"  # a Determined config's, beside the home
    code.mkdir()
    (code / "train.py").write_text("print('never run')\n")
    (code / "exp.yaml").write_text("entrypoint: python3 tran.py\nsearcher: {name: single, metric: loss}\n"
                                   "max_trials: 2\n")
    done = cli("run", code / "exp.yaml", code)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "2 problems: " in done.stderr and "exp.yaml:1: entrypoint: tran.py is not in the trial code directory" in \
        done.stderr and "exp.yaml:3: max_trials: a searcher's key" in done.stderr, done.stderr
    assert not (home / "experiments").exists() or not any((home / "experiments").iterdir())


# A script that reads a file from where it runs: each trial's reason names its own copy of the code dir.
READS_ITS_DATA = "import os\nopen(os.path.join(os.getcwd(), 'data.csv'))\n"


def test_failures_that_differ_only_by_each_trials_own_dir_stop_it(tmp_path):
    config = experiment(tmp_path, X, READS_ITS_DATA, maxTrialNumber=20, trialConcurrency=1)
    done = cli("run", config)
    assert done.returncode == 1, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    assert [row["status"] for row in export(exp)] == ["FAILED"] * 3, done.stdout
    said = re.search(r"error: the first 3 trials all failed the same way: (.*)", done.stdout)
    assert said and f"{exp}-00000" in said.group(1) and "data.csv" in said.group(1), done.stdout


def test_with_0_every_trial_runs_as_in_nni(tmp_path):
    config = experiment(tmp_path, X, "import no_such_module_here\n", maxTrialNumber=4, trialConcurrency=2,
                        stopWhenFirstTrialsFail=0)
    done = cli("run", config)
    exp = experiment_id(done.stdout.splitlines()[0])
    assert done.returncode == 1 and f"experiment {exp} DONE" in done.stdout, done.stdout  # no trial succeeded: 1
    assert "error:" not in done.stdout
    assert [row["status"] for row in export(exp)] == ["FAILED"] * 4


def test_failures_that_differ_do_not_stop_it(tmp_path):
    script = "import trialkit\nraise SystemExit('bad x=%s' % trialkit.get_next_parameter()['x'])\n"
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1, 2, 3, 4]}}, script, maxTrialNumber=4,
                        trialConcurrency=2, tuner={"name": "GridSearch"})
    done = cli("run", config)
    exp = experiment_id(done.stdout.splitlines()[0])
    rows = export(exp)
    assert f"experiment {exp} DONE" in done.stdout, done.stdout
    assert [(row["status"], row["reason"]) for row in rows] == [("FAILED", f"bad x={x}") for x in (1, 2, 3, 4)]


def test_a_trial_that_dies_silently_says_how(tmp_path):
    config = experiment(tmp_path, X, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", maxTrialNumber=1)
    done = cli("run", config)
    (row,) = export(experiment_id(done.stdout.splitlines()[0]))
    assert (row["status"], row["reason"]) == ("FAILED", "signal SIGKILL (exit 137), nothing on stderr")


# Trials 0-2 fail at once; trial 3 runs on until the experiment stops it.
FAILS_FIRST = """
import os, time
if int(os.environ["TRIALKIT_SEQUENCE"]) >= 3:
    time.sleep(60)
raise SystemExit(3)
"""


def test_a_trial_that_the_experiments_error_canceled_says_why_in_the_trial_table(tmp_path, home):
    config = experiment(tmp_path, X, FAILS_FIRST, maxTrialNumber=20, trialConcurrency=2)
    done = cli("run", config)
    assert done.returncode == 1, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    canceled = [row for row in export(exp) if row["status"] == "SYS_CANCELED"]
    assert [row["reason"] for row in canceled] == ["experiment stopped: its first 3 trials all failed"], canceled
    listed = cli("trial", "list", exp).stdout
    line = next(line for line in listed.splitlines() if line.startswith(canceled[0]["trial_id"]))
    assert re.match(r"\S+  SYS_CANCELED  .*  experiment stopped: its first 3 trials all failed$", line), listed


def test_a_run_cut_short_says_why_at_its_end_as_experiment_show_does(tmp_path):
    script = "import time, trialkit\ntrialkit.get_next_parameter()\ntime.sleep(60)\n"
    config = experiment(tmp_path, X, script, maxTrialNumber=2, maxExperimentDuration="2s", trialGraceSeconds=2)
    done = cli("run", config)
    exp = experiment_id(done.stdout.splitlines()[0])
    end = done.stdout[done.stdout.index(f"\nexperiment {exp} DONE after "):].splitlines()
    assert end[2] == "why: maxExperimentDuration reached", done.stdout
    assert "status      DONE: maxExperimentDuration reached" in cli("experiment", "show", exp).stdout


@pytest.mark.parametrize("tuner, trials, why", [
    ("Random", 2, "maxTrialNumber (2) reached"),
    ("GridSearch", 9, "search space exhausted: each of its 6 points was tried")])
def test_a_run_that_ends_done_says_why_as_experiment_show_does(tmp_path, tuner, trials, why):
    config = experiment(tmp_path, X, "import trialkit\ntrialkit.report_final_result(1)\n", maxTrialNumber=trials,
                        tuner={"name": tuner})
    done = cli("run", config)
    exp = experiment_id(done.stdout.splitlines()[0])
    assert done.returncode == 0 and f"\nwhy: {why}\n" in done.stdout, done.stdout
    assert f"status      DONE: {why}" in cli("experiment", "show", exp).stdout
