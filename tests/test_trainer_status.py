"""The keeper posts the trial's progress to Kubeflow Trainer's status endpoint (keeper/trainer_status.py).

A real keeper runs a real trial; a stand-in of Trainer's endpoint on loopback speaks HTTPS with its own
CA certificate and checks the bearer token of the file Trainer would mount, as Trainer does.
"""
from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness import child_environ
from keeper_util import KEEPER, py
from test_manager_guard import self_signed

PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/tk-exp-00001/status"
# After its first result the trial waits (10 s at most) for the endpoint's first post, the file POSTED: a keeper
# slowed by load once read all three results in one go and made one post, the last.
TRIAL = """
import os, time, trialkit
trialkit.report_intermediate_result({"default": 0.25, "loss": 1.5})
deadline = time.monotonic() + 10
while not os.path.exists(os.environ["POSTED"]) and time.monotonic() < deadline:
    time.sleep(0.02)
trialkit.report_intermediate_result(0.5)
trialkit.report_final_result(0.75)
"""


class Endpoint:
    """Trainer's status endpoint, standing in: every POST's body and Authorization header, in order."""

    def __init__(self, tmp_path, hang: bool = False):
        self.posts: list = []
        self.hang = hang
        self.posted = tmp_path / "posted"
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.posts.append((self.path, self.headers.get("Authorization"), body))
                endpoint.posted.touch()
                if endpoint.hang:
                    time.sleep(30)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.cert, key = self_signed(tmp_path)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}{PATH}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def keeper(tmp_path, endpoint: Endpoint, token_file) -> subprocess.CompletedProcess:
    env = child_environ(TRIALKIT_TRIAL_DIR=str(tmp_path / "trial"), KUBEFLOW_TRAINER_SERVER_URL=endpoint.url,
                        KUBEFLOW_TRAINER_SERVER_CA_CERT=endpoint.cert, KUBEFLOW_TRAINER_SERVER_TOKEN=str(token_file),
                        TRIALKIT_GRACE_SECONDS="2", POSTED=str(endpoint.posted))
    return subprocess.run([*KEEPER, "--flush-seconds", "3", "--", *py(TRIAL)], env=env, capture_output=True,
                          text=True, timeout=60)


def test_kubectl_get_trainjob_shows_the_trials_progress_and_metrics(tmp_path):
    endpoint = Endpoint(tmp_path)
    token = tmp_path / "token"
    token.write_text("projected-sa-token\n")
    try:
        done = keeper(tmp_path, endpoint, token)
    finally:
        endpoint.close()
    assert done.returncode == 0, done.stderr
    assert endpoint.posts, done.stderr
    assert all(path == PATH and auth == "Bearer projected-sa-token" for path, auth, _ in endpoint.posts)
    first, last = endpoint.posts[0][2]["trainerStatus"], endpoint.posts[-1][2]["trainerStatus"]
    assert "progressPercentage" not in first  # an NNI trial names no total: its progress is known at its end
    assert {m["name"]: m["value"] for m in first["metrics"]} == {"default": "0.25", "loss": "1.5",
                                                                 "intermediateResults": "1"}
    assert last["progressPercentage"] == 100
    assert {m["name"]: m["value"] for m in last["metrics"]} == {"default": "0.75", "intermediateResults": "2"}
    assert last["lastUpdatedTime"].endswith("Z")
    # Rate-limited: the second intermediate result and the final one, right after the first post, make one more.
    assert len(endpoint.posts) <= 2


def test_an_endpoint_that_never_answers_holds_neither_the_trial_nor_the_keeper(tmp_path):
    endpoint = Endpoint(tmp_path, hang=True)
    token = tmp_path / "token"
    token.write_text("t")
    started = time.monotonic()
    try:
        done = keeper(tmp_path, endpoint, token)
    finally:
        endpoint.close()
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert took < 3 + 10, took  # the flush's 3 s bound it, however long the endpoint waits
    assert json.loads((tmp_path / "trial" / ".trialkit" / "status.json").read_text())["status"] == "SUCCEEDED"
    assert endpoint.posts  # it was asked, and never answered
