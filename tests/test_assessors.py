"""Assessors: Medianstop as NNI's (with a true median), and optuna's pruners."""
from __future__ import annotations

import pytest

from trialkit.control.assessors import build_assessor, check_assessor
from trialkit.control.config import parse_config
from trialkit.errors import UserError


def medianstop(**args):
    assessor = build_assessor("Medianstop", args)
    # Two finished trials: running averages [1, 1.5, 2] and [3, 3.5, 4].
    assessor.should_stop("a", [1, 2, 3])
    assessor.trial_end("a", succeeded=True)
    assessor.should_stop("b", [3, 4, 5])
    assessor.trial_end("b", succeeded=True)
    return assessor


def test_medianstop_stops_a_trial_below_the_median_and_keeps_a_good_one():
    assessor = medianstop(optimize_mode="maximize")
    # median of [1.5, 3.5] at step 2 is 2.5
    assert assessor.should_stop("bad", [0.5, 1.0]) is True
    assert assessor.should_stop("good", [4.0, 4.0]) is False


def test_medianstop_uses_the_true_median_of_an_even_count():
    # NNI's code took the lower middle (1.5) here, which would keep this trial.
    assert medianstop().should_stop("c", [2.0, 2.0]) is True


def test_medianstop_judges_the_running_average_not_the_latest_value():
    assessor = medianstop()
    # latest 4.0 beats the median 2.5, but the average (2.0) does not
    assert assessor.should_stop("late", [0.0, 4.0]) is True
    assert assessor.should_stop("steady", [2.5, 2.5]) is False  # equal is not worse


def test_medianstop_compares_at_the_same_step_only():
    assessor = medianstop()
    # no finished trial reached step 4: nothing to compare with
    assert assessor.should_stop("long", [0, 0, 0, 0]) is False


def test_medianstop_minimize_turns_it_round():
    assessor = medianstop(optimize_mode="minimize")
    assert assessor.should_stop("high", [4.0, 4.0]) is True
    assert assessor.should_stop("low", [0.5, 1.0]) is False


def test_medianstop_waits_for_start_step_and_for_finished_trials():
    assert medianstop(start_step=3).should_stop("bad", [0.0, 0.0]) is False
    assert medianstop(start_step=3).should_stop("bad", [0.0, 0.0, 0.0]) is True
    fresh = build_assessor("Medianstop", {})
    assert fresh.should_stop("first", [0.0]) is False


def test_medianstop_ignores_failed_and_stopped_trials():
    assessor = build_assessor("Medianstop", {})
    assessor.should_stop("crashed", [100, 100])
    assessor.trial_end("crashed", succeeded=False)
    assert assessor.should_stop("x", [1, 1]) is False  # nothing completed yet
    assessor.should_stop("ok", [2, 2])
    assessor.trial_end("ok", succeeded=True)
    assert assessor.should_stop("x", [1, 1]) is True


def test_medianstop_resumes_from_stored_results():
    assessor = build_assessor("Medianstop", {})
    assessor.trial_end("a", True, [1, 2, 3])
    assessor.trial_end("b", True, [3, 4, 5])
    assert assessor.should_stop("bad", [0.5, 1.0]) is True
    assert assessor.should_stop("good", [4.0, 4.0]) is False


def test_pruner_median_stops_a_bad_trial_and_keeps_a_good_one():
    assessor = build_assessor("Pruner", {"pruner": "median", "n_startup_trials": 2, "optimize_mode": "maximize"})
    for i, curve in enumerate([[0.5, 0.6, 0.7], [0.6, 0.7, 0.8], [0.55, 0.65, 0.75]]):
        for step in range(1, 4):
            assert assessor.should_stop(f"t{i}", curve[:step]) is False
        assessor.trial_end(f"t{i}", succeeded=True)
    assert assessor.should_stop("good", [0.9, 0.95]) is False
    assert assessor.should_stop("bad", [0.1, 0.1]) is True
    assessor.trial_end("bad", succeeded=False)  # recorded as pruned, not failed
    assert [t.state.name for t in assessor._study.trials][-1] == "PRUNED"


def finished(assessor, curves):
    """Trials t0, t1, ... that reported these curves step by step and succeeded."""
    for i, curve in enumerate(curves):
        for step in range(1, len(curve) + 1):
            assessor.should_stop(f"t{i}", curve[:step])
        assessor.trial_end(f"t{i}", succeeded=True)
    return assessor


@pytest.mark.parametrize("percentile, stops_06", [(25, True), (50, False)])
def test_pruner_percentile_keeps_the_given_top_share(percentile, stops_06):
    # Maximizing, percentile 25 keeps the best quarter: at step 1 of five finished trials
    # [0.1, 0.3, 0.5, 0.7, 0.9] that is above 0.7 (their 75th percentile); percentile 50 keeps above 0.5.
    assessor = finished(build_assessor("pruner", {"pruner": "percentile", "percentile": percentile,
                                                  "n_startup_trials": 5}),
                        [[0.1, 0.1], [0.3, 0.3], [0.5, 0.5], [0.7, 0.7], [0.9, 0.9]])
    assert assessor.should_stop("low", [0.2]) is True
    assert assessor.should_stop("between", [0.6]) is stops_06
    assert assessor.should_stop("high", [0.8]) is False


@pytest.mark.parametrize("reduction_factor, stops_06", [(2, False), (4, True)])
def test_pruner_successive_halving_promotes_the_top_one_in_reduction_factor(reduction_factor, stops_06):
    # Rung 0 is step 1. There a 0.6 is second of five (the finished [0.9, 0.5, 0.1], the stopped 0.2 and
    # itself): factor 2 promotes the best 5 // 2 (it stays), factor 4 only the best (it stops).
    assessor = finished(build_assessor("Pruner", {"pruner": "SuccessiveHalving", "min_resource": 1,
                                                  "reduction_factor": reduction_factor}),
                        [[0.9], [0.5], [0.1]])
    assert assessor.should_stop("low", [0.2]) is True
    assert assessor.should_stop("between", [0.6]) is stops_06
    assert assessor.should_stop("high", [0.95]) is False


@pytest.mark.parametrize(
    "name, args, where, words",
    [
        ("Medianstpo", {}, "assessor.name", "did you mean 'Medianstop'"),
        ("Curvefitting", {"gap": 0}, "assessor.classArgs.gap", "too small"),
        ("Medianstop", {"start_step": -1}, "assessor.classArgs.start_step", "too small"),
        ("Medianstop", {"optimize_mode": "up"}, "assessor.classArgs.optimize_mode", "unknown value"),
        ("Medianstop", {"start_step": 1, "startStep": 2}, "assessor.classArgs.startStep", "given twice"),
        ("Pruner", {"pruner": "medain"}, "assessor.classArgs.pruner", "did you mean 'median'"),
        ("Pruner", {"n_startup_trial": 2}, "assessor.classArgs.n_startup_trial", "did you mean 'n_startup_trials'"),
        ("Pruner", {"pruner": "percentile"}, "assessor.classArgs", "PercentilePruner"),
        ("Pruner", {"pruner": "percentile", "percentile": 150}, "assessor.classArgs", "PercentilePruner"),
    ],
)
def test_bad_assessor_configs_are_one_line_errors(name, args, where, words):
    with pytest.raises(UserError) as err:
        check_assessor(name, args)
    assert err.value.where == where
    assert words in err.value.line() and "\n" not in err.value.line()


def test_curvefitting_takes_nnis_optimize_mode_as_nni_does():
    """NNI's docs give Curvefitting `optimize_mode` with its other classArgs, and NNI's validator takes it."""
    nni_args = {"epoch_num": 20, "optimize_mode": "minimize", "start_step": 6, "threshold": 0.95, "gap": 1}
    name, args = check_assessor("Curvefitting", nni_args)
    assert (name, args) == ("Curvefitting", nni_args)
    assert build_assessor("Curvefitting", nni_args).optimize_mode == "minimize"
    config = parse_config({"searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}}, "trialCommand": "true",
                           "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "minimize"}},
                           "assessor": {"name": "Curvefitting", "classArgs": nni_args}}, ".")
    assert config.assessor.class_args["optimize_mode"] == "minimize"
    with pytest.raises(UserError) as err:
        check_assessor("Curvefitting", {"optimize_mode": "upward"})
    assert err.value.where == "assessor.classArgs.optimize_mode"
