"""A script written against the real nni 3.0 package runs under trialkit's keeper unchanged.

nni lives in a venv of its own (tools/nni_venv.sh, cached under ~/.cache/trialkit)
because it pins old versions of packages trialkit's environment shares.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from harness import ROOT, Manager, start_keeper


@pytest.fixture(scope="session")
def nni_python():
    done = subprocess.run(["bash", str(ROOT / "tools" / "nni_venv.sh")], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"cannot prepare the nni 3.0 venv: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


NNI_TRIAL = """
import json, nni
params = nni.get_next_parameter()
print("PARAMS " + json.dumps(params), flush=True)
for i in range(20):
    nni.report_intermediate_result({"default": i * params["lr"], "it's \\"quoted\\"": i})
nni.report_final_result(0.99)
"""


@pytest.mark.parametrize("platform, source", [("kubeflow", "stdout"), ("local", "nni")])
def test_a_script_using_real_nni_gets_its_parameters_and_delivers_every_metric(tmp_path, nni_python, platform,
                                                                                 source):
    manager = Manager(tmp_path / "exp")
    manager.register("t1", "token-1", {"lr": 0.5})
    manager.start()
    try:
        script = tmp_path / "nni_trial.py"
        script.write_text(NNI_TRIAL)
        keeper = start_keeper(tmp_path / "trial", [nni_python, str(script)], manager=manager,
                              TRIALKIT_PLATFORM=platform, TRIALKIT_PARAMETERS='{"lr": 0.5}', TRIALKIT_PARAMETER_ID="5")
        _, err = keeper.communicate(timeout=120)
        assert keeper.returncode == 0, err
        assert "malformed" not in err
        # nni in local mode sends the script's stdout to $NNI_OUTPUT_DIR/trial.log (the trial dir here).
        log = tmp_path / "trial" / ("trial.log" if platform == "local" else "stdout.log")
        assert 'PARAMS {"lr": 0.5}' in log.read_text()
        stored = manager.store.records_for("t1")
        metrics = [r for r in stored if r["type"] != "STATUS"]
        assert [(r["type"], r["sequence"], r["value"]) for r in metrics] == [
            ("PERIODICAL", i, {"default": i * 0.5, "it's \"quoted\"": i}) for i in range(20)] + [("FINAL", 0, 0.99)]
        assert {r["source"] for r in metrics} == {source}
        assert {r["parameter_id"] for r in metrics} == {5}
        assert [r["value"]["status"] for r in stored if r["type"] == "STATUS"] == ["RUNNING", "SUCCEEDED"]
        cfg = json.loads((tmp_path / "trial" / "parameter.cfg").read_text())
        assert cfg == {"parameter_id": 5, "parameter_source": "algorithm", "parameters": {"lr": 0.5},
                       "parameter_index": 0}
    finally:
        manager.close()
