"""A trial's output reaches the manager as its metrics do (issue 23, item 2).

Two ranks under wrap_rank write 5 MB each; `trialkit trial logs --rank N`
reads every line of rank N back from the store, in order, on the local
platform, on Ray, and after the control plane was killed with SIGKILL in the
middle of the output and resumed. Past the cap, a line says what was cut.
"""
from __future__ import annotations

import time

import pytest

from experiment_util import PYTHON, cli, experiment, experiment_id, export, start_cli
from trialkit.keeper import logship

LINES = 50_000  # a rank: 100-byte lines, 5 MB
GENERATE = f"""
import sys, time, trialkit
rank = int(sys.argv[1])
pause = float(sys.argv[2])
for i in range({LINES}):
    sys.stdout.write("rank %d line %06d %s\\n" % (rank, i, "x" * 80))
    if i == {LINES} // 2:
        sys.stdout.flush()
        time.sleep(pause)  # half the output out: time for a test to kill the control plane
sys.stdout.flush()
print("rank", rank, "to stderr", file=sys.stderr)
if rank == 0:
    trialkit.get_next_parameter()
    trialkit.report_final_result(1)
"""
# Two ranks at once under wrap_rank, as a launcher starts them (shell syntax: run under sh).
COMMAND = (f"{PYTHON} -m trialkit.launch.wrap_rank 0 {PYTHON} gen.py 0 {{pause}} & "
           f"{PYTHON} -m trialkit.launch.wrap_rank 1 {PYTHON} gen.py 1 {{pause}}; wait")


def project(tmp_path, pause: float = 0.0, **keys):
    config = experiment(tmp_path, {"x": {"_type": "choice", "_value": [1]}}, "", maxTrialNumber=1,
                        trialCommand=COMMAND.format(pause=pause), **keys)
    (config.parent / "gen.py").write_text(GENERATE)
    return config


def check_logs(trial_id: str) -> None:
    for rank in (0, 1):
        done = cli("trial", "logs", trial_id, "--rank", rank)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        expected = [f"[rank={rank}] rank {rank} line {i:06d} {'x' * 80}" for i in range(LINES)]
        assert lines[:LINES] == expected, "every line of the rank, once, in order"
        assert lines[LINES:] == [f"[rank={rank}] rank {rank} to stderr"]
    everything = cli("trial", "logs", trial_id).stdout
    assert everything.count("line ") == 2 * LINES and "trialkit: " not in everything  # nothing cut below the cap


@pytest.mark.slow
def test_two_ranks_output_read_back_by_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    done = cli("run", project(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    exp = experiment_id(done.stdout.splitlines()[0])
    (row,) = export(exp)
    assert row["status"] == "SUCCEEDED"
    check_logs(row["trial_id"])
    # The page reads the same: for a trial whose log file is not on this machine (a cluster's),
    # from what its keeper shipped, one rank at a time.
    (tmp_path / "home" / "experiments" / exp / "trials" / row["trial_id"] / "stdout.log").unlink()
    page_lines = read_page_log(tmp_path / "home", exp, row["trial_id"], rank=1)
    assert page_lines == [f"[rank=1] rank 1 line {i:06d} {'x' * 80}" for i in range(LINES)]


def read_page_log(home, exp: str, trial: str, rank: int) -> list:
    """The page's log route from the start (offset 0) until it has nothing more, as `trialkit ui` serves it."""
    import os
    import subprocess
    import sys

    import requests

    code = "import sys; from trialkit.web import serve_ui; sys.exit(serve_ui(None, 0))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, TRIALKIT_HOME=str(home)))
    try:
        base, token = proc.stdout.readline().split()[-1].split("/?token=")
        route = f"{base}/api/ui/experiments/{exp}/trials/{trial}/log"
        headers = {"Authorization": f"Bearer {token}"}
        assert requests.get(route, params={"offset": "\u00b2"}, headers=headers, timeout=10).status_code == 400
        text, offset = "", 0
        while True:
            part = requests.get(route, params={"name": "stdout", "offset": offset, "rank": rank}, headers=headers,
                                timeout=10).json()
            if part["end"] == offset:
                return text.splitlines()
            text, offset = text + part["text"], part["end"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.slow
def test_nothing_is_lost_over_a_sigkill_of_the_control_plane(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TRIALKIT_HOME", str(home))
    proc = start_cli("run", project(tmp_path, pause=4.0))
    try:
        exp = experiment_id(proc.stdout.readline())
        trial_dir = home / "experiments" / exp / "trials" / f"{exp}-00000"
        deadline = time.monotonic() + 60
        while "line 025000" not in _read(trial_dir / "stdout.log"):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
    finally:
        proc.kill()  # mid-output: the keeper spools what it cannot deliver
        proc.wait()
    done = cli("experiment", "resume", exp)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = export(exp)
    assert (row["status"], row["restart_count"]) == ("SUCCEEDED", 0)
    check_logs(row["trial_id"])


def _read(path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_past_the_cap_a_line_says_what_was_cut():
    shipped = []
    budget = logship.Budget(rate=1e9, burst=1e9, cap=1000)
    stream = logship.LogStream("stdout", budget, lambda name, text: shipped.append(text),
                               lambda delay, callback: None)
    stream.feed(b"a" * 99 + b"\n")  # 100 bytes: fits
    stream.flush()
    stream.feed(b"b" * 2000 + b"\n")  # over the cap: cut
    stream.flush()
    stream.flush(final=True)
    assert shipped[0] == "a" * 99 + "\n"
    assert shipped[1].startswith("[trialkit: 1 lines (2001 bytes) of output not sent to the manager: over the log cap")
    assert len(shipped) == 2


def test_over_the_rate_lines_are_cut_then_the_next_chunk_says_so():
    shipped = []
    budget = logship.Budget(rate=0.0, burst=150, cap=10 ** 6)
    stream = logship.LogStream("stderr", budget, lambda name, text: shipped.append(text),
                               lambda delay, callback: None)
    for text in (b"x" * 99 + b"\n", b"y" * 99 + b"\n", b"z" * 9 + b"\n"):
        stream.feed(text)
        stream.flush()
    assert shipped[0] == "x" * 99 + "\n"
    assert shipped[1].startswith("[trialkit: 1 lines (100 bytes) of output not sent to the manager: over the log rate")
    assert shipped[1].endswith("z" * 9 + "\n")


@pytest.mark.slow
def test_a_ray_trials_output_read_back_by_rank(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    config = project(tmp_path, nniManagerIp="127.0.0.1",
                     trainingService={"platform": "ray", "address": ray_cluster.address})
    done = cli("run", config, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = export(experiment_id(done.stdout.splitlines()[0]))
    assert row["status"] == "SUCCEEDED"
    check_logs(row["trial_id"])
    ray_cluster.wait_clean()


def test_writes_to_a_shared_pipe_end_at_line_ends_within_pipe_buf():
    from trialkit.launch.wrap_rank import whole_line_pieces

    data = b"".join(b"%05d %s\n" % (i, b"y" * (i % 300)) for i in range(2000)) + b"z" * 10000 + b"\ntail"
    pieces = [bytes(p) for p in whole_line_pieces(data, 4096)]
    assert b"".join(pieces) == data
    assert all(len(p) <= 4096 for p in pieces)
    long_line = next(i for i, p in enumerate(pieces) if p.startswith(b"z"))
    assert all(p.endswith(b"\n") for p in pieces[:long_line]), "every piece before the long line ends a line"
