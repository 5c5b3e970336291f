"""PBT's checkpoints where its trials run: on a Kubernetes platform all_checkpoint_dir is on the volume every pod
mounts (NFS, an Azure File share), its default there too, or the config is refused in one line; Determined's
searchers that trialkit does not take name what it has instead (its PBT tuner for `pbt`)."""
from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

import k8s_schemas
from experiment_util import cli
from trialkit.control.config import parse_config, trials_experiment_dir
from trialkit.control.loop import Loop
from trialkit.errors import UserError
from trialkit.manager.store import Store

# NNI's mnist-pbt-tuner-pytorch config (its classArgs) on kubeflow.
NNI_PBT = """\
searchSpace: {lr: {_type: choice, _value: [0.1, 0.01]}, momentum: {_type: uniform, _value: [0.1, 0.9]}}
trialCommand: python3 main.py
trialConcurrency: 4
maxTrialNumber: 12
tuner:
  name: PBTTuner
  classArgs: {optimize_mode: maximize, population_size: 4%s}
trainingService:
  platform: kubeflow
  namespace: team
  managerAddress: 10.20.30.40
  dockerImage: registry.example.com/train:1
  master: {replicas: 1}
"""
NFS = "  nfs: {server: 10.0.0.5, path: /exports/team, containerMountPath: /mnt/shared}\n"
AZURE = ("  storage: {storageType: azureStorage, azureAccount: acct, azureShare: share, keyVaultName: vault,\n"
         "            keyVaultKey: key, containerMountPath: /mnt/shared}\n")
S3 = "checkpointStorage: {type: s3, bucket: ckpts, endpointUrl: 'http://10.0.0.9:9000'}\n"


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "code").mkdir(exist_ok=True)
    path = tmp_path / "code" / "config.yml"
    path.write_text(text)
    return path


def rendered_trial(tmp_path: Path, text: str, trial: int) -> List[dict]:
    done = cli("render", write(tmp_path, text), "--trial", trial)
    assert done.returncode == 0, done.stderr
    objects = list(yaml.safe_load_all(done.stdout))
    k8s_schemas.validate_objects(objects)  # strict, against the CRDs, as every rendered object
    return objects


def containers(objects: List[dict]) -> List[dict]:
    found = [container for obj in objects for template in k8s_schemas.pod_templates(obj)
             for container in template["spec"]["containers"]]
    assert found, objects
    return found


def parameters(container: dict) -> Dict[str, object]:
    return json.loads(next(e["value"] for e in container["env"] if e["name"] == "TRIALKIT_PARAMETERS"))


def refusal(tmp_path: Path, text: str) -> str:
    done = cli("render", write(tmp_path, text))
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


# FrameworkController's, with NNI v2's form of the volume.
FRAMEWORK_PBT = (NNI_PBT % "").replace("platform: kubeflow", "platform: frameworkcontroller").replace(
    "  master: {replicas: 1}\n", "  taskRoles: [{name: worker, taskNumber: 1}]\n") + \
    "  storage: {storageType: nfs, server: 10.0.0.5, path: /exports/team, containerMountPath: /mnt/shared}\n"


@pytest.mark.parametrize("text", [NNI_PBT % "" + NFS, FRAMEWORK_PBT],
                         ids=["kubeflow-nfs", "frameworkcontroller-storage"])
def test_nnis_pbt_on_kubernetes_loads_and_saves_on_the_volume_every_pod_mounts(tmp_path, text):
    for trial, member in ((0, "0"), (3, "3")):  # generation 0: both dirs the member's first
        objects = rendered_trial(tmp_path, text, trial)
        for container in containers(objects):
            mounts = [m["mountPath"] for m in container["volumeMounts"]]
            assert "/mnt/shared" in mounts
            params = parameters(container)
            # The run's experiment dir as its pods see it: <mount>/trialkit/<experiment id> (render's id: render).
            expected = f"/mnt/shared/trialkit/render/checkpoint/{member}/0"
            assert params["load_checkpoint_dir"] == params["save_checkpoint_dir"] == expected


def test_a_given_all_checkpoint_dir_under_the_mount_is_kept(tmp_path):
    objects = rendered_trial(tmp_path, NNI_PBT % ", all_checkpoint_dir: /mnt/shared/pbt/" + NFS, 1)
    assert {parameters(c)["save_checkpoint_dir"] for c in containers(objects)} == {"/mnt/shared/pbt/1/0"}


def test_an_all_checkpoint_dir_outside_every_mounted_volume_is_refused_naming_the_mount(tmp_path):
    said = refusal(tmp_path, NNI_PBT % ", all_checkpoint_dir: /mnt/sharedx/pbt" + NFS)
    assert "config.yml:7: tuner.classArgs.all_checkpoint_dir: all_checkpoint_dir /mnt/sharedx/pbt is on no volume " \
           "the kubeflow pods mount" in said
    assert "put it under /mnt/shared, the shared volume's containerMountPath" in said


def test_pbt_on_kubeflow_without_a_shared_volume_is_refused_saying_to_add_nfs(tmp_path):
    said = refusal(tmp_path, NNI_PBT % "")
    assert "config.yml:8: trainingService: PBT on kubeflow needs its checkpoints on a volume every trial pod " \
           "mounts, and it mounts none" in said
    assert "add nfs: {server, path, containerMountPath}" in said and "trialkit.checkpoint_dir returns" in said


def test_without_a_volume_an_object_store_carries_pbt_through_the_trials_own_checkpoint_dir_with_a_note(tmp_path):
    """tests/test_searches_e2e.py runs that path with real pods and S3; NNI's dirs are then said to be unshared."""
    config = parse_config(yaml.safe_load(NNI_PBT % "" + S3), tmp_path)
    assert any("PBT on kubeflow without a shared volume" in note and "load_checkpoint_dir" in note
               for note in config.notes)
    local = parse_config(yaml.safe_load((NNI_PBT % "").replace("platform: kubeflow", "platform: local")
                                        .split("  namespace")[0]), tmp_path)
    assert not any("PBT" in note for note in local.notes)


def test_an_azure_file_share_is_a_volume_every_pod_mounts_too(tmp_path):
    config = parse_config(yaml.safe_load(NNI_PBT % "" + AZURE), tmp_path)
    assert trials_experiment_dir(config, tmp_path / "exp1") == "/mnt/shared/trialkit/exp1"
    with pytest.raises(Exception, match="put it under /mnt/shared"):
        parse_config(yaml.safe_load(NNI_PBT % ", all_checkpoint_dir: /data" + AZURE), tmp_path)


def test_the_loops_pbt_tuner_puts_its_default_under_the_mount_and_a_local_one_under_the_experiment_dir(tmp_path):
    nfs = parse_config(yaml.safe_load(NNI_PBT % "" + NFS), tmp_path)
    local = parse_config(yaml.safe_load((NNI_PBT % "").replace("platform: kubeflow", "platform: local")
                                        .split("  namespace")[0]), tmp_path)
    store = Store(tmp_path / "store.db")
    try:
        for config, root in ((nfs, "/mnt/shared/trialkit/abcd1234/checkpoint"),
                             (local, str(tmp_path / "abcd1234" / "checkpoint"))):
            loop = Loop(config, "abcd1234", tmp_path / "abcd1234", store)
            assert posixpath.dirname(loop.tuner.ask()[1]["save_checkpoint_dir"]) == root + "/0"
    finally:
        store.close()


def ray_pbt(address: str, extra: str = "") -> dict:
    text = (NNI_PBT % "").split("trainingService:")[0] + extra
    return {**yaml.safe_load(text), "trainingService": {"platform": "ray", "address": address}}


@pytest.mark.parametrize("address", ["10.20.30.40:6379", "ray://head.example.com:10001"])
def test_pbt_on_a_ray_cluster_elsewhere_needs_a_shared_dir_or_an_object_store(tmp_path, address):
    """Ray's trials keep their dirs at this machine's paths on their own node: a remote node's are its disk's."""
    with pytest.raises(UserError) as refused:
        parse_config(ray_pbt(address), tmp_path)
    assert str(refused.value) == (
        "trainingService.address: PBT on a ray cluster elsewhere: its nodes do not see this machine's experiment "
        "dir, where PBT's checkpoints go by default (set all_checkpoint_dir to a directory every node mounts at the "
        "same path, or put checkpointStorage in an object store, s3, gcs or azure)")
    parse_config(ray_pbt(address, S3), tmp_path)
    shared = {"tuner": {"name": "PBT", "classArgs": {"all_checkpoint_dir": "/mnt/efs/pbt"}}}
    given = parse_config({**ray_pbt(address), **shared}, tmp_path)
    assert given.tuner.class_args["all_checkpoint_dir"] == "/mnt/efs/pbt"


@pytest.mark.parametrize("address", ["auto", "127.0.0.1:6379", "ray://localhost:10001"])
def test_pbt_on_a_ray_cluster_on_this_machine_keeps_the_experiment_dirs_default(tmp_path, address):
    config = parse_config(ray_pbt(address), tmp_path)
    assert trials_experiment_dir(config, tmp_path / "exp1") == str(tmp_path / "exp1")
    assert not any("PBT" in note for note in config.notes)


@pytest.mark.parametrize("searcher, words", [
    ("pbt", ["or trialkit's PBT tuner: a trialkit config, NNI's keys, with tuner: {name: PBT",
             "runs your Core API code unchanged, latest_checkpoint naming the checkpoint each trial goes on from"]),
    ("async_halving", [": adaptive_asha is asynchronous successive halving"]),
    ("sync_halving", ["or trialkit's Hyperband tuner: tuner: {name: Hyperband} in a trialkit config"]),
    ("custom", ["(use single, random, grid, adaptive_asha; see docs/migration/determined.md)"]),
])
def test_determineds_unsupported_searchers_name_what_trialkit_has_instead(tmp_path, searcher, words):
    (tmp_path / "train.py").write_text("")
    config = tmp_path / "det.yml"
    config.write_text("name: pbt\nentrypoint: python3 train.py\n"
                      "hyperparameters: {lr: {type: double, minval: 0.01, maxval: 0.1}}\n"
                      f"searcher: {{name: {searcher}, metric: loss}}\n")
    done = cli("render", config, tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert f"det.yml:4: searcher.name: Determined's {searcher!r} searcher is not supported by trialkit" in done.stderr
    for text in words:
        assert text in done.stderr, done.stderr
