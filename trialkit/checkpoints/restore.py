"""A trial's checkpoints back from the experiment's object store, wherever the trial starts again.

    python -m trialkit.checkpoints.restore             the latest into the checkpoint dir (the keeper, before
                                                        the trial starts: a new node or pod has none)
    python -m trialkit.checkpoints.restore UUID DEST   one checkpoint of this trial into DEST (Core API's
                                                        restore_path/download of one whose local copy is gone)
    python -m trialkit.checkpoints.restore --delete UUID   one checkpoint of this trial deleted from the store
                                                        (Core API's core.checkpoint.delete)

Only whole checkpoints (with their manifest) are ever fetched, each into a
dir beside its place and moved there once every file came with its size.
Exit: 0 (restored, or nothing to restore), 1 (the store failed: one line on
stderr), 2 (no such checkpoint).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

from trialkit import env
from trialkit.checkpoints import (CORE, DETERMINED_METADATA, STORED_LIST, Checkpoint, dir_files, noted_stored,
                                  set_latest, store_spec)
from trialkit.checkpoints.store import ObjectStore, StoreError

PROG = "trialkit checkpoints"


def restore_latest(trial: env.TrialEnv, store: ObjectStore) -> Optional[Checkpoint]:
    """The trial's latest stored checkpoint made its local one; None when the store has none. StoreError when
    the store has none of those its uploader stored and this node has no copy: started, it would begin again
    from nothing."""
    stored = store.checkpoints(trial.experiment_id, trial.trial_id)
    if not stored:
        _check_none_lost(trial, store)
        return None
    latest = stored[-1]
    root = trial.checkpoint_dir
    if latest.kind == CORE:
        if not (root / latest.uuid / DETERMINED_METADATA).is_file():
            store.download(latest, root / latest.uuid)
        set_latest(root, latest.uuid)
    elif not root.exists() or not any(root.iterdir()):  # a dir the trial left is newer than any upload of it
        store.download(latest, root)
    return latest


def _check_none_lost(trial: env.TrialEnv, store: ObjectStore) -> None:
    """Refuse a start from nothing when the trial's uploader noted checkpoints stored (the list it leaves in the
    trial dir) that the store no longer lists (deleted, a store emptied) and the checkpoint dir is empty."""
    # Nothing noted: a first start, or a node that never ran it.
    if noted_stored(trial.trial_dir) and not dir_files(trial.checkpoint_dir):
        raise StoreError(f"its checkpoint is not in {store.url} (an earlier run stored it: deleted, or the store "
                         f"was emptied); put it back, or delete {trial.trial_dir / STORED_LIST} to start the trial "
                         f"from the beginning")


def main(argv: List[str]) -> int:
    trial = env.read()
    spec = store_spec(trial.checkpoint_store)
    if spec is None:
        return 0
    try:
        store = ObjectStore(spec)
        if not argv:
            latest = restore_latest(trial, store)
            if latest is not None:
                print(f"{PROG}: restored checkpoint {latest.uuid} from {latest.where}", file=sys.stderr, flush=True)
            return 0
        deleting = argv[0] == "--delete"
        uuid = argv[1] if deleting else argv[0]
        found = [c for c in store.checkpoints(trial.experiment_id, trial.trial_id) if c.uuid == uuid]
        if not found:
            if not deleting:  # one saved but not uploaded yet is deleted where it is, with nothing to say
                print(f"{PROG}: no checkpoint {uuid!r} of trial {trial.trial_id} in {store.url}", file=sys.stderr)
            return 2
        if deleting:
            store.delete(found[0])
        else:
            store.download(found[0], Path(argv[1]))
        return 0
    except (StoreError, OSError) as err:
        print(f"{PROG}: cannot restore: {err}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
