"""Periodic AdaptDL checkpoints with the training code unchanged, and saves that
a crash cannot tear.

This module runs inside the training process, where trialkit itself may not be
importable (a local trial runs the user's own interpreter): it uses the
standard library and adaptdl only, and nothing of adaptdl before
`install()`. `sitecustomize.py` beside it calls `install()` right after
adaptdl.torch.data is imported.

What changes in adaptdl 0.2.11, each at a seam its own SIGTERM path uses:

- The exit flag its data loader all-reduces before every step
  (`adaptdl.torch.data.get_exit_flag`) also reads DUE when this replica's
  interval has passed: a monotonic clock compare, nothing else, on a step with
  no checkpoint due. The reduce (`a or b`) runs on rank 0 and its result goes
  to every replica, so all agree on the step; an exit wins one step later if a
  DUE came first.
- At the step where the agreed flag is DUE, every registered State is saved
  (`adaptdl.checkpoint.save_all_states`, as on SIGTERM) and training goes on.
- `save_all_states` itself (the SIGTERM path's too) commits atomically: the
  states are written aside (adaptdl's `_checkpoint`), flushed to disk, and then
  swapped with `checkpoint-<restart>` in one rename (renameat2's exchange; on a
  filesystem without it, NFS for one, two renames and a repair at the next
  start). adaptdl's own rename fails once `checkpoint-<restart>` exists, so it
  could not save twice under one restart count.
- A State of its own, PROGRESS_STATE, saves the step count (and epoch) with
  every checkpoint: the count goes on after a resume, and adaptdl-ray reads it
  to say where the job resumed.
- adaptdl's reducer sleeps 5 s after a refused connect to rank 0, which its own
  rank 0 often gets (its server thread binds after its main thread's first
  connect): the first retries come after 0.1-0.4 s instead.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import math
import os
import shutil
import sys
import time
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, Optional

# Named in trialkit/env.py (CHECKPOINT_EVERY); spelled here because trialkit may not be importable.
EVERY_VARIABLE = "TRIALKIT_CHECKPOINT_EVERY"
PROGRESS_STATE = "trialkit-progress"  # a file in every checkpoint: {"step": N, "epoch": E}
CHECKPOINT_PREFIX = "checkpoint-"  # adaptdl's: checkpoint-<restart count>
STAGING = "_checkpoint"  # adaptdl writes every state here before the commit
REPLACED = "_replaced-"  # the checkpoint being replaced, while a swap by two renames is under way
DUE = "trialkit-checkpoint-due"  # all-reduced in place of the exit flag when an interval has passed
RECONNECT_SECONDS = (0.1, 0.2, 0.4)  # the reducer's first retries; then adaptdl's 5 s
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def interval(environ: Optional[Dict[str, str]] = None) -> float:
    """Seconds between checkpoints; 0: none. The keeper checked the value; a bad one is 0."""
    try:
        return max(0.0, float((os.environ if environ is None else environ).get(EVERY_VARIABLE) or 0))
    except ValueError:
        return 0.0


def say(line: str) -> None:
    print(f"trialkit: {line}", file=sys.stderr, flush=True)


# -- the atomic commit ---------------------------------------------------------------------------


def commit(directory: str, name: str) -> None:
    """Make the staged states `directory/name`, replacing a checkpoint of that name in one
    step; then remove the other checkpoints, as adaptdl does (it keeps the newest only)."""
    staged, final = os.path.join(directory, STAGING), os.path.join(directory, name)
    _sync_tree(staged)
    if not os.path.exists(final):
        os.rename(staged, final)
    elif not _exchange(staged, final):
        aside = os.path.join(directory, REPLACED + name)
        os.rename(final, aside)
        os.rename(staged, final)
        staged = aside
    _sync(directory)
    shutil.rmtree(staged, ignore_errors=True)  # the replaced checkpoint, if there was one
    for entry in os.listdir(directory):
        if entry.startswith(CHECKPOINT_PREFIX) and entry != name:
            shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)


def repair(directory: str) -> None:
    """A swap by two renames cut short between them: the replaced checkpoint goes back."""
    for entry in os.listdir(directory):
        if entry.startswith(REPLACED):
            aside, final = os.path.join(directory, entry), os.path.join(directory, entry[len(REPLACED):])
            if os.path.exists(final):
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(aside, final)


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux renameat2); False where the C library or the
    filesystem cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a)


def _sync_tree(directory: str) -> None:
    # A machine that dies after the rename must not leave a checkpoint of empty files.
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        if os.path.isfile(path):
            _sync(path)
    _sync(directory)


def _sync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_progress(checkpoint: str) -> Optional[Dict[str, Any]]:
    """The PROGRESS_STATE of a committed checkpoint dir, or None if it has none."""
    try:
        with open(os.path.join(checkpoint, PROGRESS_STATE), "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


# -- the hook into adaptdl -----------------------------------------------------------------------


class Periodic:
    """The hook's state in one training process."""

    def __init__(self, every: float):
        import adaptdl.checkpoint
        import adaptdl.env
        from adaptdl import _signal
        from adaptdl.torch.epoch import current_epoch

        self.every = every
        self.due = math.inf  # the clock starts at the first step: start-up is not training
        self.steps = 0  # completed steps (batches), across restarts
        self._checkpoint = adaptdl.checkpoint
        self._env = adaptdl.env
        self._signal = _signal
        self._current_epoch = current_epoch
        self._save_in_ray_tune = adaptdl.checkpoint.save_all_states
        periodic = self

        class Progress(adaptdl.checkpoint.State):
            def save(self, fileobj) -> None:
                fileobj.write(json.dumps({"step": periodic.steps, "epoch": current_epoch()}).encode())

            def load(self, fileobj) -> None:
                periodic.steps = json.loads(fileobj.read())["step"]

        self.progress = Progress(PROGRESS_STATE)

    def exit_flag(self) -> Any:
        """What a replica all-reduces before each step: True (stop), DUE or False."""
        if self._signal.get_exit_flag():
            return True
        return DUE if time.monotonic() >= self.due else False

    def profile(self, original: Callable) -> Callable:
        """AdaptiveDataLoaderHelper.profile, which every step enters: checkpoint there
        when the replicas agreed one is due, and count the step once it is done."""
        periodic = self

        @contextlib.contextmanager
        def profile(helper, commit: bool) -> Iterator[None]:
            future = helper.future_exit
            if future is None:  # this loader's first step in this process
                periodic.start_clock()
            elif future.result() == DUE:
                helper.future_exit = None  # handled: adaptdl's own check finds nothing to do
                periodic.checkpoint()
            with original(helper, commit):
                yield
            periodic.steps += 1

        return profile

    def start_clock(self) -> None:
        if self.due == math.inf and self.every > 0:
            self.due = time.monotonic() + self.every

    def checkpoint(self) -> None:
        started = time.monotonic()
        self._checkpoint.save_all_states()  # the module's: what install() put there
        self.due = time.monotonic() + self.every
        if self._env.replica_rank() == 0:
            say(f"checkpoint at step {self.steps} (epoch {self._current_epoch()}) "
                f"in {time.monotonic() - started:.3f} s")

    def save_all_states(self) -> Optional[str]:
        """adaptdl.checkpoint.save_all_states with an atomic commit (see the module's doc)."""
        if self._env.from_ray():  # Ray Tune's AdaptDL integration keeps its own dirs
            return self._save_in_ray_tune()
        directory = self._env.checkpoint_path()
        writer = directory is not None and self._env.replica_rank() == 0
        if writer:
            repair(directory)
            shutil.rmtree(os.path.join(directory, STAGING), ignore_errors=True)  # a save that was killed
        for state in list(self._checkpoint._STATES_TO_NAMES):
            self._checkpoint.save_state(state, directory)
        if writer:
            commit(directory, f"{CHECKPOINT_PREFIX}{self._env.num_restarts()}")
        return directory

    def resume(self) -> None:
        """Load the step count from the newest checkpoint, if there is one, and say so."""
        directory = self._env.checkpoint_path()
        if directory is None or not os.path.isdir(directory):
            return
        if self._env.replica_rank() == 0:
            repair(directory)
        if self._checkpoint.load_state(self.progress) and self._env.replica_rank() == 0:
            say(f"resuming at step {self.steps}")


def install(data: ModuleType) -> Periodic:
    """Hook adaptdl (its data module `data` just executed) for this process."""
    import adaptdl.checkpoint
    import adaptdl.reducer

    periodic = Periodic(interval())
    data.get_exit_flag = periodic.exit_flag
    helper = data.AdaptiveDataLoaderHelper
    helper.profile = periodic.profile(helper.profile)
    adaptdl.checkpoint.save_all_states = periodic.save_all_states
    adaptdl.reducer.time = _QuickRetry(adaptdl.reducer.time)
    periodic.resume()
    return periodic


class _QuickRetry:
    """adaptdl.reducer's `time`, whose sleep (only ever after a refused connect) starts short."""

    def __init__(self, time_module: ModuleType):
        self._time = time_module
        self._short = list(RECONNECT_SECONDS)

    def sleep(self, seconds: float) -> None:
        self._time.sleep(self._short.pop(0) if self._short else seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._time, name)
