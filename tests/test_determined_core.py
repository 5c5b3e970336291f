"""Determined's own Core API tutorial, unchanged, under `trialkit run CONFIG CONTEXT_DIR` on the local platform.

The scripts and configs in tests/fixtures/determined are Determined's
(examples/tutorials/core_api); this Python has no `determined`, so each
trial imports trialkit's (trialkit/shims/determined). Each is a real
experiment: a manager, keepers, trial processes, the store on disk.
"""
from __future__ import annotations

import base64
import csv
import io
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiment_util import by_sequence, cli, experiment_id, export, paused_and_activated
from harness import ROOT, channel_records

FIXTURES = Path(__file__).parent / "fixtures" / "determined"
WAIT = 120.0  # an upper bound for a loaded machine; never waited for on success
BOOT = ROOT / "trialkit" / "shims" / "boot"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_determined_is_not_installed_here():
    # No distribution of Determined: what `import determined` finds is trialkit's fallback package.
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("determined")
    assert importlib.util.find_spec("determined").origin == str(ROOT / "trialkit" / "shims" / "determined" /
                                                                "__init__.py")


def run(config: str, context: Path = FIXTURES) -> str:
    done = cli("run", FIXTURES / config, context, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    return experiment_id(done.stdout.splitlines()[0])


def metrics(row: dict, group: str) -> list:
    return [(r["steps_completed"], r["metrics"]) for r in row["intermediate"] if r["group"] == group]


def test_metrics_are_stored_and_the_validation_is_the_final_result():
    done = cli("run", FIXTURES / "1_metrics.yaml", FIXTURES, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    # A trial of no parameters is named alone as the best: no empty ": " after it.
    assert f"| best 100 ({exp}-00000)\n" in done.stdout, done.stdout
    assert "searcher.metric" not in done.stdout  # its validations report the searcher's metric: no warning
    row = export(exp)[0]
    assert row["status"] == "SUCCEEDED" and row["parameters"] == {}
    assert metrics(row, "training") == [(n, {"x": n}) for n in range(10, 101, 10)]
    assert metrics(row, "validation") == [(100, {"x": 100})]
    assert row["final"] == 100  # the searcher metric (x) of the last validation
    log = (Path(row["trial_dir"]) / "stderr.log").read_text()
    assert "INFO: [" in log and "root: x is now 100" in log  # det.LOG_FORMAT


def pause_and_resume(home: Path, config: str) -> tuple:
    """Run `config`, pause its trial after 20 batches, check it left by itself through should_preempt()
    (exit 143, the keeper's own verdict PREEMPTED: no death by SIGTERM), activate it, run to the end.
    Returns (the state file of the latest checkpoint as it was paused, the last step run 0 reported, each run's
    row). Read while paused: Determined's retention (the latest and the best) deletes it once the trial goes on."""
    def while_paused(exp: str, trial: str) -> tuple:
        paused = json.loads(cli("experiment", "export", exp, "--all-runs").stdout)[0]
        kept = json.loads((Path(paused["trial_dir"]) / ".trialkit" / "status.json").read_text())
        assert paused["exit_code"] == 143 and kept["status"] == "PREEMPTED", kept
        stopped_at = metrics(paused, "training")[-1][0]
        assert stopped_at < 100
        checkpoints = Path(paused["trial_dir"]) / "checkpoint"
        latest = checkpoints / (checkpoints / "latest").read_text()
        # The checkpoint stored at the last report before should_preempt() said yes.
        assert json.loads((latest / "metadata.json").read_text()) == {"steps_completed": stopped_at}
        return (latest / "state").read_text() if (latest / "state").exists() else None, stopped_at

    exp, (state, stopped_at) = paused_and_activated(home, [FIXTURES / config, FIXTURES], 2, while_paused)
    runs = {row["run"]: row for row in json.loads(cli("experiment", "export", exp, "--all-runs").stdout)}
    assert sorted(runs) == [0, 1] and runs[1]["status"] == "SUCCEEDED" and runs[1]["restart_count"] == 1
    return state, stopped_at, runs


def test_a_pause_reaches_should_preempt_and_the_trial_resumes_from_its_stored_checkpoint(home):
    state, stopped_at, runs = pause_and_resume(home, "2_checkpoints.yaml")
    assert state == f"{stopped_at},{stopped_at},0"  # x, steps, trial id
    # Run 1 began where the checkpoint left off: no batch trained twice, x carried on.
    assert [n for n, _ in metrics(runs[0], "training")] == list(range(10, stopped_at + 1, 10))
    assert metrics(runs[1], "training") == [(n, {"x": n}) for n in range(stopped_at + 10, 101, 10)]
    assert runs[1]["final"] == 100
    # Each run keeps its own end: the paused one was PREEMPTED (exit 143), however the trial ended later.
    assert (runs[0]["status"], runs[0]["exit_code"], runs[0]["steps"]) == ("PREEMPTED", 143, stopped_at)
    assert runs[0]["ended"] <= runs[1]["started"]
    # Every view is the trial's one series: the default export, trial list, the flat CSV.
    exp = runs[1]["trial_id"].rsplit("-", 1)[0]
    row = export(exp)[0]
    assert metrics(row, "training") == [(n, {"x": n}) for n in range(10, 101, 10)]  # 10..100, each once
    assert metrics(row, "validation") == [(100, {"x": 100})]
    assert (row["status"], row["steps"], row["final"], row["run"]) == ("SUCCEEDED", 100, 100, 1)
    listed = cli("trial", "list", exp).stdout.splitlines()
    assert listed[0].split() == ["trial", "status", "final", "steps", "duration", "parameters"]
    assert listed[2].split()[1:4] == ["SUCCEEDED", "100", "100"]
    table = list(csv.DictReader(io.StringIO(cli("experiment", "export", exp, "--format", "csv").stdout)))
    assert (table[0]["steps"], table[0]["latest.training.x"], table[0]["latest.validation.x"]) == ("100", "100.0",
                                                                                                  "100.0")
    assert not any(cell.startswith(("[", "{")) for cell in table[0].values())  # flat: no JSON inside a cell


def test_adaptive_asha_stops_the_worse_trials_at_a_rung():
    exp = run("3_hpsearch.yaml")
    rows = by_sequence(export(exp))
    assert len(rows) == 10
    stopped = [r for r in rows.values() if r["status"] == "EARLY_STOPPED"]
    done = [r for r in rows.values() if r["status"] == "SUCCEEDED"]
    assert stopped and done and len(stopped) + len(done) == 10
    for row in stopped:  # stopped by the first rung (25 batches) of the two-rung bracket, long before 100
        assert metrics(row, "validation")[-1][0] < 100 and row["final"] is None
    for row in done:
        assert metrics(row, "validation")[-1] == (100, {"x": 100 * row["parameters"]["increment_by"],
                                                        "batches": 100})
    # Smaller x is better: a stopped trial never beat every trial that went on at its rung.
    best_done = min(r["parameters"]["increment_by"] for r in done)
    assert all(r["parameters"]["increment_by"] >= best_done for r in stopped)


def test_a_searcher_metric_the_validations_do_not_report_is_said_once_where_the_user_looks(tmp_path):
    """Else ASHA stops nothing and no checkpoint is the best, silently (newcomer17)."""
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(LEGACY_TRAIN.replace('metrics={"x": x}', 'metrics={"validation_x": x}'))
    (context / "exp.yaml").write_text(LEGACY_CONFIG.replace("max_trials: 8", "max_trials: 2"))
    done = cli("run", context / "exp.yaml", context, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in done.stdout.splitlines() if "searcher.metric" in line]
    assert len(said) == 1 and said[0].endswith(
        "warning: its validation metrics (validation_x) hold no number named by the Determined config's "
        "searcher.metric: the searcher judges none of its validations (ASHA stops no trial) and no checkpoint is "
        "its best; name one of them in searcher.metric"), done.stdout
    # Where the metric is reported, nothing is said: test_metrics_are_stored_and_the_validation_is_the_final_result.
    assert "why: searcher.max_trials (2) reached" in done.stdout, done.stdout  # the key its user wrote
    shown = cli("experiment", "show", experiment_id(done.stdout.splitlines()[0]))  # as the page, from the store
    assert shown.returncode == 0 and "searcher.max_trials (2) reached" in shown.stdout, shown.stdout


# Determined 0.38's form: ASHA's rungs on the time_metric the validations report, here {TIMED} (or nothing).
TIMED_TRAIN = """
import determined as det

with det.core.init() as core:
    for batch in (25, 50, 75, 100):
        core.train.report_validation_metrics(steps_completed=batch, metrics={{"x": batch, {TIMED}}})
"""
TIMED_CONFIG = """
entrypoint: python3 train.py
hyperparameters: {increment_by: {type: int, minval: 1, maxval: 8}}
searcher: {name: adaptive_asha, metric: x, time_metric: batches, max_time: 100, max_trials: 2}
max_restarts: 0
"""


@pytest.mark.parametrize("timed", ['"batches": batch', ""], ids=["reported", "missing"])
def test_a_time_metric_the_validations_do_not_report_is_said_once_where_the_user_looks(tmp_path, timed):
    """Else ASHA places no validation at a rung and stops nothing, silently (newcomer, session 11)."""
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(TIMED_TRAIN.format(TIMED=timed))
    (context / "exp.yaml").write_text(TIMED_CONFIG)
    done = cli("run", context / "exp.yaml", context, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in done.stdout.splitlines() if "searcher.time_metric" in line]
    assert "searcher.metric" not in done.stdout  # the searcher's metric is there
    if timed:
        assert said == [], done.stdout
    else:
        assert len(said) == 1 and said[0].endswith(
            "warning: its validation metrics (x) hold no number named by the Determined config's "
            "searcher.time_metric (batches): ASHA places none of its validations at a rung, so it stops no trial; "
            "report batches with each validation, or name one of its metrics in searcher.time_metric"), done.stdout


# A script written for the legacy searcher, as the tutorial's stage 3 was before Determined 0.38: it trains to each
# operation's length and validates only when the operation completes.
LEGACY_TRAIN = """
import time
import determined as det


def main(core, increment_by):
    x = batch = 0
    for op in core.searcher.operations():
        while batch < op.length:
            batch += 1
            x += increment_by
            time.sleep(0.03)  # a trial ASHA stops at 25 hears it long before 100, on a loaded machine too
            if batch % 5 == 0 and core.preempt.should_preempt():
                return
        core.train.report_validation_metrics(steps_completed=batch, metrics={"x": x})
        op.report_completed(x)


with det.core.init() as core:
    main(core, det.get_cluster_info().trial.hparams["increment_by"])
"""
LEGACY_CONFIG = """
name: legacy-asha
entrypoint: python3 train.py
hyperparameters: {increment_by: {type: int, minval: 1, maxval: 8}}
searcher: {name: adaptive_asha, metric: x, max_length: {batches: 100}, max_trials: 8, mode: aggressive, divisor: 4,
           max_concurrent_trials: 2}
max_restarts: 0
"""


def test_adaptive_asha_on_max_length_gives_an_operation_per_rung_so_a_legacy_script_is_stopped_early(tmp_path):
    """max_length 100, divisor 4, aggressive: one bracket, rungs at 25 and 100 batches. The script validates only
    when an operation completes; with one operation of 100 no trial could be stopped early. Each trial validates
    at 25, and those ASHA stops there end EARLY_STOPPED long before 100."""
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(LEGACY_TRAIN)
    (context / "exp.yaml").write_text(LEGACY_CONFIG)
    exp = run(context / "exp.yaml", context)
    rows = by_sequence(export(exp))
    stopped = [r for r in rows.values() if r["status"] == "EARLY_STOPPED"]
    done = [r for r in rows.values() if r["status"] == "SUCCEEDED"]
    assert len(rows) == 8 and len(stopped) + len(done) == 8, rows
    assert stopped and done  # the first trial is alone at each rung: it goes on; 7 that never beat the best: 1/2600
    for row in rows.values():
        step = row["parameters"]["increment_by"]
        seen = [(25, {"x": 25 * step})] + ([(100, {"x": 100 * step})] if row in done else [])
        assert metrics(row, "validation") == seen, row
        assert row["final"] == (100 * step if row in done else None)


# The legacy script again, with checkpoints: trial 0's first run holds at batch 30 (its first operation, to 25,
# completed) until it is paused.
LEGACY_CHECKPOINTED = """
import json
import time
import determined as det


def main(core, info):
    x = batch = 0
    if info.latest_checkpoint is not None:
        with core.checkpoint.restore_path(info.latest_checkpoint) as path:
            x, batch = json.loads((path / "state").read_text())
    hold = info.trial.trial_id == 0 and info.trial.trial_run_id == 0
    for op in core.searcher.operations():
        while batch < op.length:
            batch += 1
            x += 1
            if batch % 5 == 0:
                core.train.report_training_metrics(steps_completed=batch, metrics={"x": x})
                with core.checkpoint.store_path({"steps_completed": batch}) as (path, _):
                    (path / "state").write_text(json.dumps([x, batch]))
                while hold and batch == 30 and not core.preempt.should_preempt():
                    time.sleep(0.05)
                if core.preempt.should_preempt():
                    return
        core.train.report_validation_metrics(steps_completed=batch, metrics={"x": x})
        op.report_completed(x)


with det.core.init() as core:
    main(core, det.get_cluster_info())
"""


def test_a_legacy_script_resumed_from_its_checkpoint_gets_only_the_operations_it_has_not_completed(tmp_path, home):
    """Rungs at 25 and 100: paused at batch 30, after it completed the operation to 25, the trial goes on from its
    checkpoint with the operation to 100 alone (Determined gives a completed operation once): it validates at 25
    and 100, not again at 30 for an operation it already completed."""
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(LEGACY_CHECKPOINTED)
    # One at a time: trial 0 is alone at rung 25, and goes on.
    (context / "exp.yaml").write_text(LEGACY_CONFIG.replace("max_trials: 8", "max_trials: 4")
                                      .replace("max_concurrent_trials: 2", "max_concurrent_trials: 1"))
    exp, _ = paused_and_activated(home, [context / "exp.yaml", context], 7)  # 6 training reports, 1 validation
    row = by_sequence(export(exp))[0]
    assert metrics(row, "validation") == [(25, {"x": 25}), (100, {"x": 100})], row
    assert (row["status"], row["final"], row["restart_count"]) == ("SUCCEEDED", 100, 1)


def test_a_distributed_script_starts_its_workers_from_the_cluster_info_and_all_stop_for_a_pause(home):
    """Eight workers of Determined's own launcher; a pause reaches every rank at the same step (rank 0 asks, all
    hear), the launcher exits 143 with them, and the resumed run goes on from rank 0's checkpoint."""
    # The tutorial asks for 8 slots; this machine's default pool has one a CPU: declare a pool that has them.
    home.mkdir(parents=True, exist_ok=True)
    (home / "pools.yml").write_text("pools:\n  default: {slots: 8}\n")
    _, stopped_at, runs = pause_and_resume(home, "4_distributed.yaml")
    increment = runs[1]["parameters"]["increment_by"]
    # Every rank's increment, allgathered at each of 100 steps, across the pause: rank 0's reports only.
    assert metrics(runs[1], "training") == [(n, {"x": 8 * increment * n}) for n in range(stopped_at + 10, 101, 10)]
    assert metrics(runs[1], "validation") == [(100, {"x": 8 * increment * 100})]
    assert runs[1]["final"] == 8 * increment * 100  # op.report_completed(x)
    out = (Path(runs[1]["trial_dir"]) / "stdout.log").read_text()
    assert {f"[rank={r}] worker starting" for r in range(8)} <= set(out.splitlines())
    assert "[rank=0] x is now" in out and "[rank=1] x is now" not in out


TORCH_TRAIN = """
import determined as det
import torch.distributed as dist

dist.init_process_group("gloo")
distributed = det.core.DistributedContext.from_torch_distributed()
with det.core.init(distributed=distributed) as core:
    ranks = core.distributed.allgather(distributed.rank)
    for step in range(1, 4):
        core.train.report_validation_metrics(steps_completed=step, metrics={"loss": 1.0 / step, "ranks": ranks})
dist.destroy_process_group()
"""


def test_a_core_api_script_under_determineds_torch_distributed_launcher(tmp_path):
    """`python3 -m determined.launch.torch_distributed` is trialkit's launcher: two torch workers, rank 0 reports."""
    pytest.importorskip("torch", reason="torch is one of trialkit's extras")
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(TORCH_TRAIN)
    (context / "exp.yaml").write_text(
        "name: torch-core\nentrypoint: python3 -m determined.launch.torch_distributed python3 train.py\n"
        "resources: {slots_per_trial: 2}\nsearcher: {name: single, metric: loss}\nmax_restarts: 0\n")
    done = cli("run", context / "exp.yaml", context, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    row = export(experiment_id(done.stdout.splitlines()[0]))[0]
    assert metrics(row, "validation") == [(n, {"loss": 1.0 / n, "ranks": [0, 1]}) for n in (1, 2, 3)]
    assert row["final"] == pytest.approx(1 / 3)


HOROVOD_TRAIN = """
import determined as det
import horovod.torch as hvd

hvd.init()
distributed = det.core.DistributedContext.from_horovod(hvd)
with det.core.init(distributed=distributed) as core:
    ranks = core.distributed.allgather([hvd.rank(), hvd.size(), hvd.local_size()])
    print("rank", distributed.rank, "of", distributed.size, flush=True)
    for step in range(1, 4):
        core.train.report_validation_metrics(steps_completed=step, metrics={"loss": 1.0 / step, "ranks": ranks})
"""


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None, reason="needs horovod (tools/build_horovod.sh)")
@pytest.mark.parametrize("launcher", ["autohorovod", "horovod"])
def test_a_core_api_script_under_determineds_horovod_launchers(tmp_path, launcher):
    """Two slots: autohorovod picks horovodrun (gloo on the CPU), as horovod does; the DistributedContext comes
    from horovod's ranks, both workers run, rank 0 alone reports."""
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(HOROVOD_TRAIN)
    (context / "exp.yaml").write_text(
        f"name: hvd-core\nentrypoint: python3 -m determined.launch.{launcher} python3 train.py\n"
        "resources: {slots_per_trial: 2}\nsearcher: {name: single, metric: loss}\nmax_restarts: 0\n")
    done = cli("run", context / "exp.yaml", context, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    row = export(experiment_id(done.stdout.splitlines()[0]))[0]
    ranks = [[0, 2, 2], [1, 2, 2]]  # (rank, size, local_size) from horovod, allgathered over the context's star
    assert metrics(row, "validation") == [(n, {"loss": 1.0 / n, "ranks": ranks}) for n in (1, 2, 3)]
    assert row["status"] == "SUCCEEDED" and row["final"] == pytest.approx(1 / 3)
    out = (Path(row["trial_dir"]) / "stdout.log").read_text().splitlines()
    assert "[rank=0] rank 0 of 2" in out and "[rank=1] rank 1 of 2" in out  # horovod's launcher labels its ranks


def test_a_pause_stops_every_torch_distributed_rank_at_one_step_and_the_trial_resumes(home):
    """Two workers of determined.launch.torch_distributed: rank 0 hears the pause, every rank stops at the
    same step through should_preempt(), the trial resumes from rank 0's checkpoint and reports once."""
    pytest.importorskip("torch", reason="torch is one of trialkit's extras")
    state, stopped_at, runs = pause_and_resume(home, "trialkit_torch_pause.yaml")
    assert state == f"{3 * stopped_at},{stopped_at}"
    out = (Path(runs[0]["trial_dir"]) / "stdout.log").read_text().splitlines()
    assert sorted(line for line in out if "preempted" in line) == [
        f"[rank={r}] preempted after step {stopped_at}" for r in (0, 1)]
    assert [n for n, _ in metrics(runs[0], "training")] == list(range(10, stopped_at + 1, 10))
    assert metrics(runs[1], "training") == [(n, {"x": 3 * n}) for n in range(stopped_at + 10, 101, 10)]
    assert metrics(runs[1], "validation") == [(100, {"x": 300})] and runs[1]["final"] == 300


def shim_python(tmp_path: Path, code: str, **environ: str) -> subprocess.CompletedProcess:
    """`code` in a Python that finds `determined` through the keeper's boot dir, as a trial does."""
    e = {**os.environ, "PYTHONPATH": str(BOOT), "TRIALKIT_TRIAL_DIR": str(tmp_path), **environ}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=e,
                          cwd=tmp_path)


def test_checkpoints_by_storage_id(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(b"weights")
    done = shim_python(tmp_path, f"""
import pathlib, determined as det
with det.core.init() as core:
    ckpt = core.checkpoint
    a = ckpt.upload({str(src)!r}, {{"epoch": 1}})
    with ckpt.store_path({{"epoch": 2}}) as (path, b):
        (path / "w.bin").write_bytes(b"newer")
    assert ckpt.get_metadata(a) == {{"epoch": 1}}
    ckpt.download(a, {str(tmp_path / "out")!r})
    with ckpt.restore_path(b) as path:
        print((path / "w.bin").read_bytes().decode())
    ckpt.delete(a)
    torch_style = det.core.DistributedContext.from_torch_distributed()
    print("ranks", torch_style.rank, torch_style.size, torch_style.local_size, torch_style.cross_size)
    deepspeed_style = det.core.DistributedContext.from_deepspeed()  # trialkit's launcher sets torch's names
    class hvd:  # horovod's module functions, for one worker
        rank = local_rank = cross_rank = staticmethod(lambda: 0)
        size = local_size = cross_size = staticmethod(lambda: 1)
    horovod_style = det.core.DistributedContext.from_horovod(hvd)
    print("same", [(c.rank, c.size, c.local_size, c.cross_size) for c in (deepspeed_style, horovod_style)])
    try:
        ckpt.get_metadata(a)
    except FileNotFoundError as err:
        print("gone:", err)
""", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0", GROUP_WORLD_SIZE="1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["newer", "ranks 0 1 1 1", "same [(0, 1, 1, 1), (0, 1, 1, 1)]"]
    assert lines[3].startswith("gone: no checkpoint")
    assert (tmp_path / "out" / "sub" / "w.bin").read_bytes() == b"weights"
    assert (tmp_path / "checkpoint" / "latest").read_text() != ""


def test_the_launch_modules_are_trialkits_launchers(tmp_path):
    done = shim_python(tmp_path, "import runpy, sys; sys.argv = ['x', '3', '--', sys.executable, '-c', "
                       "'print(\"hi\")']; runpy.run_module('determined.launch.wrap_rank', run_name='__main__')")
    assert done.returncode == 0 and done.stdout == "[rank=3] hi\n", done.stderr
    for name in ("torch_distributed", "deepspeed", "horovod"):
        done = subprocess.run([sys.executable, "-m", f"determined.launch.{name}", "--help"], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(BOOT)})
        assert done.returncode == 0 and f"trialkit.launch.{name}" in done.stdout, (name, done.stdout, done.stderr)
    script = tmp_path / "train.py"
    script.write_text("import sys; print('args', sys.argv[1:])")
    done = subprocess.run([sys.executable, "-m", "determined.launch.autohorovod", str(script), "--lr", "1"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(BOOT), "TRIALKIT_SLOTS_PER_NODE": "1"})
    assert done.returncode == 0 and done.stdout == "args ['--lr', '1']\n", done.stderr


RANKS = """
import json, sys, determined as det
rank = int(sys.argv[1])
dist = det.core.DistributedContext(rank=rank, size=2, local_rank=rank, local_size=2, cross_rank=0, cross_size=1)
with det.core.init(distributed=dist) as core:
    print(json.dumps({"allgather": dist.allgather(rank * 10), "gather": dist.gather(rank),
                      "broadcast": dist.broadcast("from %d" % rank), "local": dist.allgather_local(rank)}))
    core.train.report_validation_metrics(steps_completed=1, metrics={"loss": rank + 0.5})
    with core.checkpoint.store_path({"sharded": True}, shard=True) as (path, storage_id):
        (path / ("rank%d" % rank)).write_text("part")
    print(json.dumps({"preempt": core.preempt.should_preempt(), "storage_id": storage_id}), flush=True)
"""


def test_ranks_share_collectives_and_only_rank_0_reports_and_asks(tmp_path):
    """Two ranks of one trial: rank 1 has no stop file of its own, yet learns of the stop from rank 0."""
    stop = tmp_path / ".trialkit" / "stop"
    stop.parent.mkdir()
    stop.touch()
    common = {**os.environ, "PYTHONPATH": str(BOOT), "TRIALKIT_TRIAL_DIR": str(tmp_path),
              "TRIALKIT_KEEPER_PID": "1", "TRIALKIT_EXPERIMENT_ID": "e", "TRIALKIT_TRIAL_ID": "e-0",
              "TRIALKIT_DETERMINED": base64.urlsafe_b64encode(b'{"searcher": {"metric": "loss"}}').decode()}
    procs = [subprocess.Popen([sys.executable, "-c", RANKS, str(rank)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**common, "TRIALKIT_STOP_FILE": str(stop if rank == 0 else tmp_path / "none")})
             for rank in (0, 1)]
    outs = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [143, 143], outs  # preempted: "checkpointed, resume me"
    answers = [[json.loads(line) for line in out.splitlines()] for out, _ in outs]
    assert answers[0][0] == {"allgather": [0, 10], "gather": [0, 1], "broadcast": "from 0", "local": [0, 1]}
    assert answers[1][0] == {"allgather": [0, 10], "gather": None, "broadcast": "from 0", "local": [0, 1]}
    assert answers[0][1] == answers[1][1] and answers[0][1]["preempt"] is True
    shards = tmp_path / "checkpoint" / answers[0][1]["storage_id"]  # one storage id, every rank's part in it
    assert sorted(p.name for p in shards.iterdir()) == ["metadata.json", "rank0", "rank1"]
    assert (tmp_path / "checkpoint" / "latest").read_text() == shards.name
    written = channel_records(tmp_path / ".trialkit" / "channel")
    assert [rec["value"]["metrics"] for rec in written] == [{"loss": 0.5}]  # rank 0's; no FINAL after a preempt


NODES = """
import json, sys, determined as det
rank, port = int(sys.argv[1]), int(sys.argv[2])
dist = det.core.DistributedContext(rank=rank, size=4, local_rank=rank % 2, local_size=2, cross_rank=rank // 2,
                                   cross_size=2, chief_ip="127.0.0.1", pub_port=port)
print(json.dumps({"all": dist.allgather(rank), "local": dist.allgather_local(rank),
                  "local_chief": dist.broadcast_local("node %d" % dist.cross_rank),
                  "gathered": dist.gather_local(rank)}))
dist.close()
"""


def test_two_nodes_talk_over_tcp_to_the_chief_and_each_node_has_its_own_local_star(tmp_path):
    """Two "nodes" of two workers each, on this machine: the job's star is TCP on the chief's address and
    port, each node's star its own."""
    from harness import free_port

    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", NODES, str(rank), str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(BOOT), "TRIALKIT_TRIAL_DIR": str(tmp_path)})
             for rank in range(4)]
    outs = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, outs
    got = [json.loads(out) for out, _ in outs]
    assert [g["all"] for g in got] == [[0, 1, 2, 3]] * 4
    assert [g["local"] for g in got] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [g["local_chief"] for g in got] == ["node 0", "node 0", "node 1", "node 1"]
    assert [g["gathered"] for g in got] == [[0, 1], None, [2, 3], None]


def test_what_the_fallback_lacks_says_so(tmp_path):
    done = shim_python(tmp_path, "import determined as det\ntry:\n    det.pytorch.PyTorchTrial\n"
                       "except AttributeError as err:\n    print(err)")
    assert done.returncode == 0 and "Core API only" in done.stdout and "install determined" in done.stdout


def test_training_that_raises_reports_no_final_result(tmp_path):
    done = shim_python(tmp_path, "import determined as det\nwith det.core.init() as core:\n"
                       "    core.train.report_training_metrics(steps_completed=1, metrics={'loss': 0.6}, "
                       "batch_metrics=[{'loss': 0.7}, {'loss': 0.5}])\n"
                       "    core.train.report_validation_metrics(steps_completed=1, metrics={'loss': 0.5})\n"
                       "    raise RuntimeError('diverged')",
                       TRIALKIT_KEEPER_PID="1", TRIALKIT_DETERMINED=base64.urlsafe_b64encode(
                           b'{"searcher": {"metric": "loss"}}').decode())
    assert done.returncode == 1 and "diverged" in done.stderr
    written = channel_records(tmp_path / ".trialkit" / "channel")
    assert [rec["type"] for rec in written] == ["PERIODICAL"] * 2  # no FINAL after the error
    assert written[0]["value"] == {"group": "training", "steps_completed": 1, "metrics": {"loss": 0.6},
                                   "batch_metrics": [{"loss": 0.7}, {"loss": 0.5}], "default": 0.6}


def test_a_trial_class_entrypoint_runs_the_class(tmp_path):
    context = tmp_path / "context"
    context.mkdir()
    (context / "model_def.py").write_text(
        "import trialkit\n\nclass MyTrial(trialkit.Trial):\n    def run(self):\n"
        "        return self.parameters['lr'] * 2\n")
    (context / "exp.yaml").write_text("entrypoint: model_def:MyTrial\nhyperparameters: {lr: 0.25}\n"
                                      "searcher: {name: single, metric: loss}\n")
    done = cli("run", context / "exp.yaml", context, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    row = export(experiment_id(done.stdout.splitlines()[0]))[0]
    assert row["status"] == "SUCCEEDED" and row["final"] == 0.5


def test_the_cluster_info_gives_nested_hyperparameters_data_and_ids(tmp_path):
    settings = {"searcher": {"name": "single", "metric": "loss"}, "data": {"bucket": "b"}}
    done = shim_python(tmp_path, "import json, determined as det\ninfo = det.get_cluster_info()\n"
                       "print(json.dumps([info.trial.hparams, info.user_data, info.trial.trial_id, "
                       "info.latest_checkpoint, info.slot_ids, info.container_addrs, info.container_rank]))",
                       TRIALKIT_KEEPER_PID="1", TRIALKIT_SEQUENCE="7", TRIALKIT_SLOTS_PER_NODE="2",
                       TRIALKIT_PARAMETERS=json.dumps({"optimizer": {"_name": "optimizer", "lr": 0.1}, "layers": 2}),
                       TRIALKIT_DETERMINED=base64.urlsafe_b64encode(json.dumps(settings).encode()).decode())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"optimizer": {"lr": 0.1}, "layers": 2}, {"bucket": "b"}, 7, None, [0, 1],
                                       ["127.0.0.1"], 0]
    off_cluster = shim_python(tmp_path, "import determined as det; print(det.get_cluster_info())")
    assert off_cluster.stdout == "None\n"  # as Determined's, run by hand


def test_a_determined_module_trialkit_does_not_serve_says_what_to_install(tmp_path):
    for statement in ("import determined.pytorch", "from determined import keras",
                      "from determined.estimator import EstimatorTrial"):
        done = shim_python(tmp_path, f"try:\n    {statement}\nexcept ModuleNotFoundError as err:\n"
                                     f"    print(type(err).__name__, err)")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("NotServed ") and done.stdout.count("\n") == 1, done.stdout
        assert "Core API only" in done.stdout and "pip install determined" in done.stdout
    served = shim_python(tmp_path, "import determined.core, determined.launch.torch_distributed; print('served')")
    assert served.stdout == "served\n", served.stderr


MISUSE = """
import determined as det, pathlib
def attempt(what, call):
    try:
        call()
        print(what, "ok")
    except Exception as err:
        print(what, type(err).__name__, err)
src = pathlib.Path("src")
src.mkdir()
pathlib.Path("a-file").write_text("x")
with det.core.init() as core:
    attempt("training", lambda: core.train.report_training_metrics(steps_completed=1, metrics=[0.5]))
    attempt("validation", lambda: core.train.report_validation_metrics(steps_completed=1, metrics=[0.5]))
    attempt("group", lambda: core.train.report_metrics("custom", 1, (0.5,)))
    attempt("upload-metadata", lambda: core.checkpoint.upload(src, ["steps_completed", 1]))
    def store():
        with core.checkpoint.store_path(["steps_completed"]) as (path, storage_id):
            pass
    attempt("store-metadata", store)
    attempt("upload-missing", lambda: core.checkpoint.upload("missing", {"steps_completed": 1}))
    attempt("upload-file", lambda: core.checkpoint.upload("a-file", {"steps_completed": 1}))
"""


def test_core_api_misuse_raises_determineds_exception_naming_the_call_and_stores_nothing(tmp_path):
    done = shim_python(tmp_path, MISUSE, TRIALKIT_KEEPER_PID="1")
    assert done.returncode == 0, done.stderr
    said = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in done.stdout.splitlines()}
    # Determined's types: it reads metrics as a dict (AttributeError), refuses metadata without its
    # 'steps_completed' item (ValueError), and lists the directory it uploads (FileNotFound, NotADirectory).
    for what, call in (("training", "report_training_metrics"), ("validation", "report_validation_metrics"),
                       ("group", "report_metrics")):
        assert said[what].startswith(f"AttributeError core.train.{call}(metrics=...) takes a dict"), said[what]
    for what, call in (("upload-metadata", "upload"), ("store-metadata", "store_path")):
        assert said[what].startswith(f"ValueError core.checkpoint.{call}(metadata=...) takes a dict"), said[what]
    assert said["upload-missing"] == "FileNotFoundError core.checkpoint.upload(ckpt_dir='missing'): no such directory"
    assert said["upload-file"].startswith("NotADirectoryError core.checkpoint.upload(ckpt_dir='a-file'): not a")
    assert not (tmp_path / "checkpoint").exists() or not any((tmp_path / "checkpoint").iterdir())
    channel = tmp_path / ".trialkit" / "channel"
    assert not channel.exists() or channel_records(channel) == []


def test_a_garbled_determined_setting_is_a_value_error_naming_the_variable(tmp_path):
    for garbled in ("%%%not-base64", base64.urlsafe_b64encode(b"{not json").decode(),
                    base64.urlsafe_b64encode(b"[1, 2]").decode()):
        for call in ("det.core.init()", "det.get_cluster_info()"):
            done = shim_python(tmp_path, f"import determined as det\ntry:\n    {call}\nexcept ValueError as err:\n"
                                         f"    print(err)", TRIALKIT_KEEPER_PID="1", TRIALKIT_DETERMINED=garbled)
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith("TRIALKIT_DETERMINED in the environment is not what `trialkit run` "
                                          "writes there"), (garbled, call, done.stdout)


def test_a_value_the_trialkit_sdk_takes_never_raises_into_training(tmp_path):
    code = """
import determined as det
class NoRepr:
    def __repr__(self):
        raise RuntimeError("no repr")
    __str__ = __repr__
deep = current = []
for _ in range(3000):
    current.append([])
    current = current[0]
with det.core.init() as core:
    for metrics in ({"loss": 0.5, "odd": NoRepr()}, {"loss": 0.5, "deep": deep}):
        core.train.report_training_metrics(steps_completed=1, metrics=metrics)
        core.train.report_validation_metrics(steps_completed=2, metrics=metrics)
        core.train.report_metrics("custom", 3, metrics)
print("trained on")
"""
    done = shim_python(tmp_path, code, TRIALKIT_KEEPER_PID="1", TRIALKIT_DETERMINED=base64.urlsafe_b64encode(
        b'{"searcher": {"metric": "loss"}}').decode())
    assert done.returncode == 0 and done.stdout == "trained on\n", done.stderr[-3000:]
    assert "a metric cannot be written as JSON" in done.stderr  # the SDK's own word: lost, not raised
