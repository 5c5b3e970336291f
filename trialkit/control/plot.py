"""`trialkit experiment plot`: an experiment's metrics in one PNG.

The first panel draws each trial's intermediate results against their step;
then one panel per parameter draws the final metric against that parameter's
value (a choice's options are spread along the axis in their order).
A panel with nothing to draw says why on it; an experiment with no metric at
all (every trial failed before reporting) is no plot: `nothing_to_plot` says so.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional

from trialkit.control.results import flat_parameters, metric_value

COLUMNS = 3


def nothing_to_plot(rows: List[Dict[str, Any]]) -> Optional[str]:
    """Why there is no plot of these trials (none reported a metric), or None when there is one."""
    if not rows or any(row["intermediate"] or row["final"] is not None for row in rows):
        return None  # no trial yet: the panels say so
    failed = sum(row["status"] == "FAILED" for row in rows)
    return (f"none of its {len(rows)} trials reported a metric" + (f" ({failed} failed)" if failed else "")
            + ": see why with `trialkit trial list`")


def plot_experiment(rows: List[Dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt

    params: List[str] = []
    for row in rows:
        params += [key for key in flat_parameters(row["parameters"]) if key not in params]
    panels = 1 + len(params)
    columns = min(COLUMNS, panels)
    lines = math.ceil(panels / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(5 * columns, 3.8 * lines), squeeze=False)
    flat_axes = [ax for line in axes for ax in line]
    _curves(flat_axes[0], rows)
    for ax, name in zip(flat_axes[1:], params):
        _final_against(ax, rows, name)
    for ax in flat_axes[panels:]:
        ax.set_visible(False)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100, format="png")  # at `path` as named: matplotlib adds .png to a name without
    plt.close(figure)


def _curves(ax: Any, rows: List[Dict[str, Any]]) -> None:
    for row in rows:
        values = [metric_value(value) for value in row["intermediate"]]
        points = [(step, value) for step, value in enumerate(values, start=1) if value is not None]
        if points:
            ax.plot(*zip(*points), marker=".", linewidth=1, label=row["trial_id"].rsplit("-", 1)[-1])
    if not rows:
        _empty(ax, "no trial yet")
    elif not any(row["intermediate"] for row in rows):
        _empty(ax, "no intermediate results:\nthe trials reported final results only")
    ax.set_title("intermediate results")
    ax.set_xlabel("step")
    ax.set_ylabel("metric")
    if 0 < len(rows) <= 12:
        ax.legend(fontsize="x-small")


def _final_against(ax: Any, rows: List[Dict[str, Any]], name: str) -> None:
    xs, ys = [], []
    for row in rows:
        final = metric_value(row["final"])
        value = flat_parameters(row["parameters"]).get(name)
        if final is not None and value is not None:
            xs.append(value)
            ys.append(final)
    if xs and not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
        labels = list(dict.fromkeys(str(x) for x in xs))  # categories in their first-seen order
        xs = [labels.index(str(x)) for x in xs]
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, fontsize="small")
    ax.scatter(xs, ys, s=18)
    if not xs:
        _empty(ax, "no final result yet")
    ax.set_title(f"final vs {name}")
    ax.set_xlabel(name)
    ax.set_ylabel("final metric")


def _empty(ax: Any, why: str) -> None:
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="gray")
