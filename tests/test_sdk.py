"""The SDK as training code sees it: parameters, metrics into the channel, stop flag, dirs, standalone use."""
from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys

import pytest

from trialkit import env, records
from trialkit.sdk import Session

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def session(tmp_path, **extra):
    environ = {env.TRIAL_DIR: str(tmp_path), env.UNDER_KEEPER: "1", env.TRIAL_ID: "t1", env.PARAMETER_ID: "7"}
    environ.update(extra)
    out, err = io.StringIO(), io.StringIO()
    return Session(env.read(environ), out=out, err=err), out, err


def channel_records(path):
    bad = []
    decoder = records.SeqDecoder(lambda at, why: bad.append(why))
    with open(path, "rb") as f:
        frames = decoder.feed(f.read())
    decoder.finish()
    assert bad == []
    return [json.loads(p) for p, _ in frames]


def test_metrics_become_nni_shaped_records_in_the_channel(tmp_path):
    s, out, err = session(tmp_path)
    s.report("PERIODICAL", 0.5)
    s.report("PERIODICAL", 3)
    s.report("FINAL", {"default": 0.9, "loss": 0.1})
    recs = channel_records(tmp_path / ".trialkit" / "channel")
    assert [(r["type"], r["sequence"], r["value"]) for r in recs] == [
        ("PERIODICAL", 0, 0.5), ("PERIODICAL", 1, 3), ("FINAL", 0, {"default": 0.9, "loss": 0.1})]
    assert all(r["parameter_id"] == 7 and r["trial_job_id"] == "t1" and r["time"] > 0 for r in recs)
    assert out.getvalue() == "" and err.getvalue() == ""  # under a keeper the SDK is silent


def test_nan_infinity_numpy_and_torch_scalars_are_kept(tmp_path):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    s, _, err = session(tmp_path)
    for metric in (float("nan"), float("inf"), np.float32(0.25), torch.tensor(1.5), {"default": np.int64(4)}):
        s.report("PERIODICAL", metric)
    values = [r["value"] for r in channel_records(tmp_path / ".trialkit" / "channel")]
    assert math.isnan(values[0]) and values[1] == math.inf
    assert values[2:] == [0.25, 1.5, {"default": 4}]
    # NaN and infinities are kept, but are no number for a tuner: said once.
    assert err.getvalue().count("tuners and assessors do not see a number") == 1


def test_an_odd_metric_is_kept_with_one_warning(tmp_path):
    s, _, err = session(tmp_path)
    s.report("PERIODICAL", "high")
    s.report("PERIODICAL", {"loss": 1})
    assert err.getvalue().count("should be a number") == 1
    assert [r["value"] for r in channel_records(tmp_path / ".trialkit" / "channel")] == ["high", {"loss": 1}]


def test_only_rank_zero_reports_unless_told(tmp_path):
    s, _, _ = session(tmp_path, RANK="1")
    s.report("PERIODICAL", 1.0)
    assert not (tmp_path / ".trialkit" / "channel").exists()
    s, _, _ = session(tmp_path, RANK="2", **{env.REPORT_ALL_RANKS: "1"})
    s.report("PERIODICAL", 1.0)
    assert channel_records(tmp_path / ".trialkit" / "channel")[0]["rank"] == 2


@pytest.mark.parametrize("value", ["abc", "9" * 5000, "-1", "\u00b2"])
def test_a_rank_that_is_no_rank_reports_as_rank_0_and_says_so_once(tmp_path, value):
    s, _, err = session(tmp_path, RANK=value, HOROVOD_RANK="1")  # RANK is the one named: it is set
    s.report("PERIODICAL", 1.0)
    s.report("PERIODICAL", 2.0)
    assert len(channel_records(tmp_path / ".trialkit" / "channel")) == 2
    assert err.getvalue().count("\n") == 1 and "is not a rank; this process reports as rank 0" in err.getvalue()
    assert len(err.getvalue()) < 200  # a 5,000-digit value is not echoed whole


def test_parameters_inline_or_from_a_file_or_empty(tmp_path):
    s, _, _ = session(tmp_path, **{env.PARAMETERS: '{"lr": 0.1}'})
    assert s.parameters() == {"lr": 0.1}
    cfg = tmp_path / "parameter.cfg"
    cfg.write_text(json.dumps(records.nni_parameter_cfg(3, {"lr": 0.2})))
    s, _, _ = session(tmp_path, **{env.PARAMETERS_FILE: str(cfg)})
    assert s.parameters() == {"lr": 0.2}
    s, _, _ = session(tmp_path)
    assert s.parameters() == {}
    s, _, err = session(tmp_path, **{env.PARAMETERS: "{broken"})
    assert s.parameters() == {} and "cannot read the trial's parameters" in err.getvalue()
    s, _, err = session(tmp_path, **{env.PARAMETERS: "[1, 2]"})  # JSON, but no names and values: never raised
    assert s.parameters() == {} and "holds a JSON list" in err.getvalue()


def test_should_preempt_turns_true_when_the_stop_file_appears(tmp_path):
    s, _, _ = session(tmp_path)
    assert s.should_preempt() is False
    (tmp_path / ".trialkit").mkdir(exist_ok=True)
    (tmp_path / ".trialkit" / "stop").touch()
    assert s.should_preempt() is True
    (tmp_path / ".trialkit" / "stop").unlink()
    assert s.should_preempt() is True  # a stop once asked stays asked


def test_a_channel_that_cannot_be_written_warns_once_never_raises_and_hands_its_records_to_the_keeper_at_exit(
        tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    s, out, err = session(tmp_path, **{env.CHANNEL: str(blocker / "channel")})
    for i in range(3):
        s.report("PERIODICAL", i)
    assert err.getvalue().count("cannot write metrics") == 1 and "wait in memory" in err.getvalue()
    s._at_exit()  # as atexit runs it: what the channel never took goes out as NNI's stdout lines, which the keeper reads
    lines = out.getvalue().splitlines()
    assert [records.parse_nni_stdout(line.encode())["value"] for line in lines] == [0, 1, 2]
    assert "lost" not in err.getvalue()


def run_python(code, cwd, environ):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=60)


def clean_environ():
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("TRIALKIT_", "NNI_", "ADAPTDL_")) and k not in env.RANK_VARIABLES}
    keep["TRIALKIT_TEST_TAG"] = os.environ["TRIALKIT_TEST_TAG"]
    keep["PYTHONPATH"] = ROOT
    return keep


STANDALONE = """
import trialkit
print("params", trialkit.get_next_parameter(), trialkit.get_current_parameter("lr"))
for i in range(3):
    trialkit.report_intermediate_result(i / 2)
trialkit.report_final_result({"default": 0.75})
print("ids", trialkit.get_trial_id(), trialkit.get_experiment_id(), trialkit.get_sequence_id())
print("preempt", trialkit.should_preempt())
print("dirs", trialkit.checkpoint_dir(), trialkit.output_dir(), trialkit.tensorboard_dir())
"""


def test_standalone_without_keeper_manager_or_environment(tmp_path):
    done = run_python(STANDALONE, tmp_path, clean_environ())
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "params {} None"
    assert lines[1:5] == ["trialkit: intermediate result 0: 0.0", "trialkit: intermediate result 1: 0.5",
                          "trialkit: intermediate result 2: 1.0", "trialkit: final result 0: {'default': 0.75}"]
    assert lines[5] == "ids standalone standalone 0"
    assert lines[6] == "preempt False"
    assert lines[7] == f"dirs {tmp_path}/checkpoint {tmp_path} None"
    kept = tmp_path / ".trialkit" / "channel"
    assert done.stderr.count("trialkit:") == 1 and str(kept) in done.stderr  # says where, once
    assert [r["value"] for r in channel_records(kept)] == [0.0, 0.5, 1.0, {"default": 0.75}]


def test_standalone_takes_inline_parameters_and_survives_an_unwritable_dir(tmp_path):
    environ = clean_environ()
    environ["TRIALKIT_PARAMETERS"] = '{"lr": 0.01}'
    environ["TRIALKIT_CHANNEL"] = "/proc/trialkit-cannot-be-here/channel"
    done = run_python(STANDALONE, tmp_path, environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "params {'lr': 0.01} 0.01"
    assert "trialkit: intermediate result 2: 1.0" in done.stdout
    assert done.stderr.count("cannot write metrics") == 1 and "only printed" in done.stderr


@pytest.mark.parametrize("environ, reports", [
    ({}, True),
    ({"RANK": "0", "MASTER_ADDR": "job-master-0", "WORLD_SIZE": "3"}, True),  # PyTorchJob master
    ({"RANK": "2", "MASTER_ADDR": "job-master-0", "WORLD_SIZE": "3"}, False),  # PyTorchJob worker
    ({"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "chief", "index": 0}}'}, True),
    ({"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 0}}'}, False),
    ({"TF_CONFIG": '{"cluster": {"ps": ["p:1"], "worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 0}}'}, True),
    ({"TF_CONFIG": '{"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "ps", "index": 0}}'}, False),
    ({"FC_TASKROLE_NAME": "worker", "FC_TASK_INDEX": "0", "TRIALKIT_CHIEF_ROLE": "worker"}, True),
    ({"FC_TASKROLE_NAME": "worker", "FC_TASK_INDEX": "1", "TRIALKIT_CHIEF_ROLE": "worker"}, False),
    ({"FC_TASKROLE_NAME": "ps", "FC_TASK_INDEX": "0", "TRIALKIT_CHIEF_ROLE": "worker"}, False),
    ({"ADAPTDL_NUM_REPLICAS": "2", "ADAPTDL_REPLICA_RANK": "1"}, False),
])
def test_only_the_chief_replica_of_a_multi_pod_trial_ships_records(environ, reports):
    """Every pod of a trial runs a keeper with the trial's token; their sequence
    numbers would collide at the manager, so exactly one replica ships."""
    from trialkit.env import is_reporting_replica

    assert is_reporting_replica(environ) is reports


class _ReprRaises:
    def __repr__(self):
        raise RuntimeError("repr refused")


def _nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


def test_odd_values_are_stored_faithfully_or_refused_with_a_line_never_raised(tmp_path):
    """Issue 29, item 4: whatever training code reports, the SDK raises nothing into its loop."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    cycle = []
    cycle.append(cycle)
    kept = [
        (torch.tensor([1.5, 2.5]), [1.5, 2.5]),  # an array: its nested list
        (np.arange(4).reshape(2, 2), [[0, 1], [2, 3]]),
        ({"default": torch.tensor(0.5), 3: np.float64(1.0), None: 2}, {"default": 0.5, "3": 1.0, "null": 2}),
        ((1, 2), [1, 2]),
        (_nested(63), _nested(63)),
    ]
    refused = [
        ({(1, 2): 3.0}, "a key of type tuple"),
        (_ReprRaises(), "converting it raised RuntimeError"),
        ({"default": 1.0, "x": _ReprRaises()}, "converting it raised RuntimeError"),
        (_nested(3000), "nests deeper than 64"),
        (cycle, "nests deeper than 64"),
        ("x" * (records.MAX_FRAME + 1), "over the 1048576 bytes"),
        (10 ** 5000, "more than 4,300 digits (report it as a float or as text)"),
    ]
    s, _, err = session(tmp_path)
    for value, _ in kept + refused:
        s.report("PERIODICAL", value)
        s.report("FINAL", value)
    stored = [r["value"] for r in channel_records(tmp_path / ".trialkit" / "channel")]
    assert stored == [want for _, want in kept for _ in range(2)]
    lines = err.getvalue().splitlines()
    for _, why in refused:
        assert sum(why in line and line.endswith("it is lost") for line in lines) == 1, (why, lines)
