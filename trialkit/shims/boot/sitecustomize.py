"""Serves trialkit's fallback packages (trialkit/shims/NAME) to a training process
whose interpreter does not have the real ones. See trialkit/shims/__init__.py.

The finder goes to the END of sys.meta_path, after the interpreter's own
finders: it is asked only for a top-level name that nothing else found, so an
installed `nni` is never shadowed. It costs a process one directory listing at
start-up. A `sitecustomize` later on sys.path (the interpreter's own) still
runs afterwards; AdaptDL's boot dir, when on, comes before this one and chains
to it. Standard library only: trialkit may not be importable here.

One more finder goes BEFORE the path's, for `trialkit` alone: a folder named
`trialkit` in the code dir (the script's dir, first on sys.path) is taken for a
namespace package, ahead of an editable install's finder (setuptools issue
3557), and the SDK is then an empty package. Where the path finds only such a
folder, this one serves the real trialkit; a real package on the path (an
older keeper's on PYTHONPATH, site-packages') is still what the path finds.
"""
import importlib.machinery
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHIMS = os.path.dirname(HERE)
TRIALKIT_HOME = os.path.dirname(os.path.dirname(SHIMS))  # the directory that holds trialkit/


class FallbackFinder:
    """Last on sys.meta_path: finds `trialkit` and the fallback packages, where no one else did."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, name, path=None, target=None):
        # Submodules (nni.utils) are found by the path finder through the package's __path__.
        if name == "trialkit":
            return importlib.machinery.PathFinder.find_spec(name, [TRIALKIT_HOME])
        if name in self.names:
            return importlib.machinery.PathFinder.find_spec(name, [SHIMS])
        return None


class NotANamespaceFinder:
    """Before the path finder: `trialkit` as the path finds it, but never a folder of that name without
    an __init__.py (a namespace package), which trialkit never is: then what the finders after the path's
    find (an editable install's, FallbackFinder's). setup.py puts this class's source in the .pth of every
    install too, for a user's own `python train.py` beside such a folder: it uses sys and importlib alone."""

    def find_spec(self, name, path=None, target=None):
        if name != "trialkit" or path is not None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name)
        if spec is None or spec.loader is not None:
            return spec
        finders = sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder) + 1:]
        found = (finder.find_spec(name, None, target) for finder in finders if hasattr(finder, "find_spec"))
        return next((real for real in found if real is not None and real.loader is not None), spec)


def _before_the_path_finder(finder):
    at = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder), len(sys.meta_path))
    sys.meta_path.insert(at, finder)


def fallback_names(shims=SHIMS):
    """The packages in trialkit/shims: every directory with an __init__.py, but boot."""
    return sorted(entry.name for entry in os.scandir(shims)
                  if entry.is_dir() and entry.name != "boot"
                  and os.path.isfile(os.path.join(entry.path, "__init__.py")))


def _run_next_sitecustomize():
    # The next one after this directory on sys.path: one before it (AdaptDL's boot dir) ran
    # first and chained here; looking behind would run it again, and it would chain back.
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    after = paths.index(HERE) + 1 if HERE in paths else 0
    rest = [p for p, full in zip(sys.path[after:], paths[after:]) if full != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        # importlib.util.module_from_spec's work, without importing importlib.util (and contextlib) into
        # every training process at its start.
        module = type(sys)(spec.name)
        module.__spec__, module.__loader__, module.__file__ = spec, spec.loader, spec.origin
        spec.loader.exec_module(module)


# Only as the interpreter's start-up hook: trialkit's .pth (setup.py) imports this module by its full name
# for FallbackFinder alone. By name: a second run of this file (a second boot dir of the same trialkit) has
# its own class.
if __name__ == "sitecustomize":
    if not any(type(finder).__name__ == FallbackFinder.__name__ for finder in sys.meta_path):
        sys.meta_path.append(FallbackFinder(fallback_names()))
    if not any(type(finder).__name__ == NotANamespaceFinder.__name__ for finder in sys.meta_path):
        _before_the_path_finder(NotANamespaceFinder())
    _run_next_sitecustomize()
