"""What a Kubernetes trial's pods fetch from the manager: its code, and trialkit's trial side.

The renderer names each archive by digest in the pod's environment
(TRIALKIT_CODE_DIGEST, TRIALKIT_TRIALSIDE_DIGEST); run.sh fetches it with the
trial's token and checks the digest (scripts/fetch.py). A code dir is packed
once a process (trialkit.platforms.context: the same ignore rules, size
limit and startup hook as locally and on Ray), so every trial of an
experiment runs the same code; submitting a trial keeps the archives its
objects name where the manager serves them (trialkit.manager.archives).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from trialkit import env as envnames
from trialkit.manager import archives
from trialkit.platforms import context, trialside

DIGEST_NAMES = (envnames.CODE_DIGEST, envnames.TRIALSIDE_DIGEST)
_by_dir: Dict[str, str] = {}  # code dir (real path) -> digest: packed once
_by_digest: Dict[str, bytes] = {}


def code_digest(code_dir: str) -> str:
    """The digest of `code_dir` packed (once a process; UserError over the size limit)."""
    real = os.path.realpath(code_dir)
    if real not in _by_dir:
        _by_dir[real] = _remember(context.pack(real))
    return _by_dir[real]


def trialside_digest() -> str:
    return _remember(trialside.pack())


def pod_env(code_dir: Optional[str]) -> Dict[str, str]:
    """The variables that tell run.sh what to fetch: the trial side always, the code when shipped."""
    env = {envnames.TRIALSIDE_DIGEST: trialside_digest()}
    if code_dir is not None:
        env[envnames.CODE_DIGEST] = code_digest(code_dir)
    return env


def keep(objects: Sequence[dict], experiment_dir: Path, experiment_id: str) -> List[str]:
    """Put every archive `objects` name where the manager serves them to the experiment's trials; their digests."""
    kept = []
    for digest in sorted(named_digests(objects)):
        archives.put(experiment_dir, experiment_id, _by_digest[digest])
        kept.append(digest)
    return kept


def named_digests(objects: Sequence[dict]) -> set:
    """The archive digests in the containers' environments of `objects`."""
    found = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            if node.get("name") in DIGEST_NAMES and "value" in node:
                found.add(node["value"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(list(objects))
    return found


def _remember(data: bytes) -> str:
    digest = archives.digest_of(data)
    _by_digest.setdefault(digest, data)
    return digest
