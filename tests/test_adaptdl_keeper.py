"""AdaptDL under the keeper: the environment its library reads, and the whole
path with the real library: run.sh -> keeper -> training on the CPU with gloo;
cleanup.sh in the middle; the checkpoint is written, the keeper exits 143 and
records PREEMPTED; the next run (restart count + 1) resumes from that
checkpoint at the same epoch and the next sample."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal

import pytest

from keeper_util import PYTHON, ROOT, cleanup_sh, keeper, kill_group, numbers_after, py, run_sh, status, trial_dir


EXAMPLE = ROOT / "examples" / "adaptdl" / "train.py"
SAMPLES = 512  # the example's dataset
BATCH = re.compile(rb"^epoch (\d+) samples (\d+)-(\d+) size (\d+)", re.M)
EPOCH_DONE = re.compile(rb"^epoch (\d+) done: (\d+) trained this epoch, (\d+) in all", re.M)


def batches(out: bytes) -> list:
    """(epoch, first sample, last sample, size) of every batch the trial printed."""
    return [tuple(int(n) for n in m.groups()) for m in BATCH.finditer(out)]


def test_the_trial_gets_adaptdls_environment(trial_env, tmp_path):
    env = {**trial_env, "TRIALKIT_EXPERIMENT_ID": "exp", "TRIALKIT_TRIAL_ID": "t3",
           "TRIALKIT_TENSORBOARD_DIR": str(tmp_path / "tb"), "TRIALKIT_RESTART_COUNT": "2"}
    k = keeper(py("""
        import json, os
        print(json.dumps({k: v for k, v in os.environ.items() if "ADAPTDL" in k or k == "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}))
    """), env)
    assert k.wait() == 0
    seen = json.loads(k.stdout)
    home = trial_dir(env)
    assert seen == {
        "ADAPTDL_CHECKPOINT_PATH": str(home / "checkpoint"),
        "ADAPTDL_SHARE_PATH": str(home / "share"),
        "ADAPTDL_TENSORBOARD_LOGDIR": str(tmp_path / "tb"),
        "ADAPTDLCTL_TENSORBOARD_LOGDIR": str(tmp_path / "tb"),
        "ADAPTDL_NUM_RESTARTS": "2",
        "ADAPTDL_JOB_ID": "exp/t3",
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
    }
    assert (home / "checkpoint").is_dir() and (home / "share").is_dir()


def test_the_job_keeps_the_name_adaptdls_scheduler_gave_it(trial_env):
    # In an AdaptDLJob's pod the scheduler's controller sets ADAPTDL_JOB_ID to the job's namespace/name: the
    # supervisor finds replica 0 and takes the trainer's hints by it, so the keeper must pass it on.
    env = {**trial_env, "TRIALKIT_EXPERIMENT_ID": "exp", "TRIALKIT_TRIAL_ID": "t3", "ADAPTDL_JOB_ID": "team/tk-exp-t3"}
    show = py("""
        import os
        print(os.environ["ADAPTDL_JOB_ID"])
    """)
    k = keeper(show, {**env, "TRIALKIT_PLATFORM": "adaptdl"})
    assert k.wait() == 0
    assert k.stdout.strip() == b"team/tk-exp-t3"
    # Elsewhere the name is trialkit's (adaptdl-ray's supervisor knows its trainers by it), whatever was inherited.
    k = keeper(show, {**env, "TRIALKIT_PLATFORM": "local"})
    assert k.wait() == 0
    assert k.stdout.strip() == b"exp/t3"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("adaptdl") is None, reason="needs the adaptdl extra")
@pytest.mark.parametrize("stop", ["cleanup.sh", "Ctrl-C"])
def test_preempted_by_cleanup_then_resumed_from_the_checkpoint(trial_env, stop):
    env = {**trial_env, "TRIALKIT_PYTHON": PYTHON, "TRIALKIT_GRACE_SECONDS": "30",
           "TRIALKIT_EXPERIMENT_ID": "e2e", "TRIALKIT_TRIAL_ID": "adaptdl"}
    command = [PYTHON, str(EXAMPLE), "--epochs", "3", "--step-seconds", "0.02"]

    first = run_sh(env, *command)
    first.expect(b"epoch 1 samples")  # training is in epoch 1: the pod is deleted now (or the keeper Ctrl-C'd)
    if stop == "cleanup.sh":
        assert cleanup_sh(env).returncode == 0
    else:
        first.signal(signal.SIGINT)
    assert first.wait() == 143, first.stderr[-3000:]
    assert status(env)["status"] == "PREEMPTED" and status(env)["exit_code"] == 143
    assert (trial_dir(env) / "checkpoint" / "checkpoint-0").is_dir()
    assert b"training done" not in first.stdout
    before = batches(first.stdout)
    last_epoch, _, last_sample, _ = before[-1]

    second = run_sh({**env, "TRIALKIT_RESTART_COUNT": "1"}, *command)
    assert second.wait() == 0, second.stderr[-3000:]
    assert status(env)["status"] == "SUCCEEDED" and status(env)["restart_count"] == 1
    assert b"training done" in second.stdout
    after = batches(second.stdout)

    # The data position continues: the next sample, in the same epoch (or the
    # next epoch's first sample when the checkpoint fell on an epoch's end).
    epoch, first_sample, _, _ = after[0]
    assert first_sample == (last_sample + 1) % SAMPLES
    assert epoch == last_epoch or (first_sample == 0 and epoch == last_epoch + 1)
    # The Accumulator came back too: its totals at the end of that epoch count
    # the batches of both runs, each once, as the example's docstring says to check them (not epochs x 512:
    # AdaptDL's epoch can run past the data's end).
    done = {int(e): (int(this), int(total)) for e, this, total in EPOCH_DONE.findall(second.stdout)}
    seen = sum(size for *_, size in before) + sum(size for e, *_, size in after if e <= epoch)
    this_epoch = sum(size for e, *_, size in before + after if e == epoch)
    assert done[epoch] == (this_epoch, seen), (done, this_epoch, seen)


@pytest.mark.skipif(importlib.util.find_spec("adaptdl") is None, reason="needs the adaptdl extra")
def test_periodic_checkpoints_hook_the_trials_python_unless_turned_off(trial_env):
    show = py("""
        import json, os
        import adaptdl.torch.data, adaptdl.reducer
        print(json.dumps({"every": os.environ["TRIALKIT_CHECKPOINT_EVERY"],
                          "path": os.environ["PYTHONPATH"].split(os.pathsep),
                          "flag": adaptdl.torch.data.get_exit_flag.__qualname__,
                          "reducer_sleeps": type(adaptdl.reducer.time).__name__}))
    """)
    boot = str(ROOT / "trialkit" / "adaptdl" / "boot")
    shims = str(ROOT / "trialkit" / "shims" / "boot")  # trialkit's fallback packages (nni), always there
    k = keeper(show, trial_env)
    assert k.wait() == 0, k.stderr
    assert json.loads(k.stdout) == {"every": "600", "path": [boot, shims, *trial_env["PYTHONPATH"].split(os.pathsep)],
                                    "flag": "Periodic.exit_flag", "reducer_sleeps": "_QuickRetry"}
    k = keeper(show, {**trial_env, "TRIALKIT_CHECKPOINT_EVERY": "0"})
    assert k.wait() == 0, k.stderr
    assert json.loads(k.stdout) == {"every": "0", "path": [shims, *trial_env["PYTHONPATH"].split(os.pathsep)],
                                    "flag": "get_exit_flag", "reducer_sleeps": "module"}


def test_the_hook_still_runs_the_sitecustomize_it_shadows(trial_env, tmp_path):
    own = tmp_path / "site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import sys\nsys.own_sitecustomize = 'ran'\n")  # this process only
    env = {**trial_env, "PYTHONPATH": trial_env["PYTHONPATH"] + os.pathsep + str(own)}
    k = keeper(py("""
        import sys
        print(getattr(sys, "own_sitecustomize", None), sys.modules["sitecustomize"].HOOKED)
    """), env)
    assert k.wait() == 0, k.stderr
    assert k.stdout.split() == [b"ran", b"adaptdl.torch.data"]


# A wrapper of the example: one more State, whose third save under restart 0
# writes half its data and then blocks, so that the test can SIGKILL the trial in the middle of
# writing a checkpoint. The training code itself is the example, unchanged.
TORN = '''
import runpy
import sys
import time

import adaptdl.checkpoint
import adaptdl.env

TRAIN = sys.argv.pop(1)


class TornOnThirdSave(adaptdl.checkpoint.State):
    saves = 0

    def save(self, fileobj):
        self.saves += 1
        fileobj.write(b"half of it")
        if self.saves == 3 and adaptdl.env.num_restarts() == 0:
            fileobj.flush()
            print("blocked in the middle of a checkpoint", flush=True)
            time.sleep(3600)


TornOnThirdSave("torn")
sys.argv[0] = TRAIN
runpy.run_path(TRAIN, run_name="__main__")
'''


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("adaptdl") is None, reason="needs the adaptdl extra")
def test_a_trial_killed_while_writing_a_checkpoint_resumes_from_the_previous_one(trial_env, tmp_path):
    (tmp_path / "torn.py").write_text(TORN)
    env = {**trial_env, "TRIALKIT_PYTHON": PYTHON, "TRIALKIT_CHECKPOINT_EVERY": "1",
           "TRIALKIT_EXPERIMENT_ID": "e2e", "TRIALKIT_TRIAL_ID": "torn"}
    command = [PYTHON, str(tmp_path / "torn.py"), str(EXAMPLE), "--epochs", "8", "--step-seconds", "0.02"]

    first = run_sh(env, *command)
    first.expect(b"trialkit: checkpoint at step", "stderr")
    # The second replaces the first under the same restart count (AdaptDL's own save cannot).
    saved = numbers_after(first.expect(b"trialkit: checkpoint at step", "stderr"), b"step")[0]
    first.expect(b"blocked in the middle of a checkpoint")
    kill_group(status(env)["pid"])  # the training process, SIGKILLed mid-write
    assert first.wait() == 137, first.stderr[-3000:]
    checkpoints = trial_dir(env) / "checkpoint"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["_checkpoint", "checkpoint-0"]
    assert (checkpoints / "_checkpoint" / "torn").read_bytes() == b"half of it"  # the torn one, aside
    before = batches(first.stdout)

    second = run_sh({**env, "TRIALKIT_RESTART_COUNT": "1"}, *command)
    assert second.wait() == 0, second.stderr[-3000:]
    assert f"trialkit: resuming at step {saved}\n".encode() in second.stderr
    after = batches(second.stdout)
    # The data position is the one of the checkpoint before the torn one: the
    # next batch after its step, not a later one.
    assert after[0][:2] == before[saved][:2], (before[saved - 1:saved + 2], after[:2])
    assert b"training done" in second.stdout
