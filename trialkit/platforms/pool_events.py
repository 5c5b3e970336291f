"""Wake the control planes that wait on a home's resource pool when it may give them slots, across processes.

A process that frees slots or changes who goes first (pools.py: a lease released, a job that stops or starts
waiting, a job update) calls `tell(home)`, which rewrites $TRIALKIT_HOME/pools.events/changed; each waiting
control plane holds a `Listener`, which watches that directory with inotify (keeper/watch.py's DirWatch) and
the pidfds of the leases' holders, so it looks at the lease table as soon as either speaks:

    listener = Listener(home)
    while trials_wait():
        look_at_the_lease_table()
        listener.wait(pool.holders())   # a change told, a holder ended, or LOOK_SECONDS passed

A holder SIGKILLed (a keeper whose control plane died before it) releases nothing, but its pidfd turns
readable. What neither tells (a job ahead whose control plane died while it waited, or a fair share order
changed by another job's grant) is seen at the next look, LOOK_SECONDS at most later. Where inotify is
refused, DirWatch polls every 0.2 s instead.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List, Sequence, Tuple

from trialkit import process
from trialkit.keeper.watch import DirWatch

DIR_NAME = "pools.events"
FILE_NAME = "changed"
LOOK_SECONDS = 2.0  # a look all the same, for what no one tells (see above)


def tell(home: Path) -> None:
    """Every Listener of this home looks at the lease table again."""
    # Opened for writing and closed: inotify's IN_CLOSE_WRITE. Empty, so a full disk takes it too.
    try:
        (home / DIR_NAME / FILE_NAME).write_bytes(b"")
    except OSError:
        # No pools.Pool opened this home (none listens), the file is another user's of a shared home, or the
        # disk refuses: the listeners' next look, LOOK_SECONDS at most later, sees the change all the same.
        pass


class Listener:
    """What a waiting control plane sleeps on (one thread's: not shared)."""

    def __init__(self, home: Path):
        self._loop = process.EventLoop(signals=())  # no handlers installed: a thread's loop of fds and timers
        self._told = False
        self._watch = DirWatch(self._loop, [home / DIR_NAME], self._hear)  # the dir: made by pools.Pool

    def wait(self, holders: Sequence[Tuple[int, int]], timeout: float = LOOK_SECONDS) -> None:
        """Until a change is told (or was, since the last wait), one of `holders` ((pid, start ticks) of
        processes alive now) ends, or `timeout` passes."""
        pidfds = self._pidfds(holders)
        try:
            for fd in pidfds:
                self._loop.add_reader(fd, self._hear)  # a pidfd turns readable when its process ends
            self._loop.run_until(lambda: self._told, time.monotonic() + timeout)
        finally:
            for fd in pidfds:
                self._loop.remove_reader(fd)
                os.close(fd)
        self._told = False

    def close(self) -> None:
        self._watch.close()
        self._loop.close()

    def _hear(self) -> None:
        self._told = True

    def _pidfds(self, holders: Sequence[Tuple[int, int]]) -> List[int]:
        fds = []
        for pid, ticks in holders:
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # ended since it was found alive: its slots are free now
                self._told = True
                continue
            if process.is_running(pid, ticks):  # checked with the fd open: the fd names the very process checked
                fds.append(fd)
            else:
                os.close(fd)
                self._told = True
        return fds
