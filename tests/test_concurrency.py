"""trialConcurrency as NNI users mean it, and what a pool that holds trials back says.

With no pools.yml an experiment runs its trialConcurrency trials at once, whatever the machine's CPUs (this
one has 2); a cap comes only from a declared pool, and then the start line and the progress line say so,
never counting a waiting trial as running.
"""
from __future__ import annotations

import re
import signal
from pathlib import Path

from experiment_util import TIMEOUT, cli, experiment, experiment_id, start_cli
from harness import wait_until
from pools_util import GATED, home, pool_of  # noqa: F401 (home: a fixture)

SPACE = {"x": {"_type": "choice", "_value": [1, 2, 3, 4, 5, 6]}}


def gated(tmp_path: Path, **keys) -> Path:
    log, gate = tmp_path / "starts", tmp_path / "gate"
    return experiment(tmp_path, SPACE, GATED.format(log=str(log), name="a", gate=str(gate)), trialConcurrency=4,
                      tuner={"name": "GridSearch"}, **keys)


def started(tmp_path: Path) -> int:
    log = tmp_path / "starts"
    return log.read_text().count("start ") if log.exists() else 0


def stop(proc, tmp_path: Path) -> None:
    """After a failure: the trials let through, the experiment stopped as Ctrl-C stops it."""
    (tmp_path / "gate").touch()
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=TIMEOUT)


def test_with_no_pools_file_trial_concurrency_4_runs_4_trials_at_once(tmp_path, home):
    proc = start_cli("run", gated(tmp_path, maxTrialNumber=4))
    try:
        wait_until(lambda: started(tmp_path) == 4, TIMEOUT, "4 trials to run at once")
        (tmp_path / "gate").touch()
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        stop(proc, tmp_path)
    assert proc.returncode == 0, err
    assert "note: pool" not in out  # nothing holds a trial back: nothing to say
    assert "waiting" not in out


def test_a_declared_pool_that_holds_trials_back_says_so_and_they_count_as_waiting(tmp_path, home):
    pool_of(home, 2)
    proc = start_cli("run", gated(tmp_path, maxTrialNumber=6))
    try:
        head = [proc.stdout.readline().rstrip("\n") for _ in range(4)]  # started, manager, page, note
        exp = experiment_id(head[0])
        wait_until(lambda: started(tmp_path) == 2, TIMEOUT, "2 trials to run")
        held = f"{exp}-00002"
        wait_until(lambda: "waiting for 1 slot of pool default" in cli("trial", "list", exp).stdout,
                   TIMEOUT, f"{held} to wait for its slot")
        (tmp_path / "gate").touch()
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        stop(proc, tmp_path)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert (f"note: pool default has 2 slots and each trial takes 1: at most 2 of the 4 trials trialConcurrency "
            f"asks for run at once ({home / 'pools.yml'} sets its slots)") in head, head
    progress = [line for line in lines if " ended: " in line and line.startswith("trial ")]
    running = [int(re.search(r"(\d+) running", line).group(1)) for line in progress]
    assert running and max(running) <= 2, progress  # never a waiting trial counted as running
    assert any(re.search(r"\d+ running, \d+ waiting \(for 1 slot of pool default: \d of 2 free\)", line)
               for line in progress), progress


def test_one_priority_per_experiment_two_different_ones_are_refused(tmp_path, home):
    config = gated(tmp_path, maxTrialNumber=1, priority=1, trainingService={"platform": "local", "poolPriority": 5})
    done = cli("run", config)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "priority 1 and trainingService.poolPriority 5 differ" in done.stderr


def test_every_help_text_says_smaller_priority_first():
    done = cli("job", "update", "--help")
    assert "higher starts first" not in done.stdout and "smaller starts first" in done.stdout
    assert "--resource-pool" in cli("job", "list", "--help").stdout


def test_a_determined_configs_pool_note_names_the_key_its_user_wrote(tmp_path, home):
    # Its user wrote searcher.max_concurrent_trials; trialConcurrency is trialkit's name for it (left12's finding).
    pool_of(home, 2)
    context = tmp_path / "context"
    context.mkdir()
    (context / "trial.py").write_text(GATED.format(log=str(tmp_path / "starts"), name="a", gate=str(tmp_path / "gate")))
    (context / "exp.yaml").write_text("name: held\nentrypoint: python3 trial.py\n"
                                      "hyperparameters: {x: {type: categorical, vals: [1, 2, 3, 4]}}\n"
                                      "searcher: {name: grid, metric: x, max_length: 1, max_concurrent_trials: 4}\n")
    proc = start_cli("run", context / "exp.yaml", context)
    try:
        head = [proc.stdout.readline().rstrip("\n") for _ in range(4)]  # started, manager, page, note
    finally:
        stop(proc, tmp_path)
    assert (f"note: pool default has 2 slots and each trial takes 1: at most 2 of the 4 trials "
            f"searcher.max_concurrent_trials asks for run at once ({home / 'pools.yml'} sets its slots)") in head, head
