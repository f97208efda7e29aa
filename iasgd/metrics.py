"""What a run reports, and writing it to disk without ever leaving half a file."""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np


def mean_step_loss(step_losses: np.ndarray, batch_size: int, samples: int) -> float:
    """Sample-weighted mean of batch-mean losses (the last batch may be short).

    step_losses: (S,) batch means of S consecutive steps covering `samples`
    samples, all batches of `batch_size` but possibly the last.
    """
    steps = step_losses.size
    if steps == 0:
        return float("nan")
    weights = np.full(steps, float(batch_size))
    weights[-1] = samples - batch_size * (steps - 1)
    return float(np.dot(step_losses, weights) / samples)


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of predictions equal to labels, in [0, 1]."""
    return float(np.mean(predictions == labels)) if labels.size else float("nan")


def machine_info() -> dict[str, Any]:
    """Where a result was measured."""
    import numba

    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
    }


def results_document(config: dict[str, Any], result: Any, num_params: int) -> dict[str, Any]:
    """The results JSON of a run: configuration, status, per-epoch records and
    run-wide throughput."""
    epochs = [asdict(e) for e in result.epochs]
    accuracies = [e["test_accuracy"] for e in epochs]
    hist = result.staleness_hist
    applied = int(hist.sum())
    seconds = result.train_time_s
    return {
        "config": config,
        "status": result.status,
        "diverged_at": result.diverged_at,
        "num_params": num_params,
        "epochs": epochs,
        "train_time_s": result.train_time_s,
        "eval_time_s": result.eval_time_s,
        "samples": result.samples,
        "samples_per_s": result.samples / seconds if seconds > 0 else 0.0,
        "updates_per_s": result.applied / seconds if seconds > 0 else 0.0,
        "computed": result.computed,
        "applied": result.applied,
        "dropped": result.dropped,
        "intervals": result.intervals,
        "acceptance_rate": result.applied / result.computed if result.computed else 1.0,
        "staleness": {
            "hist": trimmed(hist),
            "mean": float(np.dot(np.arange(hist.size), hist) / applied) if applied else 0.0,
            "max": result.staleness_max,
            "bound": result.staleness_bound,
        },
        "gate_wait_s": result.gate_wait_s,
        "gil_fraction": result.gil_fraction,
        "max_concurrent_steps": result.max_concurrent_steps,
        "bound_violations": result.bound_violations,
        "loss_first": result.loss_first,
        "interval_trace": result.interval_trace,
        "threads_trace": result.threads_trace,
        "probe_log": result.probe_log,
        "evals": result.evals,
        "backend": (result.cluster or {}).get("backend", "threads"),
        "cluster": result.cluster,
        "final_test_accuracy": accuracies[-1] if accuracies else None,
        "best_test_accuracy": max(accuracies) if accuracies else None,
        "machine": machine_info(),
    }


def trimmed(hist: np.ndarray) -> list[int]:
    """A histogram as a list without its trailing zero bins."""
    nonzero = np.flatnonzero(hist)
    return hist[: nonzero[-1] + 1].tolist() if nonzero.size else []


def _json_safe(value: Any) -> Any:
    """NaN and infinities become null: strict JSON that every tool reads."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block succeeds, move it
    onto `path` in one rename (with the permissions a new file would get), so
    a reader never sees half a file and the old one survives any failure."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_json_atomic(path: str | Path, document: dict[str, Any]) -> None:
    """Write JSON atomically (see `replacing`); non-finite numbers as null."""
    with replacing(path) as tmp, open(tmp, "w") as f:
        json.dump(_json_safe(document), f, indent=2, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
