"""BOHB's model: the kernel densities of good and bad configurations on the largest budget that has enough.

This is the model NNI's BOHB builds (its config_generator.py, after HpBandSter,
the BOHB authors' code) with the library it uses: statsmodels'
KDEMultivariate, normal-reference bandwidths. statsmodels rather than optuna's
TPE because BOHB's one multivariate density over all parameters, its
bandwidth factor and its minimum bandwidth are what BOHB's classArgs tune, and
optuna's sampler has no place for the last two. A configuration is a vector:
a numeric parameter its unit coordinate (searchspace.Numeric.to_unit, so a
log-uniform one is modelled on its log), a choice its option's index.

For each budget, its results sorted by loss (the value, negated when
maximizing): the best max(min_points_in_model, top_n_percent%) are good, the
next max(min_points_in_model, the rest%) bad; a budget has a model when both
sets hold more points than there are parameters. A new configuration is, with
probability random_fraction or while no budget has a model, drawn from the
space; otherwise the best of num_samples candidates by bad(x) / good(x), each a
good point with every numeric coordinate moved by a normal of the good
density's bandwidth times bandwidth_factor (truncated to [0, 1]) and each
choice kept with probability 1 - bandwidth, else drawn anew. Bandwidths are at
least min_bandwidth. NNI feeds the model with results on the budget its trial
reported as the final record's sequence number; here the budget is the
trial's TRIAL_BUDGET, the budget BOHB gave it.
"""
from __future__ import annotations

import random
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from trialkit.control.searchspace import Choice, SearchSpace


class KdeSettings(NamedTuple):
    min_points_in_model: int
    top_n_percent: int
    num_samples: int
    random_fraction: float
    bandwidth_factor: float
    min_bandwidth: float

    @classmethod
    def from_args(cls, args: Mapping[str, Any], dimensions: int) -> "KdeSettings":
        """NNI's defaults; min_points_in_model is at least one more than the parameters, as NNI makes it."""
        least = dimensions + 1
        return cls(max(args.get("min_points_in_model") or least, least), args.get("top_n_percent", 15),
                   args.get("num_samples", 64), args.get("random_fraction", 1 / 3), args.get("bandwidth_factor", 3.0),
                   args.get("min_bandwidth", 1e-3))


class Model(NamedTuple):
    budget: float
    good: Any  # statsmodels KDEMultivariate
    bad: Any


def vector(space: SearchSpace, params: Mapping[str, Any]) -> List[float]:
    return [float(param.index_of(params[key])) if isinstance(param, Choice) else param.to_unit(params[key])
            for key, param in space.params.items()]


def point(space: SearchSpace, values: Sequence[float]) -> Dict[str, Any]:
    out = {}
    for (key, param), value in zip(space.params.items(), values):
        if isinstance(param, Choice):
            out[key] = param.value_at(min(max(int(round(value)), 0), len(param.options) - 1), lambda sub: {})
        else:
            out[key] = param.from_unit(min(max(float(value), 0.0), 1.0))
    return out


def _var_types(space: SearchSpace) -> str:
    return "".join("u" if isinstance(param, Choice) else "c" for param in space.params.values())


def load_libraries() -> None:
    """Import what fit() and sample() use, so that they find it imported (each imports it too)."""
    import scipy.stats  # noqa: F401
    from statsmodels.nonparametric import kernel_density  # noqa: F401


def fit(space: SearchSpace, observations: Sequence[Tuple[Mapping[str, Any], float, float]], optimize_mode: str,
        settings: KdeSettings) -> Optional[Model]:
    """The model of the largest budget that has one, from (parameters, value, budget) of finished trials."""
    sign = -1.0 if optimize_mode == "maximize" else 1.0
    by_budget: Dict[float, List[Tuple[float, List[float]]]] = {}
    for params, value, budget in observations:
        if space.contains({k: v for k, v in params.items() if k in space.params}):
            by_budget.setdefault(budget, []).append((sign * value, vector(space, params)))
    dims = len(space.params)
    for budget in sorted(by_budget, reverse=True):
        # Sorted by loss, ties by the configuration: the model is a function of the results, not their order.
        rows = sorted(by_budget[budget])
        if len(rows) < settings.min_points_in_model:
            continue
        import numpy  # only once a budget has the points (the first bracket has none: it waits for no import)
        from statsmodels.nonparametric.kernel_density import KDEMultivariate

        n_good = max(settings.min_points_in_model, settings.top_n_percent * len(rows) // 100)
        n_bad = max(settings.min_points_in_model, (100 - settings.top_n_percent) * len(rows) // 100)
        good = numpy.array([row for _, row in rows[:n_good]])
        bad = numpy.array([row for _, row in rows[n_good:n_good + n_bad]])
        if len(good) <= dims or len(bad) <= dims:
            continue
        # rng: the estimator's own numbers, which normal-reference bandwidths never draw (statsmodels 0.15 warns
        # when none is given).
        kdes = [KDEMultivariate(data=data, var_type=_var_types(space), bw="normal_reference", rng=0)
                for data in (good, bad)]
        for kde in kdes:
            kde.bw = numpy.clip(kde.bw, settings.min_bandwidth, None)
        return Model(budget, *kdes)
    return None


def sample(space: SearchSpace, model: Optional[Model], settings: KdeSettings, rng: random.Random) -> Dict[str, Any]:
    """A configuration: from the space, or the model's best of num_samples candidates (see the module)."""
    if model is None or rng.random() < settings.random_fraction:
        return space.sample(rng)
    import numpy
    from scipy.stats import truncnorm

    state = numpy.random.RandomState(rng.getrandbits(32))  # this proposal's own numbers, as numpy draws them
    # The candidates at once, as arrays: one call each to scipy and statsmodels rather than one per candidate
    # and coordinate (measured: 23 ms a proposal became 3, while the trials wait for it).
    count, bandwidths = settings.num_samples, numpy.maximum(model.good.bw, settings.min_bandwidth)
    candidates = model.good.data[state.randint(len(model.good.data), size=count)].astype(float)
    levels = numpy.array([len(param.options) if isinstance(param, Choice) else 0 for param in space.params.values()])
    numeric = levels == 0
    if numeric.any():
        means = candidates[:, numeric]
        scales = numpy.broadcast_to(bandwidths[numeric] * settings.bandwidth_factor, means.shape)
        candidates[:, numeric] = truncnorm.rvs(-means / scales, (1 - means) / scales, loc=means, scale=scales,
                                               random_state=state)
    for column in numpy.flatnonzero(~numeric):
        redrawn = state.rand(count) >= 1 - bandwidths[column]  # a choice kept with probability 1 - bandwidth
        candidates[redrawn, column] = state.randint(levels[column], size=int(redrawn.sum()))
    # A choice with one level among the model's points is a division by zero inside statsmodels' kernel
    # (its levels are those it saw): the infinite densities are the case handled below, as NNI's BOHB
    # handles them, so numpy's warnings about them would only scribble over the run's progress line.
    with numpy.errstate(divide="ignore", invalid="ignore"):
        good = numpy.atleast_1d(model.good.pdf(candidates))
        bad = numpy.atleast_1d(model.bad.pdf(candidates))
        scores = numpy.fmax(bad, 1e-32) / numpy.fmax(good, 1e-32)  # fmax: a NaN density counts as none, as max()
    finite = numpy.isfinite(scores)
    # The first candidate of an infinite ratio whose good density is finite wins at once (NNI's BOHB); else the
    # least ratio, the first of equals; none finite: a draw from the space.
    infinite = numpy.flatnonzero(~finite & numpy.isfinite(good))
    if infinite.size:
        return point(space, candidates[infinite[0]])
    if not finite.any():
        return space.sample(rng)
    return point(space, candidates[int(numpy.argmin(numpy.where(finite, scores, numpy.inf)))])
