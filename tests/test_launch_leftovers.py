"""What a launch left (trialkit.launch.leftovers) is removed, and only that: never a file a live process holds,
never a file that was there before the launch. Real holders: torch's FileBaton discipline and a multiprocessing
semaphore of a process that does not fork."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trialkit.launch import leftovers

# Takes the build lock as torch's FileBaton does (O_CREAT|O_EXCL, held open while it builds), says so, waits.
HOLDS_A_LOCK = "import os, sys, time; os.open(sys.argv[1], os.O_CREAT | os.O_EXCL); print('held', flush=True); time.sleep(60)"
# A named semaphore, as horovodrun's multiprocessing makes them (mapped while it is used).
HOLDS_A_SEMAPHORE = ("import multiprocessing, time; lock = multiprocessing.get_context('spawn').Lock(); "
                     "print('held', flush=True); time.sleep(60)")


@pytest.fixture
def holder():
    """Starts a process that holds something and returns once it says so; killed (by pid) at the end."""
    started = []

    def start(code: str, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE)
        started.append(proc)
        assert proc.stdout.readline() == b"held\n"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_lock_whose_holder_was_killed_goes_and_a_held_one_stays(tmp_path, holder):
    globs = leftovers.torch_extension_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    for op in ("killed_build", "live_build"):
        (tmp_path / op).mkdir()
    before = leftovers.snapshot(globs)
    killed = holder(HOLDS_A_LOCK, str(tmp_path / "killed_build" / "lock"))
    holder(HOLDS_A_LOCK, str(tmp_path / "live_build" / "lock"))  # another trial's build of the same op
    killed.kill()
    killed.wait()
    assert leftovers.remove_left_behind(globs, before, wait=1.0) == [str(tmp_path / "killed_build" / "lock")]
    assert (tmp_path / "live_build" / "lock").exists()


def test_a_lock_there_before_the_launch_stays(tmp_path):
    globs = leftovers.torch_extension_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    (tmp_path / "op").mkdir()
    (tmp_path / "op" / "lock").touch()  # not ours: left by a run outside trialkit, or being made
    assert leftovers.remove_left_behind(globs, leftovers.snapshot(globs), wait=0.5) == []
    assert (tmp_path / "op" / "lock").exists()


def test_a_semaphore_in_use_stays(holder):
    before = leftovers.snapshot([leftovers.SEMAPHORES])
    holder(HOLDS_A_SEMAPHORE)
    theirs = {path for path, _, _ in leftovers.snapshot([leftovers.SEMAPHORES]) - before}
    assert theirs
    removed = leftovers.remove_left_behind([leftovers.SEMAPHORES], before, wait=0.5)
    assert not theirs & set(removed)
    assert all(os.path.exists(path) for path in theirs)


def test_where_torch_puts_its_build_locks():
    assert leftovers.torch_extension_locks({"TORCH_EXTENSIONS_DIR": "/x"}) == ["/x/*/lock"]
    assert leftovers.torch_extension_locks({"XDG_CACHE_HOME": "/c"}) == ["/c/torch_extensions/*/*/lock"]
