"""Where `core.checkpoint` keeps checkpoints: one directory per storage id in the trial's checkpoint dir.

    <checkpoint dir>/<storage id>/...            the files training wrote
    <checkpoint dir>/<storage id>/metadata.json  the metadata given to store_path()/upload()
    <checkpoint dir>/latest                      the storage id stored last (renamed into place)

The checkpoint dir is the trial's own (TRIALKIT_CHECKPOINT_DIR): it outlives
a pause and a restart, so the checkpoint stored before a stop is the one
`latest_checkpoint` names after it. A checkpoint counts once its metadata is
written; `latest` moves only then, so a stop in the middle of a store leaves
the previous one latest.

With an object store (checkpoint_storage s3, gcs, azure) the keeper's
uploader copies each whole checkpoint there and keeps only the latest here;
one asked for that is not here is fetched back by trialkit.checkpoints.restore,
in a process of its own (the training process never loads the cloud library).
"""
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Optional

from trialkit import env
from trialkit.checkpoints import DETERMINED_LATEST as LATEST
from trialkit.checkpoints import DETERMINED_METADATA as METADATA
from trialkit.checkpoints import set_latest


def path(root: Path, storage_id: str) -> Path:
    """The directory of `storage_id`, fetched from the experiment's object store when it is only there; a
    FileNotFoundError when this trial stored no such checkpoint."""
    where = _where(root, storage_id)
    if not (where / METADATA).is_file() and os.environ.get(env.CHECKPOINT_STORE):
        _in_store(storage_id, str(where))
    if not (where / METADATA).is_file():
        raise FileNotFoundError(f"no checkpoint {storage_id!r} in this trial's checkpoint dir {root}")
    return where


def _where(root: Path, storage_id: str) -> Path:
    if os.sep in storage_id or storage_id in ("", ".", ".."):
        raise FileNotFoundError(f"no checkpoint {storage_id!r} in this trial's checkpoint dir {root}")
    return root / storage_id


def _in_store(*argv: str) -> int:
    """trialkit.checkpoints.restore ARGV in a process of its own (it loads the cloud library); its exit code."""
    import subprocess  # here: only the store needs it

    from trialkit.process import own_module_argv

    return subprocess.run(own_module_argv("trialkit.checkpoints.restore", *argv),
                          stdin=subprocess.DEVNULL).returncode


def finish(root: Path, storage_id: str, metadata: Dict[str, Any]) -> None:
    """Write the metadata that makes a checkpoint whole, then make it the latest."""
    (root / storage_id / METADATA).write_text(json.dumps(metadata, default=str))
    set_latest(root, storage_id)


def latest(root: Path) -> Optional[str]:
    try:
        storage_id = (root / LATEST).read_text().strip()
    except OSError:
        return None
    return storage_id if (root / storage_id / METADATA).is_file() else None


def metadata(root: Path, storage_id: str) -> Dict[str, Any]:
    return json.loads((path(root, storage_id) / METADATA).read_text())


def delete(root: Path, storage_id: str) -> None:
    """The checkpoint gone from this trial's dir and from the experiment's object store, if it has one."""
    where = _where(root, storage_id)
    stored = os.environ.get(env.CHECKPOINT_STORE) and _in_store("--delete", storage_id) == 0
    if not (where / METADATA).is_file():
        if stored:
            return
        raise FileNotFoundError(f"no checkpoint {storage_id!r} in this trial's checkpoint dir {root}")
    if latest(root) == storage_id:
        (root / LATEST).unlink()
    shutil.rmtree(where)
