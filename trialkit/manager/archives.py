"""Archives the manager serves to its experiment's trials: their code, and trialkit's trial side.

A Kubernetes trial's pod holds only its image; what it needs besides (the
experiment's code dir, trialkit's keeper when the image has none) is packed
once by the control plane, kept here by the sha256 of its bytes, and fetched
by the pod's run.sh (scripts/fetch.py) over the connection its keeper uses:

    GET /api/v1/trials/<trial_id>/archives/<sha256>
        -> 200 the tar.gz, 404 when the trial's experiment has no such archive

with the trial's own token, as every trial route (401 without one or with
an ended trial's, 403 with another trial's). An archive is kept under the
experiment's id, so a token of another experiment in the same store finds
nothing (404), and the digest in the path is the name: no path a client
sends reaches the disk.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Tuple

from trialkit.manager.routes import Check, HttpError, Raw, Request, Router

if TYPE_CHECKING:
    from trialkit.manager.store import Store

ARCHIVES_DIR = "archives"  # in the experiment dir: archives/<experiment id>/<sha256>.tar.gz
ROUTE = "/api/v1/trials/<trial_id>/archives/<digest>"
CONTENT_TYPE = "application/gzip"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def archive_path(experiment_dir: Path, experiment_id: str, digest: str) -> Path:
    return Path(experiment_dir) / ARCHIVES_DIR / experiment_id / f"{digest}.tar.gz"


def put(experiment_dir: Path, experiment_id: str, data: bytes) -> str:
    """Keep `data` for the experiment's trials (once: same bytes, same name); its digest."""
    digest = digest_of(data)
    path = archive_path(experiment_dir, experiment_id, digest)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_bytes(data)
        os.replace(partial, path)  # a reader never sees half an archive
    return digest


def add_route(router: Router, store: "Store", trial_check: Check) -> None:
    """Serve the archives of `store`'s experiments on `router`, to their trials' tokens only."""

    def get_archive(request: Request) -> Tuple[int, Any]:
        digest = request.params["digest"]
        trial = store.trial(request.params["trial_id"])
        if trial is None or not _DIGEST.match(digest):
            raise HttpError(404, f"no archive {digest}")
        path = archive_path(store.path.parent, trial["experiment"], digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise HttpError(404, f"experiment {trial['experiment']} has no archive {digest}") from None
        return 200, Raw(data, CONTENT_TYPE)

    router.add("GET", ROUTE, get_archive, trial_check)
