"""The figure: the panels that have data in a grid of one or two rows, the
title and one legend entry per group; written atomically."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from iasgd import files
from iasgd.plot.grouping import Group, default_target, group_runs, ordered
from iasgd.plot.panels import PANELS, Context
from iasgd.plot.readers import Run

PANEL_W, PANEL_H = 5.2, 4.2  # inches per panel (100 dpi: 520 x 420 pixels)


def grid_shape(panels: int) -> tuple[int, int]:
    """(rows, columns) for `panels` panels: one row up to 3, then 2 rows."""
    if panels <= 3:
        return 1, max(panels, 1)
    return 2, math.ceil(panels / 2)


def _targets(runs: list[Run], targets: Sequence[float] | None) -> tuple[list[float], str]:
    """The targets to draw (percent) and the note that says where they came from."""
    if targets:
        return list(targets), ""
    auto = default_target(runs)
    return ([], "") if auto is None else ([auto], "target: highest all runs reach")


def draw(runs: list[Run], out: Path, targets: Sequence[float] | None = None) -> None:
    """Draw the figure of `runs` into `out`, atomically; the format follows its
    suffix (png, pdf, svg, ...). targets: percent (None: automatic)."""
    import matplotlib.pyplot as plt

    fig = figure(runs, targets)
    try:
        with files.replacing(out) as tmp:
            fig.savefig(tmp, format=out.suffix[1:].lower(), dpi=100)
    finally:
        plt.close(fig)


def figure(runs: list[Run], targets: Sequence[float] | None = None) -> Any:
    """The matplotlib Figure (Agg backend) of `runs`: one panel (Axes, labelled
    with its name in PANELS) for each kind of data the runs have, in a grid of
    one or two rows of 520 x 420 pixels each at 100 dpi, and one legend entry
    per group below them. targets: test accuracies in percent for the
    time-to-target panel (None or empty: the highest every run reaches)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    groups = ordered(group_runs(runs))
    chosen, note = _targets(runs, targets)
    seconds = ("training time (s, SIMULATED)" if all(r.simulated for r in runs)
               else "training time (s)")
    ctx = Context(seconds=seconds, targets=chosen, target_note=note,
                  seeds=any(len(g.runs) > 1 for g in groups), crowded=len(groups) > 6)
    panels = [p for p in PANELS if p.has(groups) and (p.name != "time-to-target" or chosen)]
    rows, cols = grid_shape(len(panels))
    legend_rows = math.ceil(len(groups) / _legend_columns(groups))
    fig = plt.figure(figsize=(PANEL_W * cols, PANEL_H * rows + 0.6 + 0.22 * legend_rows),
                     layout="constrained")
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1, label=panel.name)
        panel.draw(ax, groups, ctx)
        ax.grid(alpha=0.3)
        ax.title.set_fontsize(10)
    _decorate(fig, runs, groups)
    return fig


def _legend_columns(groups: list[Group]) -> int:
    """One column per variant when every variant has as many groups (the
    columns then read as variants, rows as thread counts), else up to 3."""
    per = [sum(g.variant == v for g in groups) for v in dict.fromkeys(g.variant for g in groups)]
    if 1 < len(per) <= 5 and len(set(per)) == 1:
        return len(per)
    return max(1, min(len(groups), 3))


def _decorate(fig: Any, runs: list[Run], groups: list[Group]) -> None:
    """The title and the legend (one entry per group, the band explained)."""
    from matplotlib.lines import Line2D

    names = sorted({f"{r.config.get('model') or 'lenet'} on {r.config.get('dataset')}"
                    for r in runs})
    title = "iasgd: " + "; ".join(names)
    if any(r.simulated for r in runs):
        title += "  -  SIMULATED runs: times and throughput are simulated"
    fig.suptitle(title, fontsize=12)
    handles = [Line2D([], [], color=g.color, lw=2, label=g.label) for g in groups]
    fig.legend(handles=handles, loc="outside lower center", ncols=_legend_columns(groups),
               fontsize=9, frameon=False)

