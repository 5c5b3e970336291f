"""`experiment list`'s trials cell counts what is there, not only what succeeded (a stopped experiment whose trial
is paused said `1 (0 succeeded)`), and `experiment show` of a STOPPED experiment names, last, the `experiment
resume` that takes it up again. A real run: its one trial paused (`trial pause`), then the experiment stopped.
"""
from __future__ import annotations

import signal

import pytest

from experiment_util import cli, experiment, experiment_id, reported, start_cli, trial_status
from harness import signal_and_wait, wait_until
from test_faces import SLOW

pytestmark = pytest.mark.usefixtures("home")  # conftest's: TRIALKIT_HOME in the test's tmp_path


def test_a_stopped_experiment_lists_its_paused_trial_and_show_names_its_resume(tmp_path, home):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, SLOW, maxTrialNumber=1)
    run = start_cli("run", config)
    try:
        exp = experiment_id(run.stdout.readline())
        trial = f"{exp}-00000"
        wait_until(lambda: reported(home, trial) >= 1, 120, "the trial's first result")
        assert cli("trial", "pause", trial).returncode == 0
        wait_until(lambda: trial_status(home, trial) == "PREEMPTED", 120, "the trial paused")
        assert cli("experiment", "stop", exp).returncode == 0
        run.communicate(timeout=60)
    finally:
        if run.poll() is None:  # a failed assertion: Ctrl-C, so that its keeper and trial end with it
            signal_and_wait(run, signal.SIGINT, 60)

    listed = cli("experiment", "list")
    assert listed.returncode == 0, listed.stderr
    header, _, line = listed.stdout.splitlines()
    cell = lambda name, after: line[header.index(name):header.index(after)].rstrip()  # noqa: E731 (no name: blank)
    assert (cell("status", "trials"), cell("trials", "created")) == ("STOPPED", "1 (1 paused)"), listed.stdout
    shown = cli("experiment", "show", exp)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == f"stopped: `trialkit experiment resume {exp}` takes it up again"


def test_every_status_counts_in_the_list_so_a_lone_canceled_trial_is_not_a_bare_count(home):
    from trialkit.manager.store import Store
    from trialkit.statuses import FINAL_STATUSES, RUNNING, USER_CANCELED, WAITING

    statuses = {"canceled": [USER_CANCELED], "every": sorted(FINAL_STATUSES | {RUNNING, WAITING})}
    for experiment_id, made in statuses.items():
        store = Store.in_dir(home / "experiments" / experiment_id)
        store.create_experiment(experiment_id, config={})
        for sequence, status in enumerate(made):
            store.add_trial(experiment_id, f"{experiment_id}-{sequence:05d}", sequence=sequence, parameters={},
                            token=None, status=status)
        store.close()
    listed = cli("experiment", "list")
    assert listed.returncode == 0, listed.stderr
    cells = {line.split()[0]: line for line in listed.stdout.splitlines()[2:]}
    assert " 1 (1 canceled) " in cells["canceled"], listed.stdout
    counted = cells["every"].split(" (", 1)[1].split(")")[0].split(", ")
    assert len(counted) == len(statuses["every"]) and all(part.startswith("1 ") for part in counted), listed.stdout
