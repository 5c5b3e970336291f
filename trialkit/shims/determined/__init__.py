"""trialkit's `determined`: Determined's Core API for a training process whose Python has no determined.

Served only where `import determined` finds no real package (trialkit/shims):
Determined's Core API scripts run unchanged under trialkit's keeper.
`det.core.init()` and its contexts (distributed, train, preempt, checkpoint,
searcher) and `det.get_cluster_info()` are Determined 0.38's, over trialkit's
SDK, the keeper's stop file and the trial's checkpoint dir;
`python3 -m determined.launch.NAME` runs trialkit's launcher of that name.
docs/migration/determined.md maps each call.

A pause reaches the script the way Determined's does, through
`should_preempt()`, not as a death: on Determined nothing signals a trial
before it is asked to preempt, so a process under a keeper that imports
`determined` takes the keeper's SIGTERM (which the stop file already
answers) without dying of it, unless the script set its own handler. What
does not stop by itself is ended by the keeper's SIGKILL after the grace,
as Determined kills a trial that does not exit.
"""
import signal
import sys

from trialkit import env

from . import core  # noqa: F401  (det.core after a bare `import determined`)
from ._info import ClusterInfo, TrialInfo, get_cluster_info  # noqa: F401

__version__ = "0.38.0+trialkit"  # the Determined version whose Core API this is; +trialkit: not Determined itself

# Determined's log line format (enables filter-by-level in its WebUI; here, lines in the trial's log).
LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"


class InvalidHP(Exception):
    """Determined's: raise it from training code when the hyperparameters cannot be trained."""


def _take_stop_signal_as_preemption() -> None:
    if env.read().under_keeper and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: None)


_take_stop_signal_as_preemption()


def _not_here(name: str) -> str:
    # Trial classes (det.pytorch.PyTorchTrial, det.keras, ...) run Determined's own training loop: not here.
    return (f"trialkit's determined has the Core API only (det.core, det.get_cluster_info, det.launch), not "
            f"{name}: install determined in the trial's Python (pip install determined) for the rest of it "
            f"(docs/migration/determined.md)")


def __getattr__(name: str):
    raise AttributeError(_not_here(f"det.{name}"))


class NotServed(ModuleNotFoundError):
    """`import determined.pytorch` (or keras, ...): a module of Determined's that this package does not serve."""


class _NotServedFinder:
    """Last on sys.meta_path: asked only for a `determined.*` module no other finder found in this package."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.startswith(__name__ + "."):
            # No `name=`: `from determined import keras` would take a ModuleNotFoundError naming that module
            # for "no such attribute" and say only "cannot import name 'keras'".
            raise NotServed(_not_here(name))


sys.meta_path.append(_NotServedFinder())
