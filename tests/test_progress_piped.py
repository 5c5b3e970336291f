"""Piped, `trialkit run` prints a line at each trial's end; its running count is the loop's once it has acted on that
end, so a trial replaced at once is no dip: with two at a time and more to come, the line says "2 running", not
"1 running" printed in the milliseconds before the replacement started (a user read that as the experiment
slowing down). A real run, its stdout a pipe.
"""
from __future__ import annotations

import pytest

from experiment_util import experiment, start_cli

pytestmark = pytest.mark.usefixtures("home")

SCRIPT = """
import time, trialkit
time.sleep(0.2)
trialkit.report_final_result(trialkit.get_next_parameter()["x"])
"""


def test_a_trial_replaced_at_its_end_leaves_the_running_count_as_it_was(tmp_path):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [0, 1, 2, 3, 4, 5]}}, SCRIPT,
                        trialConcurrency=2, maxTrialNumber=6,
                        tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "maximize"}})
    proc = start_cli("run", config)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    ends = [line for line in out.splitlines() if line.startswith("trial ") and " SUCCEEDED " in line]
    assert len(ends) == 6, out
    for count, line in enumerate(ends, 1):
        assert f"] {count} of 6 ended: {count} done, " in line, line  # each end's own count of ended trials
    # Each of the first four ends was replaced by a trial not yet started: two ran on.
    assert all(", 2 running, " in line for line in ends[:4]), "\n".join(ends)
    assert ", 0 running, " in ends[-1], ends[-1]
