"""The manager checks before it reads (issue 16, points 5 and 6): real servers on loopback, real keepers.

A trial's token writes only while the trial is live; `trialkit ui` serves no
write route; a request is refused on its headers before its body is read;
connections and header time are bounded; the page's token opens the page's
routes and nothing else; the manager speaks TLS when given a certificate.
"""
from __future__ import annotations

import datetime
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from conftest import ROOT
from harness import child_environ, wait_until
from trialkit.control.manager_http import install_admin_routes
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
from trialkit.statuses import PREEMPTED, USER_CANCELED, WAITING
from trialkit.web import install
from trialkit.web.address import page_token

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
FINAL_99 = {"records": [
    {"seq": 7, "type": "FINAL", "sequence": 0, "parameter_id": 0, "trial_job_id": "t1", "value": 99, "time": 1.0},
    {"seq": 8, "type": "STATUS", "time": 2.0, "value": {"status": "SUCCEEDED", "exit_code": 0}},
]}


@pytest.fixture
def store(tmp_path):
    store = Store.in_dir(tmp_path / "exp")
    store.create_experiment("exp")
    store.add_trial("exp", "t1", sequence=0, parameters={"lr": 0.1}, token="token-1")
    yield store
    store.close()


@pytest.fixture
def server(store):
    server = ManagerServer(store).start()
    yield server
    server.stop()


def post_records(url: str, token: str, body=FINAL_99, trial: str = "t1") -> requests.Response:
    return requests.post(f"{url}/api/v1/trials/{trial}/records", json=body,
                         headers={"Authorization": f"Bearer {token}"}, timeout=10)


def snapshot(store: Store) -> tuple:
    trial = store.trial("t1")
    return trial["status"], trial["exit_code"], store.count_records("t1"), len(store.status_history("t1"))


# ---------------------------------------------------------------- tokens (point 5)

def test_a_finished_trials_old_token_is_refused_and_changes_nothing(store, server):
    running = {"records": [{"seq": 1, "type": "STATUS", "time": 1.0, "value": {"status": "RUNNING"}}]}
    assert post_records(server.url, "token-1", running).status_code == 200  # live: it writes
    store.set_status("t1", USER_CANCELED, reason="killed by `trialkit trial kill`")  # what the loop does at its end
    before = snapshot(store)
    answer = post_records(server.url, "token-1")
    assert answer.status_code == 401 and "ended" in answer.json()["error"]
    assert snapshot(store) == before == (USER_CANCELED, None, 1, 3)
    assert requests.get(f"{server.url}/api/v1/trials/t1/parameters", headers={"Authorization": "Bearer token-1"},
                        timeout=10).status_code == 401


def test_a_paused_trial_queued_again_does_not_revive_its_old_token(store, server):
    store.set_status("t1", PREEMPTED, exit_code=143, reason="paused")
    store.set_status("t1", WAITING, reason="activated")  # queued again: live, but not yet given a new token
    before = snapshot(store)
    assert post_records(server.url, "token-1").status_code == 401
    assert snapshot(store) == before
    store.replace_token("t1", "token-2")  # started again: its new token writes
    assert store.trial("t1")["reason"] == ""  # no longer waiting: the reason of its wait went with it
    assert post_records(server.url, "token-2").status_code == 200
    assert store.trial("t1")["status"] == "SUCCEEDED"


def test_trialkit_ui_serves_no_write_route(tmp_path, store):
    home = tmp_path / "home"
    (home / "experiments").mkdir(parents=True)
    (home / "experiments" / "exp").symlink_to(store.path.parent)
    before = snapshot(store)
    code = "import sys; from trialkit.web import serve_ui; sys.exit(serve_ui(None, 0))"
    proc = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=child_environ(TRIALKIT_HOME=str(home)))
    try:
        base, token = proc.stdout.readline().split()[-1].split("/?token=")
        page = {"Authorization": f"Bearer {token}"}
        assert post_records(base, "token-1").status_code == 404  # a live trial's token: still no route
        assert requests.get(f"{base}/api/v1/trials/t1/parameters", headers={"Authorization": "Bearer token-1"},
                            timeout=10).status_code == 404
        kill = requests.post(f"{base}/api/ui/experiments/exp/trials/t1/kill", headers=page, timeout=10)
        assert kill.status_code == 404
        assert requests.get(f"{base}/api/ui/experiments/exp", headers=page, timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
    assert snapshot(store) == before


# ---------------------------------------------------------------- checked before read (point 6)

def raw_request(url: str, head: str, timeout: float = 10.0) -> bytes:
    """Send a request's head and no body; what the server answers before any body byte is sent."""
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode())
        return sock.recv(65536)


def test_a_refused_request_is_answered_before_its_body_is_read(server):
    for path, token in [("/api/v1/trials/t1/records", "wrong"), ("/api/v1/trials/t1/records", "")]:
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {token}\r\nContent-Length: {8 << 20}\r\n\r\n")
        answer = raw_request(server.url, head)  # the 8 MiB never come: an answer now means nothing was read
        assert answer.startswith(b"HTTP/1.1 401") and b"Connection: close" in answer


def test_admin_and_page_routes_check_their_tokens_on_the_headers(store, server):
    install_admin_routes(server, "admin-token", performer=None)  # refused requests never reach the loop
    install(server, store, admin_token="admin-token", read_only=False)
    page = page_token("admin-token")
    assert page != "admin-token"
    stop = "/api/v1/admin/experiment/stop"
    kill = "/api/ui/experiments/exp/trials/t1/kill"
    for path, token in [(stop, page), (stop, "nope"), (kill, "admin-token"), (kill, "")]:
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Length: {1 << 20}\r\n\r\n")
        assert raw_request(server.url, head).split(b" ")[1] in (b"401", b"403"), (path, token)
    # The page's token reads what the page shows.
    info = requests.get(f"{server.url}/api/ui/info", headers={"Authorization": f"Bearer {page}"}, timeout=10)
    assert info.status_code == 200 and info.json()["disk"] is None


def test_connections_over_the_bound_are_closed_and_the_rest_served(store):
    server = ManagerServer(store, max_connections=3).start()
    host, port = server.url.rsplit("/", 1)[1].rsplit(":", 1)
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
    try:
        wait_until(lambda: server.connections == 3, 10, "three connections to be served")
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            extra.sendall(b"GET /api/v1/trials/t1/parameters HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                assert extra.recv(100) == b""  # closed at once
            except ConnectionResetError:
                pass  # closed at once, with the request unread
        held.pop().close()
        wait_until(lambda: server.connections == 2, 10, "a slot to free")
        answer = requests.get(f"{server.url}/api/v1/trials/t1/parameters",
                              headers={"Authorization": "Bearer token-1"}, timeout=10)
        assert answer.status_code == 200
    finally:
        for sock in held:
            sock.close()
        server.stop()


def test_ctrl_c_ends_the_serving_in_the_main_thread(store):
    # `trialkit ui` serves in its main thread and ends on Ctrl-C, with a keep-alive connection open.
    code = (
        "import sys\n"
        "from trialkit.manager.server import ManagerServer\n"
        "from trialkit.manager.store import Store\n"
        "server = ManagerServer(Store(sys.argv[1]))\n"
        "signum = server.serve_until_signalled(lambda: print(server.url, flush=True))\n"
        "print('interrupted' if signum == 2 else signum, flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(store.path)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    held = None
    try:
        host, port = proc.stdout.readline().strip().rsplit("/", 1)[1].rsplit(":", 1)
        held = socket.create_connection((host, int(port)), timeout=10)
        request = b"GET /api/v1/trials/t1/parameters HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer token-1\r\n"
        held.sendall(request + b"\r\n")
        assert held.recv(65536).startswith(b"HTTP/1.1 200")  # served, and kept open for the next request
        held.sendall(request)  # whose head is still coming when Ctrl-C lands
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert proc.stdout.read().strip() == "interrupted"
    finally:
        if held is not None:
            held.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.mark.parametrize("before", ["nothing", "a request whose body takes longer than a head may"])
def test_a_client_dribbling_its_headers_is_cut_off(store, before):
    server = ManagerServer(store, header_seconds=1.0).start()
    host, port = server.url.rsplit("/", 1)[1].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            if before != "nothing":
                # The deadline follows the connection's requests: a body is not a head (it has
                # body_seconds), and the next head on the connection has a deadline of its own.
                body = b'{"records": []}'
                sock.sendall(b"POST /api/v1/trials/t1/records HTTP/1.1\r\nHost: x\r\n"
                             b"Authorization: Bearer token-1\r\nContent-Length: %d\r\n\r\n" % len(body))
                for part in (body[:5], body[5:10], body[10:]):  # 2.1 s in all, a second between parts
                    time.sleep(0.7)
                    sock.sendall(part)
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            sock.sendall(b"GET /api/v1/trials/t1/parameters HTTP/1.1\r\n")
            cut = False
            for _ in range(25):  # 5 s of dribbling, far inside the idle connections' SOCKET_TIMEOUT
                try:
                    sock.sendall(b"X")
                    time.sleep(0.2)
                except OSError:
                    cut = True
                    break
                sock.setblocking(False)
                try:
                    if sock.recv(100) == b"":
                        cut = True
                        break
                except BlockingIOError:
                    pass
                finally:
                    sock.setblocking(True)
            assert cut, "the server kept reading headers for 5 s"
    finally:
        server.stop()


def test_a_body_that_stops_coming_is_answered_408_and_its_connection_closed(store):
    server = ManagerServer(store, body_seconds=1.0).start()
    host, port = server.url.rsplit("/", 1)[1].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /api/v1/trials/t1/records HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer token-1\r\n"
                         b"Content-Length: 100\r\n\r\n{\"records\": [")
            started = time.monotonic()
            answer = b""
            while not answer.endswith(b"}") and time.monotonic() - started < 10:
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 408") and b"Connection: close" in answer, answer
            assert time.monotonic() - started < 5
            assert sock.recv(100) == b""  # closed, once what the client still sends has been let in
    finally:
        server.stop()


# ---------------------------------------------------------------- TLS (point 6)

def self_signed(tmp_path: Path) -> tuple:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trialkit-manager")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "manager.crt", tmp_path / "manager.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_a_keeper_delivers_over_tls_and_plain_http_is_refused(tmp_path, store):
    cert, key = self_signed(tmp_path)
    server = ManagerServer(store, tls=(cert, key)).start()
    try:
        assert server.url.startswith("https://127.0.0.1:")
        host, port = server.url.rsplit("/", 1)[1].rsplit(":", 1)
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"{server.url}/api/v1/trials/t1/parameters", timeout=10)  # an untrusted certificate
        plain = raw_request(server.url, "GET /api/v1/trials/t1/parameters HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not plain.startswith(b"HTTP/")  # no plaintext answer from a TLS port
        script = tmp_path / "train.py"
        script.write_text("import trialkit\nfor i in range(5):\n    trialkit.report_intermediate_result(i)\n"
                          "trialkit.report_final_result(5)\n")
        environ = child_environ(TRIALKIT_TRIAL_ID="t1", TRIALKIT_TOKEN="token-1", TRIALKIT_MANAGER_URL=server.url,
                                TRIALKIT_EXPERIMENT_ID="exp", SSL_CERT_FILE=cert)
        done = subprocess.run([PYTHON, "-m", "trialkit.keeper", "--quiet", "--trial-dir", str(tmp_path / "trial"),
                               "--", PYTHON, str(script)], env=environ, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        stored = store.records_for("t1")
        assert [r["value"] for r in stored if r["type"] == "PERIODICAL"] == [0, 1, 2, 3, 4]
        assert [r["value"] for r in stored if r["type"] == "FINAL"] == [5]
        assert store.trial("t1")["status"] == "SUCCEEDED"
        context = ssl.create_default_context(cafile=cert)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        server.stop()


def test_the_standalone_server_wants_both_tls_files(tmp_path):
    done = subprocess.run([PYTHON, "-m", "trialkit.manager.server", "--experiment-dir", str(tmp_path),
                           "--tls-cert", str(tmp_path / "c.pem")], capture_output=True, text=True, timeout=60,
                          env=child_environ())
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "--tls-key" in done.stderr


TLS_TRIAL = """
import os, pathlib, time, trialkit
seq = trialkit.get_sequence_id()
trialkit.report_intermediate_result(seq)
if seq == 1:
    while not pathlib.Path(os.environ["T_GO"]).exists():
        time.sleep(0.05)
trialkit.report_final_result(seq + 10)
"""


def test_trialkit_run_serves_its_trials_the_page_and_the_cli_over_tls(tmp_path):
    cert, key = self_signed(tmp_path)
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(TLS_TRIAL)
    (code / "config.yml").write_text(json.dumps({
        "searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}}, "trialCommand": f"{PYTHON} trial.py",
        "trialConcurrency": 2, "maxTrialNumber": 2, "trainingService": {"platform": "local"}, "trialGraceSeconds": 1,
        "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}}}))
    home = tmp_path / "home"
    # Local trials trust the certificate the way any keeper does: SSL_CERT_FILE (a pod mounts the CA).
    environ = child_environ(TRIALKIT_HOME=str(home), SSL_CERT_FILE=cert, T_GO=str(tmp_path / "go"))
    run = subprocess.Popen([PYTHON, "-m", "trialkit.cli", "run", str(code / "config.yml"), "--tls-cert", cert,
                            "--tls-key", key], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    try:
        experiment = run.stdout.readline().split()[-1]
        manager = run.stdout.readline()
        page = run.stdout.readline().split()[-1]
        assert manager.split()[1].startswith("https://127.0.0.1:") and page.startswith("https://127.0.0.1:")
        info = json.loads((home / "experiments" / experiment / "manager.json").read_text())
        assert info["url"].startswith("https://")
        store = Store.in_dir(home / "experiments" / experiment)
        try:
            wait_until(lambda: store.count_records(f"{experiment}-00000") >= 4, 60, "trial 0 to deliver over TLS")
        finally:
            store.close()
        base, token = page.split("/?token=")
        listed = requests.get(f"{base}/api/ui/experiments", verify=cert, timeout=10,
                              headers={"Authorization": f"Bearer {token.split('#')[0]}"})
        assert [e["id"] for e in listed.json()] == [experiment]
        # The CLI's admin call goes over TLS to its own manager on loopback.
        stop = subprocess.run([PYTHON, "-m", "trialkit.cli", "experiment", "stop", experiment], capture_output=True,
                              text=True, timeout=60, env=environ)
        assert stop.stdout.startswith(f"stopping experiment {experiment}"), stop.stdout + stop.stderr
        assert run.wait(timeout=60) == 0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        out, err = run.communicate()
    assert "Traceback" not in err, err
    store = Store.in_dir(home / "experiments" / experiment)
    try:
        trials = {t["sequence"]: t for t in store.trials(experiment)}
        assert trials[0]["status"] == "SUCCEEDED" and trials[1]["status"] == "PREEMPTED"  # cut short: resume reruns it
        assert [r["value"] for r in store.records_for(trials[0]["id"], type="FINAL")] == [10]
    finally:
        store.close()
