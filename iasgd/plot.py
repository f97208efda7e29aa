"""Plots of finished runs: `python -m iasgd.plot RESULTS.json [MORE.json ...] [--out FIG.png]`.

One figure: test accuracy and training loss against training time and against
epochs, the staleness histogram (log scale; each bounded run's bound dashed), and the
interval size y and active thread count m over time where a run has them.
Several runs overlay; each is labelled from its configuration (algorithm,
threads, y, schedules), simulated runs as SIMULATED.

Inputs: results of `python -m iasgd.run` (real or `--simulate`), and single
runs of a `bench/scaling.py` sweep JSON, picked as `SWEEP.json:ALGO:THREADS`
(every seed) or `SWEEP.json:ALGO:THREADS:SEED` (sweeps record test accuracy
over time and the staleness histogram, not the loss or the traces).

Bad input is one line on stderr and exit code 2. Needs matplotlib
(`pip install 'iasgd[plot]'`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from iasgd import files
from iasgd.algorithms import ALGORITHMS, VARIANTS, sweep_variant

EXIT_USAGE = 2
INSTALL_HINT = "pip install 'iasgd[plot]'"
SWEEP_ALGOS = VARIANTS  # bench/scaling.py's algorithm names -> their run options
# configuration keys that may tell two same-labelled runs apart, in this order
DISTINCT_KEYS = ("seed", "lr", "batch_size", "momentum", "gate", "dataset", "model", "y_min",
                 "decay_every", "probe_offset", "window", "tail_amplitude", "time_budget")


class PlotError(ValueError):
    """Input that cannot be plotted; the message is one line."""


@dataclass
class Run:
    """One run as plotted. Per-epoch lists are aligned: epoch numbers, training
    seconds at each epoch end (evaluation excluded; simulated seconds for a
    simulated run), test accuracy in [0, 1] and mean training loss (NaN where
    not recorded)."""

    config: dict[str, Any]
    simulated: bool
    source: str
    epochs: list[int]
    time_s: list[float]
    accuracy: list[float]
    loss: list[float]
    hist: list[int]  # hist[k]: applied updates with staleness k (the last of 1,024 bins: >= k)
    bound: int | None  # the run's staleness bound; None: unbounded
    bound_known: bool = True  # False: a sweep run whose bound was not recorded
    y_trace: list[tuple[float, float]] = field(default_factory=list)  # (t_s, y) at each change
    m_trace: list[tuple[float, float]] = field(default_factory=list)  # (t_s, m) at each change
    label: str = ""

    @property
    def end_s(self) -> float:
        return max(self.time_s, default=0.0)


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
    return Run(
        config=config, simulated="simulated" in doc, source=source,
        epochs=[int(e["epoch"]) for e in epochs],
        time_s=[_number(e["wall_s"]) for e in epochs],
        accuracy=[_number(e["test_accuracy"]) for e in epochs],
        loss=[_number(e["train_loss"]) for e in epochs],
        hist=_histogram(doc["staleness"]["hist"]),
        bound=None if bound is None else int(bound),
        y_trace=_trace(doc.get("interval_trace")),
        m_trace=_trace(doc.get("threads_trace")),
    )


def sweep_runs(doc: dict[str, Any], source: str, pick: list[str]) -> list[Run]:
    """Single runs of a bench/scaling.py sweep: pick = [ALGO, THREADS] (every
    seed) or [ALGO, THREADS, SEED]."""
    runs, options = doc["runs"], doc["options"]
    threads_run = sorted({int(n) for by_n in runs.values() for n in by_n})
    listing = (f"ALGO one of {', '.join(runs)}; THREADS one of "
               f"{', '.join(map(str, threads_run))}")
    if len(pick) not in (2, 3):
        raise PlotError(f"{source} is a bench/scaling.py sweep: pick runs as "
                        f"{source}:ALGO:THREADS[:SEED] ({listing})")
    algo, threads = pick[0], pick[1]
    if algo not in runs or threads not in runs[algo]:
        raise PlotError(f"{source} has no runs {algo}:{threads} ({listing})")
    seeds = list(range(len(runs[algo][threads])))
    if len(pick) == 3:
        if not pick[2].isdigit() or int(pick[2]) not in seeds:
            raise PlotError(f"{source}:{algo}:{threads} has seeds {seeds[0]}-{seeds[-1]}, "
                            f"not {pick[2]}")
        seeds = [int(pick[2])]
    picked = []
    for seed in seeds:
        saved = runs[algo][threads][seed]
        config = {k: options.get(k) for k in ("dataset", "batch_size", "lr", "momentum",
                                              "interval", "gate", "y0", "time_budget")}
        config.update(sweep_variant(algo) or {"algo": algo}, threads=int(threads), seed=seed,
                      model="lenet")
        bound, known = _sweep_bound(config)
        curve = saved["curve"]
        picked.append(Run(
            config=config, simulated=bool(doc.get("simulated")), source=f"{source}:{algo}",
            epochs=list(range(1, len(curve) + 1)),
            time_s=[_number(t) for t, _ in curve], accuracy=[_number(a) for _, a in curve],
            loss=[math.nan] * len(curve), hist=_histogram(saved["staleness_hist"]),
            bound=bound, bound_known=known))
    return picked


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


def describe(config: dict[str, Any], simulated: bool) -> str:
    """A legend label from a run's configuration, e.g. "interval y=16, 8 threads"
    or "SIMULATED interval decay y0=64, 128 threads, lr tail"."""
    algo = config.get("algo", "?")
    text = str(algo)
    if algo == "interval":
        schedule = config.get("interval_schedule") or "fixed"
        y0 = config.get("y0") or config.get("interval")
        text = f"interval y={y0}" if schedule == "fixed" else f"interval {schedule} y0={y0}"
        if config.get("gate") == "drop":
            text += " drop"
    if (config.get("threads") or 1) > 1 or algo != "sequential":
        text += f", {config.get('threads')} threads"
    if config.get("threads_schedule") not in (None, "fixed"):
        text += f", m {config['threads_schedule']}"
    if config.get("lr_schedule") not in (None, "none"):
        text += f", lr {config['lr_schedule']}"
    return ("SIMULATED " if simulated else "") + text


def label_runs(runs: list[Run]) -> None:
    """Set each run's label; runs whose labels coincide get the configuration
    keys in which they differ (e.g. seed=1), else their file name."""
    for run in runs:
        run.label = describe(run.config, run.simulated)
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    for same in groups.values():
        if len(same) < 2:
            continue
        keys = [k for k in DISTINCT_KEYS if len({repr(r.config.get(k)) for r in same}) > 1]
        for run in same:
            extra = ", ".join(f"{k}={run.config.get(k)}" for k in keys[:2])
            run.label += f" ({extra or Path(run.source).name})"


def _series_ok(values: Sequence[float]) -> bool:
    return any(math.isfinite(v) for v in values)


def draw(runs: list[Run], out: Path) -> None:
    """Draw the figure of `runs` (labelled) into `out`, atomically; the format
    follows its suffix (png, pdf, svg, ...)."""
    import matplotlib.pyplot as plt

    fig = figure(runs)
    try:
        with files.replacing(out) as tmp:
            fig.savefig(tmp, format=out.suffix[1:].lower(), dpi=100)
    finally:
        plt.close(fig)


def figure(runs: list[Run]) -> Any:
    """The matplotlib Figure (Agg backend) of `runs`, 1,500 x 850 pixels at
    100 dpi: six panels in two rows, one legend entry per run below them."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), layout="constrained")
    (acc_t, loss_t, hist_ax), (acc_e, loss_e, trace_ax) = axes
    all_sim = all(r.simulated for r in runs)
    seconds = "training time (s, SIMULATED)" if all_sim else "training time (s)"
    handles = []
    for i, run in enumerate(runs):
        color = f"C{i % 10}"
        acc = [100 * a for a in run.accuracy]
        (line,) = acc_t.plot(run.time_s, acc, marker="o", ms=3, color=color, label=run.label)
        handles.append(line)
        acc_e.plot(run.epochs, acc, marker="o", ms=3, color=color)
        if _series_ok(run.loss):
            loss_t.plot(run.time_s, run.loss, marker="o", ms=3, color=color)
            loss_e.plot(run.epochs, run.loss, marker="o", ms=3, color=color)
        total = sum(run.hist)
        if total:
            share = [c / total if c else math.nan for c in run.hist]
            hist_ax.plot(range(len(share)), share, drawstyle="steps-mid", color=color, lw=1.2,
                         marker="o" if len(share) == 1 else None)  # one bin: no step to draw
        if run.bound is not None and run.bound_known:
            hist_ax.axvline(run.bound, color=color, ls="--", lw=1)
        for trace, style in ((run.y_trace, "-"), (run.m_trace, ":")):
            if trace:  # a step function held until the run's end
                t = [p[0] for p in trace] + [max(run.end_s, trace[-1][0])]
                v = [p[1] for p in trace] + [trace[-1][1]]
                trace_ax.plot(t, v, drawstyle="steps-post", ls=style, color=color, lw=1.5)
    acc_t.set(xlabel=seconds, ylabel="test accuracy (%)", title="Test accuracy over time")
    acc_e.set(xlabel="epoch", ylabel="test accuracy (%)", title="Test accuracy by epoch")
    loss_t.set(xlabel=seconds, ylabel="mean training loss", title="Training loss over time")
    loss_e.set(xlabel="epoch", ylabel="mean training loss", title="Training loss by epoch")
    for ax in (loss_t, loss_e):
        if not ax.lines:
            _empty(ax, "no training loss recorded\n(bench/scaling.py sweeps keep accuracy only)")
    hist_ax.set(xlabel="staleness tau (applied updates in between)",
                ylabel="share of applied updates", yscale="log",
                title="Staleness (dashed: each run's bound)")
    hist_ax.set_xlim(left=-0.5)
    has_y = any(r.y_trace for r in runs)
    has_m = any(r.m_trace for r in runs)
    what = {(True, True): "y (solid), active threads m (dotted)", (True, False): "interval size y",
            (False, True): "active threads m"}.get((has_y, has_m), "")
    trace_ax.set(xlabel=seconds, ylabel=what, title="Schedules over time")
    if not (has_y or has_m):
        _empty(trace_ax, "no interval size or thread count recorded\n"
                         "(interval runs and --threads-schedule window have them)")
    else:
        trace_ax.set_ylim(bottom=0)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    for ax in (acc_e, loss_e):
        if ax.lines:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs
    names = sorted({f"{r.config.get('model') or 'lenet'} on {r.config.get('dataset')}"
                    for r in runs})
    title = "iasgd: " + "; ".join(names)
    if any(r.simulated for r in runs):
        title += "  -  SIMULATED runs: times and throughput are simulated"
    fig.suptitle(title, fontsize=13)
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(runs), 3),
               fontsize=10, frameon=False)
    return fig


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise PlotError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m iasgd.plot",
                description="Plot one or more runs of iasgd: accuracy and loss over time and "
                            "epochs, staleness, and the schedules of y and m.")
    p.add_argument("results", nargs="+", metavar="RESULTS.json",
                   help="results of python -m iasgd.run, or SWEEP.json:ALGO:THREADS[:SEED] "
                        "for runs of a bench/scaling.py sweep")
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
    try:
        args = build_parser().parse_args(argv)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise PlotError(f"plotting needs matplotlib: {INSTALL_HINT}") from None
        runs = [run for spec in args.results for run in load(spec)]
        first = args.results[0]
        out = output_path(args.out, first if Path(first).is_file() else first.split(":")[0])
        label_runs(runs)
        draw(runs, out)
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
