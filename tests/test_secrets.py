"""The trial's token never reaches a log, whatever the trial runs (issue 45, item 1).

Only the keeper holds it (its shipper sends it); the training process and the startup hook reach the keeper
through the channel file and get no token in their environment, and the keeper overwrites the value in its
own first environment block, which /proc/PID/environ and `ps e` show to every process of its user.
"""
from __future__ import annotations

import re

from experiment_util import cli, experiment, experiment_id, export
from keeper_util import PYTHON, run_sh, status, trial_dir

TOKEN = "tok-" + "s3cr3t" * 6
# Every way a trial (or its hook) prints an environment: its own, and its keeper's.
DUMPS = ("env; printenv; {python} -c 'import os; print(os.environ)'; "
         "cat /proc/$TRIALKIT_KEEPER_PID/environ; ps eww -p $TRIALKIT_KEEPER_PID; echo dumped")


def test_no_environment_a_trial_or_its_hook_prints_holds_the_token(trial_env):
    code = trial_dir(trial_env).parent / "code"
    code.mkdir()
    (code / "startup-hook.sh").write_text("env; cat /proc/$PPID/environ; ps eww -p $PPID\n")
    environ = {**trial_env, "TRIALKIT_PYTHON": PYTHON, "TRIALKIT_CODE_DIR": str(code), "TRIALKIT_TOKEN": TOKEN}
    r = run_sh(environ, "sh", "-c", DUMPS.format(python=PYTHON))
    r.expect(b"dumped")
    assert r.wait() == 0, r.stderr
    assert b"TRIALKIT_KEEPER_PID=" in r.stdout  # the dumps ran
    logs = {name: (trial_dir(environ) / name).read_bytes() for name in ("stdout.log", "stderr.log", "startup-hook.log")}
    assert b"TRIALKIT_TRIAL_DIR=" in logs["startup-hook.log"]
    for name, text in {**logs, "echoed stdout": r.stdout, "echoed stderr": r.stderr}.items():
        assert TOKEN.encode() not in text, name
    assert status(environ)["status"] == "SUCCEEDED"


NNI_TRIAL = """
import os, subprocess, nni
print(dict(os.environ))
subprocess.run("env; cat /proc/$TRIALKIT_KEEPER_PID/environ", shell=True)
nni.report_final_result(nni.get_next_parameter()["x"])
"""


def test_a_trial_that_prints_its_environment_still_reports_through_its_keeper(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [3]}}, NNI_TRIAL, maxTrialNumber=1,
                        trialConcurrency=1)
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    (row,) = export(exp)
    assert row["status"] == "SUCCEEDED" and row["final"] == 3  # delivered with the keeper's token
    logs = cli("trial", "logs", f"{exp}-00000")
    assert logs.returncode == 0 and "TRIALKIT_TRIAL_ID" in logs.stdout, logs.stderr
    # The name is in none of the trial's environments; the keeper's own shows it with its value overwritten.
    assert "'TRIALKIT_TOKEN'" not in logs.stdout
    assert set(re.findall(r"TRIALKIT_TOKEN=([^\s\x00]*)", logs.stdout)) <= {"*" * 43}, logs.stdout
