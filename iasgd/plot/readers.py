"""Readers of `python -m iasgd.plot`: a results file of `python -m iasgd.run`
(real or simulated) or runs picked from a `bench/scaling.py` sweep, each made
a `Run`; anything else is a `PlotError` of one line."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py

from iasgd import sweeps
from iasgd.algorithms import ALGORITHMS, sweep_variant

# sweep options copied into each picked run's configuration (the rest come from its name)
SWEEP_OPTIONS = ("dataset", "model", "batch_size", "momentum", "interval", "gate", "y0",
                 "y_min", "decay_every", "probe_offset", "window", "time_budget")


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


def not_results(path: Path) -> str:
    """The error for an HDF5 file given as results: what it is and which file to pass
    (a run writes its results beside its checkpoint: r.ckpt.h5 and r.json)."""
    if path.name.endswith(".ckpt.h5"):
        results = path.with_name(path.name[:-len(".ckpt.h5")] + ".json")
        return (f"{path} is a checkpoint, not a results file: pass the run's results "
                f"file, {results}")
    return f"{path} is an HDF5 file, not a results file: pass a run's or a sweep's .json"


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
    saved = sweeps.tagged(runs[algo][threads], doc["options"].get("lr"))
    have = sorted({int(s["seed"]) for s in saved})
    for seed in seeds or []:
        if not seed.isdigit() or int(seed) not in have:
            raise PlotError(f"{source}:{algo}:{threads} has seeds {have[0]}-{have[-1]}, "
                            f"not {seed}")
    wanted = set(have) if seeds is None else {int(s) for s in seeds}
    return [_sweep_run(doc, source, algo, int(threads), s) for s in saved
            if int(s["seed"]) in wanted]


def _sweep_run(doc: dict[str, Any], source: str, algo: str, threads: int,
               saved: sweeps.Record) -> Run:
    """One record of a sweep (tagged with its lr and seed) as a Run."""
    options = doc["options"]
    config = {k: options.get(k) for k in SWEEP_OPTIONS}
    config.update(sweep_variant(algo) or {"algo": algo}, threads=threads,
                  seed=int(saved["seed"]), lr=saved["lr"],
                  model=options.get("model") or "lenet")
    bound, known = _sweep_bound(config)
    # every evaluation when the sweep had --eval-every, as its time to target used
    points = sweeps.accuracy_points(saved)
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
        if h5py.is_hdf5(path):  # a checkpoint (.ckpt.h5) or a dataset's cache
            raise PlotError(not_results(path))
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise PlotError(f"{path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise PlotError(f"{path} is not JSON ({e.msg} at line {e.lineno})") from None
    try:
        if sweeps.is_sweep(doc):
            return sweep_runs(sweeps.check(doc, str(path)), str(path), pick)
        if pick:
            raise PlotError(f"{path} is not a bench/scaling.py sweep: name the file alone")
        if isinstance(doc, dict) and "config" in doc and "epochs" in doc:
            return [results_run(doc, str(path))]
    except PlotError:
        raise
    except sweeps.SweepError as e:
        raise PlotError(str(e)) from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise PlotError(f"{path} looks like iasgd results but is damaged "
                        f"({type(e).__name__}: {e})") from None
    raise PlotError(f"{path} is not an iasgd results file (python -m iasgd.run) or a "
                    "bench/scaling.py sweep")
