"""`trialkit experiment plot`: an experiment's metrics in one PNG.

First one panel per metric (results.metrics_of: "default", each key of
an NNI dict metric, each metric of a Determined report by the name its user
wrote, GROUP.NAME where two groups share it; the first few, or those asked
for, by either name) draws each trial's values against their step: the step a
report names (Determined's steps_completed: batches), else its place in the
trial's series; every run of a trial is one series. Then one panel per
parameter draws the final metric against that parameter's value, on the axis
its search space gives it (`parameter_scale`: log for the log types,
categories in the space's order for a choice), across the whole space as it is
declared (`parameter_span`: low to high), not only the values drawn. Each curve panel's legend sits
beside it, never over a curve; an axis whose values are all whole numbers (steps, a
randint) has whole-number ticks; no two of the first 40 curves share colour and dash; a log axis has a few round ticks whose labels
never meet (`log_ticks`). A panel with nothing to draw
says why on it; an experiment with no metric at all (every trial failed before
reporting) is no plot: `nothing_to_plot` says so.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from trialkit import records
from trialkit.control.results import (Metric, find_metric, flat_parameters, metric_points, metric_value, metrics_of,
                                      shown_parameters)

COLUMNS = 3
LOG_TICKS = 5  # at most, on a log axis: more of them, in a panel 5 inches wide, meet
CURVE_PANELS = 4  # metrics drawn when none is asked for: the first ones (`--metric NAME` picks others)
LOG_TYPES = frozenset({"loguniform", "qloguniform", "lognormal", "qlognormal"})  # Determined's `log` is loguniform
STEP_TITLE, BATCH_TITLE = "step", "batches (steps_completed)"
# A curve's look: matplotlib's ten colours, then again in each of these dashes, so that no two of the first 40
# trials' curves (or legend entries: 00000 and 00010 were both blue) look alike.
DASHES = ("-", "--", ":", "-.")


def nothing_to_plot(rows: List[Dict[str, Any]]) -> Optional[str]:
    """Why there is no plot of these trials (none reported a metric), or None when there is one."""
    if not rows or any(row["intermediate"] or row["final"] is not None for row in rows):
        return None  # no trial yet: the panels say so
    failed = sum(row["status"] == "FAILED" for row in rows)
    return (f"none of its {len(rows)} trials reported a metric" + (f" ({failed} failed)" if failed else "")
            + ": see why with `trialkit trial list`")


def reported_metrics(rows: List[Dict[str, Any]]) -> List[Metric]:
    """The metrics these trials' intermediate results hold, the one looked at first first."""
    return metrics_of(value for row in rows for value in row["intermediate"])


def step_title(values: Iterable[Any], name: str) -> str:
    """What the x axis of metric `name`'s curves (records.scalars' name) counts: batches where the reports
    holding it name their step (Determined's), else steps."""
    named = any(records.report_step(value) and name in dict(records.scalars(value)) for value in values)
    return BATCH_TITLE if named else STEP_TITLE


def parameter_scale(space: Mapping[str, Any], name: str) -> Tuple[str, List[Any]]:
    """How parameter `name` (flat_parameters' dotted names) is drawn: ("log", []) for the log types,
    ("category", its options in the space's order) for a choice, else ("linear", [])."""
    spec = _spec(space, name)
    kind = spec.get("_type") if isinstance(spec, dict) else None
    if kind in LOG_TYPES:
        return "log", []
    if kind == "choice" and isinstance(spec.get("_value"), list):
        return "category", [option.get("_name") if isinstance(option, dict) else option for option in spec["_value"]]
    return "linear", []


def parameter_span(space: Mapping[str, Any], name: str) -> Optional[Tuple[float, float]]:
    """The [low, high] the search space declares for parameter `name` (a bounded numeric type: uniform,
    loguniform, randint and their q-variants), the whole space an axis of it spans whether or not a trial
    drew near its ends; None for a choice, the unbounded normal types or a spec that names no such range."""
    from trialkit.control.searchspace import NUMERIC_ARGS  # here: the CLI's reads load this module, not dataclasses

    spec = _spec(space, name)
    kind = spec.get("_type") if isinstance(spec, dict) else None
    value = spec.get("_value") if isinstance(spec, dict) else None
    if NUMERIC_ARGS.get(kind, ())[:2] != ("low", "high") or not isinstance(value, list) or len(value) < 2:
        return None
    low, high = value[:2]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (low, high)) \
            or low >= high or (kind in LOG_TYPES and low <= 0):
        return None
    return float(low), float(high)


def log_ticks(low: float, high: float, most: int = LOG_TICKS) -> List[float]:
    """Round ticks for a log axis from `low` to `high` (both > 0): the first of powers of ten (every other one,
    every third, ... where there are many), 1, 2 and 5 times them, 1 to 9 times them that gives 3 to `most`
    ticks, else (a range too narrow for those) evenly spaced round numbers."""
    from matplotlib.ticker import MaxNLocator

    first, last = math.floor(math.log10(low)), math.floor(math.log10(high))
    decades = list(range(first, last + 1))
    # Thinned among the powers inside the range: a stride from `first`, below it, could leave too few.
    inside = [exponent for exponent in decades if low <= 10.0 ** exponent <= high]
    stride = max(1, math.ceil(len(inside) / most))
    for exponents, subs in ((inside[::stride], (1,)), (decades, (1, 2, 5)), (decades, range(1, 10))):
        ticks = [sub * 10.0 ** exponent for exponent in exponents for sub in subs]
        ticks = [tick for tick in ticks if low <= tick <= high]
        if 3 <= len(ticks) <= most:
            return ticks
    return [float(tick) for tick in MaxNLocator(nbins=most - 1).tick_values(low, high) if low <= tick <= high]


def _spec(space: Mapping[str, Any], name: str) -> Any:
    """The search space's spec of a flat name: a top-level key, or a key inside a nested choice's option."""
    if not isinstance(space, Mapping):
        return None
    if name in space:
        return space[name]
    for at, char in enumerate(name):
        spec = space.get(name[:at]) if char == "." else None
        options = spec.get("_value") if isinstance(spec, dict) and spec.get("_type") == "choice" else None
        for option in options if isinstance(options, list) else []:
            found = _spec(option, name[at + 1:]) if isinstance(option, dict) else None
            if found is not None:
                return found
    return None


def plot_experiment(rows: List[Dict[str, Any]], title: str, path: Path, metrics: Sequence[str] = (),
                    search_space: Optional[Mapping[str, Any]] = None) -> None:
    """Write the PNG of `draw`."""
    import matplotlib.pyplot as plt

    figure = draw(rows, title, metrics, search_space)
    figure.savefig(path, dpi=100, format="png")  # at `path` as named: matplotlib adds .png to a name without
    plt.close(figure)


def draw(rows: List[Dict[str, Any]], title: str, metrics: Sequence[str] = (),
         search_space: Optional[Mapping[str, Any]] = None) -> Any:
    """The figure: curves of `metrics` (by either name; default: the first CURVE_PANELS reported), then final vs
    each parameter on its search space's axis."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt

    curves = list(metrics) or [metric.shown for metric in reported_metrics(rows)[:CURVE_PANELS]] or ["default"]
    params: List[str] = []
    for row in rows:  # the page's parameters (results.shown_parameters): a tuner's paths are no axis
        flat = flat_parameters(row["parameters"])
        searched = [key for key in flat if not search_space or key.split(".")[0] in search_space]
        params += [key for key in shown_parameters(searched, flat) if key not in params]
    panels = len(curves) + len(params)
    columns = min(COLUMNS, panels)
    lines = math.ceil(panels / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(5 * columns, 3.8 * lines), squeeze=False)
    flat_axes = [ax for line in axes for ax in line]
    for ax, name in zip(flat_axes, curves):
        _curves(ax, rows, name)
    for ax, name in zip(flat_axes[len(curves):], params):
        _final_against(ax, rows, name, parameter_scale(search_space or {}, name),
                       parameter_span(search_space or {}, name))
    for ax in flat_axes[panels:]:
        ax.set_visible(False)
    figure.suptitle(title)
    figure.tight_layout()  # makes room for the legends beside the panels
    return figure


def _curves(ax: Any, rows: List[Dict[str, Any]], name: str) -> None:
    """Metric `name` (either of its names) of each trial against its steps."""
    metric = find_metric(reported_metrics(rows), name) or Metric(name, name, None)
    steps: List[float] = []
    values: List[float] = []
    for row in rows:
        points = metric_points(row["intermediate"], metric.name)
        if points:
            drawn_before = len(ax.lines)
            ax.plot(*zip(*points), marker=".", linewidth=1, label=row["trial_id"].rsplit("-", 1)[-1],
                    color=f"C{drawn_before % 10}", linestyle=DASHES[drawn_before // 10 % len(DASHES)])
            steps += [step for step, _ in points]
            values += [value for _, value in points]
    drawn = bool(steps)
    if not rows:
        _empty(ax, "no trial yet")
    elif not any(row["intermediate"] for row in rows):
        _empty(ax, "no intermediate results:\nthe trials reported final results only")
    elif not drawn:
        _empty(ax, f"no trial reported {metric.shown}")
    # A Determined metric shown by its own name carries its group beside it, as Determined's UI marks it.
    marked = f"{metric.shown} ({metric.group})" if metric.group and metric.shown != metric.name else metric.shown
    ax.set_title("intermediate results" if metric.name == "default" else marked)
    ax.set_xlabel(step_title((value for row in rows for value in row["intermediate"]), metric.name))
    ax.set_ylabel("metric" if metric.name == "default" else metric.shown)
    _whole_ticks(ax.xaxis, steps)
    _whole_ticks(ax.yaxis, values)
    if drawn and len(rows) <= 12:
        # Beside the panel: inside it, with every trial's curve over the whole range, no corner is free.
        ax.legend(title="trial", fontsize="x-small", title_fontsize="x-small", loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _final_against(ax: Any, rows: List[Dict[str, Any]], name: str, scale: Tuple[str, List[Any]],
                   span: Optional[Tuple[float, float]]) -> None:
    xs, ys = [], []
    for row in rows:
        final = metric_value(row["final"])
        value = flat_parameters(row["parameters"]).get(name)
        if final is not None and value is not None:
            xs.append(value)
            ys.append(final)
    kind, options = scale
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    categorical = kind == "category" or not numeric
    if categorical:
        # The space's options in its order (every one, drawn or not), then any value it does not name.
        labels = list(dict.fromkeys([str(option) for option in options] + [str(x) for x in xs]))
        xs = [labels.index(str(x)) for x in xs]
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, fontsize="small")
        ax.set_xlim(-0.5, len(labels) - 0.5)
    elif kind == "log":
        ax.set_xscale("log")
    ax.scatter(xs, ys, s=18)
    if span is not None and not categorical and (kind != "log" or all(x > 0 for x in xs)):
        _span_axis(ax, min([span[0], *xs]), max([span[1], *xs]), kind == "log")
    if kind == "log" and not categorical:
        _log_axis(ax.xaxis, *ax.get_xlim())
    elif not categorical:
        _whole_ticks(ax.xaxis, xs)
    _whole_ticks(ax.yaxis, ys)
    if not xs:
        _empty(ax, "no final result yet")
    ax.set_title(f"final vs {name}")
    ax.set_xlabel(name + (" (log)" if kind == "log" else ""))
    ax.set_ylabel("final metric")


def _span_axis(ax: Any, low: float, high: float, log: bool) -> None:
    """The x axis from `low` to `high` (the space's span, widened to any value beyond it), with matplotlib's own
    margin (5% a side, of the log for a log axis) so that a point at either end shows whole."""
    if log:
        low, high = math.log10(low), math.log10(high)
    pad = (high - low) * 0.05
    ends = (low - pad, high + pad)
    ax.set_xlim(*((10 ** end for end in ends) if log else ends))


def _whole_ticks(axis: Any, values: Sequence[float]) -> None:
    """Ticks on whole numbers only, where every value drawn is one (a step at 1.25 means nothing)."""
    from matplotlib.ticker import MaxNLocator

    if values and all(float(value).is_integer() for value in values):
        axis.set_major_locator(MaxNLocator(integer=True))


def _log_axis(axis: Any, low: float, high: float) -> None:
    """`log_ticks` labelled plainly ("0.002", "1e-05"), no labels between them: matplotlib's own label each
    minor tick of a range under a decade or two, and they meet."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    axis.set_major_locator(FixedLocator(log_ticks(low, high)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def _empty(ax: Any, why: str) -> None:
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="gray")
