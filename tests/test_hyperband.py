"""NNI's advisors, Hyperband and BOHB, as the loop drives them: budgets, rounds, brackets, replay, the model.

The budgets are checked against NNI 3.0's own Hyperband advisor, driven the way
NNI's manager drives it (tools/nni_venv.sh's nni), one trial at a time.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Dict, List, Tuple

import pytest

from trialkit.control.searchspace import parse_space
from trialkit.control.tuners import build_tuner, check_tuner
from trialkit.control.tuners.hyperband import BUDGET, bracket_rounds
from trialkit.errors import UserError
from test_nni_compat import nni_python  # noqa: F401 - the fixture: the real nni 3.0's python

LINE = parse_space({"x": {"_type": "uniform", "_value": [0, 1]}})
PLANE = parse_space({"x": {"_type": "uniform", "_value": [-5, 5]}, "y": {"_type": "uniform", "_value": [-5, 5]}})

# NNI's Hyperband advisor asked for one trial at a time, each reporting its final result before it ends (as
# NNI's manager would pass them); prints the (parameter id, TRIAL_BUDGET) it hands out. A configuration's result
# is a function of its number (the n-th new one), so both advisors rank the same configurations alike.
NNI_HYPERBAND = """
import json, sys
import nni
from nni.algorithms.hpo.hyperband_advisor import Hyperband
from nni.runtime.tuner_command_channel import CommandType

def score(n):
    return (n * 37) % 101

R, eta, mode, count = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
advisor = Hyperband(optimize_mode="maximize", R=R, eta=eta, exec_mode=mode)
advisor.is_created_in_previous_exp = lambda parameter_id: False  # NNI 3.0 compares its str ids with an int here
sent = []
advisor.send = lambda command, data: sent.append((command, data))
advisor.handle_initialize({"x": {"_type": "uniform", "_value": [0, 1]}})
out = []
for job_id in range(count):
    before = len(sent)
    advisor.handle_request_trial_jobs(1)
    job = [nni.load(data) for command, data in sent[before:] if command == CommandType.NewTrialJob][0]
    out.append([job["parameter_id"], job["parameters"]["TRIAL_BUDGET"]])
    metric = {"parameter_id": job["parameter_id"], "trial_job_id": str(job_id), "type": "FINAL", "sequence": 0,
              "value": nni.dump(score(int(job["parameter_id"].rsplit("_", 1)[1])))}
    advisor.handle_report_metric_data(metric)
    advisor.handle_trial_end({"trial_job_id": str(job_id), "event": "SUCCEEDED", "hyper_params": nni.dump(job)})
print(json.dumps(out))
"""


def serially(tuner, count: int, objective=lambda p: p["x"]) -> List[Tuple[int, Dict]]:
    """`count` trials one at a time, each told its result before the next ask."""
    asked = []
    for _ in range(count):
        pid, params = tuner.ask()
        asked.append((pid, params))
        tuner.tell(pid, objective(params))
    return asked


@pytest.mark.parametrize("r, eta, mode, count", [(27, 3, "parallelism", 80), (100, 3, "serial", 180),
                                                 (16, 2, "parallelism", 70), (60, 4, "serial", 40)])
def test_budgets_and_promotions_are_what_nnis_own_hyperband_hands_out(tmp_path, nni_python, r, eta, mode, count):
    script = tmp_path / "nni_hyperband.py"
    script.write_text(NNI_HYPERBAND)
    done = subprocess.run([nni_python, str(script), str(r), str(eta), mode, str(count)], capture_output=True,
                          text=True, timeout=120, env={"NNI_TUNER_COMMAND_CHANNEL": "ws://_unittest_", "PATH": "/usr/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    nni = json.loads(done.stdout)  # [["<hb>-<s>_<round>_<config>", budget], ...]
    tuner = build_tuner("Hyperband", {"R": r, "eta": eta, "exec_mode": mode}, LINE, 0)
    numbers: Dict[str, int] = {}
    ours = serially(tuner, count, lambda p: (numbers.setdefault(p["x"], len(numbers)) * 37) % 101)
    assert [params[BUDGET] for _, params in ours] == [budget for _, budget in nni]
    # The same trials go on: NNI's id keeps its configuration's number through the rounds; here the
    # configuration itself goes on. Their positions (the n-th new configuration) match.
    nni_configs = [pid.rsplit("_", 1)[1] for pid, _ in nni]
    our_configs = [json.dumps({k: v for k, v in params.items() if k != BUDGET}) for _, params in ours]
    assert _first_seen_order(nni_configs) == _first_seen_order(our_configs)


def _first_seen_order(configs: List[str]) -> List[int]:
    """Each trial's configuration as the index of its first appearance."""
    first: Dict[str, int] = {}
    return [first.setdefault(config, len(first)) for config in configs]


def test_a_round_sends_on_its_best_by_final_result_else_latest_intermediate_and_none_without_either():
    tuner = build_tuner("Hyperband", {"R": 9, "eta": 3, "optimize_mode": "minimize"}, LINE, 1)
    first_round = [tuner.ask() for _ in range(9)]
    assert [p[BUDGET] for _, p in first_round] == [1] * 9 and all(tuner.slot(pid) == (0, 0) for pid, _ in first_round)
    values = {}
    for i, (pid, params) in enumerate(first_round):
        if i == 0:
            tuner.tell_intermediate(pid, -5.0)  # failed after reporting: ranked by its latest intermediate result
            tuner.tell_intermediate(pid, -1.0)
            tuner.tell_failed(pid)
            values[pid] = -1.0
        elif i == 1:
            tuner.tell_failed(pid)  # no result at all: goes on from no round
        else:
            values[pid] = params["x"]
            tuner.tell_intermediate(pid, -100.0)  # the final result wins over any intermediate one
            tuner.tell(pid, params["x"])
    # The round ended: its best three go on (before a new bracket opens), on budget 3.
    promoted = [tuner.ask() for _ in range(3)]
    best = sorted(values, key=values.get)[:3]  # minimize
    assert best[0] == first_round[0][0]
    assert [json.dumps({k: v for k, v in p.items() if k != BUDGET}) for _, p in promoted] == \
        [json.dumps({k: v for k, v in dict(first_round)[pid].items() if k != BUDGET}) for pid in best]
    assert [p[BUDGET] for _, p in promoted] == [3, 3, 3] and {tuner.slot(pid) for pid, _ in promoted} == {(0, 1)}


def test_parallelism_opens_the_next_bracket_while_a_round_runs_and_serial_waits_for_the_last_round():
    for mode, expected in (("parallelism", (1, 0)), ("serial", None)):
        tuner = build_tuner("Hyperband", {"R": 9, "eta": 3, "exec_mode": mode}, LINE, 2)
        for _ in range(9):
            tuner.ask()  # bracket 0's first round, all running
        asked = tuner.ask()
        if expected is None:
            assert asked is None and tuner.waiting
        else:
            assert tuner.slot(asked[0]) == expected and asked[1][BUDGET] == 3


def test_serial_starts_the_next_bracket_once_the_last_round_is_out_not_ended():
    tuner = build_tuner("Hyperband", {"R": 9, "eta": 3, "exec_mode": "serial"}, LINE, 3)
    for _ in range(9 + 3):  # rounds 0 and 1 of bracket 0, each told
        pid, params = tuner.ask()
        tuner.tell(pid, params["x"])
    last = tuner.ask()
    assert tuner.slot(last[0]) == (0, 2) and last[1][BUDGET] == 9
    following = tuner.ask()  # NNI's serial mode: the bracket is complete once its last round was handed out
    assert tuner.slot(following[0]) == (1, 0)


def test_an_interrupted_bracket_goes_on_where_it_was():
    uninterrupted = build_tuner("Hyperband", {"R": 27, "eta": 3}, PLANE, 4)
    history = []
    for pid, params in (uninterrupted.ask() for _ in range(33)):
        history.append((pid, params, None))
    for pid, params, _ in history[:30]:  # 27 of round 0 and 3 of bracket 1 ended; the last three run on
        uninterrupted.tell(pid, -params["x"] ** 2)
    resumed = build_tuner("Hyperband", {"R": 27, "eta": 3}, PLANE, 4)
    resumed.replay([(pid, params, -params["x"] ** 2 if pid < 30 else None) for pid, params, _ in history])
    assert [resumed.slot(pid) for pid, _, _ in history] == [uninterrupted.slot(pid) for pid, _, _ in history]
    for _ in range(40):
        expected, got = uninterrupted.ask(), resumed.ask()
        assert got == expected
        uninterrupted.tell(expected[0], -expected[1]["x"] ** 2)
        resumed.tell(got[0], -got[1]["x"] ** 2)
    # The configurations that went on start from their round before's checkpoint, as uninterrupted ones would.
    went_on = [pid for pid in range(73) if uninterrupted.slot(pid)[1] > 0]
    assert went_on and [resumed.continues_from(pid) for pid in went_on] == \
        [uninterrupted.continues_from(pid) for pid in went_on]
    assert all(uninterrupted.slot(uninterrupted.continues_from(pid)) == (uninterrupted.slot(pid)[0],
                                                                          uninterrupted.slot(pid)[1] - 1)
               for pid in went_on)
    assert [uninterrupted.continues_from(pid) for pid in range(27)] == [None] * 27


def test_a_small_space_runs_out_of_new_configurations_while_its_rounds_go_on():
    space = parse_space({"a": {"_type": "choice", "_value": [1, 2, 3]}, "b": {"_type": "choice", "_value": [0, 1]}})
    tuner = build_tuner("Hyperband", {"R": 9, "eta": 3}, space, 5)
    asked = []
    while (got := tuner.ask()) is not None:
        asked.append(got)
        tuner.tell(got[0], got[1]["a"] + got[1]["b"])
    first_round = [p for pid, p in asked if tuner.slot(pid)[1] == 0]
    points = [json.dumps({k: v for k, v in p.items() if k != BUDGET}, sort_keys=True) for p in first_round]
    assert len(points) == len(set(points)) == 6 and not tuner.waiting  # each configuration once, then the end
    # The first bracket (9 wanted) took all six; its best three went on to budget 3, the best of them to 9.
    assert [(p[BUDGET], p["a"] + p["b"]) for pid, p in asked if tuner.slot(pid)[0] == 0 and tuner.slot(pid)[1] > 0] \
        == [(3, 4), (3, 3), (3, 3), (9, 4)]
    assert tuner.points_tried == 6


def test_nnis_class_args_are_checked_and_defaulted():
    assert check_tuner("Hyperband", None, LINE) == ("Hyperband", {"optimize_mode": "maximize"})
    tuner = build_tuner("hyperband", None, LINE, 0)
    assert (tuner.max_budget, tuner.eta, tuner.exec_mode) == (60, 3, "parallelism")  # NNI's defaults
    for args, where, words in [({"R": 0}, "R", "too small"), ({"eta": 1}, "eta", "too small"),
                               ({"exec_mode": "parallel"}, "exec_mode", "did you mean 'parallelism'"),
                               ({"etta": 3}, "etta", "did you mean 'eta'"),
                               ({"r": 9}, "r", "did you mean 'R'")]:  # NNI's Hyperband rejects r too
        with pytest.raises(UserError) as err:
            check_tuner("Hyperband", args, LINE)
        assert err.value.where == f"tuner.classArgs.{where}" and words in err.value.line()


# ---------------------------------------------------------------- BOHB


def test_bohb_runs_nnis_brackets_one_at_a_time():
    """NNI's BOHB docs: max_budget 9, min_budget 1, eta 3 cycles s = 2, 1, 0, 2, ...; a bracket starts once the
    one before ended."""
    tuner = build_tuner("BOHB", {"min_budget": 1, "max_budget": 9, "eta": 3}, LINE, 6)
    assert [bracket_rounds(s, 2, 3, 9) for s in (2, 1, 0)] == [[(9, 1), (3, 3), (1, 9)], [(5, 3), (1, 9)], [(3, 9)]]
    budgets = [p[BUDGET] for _, p in serially(tuner, 9 + 3 + 1 + 5 + 1 + 3 + 9)]
    assert budgets == [1] * 9 + [3] * 3 + [9] + [3] * 5 + [9] + [9] * 3 + [1] * 9
    second = [tuner.ask() for _ in range(3)]  # the fourth bracket's second round, running
    assert [p[BUDGET] for _, p in second] == [3, 3, 3] and tuner.ask() is None and tuner.waiting
    for pid, params in second:
        tuner.tell(pid, params["x"])
    last = tuner.ask()
    assert last[1][BUDGET] == 9
    # Hyperband's serial mode would open the next bracket now that the last round is out; BOHB waits for it to end.
    assert tuner.ask() is None and tuner.waiting
    tuner.tell(last[0], last[1]["x"])
    assert tuner.ask()[1][BUDGET] == 3  # s = 1: five configurations on budget 3
    with pytest.raises(UserError) as err:
        check_tuner("BOHB", {"min_budget": 9, "max_budget": 9}, LINE)
    assert err.value.where == "tuner.classArgs.min_budget"


def bowl(params):
    return (params["x"] - 1.5) ** 2 + (params["y"] + 2) ** 2


def test_bohbs_model_closes_in_on_the_best_configurations():
    """On the bowl (the same on every budget), configurations the model draws (from the third bracket on)
    beat the random ones of the first bracket, and beat Hyperband's random ones drawn meanwhile."""
    gains = []
    for seed in range(3):
        args = {"min_budget": 1, "max_budget": 9, "eta": 3, "optimize_mode": "minimize", "random_fraction": 0.0}
        bohb = build_tuner("BOHB", args, PLANE, seed)
        hyperband = build_tuner("Hyperband", {"R": 9, "eta": 3, "optimize_mode": "minimize"}, PLANE, seed)
        drawn = {}
        for name, tuner in (("BOHB", bohb), ("Hyperband", hyperband)):
            trials = serially(tuner, 80, bowl)
            drawn[name] = [bowl(p) for pid, p in trials if tuner.slot(pid)[1] == 0 and tuner.slot(pid)[0] >= 3]
        gains.append(statistics.mean(drawn["Hyperband"]) / statistics.mean(drawn["BOHB"]))
    assert min(gains) > 2, gains


def test_bohbs_class_args_reach_its_model():
    space = PLANE
    tuner = build_tuner("BOHB", {"min_budget": 1, "max_budget": 9, "top_n_percent": 30, "num_samples": 8,
                                 "random_fraction": 1.0, "bandwidth_factor": 2.0, "min_bandwidth": 0.01,
                                 "min_points_in_model": 5}, space, 0)
    assert tuple(tuner.settings) == (5, 30, 8, 1.0, 2.0, 0.01)
    assert build_tuner("BOHB", {"min_points_in_model": 1}, space, 0).settings.min_points_in_model == 3  # dims + 1
    with pytest.raises(UserError) as err:
        check_tuner("BOHB", {"config_space": "/tmp/space.pcs"}, space)
    assert "not read by trialkit" in err.value.line()
    nested = parse_space({"layer": {"_type": "choice", "_value": [{"_name": "conv", "k": {"_type": "choice",
                                                                                             "_value": [3, 5]}}]}})
    with pytest.raises(UserError) as err:
        check_tuner("BOHB", None, nested)
    assert err.value.where == "searchSpace.layer" and "use Hyperband" in err.value.line()


def test_bohb_with_random_fraction_one_draws_as_hyperband_does():
    """random_fraction 1: every configuration from the space, none from the model (the same draws as Hyperband's
    serial schedule would make for the same proposal)."""
    tuner = build_tuner("BOHB", {"min_budget": 1, "max_budget": 9, "random_fraction": 1.0}, PLANE, 9)
    trials = serially(tuner, 60, lambda p: -bowl(p))
    later = [p for pid, p in trials if tuner.slot(pid)[0] >= 3 and tuner.slot(pid)[1] == 0]
    assert later and statistics.mean(bowl(p) for p in later) > 10  # the bowl's mean over the square is about 20


def test_bohb_learns_imported_results_as_nnis_and_hyperband_ignores_them_as_nnis():
    """`trialkit experiment import`: NNI's BOHB feeds its model (on the result's TRIAL_BUDGET, else max_budget);
    NNI's Hyperband does nothing with them."""
    grid = [{"x": x / 2, "y": y / 2} for x in range(-10, 11, 2) for y in range(-10, 11, 2)]  # 121 points
    args = {"min_budget": 1, "max_budget": 9, "optimize_mode": "minimize", "random_fraction": 0.0}
    taught = build_tuner("BOHB", args, PLANE, 3)
    taught.import_results([(p, bowl(p)) for p in grid])
    cold = build_tuner("BOHB", args, PLANE, 3)
    first = {name: [bowl(tuner.ask()[1]) for _ in range(9)] for name, tuner in (("taught", taught), ("cold", cold))}
    assert statistics.mean(first["taught"]) < statistics.mean(first["cold"]) / 4, first
    hyperband = build_tuner("Hyperband", {"R": 9}, PLANE, 3)
    hyperband.import_results([(p, bowl(p)) for p in grid])
    plain = build_tuner("Hyperband", {"R": 9}, PLANE, 3)
    assert [hyperband.ask() for _ in range(3)] == [plain.ask() for _ in range(3)]


def test_bohbs_model_of_a_choice_whose_good_points_share_one_level_draws_without_numpys_warnings():
    """statsmodels' kernel for a choice divides by the levels it saw less one: good points that all chose one
    level make infinite densities, which BOHB handles as NNI's does. numpy's warnings about them went to the
    run's terminal, over its progress line (a new user saw them on NNI's own config_bohb.yml)."""
    import warnings

    space = parse_space({"c": {"_type": "choice", "_value": [0, 1, 2]}, "x": {"_type": "uniform", "_value": [0, 1]}})
    args = {"min_budget": 1, "max_budget": 9, "eta": 3, "optimize_mode": "minimize", "random_fraction": 0.0}
    tuner = build_tuner("BOHB", args, space, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning anywhere in the model fails the test
        trials = serially(tuner, 60, lambda p: p["x"] + 10 * (p["c"] != 0))
    drawn = [p for pid, p in trials if tuner.slot(pid)[0] >= 3 and tuner.slot(pid)[1] == 0]
    assert drawn and sum(p["c"] == 0 for p in drawn) > len(drawn) / 2, drawn  # the model drew, toward c = 0


LIBRARIES_PROBE = """
import sys
from trialkit.control.pick import Picker
from trialkit.control.searchspace import parse_space
from trialkit.control.tuners import build_tuner
space = parse_space({"x": {"_type": "uniform", "_value": [0, 1]}, "y": {"_type": "uniform", "_value": [0, 1]}})
tuner = build_tuner("BOHB", {"min_budget": 1, "max_budget": 9}, space, 0)
if sys.argv[1] == "ask":
    tuner.ask()  # the first bracket's first configuration: no model yet
else:
    Picker(tuner, lambda: None).close()  # a run's start and end, as the loop makes them
print(" ".join(name for name in ("scipy.stats", "statsmodels.nonparametric.kernel_density") if name in sys.modules))
"""


def test_bohbs_first_bracket_waits_for_no_model_library_and_a_run_loads_them_meanwhile():
    """scipy and statsmodels take a second or two to import (at load, longer): BOHB's first bracket has no model,
    so its first trials start without them; a run (the loop's Picker) imports them on a thread of its own
    meanwhile, and its end waits for that thread. Before, the first proposal imported them, and every slot
    waited; each in a fresh interpreter, where nothing imported them yet."""
    def imported(mode: str) -> List[str]:
        done = subprocess.run([sys.executable, "-c", LIBRARIES_PROBE, mode], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert imported("ask") == []
    assert imported("run") == ["scipy.stats", "statsmodels.nonparametric.kernel_density"]
