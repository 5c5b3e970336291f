"""The keeper's uploader: a trial's checkpoints into the experiment's object store, as they are saved.

    python -m trialkit.checkpoints.sync        (started by the keeper, beside the trial, in its environment)

It watches the trial's checkpoint dir (inotify, as the keeper follows its
files) and uploads each Core API checkpoint once it is whole (its
metadata.json written), oldest first, one at a time: training never waits
for it, and what is saved while an upload runs goes next. A line on stdin
(or its end) says the trial has ended: it uploads what is left (a trial that
is not Core API's leaves its whole checkpoint dir, uploaded as one
checkpoint), then exits; the keeper records the trial's end only after that,
bounded by TRIALKIT_CHECKPOINT_TRANSFER_SECONDS. Once a Core API checkpoint
is in the store, its local copy goes unless it is the latest (the store keeps
it; the trial's restore_path fetches it back when asked).
Exit: 0 when everything was uploaded, 1 when something could not be.
"""
from __future__ import annotations

import os
import shutil
import sys
import uuid as uuids
from pathlib import Path
from typing import List, Set

from trialkit import env
from trialkit.checkpoints import (
    CORE,
    DETERMINED_LATEST,
    WHOLE_DIR,
    determined_layout,
    dir_files,
    local_checkpoints,
    store_spec,
    write_stored,
)
from trialkit.checkpoints.store import ObjectStore, StoreError
from trialkit.keeper.watch import DirWatch
from trialkit.process import EventLoop

PROG = "trialkit checkpoints"


class Uploader:
    def __init__(self, trial: env.TrialEnv, store: ObjectStore):
        self.trial = trial
        self.store = store
        self.root = trial.checkpoint_dir
        stored = store.checkpoints(trial.experiment_id, trial.trial_id)
        self.stored: Set[str] = {c.uuid for c in stored}
        # A Core API trial's dir is never stored whole, once any checkpoint of it was Core API's: at its end the
        # dir may hold no whole one (all stored and gone but the latest, which a delete may have taken).
        self.core = any(c.kind == CORE for c in stored)
        # Uploaded by us and still here, kept while it is the latest. Only these go: a copy fetched back from
        # the store (core.checkpoint.restore_path of an older one) is the trial's to read.
        self.uploaded_here: Set[str] = set()
        self.failed = False
        self.dir_stored = False  # this run's whole checkpoint dir
        self._note()

    def upload_saved(self) -> None:
        """Each whole Core API checkpoint not in the store yet, oldest first; then local copies but the latest go."""
        for ckpt in local_checkpoints(self.root, self.trial.experiment_id, self.trial.trial_id):
            self.core = True
            if ckpt.uuid in self.stored:
                continue
            if self._upload(Path(ckpt.where), ckpt.uuid, CORE, ckpt.metadata):
                self.uploaded_here.add(ckpt.uuid)
        self._prune()

    def upload_rest(self) -> None:
        """At the trial's end: what is left, or the whole checkpoint dir of a trial that is not Core API's."""
        if self.core or determined_layout(self.root):
            self.upload_saved()
        elif dir_files(self.root):
            self.dir_stored = self._upload(self.root, str(uuids.uuid4()), WHOLE_DIR, {})
            self._note()

    def _upload(self, src: Path, uuid: str, kind: str, metadata: dict) -> bool:
        try:
            ckpt = self.store.upload(src, self.trial.experiment_id, self.trial.trial_id, uuid,
                                     self.trial.restart_count, kind, metadata)
        except (StoreError, OSError) as err:
            self.failed = True
            say(f"checkpoint {uuid} was not stored: {err}")
            return False
        self.stored.add(uuid)
        self._note()
        say(f"checkpoint {uuid} stored: {ckpt.where} ({ckpt.size:,} bytes)")
        return True

    def _note(self) -> None:
        """What is stored, where the keeper reads it (checkpoints.unstored) should this process not finish."""
        try:
            write_stored(self.trial.trial_dir, sorted(self.stored) + [WHOLE_DIR] * self.dir_stored)
        except OSError as err:  # uploads go on: the keeper then counts every local one as not stored
            say(f"cannot note what is stored in {self.trial.trial_dir}: {err}")

    def _prune(self) -> None:
        """The local copies this uploader stored, but the latest's."""
        try:
            latest = (self.root / DETERMINED_LATEST).read_text().strip()
        except OSError:
            return  # which is the latest is not known: nothing goes
        for uuid in sorted(self.uploaded_here - {latest}):
            shutil.rmtree(self.root / uuid, ignore_errors=True)
            self.uploaded_here.discard(uuid)


def say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def main(argv: List[str]) -> int:
    trial = env.read()
    spec = store_spec(trial.checkpoint_store)
    if spec is None:
        say(f"{env.CHECKPOINT_STORE} names no object store: nothing to upload")
        return 0
    try:
        uploader = Uploader(trial, ObjectStore(spec))
    except StoreError as err:
        say(str(err))
        return 1
    loop = EventLoop(())
    ended: List[bool] = []

    def on_stdin() -> None:
        try:
            data = os.read(0, 4096)
        except BlockingIOError:
            return
        if not data or b"\n" in data:
            loop.remove_reader(0)
            ended.append(True)

    watch = DirWatch(loop, [trial.checkpoint_dir], uploader.upload_saved)
    loop.add_reader(0, on_stdin)
    uploader.upload_saved()  # what was saved before the watch began
    loop.run_until(lambda: bool(ended))
    watch.close()
    uploader.upload_rest()
    return 1 if uploader.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
