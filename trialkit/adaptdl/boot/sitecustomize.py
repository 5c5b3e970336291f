"""Hooks adaptdl in every Python process of a trial, with the training code unchanged.

The keeper puts this directory first on the training process's PYTHONPATH when
TRIALKIT_CHECKPOINT_EVERY is above 0 (trialkit.env, TrialEnv.child_environ);
Python imports `sitecustomize` from there at start-up. Why this way: the
training code must not change, and the trial's command is the user's (a shell
line, a launcher, a wrapper script), so trialkit cannot count on starting the
interpreter itself or on being installed in it (local trials run the user's
own Python). The environment is the one thing the keeper owns on every
platform (local, Ray, Kubernetes), and an interpreter reads its PYTHONPATH
whoever starts it. A `.pth` file would need trialkit installed in the user's
interpreter; `usercustomize` is off in virtual environments.

It costs a process nothing until adaptdl.torch.data is imported: a finder on
that one name, then `_trialkit_adaptdl.install()` once the module has run.
A `sitecustomize` of the interpreter's own, which this one shadows, still runs
afterwards. Not covered: `python -I`, `-E` or `-S` (no PYTHONPATH or no site),
or a command that replaces PYTHONPATH; those processes run AdaptDL unchanged.
"""
import importlib.machinery
import importlib.util
import os
import sys

HOOKED = "adaptdl.torch.data"


class _AdaptDLFinder:
    """Finds nothing itself; for HOOKED, wraps the real loader to install the hook after it."""

    def find_spec(self, name, path=None, target=None):
        if name != HOOKED:
            return None
        sys.meta_path.remove(self)  # once; and the real finders answer the lookup below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            import _trialkit_adaptdl

            _trialkit_adaptdl.install(module)

        spec.loader.exec_module = exec_module
        return spec


def _run_shadowed_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


sys.meta_path.insert(0, _AdaptDLFinder())
_run_shadowed_sitecustomize()
