"""How the local platform starts a trial's keeper (platforms/local.py, process.spawn).

The keeper is started without a forked copy of the control plane (vfork): the child inherits the
calling thread's signal mask, so a keeper started from a thread that blocks SIGTERM (an embedding
program's, a server's) must still get an empty one, or no stop would ever reach it.
"""
from __future__ import annotations

import signal
import threading

from pools_util import home  # noqa: F401 (home: a fixture)

from trialkit import env
from trialkit.platforms.base import TrialSpec
from trialkit.platforms.local import LocalConfig, Platform

WAIT = 60.0  # an upper bound for a loaded machine; never waited for on success


def test_a_keeper_started_from_a_thread_that_blocks_stops_gets_an_empty_signal_mask(tmp_path):
    platform = Platform(LocalConfig(), tmp_path / "exp")
    ended = threading.Event()
    platform.on_end = lambda handle: ended.set()
    mask_file = tmp_path / "keeper-mask"
    # The trial is the keeper's child: its parent's mask is the keeper's.
    spec = TrialSpec("exp", "exp-00000", 0, "", env={
        env.COMMAND: f"grep SigBlk /proc/$PPID/status > {mask_file}", env.PARAMETERS: "{}"})
    after: list = []

    def submit() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT])
        platform.submit(spec)
        after.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))

    thread = threading.Thread(target=submit)
    thread.start()
    thread.join()
    assert ended.wait(WAIT)
    assert platform.status("exp-00000").status == "SUCCEEDED"
    assert mask_file.read_text().split() == ["SigBlk:", "0000000000000000"]
    assert after == [{signal.SIGTERM, signal.SIGINT}]  # the thread's own mask is as it was
