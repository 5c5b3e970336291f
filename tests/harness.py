"""Real managers and keepers for the delivery tests: processes on loopback, stopped by their pids."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from trialkit import records
from trialkit.manager.store import Store

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# A trial that reports T_COUNT metrics, valued run * 1e6 + i so that every report is unique.
# T_GATE: run 0 stops before that report until the file `go` appears (after touching `gated`).
# T_HOLD: run 0 then waits to be killed instead of finishing.
TRAIN = """
import os, pathlib, time, trialkit
run = int(os.environ["TRIALKIT_RESTART_COUNT"])
count, gate = int(os.environ["T_COUNT"]), int(os.environ.get("T_GATE", "-1"))
signals = pathlib.Path(os.environ["T_SIGNALS"])
for i in range(count):
    if i == gate and run == 0:
        (signals / "gated").touch()
        while not (signals / "go").exists():
            time.sleep(0.01)
    trialkit.report_intermediate_result(run * 1000000 + i)
(signals / f"wrote-{run}").touch()
while os.environ.get("T_HOLD") and run == 0:
    time.sleep(1)
trialkit.report_final_result(run)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


class Manager:
    """`python -m trialkit.manager.server` on a fixed loopback port: start, kill, start again."""

    def __init__(self, exp_dir: Path, port: Optional[int] = None):
        self.exp_dir = exp_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self._store: Optional[Store] = None
        store = Store.in_dir(exp_dir)
        store.create_experiment("exp")
        store.close()

    def register(self, trial_id: str, token: str, parameters: Optional[dict] = None) -> None:
        store = Store.in_dir(self.exp_dir)
        store.add_trial("exp", trial_id, sequence=0, parameters=parameters or {}, token=token)
        store.close()

    def start(self) -> "Manager":
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "trialkit.manager.server", "--experiment-dir", str(self.exp_dir), "--port", str(self.port)],
            env=child_environ(), stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("listening on"), line
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc.stdout.close()

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store.in_dir(self.exp_dir)
        return self._store

    def close(self) -> None:
        self.kill()
        if self._store:
            self._store.close()


def child_environ(**extra: str) -> Dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TRIALKIT_", "NNI_"))}
    environ["TRIALKIT_TEST_TAG"] = os.environ["TRIALKIT_TEST_TAG"]  # the no-process-left check follows it
    environ["PYTHONPATH"] = str(ROOT)
    environ["PYTHONUNBUFFERED"] = "1"
    environ.update(extra)
    return environ


def start_keeper(trial_dir: Path, command: List[str], *, manager: Manager, trial_id: str = "t1",
                 token: str = "token-1", options: List[str] = (), **extra: str) -> subprocess.Popen:
    environ = child_environ(TRIALKIT_TRIAL_ID=trial_id, TRIALKIT_TOKEN=token, TRIALKIT_MANAGER_URL=manager.url,
                            TRIALKIT_EXPERIMENT_ID="exp", **extra)
    return subprocess.Popen([PYTHON, "-m", "trialkit.keeper", "--quiet", "--trial-dir", str(trial_dir), *options,
                             "--", *command], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def train_command(tmp_path: Path) -> List[str]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    return [PYTHON, str(script)]


def channel_records(path: Path) -> List[dict]:
    """Every whole record the SDK wrote: what the manager must end up holding, each once."""
    decoder = records.SeqDecoder(lambda at, why: None)
    with open(path, "rb") as f:
        frames = decoder.feed(f.read())
    return [json.loads(p) for p, _ in frames]


def assert_delivered_once(manager: Manager, trial_id: str, written: List[dict], statuses: List[str]) -> None:
    stored = manager.store.records_for(trial_id)
    spools: Dict[int, List[int]] = {}  # each spool's seqs as it numbered them, by the base the store gave it
    for r in stored:
        spools.setdefault(r["seq"] - r["seq"] % records.SPOOL_SEQS, []).append(r["seq"] % records.SPOOL_SEQS)
    assert all(seqs == list(range(1, len(seqs) + 1)) for seqs in spools.values()), spools.keys()
    assert manager.store.acked_seq(trial_id) == len(spools[max(spools)])  # the latest spool's
    metrics = sorted((r["type"], r["value"]) for r in stored if r["type"] != records.STATUS)
    assert metrics == sorted((r["type"], r["value"]) for r in written)
    assert [r["value"]["status"] for r in stored if r["type"] == records.STATUS] == statuses


def signal_and_wait(proc: subprocess.Popen, signum: int, timeout: float) -> int:
    """Send `signum` and wait for the end; a process that outlives `timeout` is killed and the test fails
    with its threads' stacks (py-spy) and its stderr: a hang seen once in CI must say where it hung."""
    proc.send_signal(signum)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        spy = Path(sys.executable).with_name("py-spy")
        stacks = subprocess.run([str(spy), "dump", "--pid", str(proc.pid)], capture_output=True, text=True,
                                timeout=60).stdout if spy.exists() else "(no py-spy)"
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"pid {proc.pid} still ran {timeout:g} s after signal {signum}:\n{stacks}\n"
                             f"its stderr:\n{err}") from None
