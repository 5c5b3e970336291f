"""adaptdl-ray's sizing decisions, driven by hints in AdaptDL's own format (issue 22).

tests/fixtures/adaptdl_hints/linear_2replicas.json was sent by AdaptDL's unchanged
trainer (examples/adaptdl/train.py, two replicas on this machine) to a supervisor
URL; compute_bound_edited.json is the same with a compute-heavy, noisy-gradient
model's parameters edited in. The speedups come from AdaptDL's adaptdl.goodput.
"""
from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from trialkit.ray.sizing import Demand, Hints, HintsError, Hysteresis, Speedup, plan
from trialkit.ray.supervisor import Supervisor

FIXTURES = Path(__file__).parent / "fixtures" / "adaptdl_hints"


def hints(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def speedup(name: str) -> Speedup:
    return Speedup(Hints.parse(hints(name)))


POOR, SCALES = "linear_2replicas", "compute_bound_edited"


def test_the_model_reads_the_real_trainers_hints():
    poor, scales = speedup(POOR), speedup(SCALES)
    assert poor(1, 1) == scales(1, 1) == 1.0
    assert poor(1, 2) < 1.1, "the tiny linear model is all communication: a second worker barely helps"
    assert scales(1, 2) > 1.8 and scales(1, 4) > 3.5
    assert scales(2, 4) <= scales(1, 4), "across two nodes the network is slower"


def test_a_job_that_scales_poorly_stays_at_one_worker_with_two_available():
    decided = plan([Demand("j", speedup(POOR))], [2])
    assert decided.workers == {"j": 1}
    assert decided.predicted["j"][2] < 1.1


def test_a_job_that_scales_takes_two():
    assert plan([Demand("j", speedup(SCALES))], [2]).workers == {"j": 2}


def test_growth_is_capped_at_twice_what_was_profiled():
    data = hints(SCALES)
    data["maxProfiledReplicas"] = 1
    assert plan([Demand("j", Speedup(Hints.parse(data)))], [8, 8]).workers == {"j": 2}


def test_without_hints_one_worker_or_the_users_pin():
    assert plan([Demand("new", None)], [4]).workers == {"new": 1}
    assert plan([Demand("pinned", None, pinned=3)], [4]).workers == {"pinned": 3}
    decided = plan([Demand("j", speedup(SCALES), max_workers=2)], [8])
    assert decided.workers == {"j": 2}, "-m caps what the model would take"


def test_two_jobs_share_by_goodput_not_by_arrival():
    # Greedy (today's) would give the first job everything it asks for.
    decided = plan([Demand("poor", speedup(POOR)), Demand("scales", speedup(SCALES))], [4])
    assert decided.workers == {"poor": 1, "scales": 3}


def test_a_small_change_of_hints_causes_no_rescale():
    # At 2 workers; the model would now like 3, but a restart costs more than 3 repays here.
    slow_restarts = Hysteresis(restart_seconds=300, horizon_seconds=600)
    job = Demand("j", speedup(SCALES), max_workers=3, current=2)
    assert plan([job], [4]).workers == {"j": 3}  # the default hysteresis: the gain repays it
    decided = plan([job], [4], slow_restarts)
    assert decided.workers == {"j": 2} and "would not repay a restart" in decided.reasons["j"]


def test_drift_around_the_threshold_does_not_shrink_a_job():
    # A model whose fourth worker just fails to earn its place (gain 0.265 < 0.3):
    # a new job gets 3, but a job already at 4 keeps it, since the gain sits inside the band.
    data = hints(SCALES)
    data["perfParams"]["beta_c"], data["gradParams"]["var"] = 0.001, 0.05
    model = Speedup(Hints.parse(data))
    assert 0.24 < model(1, 4) - model(1, 3) < 0.3
    assert plan([Demand("j", model)], [8]).workers == {"j": 3}
    assert plan([Demand("j", model, current=4)], [8]).workers == {"j": 4}
    assert plan([Demand("j", model, current=4)], [8], Hysteresis(band=1.0)).workers == {"j": 3}
    poor = Demand("p", speedup(POOR), current=4)
    assert plan([poor], [4]).workers == {"p": 1}, "workers that barely help are given back"


def test_a_job_kept_large_still_gives_way_when_another_needs_the_workers():
    keep_everything = Hysteresis(band=0.0)
    first = Demand("first", speedup(POOR), current=4)
    second = Demand("second", speedup(SCALES))
    decided = plan([first, second], [4], keep_everything)
    assert decided.workers == {"first": 1, "second": 3}


@pytest.mark.parametrize("change, says", [
    (lambda h: h.pop("perfParams"), "perfParams must hold"),
    (lambda h: h["perfParams"].update(gamma="fast"), "perfParams.gamma must be a finite number"),
    (lambda h: h["perfParams"].update(beta_c=float("nan")), "perfParams.beta_c must be a finite number"),
    (lambda h: h.update(gradParams=None), "gradParams must hold norm and var"),
    (lambda h: h.update(initBatchSize=0), "initBatchSize must be a whole number"),
    (lambda h: h.update(maxBatchSize=8), "maxBatchSize 8 is below initBatchSize 16"),
    (lambda h: h.update(localBszBounds=[8]), "localBszBounds must be [min, max]"),
])
def test_malformed_hints_are_refused_with_the_reason(change, says):
    data = copy.deepcopy(hints(POOR))
    change(data)
    with pytest.raises(HintsError, match=says.replace("[", r"\[").replace("]", r"\]")):
        Hints.parse(data)


# --- the supervisor's HTTP routes ---------------------------------------------


def request(url: str, method: str = "GET", body: bytes = None, timeout: float = 10):
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.fixture
def supervisor():
    heard = []
    server = Supervisor("127.0.0.1", lambda key, got: heard.append((key, got))).start()
    server.heard = heard
    yield server
    server.close()


def test_hints_reach_the_planner_under_the_trainers_own_key(supervisor):
    status, _ = request(f"{supervisor.url}/hints/exp1/trial7", "PUT", json.dumps(hints(POOR)).encode())
    assert status == 200
    assert [(key, got.init_batch_size) for key, got in supervisor.heard] == [("exp1/trial7", 16)]


def test_a_wrong_secret_and_malformed_hints_are_refused_and_the_supervisor_lives_on(supervisor, capfd):
    wrong = supervisor.url.rsplit("/", 1)[0] + "/not-the-secret"
    assert request(f"{wrong}/hints/exp1/t", "PUT", json.dumps(hints(POOR)).encode())[0] == 403
    assert request(f"{supervisor.url}/hints/exp1/t", "PUT", b"{not json")[0] == 400
    bad = copy.deepcopy(hints(POOR))
    bad["perfParams"]["gamma"] = None
    status, body = request(f"{supervisor.url}/hints/exp1/t", "PUT", json.dumps(bad).encode())
    assert status == 400 and b"perfParams.gamma" in body
    assert supervisor.heard == []
    assert "adaptdl-ray: refused hints for exp1/t: perfParams.gamma must be a finite number" in capfd.readouterr().err
    assert request(f"{supervisor.url}/hints/exp1/t", "PUT", json.dumps(hints(POOR)).encode())[0] == 200


def test_discover_answers_the_generations_addresses_and_408_until_then(supervisor):
    assert request(f"{supervisor.url}/discover/exp1/t/0?timeout=0.2")[0] == 408
    supervisor.publish("exp1/t", 0, ["10.0.0.5", "10.0.0.6"])
    status, body = request(f"{supervisor.url}/discover/exp1/t/0")
    assert status == 200 and json.loads(body) == ["10.0.0.5", "10.0.0.6"]
    assert request(f"{supervisor.url}/discover/exp1/t/1?timeout=0.2")[0] == 408, "another restart group"
