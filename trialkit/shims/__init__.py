"""Fallback top-level packages for the training process: `nni`, `determined`, ...

A trial written against another system's SDK (`import nni`) runs under trialkit
with that SDK absent: trialkit serves its own package of that name, a face over
trialkit's SDK. A real package always wins: the finder that serves these is
the last one on `sys.meta_path` (boot/sitecustomize.py), so it answers only a
name that the interpreter's own finders (site-packages, PYTHONPATH, the
script's dir) did not find. It serves `trialkit` itself the same way, so a
fallback works in an interpreter that has no trialkit installed.

How it gets there: the keeper puts `boot/` on the training process's
PYTHONPATH (trialkit/env.py, TrialEnv.child_environ), after AdaptDL's boot
dir when that is on too; Python imports `sitecustomize` from there at start-up,
which appends the finder and then runs the next `sitecustomize` on sys.path
(the interpreter's own, or none).

To add a fallback package: make a directory `trialkit/shims/NAME/` with an
`__init__.py` (and list `trialkit.shims.NAME` in setup.py's packages). The
finder serves every such directory but `boot`; nothing else changes. A
fallback's modules import their own parts relatively (`from . import x`: it
runs as top-level `NAME`) and trialkit's SDK as `trialkit`; it must not
import anything outside the standard library and trialkit's SDK, which is all
the training process can be counted on to have.
"""
from pathlib import Path

BOOT_DIR = Path(__file__).resolve().parent / "boot"
