"""Runs made lines: each run's label from its configuration, groups of runs
that differ only by their seed (their colours, mean and min-max band, pooled
staleness, time to a target), and the default target."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iasgd.plot.readers import Run
from iasgd.results import time_to_target

# configuration keys that may tell two same-labelled runs apart, in this order
DISTINCT_KEYS = ("seed", "lr", "batch_size", "momentum", "gate", "dataset", "model", "y_min",
                 "decay_every", "probe_offset", "window", "tail_amplitude", "time_budget")


def describe(config: dict[str, Any], simulated: bool, threads: bool = True) -> str:
    """A legend label from a run's configuration, e.g. "interval y=16, 8 threads"
    or "SIMULATED interval decay y0=64, 128 threads, lr tail"; threads=False
    leaves the thread count out (the variant, as the time-to-target panel names it)."""
    algo = config.get("algo", "?")
    text = str(algo)
    if algo == "interval":
        schedule = config.get("interval_schedule") or "fixed"
        y0 = config.get("y0") or config.get("interval")
        text = f"interval y={y0}" if schedule == "fixed" else f"interval {schedule} y0={y0}"
        if config.get("gate") == "drop":
            text += " drop"
    if threads and ((config.get("threads") or 1) > 1 or algo != "sequential"):
        text += f", {config.get('threads')} threads"
    if config.get("threads_schedule") not in (None, "fixed"):
        text += f", m {config['threads_schedule']}"
    if config.get("lr_schedule") not in (None, "none"):
        text += f", lr {config['lr_schedule']}"
    return ("SIMULATED " if simulated else "") + text


def _differing(configs: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[str]:
    """The keys among `keys` whose values are not all the same in `configs`."""
    return [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]


def label_runs(runs: list[Run]) -> None:
    """Set each run's own label; runs whose labels coincide get the configuration
    keys in which they differ (e.g. seed=1), else their file name."""
    for run in runs:
        run.label = describe(run.config, run.simulated)
    same_label: dict[str, list[Run]] = {}
    for run in runs:
        same_label.setdefault(run.label, []).append(run)
    for same in same_label.values():
        if len(same) < 2:
            continue
        keys = _differing([r.config for r in same], DISTINCT_KEYS)
        for run in same:
            extra = ", ".join(f"{k}={run.config.get(k)}" for k in keys[:2])
            run.label += f" ({extra or Path(run.source).name})"


@dataclass
class Group:
    """Runs that differ only by their seed (or one run), drawn as one line.

    variant: the label without the thread count (one line of the
    time-to-target panel); label: the legend entry, "(N seeds)" for N > 1."""

    runs: list[Run]
    variant: str = ""
    label: str = ""
    color: Any = "C0"  # its line's colour: the variant's hue, lighter for fewer threads
    hue: Any = "C0"  # the variant's full colour (bounds, time-to-target lines)

    @property
    def config(self) -> dict[str, Any]:
        return self.runs[0].config

    @property
    def threads(self) -> int:
        return int(self.config.get("threads") or 1)


def _group_key(run: Run) -> tuple[Any, ...]:
    """What runs of one group share: everything the label shows but the seed."""
    variant = describe(run.config, run.simulated, threads=False)
    rest = tuple(repr(run.config.get(k)) for k in DISTINCT_KEYS if k != "seed")
    return variant, run.config.get("threads"), rest


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs grouped by everything but the seed, in the order of first
    appearance. A group never holds one seed twice: runs of a repeated seed
    (the same configuration in two files) are grouped per file instead."""
    buckets: dict[tuple[Any, ...], list[Run]] = {}
    for run in runs:
        buckets.setdefault(_group_key(run), []).append(run)
    groups = []
    for same in buckets.values():
        seeds = [r.config.get("seed") for r in same]
        if len(set(seeds)) == len(seeds):
            groups.append(Group(same))
            continue
        by_file: dict[str, list[Run]] = {}
        for run in same:
            by_file.setdefault(run.source, []).append(run)
        groups += [Group(rs) for rs in by_file.values()]
    _label_groups(groups)
    _color_groups(groups)
    return groups


def _label_groups(groups: list[Group]) -> None:
    """Set variant and label. Groups of one variant (the label without the
    thread count) that differ in a configuration key get it (e.g. lr=0.01);
    two that would still be one line at one thread count get their file name."""
    by_base: dict[str, list[Group]] = {}
    for g in groups:
        by_base.setdefault(_base(g), []).append(g)
    for base, same in by_base.items():
        keys = _differing([g.config for g in same], [k for k in DISTINCT_KEYS if k != "seed"])
        for g in same:
            extra = ", ".join(f"{k}={g.config.get(k)}" for k in keys[:2])
            g.variant = f"{base} ({extra})" if extra else base
    twins = [g for g in groups
             if sum(x.variant == g.variant and x.threads == g.threads for x in groups) > 1]
    for g in twins:
        g.variant += f" ({Path(g.runs[0].source).name})"
    for g in groups:
        g.label = describe(g.config, g.runs[0].simulated) + g.variant[len(_base(g)):]
        if len(g.runs) > 1:
            g.label += f" ({len(g.runs)} seeds)"


def _base(group: Group) -> str:
    return describe(group.config, group.runs[0].simulated, threads=False)


def _color_groups(groups: list[Group]) -> None:
    """One hue per variant; a variant at several thread counts goes from light
    (fewest threads) to full colour (most), so the legend reads as a ramp."""
    from matplotlib.colors import to_rgb

    variants = list(dict.fromkeys(g.variant for g in groups))
    for g in groups:
        g.hue = f"C{variants.index(g.variant) % 10}"
        base = np.array(to_rgb(g.hue))
        counts = sorted({x.threads for x in groups if x.variant == g.variant})
        light = 0.0 if len(counts) < 2 else 0.6 * (1 - counts.index(g.threads) / (len(counts) - 1))
        g.color = tuple(base + (1 - base) * light)


def ordered(groups: list[Group]) -> list[Group]:
    """Groups by variant (in order of first appearance), then by thread count."""
    variants = list(dict.fromkeys(g.variant for g in groups))
    return sorted(groups, key=lambda g: (variants.index(g.variant), g.threads))


def aggregate(curves: Sequence[tuple[Sequence[float], Sequence[float]]]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max of several curves (x increasing, e.g. seconds or
    epochs; y any unit) on a common grid: the union of their x values from the
    latest first x to the earliest last x, where every curve has data; each
    curve linearly interpolated onto it. Returns (grid, mean, lo, hi), arrays
    of one length (empty when the curves do not overlap); NaN in a curve
    spreads to the grid points next to it (a diverged seed leaves a gap)."""
    usable = [(np.asarray(x, float), np.asarray(y, float)) for x, y in curves if len(x)]
    if not usable:
        return (np.empty(0),) * 4
    start, stop = max(x[0] for x, _ in usable), min(x[-1] for x, _ in usable)
    grid = np.unique(np.concatenate([x for x, _ in usable]))
    grid = grid[(grid >= start) & (grid <= stop)]
    ys = np.array([np.interp(grid, x, y) for x, y in usable]).reshape(len(usable), len(grid))
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def pooled_histogram(runs: Sequence[Run]) -> list[int]:
    """The staleness histograms of `runs` added bin by bin (counts)."""
    pooled = [0] * max((len(r.hist) for r in runs), default=0)
    for run in runs:
        for k, count in enumerate(run.hist):
            pooled[k] += count
    return pooled


def survival(hist: Sequence[int]) -> list[float]:
    """share[tau] = fraction of applied updates with staleness >= tau, for tau
    from 0 to the largest staleness seen (share[0] = 1); [] without updates."""
    total = sum(hist)
    last = max((k for k, c in enumerate(hist) if c), default=-1)
    if not total:
        return []
    tail, shares = 0, []
    for count in reversed(hist[:last + 1]):
        tail += count
        shares.append(tail / total)
    return shares[::-1]


@dataclass
class Reach:
    """Time to a target of one group: mean, min and max seconds over its seeds
    when every seed reached it (else None), and how many did of how many."""

    mean: float | None
    lo: float | None
    hi: float | None
    reached: int
    seeds: int


def group_time_to_target(group: Group, target: float) -> Reach:
    """Time to `target` (fraction) of every seed of `group`, summarised."""
    times = [time_to_target(r.time_s, r.accuracy, target) for r in group.runs]
    hit = [t for t in times if t is not None]
    if len(hit) < len(times):
        return Reach(None, None, None, len(hit), len(times))
    return Reach(float(np.mean(hit)), min(hit), max(hit), len(hit), len(times))


def default_target(runs: Sequence[Run]) -> float | None:
    """The highest whole percent (1-100) that every run reaches, in percent, so
    that every point of the time-to-target panel is a measurement of all its
    seeds; None when some run never reaches 1 %."""
    peaks = [max((a for a in r.accuracy if math.isfinite(a)), default=0.0) for r in runs]
    pct = math.floor(100 * min(peaks, default=0.0) + 1e-9)  # 0.58 is 57.99999... in binary
    return float(pct) if pct >= 1 else None

