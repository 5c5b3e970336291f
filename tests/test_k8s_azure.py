"""Azure File storage for Kubeflow and FrameworkController, as NNI's pages document it.

The share is an `azureFile` volume in every pod; its Secret is rendered
without values and filled at submission with the storage account and the key
read from Azure Key Vault through the Azure CLI. No Azure can be reached from
here, so `az` is a small script on PATH that answers as the real one does
(the secret's value on stdout with `--query value --output tsv`, an ERROR line
and exit 1 otherwise) and records its arguments; the cluster is the fake API
server, and every object is validated against the real schemas.
"""
from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import yaml

import k8s_schemas
from test_k8s_code import load, pod_envs, spec_of  # noqa: F401
from test_kube_client import api, client  # noqa: F401 (fixtures)
from trialkit.errors import UserError
from trialkit.platforms.kubernetes import frameworkcontroller, kubeflow
from trialkit.platforms.kubernetes import render as k8s

KEY = "c2VjcmV0LWFjY291bnQta2V5LTk5Zg=="

# shared/seeds/001: the FrameworkController page's AKS variant, placeholders filled.
FRAMEWORK_AKS = """
authorName: default
experimentName: example_mnist
trialConcurrency: 1
maxTrialNum: 100
nniManagerIp: 10.20.30.41
trainingServicePlatform: frameworkcontroller
searchSpacePath: search_space.json
tuner: {builtinTunerName: TPE, classArgs: {optimize_mode: maximize}}
trial:
  codeDir: code
  taskRoles:
    - name: worker
      taskNum: 1
      command: python3 mnist.py
      gpuNum: 1
      cpuNum: 1
      memoryMB: 8192
      image: msranni/nni:latest
      frameworkAttemptCompletionPolicy: {minFailedTaskCount: 1, minSucceededTaskCount: 1}
frameworkcontrollerConfig:
  storage: azureStorage
  serviceAccountName: frameworkbarrier
  keyVault:
    vaultName: nni-vault
    name: storage-key
  azureStorage:
    accountName: nnistorage
    azureShare: nnishare
"""

# shared/seeds/004: the Kubeflow page's K8sAzureStorageConfig, as a v2 config.
KUBEFLOW_AKS = """
searchSpace: {lr: {_type: choice, _value: [0.1]}}
tuner: {name: TPE, classArgs: {optimize_mode: maximize}}
trialCommand: python3 model.py
trialCodeDirectory: code
nniManagerIp: 10.20.30.41
trainingService:
  platform: kubeflow
  operator: pytorch-operator
  storage: {storageType: azureStorage, azureAccount: nnistorage, azureShare: nnishare,
            keyVaultName: nni-vault, keyVaultKey: storage-key}
  master: {replicas: 1, dockerImage: msranni/nni:latest}
  worker: {replicas: 2, dockerImage: msranni/nni:latest}
"""


@pytest.fixture
def az(tmp_path, monkeypatch):
    """An `az` on PATH: the vault nni-vault holds storage-key; every call's arguments go to az.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "az.log"
    script = bin_dir / "az"
    script.write_text(f"""#!/bin/sh
printf '%s\\n' "$*" >>{log}
if [ "$5" = nni-vault ] && [ "$7" = storage-key ]; then echo '{KEY}'; exit 0; fi
echo "ERROR: (SecretNotFound) A secret with (name/id) $7 was not found in this key vault." >&2
exit 1
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    return log


def setup(tmp_path, text):
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "code" / "mnist.py").write_text("print('train')\n")
    return load(tmp_path, text)


@pytest.mark.parametrize("text, module", [(FRAMEWORK_AKS, frameworkcontroller), (KUBEFLOW_AKS, kubeflow)])
def test_the_seeds_azure_storage_renders_a_schema_valid_share_without_its_key(tmp_path, text, module):
    config = setup(tmp_path, text)
    objects = module.render(config.training_service, spec_of())
    k8s_schemas.validate_objects(objects)
    secret = next(o for o in objects if o["kind"] == "Secret" and k8s.LABEL_TRIAL not in o["metadata"]["labels"])
    assert "data" not in secret and "stringData" not in secret
    templates = list(k8s_schemas.pod_templates(objects[-1]))
    assert templates
    for template in templates:
        volume = next(v for v in template["spec"]["volumes"] if "azureFile" in v)
        assert volume["azureFile"] == {"secretName": secret["metadata"]["name"], "shareName": "nnishare",
                                       "readOnly": False}
        mounts = [m for c in template["spec"]["containers"] for m in c["volumeMounts"] if m["name"] == volume["name"]]
        assert [m["mountPath"] for m in mounts] == ["/nfs"]
    if module is frameworkcontroller:
        assert all(t["spec"]["serviceAccountName"] == "frameworkbarrier" for t in templates)


def test_submission_reads_the_key_from_key_vault_into_the_secret_only(tmp_path, az, api, client, caplog):  # noqa: F811
    config = setup(tmp_path, FRAMEWORK_AKS)
    platform = frameworkcontroller.Platform(config.training_service, tmp_path / "experiment", client=client)
    platform.check_ready()
    platform.submit(spec_of("a1"))
    platform.submit(spec_of("a2"))
    assert az.read_text().splitlines() == [
        "keyvault secret show --vault-name nni-vault --name storage-key --query value --output tsv"]  # once
    secrets = [o for o in api.objects.values() if o["kind"] == "Secret" and "azurestorageaccountkey" in
               o.get("stringData", {})]
    assert len(secrets) == 1
    assert secrets[0]["stringData"] == {"azurestorageaccountname": "nnistorage", "azurestorageaccountkey": KEY}
    recorded = (tmp_path / "experiment" / "trials" / "a1" / "kubernetes.yaml").read_text()
    assert "azureFile" in recorded and KEY not in recorded
    assert KEY not in caplog.text
    trial_secrets = [o for o in api.objects.values() if o["kind"] == "Secret" and k8s.LABEL_TRIAL in o["metadata"]["labels"]]
    assert trial_secrets and all(KEY not in json.dumps(o) for o in trial_secrets)
    removed = platform.remove_experiment("expA", ["a1", "a2"])
    assert any(ref.startswith("Secret") and "azure-storage" in ref for ref in removed)


def test_a_key_that_cannot_be_read_is_one_line_before_any_trial(tmp_path, az, api, client):  # noqa: F811
    config = setup(tmp_path, FRAMEWORK_AKS.replace("name: storage-key", "name: no-such-key"))
    platform = frameworkcontroller.Platform(config.training_service, tmp_path / "experiment", client=client)
    with pytest.raises(UserError) as caught:
        platform.check_ready()
    said = str(caught.value)
    assert len(said.splitlines()) == 1 and "no-such-key" in said and "SecretNotFound" in said and "az login" in said
    assert not [o for o in api.objects.values() if o["kind"] != "Namespace"]


def test_without_the_azure_cli_the_reason_says_so(tmp_path, monkeypatch, api, client):  # noqa: F811
    config = setup(tmp_path, FRAMEWORK_AKS)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    platform = frameworkcontroller.Platform(config.training_service, tmp_path / "experiment", client=client)
    with pytest.raises(UserError, match="Azure CLI"):
        platform.check_ready()


def test_a_v1_azure_section_without_its_share_names_the_v1_key(tmp_path):
    with pytest.raises(UserError, match=r"frameworkcontrollerConfig\.azureStorage\.azureShare"):
        setup(tmp_path, FRAMEWORK_AKS.replace("    azureShare: nnishare\n", ""))
