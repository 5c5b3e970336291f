"""An object store that fails, as a user meets it: no credentials, no bucket, no answer, a checkpoint the
store lost. Against moto's real S3 server on loopback (tests/s3_server.py), the real CLI and keeper.

Nothing the user did may be lost for the store's sake: a store that cannot be used is refused at the start
in one line (exit 2) with everything left as it was, and a trial whose checkpoint the store cannot give back
waits (PREEMPTED) while the experiment stops saying why, to be resumed once the store is fixed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import obstore
import pytest
from obstore.store import S3Store
import yaml

from experiment_util import cli, experiment_id, export, reported, start_cli, stored, trial_status
from harness import wait_until
from s3_server import S3Server, s3, s3_server  # noqa: F401 - fixtures
from test_checkpoints import nni_config, one_line_error
from trialkit.checkpoints import noted_stored

WAIT = 120.0  # an upper bound for a loaded machine; never waited for on success


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def no_credentials() -> dict:
    """This environment as a fresh shell has it: no AWS variables at all."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}


def detached_and_paused(home: Path, config: Path) -> tuple:
    """`trialkit run CONFIG --detach`, its trial paused once it reported 3 steps: (experiment id, trial id)."""
    started = cli("run", config, "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    exp = experiment_id(started.stdout.splitlines()[0])
    trial = f"{exp}-00000"
    wait_until(lambda: reported(home, trial) >= 3, WAIT, "3 intermediate results")
    assert cli("trial", "pause", trial).returncode == 0
    wait_until(lambda: trial_status(home, trial) == "PREEMPTED", WAIT, "the pause")
    return exp, trial


def experiment_status(home: Path, exp: str) -> str:
    return stored(home, exp, "SELECT status FROM experiments WHERE id=?", exp)[0][0]


def interrupted(home: Path, config: Path) -> str:
    """`trialkit run CONFIG`, Ctrl-C once its trial reported 3 steps: it stops with its checkpoint stored."""
    proc = start_cli("run", config)
    try:
        exp = experiment_id(proc.stdout.readline())
        wait_until(lambda: reported(home, f"{exp}-00000") >= 3, WAIT, "3 intermediate results")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert trial_status(home, f"{exp}-00000") == "PREEMPTED", out + err
    return exp


def test_resuming_with_a_store_that_fails_leaves_the_experiment_resumable(tmp_path, home, s3):
    """The user's Ctrl-C, then `experiment resume` from a shell without the store's credentials: refused in one
    line, nothing changed. Then with credentials but the stored checkpoint damaged (a file of it gone): the trial
    waits PREEMPTED and the experiment stops (ERROR, saying why), not DONE. Its file back: resume finishes it."""
    bucket = s3.bucket()
    exp = interrupted(home, nni_config(tmp_path, {"type": "s3", "bucket": bucket, "endpointUrl": s3.url}))
    trial = f"{exp}-00000"
    before = experiment_status(home, exp)

    refused = cli("experiment", "resume", exp, env=no_credentials())
    one_line_error(refused, "checkpointStorage", "no AWS credentials found", "AWS_ACCESS_KEY_ID")
    assert (trial_status(home, trial), experiment_status(home, exp)) == ("PREEMPTED", before)
    listed = cli("checkpoint", "list", exp, env=no_credentials())
    one_line_error(listed, "no AWS credentials found")
    assert "169.254" not in listed.stderr

    # The store lost a file of the checkpoint, and this node has no copy: the restore fails for the store's sake.
    [ckpt] = json.loads(cli("checkpoint", "list", exp, "--json").stdout)
    key = f"{exp}/{trial}/{ckpt['uuid']}/model/state.txt"
    bucket_store = S3Store(bucket, config={"endpoint": s3.url}, client_options={"allow_http": True})
    saved = bytes(obstore.get(bucket_store, key).bytes())
    obstore.delete(bucket_store, key)
    shutil.rmtree(Path(export(exp)[0]["trial_dir"]) / "checkpoint")
    failed = cli("experiment", "resume", exp, timeout=WAIT)
    assert failed.returncode != 0, failed.stdout + failed.stderr
    assert trial_status(home, trial) == "PREEMPTED" and experiment_status(home, exp) != "DONE"
    assert "checkpoint could not be restored" in failed.stdout and "model/state.txt" in failed.stdout, failed.stdout
    assert f"trialkit experiment resume {exp}" in failed.stdout
    log = (Path(export(exp)[0]["trial_dir"]) / "trial.log").read_text()
    assert log.count("does not exist (NoSuchKey)") == 1, log  # said once, not echoed

    obstore.put(bucket_store, key, saved)
    done = cli("experiment", "resume", exp, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    row = export(exp)[0]
    assert row["status"] == "SUCCEEDED" and row["final"] == 30 and row["intermediate"] == list(range(1, 31))


@pytest.mark.parametrize("fault", ["no bucket", "no answer", "no credentials"])
def test_run_refuses_a_store_it_cannot_use_before_anything_starts(tmp_path, home, s3, fault):
    """`trialkit run` checks the store once (a listing, a few seconds at most): one line, exit 2, saying what is
    wrong in the user's words; no experiment is made."""
    storage = {"type": "s3", "bucket": s3.bucket(), "endpointUrl": s3.url}
    env = None
    if fault == "no bucket":
        storage["bucket"] = "no-such-bucket-here"
        words = ("bucket 'no-such-bucket-here' does not exist",)
    elif fault == "no answer":
        storage["endpointUrl"] = "http://127.0.0.1:9"  # the discard port: nothing listens
        words = ("s3://", "http://127.0.0.1:9 refused the connection", "check the endpoint")
    else:
        env = no_credentials()
        words = ("no AWS credentials found",)
    started = time.monotonic()
    done = cli("run", nni_config(tmp_path, storage), env=env)
    one_line_error(done, "checkpointStorage", *words)
    assert time.monotonic() - started < 30
    assert "<?xml" not in done.stderr and "169.254" not in done.stderr
    assert not (home / "experiments").exists() or not any((home / "experiments").iterdir())


def test_version_lists_the_cloud_library_beside_the_engines():
    """A user reporting a store's fault says which obstore spoke: `trialkit --version` lists it."""
    from importlib import metadata

    done = cli("--version")
    assert done.returncode == 0, done.stderr
    assert ["obstore", metadata.version("obstore")] in [line.split() for line in done.stdout.splitlines()]


STALLED_TRIAL = """
import pathlib, time
import determined as det
go = pathlib.Path({go!r})
with det.core.init() as core:
    for step in range(1, 4):
        core.train.report_validation_metrics(steps_completed=step, metrics={{"x": step}})
        with core.checkpoint.store_path({{"steps_completed": step}}) as (path, uuid):
            (path / "state").write_text(str(step))
        while step == 1 and not go.exists():  # the test freezes the store meanwhile
            time.sleep(0.05)
"""


def test_checkpoints_the_store_never_got_are_said_kept_and_listed(tmp_path, home, s3, monkeypatch):
    """The store frozen (SIGSTOP of moto) after the first of three Core API checkpoints is stored, with
    TRIALKIT_CHECKPOINT_TRANSFER_SECONDS=3: the trial's reason and the run's output say that 2 were not stored
    and where they are; both stay in the trial's checkpoint dir, and `checkpoint list` shows them as such, kept
    by no retention pass."""
    bucket = s3.bucket()
    go = tmp_path / "go"
    config = {"name": "stalled", "entrypoint": "python3 train.py", "max_restarts": 0,
              "hyperparameters": {"table": 0}, "searcher": {"name": "single", "metric": "x"},
              "checkpoint_storage": {"type": "s3", "bucket": bucket, "endpoint_url": s3.url}}
    folder = tmp_path / "context"
    folder.mkdir()
    (folder / "train.py").write_text(STALLED_TRIAL.format(go=str(go)))
    (folder / "exp.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("TRIALKIT_CHECKPOINT_TRANSFER_SECONDS", "3")
    proc = start_cli("run", folder / "exp.yaml", folder)
    frozen = False
    try:
        exp = experiment_id(proc.stdout.readline())
        trial = f"{exp}-00000"
        wait_until(lambda: any(k.endswith(".checkpoint.json") for k in s3.objects(bucket)), WAIT,
                   "the first checkpoint stored")
        s3.proc.send_signal(signal.SIGSTOP)
        frozen = True
        go.touch()
        wait_until(lambda: trial_status(home, trial) not in (None, "WAITING", "RUNNING"), WAIT, "the trial's end")
        s3.proc.send_signal(signal.SIGCONT)
        frozen = False
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if frozen:
            s3.proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    row = export(exp)[0]
    checkpoint_dir = Path(row["trial_dir"]) / "checkpoint"
    said = "2 checkpoints not stored in the object store: the uploader did not finish within 3 s"
    assert row["status"] == "SUCCEEDED" and said in row["reason"] and str(checkpoint_dir) in row["reason"], row
    assert said in out, out
    listed = json.loads(cli("checkpoint", "list", exp, "--json").stdout)
    local = [c for c in listed if c["where"].startswith(str(checkpoint_dir))]
    assert [c["steps"] for c in local] == [2, 3], listed
    assert all(c["kept_by"] == ["not stored: only in its trial's checkpoint dir"] for c in local)
    assert all((Path(c["where"]) / "state").read_text() == str(c["steps"]) for c in local)
    assert [c["steps"] for c in listed if c["where"].startswith(f"s3://{bucket}/")] == [1]


def test_a_checkpoint_gone_from_the_store_holds_the_trial_back(tmp_path, home, s3):
    """The user's Ctrl-C stored the trial's checkpoint; then the whole of it (manifest and files) went from the
    store (deleted, or the store emptied) and this node has no copy. `experiment resume` does not start the
    trial from step 0: it waits PREEMPTED, the experiment stops saying why and how to go on. Put back, the
    checkpoint resumes it where it was."""
    bucket = s3.bucket()
    exp = interrupted(home, nni_config(tmp_path, {"type": "s3", "bucket": bucket, "endpointUrl": s3.url}))
    trial = f"{exp}-00000"
    bucket_store = S3Store(bucket, config={"endpoint": s3.url}, client_options={"allow_http": True})
    saved = {meta["path"]: bytes(obstore.get(bucket_store, meta["path"]).bytes())
             for page in obstore.list(bucket_store, prefix=f"{exp}/{trial}/") for meta in page}
    assert saved
    for key in saved:
        obstore.delete(bucket_store, key)
    shutil.rmtree(Path(export(exp)[0]["trial_dir"]) / "checkpoint")

    failed = cli("experiment", "resume", exp, timeout=WAIT)
    assert failed.returncode != 0, failed.stdout + failed.stderr
    assert trial_status(home, trial) == "PREEMPTED" and experiment_status(home, exp) == "ERROR"
    assert "its checkpoint is not in" in failed.stdout, failed.stdout
    assert f"trialkit experiment resume {exp}" in failed.stdout
    assert reported(home, trial) < 30  # it never ran on from nothing

    for key, data in saved.items():
        obstore.put(bucket_store, key, data)
    done = cli("experiment", "resume", exp, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    row = export(exp)[0]
    assert row["status"] == "SUCCEEDED" and row["final"] == 30 and row["intermediate"] == list(range(1, 31))


def test_a_store_gone_at_activate_ends_the_experiment_at_once_saying_it_once(tmp_path, home, monkeypatch):
    """A detached run, its trial paused (its checkpoint stored), the store stopped, `trial activate`: the trial
    waits PAUSED (exit 75) and the experiment is ERROR as soon as the trial has ended, not a retention pass
    against the dead store later, and manager.log says nothing twice (newcomer23: the "checkpoints were not
    collected" warning twice, and RUNNING some 15 s after the trial ended)."""
    server = S3Server()  # its own: this test stops it
    try:
        for key, value in (("AWS_ACCESS_KEY_ID", server.access_key), ("AWS_SECRET_ACCESS_KEY", server.secret_key),
                           ("AWS_REGION", "us-east-1")):
            monkeypatch.setenv(key, value)
        config = nni_config(tmp_path, {"type": "s3", "bucket": server.bucket(), "endpointUrl": server.url})
        exp, trial = detached_and_paused(home, config)
    finally:
        server.stop()
    shutil.rmtree(Path(export(exp)[0]["trial_dir"]) / "checkpoint")  # this node has no copy
    assert cli("trial", "activate", trial).returncode == 0
    wait_until(lambda: trial_status(home, trial) == "PREEMPTED" and "could not be restored" in (stored(
        home, exp, "SELECT reason FROM trials WHERE id=?", trial)[0][0] or ""), WAIT, "the failed restore")
    ended = time.monotonic()
    wait_until(lambda: experiment_status(home, exp) != "RUNNING", WAIT, "the experiment's end")
    assert time.monotonic() - ended < 5 and experiment_status(home, exp) == "ERROR"
    log = (home / "experiments" / exp / "manager.log").read_text()
    lines = [line for line in log.splitlines() if line.strip()]
    # (A pass that ran as the pause ended may have met the store going down: said once, then.)
    assert len(lines) == len(set(lines)) and log.count("checkpoints were not collected") <= 1, log


SAVES_EACH_STEP = """
import os, time, trialkit
state = os.path.join(trialkit.checkpoint_dir(), "state.txt")
step = int(open(state).read()) if os.path.exists(state) else 0
print("starting from", step, flush=True)
while step < 30:
    step += 1
    trialkit.report_intermediate_result(step)
    open(state, "w").write(str(step))
    time.sleep(0.2)
trialkit.report_final_result(step)
"""


def test_activate_says_a_trial_whose_checkpoint_the_store_holds_resumes_from_it(tmp_path, home, s3):
    """A detached run, its trial paused (a script that saves each step and dies of the SIGTERM: the uploader
    stores its dir), this node's copy removed, `trial activate`: it says the trial resumes from its checkpoint,
    and the keeper's restore resumes it there (newcomer25: "queued to start from the beginning (it holds no
    checkpoint)", then "starting from 6")."""
    config = nni_config(tmp_path, {"type": "s3", "bucket": s3.bucket(), "endpointUrl": s3.url})
    (config.parent / "trial.py").write_text(SAVES_EACH_STEP)
    exp, trial = detached_and_paused(home, config)
    trial_dir = Path(export(exp)[0]["trial_dir"])
    wait_until(lambda: noted_stored(trial_dir), WAIT, "the checkpoint stored")
    (trial_dir / "checkpoint" / "state.txt").unlink()  # this node's copy is gone; the store has it

    activated = cli("trial", "activate", trial)
    assert activated.stdout == f"activated trial {trial}: queued to resume from its checkpoint\n", activated.stdout
    wait_until(lambda: experiment_status(home, exp) != "RUNNING", WAIT, "the experiment's end")
    assert trial_status(home, trial) == "SUCCEEDED"
    starts = [line for line in (trial_dir / "stdout.log").read_text().splitlines() if line.startswith("starting")]
    assert starts[0] == "starting from 0" and starts[-1] != "starting from 0", starts
