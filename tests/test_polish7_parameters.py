"""The parameters `trial list`, `experiment show` and the end of `trialkit run` show: whole (Hyperband's
TRIAL_BUDGET, the last of them, is what its users look for: a cut one says nothing), and not the paths NNI's
PBTTuner hands each trial (`load_checkpoint_dir`, `save_checkpoint_dir`: long, and noise beside the search
space's values), as the page and the plot leave them out (results.shown_parameters). Real runs, piped.
"""
from __future__ import annotations

import pytest

from experiment_util import cli, experiment, experiment_id

pytestmark = pytest.mark.usefixtures("home")

# Names long enough that the parameters text passes the 80 characters the table cut it to.
LONG = {"learning_rate_of_the_optimizer": {"_type": "choice", "_value": [0.001]},
        "dropout_probability_of_the_head": {"_type": "choice", "_value": [0.25]}}
REPORTS = "import trialkit\np = trialkit.get_next_parameter()\ntrialkit.report_final_result(1.0)\n"
# A PBT step as users write them: its model saved into the dir PBT gives (one that saves nothing is warned of, and
# the warning names the dir).
SAVES = ("import os, trialkit\np = trialkit.get_next_parameter()\nos.makedirs(p['save_checkpoint_dir'], exist_ok=True)\n"
         "open(os.path.join(p['save_checkpoint_dir'], 'model'), 'w').write('1')\ntrialkit.report_final_result(1.0)\n")


def test_hyperbands_trial_budget_shows_whole_in_trial_list(tmp_path):
    config = experiment(tmp_path, LONG, REPORTS, maxTrialNumber=1, trialConcurrency=1,
                        tuner={"name": "Hyperband", "classArgs": {"R": 9, "eta": 3}})
    done = cli("run", config)
    assert done.returncode == 0, done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    listed = cli("trial", "list", exp).stdout
    line = next(line for line in listed.splitlines() if line.startswith(f"{exp}-00000"))
    assert "learning_rate_of_the_optimizer=0.001, dropout_probability_of_the_head=0.25, TRIAL_BUDGET=" in line, listed
    assert "…" not in line and line.split("TRIAL_BUDGET=")[1].split()[0].replace(".", "").isdigit(), line
    assert "TRIAL_BUDGET=" in done.stdout.split(f"experiment {exp} ")[-1]  # the end of the run's table too


def test_pbts_checkpoint_paths_are_not_shown(tmp_path):
    config = experiment(tmp_path, LONG, SAVES, maxTrialNumber=2, trialConcurrency=2,
                        tuner={"name": "PBTTuner", "classArgs": {"population_size": 2,
                                                                 "all_checkpoint_dir": str(tmp_path / "ckpt")}})
    done = cli("run", config)
    assert done.returncode == 0, done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    end = next(line for line in done.stdout.splitlines() if line.startswith(f"experiment {exp} DONE after"))
    assert end.endswith("learning_rate_of_the_optimizer=0.001, dropout_probability_of_the_head=0.25)"), end
    assert "checkpoint_dir" not in done.stdout, done.stdout  # nor the progress lines on the way
    given = cli("trial", "show", f"{exp}-00000").stdout
    assert "load_checkpoint_dir" in given  # the trial got them (trial show has them all)
    listed, shown = cli("trial", "list", exp).stdout, cli("experiment", "show", exp).stdout
    best = next(line for line in shown.splitlines() if line.startswith("best"))
    for face in (listed, shown, best, done.stdout.split(f"experiment {exp} ")[-1]):
        assert "checkpoint_dir" not in face and "learning_rate_of_the_optimizer=0.001" in face.replace(
            '"learning_rate_of_the_optimizer":', "learning_rate_of_the_optimizer="), face
