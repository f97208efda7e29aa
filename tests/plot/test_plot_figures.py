"""iasgd.plot.figures and iasgd.plot.panels: the panels that have data, what
each draws, and the grid they are laid out in."""

from __future__ import annotations

import math

import pytest
from documents import panels, results, sweep, write

from iasgd.plot import cli, figures, grouping, readers


def test_the_figure_marks_bounds_traces_and_labels():
    runs = [readers.results_run(results("interval", 8, interval=16), "a.json"),
            readers.results_run(results("hogwild", 8, threads_schedule="window"), "b.json")]
    grouping.label_runs(runs)
    fig = figures.figure(runs)
    axes = panels(fig)
    assert list(axes) == ["accuracy-time", "loss-time", "accuracy-epoch", "loss-epoch",
                          "time-to-target", "staleness", "schedules"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "interval y=16, 8 threads", "hogwild, 8 threads, m window"]
    hist_ax, trace_ax = axes["staleness"], axes["schedules"]
    assert hist_ax.get_yscale() == "log" and hist_ax.get_xscale() == "symlog"
    bounds = [line.get_xdata()[0] for line in hist_ax.lines if line.get_linestyle() == "--"]
    assert bounds == [15]  # interval's y - 1; hogwild is unbounded: no line
    assert len(trace_ax.lines) == 2  # y of the interval run, m of the elastic one
    y_line = trace_ax.lines[0]
    assert list(y_line.get_ydata()) == [16, 12, 12] and y_line.get_xdata()[-1] == 4.5
    assert list(axes["accuracy-epoch"].lines[0].get_ydata()) == pytest.approx([60, 70, 80])
    assert len(axes["loss-time"].lines) == len(axes["loss-epoch"].lines) == 2
    assert axes["accuracy-time"].get_xlabel() == "training time (s)"
    assert "seeds" not in axes["accuracy-time"].get_title()  # one run each: no band


def test_panels_without_data_are_left_out(tmp_path):
    path = write(tmp_path / "s.json", sweep())
    fig = figures.figure(readers.load(f"{path}:hogwild:2,8"))
    assert list(panels(fig)) == ["accuracy-time", "time-to-target", "staleness"]
    assert fig.axes[0].get_subplotspec().get_geometry()[:2] == (1, 3)
    fixed = readers.results_run(results("interval", 4), "a.json")
    fixed.y_trace = [(0.0, 8.0)]  # a fixed y is not a schedule
    no_loss = readers.results_run(results("hogwild", 4), "b.json")
    no_loss.loss = [math.nan] * 3
    assert list(panels(figures.figure([fixed]))) == [
        "accuracy-time", "loss-time", "accuracy-epoch", "loss-epoch", "time-to-target",
        "staleness"]
    assert "loss-time" not in panels(figures.figure([no_loss]))
    zero = readers.results_run(results("hogwild", 4), "z.json")
    zero.accuracy = zero.epoch_accuracy = [0.0, 0.0, 0.0]  # no target any run reaches
    assert "time-to-target" not in panels(figures.figure([zero]))
    assert [figures.grid_shape(n) for n in (1, 3, 4, 6, 7)] == [(1, 1), (1, 3), (2, 2), (2, 3),
                                                             (2, 4)]


def test_targets_reach_the_figure(tmp_path):
    path = write(tmp_path / "r.json", results())
    out = tmp_path / "f.svg"
    assert cli.main([path, "--target", "55", "--target", "65", "--out", str(out)]) == 0
    assert "Time to 55 %, 65 % test accuracy" in out.read_text()
