"""A trial that ignores its stop, under a keeper and a launcher: killed when the keeper's grace is over,
it leaves nothing behind on the node (docs/launchers.md): no engine log in the temporary directory."""
from __future__ import annotations

import importlib.util
import signal

import pytest

from launch_support import PY, Proc, launch_env, write

pytestmark = pytest.mark.slow

KEEPER = [PY, "-m", "trialkit.keeper", "--grace", "2", "--"]
# Ignores every stop signal: only the SIGKILL at the grace's end ends it.
IGNORES_STOPS = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(300)
"""
LAUNCHERS = [
    pytest.param("torch_distributed", "torch", id="torchrun"),
    pytest.param("deepspeed", "deepspeed", id="deepspeed"),
    pytest.param("horovod", "horovod", id="horovodrun"),
]


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"needs {module}")


def start_and_stop(tmp_path, launcher: str, script: str, **extra: str) -> Proc:
    """The keeper runs the launcher over two workers that say ready; SIGTERM, then its end (143: killed)."""
    path = write(tmp_path, "ignore.py", script)
    proc = Proc([*KEEPER, PY, "-m", f"trialkit.launch.{launcher}", str(path)],
                launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2", TMPDIR=str(tmp_path), **extra))
    for rank in (0, 1):
        proc.wait_for(rf"\[rank={rank}\] ready", timeout=300)
    proc.signal(signal.SIGTERM)
    assert proc.finish(timeout=60) == 137, proc.err[-3000:]
    assert b"killed: it was still running 2 s after SIGTERM" in proc.err
    return proc


@pytest.mark.parametrize("launcher,module", LAUNCHERS)
def test_a_launcher_killed_after_the_grace_leaves_no_log(tmp_path, launcher, module):
    needs(module)
    start_and_stop(tmp_path, launcher, IGNORES_STOPS)
    assert not list(tmp_path.glob("trialkit-*.log"))
