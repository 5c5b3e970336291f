"""trialkit's trial side as one archive, for images that do not hold trialkit.

A Kubernetes trial runs in the user's image; when that image cannot
`import trialkit`, run.sh fetches this archive from the manager (by digest,
scripts/fetch.py), puts it on PYTHONPATH and runs the keeper from it, and the
training code can then `import trialkit` (and `import nni` through the
shims, where they exist). What goes in is what runs in a trial: the keeper,
the launchers, the SDK and the contract modules under them, and nothing of
the control plane. Every module in it imports only the standard library on
its own path (tests/test_trialside.py imports each one in a bare python3).
"""
from __future__ import annotations

import functools
import gzip
import io
import tarfile
from pathlib import Path
from typing import List

import trialkit

# Top-level modules of the trial side: the SDK face and the contract below it.
# checkpoints/__init__.py alone: the Core API shim reads its names; its uploader and restore need obstore, which
# an image without trialkit lacks (an object store of checkpoints asks for trialkit in the image).
MODULES = ("__init__.py", "sdk.py", "channel.py", "checkpoints/__init__.py", "env.py", "errors.py", "layout.py",
           "process.py", "records.py", "statuses.py", "trial.py")
# Packages taken whole (.py files only): the keeper, the launchers, AdaptDL's wiring, NNI's fallback package.
PACKAGES = ("keeper", "launch", "adaptdl", "shims")


def files() -> List[str]:
    """The archive's members, as paths under the directory that holds `trialkit/`, sorted."""
    root = Path(trialkit.__file__).parent
    out = [f"trialkit/{name}" for name in MODULES]
    for package in PACKAGES:
        base = root / package
        if base.is_dir():  # shims/ comes with NNI's fallback package
            out += [f"trialkit/{path.relative_to(root).as_posix()}" for path in base.rglob("*.py")
                    if "__pycache__" not in path.parts]
    return sorted(out)


@functools.lru_cache(maxsize=1)
def pack() -> bytes:
    """The trial side as a tar.gz whose bytes depend on the files' contents alone (packed once a process)."""
    top = Path(trialkit.__file__).parent.parent
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel in files():
                data = (top / rel).read_bytes()
                info = tarfile.TarInfo(rel)  # owner 0, mtime 0
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
