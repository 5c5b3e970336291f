"""`trialkit render` shows what a run really sends: the Kueue pool's labels, the run's manager address
options, the operator it assumed, a Determined config's context dir, and says what its placeholders are."""
from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
import yaml

import k8s_schemas
from experiment_util import cli
from pools_util import home, pools_yml  # noqa: F401 (home: a fixture)

SECTION = """\
searchSpace: {lr: {_type: choice, _value: [0.1]}}
trialCommand: python3 train.py
tuner: {name: Random}
trainingService:
  platform: %s
  namespace: team
  managerAddress: 10.20.30.40
  dockerImage: registry.example.com/train:1
"""
KUBEFLOW = SECTION % "kubeflow"
PYTORCHJOB = KUBEFLOW + "  master: {replicas: 1}\n  worker: {replicas: 1}\n"
TRAINJOB = KUBEFLOW + "  operator: trainjob\n  worker: {replicas: 2}\n"
FRAMEWORK = SECTION % "frameworkcontroller" + "  taskRoles: [{name: worker, taskNumber: 2}]\n"


def render(tmp_path: Path, text: str, *args: str) -> List[dict]:
    (tmp_path / "code").mkdir(exist_ok=True)
    config = tmp_path / "code" / "config.yml"
    config.write_text(text)
    done = cli("render", config, *args)
    assert done.returncode == 0, done.stderr
    objects = list(yaml.safe_load_all(done.stdout))
    k8s_schemas.validate_objects(objects)  # strict, against the CRDs, as every rendered object
    return objects, done.stdout


def comments(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))


@pytest.mark.parametrize("text, kind", [(PYTORCHJOB, "PyTorchJob"), (TRAINJOB, "TrainJob")])
def test_a_kueue_pools_job_is_rendered_queued_and_suspended(tmp_path, home, text, kind):
    plain, said = render(tmp_path, text)
    assert "kueue.x-k8s.io/queue-name" not in said and "suspend" not in said and "Kueue" not in comments(said)
    pools_yml(home, "  gpu-team: {kueue: {namespace: team, localQueue: team-queue, priorityClass: research}}\n")
    objects, said = render(tmp_path, text)
    job = objects[-1]
    assert job["kind"] == kind
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "research"
    suspension = job["spec"] if kind == "TrainJob" else job["spec"]["runPolicy"]
    assert suspension["suspend"] is True
    assert objects[:-1] == plain[:-1], "only the job joins the queue"
    assert "pool gpu-team of pools.yml" in comments(said) and "LocalQueue team-queue" in comments(said)


def test_a_kueue_pools_framework_pods_are_rendered_as_a_pod_group(tmp_path, home):
    pools_yml(home, "  gpu-team: {kueue: {namespace: team, localQueue: team-queue}}\n")
    objects, _ = render(tmp_path, FRAMEWORK)
    pod = objects[-1]["spec"]["taskRoles"][0]["task"]["pod"]
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == objects[-1]["metadata"]["name"]
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"


def manager_urls(objects: List[dict]) -> set:
    found = set()
    for obj in objects:
        for template in k8s_schemas.pod_templates(obj):
            for container in template["spec"]["containers"]:
                found |= {e["value"] for e in container.get("env", []) if e["name"] == "TRIALKIT_MANAGER_URL"}
    return found


def test_the_manager_port_is_the_runs_or_said_to_be_a_placeholder(tmp_path):
    objects, said = render(tmp_path, PYTORCHJOB)
    assert manager_urls(objects) == {"http://10.20.30.40:8080"}
    assert "manager port 8080: a run listens on any free port unless given --port" in comments(said)
    objects, said = render(tmp_path, PYTORCHJOB, "--port", "9123")  # run's option, the same definition
    assert manager_urls(objects) == {"http://10.20.30.40:9123"}
    assert ":8080" not in said and "manager port" not in comments(said)


def test_the_placeholders_are_explained(tmp_path):
    objects, said = render(tmp_path, PYTORCHJOB)
    assert objects[-1]["metadata"]["name"] == "tk-render-render-00000"
    assert "experiment id 'render': a run's own id, so its objects are tk-<experiment id>-<trial id>" in said
    assert "the trial's token: a run puts it in the trial's Secret" in said


def test_an_unset_operator_is_said_to_be_assumed(tmp_path):
    _, said = render(tmp_path, PYTORCHJOB)
    assert "operator is unset: rendered as a PyTorchJob" in comments(said)
    assert "where it serves only Kubeflow Trainer v2, a run submits a TrainJob instead" in comments(said)
    _, said = render(tmp_path, PYTORCHJOB.replace("  master:", "  operator: pytorch-operator\n  master:"))
    assert "operator is unset" not in said


def test_an_unset_operator_with_a_trial_template_is_said_to_be_assumed_too(tmp_path):
    # A PyTorchJob trialTemplate: no TrainJob alternative, so it was the one case without the comment.
    template = Path(__file__).resolve().parents[1] / "examples" / "kubernetes" / "pytorchjob-gpu-nodes.yaml"
    with_template = PYTORCHJOB + f"  trialTemplate: {template}\n"
    objects, said = render(tmp_path, with_template)
    assert objects[-1]["kind"] == "PyTorchJob"
    assert ("operator is unset: rendered as a PyTorchJob (training-operator), the kind of its trialTemplate, as a "
            "run submits it on any cluster") in comments(said)
    _, said = render(tmp_path, with_template.replace("  master:", "  operator: pytorch-operator\n  master:"))
    assert "operator is unset" not in said


def test_a_worker_only_section_with_operator_unset_is_told_of_trainjob(tmp_path):
    (tmp_path / "config.yml").write_text(KUBEFLOW + "  worker: {replicas: 2}\n")
    done = cli("render", tmp_path / "config.yml")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "pytorch-operator needs a master role (operator is unset: a PyTorchJob is assumed)" in done.stderr
    assert "or set operator: trainjob" in done.stderr
    (tmp_path / "config.yml").write_text(KUBEFLOW + "  worker: {replicas: 2}\n  ps: {replicas: 1}\n")
    done = cli("render", tmp_path / "config.yml")
    assert done.returncode == 2 and "trainjob" not in done.stderr, "no TrainJob has a ps role: not suggested"


def test_render_takes_a_determined_configs_context_dir(tmp_path):
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(f"print({name!r})\n")
    config = {"name": "on-kubeflow", "entrypoint": "python3 train.py", "searcher": {"name": "single", "metric": "l"},
              "environment": {"image": "example/det:1"},
              "trainingService": {"platform": "kubeflow", "managerAddress": "10.0.0.5", "master": {"replicas": 1}}}
    (tmp_path / "one" / "det.yaml").write_text(yaml.safe_dump(config))

    def code_digest(*context: Path) -> str:
        done = cli("render", tmp_path / "one" / "det.yaml", *context)
        assert done.returncode == 0, done.stderr
        job = list(yaml.safe_load_all(done.stdout))[-1]
        env = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
        return next(e["value"] for e in env if e["name"] == "TRIALKIT_CODE_DIGEST")

    assert code_digest(tmp_path / "two") != code_digest()  # the context dir is the code shipped, as `run` ships it


@pytest.mark.parametrize("text", [PYTORCHJOB, TRAINJOB, FRAMEWORK], ids=["pytorchjob", "trainjob", "framework"])
def test_every_claim_is_read_write_many_as_the_docs_say(tmp_path, text):
    objects, _ = render(tmp_path, text + "  checkpoint: {storageClass: shared-rwx, storageSize: 1Gi}\n")
    claims = [obj for obj in objects if obj["kind"] == "PersistentVolumeClaim"]
    assert claims and all(claim["spec"]["accessModes"] == ["ReadWriteMany"] for claim in claims)
    assert {claim["spec"]["storageClassName"] for claim in claims} == {"shared-rwx"}


def test_adaptdls_claims_are_read_write_many_as_the_docs_say():
    done = cli("render", Path(__file__).resolve().parent.parent / "examples" / "kubernetes" / "adaptdl.yml")
    assert done.returncode == 0, done.stderr
    claims = [obj for obj in yaml.safe_load_all(done.stdout) if obj["kind"] == "PersistentVolumeClaim"]
    assert len(claims) == 3 and all(claim["spec"]["accessModes"] == ["ReadWriteMany"] for claim in claims)


def test_the_runs_tls_options_make_the_pods_manager_url_https(tmp_path):
    for name in ("cert.pem", "key.pem"):
        (tmp_path / name).write_text("PEM\n")
    objects, _ = render(tmp_path, PYTORCHJOB, "--tls-cert", str(tmp_path / "cert.pem"), "--tls-key",
                        str(tmp_path / "key.pem"))
    assert manager_urls(objects) == {"https://10.20.30.40:8080"}
    done = cli("render", tmp_path / "code" / "config.yml", "--tls-cert", tmp_path / "cert.pem")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--tls-cert/--tls-key" in done.stderr


def test_render_into_a_dir_prints_the_file_it_wrote(tmp_path):
    render(tmp_path, PYTORCHJOB)  # writes the config
    done = cli("render", tmp_path / "code" / "config.yml", "-o", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    written = tmp_path / "out" / "render-00000.yaml"
    assert done.stdout == f"{written}\n" and written.read_text().startswith("# trial 0 as a run submits it")
