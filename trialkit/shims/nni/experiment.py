"""trialkit's `nni.experiment`: NNI's Python API (Experiment, ExperimentConfig,
AlgorithmConfig, LocalConfig, ...) for a user's Python that has trialkit and no nni.

NNI's notebooks and examples start experiments with `from nni.experiment import
Experiment`; trialkit.experiment is that API member for member, so its names are
served here as they are there. Lazily, on first use: this package also ships to
trials (trialkit/platforms/trialside.py), where the control plane is absent and
nothing here may load it. In a trial, asking for a name says so.
"""


def __getattr__(name: str):
    if name.startswith("__"):  # import machinery and tools probe dunders: they are not the API
        raise AttributeError(name)
    try:
        # The one import of the control plane from the trial side (tests/test_layering.py knows it).
        from trialkit import experiment
    except ImportError as err:
        raise ImportError(f"nni.experiment.{name}: trialkit's nni serves the experiment API only where trialkit's "
                          f"control plane is installed ({err}); install nni or trialkit there") from None
    return getattr(experiment, name)
