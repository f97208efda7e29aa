"""Plots of finished runs: `python -m iasgd.plot RUNS [RUNS ...] [--target PCT] [--out FIG.png]`.

One figure, with only the panels that have data (docs/plots.md):

- test accuracy against training time (and by epoch, for runs that have epochs);
- training loss against training time and by epoch, where a run recorded it;
- time to a target test accuracy against the thread count, one line per
  algorithm variant (`--target PCT`; default: the highest whole percent every
  plotted run reaches);
- staleness as a survival curve: the share of applied updates with staleness
  >= tau against tau, both axes logarithmic (x symlog, so tau = 0 shows), each
  bounded run's bound dashed;
- the interval size y and the active thread count m over time, for runs in
  which one of them changed (a fixed y is not a schedule).

Runs that differ only by their seed are one group: a mean line and a shaded
min-max band over the seeds (on the union of their evaluation times, where
every seed has data), their staleness histograms pooled, labelled "(3 seeds)".
Each group is labelled from its configuration (algorithm, threads, y,
schedules), simulated runs as SIMULATED.

Inputs: results of `python -m iasgd.run` (real or `--simulate`), and runs of
a `bench/scaling.py` sweep JSON, picked as `SWEEP.json:ALGO:THREADS[:SEED]`;
each of ALGO, THREADS and SEED may be a comma-separated list, and without
SEED every seed is taken (e.g. `sweep.json:hogwild,interval:16,128`). Sweeps
record test accuracy over time and the staleness histogram, not the loss,
the epochs or the schedules.

Bad input is one line on stderr and exit code 2. Needs matplotlib
(`pip install 'iasgd[plot]'`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from iasgd import files
from iasgd.algorithms import ALGORITHMS, VARIANTS, sweep_variant
from iasgd.results import time_to_target

EXIT_USAGE = 2
INSTALL_HINT = "pip install 'iasgd[plot]'"
SWEEP_ALGOS = VARIANTS  # bench/scaling.py's algorithm names -> their run options
# configuration keys that may tell two same-labelled runs apart, in this order
DISTINCT_KEYS = ("seed", "lr", "batch_size", "momentum", "gate", "dataset", "model", "y_min",
                 "decay_every", "probe_offset", "window", "tail_amplitude", "time_budget")
# sweep options copied into each picked run's configuration (the rest come from its name)
SWEEP_OPTIONS = ("dataset", "model", "batch_size", "momentum", "interval", "gate", "y0",
                 "y_min", "decay_every", "probe_offset", "window", "time_budget")
TARGET_STYLES = ("-", "--", ":", "-.")  # one line style per --target value
NUDGE = 0.06  # time to target: points side by side, in octaves (or shares of a linear axis)
PANEL_W, PANEL_H = 5.2, 4.2  # inches per panel (100 dpi: 520 x 420 pixels)


class PlotError(ValueError):
    """Input that cannot be plotted; the message is one line."""


@dataclass
class Run:
    """One run as plotted.

    time_s/accuracy: every test evaluation, aligned (training seconds,
    evaluation excluded, simulated seconds for a simulated run; accuracy in
    [0, 1], NaN where not finite): the `evals` when recorded, else the epoch
    ends. epochs/epoch_s/epoch_accuracy/loss: per epoch, aligned (mean
    training loss NaN where not recorded); empty for a sweep run, which
    records no epochs."""

    config: dict[str, Any]
    simulated: bool
    source: str
    time_s: list[float]
    accuracy: list[float]
    hist: list[int]  # hist[k]: applied updates with staleness k (the last of 1,024 bins: >= k)
    bound: int | None  # the run's staleness bound; None: unbounded
    bound_known: bool = True  # False: a sweep run whose bound was not recorded
    epochs: list[int] = field(default_factory=list)
    epoch_s: list[float] = field(default_factory=list)
    epoch_accuracy: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    y_trace: list[tuple[float, float]] = field(default_factory=list)  # (t_s, y) at each change
    m_trace: list[tuple[float, float]] = field(default_factory=list)  # (t_s, m) at each change
    label: str = ""

    @property
    def end_s(self) -> float:
        """The last training second recorded (0.0 for none)."""
        return max([*self.time_s, *self.epoch_s], default=0.0)


def _number(value: Any) -> float:
    """A JSON number, or NaN for null (a non-finite value in the results)."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _trace(rows: Any) -> list[tuple[float, float]]:
    """[[t_s, applied, value], ...] -> [(t_s, value), ...]."""
    return [(_number(t), _number(v)) for t, _, v in rows or []]


def _histogram(values: Any) -> list[int]:
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise TypeError("staleness histogram is not a list of counts")
    return values


def results_run(doc: dict[str, Any], source: str) -> Run:
    """A run from a results document of `python -m iasgd.run`."""
    config, epochs = doc["config"], doc["epochs"]
    if not isinstance(config, dict) or not isinstance(epochs, list):
        raise TypeError("config or epochs has the wrong type")
    bound = doc["staleness"]["bound"]
    epoch_s = [_number(e["wall_s"]) for e in epochs]
    epoch_accuracy = [_number(e["test_accuracy"]) for e in epochs]
    evals = doc.get("evals") or []  # they include the epoch ends
    return Run(
        config=config, simulated="simulated" in doc, source=source,
        time_s=[_number(t) for t, _, _ in evals] if evals else epoch_s,
        accuracy=[_number(a) for _, _, a in evals] if evals else epoch_accuracy,
        hist=_histogram(doc["staleness"]["hist"]),
        bound=None if bound is None else int(bound),
        epochs=[int(e["epoch"]) for e in epochs], epoch_s=epoch_s,
        epoch_accuracy=epoch_accuracy, loss=[_number(e["train_loss"]) for e in epochs],
        y_trace=_trace(doc.get("interval_trace")),
        m_trace=_trace(doc.get("threads_trace")),
    )


def _sweep_listing(runs: dict[str, Any]) -> str:
    threads = sorted({int(n) for by_n in runs.values() for n in by_n})
    return f"ALGO one of {', '.join(runs)}; THREADS one of {', '.join(map(str, threads))}"


def _sweep_seed(saved: dict[str, Any], place: int) -> int:
    """A sweep run's seed: recorded since --lrs; before, its place in the list."""
    return int(saved.get("seed", place))


def sweep_runs(doc: dict[str, Any], source: str, pick: list[str]) -> list[Run]:
    """Runs of a bench/scaling.py sweep: pick = [ALGOS, THREADS] (every seed) or
    [ALGOS, THREADS, SEEDS], each a comma-separated list; runs in that order."""
    runs = doc["runs"]
    if len(pick) not in (2, 3):
        raise PlotError(f"{source} is a bench/scaling.py sweep: pick runs as "
                        f"{source}:ALGO:THREADS[:SEED] ({_sweep_listing(runs)})")
    seeds = None if len(pick) == 2 else pick[2].split(",")
    return [run for algo in pick[0].split(",") for threads in pick[1].split(",")
            for run in _sweep_pick(doc, source, algo, threads, seeds)]


def _sweep_pick(doc: dict[str, Any], source: str, algo: str, threads: str,
                seeds: list[str] | None) -> list[Run]:
    """The runs of one ALGO:THREADS of a sweep, of the given seeds (None: all)."""
    runs = doc["runs"]
    if algo not in runs or threads not in runs[algo]:
        raise PlotError(f"{source} has no runs {algo}:{threads} ({_sweep_listing(runs)})")
    saved = runs[algo][threads]
    have = sorted({_sweep_seed(s, i) for i, s in enumerate(saved)})
    for seed in seeds or []:
        if not seed.isdigit() or int(seed) not in have:
            raise PlotError(f"{source}:{algo}:{threads} has seeds {have[0]}-{have[-1]}, "
                            f"not {seed}")
    wanted = set(have) if seeds is None else {int(s) for s in seeds}
    return [_sweep_run(doc, source, algo, int(threads), s, _sweep_seed(s, i))
            for i, s in enumerate(saved) if _sweep_seed(s, i) in wanted]


def _sweep_run(doc: dict[str, Any], source: str, algo: str, threads: int,
               saved: dict[str, Any], seed: int) -> Run:
    options = doc["options"]
    config = {k: options.get(k) for k in SWEEP_OPTIONS}
    config.update(sweep_variant(algo) or {"algo": algo}, threads=threads, seed=seed,
                  lr=saved.get("lr", options.get("lr")), model=options.get("model") or "lenet")
    bound, known = _sweep_bound(config)
    # every evaluation when the sweep had --eval-every, as its time to target used
    points = [(t, a) for t, _, a in saved["evals"]] if saved.get("evals") else saved["curve"]
    return Run(config=config, simulated=bool(doc.get("simulated")), source=f"{source}:{algo}",
               time_s=[_number(t) for t, _ in points], accuracy=[_number(a) for _, a in points],
               hist=_histogram(saved["staleness_hist"]), bound=bound, bound_known=known)


def _sweep_bound(config: dict[str, Any]) -> tuple[int | None, bool]:
    """(bound, known) of a sweep run, which does not record its bound: y - 1 for
    a fixed y, y0 - 1 for decay (y only shrinks); unknown for probe."""
    bound = ALGORITHMS[config["algo"]].bound
    if bound != "interval":
        return (0 if bound == "zero" else None), True
    schedule = config.get("interval_schedule", "fixed")
    if schedule == "fixed":
        return config["interval"] - 1, True
    if schedule == "decay":
        return (config.get("y0") or config["interval"]) - 1, True
    return None, False


def load(spec: str) -> list[Run]:
    """The runs that one command-line argument names: a results file, or
    SWEEP.json:ALGO:THREADS[:SEED]. PlotError on anything else."""
    path, pick = Path(spec), []
    if not path.is_file():  # a sweep pick: the longest prefix that is a file
        parts = spec.split(":")
        for cut in range(len(parts) - 1, 0, -1):
            if Path(":".join(parts[:cut])).is_file():
                path, pick = Path(":".join(parts[:cut])), parts[cut:]
                break
        else:
            raise PlotError(f"{spec}: no such file")
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise PlotError(f"{path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise PlotError(f"{path} is not JSON ({e.msg} at line {e.lineno})") from None
    try:
        if isinstance(doc, dict) and "runs" in doc and "options" in doc:
            return sweep_runs(doc, str(path), pick)
        if pick:
            raise PlotError(f"{path} is not a bench/scaling.py sweep: name the file alone")
        if isinstance(doc, dict) and "config" in doc and "epochs" in doc:
            return [results_run(doc, str(path))]
    except PlotError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise PlotError(f"{path} looks like iasgd results but is damaged "
                        f"({type(e).__name__}: {e})") from None
    raise PlotError(f"{path} is not an iasgd results file (python -m iasgd.run) or a "
                    "bench/scaling.py sweep")


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


def parse_targets(values: Sequence[str] | None) -> list[float]:
    """--target values (each "55", "57.5" or "50,55"; "%" allowed) -> percents,
    in order, without repeats. PlotError (one line) for anything else."""
    targets: list[float] = []
    for value in values or []:
        for part in value.split(","):
            text = part.strip().removesuffix("%").strip()
            try:
                pct = float(text)
            except ValueError:
                raise PlotError(f"--target {value}: {part.strip() or 'nothing'} is not a "
                                "number; give test accuracy in percent, e.g. --target 55"
                                ) from None
            if not 1 <= pct <= 100:  # also refuses NaN
                raise PlotError(f"--target {value}: {text} is not a test accuracy in percent "
                                "from 1 to 100 (55 means 55 %)")
            if pct not in targets:
                targets.append(pct)
    if len(targets) > len(TARGET_STYLES):
        raise PlotError(f"--target: at most {len(TARGET_STYLES)} targets, got {len(targets)}")
    return targets


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


def _accuracy_time(ax: Any, groups: list[Group], ctx: Context) -> None:
    for g in groups:
        _mean_band(ax, g, [(r.time_s, r.accuracy) for r in g.runs], 100, ctx)
    ax.set(xlabel=ctx.seconds, ylabel="test accuracy (%)",
           title="Test accuracy over time" + _seeds_note(ctx))


def _has_loss(groups: list[Group]) -> bool:
    return any(math.isfinite(v) for g in groups for r in g.runs for v in r.loss)


def _loss_time(ax: Any, groups: list[Group], ctx: Context) -> None:
    for g in groups:
        _mean_band(ax, g, [(r.epoch_s, r.loss) for r in g.runs if r.epochs], 1, ctx)
    ax.set(xlabel=ctx.seconds, ylabel="mean training loss",
           title="Training loss over time" + _seeds_note(ctx))


def _has_epochs(groups: list[Group]) -> bool:
    return any(r.epochs for g in groups for r in g.runs)


def _accuracy_epoch(ax: Any, groups: list[Group], ctx: Context) -> None:
    for g in groups:
        _mean_band(ax, g, [(r.epochs, r.epoch_accuracy) for r in g.runs if r.epochs], 100, ctx)
    ax.set(xlabel="epoch", ylabel="test accuracy (%)",
           title="Test accuracy by epoch" + _seeds_note(ctx))
    _whole_epochs(ax)


def _loss_epoch(ax: Any, groups: list[Group], ctx: Context) -> None:
    for g in groups:
        _mean_band(ax, g, [(r.epochs, r.loss) for r in g.runs if r.epochs], 1, ctx)
    ax.set(xlabel="epoch", ylabel="mean training loss",
           title="Training loss by epoch" + _seeds_note(ctx))
    _whole_epochs(ax)


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
    Panel("accuracy-time", _has_accuracy, _accuracy_time),
    Panel("loss-time", _has_loss, _loss_time),
    Panel("accuracy-epoch", _has_epochs, _accuracy_epoch),
    Panel("loss-epoch", lambda gs: _has_epochs(gs) and _has_loss(gs), _loss_epoch),
    Panel("time-to-target", _has_accuracy, _time_to_target),
    Panel("staleness", lambda gs: any(sum(r.hist) for g in gs for r in g.runs), _staleness),
    Panel("schedules", _has_schedule, _schedules),
)


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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise PlotError(message)


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m iasgd.plot` (errors raise PlotError)."""
    p = _Parser(prog="python -m iasgd.plot",
                description="Plot runs of iasgd in one figure: accuracy (and loss) over time "
                            "and epochs, time to a target accuracy against threads, staleness "
                            "as a survival curve, and the schedules of y and m; only panels "
                            "with data. Runs that differ only by seed are one mean line with "
                            "a min-max band. See docs/plots.md.")
    p.add_argument("results", nargs="+", metavar="RUNS",
                   help="a results file of python -m iasgd.run, or runs of a bench/scaling.py "
                        "sweep as SWEEP.json:ALGO:THREADS[:SEED] (each part may be a "
                        "comma-separated list; no SEED: every seed), e.g. "
                        "sweep.json:hogwild,interval:16,128")
    p.add_argument("--target", action="append", metavar="PCT",
                   help="test accuracy in percent for the time-to-target panel (1-100; "
                        "repeatable or comma-separated, at most 4; default: the highest whole "
                        "percent every plotted run reaches)")
    p.add_argument("--out", default=None, metavar="FIG.png",
                   help="figure file; its suffix picks the format (default: the first "
                        "file's name with .png)")
    return p


def output_path(out: str | None, first: str) -> Path:
    """Where the figure goes: `out`, or beside the first input as NAME.png."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(out) if out else Path(first).with_suffix(".png")
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise PlotError(f"--out {path}: unknown figure format {path.suffix or '(none)'}; "
                        f"use one of {', '.join('.' + f for f in sorted(formats))}")
    if path.is_dir():
        raise PlotError(f"--out {path} is a directory; give a file name")
    if not path.resolve().parent.is_dir():
        raise PlotError(f"--out {path}: directory {path.resolve().parent} does not exist")
    return path


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code (0, or 2 after one line on stderr)."""
    try:
        args = build_parser().parse_args(argv)
        targets = parse_targets(args.target)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise PlotError(f"plotting needs matplotlib: {INSTALL_HINT}") from None
        runs = [run for spec in args.results for run in load(spec)]
        first = args.results[0]
        out = output_path(args.out, first if Path(first).is_file() else first.split(":")[0])
        label_runs(runs)
        draw(runs, out, targets)
    except PlotError as e:
        print(f"iasgd: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # e.g. no permission to write beside the results
        print(f"iasgd: error: cannot write the figure ({e.strerror}: {e.filename})",
              file=sys.stderr)
        return EXIT_USAGE
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
