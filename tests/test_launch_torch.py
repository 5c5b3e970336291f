"""torch_distributed with real torchrun and gloo on the CPU: 2 workers, tiny tensors."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from launch_support import ALLREDUCE, PY, WAIT_FOR_STOP, Proc, free_port, launch_env, write

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
]
LAUNCHER = [PY, "-m", "trialkit.launch.torch_distributed"]
KEEPER = [PY, "-m", "trialkit.keeper", "--"]


def test_two_workers_all_reduce_through_the_keeper(tmp_path):
    script = write(tmp_path, "allreduce.py", ALLREDUCE)
    # The script's own "--" is its own: it gets every argument as given.
    proc = Proc([*KEEPER, *LAUNCHER, str(script), "--", "--lr", "0.1"], launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2"))
    assert proc.finish() == 0, proc.err[-3000:]
    for rank in (0, 1):
        assert f"[rank={rank}] rank {rank} of 2 sum 3 args ['--', '--lr', '0.1']\n" in proc.text


def test_torchrun_leaves_nothing_in_tmpdir_and_the_script_keeps_the_users(tmp_path):
    """torchrun makes a torchelastic_* dir in TMPDIR for its logs and never removes it, even after a normal
    end (hygiene13); the launcher gives it a TMPDIR of the launch's own, removed at the end, and gives the
    user's script the user's TMPDIR back."""
    tmpdir = Path(tempfile.mkdtemp(prefix="tk", dir="/tmp"))  # short: the launch's socket dir goes there too
    try:
        script = write(tmp_path, "tmp.py", ALLREDUCE + "import tempfile\nprint('tmp', tempfile.gettempdir())\n")
        proc = Proc([*LAUNCHER, str(script)], launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2", TMPDIR=str(tmpdir)))
        assert proc.finish() == 0, proc.err[-3000:]
        for rank in (0, 1):
            assert f"[rank={rank}] tmp {tmpdir}\n" in proc.text
        assert not list(tmpdir.iterdir())
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def test_a_trial_class_runs_in_every_worker(tmp_path):
    write(tmp_path, "model_def.py", """
    import torch, torch.distributed as dist
    from trialkit.trial import Trial

    class SumTrial(Trial):
        def run(self):
            dist.init_process_group("gloo")
            t = torch.tensor([self.parameters["x"] * (self.rank + 1.0)])
            dist.all_reduce(t)
            print(f"trial rank {self.rank} sum {t.item():g}", flush=True)
            dist.destroy_process_group()
            return t.item()
    """)
    proc = Proc([*LAUNCHER, "--trial", "model_def:SumTrial"], cwd=tmp_path,
                env=launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2", TRIALKIT_PARAMETERS='{"x": 2}'))
    assert proc.finish() == 0, proc.err[-3000:]
    assert "[rank=0] trial rank 0 sum 6\n" in proc.text and "[rank=1] trial rank 1 sum 6\n" in proc.text
    # The final result goes through the SDK, which lets rank 0 speak for the job.
    assert re.search(r"\[rank=0\] trialkit: final result.*6", proc.text)
    assert not re.search(r"\[rank=1\] trialkit: final result", proc.text)


def test_kill_9_one_rank_stops_every_worker_within_the_grace(tmp_path):
    script = write(tmp_path, "wait.py", WAIT_FOR_STOP)
    grace = 10.0
    proc = Proc([*LAUNCHER, str(script)], launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2",
                                                     TRIALKIT_GRACE_SECONDS=str(grace)))
    pids = {int(proc.wait_for(rf"ready rank={r} pid=(\d+)").group(1)) for r in (0, 1)}
    victim = int(proc.wait_for(r"ready rank=1 pid=(\d+)").group(1))
    killed = time.monotonic()
    psutil.Process(victim).kill()
    code = proc.finish()
    assert time.monotonic() - killed < grace
    assert code == 137
    assert proc.err_lines[-1] == (f"trialkit.launch.torch_distributed: rank 1 failed with signal SIGKILL (exit 137) "
                                  f"running {script}; stopped the other workers")
    assert "[rank=0] handler rank=0 signal=SIGTERM\n" in proc.text  # the survivor was asked, not shot
    assert not any(psutil.pid_exists(pid) for pid in pids)


def test_a_rank_torchrun_is_not_watching_is_stopped_by_trialkit_alone(tmp_path):
    # torchrun looks at its workers once per --monitor-interval: at an hour it cannot be what stops the
    # survivor, and SIGKILL comes only when the grace is over, so the survivor's handler shows our stop.
    script = write(tmp_path, "wait.py", WAIT_FOR_STOP)
    proc = Proc([*LAUNCHER, "--monitor-interval", "3600", "--", str(script)],
                launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2", TRIALKIT_GRACE_SECONDS="60"))
    pids = {int(proc.wait_for(rf"ready rank={r} pid=(\d+)").group(1)) for r in (0, 1)}
    psutil.Process(int(proc.wait_for(r"ready rank=1 pid=(\d+)").group(1))).kill()
    assert proc.finish() == 137
    assert "[rank=0] handler rank=0 signal=SIGTERM\n" in proc.text, proc.text
    assert proc.err_lines[-1].endswith(f"running {script}; stopped the other workers")
    assert not any(psutil.pid_exists(pid) for pid in pids)


def test_sigterm_at_the_keeper_runs_every_ranks_handler_once(tmp_path):
    script = write(tmp_path, "wait.py", WAIT_FOR_STOP)
    proc = Proc([*KEEPER, *LAUNCHER, str(script)], launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2"))
    for rank in (0, 1):
        proc.wait_for(rf"\[rank={rank}\] ready")
    proc.signal(signal.SIGTERM)
    assert proc.finish() == 143
    for rank in (0, 1):
        assert proc.text.count(f"[rank={rank}] handler rank={rank} signal=SIGTERM\n") == 1, proc.text


def test_two_nodes_on_one_machine_form_one_job(tmp_path):
    script = write(tmp_path, "allreduce.py", ALLREDUCE)
    port = str(free_port())
    nodes = [Proc([*LAUNCHER, str(script)], launch_env(
        tmp_path, TRIALKIT_NUM_NODES="2", TRIALKIT_NODE_RANK=str(rank), TRIALKIT_CHIEF_ADDR="127.0.0.1",
        TRIALKIT_CHIEF_PORT=port, TRIALKIT_SLOTS_PER_NODE="1")) for rank in (0, 1)]
    for rank, node in enumerate(nodes):
        assert node.finish() == 0, node.err[-3000:]
        assert f"[rank={rank}] rank {rank} of 2 sum 3 " in node.text


def test_nested_keeper_launcher_profiler_workers(tmp_path):
    script = write(tmp_path, "allreduce.py", ALLREDUCE)
    # A profiler-like wrapper: it starts the worker as its own child, as nsys does.
    wrapper = write(tmp_path, "profile.py", """
    import os, subprocess, sys
    print(f"profiling {os.environ['RANK']}", flush=True)
    sys.exit(subprocess.call([sys.executable, *sys.argv[1:]]))
    """)
    proc = Proc([*KEEPER, *LAUNCHER, str(wrapper), str(script)], launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2"))
    assert proc.finish() == 0, proc.err[-3000:]
    for rank in (0, 1):
        assert f"[rank={rank}] profiling {rank}\n" in proc.text
        assert f"[rank={rank}] rank {rank} of 2 sum 3 " in proc.text


def test_an_engine_that_fails_before_any_worker_is_named(tmp_path):
    script = write(tmp_path, "allreduce.py", ALLREDUCE)
    proc = Proc([*LAUNCHER, "--no-such-torchrun-option", "--", str(script)], launch_env(tmp_path))
    assert proc.finish() == 2
    # torchrun's usage goes to its log, kept and named: the user sees one line.
    prefix = ("trialkit.launch.torch_distributed: torchrun refused the overrides --no-such-torchrun-option: "
              "run.py: error: unrecognized arguments: --no-such-torchrun-option (its output: ")
    assert len(proc.err_lines) == 1 and proc.err_lines[0].startswith(prefix), proc.err_lines
    log = proc.err_lines[0][len(prefix):-1]
    try:
        assert "usage:" in open(log).read()
    finally:
        os.unlink(log)
