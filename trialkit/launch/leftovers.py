"""What a launch's killed processes leave on the node, and how a launcher removes it without touching anyone else's.

Some files are only ever removed by the process that made them, which a SIGKILL (the keeper's, at the end of
its grace; the launcher's, of an engine that lingers) never lets run:
- torch's cpp_extension builds an op (DeepSpeed's CPU communication op, a user's own) under a `lock` file that
  its FileBaton creates (O_CREAT|O_EXCL) and removes when the build is done; every later load of the op, in
  any run, waits for that file to go, forever.
- Python's multiprocessing, in a process that does not fork (horovodrun's), names its semaphores
  (`/dev/shm/sem.mp-*`) and leaves their unlinking to its resource tracker, a process that dies with it when
  their group is SIGKILLed (the launcher's kill of an engine at the end of the grace): ten a horovodrun.

Whose is a file? Only its maker could say, and it is gone. But such a file is held while it is in use: a
FileBaton keeps its lock open for as long as it builds. So a launcher removes a file only when it appeared
during its launch (it was not there at the start) and no process on the node holds it (open, or mapped into its
memory): a live build elsewhere holds its lock, so it is never touched. Only the processes this user may look
into are seen (/proc/PID/fd and maps): a builder of another user, or in another PID namespace sharing the
directory, is not; their caches are their own.
"""
from __future__ import annotations

import glob
import os
import time
from typing import FrozenSet, Iterable, List, Mapping, Sequence, Set, Tuple

from trialkit.process import when_gone

HOLDER_WAIT = 10.0  # how long the killed holders (our own workers, dying layer by layer) may take to go
RELEASE_GAP = 0.2  # a holder closes its file just before it removes it: a file unheld this long is left behind

Identity = Tuple[str, int, int]  # a path, its device and inode: a file removed and made again is another file


def torch_extension_locks(environ: Mapping[str, str]) -> List[str]:
    """Where torch's cpp_extension puts its build locks: `$TORCH_EXTENSIONS_DIR/<op>/lock`, else
    `<cache>/torch_extensions/<python and device tag, py311_cpu>/<op>/lock` (torch's own rule, without torch)."""
    root = environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return [os.path.join(root, "*", "lock")]
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(cache, "torch_extensions", "*", "*", "lock")]


SHARED_MEMORY = "/dev/shm/"
SEMAPHORES = SHARED_MEMORY + "sem.mp-*"  # a live semaphore is mapped by each process that uses it


def patterns(environ: Mapping[str, str]) -> List[str]:
    """Every kind of file a launch may leave behind, as glob patterns."""
    return [*torch_extension_locks(environ), SEMAPHORES]


def remove_when_gone(environ: Mapping[str, str]) -> None:
    """At the start of a launch: once this launcher is gone, however it ends, what its launch left is removed."""
    globs = patterns(environ)
    before = snapshot(globs)
    when_gone(lambda: remove_left_behind(globs, before))


def snapshot(globs: Sequence[str]) -> FrozenSet[Identity]:
    """The files there before the launch: never ours to remove."""
    return frozenset(_matching(globs))


def remove_left_behind(globs: Sequence[str], before: FrozenSet[Identity], wait: float = HOLDER_WAIT) -> List[str]:
    """Remove the files that appeared since `before` once no process holds them; those still held after `wait`
    seconds belong to someone alive and stay. Returns what was removed."""
    removed: List[str] = []
    tried: Set[Identity] = set()
    deadline = time.monotonic() + wait
    pause = 0.05
    while True:
        new = _matching(globs) - before - tried
        if not new or time.monotonic() > deadline:
            return removed
        unheld = _unheld(new)
        if not unheld:
            time.sleep(pause)  # our killed workers may still be dying
            pause = min(pause * 2, 1.0)
            continue
        time.sleep(RELEASE_GAP)
        for identity in _unheld(unheld & _matching(globs)):
            tried.add(identity)
            try:
                os.unlink(identity[0])
                removed.append(identity[0])
            except OSError:
                pass  # removed by its holder after all, or not ours to remove


def _matching(globs: Iterable[str]) -> Set[Identity]:
    found = set()
    for pattern in globs:
        for path in glob.glob(pattern):
            try:
                stat = os.lstat(path)
            except OSError:
                continue
            found.add((path, stat.st_dev, stat.st_ino))
    return found


def _unheld(files: Set[Identity]) -> Set[Identity]:
    """Those of `files` that no process has open or mapped."""
    if not files:
        return set()
    held_paths: Set[str] = set()
    held_inodes: Set[Tuple[int, int]] = set()
    # Shared memory is used mapped, its fd closed; reading every process's maps costs a scan most of its time
    # (136 to 307 ms over ~140 processes at load 8; 14 ms for their fds alone), so only for a file there.
    maps = any(path.startswith(SHARED_MEMORY) for path, _, _ in files)
    for pid in (name for name in os.listdir("/proc") if name.isdigit()):
        held_paths.update(_open_paths(pid))
        if maps:
            held_inodes.update(_mapped_inodes(pid))
    return {(path, dev, inode) for path, dev, inode in files
            if os.path.realpath(path) not in held_paths and (dev, inode) not in held_inodes}


def _open_paths(pid: str) -> Set[str]:
    """The paths a process has open (none when it has exited, or is not ours to look into)."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return set()
    paths = set()
    for fd in fds:
        try:
            paths.add(os.readlink(os.path.join(fd_dir, fd)))
        except OSError:
            pass  # closed meanwhile
    return paths


def _mapped_inodes(pid: str) -> Set[Tuple[int, int]]:
    """The (device, inode) of the files a process has mapped (/proc/PID/maps: address perms offset dev inode
    path, dev as hex major:minor)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()  # exited, or not ours to look into
    inodes = set()
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[4] != b"0":
            major, minor = fields[3].split(b":")
            inodes.add((os.makedev(int(major, 16), int(minor, 16)), int(fields[4])))
    return inodes
