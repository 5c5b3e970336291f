"""GPUs: the inventory from nvidia-smi, and the local platform giving each trial its own.

This machine has no GPU: a stand-in `nvidia-smi` on PATH (gpu_util) answers
the two queries from a table. The experiments are real: `trialkit run` with
its manager, keepers and trials, each trial logging the devices it was given
and when it ran.
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import requests

from experiment_util import cli, experiment, experiment_id, start_cli, stored
from gpu_util import fake_gpus, most_at_once, overlapping, runs, trial_script, uuid
from harness import wait_until
from launch_support import PY, Proc, launch_env, write
from web_util import Browser
from trialkit import env, gpus
from trialkit.control.config import parse_config
from trialkit.errors import UserError
from trialkit.launch import torch_distributed
from trialkit.platforms import ray as ray_platform
from trialkit.platforms.base import TrialSpec

SPACE = {"x": {"_type": "uniform", "_value": [0, 1]}}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def gpu_experiment(tmp_path: Path, log: Path, group: int, trials: int, concurrency: int, gate: Path = None,
                   name: str = "exp", top: dict = None, **local):
    """An experiment of `trials` logging trials; `top`: more top-level keys, `local`: the section's keys."""
    return experiment(tmp_path, SPACE, trial_script(log, group, gate), name=name, maxTrialNumber=trials,
                      trialConcurrency=concurrency, trialGpuNumber=local.pop("trialGpuNumber", 1),
                      trainingService={"platform": "local", **local}, **(top or {}))


def table(text: str) -> dict:
    """`trialkit trial list` as {trial id: {column: cell}}."""
    lines = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]
    return {cells[0]: dict(zip(lines[0], cells)) for cells in lines[2:]}


def run_to_end(config) -> str:
    done = cli("run", config)
    assert done.returncode == 0, done.stdout + done.stderr
    return experiment_id(done.stdout.splitlines()[0])


# -- the inventory -------------------------------------------------------------------------


def test_the_inventory_reads_both_queries_and_honours_cuda_visible_devices(tmp_path, monkeypatch):
    smi = fake_gpus(tmp_path, monkeypatch, 4)
    smi.set(apps=[[uuid(2), 4242], [uuid(2), 4343]], gpus=[[0, uuid(0), 16384, 10, 5], [1, uuid(1), 16384, 0, 0],
                                                             [2, uuid(2), 16384, 900, 87], [3, uuid(3), "[N/A]", 0, 0]])
    found = gpus.inventory()
    assert [(g.index, g.memory_total, g.memory_used, g.utilization, g.pids) for g in found] == [
        (0, 16384, 10, 5, ()), (1, 16384, 0, 0, ()), (2, 16384, 900, 87, (4242, 4343)), (3, None, 0, 0, ())]
    assert [g.index for g in gpus.inventory({"CUDA_VISIBLE_DEVICES": "3,1"})] == [3, 1]
    assert [g.index for g in gpus.inventory({"CUDA_VISIBLE_DEVICES": uuid(2)[:12]})] == [2]
    assert [g.index for g in gpus.inventory({"CUDA_VISIBLE_DEVICES": "1,-1,2"})] == [1]  # CUDA stops at -1
    assert gpus.inventory({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_no_nvidia_smi_means_no_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.inventory() == []


@pytest.mark.parametrize("change, what", [
    ({"fail": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."},
     "nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate"),
    ({"garble": "0, GPU-1, lots, 0, 0"}, "cannot read the answer of `nvidia-smi --query-gpu="),
    ({"apps": [["GPU-00000000-fake", "not a pid"]]}, "cannot read the answer of `nvidia-smi --query-compute-apps"),
])
def test_a_failing_or_garbled_nvidia_smi_is_one_user_error(tmp_path, monkeypatch, change, what):
    fake_gpus(tmp_path, monkeypatch, 2).set(**change)
    with pytest.raises(UserError) as caught:
        gpus.inventory()
    assert what in caught.value.line() and "\n" not in caught.value.line()
    assert caught.value.where == "nvidia-smi"


def test_at_start_an_experiment_is_refused_when_nvidia_smi_fails(tmp_path, monkeypatch):
    fake_gpus(tmp_path, monkeypatch, 2).set(fail="Failed to initialize NVML: Driver/library version mismatch")
    done = cli("run", gpu_experiment(tmp_path, tmp_path / "runs.log", 1, 2, 2))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "trialkit: error: nvidia-smi: nvidia-smi failed (exit 9): Failed to initialize NVML: Driver/library version "
        "mismatch (check the NVIDIA driver by running nvidia-smi yourself, or leave trialGpuNumber out)"]


@pytest.mark.parametrize("keys, what", [
    ({"trialGpuNumber": 5}, "trialGpuNumber: each trial asks for 5 GPUs but this machine holds 4 (0,1,2,3) "
                            "(set it to 4 or less)"),
    ({"trialGpuNumber": 2, "gpuIndices": "1"}, "each trial asks for 2 GPUs but gpuIndices holds 1 (1)"),
    ({"gpuIndices": [0, 7]}, "gpuIndices names GPU 7, which is not among this machine's usable GPUs (0,1,2,3)"),
])
def test_a_config_asking_for_more_gpus_than_the_pool_holds_is_refused_at_start(tmp_path, monkeypatch, keys, what):
    fake_gpus(tmp_path, monkeypatch, 4)
    done = cli("run", gpu_experiment(tmp_path, tmp_path / "runs.log", 1, 2, 2, **keys))
    assert done.returncode == 2 and what in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_gpu_trials_on_a_machine_without_nvidia_smi_are_refused_at_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(PY))  # python, and no nvidia-smi
    config = gpu_experiment(tmp_path, tmp_path / "runs.log", 1, 1, 1)
    done = cli("run", config)
    assert done.returncode == 2
    line = next(n for n, text in enumerate(open(config).read().splitlines(), 1) if text.startswith("trialGpuNumber:"))
    assert done.stderr.strip().splitlines() == [f"trialkit: error: {config}:{line}: trialGpuNumber: each trial asks for 1 GPU but this "
                                                "machine holds 0 (none) (leave it out)"]


# -- scheduling: real experiments ------------------------------------------------------------


def test_one_gpu_a_trial_never_more_trials_than_gpus_each_its_own(tmp_path, monkeypatch, home):
    fake_gpus(tmp_path, monkeypatch, 4)
    log, gate = tmp_path / "runs.log", tmp_path / "go"
    proc = start_cli("run", gpu_experiment(tmp_path, log, group=1, trials=8, concurrency=8, gate=gate))
    try:
        exp = experiment_id(proc.stdout.readline())
        # All eight are submitted at once (concurrency 8): four start, four wait for a GPU.
        wait_until(lambda: len(waiting_for_a_gpu(home, exp)) == 4, 60, "four trials to wait for a GPU")
        wait_until(lambda: len(list(Path(f"{log}.starts").iterdir())) == 4, 60, "four trials to start")
        assert sorted(waiting_for_a_gpu(home, exp)) == [f"{exp}-{n:05d}" for n in range(4, 8)]
        gate.touch()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        stop(proc)
    done = runs(log)
    assert len(done) == 8 and most_at_once(done) == 4
    assert all(len(r["devices"].split(",")) == 1 for r in done)
    assert all(a["devices"] != b["devices"] for a, b in overlapping(done))
    assert {r["devices"] for r in done} == {"0", "1", "2", "3"}
    assert all(r["nvidia"] == r["devices"] and r["order"] == "PCI_BUS_ID" and r["slots"] == "1" for r in done)


def waiting_for_a_gpu(home: Path, exp: str) -> list:
    """The trials the store shows WAITING for a GPU now."""
    return [trial for trial, in stored(home, exp, "SELECT id FROM trials WHERE status='WAITING' "
                                                  "AND reason LIKE 'waiting for 1 GPU%'")]


def stop(proc) -> None:
    """A control plane a test started: killed (SIGKILL) if it still runs, its pipes closed."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()


def test_two_trials_per_gpu_run_eight_at_once_two_on_each(tmp_path, monkeypatch):
    fake_gpus(tmp_path, monkeypatch, 4)
    log = tmp_path / "runs.log"
    run_to_end(gpu_experiment(tmp_path, log, group=8, trials=8, concurrency=8, maxTrialNumberPerGpu=2))
    done = runs(log)
    assert len(done) == 8 and all(r["barrier"] for r in done)
    assert most_at_once(done) == 8
    assert sorted(r["devices"] for r in done) == ["0", "0", "1", "1", "2", "2", "3", "3"]


def test_gpu_indices_limit_the_pool_and_trials_take_several(tmp_path, monkeypatch):
    fake_gpus(tmp_path, monkeypatch, 4)
    log = tmp_path / "runs.log"
    run_to_end(gpu_experiment(tmp_path, log, group=2, trials=4, concurrency=4, gpuIndices="1,3"))
    done = runs(log)
    assert all(r["barrier"] for r in done) and {r["devices"] for r in done} == {"1", "3"}
    assert all(a["devices"] != b["devices"] for a, b in overlapping(done))
    # Two GPUs a trial: both of the pool's, and the launchers' slots follow.
    log2 = tmp_path / "runs2.log"
    run_to_end(gpu_experiment(tmp_path, log2, group=1, trials=2, concurrency=2, gpuIndices=[1, 3], trialGpuNumber=2,
                              name="exp2"))
    assert [(r["devices"], r["slots"]) for r in runs(log2)] == [("1,3", "2"), ("1,3", "2")]
    assert not overlapping(runs(log2))


def test_a_gpu_another_process_uses_stays_free_unless_use_active_gpu(tmp_path, monkeypatch):
    smi = fake_gpus(tmp_path, monkeypatch, 4)
    stranger = psutil.Process().pid  # not started by the experiment
    smi.set(apps=[[uuid(2), stranger]])
    log = tmp_path / "runs.log"
    run_to_end(gpu_experiment(tmp_path, log, group=3, trials=6, concurrency=6))
    done = runs(log)
    assert all(r["barrier"] for r in done) and most_at_once(done) == 3
    assert {r["devices"] for r in done} == {"0", "1", "3"}
    log2 = tmp_path / "runs2.log"
    run_to_end(gpu_experiment(tmp_path, log2, group=4, trials=4, concurrency=4, useActiveGpu=True, name="exp2"))
    assert {r["devices"] for r in runs(log2)} == {"0", "1", "2", "3"}


def test_a_waiting_trial_can_be_killed_and_the_next_starts_when_the_other_process_leaves(tmp_path, monkeypatch,
                                                                                          home):
    smi = fake_gpus(tmp_path, monkeypatch, 1)
    smi.set(apps=[[uuid(0), psutil.Process().pid]])
    log = tmp_path / "runs.log"
    proc = start_cli("run", gpu_experiment(tmp_path, log, group=1, trials=2, concurrency=2))
    try:
        exp = experiment_id(proc.stdout.readline())
        first, second = f"{exp}-00000", f"{exp}-00001"
        wait_until(lambda: len(waiting_for_a_gpu(home, exp)) == 2, 60, "both trials to wait")
        reason = stored(home, exp, "SELECT reason FROM trials WHERE id=?", first)[0][0]
        assert reason == "waiting for 1 GPU: 0 of 1 free; GPU 0 busy with other processes (useActiveGpu: false)"
        killed = cli("trial", "kill", first)
        assert killed.returncode == 0, killed.stderr
        wait_until(lambda: stored(home, exp, "SELECT status FROM trials WHERE id=?", first) == [("USER_CANCELED",)],
                   60, "the killed trial to end")
        smi.set(fail="Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error")
        wait_until(lambda: "nvidia-smi failed (exit 9): Unable to determine" in cli("trial", "show", second).stdout,
                   60, "the waiting trial to say nvidia-smi fails")
        smi.set(fail=None, apps=[])  # nvidia-smi recovers, the other process has left: the trial starts
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        stop(proc)
    assert [(r["trial"], r["devices"]) for r in runs(log)] == [(second, "0")]


def test_max_trial_duration_counts_from_the_start_not_the_wait_for_a_gpu(tmp_path, monkeypatch, home):
    fake_gpus(tmp_path, monkeypatch, 1)
    log, gate = tmp_path / "runs.log", tmp_path / "go"
    limit = 4  # seconds; the second trial waits longer than this for the GPU, then runs well within it
    proc = start_cli("run", gpu_experiment(tmp_path, log, group=1, trials=2, concurrency=2, gate=gate,
                                           top={"maxTrialDuration": limit}))
    try:
        exp = experiment_id(proc.stdout.readline())
        wait_until(lambda: waiting_for_a_gpu(home, exp) == [f"{exp}-00001"], 60, "the second trial to wait")
        time.sleep(limit + 1)  # past the second trial's limit, had its clock started when it was submitted
        gate.touch()
        assert proc.wait(timeout=60) == 0, stored(home, exp, "SELECT id, status, reason FROM trials")
    finally:
        gate.touch()
        stop(proc)
    assert stored(home, exp, "SELECT status FROM trials ORDER BY sequence") == [("FAILED",), ("SUCCEEDED",)]


def test_zero_gpus_hides_every_gpu_and_no_key_leaves_them_alone(tmp_path, monkeypatch):
    fake_gpus(tmp_path, monkeypatch, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    log = tmp_path / "runs.log"
    run_to_end(gpu_experiment(tmp_path, log, group=1, trials=1, concurrency=1, trialGpuNumber=0))
    assert [(r["devices"], r["nvidia"]) for r in runs(log)] == [("", "void")]
    log2 = tmp_path / "runs2.log"
    run_to_end(experiment(tmp_path, SPACE, trial_script(log2), name="exp2", maxTrialNumber=1))
    assert [r["devices"] for r in runs(log2)] == ["1"]  # the control plane's own, untouched


def test_a_waiting_trial_shows_why_and_kill_9_of_a_keeper_frees_its_gpu(tmp_path, monkeypatch, home):
    smi = fake_gpus(tmp_path, monkeypatch, 1)
    smi.set(gpus=[[0, uuid(0), 16384, 900, 87]])
    log, gate = tmp_path / "runs.log", tmp_path / "go"
    proc = start_cli("run", gpu_experiment(tmp_path, log, group=1, trials=2, concurrency=2, gate=gate))
    try:
        exp = experiment_id(proc.stdout.readline())
        proc.stdout.readline()  # manager: ...
        page, token = proc.stdout.readline().split()[-1].split("#")[0].split("/?token=")
        first, second = f"{exp}-00000", f"{exp}-00001"
        trials = home / "experiments" / exp / "trials"
        wait_until(lambda: (trials / first / ".trialkit" / "keeper.pid").exists(), 60, "the first trial's keeper")
        wait_until(lambda: waiting_for_a_gpu(home, exp) == [second], 60, "the second to wait")
        assert "status         WAITING: waiting for 1 GPU: 0 of 1 free" in cli("trial", "show", second).stdout
        rows = requests.get(f"{page}/api/ui/experiments/{exp}/trials", headers={"Authorization": f"Bearer {token}"},
                            timeout=10).json()["rows"]
        assert {row["id"]: row["reason"] for row in rows}[second] == "waiting for 1 GPU: 0 of 1 free"  # the page's
        wait_until(lambda: table(cli("trial", "list", exp).stdout)[first]["status"] == "RUNNING", 60, "RUNNING")
        listed = table(cli("trial", "list", exp).stdout)
        assert (listed[first]["gpus"], listed[second]["gpus"]) == ("0", "-")
        assert (listed[second]["status"], listed[second]["why"]) == ("WAITING", "waiting for 1 GPU: 0 of 1 free")
        shown = cli("trial", "show", first).stdout
        assert "gpus           0\n" in shown
        assert "gpu use        0: 87% busy, 900 of 16384 MiB at " in shown  # as the trial found it
        smi.set(gpus=[[0, uuid(0), 16384, 15000, 55]])  # sampled again while it runs
        wait_until(lambda: "0: 55% busy, 15000 of 16384 MiB" in cli("trial", "show", first).stdout, 60,
                   "a later sample")
        keeper = int((trials / first / ".trialkit" / "keeper.pid").read_text().split()[0])
        os.kill(keeper, signal.SIGKILL)
        # The second trial starts on the GPU set free; the first, killed with its keeper, never passes the gate.
        wait_until(lambda: len(list(Path(f"{log}.starts").iterdir())) == 2, 60, "the second trial to start")
        gate.touch()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        gate.touch()
        stop(proc)
    assert [(r["trial"], r["devices"]) for r in runs(log)] == [(second, "0")]
    assert stored(home, exp, "SELECT status FROM trials ORDER BY sequence") == [("FAILED",), ("SUCCEEDED",)]


def test_the_trial_page_plots_its_gpus_use_as_sampled(tmp_path, monkeypatch, home):
    smi = fake_gpus(tmp_path, monkeypatch, 2)
    smi.set(gpus=[[0, uuid(0), 16384, 900, 87], [1, uuid(1), 16384, 0, 0]])
    log, gate = tmp_path / "runs.log", tmp_path / "go"
    proc = start_cli("run", gpu_experiment(tmp_path, log, group=1, trials=1, concurrency=1, gate=gate))
    browser = None
    try:
        exp = experiment_id(proc.stdout.readline())
        proc.stdout.readline()  # manager: ...
        page = proc.stdout.readline().split()[-1]
        trial_dir = home / "experiments" / exp / "trials" / f"{exp}-00000"
        wait_until(lambda: len(gpus.read_samples(str(trial_dir))) == 1, 60, "the first sample")
        smi.set(gpus=[[0, uuid(0), 16384, 15000, 55], [1, uuid(1), 16384, 0, 0]])
        wait_until(lambda: len(gpus.read_samples(str(trial_dir))) >= 2, 60, "a second sample")
        browser = Browser()
        browser.driver.get(f"{page.split('#')[0]}#/exp/{exp}/trial/{exp}-00000")
        wait_until(lambda: browser.driver.execute_script("return document.body.dataset.ready === 'trial'"), 60,
                   "the trial view")
        plotted = browser.driver.execute_script(
            "return document.getElementById('trial-gpus').data.map(t => [t.name, t.y.slice(0, 2)])")
        assert plotted == [["GPU 0 utilization %", [87, 55]], ["GPU 0 memory MiB", [900, 15000]]]
        gate.touch()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        gate.touch()
        stop(proc)
        if browser is not None:
            assert not browser.close()


def test_resume_keeps_the_running_trials_gpus_and_gives_none_twice(tmp_path, monkeypatch, home):
    fake_gpus(tmp_path, monkeypatch, 2)
    log, gate = tmp_path / "runs.log", tmp_path / "go"
    proc = start_cli("run", gpu_experiment(tmp_path, log, group=1, trials=4, concurrency=3, gate=gate))
    resumed = None
    try:
        exp = experiment_id(proc.stdout.readline())
        held = f"{exp}-00002"

        def times_held() -> int:
            return stored(home, exp, "SELECT COUNT(*) FROM statuses WHERE trial=? AND reason LIKE "
                                     "'waiting for 1 GPU%'", held)[0][0]

        wait_until(lambda: times_held() == 1, 60, "the third trial to wait")
        stop(proc)  # kill -9: the control plane dies; the two trials holding the GPUs run on
        resumed = start_cli("experiment", "resume", exp)
        wait_until(lambda: times_held() == 2, 60, "the third trial to wait again after the resume")
        gate.touch()
        assert resumed.wait(timeout=60) == 0, resumed.stderr.read()
    finally:
        gate.touch()
        stop(proc)
        if resumed is not None:
            stop(resumed)
    done = runs(log)
    assert len(done) == 4 and {r["devices"] for r in done} == {"0", "1"}
    assert all(a["devices"] != b["devices"] for a, b in overlapping(done))
    restarts = dict(stored(home, exp, "SELECT sequence, restart_count FROM trials"))
    assert restarts[0] == restarts[1] == 0  # reattached, not started again


# -- launchers: one worker per visible GPU ------------------------------------------------------

WORKER = """
import os
print("worker", os.environ["LOCAL_RANK"], os.environ["RANK"], os.environ["WORLD_SIZE"],
      os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
"""


def test_the_topology_counts_the_visible_gpus_when_no_slots_are_given():
    assert env.topology({"CUDA_VISIBLE_DEVICES": "2,5,7"}).slots_per_node == 3
    assert env.topology({"CUDA_VISIBLE_DEVICES": "2,5,7", "TRIALKIT_SLOTS_PER_NODE": "1"}).slots_per_node == 1
    assert env.topology({"CUDA_VISIBLE_DEVICES": ""}).slots_per_node == 1
    assert env.topology({"CUDA_VISIBLE_DEVICES": "0,-1,1"}).slots_per_node == 1  # CUDA stops at -1
    topo = env.topology({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"})
    assert torch_distributed.build_command(topo, [], ["-m", "x"])[5:7] == ["--nproc_per_node", "2"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_torch_distributed_starts_one_worker_per_visible_gpu(tmp_path):
    script = write(tmp_path, "worker.py", WORKER)
    proc = Proc([PY, "-m", "trialkit.launch.torch_distributed", str(script)],
                launch_env(tmp_path, CUDA_VISIBLE_DEVICES="2,5,7"))
    assert proc.finish() == 0, proc.err[-3000:]
    # As torchrun --nproc-per-node gpu: every worker sees every device, LOCAL_RANK picks its own.
    assert sorted(line for line in proc.text.splitlines() if "worker" in line) == [
        f"[rank={rank}] worker {rank} {rank} 3 2,5,7" for rank in range(3)]


# -- the config: GPU keys reach a platform that applies them, or are refused ----------------------

def config_error(**keys) -> UserError:
    # The config's folder is the code dir a Kubernetes trial is sent: an empty one, not this checkout.
    with tempfile.TemporaryDirectory() as folder, pytest.raises(UserError) as caught:
        parse_config(minimal_config(**keys), folder)
    return caught.value


def minimal_config(**keys):
    return {"searchSpace": SPACE, "trialCommand": "python3 train.py",
            "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}}, **keys}


def test_trial_gpu_number_is_the_platforms_and_gpu_options_need_it():
    local = parse_config(minimal_config(trialGpuNumber=2, trainingService={"platform": "local", "gpuIndices": "0,1"}))
    assert (local.training_service.trial_gpu_number, local.training_service.slots) == (2, 2)
    assert parse_config(local.to_dict()) == local
    err = config_error(trainingService={"platform": "local", "gpuIndices": "0,1"})
    assert (err.where, err.what) == ("trialGpuNumber", "trainingService.gpuIndices is set but trialGpuNumber is not, "
                                                       "so no GPU is scheduled")
    err = config_error(trainingService={"platform": "local", "maxTrialNumberPerGpu": 2})
    assert "maxTrialNumberPerGpu is set but trialGpuNumber is not" in err.what
    assert "reuseMode: true is not supported" in config_error(trainingService={"platform": "local",
                                                                              "reuseMode": True}).what
    parse_config(minimal_config(trainingService={"platform": "local", "reuseMode": False}))


def test_use_active_gpu_without_a_gpu_number_is_taken_as_nni_takes_it_with_a_note():
    """NNI's own examples (mnist-tfv2's launch.py, the python_api_start notebook) set it with no GPU number."""
    taken = parse_config(minimal_config(trainingService={"platform": "local", "useActiveGpu": True}))
    assert (taken.training_service.trial_gpu_number, taken.training_service.slots) == (None, 1)
    assert [note for note in taken.notes if note.startswith("useActiveGpu: true without trialGpuNumber: no GPU is "
                                                           "scheduled, as in NNI")] == list(taken.notes)
    assert len(taken.notes) == 1
    assert parse_config(minimal_config(trainingService={"platform": "local", "useActiveGpu": False})).notes == ()
    with_gpus = parse_config(minimal_config(trialGpuNumber=1, trainingService={"platform": "local",
                                                                              "useActiveGpu": True}))
    assert with_gpus.notes == ()


def test_on_kubernetes_trial_gpu_number_is_refused_for_the_roles_gpu_number():
    err = config_error(trialGpuNumber=1, trainingService={**K8S_SECTIONS["PyTorchJob"], "managerAddress": "10.0.0.2"})
    assert (err.where, err.what) == ("trialGpuNumber", "trialGpuNumber is not used on the kubeflow platform")
    assert "set gpuNumber for each role" in err.fix


def test_ray_asks_for_the_trials_gpus_and_zero_hides_them(tmp_path):
    config = parse_config(minimal_config(trialGpuNumber=2, trainingService={"platform": "ray"})).training_service
    assert ray_platform.actor_options(config) == {"num_cpus": 1.0, "num_gpus": 2.0}
    assert ray_platform.actor_options(parse_config(minimal_config(
        trainingService={"platform": "ray", "gpusPerTrial": 0.5})).training_service)["num_gpus"] == 0.5
    err = config_error(trialGpuNumber=2, trainingService={"platform": "ray", "gpusPerTrial": 1})
    assert "trialGpuNumber 2 and trainingService.gpusPerTrial 1 disagree" in err.what
    spec = TrialSpec("e", "e-00000", 0, "true")
    zero = parse_config(minimal_config(trialGpuNumber=0, trainingService={"platform": "ray"})).training_service
    assert ray_platform.Platform(zero, tmp_path)._environ(spec)["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in ray_platform.Platform(config, tmp_path)._environ(spec)  # Ray's own


# -- Kubernetes: each role's gpuNumber is its pods' nvidia.com/gpu limit, in every kind ------------

K8S_SECTIONS = {
    "PyTorchJob": {"platform": "kubeflow", "operator": "pytorch-operator", "dockerImage": "img:1",
                   "master": {"replicas": 1, "gpuNumber": 2}, "worker": {"replicas": 2, "gpuNumber": 1}},
    "TFJob": {"platform": "kubeflow", "operator": "tf-operator", "dockerImage": "img:1",
              "ps": {"replicas": 1, "gpuNumber": 0}, "worker": {"replicas": 2, "gpuNumber": 3}},
    "Framework": {"platform": "frameworkcontroller", "taskRoles": [
        {"name": "ps", "taskNumber": 1, "dockerImage": "img:1", "gpuNumber": 0},
        {"name": "worker", "taskNumber": 2, "dockerImage": "img:1", "gpuNumber": 4}]},
    "AdaptDLJob": {"platform": "adaptdl", "image": "img:1", "gpuNumber": 1},
}
# The GPUs each role's pods get, by the role's name as the rendered job spells it.
K8S_GPUS = {"PyTorchJob": {"Master": 2, "Worker": 1}, "TFJob": {"PS": 0, "Worker": 3},
            "Framework": {"ps": 0, "worker": 4}, "AdaptDLJob": {"": 1}}


def role_pods(job):
    """(role name, pod template) of each role of a rendered job."""
    spec = job["spec"]
    for key in ("pytorchReplicaSpecs", "tfReplicaSpecs"):
        for role, replica in spec.get(key, {}).items():
            yield role, replica["template"]
    for role in spec.get("taskRoles", []):
        yield role["name"], role["task"]["pod"]
    if "template" in spec:
        yield "", spec["template"]


@pytest.mark.parametrize("kind", sorted(K8S_SECTIONS))
def test_every_kubernetes_kind_limits_each_roles_pods_to_its_gpus(kind):
    from trialkit.platforms import load
    from trialkit.platforms.kubernetes import render as k8s

    section = {**K8S_SECTIONS[kind], "managerAddress": "10.0.0.2"}
    config = load(section["platform"]).parse_section(section, "trainingService")
    objects = k8s.render_trial(config, TrialSpec("exp1", "exp1-00000", 0, "python3 train.py"))
    job = next(o for o in objects if o["kind"] == kind)
    seen = {}
    for role, pod in role_pods(job):
        trial = next(c for c in pod["spec"]["containers"] if c.get("command") == k8s.RUN_COMMAND)
        resources = trial.get("resources", {})
        seen[role] = int(resources.get("limits", {}).get("nvidia.com/gpu", 0))
        # Kubernetes requires a GPU request to equal its limit.
        assert resources.get("requests", {}).get("nvidia.com/gpu") == resources.get("limits", {}).get("nvidia.com/gpu")
    assert seen == K8S_GPUS[kind]
