"""Tell the keeper's event loop when files in some directories change.

Linux's inotify (through ctypes: no extra package) gives a file descriptor
that becomes readable when a watched directory's files are written, created
or renamed into place; the loop selects on it with everything else, so the
keeper sleeps until there is something to read. Where inotify is missing
(another OS, a filesystem or a container that refuses it), a short timer
polls instead. Either way the callback says only "look again": the reader
works out what is new from the files' sizes.

Watching ends in two steps, stop() then close(), because closing an inotify
fd makes the kernel wait for its watches to be freed (an SRCU grace period,
measured here at up to ~15 ms) and the keeper closes it on its way out. Removed
watches are freed in the background, so stop() as soon as the trial is over
leaves close() almost nothing to wait for.
"""
from __future__ import annotations

import os
from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: 2 of the 5.6 ms the reporting side imports beside the trial's start
if TYPE_CHECKING:
    from typing import Callable, Iterable, List, Optional, Tuple

from trialkit.process import EventLoop, libc

POLL_SECONDS = 0.2  # fallback only

_IN_MODIFY = 0x002
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_MASK = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC


def _inotify_libc():
    """The C library where it has inotify, else None (then a timer polls)."""
    return libc if libc is not None and hasattr(libc, "inotify_init1") else None


class DirWatch:
    def __init__(self, loop: EventLoop, dirs: Iterable[Path], on_change: Callable[[], None]):
        self.loop = loop
        self.on_change = on_change
        self._fd: Optional[int] = None
        self._watches: List[int] = []
        self._stopped = False
        found = self._inotify(dirs)
        if found is None:
            loop.call_later(POLL_SECONDS, self._poll)
        else:
            self._fd, self._watches = found
            loop.add_reader(self._fd, self._on_readable)

    @property
    def event_driven(self) -> bool:
        return self._fd is not None

    @staticmethod
    def _inotify(dirs: Iterable[Path]) -> Optional[Tuple[int, List[int]]]:
        """An inotify fd watching `dirs` and its watch descriptors, or None where inotify fails."""
        inotify = _inotify_libc()
        if inotify is None:
            return None
        fd = inotify.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        watches = []
        for path in dirs:
            watches.append(inotify.inotify_add_watch(fd, os.fsencode(path), _MASK))
            if watches[-1] < 0:
                os.close(fd)
                return None
        return fd, watches

    def _on_readable(self) -> None:
        try:
            while os.read(self._fd, 1 << 16):
                pass  # the events' contents do not matter: only that something changed
        except BlockingIOError:
            pass
        self.on_change()

    def _poll(self) -> None:
        if self._stopped:
            return
        self.on_change()
        self.loop.call_later(POLL_SECONDS, self._poll)

    def stop(self) -> None:
        """No more callbacks; the kernel starts freeing the watches, in the background."""
        if self._stopped:
            return
        self._stopped = True
        if self._fd is not None:
            self.loop.remove_reader(self._fd)  # removing a watch queues an event nobody needs
            for watch in self._watches:
                libc.inotify_rm_watch(self._fd, watch)

    def close(self) -> None:
        self.stop()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
