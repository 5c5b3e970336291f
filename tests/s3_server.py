"""A real S3 protocol server on loopback for the checkpoint tests: moto's standalone server (`moto[server]`).

The same HTTP calls a cloud store gets (signed requests, multipart uploads,
ListObjectsV2, DeleteObjects); nothing of the client is mocked. One server a
module, under a tag of its own (it outlives single tests); each test gets a
bucket of its own and the server's variables in its environment:
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (made up per session, so a test can
look for them in what trialkit writes) and AWS_REGION.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import requests
import yaml

from conftest import PYTHON, TAG
from harness import free_port, wait_until

pytest.importorskip("moto", reason="moto[server] is in the test extra (the S3 server of the checkpoint tests)")
pytest.importorskip("obstore", reason="obstore is trialkit's checkpoints extra")


class S3Server:
    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.access_key = "AKIA" + secrets.token_hex(8).upper()
        self.secret_key = secrets.token_urlsafe(30)
        # On every address: the pod runner's containers reach it on their bridge at the host's (reachable_at).
        self.proc = subprocess.Popen([PYTHON, "-m", "moto.server", "-H", "0.0.0.0", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=dict(os.environ, **{TAG: "s3-server-" + uuid.uuid4().hex}))
        wait_until(self._up, 60, "moto's S3 server")

    def reachable_at(self, host: str) -> str:
        """Its URL as a peer that reaches this machine at `host` names it (a pod: pod_runner.host_address())."""
        return f"http://{host}:{self.port}"

    def _up(self) -> bool:
        assert self.proc.poll() is None, "moto's server exited"
        try:
            return requests.get(self.url + "/moto-api/", timeout=1).status_code == 200
        except requests.ConnectionError:
            return False

    def bucket(self) -> str:
        name = "ckpt-" + uuid.uuid4().hex[:12]
        assert requests.put(f"{self.url}/{name}", timeout=10).status_code == 200
        return name

    def objects(self, bucket: str) -> list:
        """Every key in the bucket (moto's own listing, not trialkit's)."""
        import xml.etree.ElementTree as ET

        text = requests.get(f"{self.url}/{bucket}?list-type=2&max-keys=1000", timeout=10).text
        ns = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}
        return sorted(node.text for node in ET.fromstring(text).findall("s3:Contents/s3:Key", ns))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch) -> S3Server:
    """The server, with its credentials in the environment the test's commands inherit."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return s3_server


def create_secret(api, server: S3Server, name: str, namespace: str = "default") -> None:
    """`kubectl create secret generic NAME --from-literal=...` of the server's credentials, on a FakeApiServer
    (tests/k8s_fake_api.py): what a config's checkpointStorage.secretName names."""
    with api._lock:
        api.objects[f"/api/v1/namespaces/{namespace}/secrets/{name}"] = {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "stringData": {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key,
                           "AWS_REGION": "us-east-1"}}


def kubeflow_config(tmp_path: Path, server: S3Server, address: str, **keys) -> Path:
    """tmp_path/project/config.yml: a PyTorchJob trial (one master, the trial image, its code at /code) whose
    checkpoints go to a new bucket of the server, reached at `address` (pod_runner.host_address()), with the
    credentials of the Secret team-s3 (create_secret); `keys` complete it (search space, tuner, command...)."""
    config = {"trainingService": {"platform": "kubeflow", "namespace": "default", "managerAddress": address,
                                  "dockerImage": "trainer:1", "workingDir": "/code", "master": {"replicas": 1}},
              "checkpointStorage": {"type": "s3", "bucket": server.bucket(), "secretName": "team-s3",
                                    "endpointUrl": server.reachable_at(address)}, **keys}
    path = tmp_path / "project" / "config.yml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(config))
    return path
