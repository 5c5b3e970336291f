"""trialkit's `nni`: NNI's trial API for a training process whose Python has no nni.

Served only where `import nni` finds no real nni (trialkit/shims): NNI's example
trials and users' trial code run unchanged under trialkit. Each function is
NNI 3.0's, over trialkit's SDK: parameters from the trial's environment, metrics
into the channel the keeper follows. `nni.experiment` is trialkit.experiment's
Python API, served in any Python that has trialkit installed (its .pth, setup.py),
so NNI's notebooks run there too. What else NNI is (tuners, NAS, compression)
is not here: asking for it says so and how to get it.
"""
import os
import sys

from trialkit import env

from . import utils  # noqa: F401  (nni.utils.merge_parameter after a bare `import nni`, as NNI's own __init__ allows)
from .trial import (  # noqa: F401  (NNI 3.0's nni.trial.__all__, re-exported as nni does)
    get_current_parameter,
    get_experiment_id,
    get_next_parameter,
    get_next_parameters,
    get_sequence_id,
    get_trial_id,
    report_final_result,
    report_intermediate_result,
)

__version__ = "3.0+trialkit"  # the NNI version whose trial API this is; +trialkit: not NNI itself

if not os.environ.get(env.UNDER_KEEPER):
    # Said to a user who runs the script by hand; under a trial's keeper nothing (it would be every trial's
    # log line: the experiment's trials all import it alike).
    print("trialkit: nni is not installed in this Python; trialkit's nni serves the trial API "
          "(get_next_parameter, report_*_result, ...) and nni.experiment", file=sys.stderr, flush=True)


class NoMoreTrialError(Exception):
    """NNI's: raised by a tuner when the search space is exhausted (imported by some trial code)."""

    def __init__(self, message: str = "Search space fully explored"):
        super().__init__(message)


def __getattr__(name: str):
    if name == "experiment":  # `import nni; nni.experiment.Experiment(...)`, as NNI's package allows
        # By its full name: `from . import experiment` asks this package for the attribute first, which
        # comes back here, without end.
        import importlib

        return importlib.import_module(__name__ + ".experiment")
    raise AttributeError(f"trialkit's nni has the trial API only, not nni.{name}: "
                         f"install nni (pip install nni) in the trial's Python for the rest of it")
