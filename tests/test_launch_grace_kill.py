"""A trial that ignores its stop, under a keeper and a launcher: killed when the keeper's grace is over,
it leaves nothing behind on the node (docs/launchers.md): no engine log nor its workers' socket dir in the
temporary directory, no DeepSpeed shared-memory segment nor horovodrun semaphore in /dev/shm, no torch extension
build lock that would hang the next run."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Optional, Set

import psutil
import pytest

from launch_support import PY, Proc, free_port, launch_env, write

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


def start_and_stop(tmp_path, launcher: str, script: str, tmpdir: Optional[Path] = None, **extra: str) -> Proc:
    """The keeper runs the launcher over two workers that say ready; SIGTERM, then its end (143: killed)."""
    path = write(tmp_path, "ignore.py", script)
    proc = Proc([*KEEPER, PY, "-m", f"trialkit.launch.{launcher}", str(path)],
                launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2", TMPDIR=str(tmpdir or tmp_path), **extra))
    for rank in (0, 1):
        proc.wait_for(rf"\[rank={rank}\] ready", timeout=300)
    proc.signal(signal.SIGTERM)
    assert proc.finish(timeout=60) == 137, proc.err[-3000:]
    assert b"killed: it was still running 2 s after SIGTERM" in proc.err
    return proc


@pytest.mark.parametrize("launcher,module", LAUNCHERS)
def test_a_launcher_killed_after_the_grace_leaves_no_log_nor_socket_dir(tmp_path, launcher, module):
    needs(module)
    # A TMPDIR short enough for a socket's path (pytest's tmp_path is not: the launcher would use /tmp).
    tmpdir = Path(tempfile.mkdtemp(prefix="tk", dir="/tmp"))
    try:
        start_and_stop(tmp_path, launcher, IGNORES_STOPS, tmpdir)
        assert not list(tmpdir.glob("trialkit-*.log"))
        # Nor the dir of its workers' socket (newcomer21: trialkit-launch-*/workers.sock stayed); its cleaner
        # runs once the launcher is gone: milliseconds.
        deadline = time.monotonic() + 5
        while list(tmpdir.glob("trialkit-launch-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not list(tmpdir.glob("trialkit-launch-*"))
        assert not list(tmpdir.glob("torchelastic_*"))  # torchrun's: the launch's dir is its TMPDIR
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def semaphores_of(pid: int) -> Set[str]:
    """The multiprocessing semaphores (/dev/shm/sem.mp-*) that a process tree has mapped."""
    root = psutil.Process(pid)
    names: Set[str] = set()
    for process in [root, *root.children(recursive=True)]:
        try:
            names.update(re.findall(r"/dev/shm/(sem\.mp-\S+)", Path(f"/proc/{process.pid}/maps").read_text()))
        except OSError:
            pass  # gone meanwhile
    return names


def test_horovodrun_killed_at_the_end_of_its_grace_leaves_no_semaphores(tmp_path):
    """horovodrun's own multiprocessing semaphores (ten with horovod 0.28) outlived it when the launcher
    SIGKILLed its group at the end of the grace: its resource tracker, which unlinks them, died in the same
    kill (hygiene13). The launcher alone: under a keeper, whose SIGKILL may come first, the tracker may live."""
    needs("horovod")
    path = write(tmp_path, "ignore.py", IGNORES_STOPS)
    proc = Proc([PY, "-m", "trialkit.launch.horovod", str(path)],
                launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2", TRIALKIT_GRACE_SECONDS="2", TMPDIR=str(tmp_path)))
    for rank in (0, 1):
        proc.wait_for(rf"\[rank={rank}\] ready", timeout=300)
    theirs = semaphores_of(proc.popen.pid)
    assert theirs
    proc.signal(signal.SIGTERM)
    # 143, or 137 when a worker's SIGKILL is reported before the launcher's own end
    assert proc.finish(timeout=60) in (137, 143), proc.err[-3000:]

    def left() -> list:
        return [name for name in theirs if os.path.exists(os.path.join("/dev/shm", name))]

    deadline = time.monotonic() + 5  # the launcher's cleaner runs once it is gone: a fraction of a second
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left()


# DeepSpeed's CPU all-reduce maps a segment a rank in /dev/shm (69 MB each) and never unlinks it. The signals
# are ignored only after the group is up: the first run builds DeepSpeed's op with ninja, which a stop would cut.
DEEPSPEED_IGNORES_STOPS = """
import signal, time, torch, deepspeed
deepspeed.init_distributed(dist_backend="gloo")
deepspeed.comm.all_reduce(torch.ones(1))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(300)
"""


def test_deepspeed_killed_after_the_grace_leaves_no_shared_memory(tmp_path):
    needs("deepspeed")
    port = free_port()
    ours = f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_"

    def segments() -> list:
        return [name for name in os.listdir("/dev/shm") if name.startswith(ours)]

    start_and_stop(tmp_path, "deepspeed", DEEPSPEED_IGNORES_STOPS, TRIALKIT_CHIEF_ADDR="127.0.0.1",
                   TRIALKIT_CHIEF_PORT=str(port))
    deadline = time.monotonic() + 5  # the launcher's cleaner runs once it is gone: milliseconds
    while segments() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not segments()


# DeepSpeed JIT-builds its CPU communication op under torch's FileBaton: a `lock` file in the op's build dir,
# created and held open while it builds and removed after. A build killed with its launch left it, and every
# later DeepSpeed run waited for it in init_distributed, forever (hygiene13). Rank 0 holds the real baton.
HOLDS_THE_BUILD_LOCK = """
import os, signal, time
from torch.utils.file_baton import FileBaton
if os.environ["RANK"] == "0":
    assert FileBaton(os.environ["BUILD_LOCK"]).try_acquire()  # as torch's cpp_extension does while it builds
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(300)
"""
LOADS_THE_OP = """
import torch, deepspeed
deepspeed.init_distributed(dist_backend="gloo")  # loads the op, through its build lock
t = torch.ones(1)
deepspeed.comm.all_reduce(t)
print(f"sum {t.item():g}", flush=True)
torch.distributed.destroy_process_group()
"""


def test_a_build_lock_left_by_a_killed_launch_does_not_hang_the_next_run(tmp_path):
    needs("deepspeed")
    extensions = tmp_path / "extensions"  # the machine's own cache is shared with runs we must not disturb
    built = sorted(Path.home().glob(".cache/torch_extensions/*/deepspeed_shm_comm"))
    if built:  # the op as built before: the next run loads it in seconds (else it builds it: minutes)
        shutil.copytree(built[0], extensions / "deepspeed_shm_comm", ignore=shutil.ignore_patterns("lock"))
    lock = extensions / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    start_and_stop(tmp_path, "deepspeed", HOLDS_THE_BUILD_LOCK, TORCH_EXTENSIONS_DIR=str(extensions),
                   BUILD_LOCK=str(lock))
    script = write(tmp_path, "allreduce.py", LOADS_THE_OP)
    proc = Proc([PY, "-m", "trialkit.launch.deepspeed", str(script)],
                launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2", TORCH_EXTENSIONS_DIR=str(extensions)))
    try:
        for rank in (0, 1):
            proc.wait_for(rf"\[rank={rank}\] sum 2\n", timeout=120 if built else 600)
    except AssertionError:  # it hangs on the lock: its own stop takes its workers down
        proc.signal(signal.SIGTERM)
        proc.finish(timeout=60)
        raise
    assert proc.finish(timeout=60) == 0, proc.err[-3000:]
    assert not lock.exists()
