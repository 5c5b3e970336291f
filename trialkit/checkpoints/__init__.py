"""A trial's checkpoints, kept where the experiment says: the trial's own checkpoint dir, or an object store.

The trial writes its checkpoints locally (TRIALKIT_CHECKPOINT_DIR); with an
object store (`checkpointStorage` of type s3, gcs or azure) the keeper's
uploader process (sync.py) copies each one there as it is saved, and the
keeper fetches the latest back before the trial starts again, on whatever
node or pod that is (restore.py). One checkpoint is:

    Determined's Core API   <checkpoint dir>/<uuid>/ with its metadata.json (trialkit/shims/determined/_storage.py)
    any other trial         the whole checkpoint dir as the run left it (trialkit.checkpoint_dir(), AdaptDL's)

In the store each lies under `<prefix>/<experiment>/<trial>/<uuid>/`, and
`<prefix>/<experiment>/<trial>/<uuid>.checkpoint.json` (the manifest: its
files and sizes, metadata, steps, run) is written after every file is: a
checkpoint without its manifest is not one, so an upload cut short is never
listed nor restored. Deleting removes the manifest first.

The cloud library (obstore: one wheel, no dependencies, the Rust object_store
crate of Apache Arrow, with each cloud's own credential chain) is imported by
store.py only, which only the uploader, the restore and the control plane
load: never the training loop, never the keeper's own process. This module
holds what everyone may read: the store's description as the trial's
environment carries it (no credential is ever part of it), and the manifest.
"""
from __future__ import annotations

import json
import os
from collections import namedtuple
from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: the training process imports this module (the Core API's shim)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional

OBJECT_TYPES = ("s3", "gcs", "azure")
# The store's keys the trial's environment carries (TRIALKIT_CHECKPOINT_STORE, JSON); never a credential.
STORE_KEYS = ("type", "bucket", "container", "prefix", "endpoint_url", "region", "account_url")
MANIFEST_SUFFIX = ".checkpoint.json"
DETERMINED_METADATA = "metadata.json"  # a Core API checkpoint's own file (shims/determined/_storage.py)
DETERMINED_LATEST = "latest"
FORMAT = 1
# The keeper's exit code when the trial's checkpoint could not be restored for a reason of the store (no
# credentials, no answer, no bucket), not of the trial: it ends PREEMPTED, to resume once the store is fixed,
# and the experiment stops saying why (EX_TEMPFAIL of sysexits.h).
STORE_FAILED_EXIT = 75


CORE = "core"  # a Core API checkpoint: <checkpoint dir>/<uuid>/
WHOLE_DIR = "dir"  # the whole checkpoint dir of a trial that is not Core API's
KINDS = (CORE, WHOLE_DIR)


class Checkpoint(namedtuple("Checkpoint", "uuid experiment trial run kind metadata steps files size time where")):
    """One whole checkpoint: str uuid, experiment, trial; int run (the trial's restart count when it was saved);
    str kind (CORE or WHOLE_DIR); dict metadata (Determined's, else {}); int or None steps (metadata's
    steps_completed); dict files (relative path -> bytes); int size; float time (when it became whole); str
    where (its URL or directory)."""

    __slots__ = ()

    def manifest(self) -> Dict[str, Any]:
        return {"format": FORMAT, "uuid": self.uuid, "experiment": self.experiment, "trial": self.trial,
                "run": self.run, "kind": self.kind, "metadata": self.metadata, "steps": self.steps,
                "files": self.files, "size": self.size, "time": self.time}


def from_manifest(data: Mapping[str, Any], where: str) -> Checkpoint:
    """A manifest's checkpoint; ValueError when it is not one trialkit wrote."""
    if (not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), dict)
            or data.get("kind") not in KINDS):
        raise ValueError(f"{where} is not a trialkit checkpoint manifest")
    return Checkpoint(uuid=str(data["uuid"]), experiment=str(data["experiment"]), trial=str(data["trial"]),
                      run=int(data.get("run") or 0), kind=data["kind"], metadata=data.get("metadata") or {}, steps=data.get("steps"),
                      files={str(k): int(v) for k, v in data["files"].items()}, size=int(data.get("size") or 0),
                      time=float(data.get("time") or 0.0), where=where)


def steps_of(metadata: Mapping[str, Any]) -> Optional[int]:
    """Determined's `steps_completed` of a checkpoint's metadata, when it is a whole number."""
    steps = metadata.get("steps_completed") if isinstance(metadata, dict) else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def store_spec(text: Optional[str]) -> Optional[Dict[str, str]]:
    """The object store TRIALKIT_CHECKPOINT_STORE describes, or None for the trial's own checkpoint dir."""
    if not text:
        return None
    spec = json.loads(text)
    if not isinstance(spec, dict) or spec.get("type") not in OBJECT_TYPES:
        raise ValueError(f"not a checkpoint store: {text[:200]!r}")
    return {key: str(spec[key]) for key in STORE_KEYS if spec.get(key) not in (None, "")}


def store_url(spec: Mapping[str, str]) -> str:
    """The store's root as a URL, for people: s3://bucket/prefix, gs://..., az://container/prefix."""
    scheme = {"s3": "s3", "gcs": "gs", "azure": "az"}[spec["type"]]
    root = spec.get("bucket") or spec.get("container") or ""
    return f"{scheme}://{root}/{spec.get('prefix', '').strip('/')}".rstrip("/")


# ---------------------------------------------------------------- a trial's checkpoint dir as it lies on disk


def determined_layout(checkpoint_dir: Path) -> bool:
    """Whether the dir holds Core API checkpoints (a dir per uuid with its metadata.json) rather than one."""
    try:
        return any((entry / DETERMINED_METADATA).is_file() for entry in checkpoint_dir.iterdir() if entry.is_dir())
    except OSError:
        return False


def local_checkpoints(checkpoint_dir: Path, experiment: str, trial: str) -> List[Checkpoint]:
    """The whole Core API checkpoints in a trial's checkpoint dir, oldest first (by when their metadata was
    written: the moment each became whole). Their run is 0: the dir does not say which run saved each (the
    control plane tells it from the trial's runs; the uploader names its own)."""
    found = []
    try:
        entries = list(os.scandir(checkpoint_dir))
    except OSError:
        return []
    for entry in entries:
        meta = Path(entry.path) / DETERMINED_METADATA
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        try:
            metadata = json.loads(meta.read_text())
            written = meta.stat().st_mtime
        except (OSError, ValueError):
            continue  # not whole yet (no metadata), or not a checkpoint
        files = dir_files(Path(entry.path))
        found.append(Checkpoint(uuid=entry.name, experiment=experiment, trial=trial, run=0, kind=CORE,
                                metadata=metadata if isinstance(metadata, dict) else {},
                                steps=steps_of(metadata), files=files, size=sum(files.values()), time=written,
                                where=entry.path))
    return sorted(found, key=lambda c: (c.time, c.uuid))


def dir_files(root: Path) -> Dict[str, int]:
    """Every regular file under root: its path relative to root (POSIX) -> its size."""
    out = {}
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(folder, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out[os.path.relpath(path, root).replace(os.sep, "/")] = os.path.getsize(path)
    return out


# In the trial dir: what this run's uploader stored (one uuid a line, WHOLE_DIR for the whole dir), rewritten
# as it stores, so the keeper can say what was not stored when the uploader fails or runs out of time, and the
# next start's restore can tell a checkpoint the store lost from a trial that never stored one.
STORED_LIST = "checkpoints-stored"


def write_stored(trial_dir: Path, stored: List[str]) -> None:
    tmp = trial_dir / f".{STORED_LIST}.{os.getpid()}"
    tmp.write_text("".join(f"{uuid}\n" for uuid in stored))
    os.replace(tmp, trial_dir / STORED_LIST)


def noted_stored(trial_dir: Path) -> List[str]:
    """What the trial's uploader last noted stored (none when it noted nothing: no store, or never started)."""
    try:
        return (trial_dir / STORED_LIST).read_text().split()
    except OSError:
        return []


def unstored(trial_dir: Path, checkpoint_dir: Path) -> List[str]:
    """The trial's local checkpoints its uploader did not store this run (paths): Core API ones by uuid, else
    the whole checkpoint dir when it holds files and was not stored."""
    stored = set(noted_stored(trial_dir))
    if determined_layout(checkpoint_dir):
        return [c.where for c in local_checkpoints(checkpoint_dir, "", "") if c.uuid not in stored]
    return [str(checkpoint_dir)] if WHOLE_DIR not in stored and dir_files(checkpoint_dir) else []


def set_latest(checkpoint_dir: Path, uuid: str) -> None:
    """Name `uuid` the latest Core API checkpoint (renamed into place: never read half written)."""
    tmp = checkpoint_dir / f".{DETERMINED_LATEST}.{os.getpid()}"
    tmp.write_text(uuid)
    os.replace(tmp, checkpoint_dir / DETERMINED_LATEST)
