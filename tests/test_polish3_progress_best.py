"""The progress line's best is one of the trials its counts say ended: a trial that reported the best final
result and still runs is counted running, so it is not yet the best the line names. Real `trialkit run`, two
trials at once: x=5 reports its final result first and runs on until x=1 has ended.
"""
from __future__ import annotations

import re
import signal

import pytest

from experiment_util import cli, experiment, experiment_id, start_cli, trial_status
from harness import wait_until

pytestmark = pytest.mark.usefixtures("home")

X = {"x": {"_type": "choice", "_value": [5, 1]}}
# x=5: its final result, then it runs on until the control plane has recorded x=1's end (its token revoked, which
# it does just before it prints that end's line). x=1: ends once the manager has stored x=5's final result. Each
# reads the experiment's store (read-only, as the CLI does) for the other's event: no sleep stands in for one.
LINGERS = """
import os, sqlite3, time, trialkit
me, exp = os.environ["TRIALKIT_TRIAL_ID"], os.environ["TRIALKIT_EXPERIMENT_ID"]
store = os.path.join(os.environ["TRIALKIT_HOME"], "experiments", exp, "trialkit.db")
def other(sql):
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        return db.execute(sql, (me,)).fetchone()[0]
def wait_for(sql):
    while not other(sql):
        time.sleep(0.05)
x = trialkit.get_next_parameter()["x"]
if x == 5:
    trialkit.report_final_result(x)
    wait_for("SELECT COUNT(*) FROM trials WHERE id != ? AND status = 'SUCCEEDED' AND token_hash IS NULL")
else:
    wait_for("SELECT COUNT(*) FROM records WHERE trial != ? AND type = 'FINAL'")
    trialkit.report_final_result(x)
"""


def test_the_line_names_as_best_only_a_trial_it_counts_as_ended(tmp_path):
    config = experiment(tmp_path, X, LINGERS, maxTrialNumber=2, trialConcurrency=2,
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    ends = [line for line in done.stdout.splitlines() if line.startswith("trial ") and " ended: " in line]
    assert len(ends) == 2, done.stdout
    said = [re.match(r"trial (\S+) SUCCEEDED final=(\d) \| .* (\d) done, (\d) running.* \| best (\d) \((\S+): x=\d\)$",
                     line) for line in ends]
    assert all(said), ends
    (first, one, *counts, best, trial), last = said[0].groups(), said[1].groups()
    # x=1 ended first, x=5 still ran: the best of what ended is x=1, though x=5 had reported more.
    assert (one, counts, best, trial) == ("1", ["1", "1"], "1", first), ends
    assert last[1:] == ("5", "2", "0", "5", last[0]), ends


# x=5: its final result, then it runs until it is stopped, and leaves as one that saved its checkpoint (exit 143:
# PAUSED). x=1: ends once the manager has stored x=5's final result.
PAUSED_WITH_ITS_FINAL = """
import os, signal, sqlite3, sys, time, trialkit
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
me, exp = os.environ["TRIALKIT_TRIAL_ID"], os.environ["TRIALKIT_EXPERIMENT_ID"]
store = os.path.join(os.environ["TRIALKIT_HOME"], "experiments", exp, "trialkit.db")
x = trialkit.get_next_parameter()["x"]
if x == 5:
    trialkit.report_final_result(x)
    while True:
        time.sleep(0.05)
while True:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        if db.execute("SELECT COUNT(*) FROM records WHERE trial != ? AND type = 'FINAL'", (me,)).fetchone()[0]:
            break
    time.sleep(0.05)
trialkit.report_final_result(x)
"""


def test_a_stopped_runs_last_line_names_the_best_its_summary_and_experiment_show_name(tmp_path, home):
    """Ctrl-C with x=5 paused after its final result: the last line named x=1, the summary and `experiment show`
    x=5 (newcomer, session 11). x=5's result stands (its resume keeps it; the tuner has it): every face names it."""
    config = experiment(tmp_path, X, PAUSED_WITH_ITS_FINAL, maxTrialNumber=2, trialConcurrency=2,
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        wait_until(lambda: trial_status(home, f"{exp}-00001") == "SUCCEEDED", 60, "x=1 to end")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert trial_status(home, f"{exp}-00000") == "PREEMPTED", out + err
    last = next(line for line in out.splitlines() if line.startswith(f"experiment {exp} STOPPED after "))
    assert last.endswith(f"| best 5 ({exp}-00000: x=5)"), out
    assert f"best: {exp}-00000 final=5 " in out, out
    shown = cli("experiment", "show", exp).stdout
    assert re.search(rf"^best +{exp}-00000 final=5 ", shown, re.M), shown
