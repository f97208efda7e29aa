"""The panels of the figure: each draws one Axes from the groups, and says
whether the groups have data for it (`PANELS`, in the order they appear)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from iasgd.plot.grouping import (
    Group,
    Reach,
    aggregate,
    group_time_to_target,
    pooled_histogram,
    survival,
)
from iasgd.plot.readers import Run

TARGET_STYLES = ("-", "--", ":", "-.")  # one line style per --target value
NUDGE = 0.06  # time to target: points side by side, in octaves (or shares of a linear axis)


def _pct(value: float) -> str:
    return f"{value:g} %"


# panels: each draws one Axes from the groups; `has` says whether it has data


@dataclass
class Panel:
    name: str  # the Axes' label, e.g. "staleness"
    has: Callable[[list[Group]], bool]
    draw: Callable[..., None]  # (ax, groups, ctx)


@dataclass
class Context:
    """What every panel needs besides the groups."""

    seconds: str  # x label of training time
    targets: list[float] = field(default_factory=list)  # percent
    target_note: str = ""  # why these targets, for the panel title
    seeds: bool = False  # some group aggregates several seeds (bands and bars say so)
    crowded: bool = False  # many groups: fainter bands, thinner lines


def _mean_band(ax: Any, group: Group, curves: list[tuple[list[float], list[float]]],
               scale: float, ctx: Context) -> None:
    """One run: its line with markers; several seeds: their mean line and a
    min-max band (y times `scale`, e.g. 100 for percent)."""
    lw = 1.1 if ctx.crowded else 1.5
    if len(curves) == 1:
        x, y = curves[0]
        ax.plot(x, [scale * v for v in y], marker="o", ms=2.5, lw=lw, color=group.color)
    elif curves:
        grid, mean, lo, hi = aggregate(curves)
        ax.fill_between(grid, scale * lo, scale * hi, color=group.color, lw=0,
                        alpha=0.08 if ctx.crowded else 0.18)
        ax.plot(grid, scale * mean, lw=lw, color=group.color)


def _seeds_note(ctx: Context) -> str:
    return "\nline: mean over seeds; shaded: min-max" if ctx.seeds else ""


@dataclass(frozen=True)
class Curves:
    """Draws a panel of a quantity against training time or epochs: each
    group's mean line and min-max band (one run: its points). points: a
    run's (x, y); epochs_only: runs without epochs (a sweep's) are left out."""

    points: Callable[[Run], tuple[list[float], list[float]]]
    quantity: tuple[str, str, float]  # (y label, title, y scale): ACCURACY or LOSS
    by_epoch: bool = False  # x is the epoch (else training seconds)
    epochs_only: bool = True

    def __call__(self, ax: Any, groups: list[Group], ctx: Context) -> None:
        ylabel, what, scale = self.quantity
        for g in groups:
            _mean_band(ax, g, [self.points(r) for r in g.runs
                               if r.epochs or not self.epochs_only], scale, ctx)
        ax.set(xlabel="epoch" if self.by_epoch else ctx.seconds, ylabel=ylabel,
               title=f"{what} {'by epoch' if self.by_epoch else 'over time'}"
                     + _seeds_note(ctx))
        if self.by_epoch:
            _whole_epochs(ax)


ACCURACY = ("test accuracy (%)", "Test accuracy", 100)
LOSS = ("mean training loss", "Training loss", 1)


def _has_loss(groups: list[Group]) -> bool:
    return any(math.isfinite(v) for g in groups for r in g.runs for v in r.loss)


def _has_epochs(groups: list[Group]) -> bool:
    return any(r.epochs for g in groups for r in g.runs)


def _whole_epochs(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _time_to_target(ax: Any, groups: list[Group], ctx: Context) -> None:
    """Mean seconds to each target against the thread count, one line per
    variant (error bars: min-max over seeds); an open marker at the top for a
    group not every seed of which reached it, with the count that did."""
    variants = list(dict.fromkeys(g.variant for g in groups))
    counts = sorted({g.threads for g in groups})
    log2 = counts[-1] / counts[0] >= 4
    slots = len(variants) * len(ctx.targets)
    missed = False
    for ti, target in enumerate(ctx.targets):
        for vi, variant in enumerate(variants):
            mine = sorted((g for g in groups if g.variant == variant), key=lambda g: g.threads)
            # side by side at one thread count, so equal points and their bars stay apparent
            nudge = (vi * len(ctx.targets) + ti - (slots - 1) / 2) * NUDGE
            xs = [g.threads * 2 ** nudge if log2 else g.threads + nudge * _span(counts)
                  for g in mine]
            reach = [group_time_to_target(g, target / 100) for g in mine]
            tag = f"{_pct(target)}: " if len(ctx.targets) > 1 else ""
            missed |= _draw_reach(ax, xs, reach, mine[0].hue, ti, tag)
    _thread_axis(ax, counts, log2, slots)
    ax.set_ylim(bottom=0)
    if missed:  # room above the data for the open markers and their counts
        ax.set_ylim(top=ax.get_ylim()[1] / (0.86 - 0.1 * (len(ctx.targets) - 1)))
    ax.set(ylabel="training seconds to target", title=_ttt_title(ctx, missed))
    _ttt_legend(ax, groups, ctx)


def _ttt_legend(ax: Any, groups: list[Group], ctx: Context) -> None:
    """Name the variants here when the figure legend shows them as colour ramps
    (several thread counts), and the line style of each target when several."""
    from matplotlib.lines import Line2D

    handles = []
    if len(groups) > len({g.variant for g in groups}):
        handles += [Line2D([], [], color=g.hue, lw=2, label=g.variant)
                    for g in {g.variant: g for g in groups}.values()]
    if len(ctx.targets) > 1:
        handles += [Line2D([], [], color="grey", ls=TARGET_STYLES[i], lw=1.4,
                           label=f"target {_pct(t)}") for i, t in enumerate(ctx.targets)]
    if handles:
        ax.legend(handles=handles, fontsize=7.5, loc="best", framealpha=0.8, handlelength=3)


def _span(counts: list[int]) -> float:
    return float(counts[-1] - counts[0]) or 1.0


def _draw_reach(ax: Any, xs: list[float], reach: list[Reach], color: Any, ti: int,
                tag: str) -> bool:
    """The mean line with min-max error bars of one variant and the ti-th
    target (which picks its line style, and the height of its open markers at
    the top where not every seed reached it, counted as tag + "k/n"). True if
    any did not."""
    mean = [np.nan if r.mean is None else r.mean for r in reach]
    err = [[0 if r.mean is None else r.mean - r.lo for r in reach],
           [0 if r.mean is None else r.hi - r.mean for r in reach]]
    ax.errorbar(xs, mean, yerr=err, color=color, ls=TARGET_STYLES[ti], marker="o", ms=4,
                capsize=3, lw=1.4)
    top = ax.get_xaxis_transform()  # x in data, y in axes fractions: the panel's top edge
    height = 0.96 - 0.1 * ti  # one row of open markers per target
    for x, r in zip(xs, reach, strict=True):
        if r.mean is None:
            ax.plot([x], [height], transform=top, marker="o", ms=6, mfc="none", color=color,
                    ls="none")
            ax.text(x, height - 0.025, f"{tag}{r.reached}/{r.seeds}", transform=top,
                    ha="center", va="top", fontsize=7, color=color)
    return any(r.mean is None for r in reach)


def _thread_axis(ax: Any, counts: list[int], log2: bool, slots: int) -> None:
    """Ticks at the thread counts, and room beside them for `slots` nudged points."""
    from matplotlib.ticker import NullLocator

    if log2:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(counts, [str(n) for n in counts])
    low, high = counts[0], counts[-1]
    pad = max(0.4, slots * NUDGE / 2 + 0.15)  # octaves (log2), or shares of the span
    if log2:
        ax.set_xlim(low / 2 ** pad, high * 2 ** pad)
    else:
        ax.set_xlim(low - pad * _span(counts), high + pad * _span(counts))
    ax.set_xlabel("threads" + (" (log2 axis)" if log2 else ""))


def _ttt_title(ctx: Context, missed: bool) -> str:
    title = f"Time to {', '.join(map(_pct, ctx.targets))} test accuracy"
    notes = [n for n in (ctx.target_note, "bars: min-max over seeds" if ctx.seeds else "") if n]
    if notes:
        title += "\n" + "; ".join(notes)
    if missed:
        title += "\nopen at top: not reached by every seed (k/n did)"
    return title


def _staleness(ax: Any, groups: list[Group], ctx: Context) -> None:
    """Survival curves (pooled over seeds), a dot at each largest tau, and one
    dashed line per distinct bound and colour."""
    bounds = set()
    for g in groups:
        shares = survival(pooled_histogram(g.runs))
        if not shares:
            continue
        ax.plot(range(len(shares)), shares, drawstyle="steps-post", color=g.color, lw=1.3)
        ax.plot([len(shares) - 1], [shares[-1]], "o", ms=3.5, color=g.color)
        run = g.runs[0]
        if run.bound is not None and run.bound_known and (run.bound, g.variant) not in bounds:
            bounds.add((run.bound, g.variant))
            ax.axvline(run.bound, color=g.hue, ls="--", lw=1)
    from matplotlib.ticker import ScalarFormatter, SymmetricalLogLocator

    ax.set_xscale("symlog", linthresh=1, linscale=0.5)  # linear from 0 to 1: tau = 0 shows
    ax.xaxis.set_minor_locator(SymmetricalLogLocator(linthresh=1, base=10,
                                                     subs=np.arange(2, 10)))
    ax.xaxis.set_major_formatter(ScalarFormatter())  # 0, 1, 10, 100 rather than 10^k
    # axvline does not widen the view: make room for a bound beyond every curve's end
    ax.set_xlim(0, max([ax.get_xlim()[1], *(1.3 * b + 1 for b, _ in bounds)]))
    ax.set(yscale="log", xlabel="staleness tau (symlog axis: linear from 0 to 1)",
           ylabel="share of updates with staleness >= tau",
           title="Staleness: share of updates >= tau\n("
                 + ("pooled over seeds; " if ctx.seeds else "")
                 + "dot: largest tau; dashed: bound)")


def _has_schedule(groups: list[Group]) -> bool:
    return any(_changes(r.y_trace) or _changes(r.m_trace) for g in groups for r in g.runs)


def _changes(trace: list[tuple[float, float]]) -> bool:
    return len({v for _, v in trace}) > 1


def _schedules(ax: Any, groups: list[Group], ctx: Context) -> None:
    """y (solid) and m (dotted) of every run in which it changed, as steps held
    until the run's end."""
    has_y = has_m = False
    for g in groups:
        for run in g.runs:
            for trace, style in ((run.y_trace, "-"), (run.m_trace, ":")):
                if not _changes(trace):
                    continue
                has_y, has_m = has_y or style == "-", has_m or style == ":"
                t = [p[0] for p in trace] + [max(run.end_s, trace[-1][0])]
                v = [p[1] for p in trace] + [trace[-1][1]]
                ax.plot(t, v, drawstyle="steps-post", ls=style, color=g.color, lw=1.5,
                        alpha=1 if len(g.runs) == 1 else 0.6)
    what = {(True, True): "y (solid), active threads m (dotted)",
            (True, False): "interval size y", (False, True): "active threads m"}[has_y, has_m]
    ax.set(xlabel=ctx.seconds, ylabel=what, title="Schedules over time")
    ax.set_ylim(bottom=0)


def _has_accuracy(groups: list[Group]) -> bool:
    return any(math.isfinite(a) for g in groups for r in g.runs for a in r.accuracy)


PANELS = (
    Panel("accuracy-time", _has_accuracy,
          Curves(lambda r: (r.time_s, r.accuracy), ACCURACY, epochs_only=False)),
    Panel("loss-time", _has_loss, Curves(lambda r: (r.epoch_s, r.loss), LOSS)),
    Panel("accuracy-epoch", _has_epochs,
          Curves(lambda r: (r.epochs, r.epoch_accuracy), ACCURACY, by_epoch=True)),
    Panel("loss-epoch", lambda gs: _has_epochs(gs) and _has_loss(gs),
          Curves(lambda r: (r.epochs, r.loss), LOSS, by_epoch=True)),
    Panel("time-to-target", _has_accuracy, _time_to_target),
    Panel("staleness", lambda gs: any(sum(r.hist) for g in gs for r in g.runs), _staleness),
    Panel("schedules", _has_schedule, _schedules),
)

