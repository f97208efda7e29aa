"""Documents the plot tests read: results files of python -m iasgd.run and
bench/scaling.py sweeps, made small by hand; and the figure's Axes by panel."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def results(algo: str = "interval", threads: int = 4, **config) -> dict:
    """A small results document as python -m iasgd.run writes it."""
    y = config.get("interval", 8)
    bounded = {"interval": y - 1, "sequential": 0, "sync": 0}
    return {
        "config": {"algo": algo, "threads": threads, "interval": y, "gate": "wait",
                   "interval_schedule": "fixed", "y0": None, "threads_schedule": "fixed",
                   "lr_schedule": "none", "dataset": "synthetic", "model": "lenet", "seed": 0,
                   "lr": 0.02, **config},
        "status": "completed",
        "epochs": [{"epoch": e, "train_loss": 1.0 / e, "test_accuracy": 0.5 + 0.1 * e,
                    "wall_s": 1.5 * e, "samples_per_s": 1000.0, "complete": True,
                    "staleness_hist": [5, 3]} for e in (1, 2, 3)],
        "staleness": {"hist": [10, 5, 2, 1] if algo != "sequential" else [30],
                      "mean": 0.6, "max": 3, "bound": bounded.get(algo)},
        "interval_trace": [[0.0, 0, y], [2.0, 100, y - 4]] if algo == "interval" else [],
        "threads_trace": [[0.0, 0, threads], [3.0, 200, 2]]
        if config.get("threads_schedule") == "window" else [],
    }


def sweep() -> dict:
    """A small bench/scaling.py sweep: two algorithms, two thread counts, two seeds."""
    one = {"samples_per_s": 1e4, "staleness_mean": 1.0, "staleness_max": 3,
           "staleness_hist": [4, 3, 2, 1], "acceptance_rate": 1.0, "time_to_target_s": 2.0,
           "final_accuracy": 0.6, "curve": [[1.0, 0.4], [2.0, 0.5], [3.0, 0.6]]}
    return {"options": {"dataset": "cifar10", "interval": 16, "y0": None, "gate": "wait",
                        "batch_size": 16, "lr": 0.005, "momentum": 0.5, "time_budget": 3.0},
            "simulated": False, "summary": {},
            "runs": {algo: {n: [one, one] for n in ("2", "8")}
                     for algo in ("interval-decay", "hogwild")}}


def sweep_of(curves: dict[tuple[str, str], list[list[list[float]]]],
             hists: dict[tuple[str, str], list[list[int]]] | None = None,
             **options) -> dict:
    """A hand-made sweep: curves[(ALGO, THREADS)] = one [[t_s, acc], ...] per seed."""
    runs: dict = {}
    for (algo, n), per_seed in curves.items():
        hist = (hists or {}).get((algo, n)) or [[1, 1]] * len(per_seed)
        runs.setdefault(algo, {})[n] = [
            {"staleness_hist": hist[seed], "curve": curve} for seed, curve in enumerate(per_seed)]
    return {"options": {"dataset": "cifar10", "interval": 16, "y0": None, "gate": "wait",
                        "batch_size": 16, "lr": 0.005, "momentum": 0.5, "time_budget": 4.0,
                        **options},
            "simulated": False, "summary": {}, "runs": runs}


def write(path: Path, doc: object) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def panels(fig) -> dict:
    """The Axes of a figure by panel name (panels.PANELS)."""
    return {ax.get_label(): ax for ax in fig.axes}
