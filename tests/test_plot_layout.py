"""What `trialkit experiment plot` lays out, read from matplotlib's own objects after a draw (not pixels): the
legend covers no curve, a log axis's tick labels never meet however narrow its range, and an axis of whole
numbers (steps, a randint) is ticked at whole numbers only. The rows are trial_rows' shape, as `experiment
plot` hands them to `draw`.
"""
from __future__ import annotations

from typing import Any, Dict, List

import pytest

pytest.importorskip("matplotlib", reason="plots need matplotlib (the control extra)")

from trialkit.control.plot import draw  # noqa: E402


def trial(number: int, parameters: Dict[str, Any], intermediate: List[Any], final: Any) -> Dict[str, Any]:
    return {"trial_id": f"exp-{number}", "status": "SUCCEEDED", "parameters": parameters,
            "intermediate": intermediate, "final": final}


def drawn(rows: List[Dict[str, Any]], space: Dict[str, Any]) -> Any:
    figure = draw(rows, "exp", search_space=space)
    figure.canvas.draw()
    return figure


def panel(figure: Any, title: str) -> Any:
    (ax,) = [ax for ax in figure.axes if ax.get_visible() and ax.get_title() == title]
    return ax


def shown_labels(figure: Any, ax: Any) -> List[Any]:
    """The x tick labels drawn: with text, at a tick inside the axis's view (major and minor)."""
    low, high = sorted(ax.get_xlim())
    labels = ax.get_xticklabels() + ax.get_xticklabels(minor=True)
    return [label for label in labels if label.get_text() and label.get_visible()
            and low <= label.get_position()[0] <= high]


def test_the_legend_covers_no_curve_and_no_other_panel():
    # Twelve trials whose curves cross the whole panel, top to bottom: no corner inside it is free.
    rows = [trial(n, {"lr": 0.01 * (n + 1)}, [((n + step) % 12) / 11 for step in range(12)], n / 12)
            for n in range(12)]
    figure = drawn(rows, {"lr": {"_type": "uniform", "_value": [0.01, 0.12]}})
    renderer = figure.canvas.get_renderer()
    curves = panel(figure, "intermediate results")
    legend = curves.get_legend()
    assert legend is not None and [text.get_text() for text in legend.get_texts()] == [str(n) for n in range(12)]
    box = legend.get_window_extent(renderer)
    assert len(curves.lines) == 12
    for line in curves.lines:
        on_screen = line.get_path().transformed(line.get_transform())
        assert not on_screen.intersects_bbox(box, filled=False), f"the legend covers trial {line.get_label()}"
    others = [ax for ax in figure.axes if ax.get_visible() and ax is not curves]
    assert others and not any(box.overlaps(ax.get_window_extent(renderer)) for ax in others)
    assert figure.bbox.contains(box.x1, box.y1) and figure.bbox.contains(box.x0, box.y0)  # not cut off


@pytest.mark.parametrize("low, high", [(1.2e-3, 1.8e-3), (2e-3, 9e-3), (0.5, 5.0), (3e-5, 4e-4), (1e-4, 3e-3),
                                       (1e-6, 1.0)])
def test_a_log_axis_labels_round_ticks_that_never_meet(low, high):
    values = [low * (high / low) ** (n / 5) for n in range(6)]
    rows = [trial(n, {"lr": value}, [0.5], n) for n, value in enumerate(values)]
    figure = drawn(rows, {"lr": {"_type": "loguniform", "_value": [low, high]}})
    renderer = figure.canvas.get_renderer()
    ax = panel(figure, "final vs lr")
    assert ax.get_xscale() == "log"
    labels = sorted(shown_labels(figure, ax), key=lambda label: label.get_position()[0])
    assert len(labels) >= 2, [label.get_text() for label in labels]  # the axis still says where it is
    boxes = [label.get_window_extent(renderer) for label in labels]
    for (left, right), (one, other) in zip(zip(boxes, boxes[1:]), zip(labels, labels[1:])):
        assert left.x1 < right.x0, f"{one.get_text()!r} meets {other.get_text()!r} ({low}..{high})"


def test_a_parameters_axis_spans_its_search_space_not_only_the_values_drawn():
    # lr drawn within 0.001..0.01 of 1e-4..1e-1, x within 0.4..0.6 of 0..1: each axis spans the space as declared.
    rows = [trial(n, {"lr": 10 ** (-3 + n / 3), "x": 0.4 + n / 15}, [0.5], n) for n in range(4)]
    figure = drawn(rows, {"lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]},
                          "x": {"_type": "uniform", "_value": [0, 1]}})
    low, high = panel(figure, "final vs lr").get_xlim()
    assert low < 1e-4 < 1e-1 < high < 0.2, (low, high)  # with its margin
    assert [f"{tick:g}" for tick in panel(figure, "final vs lr").get_xticks() if low <= tick <= high] == \
        ["0.0001", "0.001", "0.01", "0.1"]
    low, high = panel(figure, "final vs x").get_xlim()
    assert -0.1 < low < 0 < 1 < high < 1.1, (low, high)


@pytest.mark.parametrize("low, high, ticks", [(1e-4, 1.0, ["0.0001", "0.001", "0.01", "0.1", "1"]),
                                              (1e-5, 1.0, ["1e-05", "0.001", "0.1"])])
def test_a_log_axis_of_many_decades_is_ticked_at_powers_of_ten_inside_its_space(low, high, ticks):
    # A newcomer's loguniform 1e-4..1 was labelled 0.4, 0.8, 1.2 (linear ticks, one beyond the space): a stride
    # over the decades from below the axis's margin left too few powers of ten inside it.
    rows = [trial(n, {"lr": low * (high / low) ** (n / 3)}, [0.5], n) for n in range(4)]
    figure = drawn(rows, {"lr": {"_type": "loguniform", "_value": [low, high]}})
    ax = panel(figure, "final vs lr")
    assert [label.get_text() for label in sorted(shown_labels(figure, ax), key=lambda one: one.get_position()[0])] \
        == ticks


def test_an_axis_of_whole_numbers_has_whole_ticks():
    # Three steps each (1, 2, 3), a randint parameter (1..3) and counts as the metric: each axis whole.
    rows = [trial(n, {"layers": 1 + n % 3, "lr": 0.1 + n / 100}, [n + step for step in range(3)], 10 + n)
            for n in range(4)]
    figure = drawn(rows, {"layers": {"_type": "randint", "_value": [1, 4]},
                          "lr": {"_type": "uniform", "_value": [0.1, 0.2]}})
    for title in ("intermediate results", "final vs layers"):
        ax = panel(figure, title)
        for ticks, (low, high) in ((ax.get_xticks(), ax.get_xlim()), (ax.get_yticks(), ax.get_ylim())):
            shown = [tick for tick in ticks if low <= tick <= high]
            assert len(shown) >= 2 and all(float(tick).is_integer() for tick in shown), (title, shown)
    # A parameter of fractions keeps its fractional ticks.
    fractions = panel(figure, "final vs lr").get_xticks()
    assert not all(float(tick).is_integer() for tick in fractions)


def test_a_tuners_budget_is_a_panel_and_its_checkpoint_paths_are_not():
    """As on the page (results.shown_parameters): Hyperband's TRIAL_BUDGET is drawn against the final result;
    PBT's checkpoint dirs, paths the tuner hands each trial, drew 100 overlapping labels and are left out."""
    space = {"lr": {"_type": "loguniform", "_value": [0.001, 0.1]}}
    rows = [trial(n, {"lr": 0.01 * (n + 1), "TRIAL_BUDGET": 3 ** n, "load_checkpoint_dir": f"/c/{n}/0",
                      "save_checkpoint_dir": f"/c/{n}/1"}, [0.1, 0.2], 0.3 + n / 10) for n in range(3)]
    titles = {ax.get_title() for ax in drawn(rows, space).axes if ax.get_visible()}
    assert {"final vs lr", "final vs TRIAL_BUDGET"} <= titles, titles
    assert not {t for t in titles if "checkpoint_dir" in t}, titles


def test_no_two_curves_look_alike_past_ten_trials():
    # A new user's legend: trials 00000 and 00010 were both blue, with the same line.
    rows = [trial(n, {"lr": 0.01 * (n + 1)}, [n / 12, (n + 1) / 12], n / 12) for n in range(12)]
    figure = drawn(rows, {"lr": {"_type": "uniform", "_value": [0.01, 0.12]}})
    curves = panel(figure, "intermediate results")
    looks = [(line.get_color(), line.get_linestyle()) for line in curves.lines]
    assert len(looks) == 12 and len(set(looks)) == 12, looks
    legend = curves.get_legend()
    entries = [(handle.get_color(), handle.get_linestyle()) for handle in legend.legend_handles]
    assert entries == looks  # the legend tells them apart as the panel does
