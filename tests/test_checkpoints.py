"""Checkpoints in object storage, against a real S3 protocol server on loopback (moto's, tests/s3_server.py).

Each test is what a user does: a Determined or NNI config whose checkpoints
go to S3, `trialkit run`, pause and activate, `trialkit checkpoint ...`; and
what a fault does: an upload killed half way. What is asserted is what the
user (or the bucket itself, read with moto's own listing) would see.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from experiment_util import RESUMABLE, cli, experiment_id, export, paused_and_activated, reported, start_cli
from harness import wait_until
from s3_server import create_secret, kubeflow_config, s3, s3_server  # noqa: F401 - fixtures

FIXTURES = Path(__file__).parent / "fixtures" / "determined"
WAIT = 120.0  # an upper bound for a loaded machine; never waited for on success


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def s3_storage(s3, bucket: str, **keys) -> dict:
    return {"type": "s3", "bucket": bucket, "endpoint_url": s3.url, "prefix": "team/runs", **keys}


def context(tmp_path: Path, config: dict, script: str, name: str = "2_checkpoints.py") -> Path:
    """A Determined context dir outside TRIALKIT_HOME: the script and exp.yaml."""
    folder = tmp_path / "context"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(script)
    (folder / "exp.yaml").write_text(yaml.safe_dump(config))
    return folder


def stage_2(s3, bucket: str, **storage) -> dict:
    config = yaml.safe_load((FIXTURES / "2_checkpoints.yaml").read_text())
    config["checkpoint_storage"] = s3_storage(s3, bucket, **storage)
    return config


def manifests(s3, bucket: str) -> list:
    return [key for key in s3.objects(bucket) if key.endswith(".checkpoint.json")]


def training(row: dict) -> list:
    return [r["steps_completed"] for r in row["intermediate"] if r["group"] == "training"]


# ---------------------------------------------------------------- resume anywhere


def test_a_paused_core_api_trial_resumes_from_the_object_store_with_its_local_copy_gone(tmp_path, home, s3):
    """Determined's tutorial, stage 2, unchanged, with checkpoint_storage of type s3: paused after 20 batches, its
    trial dir's checkpoints deleted (a new node or pod has none), activated: it goes on from the stored one."""
    bucket = s3.bucket()
    folder = context(tmp_path, stage_2(s3, bucket), (FIXTURES / "2_checkpoints.py").read_text())

    def while_paused(exp: str, trial: str) -> tuple:
        paused = json.loads(cli("experiment", "export", exp, "--all-runs").stdout)[0]
        # Stored before the keeper said PREEMPTED: the checkpoint of the last step, whole, in the bucket.
        done = cli("checkpoint", "list", trial, "--json")
        assert done.returncode == 0, done.stderr
        latest = json.loads(done.stdout)[-1]
        assert latest["steps"] == training(paused)[-1] and latest["where"].startswith(f"s3://{bucket}/team/runs/")
        assert f"team/runs/{exp}/{trial}/{latest['uuid']}.checkpoint.json" in s3.objects(bucket)
        shutil.rmtree(Path(paused["trial_dir"]) / "checkpoint")
        return training(paused)[-1], latest["uuid"]

    exp, (stopped_at, uuid) = paused_and_activated(home, [folder / "exp.yaml", folder], 2, while_paused)
    trial = f"{exp}-00000"
    runs = {row["run"]: row for row in json.loads(cli("experiment", "export", exp, "--all-runs").stdout)}
    # Run 1 began where the stored checkpoint left off: no batch twice, x carried on (x == steps).
    assert training(runs[1]) == list(range(stopped_at + 10, 101, 10))
    assert [r["metrics"]["x"] for r in runs[1]["intermediate"] if r["group"] == "training"] == training(runs[1])
    assert runs[1]["status"] == "SUCCEEDED" and runs[1]["final"] == 100
    log = (Path(runs[1]["trial_dir"]) / "trial.log").read_text()
    assert f"restored checkpoint {uuid}" in log
    # Determined's defaults kept one (the latest is also the best: the validation at 100): nothing else is left.
    left = json.loads(cli("checkpoint", "list", exp, "--json").stdout)
    assert [(c["steps"], c["kept_by"]) for c in left] == [(100, ["trial latest", "trial best"])]
    assert len(manifests(s3, bucket)) == 1
    assert sorted(s3.objects(bucket)) == sorted(f"team/runs/{exp}/{trial}/{left[0]['uuid']}{tail}"
                                                for tail in (".checkpoint.json", "/metadata.json", "/state"))
    assert_no_credentials(s3, bucket, home)


def test_a_checkpoint_names_the_run_that_saved_it_in_the_trials_own_dir(tmp_path, home):
    """The tutorial's stage 2 with its checkpoints in the trial's dir (no checkpoint_storage): one saved before the
    pause is run 0's, the one saved after activate run 1's, in `checkpoint list/show` and on the trial page, as
    the export numbers the runs."""
    folder = context(tmp_path, yaml.safe_load((FIXTURES / "2_checkpoints.yaml").read_text()),
                     (FIXTURES / "2_checkpoints.py").read_text())

    def while_paused(exp: str, trial: str) -> list:
        return [c["run"] for c in json.loads(cli("checkpoint", "list", trial, "--json").stdout)]

    exp, paused = paused_and_activated(home, [folder / "exp.yaml", folder], 2, while_paused)
    trial = f"{exp}-00000"
    assert paused and set(paused) == {0}
    runs = {row["run"]: training(row) for row in json.loads(cli("experiment", "export", exp, "--all-runs").stdout)}
    (left,) = json.loads(cli("checkpoint", "list", exp, "--json").stdout)  # the latest, also the best
    assert left["steps"] == runs[1][-1] == 100 and left["run"] == 1
    assert f"trial      {trial} (run 1)" in cli("checkpoint", "show", exp, left["uuid"]).stdout
    (row,) = trial_page_checkpoints(exp, trial, "Kept in the trials' checkpoint dirs.")
    assert row[:3] == [left["uuid"], "1", "100"]


def assert_no_credentials(s3, bucket: str, home: Path) -> None:
    """Neither key is in any file trialkit wrote (the store, logs, status files, spools) nor in the bucket."""
    secrets = (s3.access_key.encode(), s3.secret_key.encode())
    files = [path for path in home.rglob("*") if path.is_file()]
    assert len(files) > 10 and any(path.name == "trial.log" for path in files)
    for path in files:
        assert not any(secret in path.read_bytes() for secret in secrets), path
    for key in s3.objects(bucket):
        data = requests.get(f"{s3.url}/{bucket}/{key}", timeout=10).content
        assert not any(secret in data for secret in secrets), key


NNI_TRIAL = """
import os, signal, time, trialkit
signal.signal(signal.SIGTERM, lambda *_: None)  # a stop is seen by should_preempt() at the next step
ckpt = trialkit.checkpoint_dir()
state = os.path.join(ckpt, "model", "state.txt")
step = int(open(state).read()) if os.path.exists(state) else 0
while step < 30:
    step += 1
    trialkit.report_intermediate_result(step)
    time.sleep(0.1)
    if trialkit.should_preempt():
        os.makedirs(os.path.dirname(state), exist_ok=True)
        open(state, "w").write(str(step))
        raise SystemExit(143)
trialkit.report_final_result(step)
"""


def nni_config(tmp_path: Path, storage: dict) -> Path:
    """An NNI-format config of one NNI_TRIAL with this checkpointStorage."""
    folder = tmp_path / "nni"
    folder.mkdir(exist_ok=True)
    (folder / "trial.py").write_text(NNI_TRIAL)
    (folder / "config.yml").write_text(yaml.safe_dump({
        "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "trialCommand": "python3 trial.py",
        "trialConcurrency": 1, "maxTrialNumber": 1, "tuner": {"name": "Random"},
        "trainingService": {"platform": "local"}, "checkpointStorage": storage}))
    return folder / "config.yml"


def stored_and_emptied(exp: str, trial: str) -> tuple:
    """While an NNI_TRIAL is paused: its whole checkpoint dir is the one stored checkpoint; the dir deleted (a new
    node has none). Returns (its trial dir, the state it saved)."""
    stored = json.loads(cli("checkpoint", "list", exp, "--json").stdout)
    assert len(stored) == 1 and stored[0]["kind"] == "dir" and list(stored[0]["files"]) == ["model/state.txt"]
    trial_dir = Path(export(exp)[0]["trial_dir"])
    saved = (trial_dir / "checkpoint" / "model" / "state.txt").read_text()
    assert 3 <= int(saved) < 30
    shutil.rmtree(trial_dir / "checkpoint")
    return trial_dir, saved


def test_an_nni_trials_checkpoint_dir_goes_to_the_store_at_its_pause_and_comes_back_when_activated(tmp_path, home,
                                                                                                    s3):
    """An NNI-format config's checkpointStorage: a trial that is not Core API's has its whole checkpoint dir
    stored when it stops, and fetched into an empty dir before it starts again."""
    bucket = s3.bucket()
    config = nni_config(tmp_path, {"type": "s3", "bucket": bucket, "endpointUrl": s3.url, "saveTrialLatest": 1})
    exp, (trial_dir, saved) = paused_and_activated(home, [config], 3, stored_and_emptied)
    row = export(exp)[0]
    assert row["intermediate"] == list(range(1, 31)) and row["final"] == 30  # each step once, across the pause
    assert (trial_dir / "checkpoint" / "model" / "state.txt").read_text() == saved  # fetched back
    # The dir stored at the end (the second; its metric the final result, 30) is the latest and the best.
    left = json.loads(cli("checkpoint", "list", exp, "--json").stdout)
    assert len(left) == 1 and left[0]["run"] == 1 and left[0]["kept_by"] == ["trial latest", "trial best"]
    assert len(manifests(s3, bucket)) == 1


def test_a_paused_trials_latest_checkpoint_outlives_a_policy_that_keeps_none(tmp_path, home, s3):
    """saveTrialLatest 0 and saveTrialBest 0: Determined's policy keeps none of a trial's checkpoints, and its
    retention runs as each trial's run ends, a pause's too. But a paused trial goes on from its latest: that one
    stays while it is paused (and `checkpoint list` says why), and goes once the trial ended."""
    bucket = s3.bucket()
    config = nni_config(tmp_path, {"type": "s3", "bucket": bucket, "endpointUrl": s3.url, "saveTrialLatest": 0,
                                   "saveTrialBest": 0, "saveExperimentBest": 0})

    def kept_while_paused(exp: str, trial: str) -> tuple:
        [stored] = json.loads(cli("checkpoint", "list", exp, "--json").stdout)
        assert stored["kept_by"] == ["paused trial's latest: it goes on from it"]
        return stored_and_emptied(exp, trial)

    exp, (trial_dir, saved) = paused_and_activated(home, [config], 3, kept_while_paused)
    row = export(exp)[0]
    assert row["intermediate"] == list(range(1, 31)) and row["final"] == 30  # it went on from the kept one
    assert (trial_dir / "checkpoint" / "model" / "state.txt").read_text() == saved
    assert json.loads(cli("checkpoint", "list", exp, "--json").stdout) == [] and manifests(s3, bucket) == []


# ---------------------------------------------------------------- retention


RETENTION_TRIAL = """
import determined as det

TABLE = {0: [5, 3, 4, 1, 6, 2], 1: [7, 0.5, 8, 9, 10, 11]}  # the searcher's metric x at steps 1..6
info = det.get_cluster_info()
row = TABLE[info.trial.hparams["table"]]
with det.core.init() as core:
    for step in range(1, 7):
        core.train.report_validation_metrics(steps_completed=step, metrics={"x": row[step - 1]})
        with core.checkpoint.store_path({"steps_completed": step}) as (path, uuid):
            (path / "state").write_text(str(step))
import sys
print("cloud library in training:", "obstore" in sys.modules)
"""


def test_retention_keeps_exactly_what_determineds_policy_says(tmp_path, s3):
    """save_trial_latest 1, save_trial_best 1, save_experiment_best 3 (x, smaller is better) over two trials of six
    checkpoints each: trial 0 keeps step 4 (its best, x=1), step 6 (latest; x=2, third of the experiment); trial
    1 keeps step 2 (its best, x=0.5) and step 6 (latest). The other eight are gone from the bucket."""
    bucket = s3.bucket()
    config = {"name": "retention", "entrypoint": "python3 train.py", "max_restarts": 0,
              "hyperparameters": {"table": {"type": "categorical", "vals": [0, 1]}},
              "searcher": {"name": "grid", "metric": "x", "smaller_is_better": True},
              "checkpoint_storage": s3_storage(s3, bucket, save_trial_latest=1, save_trial_best=1,
                                               save_experiment_best=3)}
    folder = context(tmp_path, config, RETENTION_TRIAL, "train.py")
    done = cli("run", folder / "exp.yaml", folder, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    table = {row["trial_id"]: row["parameters"]["table"] for row in export(exp)}
    left = json.loads(cli("checkpoint", "list", exp, "--json").stdout)
    assert sorted((table[c["trial"]], c["steps"], tuple(c["kept_by"])) for c in left) == [
        (0, 4, ("trial best", "experiment best")),
        (0, 6, ("trial latest", "experiment best")),
        (1, 2, ("trial best", "experiment best")),
        (1, 6, ("trial latest",)),
    ]
    assert sorted(c["metric"] for c in left) == [0.5, 1, 2, 11]
    kept = {f"team/runs/{exp}/{c['trial']}/{c['uuid']}{tail}" for c in left
            for tail in (".checkpoint.json", "/metadata.json", "/state")}
    assert set(s3.objects(bucket)) == kept
    # Said once, at the experiment's end, not a line per round of deletions (the details: `checkpoint list`).
    said = [line for line in done.stdout.splitlines() if line.startswith("checkpoints: ")]
    assert said == [f"checkpoints: 8 deleted over the run, of 2 trials (no retention rule kept them: "
                    f"`trialkit checkpoint list {exp}` shows what is kept)"], done.stdout
    lines = done.stdout.splitlines()
    assert lines.index(said[0]) < next(i for i, line in enumerate(lines) if line.startswith(f"experiment {exp} DONE"))
    # The uploads went on beside training, in the keeper's uploader: the training process never loaded obstore.
    for row in export(exp):
        assert "cloud library in training: False" in (Path(row["trial_dir"]) / "stdout.log").read_text()


# ---------------------------------------------------------------- faults


def test_a_killed_upload_never_leaves_a_checkpoint_that_lists_or_restores(tmp_path, s3, monkeypatch):
    """The uploader SIGKILLed while the second checkpoint's files go up: the bucket holds some of its files but
    no manifest, so neither `checkpoint list` nor the restore a new node runs ever sees it: the first one is
    restored, whole."""
    bucket = s3.bucket()
    spec = json.dumps({"type": "s3", "bucket": bucket, "endpoint_url": s3.url})
    ckpt_dir = tmp_path / "trial" / "checkpoint"
    first, second = ckpt_dir / "first-uuid", ckpt_dir / "second-uuid"
    first.mkdir(parents=True)
    (first / "state").write_text("first")
    (first / "metadata.json").write_text(json.dumps({"steps_completed": 10}))
    second.mkdir()
    for i in range(400):  # many files: the upload takes long enough to be caught half way
        (second / f"shard-{i:03d}").write_bytes(os.urandom(64 << 10))
    environ = dict(os.environ, TRIALKIT_CHECKPOINT_STORE=spec, TRIALKIT_CHECKPOINT_DIR=str(ckpt_dir),
                   TRIALKIT_EXPERIMENT_ID="exp1", TRIALKIT_TRIAL_ID="exp1-00000",
                   TRIALKIT_TRIAL_DIR=str(tmp_path / "trial"))
    uploader = subprocess.Popen([sys.executable, "-m", "trialkit.checkpoints.sync"], env=environ,
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: any(k.endswith("first-uuid.checkpoint.json") for k in s3.objects(bucket)), WAIT,
                   "the first checkpoint stored")
        (second / "metadata.json").write_text(json.dumps({"steps_completed": 20}))
        (ckpt_dir / "latest.tmp").write_text("second-uuid")  # renamed into place, as the Core API does
        os.replace(ckpt_dir / "latest.tmp", ckpt_dir / "latest")
        wait_until(lambda: sum("second-uuid/" in k for k in s3.objects(bucket)) >= 5, WAIT,
                   "the second checkpoint's first files")
        uploader.send_signal(signal.SIGKILL)
    finally:
        uploader.kill()
        uploader.communicate()
    keys = s3.objects(bucket)
    assert any("second-uuid/" in k for k in keys) and not any(k.endswith("second-uuid.checkpoint.json") for k in keys)
    assert sum("second-uuid/" in k for k in keys) < 401  # cut short indeed
    # A new node: an empty checkpoint dir, the latest whole checkpoint restored.
    fresh = tmp_path / "fresh"
    restored = subprocess.run([sys.executable, "-m", "trialkit.checkpoints.restore"], capture_output=True, text=True,
                              env=dict(environ, TRIALKIT_CHECKPOINT_DIR=str(fresh)), timeout=WAIT)
    assert restored.returncode == 0, restored.stderr
    assert sorted(p.name for p in fresh.iterdir()) == ["first-uuid", "latest"]
    assert (fresh / "first-uuid" / "state").read_text() == "first" and (fresh / "latest").read_text() == "first-uuid"


# ---------------------------------------------------------------- the commands


def one_line_error(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert all(word in done.stderr for word in words), done.stderr


def answered(answer: str, *args) -> subprocess.CompletedProcess:
    """`trialkit ARGS...` on a terminal (a pty its stdin), `answer` typed when it asks."""
    import pty

    main, tty = pty.openpty()
    try:
        os.write(main, answer.encode() + b"\n")
        return subprocess.run([sys.executable, "-m", "trialkit.cli", *map(str, args)], stdin=tty,
                              capture_output=True, text=True, timeout=WAIT)
    finally:
        os.close(main)
        os.close(tty)


def test_checkpoint_list_show_download_delete(tmp_path, s3):
    """What `det checkpoint list/describe/download/delete` give, on checkpoints in S3; mistakes in one line."""
    bucket = s3.bucket()
    config = {"name": "commands", "entrypoint": "python3 train.py", "max_restarts": 0,
              "hyperparameters": {"table": 0}, "searcher": {"name": "single", "metric": "x"},
              "checkpoint_storage": s3_storage(s3, bucket, save_trial_latest=2, save_trial_best=1)}
    folder = context(tmp_path, config, RETENTION_TRIAL, "train.py")
    done = cli("run", folder / "exp.yaml", folder, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    trial = f"{exp}-00000"
    listed = cli("checkpoint", "list", exp)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["uuid", "trial", "steps", "metric", "size", "kept", "by", "where"]
    rows = [line.split() for line in lines[2:]]
    # steps 4 (best, x=1), 5 and 6 (the two latest), oldest first
    assert [(row[1], row[2], row[3]) for row in rows] == [(trial, "4", "1"), (trial, "5", "6"), (trial, "6", "2")]
    assert all(row[-1].startswith(f"s3://{bucket}/team/runs/{exp}/{trial}/") for row in rows)
    assert cli("checkpoint", "ls", trial).stdout == listed.stdout  # a trial's own: the same three
    page_rows = trial_page_checkpoints(exp, trial)
    assert [r[:5] + r[6:] for r in page_rows] == [[row[0], "0", row[2], row[3], row[4] + " " + row[5], row[-1]]
                                                for row in rows]
    assert [r[5] for r in page_rows] == ["trial best", "trial latest", "trial latest"]
    best = rows[0][0]
    shown = cli("checkpoint", "show", exp, best[:8])
    assert shown.returncode == 0, shown.stderr
    assert f"uuid       {best}" in shown.stdout and "kept by    trial best" in shown.stdout
    assert 'metadata   {"steps_completed":4}' in shown.stdout and "metadata.json" in shown.stdout
    target = tmp_path / "fetched"
    fetched = cli("checkpoint", "download", exp, best, "-o", target)
    assert fetched.returncode == 0, fetched.stderr
    assert (target / "state").read_text() == "4" and json.loads((target / "metadata.json").read_text()) == {
        "steps_completed": 4}
    one_line_error(cli("checkpoint", "download", exp, best, "-o", target), "--output", "not an empty directory")
    one_line_error(cli("checkpoint", "show", exp, "nope-nope"), "UUID", "no checkpoint 'nope-nope'")
    one_line_error(cli("checkpoint", "show", exp, best[:2]), "UUID", "give at least 4 characters")
    one_line_error(cli("checkpoint", "list", "zzzzzzzz"), "no experiment")
    one_line_error(cli("checkpoint", "delete", exp, best, "nope-nope", "--yes"), "no checkpoint")  # nothing deleted
    # It asks first, as `experiment delete` does: without a terminal to ask on and without --yes, it refuses.
    one_line_error(cli("checkpoint", "delete", exp, best), "--yes", "no terminal to ask on")
    declined = answered("n", "checkpoint", "delete", exp, best[:8])
    assert declined.returncode == 1 and f"delete checkpoint {best} of {trial} from s3://{bucket}/team/runs? [y/N]" \
        in declined.stdout and "nothing deleted" in declined.stdout, declined.stdout
    assert len(manifests(s3, bucket)) == 3
    deleted = cli("checkpoint", "delete", exp, best, "--yes")
    assert deleted.returncode == 0 and f"deleted checkpoint {best}" in deleted.stdout, deleted.stderr
    assert len(manifests(s3, bucket)) == 2 and not any(best in key for key in s3.objects(bucket))
    assert best not in cli("checkpoint", "list", exp).stdout
    helped = cli("checkpoint", "--help").stdout
    assert all(action in helped for action in ("list", "show", "download", "delete"))
    # Deleting the experiment deletes what the store holds of it.
    gone = cli("experiment", "delete", exp, "--yes")
    assert gone.returncode == 0 and gone.stdout.count("deleted checkpoint ") == 2, gone.stdout + gone.stderr
    assert s3.objects(bucket) == []


def test_checkpoints_in_the_trials_own_dirs_are_listed_and_kept_by_the_same_rules(tmp_path):
    """A Determined config without checkpoint_storage: Determined's defaults (the latest and the best) over the
    trial's own checkpoint dir, and `checkpoint list` shows what is left there."""
    config = {"name": "local", "entrypoint": "python3 train.py", "max_restarts": 0,
              "hyperparameters": {"table": 1}, "searcher": {"name": "single", "metric": "x"}}
    folder = context(tmp_path, config, RETENTION_TRIAL, "train.py")
    done = cli("run", folder / "exp.yaml", folder, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    left = json.loads(cli("checkpoint", "list", exp, "--json").stdout)
    assert [(c["steps"], c["kept_by"]) for c in left] == [(2, ["trial best"]), (6, ["trial latest"])]
    checkpoint_dir = Path(export(exp)[0]["trial_dir"]) / "checkpoint"
    assert sorted(p.name for p in checkpoint_dir.iterdir()) == sorted([c["uuid"] for c in left] + ["latest"])
    assert all(c["where"] == str(checkpoint_dir / c["uuid"]) for c in left)


def test_the_keeper_and_the_training_side_never_import_the_cloud_library():
    """obstore loads in the uploader's, the restore's and the control plane's processes only: no module the keeper
    or a training process imports names it (nor trialkit.checkpoints.store, which does), lazily or not."""
    import ast

    root = Path(__file__).resolve().parent.parent / "trialkit"
    light = [*root.glob("keeper/*.py"), root / "sdk.py", root / "__init__.py", root / "checkpoints" / "__init__.py",
             *root.glob("shims/**/*.py"), *root.glob("adaptdl/**/*.py")]
    for path in light:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "obstore" or n.startswith("trialkit.checkpoints.") for n in names), \
                f"{path.relative_to(root)}:{node.lineno} imports {names}"


@pytest.mark.parametrize("example", ["kubeflow-pytorch.yml", "frameworkcontroller.yml", "adaptdl.yml"])
def test_a_kubernetes_trial_gets_the_store_and_the_secrets_name_and_no_credential(tmp_path, example, monkeypatch):
    """`trialkit render` of a cluster config with checkpointStorage: every trial container gets the store (no key
    in it) and the Secret by name (envFrom), the objects are valid for a real API server, and the credentials in
    the environment of `trialkit render` appear nowhere in them."""
    import k8s_schemas

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIARENDERCHECK00001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "render-check-secret-key-value")
    examples = Path(__file__).resolve().parent.parent / "examples" / "kubernetes"
    config = yaml.safe_load((examples / example).read_text())
    config["checkpointStorage"] = {"type": "s3", "bucket": "team-ckpts", "endpointUrl": "https://minio.example:9000",
                                   "secretName": "team-s3-credentials"}
    shutil.copytree(examples, tmp_path / "examples")
    path = tmp_path / "examples" / example
    path.write_text(yaml.safe_dump(config))
    done = cli("render", path)
    assert done.returncode == 0, done.stderr
    assert "AKIARENDERCHECK00001" not in done.stdout and "render-check-secret-key-value" not in done.stdout
    objects = list(yaml.safe_load_all(done.stdout))
    k8s_schemas.validate_objects(objects)
    trial_containers = [c for o in objects for t in k8s_schemas.pod_templates(o) for c in t["spec"]["containers"]
                        if "TRIALKIT_COMMAND" in {e["name"] for e in c.get("env", [])}]
    assert trial_containers
    for container in trial_containers:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert json.loads(env["TRIALKIT_CHECKPOINT_STORE"]) == {
            "type": "s3", "bucket": "team-ckpts", "endpoint_url": "https://minio.example:9000"}
        assert container["envFrom"] == [{"secretRef": {"name": "team-s3-credentials"}}]


def trial_page_checkpoints(exp: str, trial: str, where: str = "Kept in s3://") -> list:
    """The Checkpoints section of the trial's page (`trialkit ui`, headless Chromium): each row's cells."""
    from web_util import CHROMEDRIVER, CHROMIUM, Browser

    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("needs Debian's chromium and chromium-driver (bootstrap.sh installs them)")
    ui = start_cli("ui", exp)
    browser = Browser()
    try:
        url = ui.stdout.readline().strip().split(": ", 1)[1]
        driver = browser.driver
        driver.get(f"{url}/trial/{trial}")
        script = ("const rows = [...document.querySelectorAll('#checkpoints tbody tr')];"
                  "return rows.length && !rows[0].querySelector('.empty') ? "
                  "rows.map(r => [...r.cells].map(c => c.textContent)) : null")
        wait_until(lambda: driver.execute_script(script), WAIT, "the trial page's checkpoints")
        assert driver.execute_script("return document.getElementById('checkpoints-where').textContent").startswith(
            where)
        return driver.execute_script(script)
    finally:
        assert not browser.close()
        ui.send_signal(signal.SIGINT)
        ui.communicate(timeout=WAIT)


@pytest.mark.slow
def test_a_paused_ray_trial_resumes_from_the_object_store_with_its_local_copy_gone(ray_cluster, tmp_path, home, s3):
    """The same NNI trial on the ray platform: its keeper (a process of its node's agent) stores the checkpoint dir
    at the pause and fetches it back into the emptied dir when the trial is placed again. The nodes' credentials
    come as Ray gives a node's processes their environment (runtimeEnv's env_vars here; an instance profile on a
    cloud)."""
    bucket = s3.bucket()
    folder = tmp_path / "ray"
    folder.mkdir()
    (folder / "trial.py").write_text(NNI_TRIAL)
    credentials = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key,
                   "AWS_REGION": "us-east-1"}
    (folder / "config.yml").write_text(yaml.safe_dump({
        "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "trialCommand": "python3 trial.py",
        "trialConcurrency": 1, "maxTrialNumber": 1, "tuner": {"name": "Random"}, "nniManagerIp": "127.0.0.1",
        "trainingService": {"platform": "ray", "address": ray_cluster.address, "cpusPerTrial": 1,
                            "runtimeEnv": {"env_vars": credentials}},
        "checkpointStorage": {"type": "s3", "bucket": bucket, "endpointUrl": s3.url}}))
    exp, (trial_dir, saved) = paused_and_activated(home, [folder / "config.yml"], 3, stored_and_emptied)
    row = export(exp)[0]
    assert row["intermediate"] == list(range(1, 31)) and row["final"] == 30  # each step once, across the pause
    assert (trial_dir / "checkpoint" / "model" / "state.txt").read_text() == saved  # fetched back
    ray_cluster.wait_clean()


@pytest.mark.containers
def test_a_paused_kubernetes_trial_resumes_from_s3_in_a_new_pod_without_a_volume(tmp_path, home, s3, monkeypatch,
                                                                                containers, image):
    """A PyTorchJob trial with no checkpoint claim (its checkpoint dir on the pod's own disk) and S3 storage whose
    credentials are a Secret the config names: paused, its pod goes with its disk; activated, the new pod's keeper
    fetches the checkpoint from S3 and the trial goes on from step 10. The pods are real containers of the trial
    image (tests/pod_runner.py), reaching moto at this machine's address on their bridge."""
    from containers_util import ended, running
    from k8s_fake_api import FakeApiServer
    from pod_runner import PodRunner, host_address

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(RESUMABLE)
    path = kubeflow_config(tmp_path, s3, host_address(), searchSpace={"x": {"_type": "choice", "_value": [3]}},
                           trialConcurrency=1, maxTrialNumber=1, tuner={"name": "GridSearch"},
                           trialCommand="python3 /code/train.py")
    with FakeApiServer() as api:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path)))
        create_secret(api, s3, "team-s3")
        with PodRunner(api, containers, image, tmp_path / "kubelet", mounts={"/code": code}) as runner:
            with running(path) as (proc, exp):
                trial = f"{exp}-00000"
                wait_until(lambda: reported(home, trial) >= 2, WAIT, "the trial to hold at step 10")
                assert cli("trial", "pause", trial).returncode == 0
                runner.wait_for(lambda pods: runner.history[0].done.is_set(), WAIT, "the paused pod to end")
                wait_until(lambda: cli("trial", "activate", trial).returncode == 0, WAIT, "the trial to activate",
                           every=0.5)
                out, err = ended(proc, runner, WAIT)
                assert proc.returncode == 0, out + err + runner.describe()
            first, again = runner.history
            assert first.exit_code == 143 and "checkpoint at step 10" in runner.logs(first), runner.describe()
            assert "restart 1 from step 10" in runner.logs(again), runner.logs(again)
            assert "restored checkpoint" in runner.logs(again)
    row = export(exp)[0]
    assert row["status"] == "SUCCEEDED" and row["final"] == 3
    # The pause's dir (judged by the 10 reported before it) is the best (GridSearch maximizes), the end's (its
    # final result, 3) the latest: both stay.
    left = json.loads(cli("checkpoint", "list", exp, "--json").stdout)
    assert [(c["kind"], c["run"], c["metric"], c["kept_by"]) for c in left] == [
        ("dir", 0, 10, ["trial best"]), ("dir", 1, 3, ["trial latest"])]


CORE_API_CALLS = """
import json, pathlib, time
import determined as det

with det.core.init() as core:
    ids = []
    for step in (1, 2, 3):
        with core.checkpoint.store_path({"steps_completed": step}) as (path, uuid):
            (path / "state").write_text(str(step))
        ids.append(uuid)
    root = pathlib.Path(core.checkpoint._root)
    deadline = time.monotonic() + 60
    while (root / ids[0]).exists() or (root / ids[1]).exists():  # stored, so the uploader keeps only the latest
        assert time.monotonic() < deadline, "the uploader never stored the first two"
        time.sleep(0.05)
    with core.checkpoint.restore_path(ids[0]) as path:
        print("restored:", (path / "state").read_text(), flush=True)
    core.checkpoint.download(ids[1], "fetched")
    print("downloaded:", pathlib.Path("fetched", "state").read_text(), flush=True)
    core.checkpoint.delete(ids[1])
    print("deleted:", ids[1], flush=True)
    core.train.report_validation_metrics(steps_completed=3, metrics={"x": 1})
"""


def test_core_api_calls_reach_checkpoints_only_the_store_holds(tmp_path, s3):
    """Once stored, a checkpoint's local copy goes (the latest stays); restore_path and download fetch it back from
    S3, and core.checkpoint.delete deletes it there."""
    bucket = s3.bucket()
    config = {"name": "calls", "entrypoint": "python3 train.py", "max_restarts": 0,
              "searcher": {"name": "single", "metric": "x"},
              "checkpoint_storage": s3_storage(s3, bucket, save_trial_latest=10)}
    folder = context(tmp_path, config, CORE_API_CALLS, "train.py")
    done = cli("run", folder / "exp.yaml", folder, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    row = export(exp)[0]
    out = (Path(row["trial_dir"]) / "stdout.log").read_text()
    assert row["status"] == "SUCCEEDED", out + (Path(row["trial_dir"]) / "stderr.log").read_text()
    assert "restored: 1" in out and "downloaded: 2" in out
    deleted = out.split("deleted: ")[1].split()[0]
    left = json.loads(cli("checkpoint", "list", exp, "--json").stdout)
    assert [c["steps"] for c in left] == [1, 3] and deleted not in {c["uuid"] for c in left}
    assert not any(deleted in key for key in s3.objects(bucket))


def test_only_the_reporting_pod_of_a_multi_pod_trial_uploads_and_every_pod_restores(tmp_path, s3):
    """Two keepers of one trial as a PyTorchJob's pods run them (the master reports, a worker does not), each
    leaving a checkpoint dir: only the master's is stored; then a worker pod that starts anew gets it."""
    bucket = s3.bucket()
    base = dict(os.environ, TRIALKIT_CHECKPOINT_STORE=json.dumps({"type": "s3", "bucket": bucket,
                                                                    "endpoint_url": s3.url}),
                TRIALKIT_EXPERIMENT_ID="exp1", TRIALKIT_TRIAL_ID="exp1-00000", TRIALKIT_CHIEF_ROLE="master")
    save = [sys.executable, "-c", "import os, trialkit; open(os.path.join(trialkit.checkpoint_dir(), 'w'), 'w')"
                                  ".write(os.environ['TRIALKIT_ROLE'])"]
    for role in ("worker", "master"):
        environ = dict(base, TRIALKIT_ROLE=role, TRIALKIT_TASK_INDEX="0", TRIALKIT_TRIAL_DIR=str(tmp_path / role))
        done = subprocess.run([sys.executable, "-m", "trialkit.keeper", "--", *save], env=environ,
                              capture_output=True, text=True, timeout=WAIT)
        assert done.returncode == 0, done.stderr
        stored = [k for k in s3.objects(bucket) if k.endswith("/w")]
        assert len(stored) == (role == "master"), (role, stored, done.stderr)
    fresh = dict(base, TRIALKIT_ROLE="worker", TRIALKIT_TASK_INDEX="1", TRIALKIT_TRIAL_DIR=str(tmp_path / "new"))
    read = [sys.executable, "-c", "import os, trialkit; print(open(os.path.join(trialkit.checkpoint_dir(), 'w'))"
                                  ".read())"]
    done = subprocess.run([sys.executable, "-m", "trialkit.keeper", "--quiet", "--", *read], env=fresh,
                          capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "new" / "stdout.log").read_text() == "master\n"
    assert len(manifests(s3, bucket)) == 1  # the worker stored nothing at its end either
