"""Where `core.checkpoint` keeps checkpoints: one directory per storage id in the trial's checkpoint dir.

    <checkpoint dir>/<storage id>/...            the files training wrote
    <checkpoint dir>/<storage id>/metadata.json  the metadata given to store_path()/upload()
    <checkpoint dir>/latest                      the storage id stored last (renamed into place)

The checkpoint dir is the trial's own (TRIALKIT_CHECKPOINT_DIR): it outlives
a pause and a restart, so the checkpoint stored before a stop is the one
`latest_checkpoint` names after it. A checkpoint counts once its metadata is
written; `latest` moves only then, so a stop in the middle of a store leaves
the previous one latest.
"""
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Optional

METADATA = "metadata.json"
LATEST = "latest"


def path(root: Path, storage_id: str) -> Path:
    """The directory of `storage_id`; a FileNotFoundError when this trial stored no such checkpoint."""
    where = root / storage_id
    if os.sep in storage_id or storage_id in ("", ".", "..") or not (where / METADATA).is_file():
        raise FileNotFoundError(f"no checkpoint {storage_id!r} in this trial's checkpoint dir {root}")
    return where


def finish(root: Path, storage_id: str, metadata: Dict[str, Any]) -> None:
    """Write the metadata that makes a checkpoint whole, then make it the latest."""
    (root / storage_id / METADATA).write_text(json.dumps(metadata, default=str))
    tmp = root / f".{LATEST}.{os.getpid()}"
    tmp.write_text(storage_id)
    os.replace(tmp, root / LATEST)


def latest(root: Path) -> Optional[str]:
    try:
        storage_id = (root / LATEST).read_text().strip()
    except OSError:
        return None
    return storage_id if (root / storage_id / METADATA).is_file() else None


def metadata(root: Path, storage_id: str) -> Dict[str, Any]:
    return json.loads((path(root, storage_id) / METADATA).read_text())


def delete(root: Path, storage_id: str) -> None:
    where = path(root, storage_id)
    if latest(root) == storage_id:
        (root / LATEST).unlink()
    shutil.rmtree(where)
