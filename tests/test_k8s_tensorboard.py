"""TensorBoard for an AdaptDL experiment, as NNI's adl mode serves it.

`trialkit experiment tensorboard ID` makes a Deployment and a Service over the
experiment's TensorBoard claim (the one every trial's pods mount) against
the fake API server, prints how to reach it; they go when the experiment
ends, the claim when it is deleted. Every object is validated against the
real schemas.
"""
from __future__ import annotations

import pytest

import k8s_schemas
from test_k8s_code import load, spec_of
from test_kube_client import api, client  # noqa: F401 (fixtures)
from trialkit import cli
from trialkit.manager import paths
from trialkit.manager.store import Store
from trialkit.platforms.kubernetes import adaptdljob as adaptdl

ADL = """
searchSpace: {lr: {_type: choice, _value: [0.1]}}
tuner: {name: TPE, classArgs: {optimize_mode: minimize}}
trialCommand: python3 /main_nni.py
nniManagerIp: 10.20.41.10
trainingService:
  platform: adl
  image: registry.petuum.com/dev/nni:adaptdl
  workingDir: .
  namespace: team
  imagePullSecrets: [{name: imagepullsecret}]
  checkpoint: {storageClass: dfs, storageSize: 1Gi}
"""


def tensorboard_kinds(objects) -> dict:
    return {o["kind"]: o for o in objects}


def test_tensorboard_serves_the_claim_the_trials_write_to(tmp_path):
    config = load(tmp_path, ADL).training_service
    objects = adaptdl.render_tensorboard(config, "expA")
    k8s_schemas.validate_objects(objects)
    claim, deployment, service = (tensorboard_kinds(objects)[k] for k in ("PersistentVolumeClaim", "Deployment", "Service"))
    trial = adaptdl.render(config, spec_of())
    trial_claims = {v["persistentVolumeClaim"]["claimName"] for t in k8s_schemas.pod_templates(trial[-1])
                    for v in t["spec"]["volumes"] if "persistentVolumeClaim" in v}
    pod = deployment["spec"]["template"]
    assert claim["metadata"]["name"] in trial_claims
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"], "readOnly": True}
    assert pod["spec"]["containers"][0]["command"] == ["tensorboard", "--logdir", "/adaptdl/tensorboard", "--bind_all",
                                                      "--port", "6006"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "imagepullsecret"}]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels and service["spec"]["selector"] == labels


@pytest.fixture
def experiment(tmp_path, monkeypatch):
    """An AdaptDL experiment in the store (TRIALKIT_HOME in tmp_path): its id."""
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    config = load(tmp_path, ADL)
    store = Store.in_dir(paths.create_experiment_dir("expA", None))
    store.create_experiment("expA", config=config.to_dict())
    store.close()
    return "expA"


def test_made_on_request_kept_when_asked_again_and_its_data_outlives_the_experiment(experiment, api, client,  # noqa: F811
                                                                                       capsys):
    assert cli.main(["experiment", "tensorboard", experiment]) == 0
    said = capsys.readouterr().out
    name = adaptdl.tensorboard_name(experiment)
    assert f"kubectl port-forward -n team service/{name} 6006:6006" in said
    made = sorted((o["kind"], o["metadata"]["name"]) for o in api.objects.values())
    assert made == [("Deployment", name), ("PersistentVolumeClaim", name), ("Service", name)]
    assert cli.main(["experiment", "tensorboard", experiment]) == 0  # asked again: what runs is kept
    assert len(api.objects) == 3
    claim = next(o for o in api.objects.values() if o["kind"] == "PersistentVolumeClaim")
    platform = adaptdl.Platform(load_config_of(experiment), paths.experiment_dir(experiment), client=client)
    platform.experiment_ended(experiment, [])
    # What served it goes; the claim with the trials' TensorBoard data stays (seed 000: read after the jobs).
    assert [o["kind"] for o in api.objects.values()] == ["PersistentVolumeClaim"]
    assert cli.main(["experiment", "tensorboard", experiment]) == 0  # an ended experiment's data, served again
    again = {o["kind"]: o for o in api.objects.values()}
    assert again["PersistentVolumeClaim"]["metadata"]["uid"] == claim["metadata"]["uid"]  # the same claim, not a new one
    volume = again["Deployment"]["spec"]["template"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"]["claimName"] == name
    assert name in platform.remove_experiment(experiment, [])[0] and api.objects == {}  # `experiment delete`


def load_config_of(experiment_id: str):
    from trialkit.control.config import parse_config

    store = Store.in_dir(paths.experiment_dir(experiment_id))
    try:
        return parse_config(store.experiment(experiment_id)["config"], paths.experiment_dir(experiment_id)).training_service
    finally:
        store.close()


def test_an_experiment_on_another_platform_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    config = load(tmp_path, "searchSpace: {lr: {_type: choice, _value: [0.1]}}\ntuner: {name: Random}\n"
                            "trialCommand: python3 train.py\n")
    store = Store.in_dir(paths.create_experiment_dir("expL", None))
    store.create_experiment("expL", config=config.to_dict())
    store.close()
    with pytest.raises(SystemExit) as caught:
        cli.main(["experiment", "tensorboard", "expL"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    # The local platform serves the dir its trials wrote in, when it gave them one: this run's trials got none.
    assert len(err.strip().splitlines()) == 1 and "expL's trials got no TensorBoard dir" in err, err
    assert "set TRIALKIT_TENSORBOARD_DIR=DIR in the environment of `trialkit run`" in err, err
