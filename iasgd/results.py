"""What a run produces: the epoch records and the run's result, the callbacks
a run makes, its snapshots, the evaluation, and the run summary of the
parallel executors (threads, simulator). The epoch recorder every executor
uses is iasgd.executors.base.ExecutorBase.record_epoch."""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from iasgd.algorithms import staleness_bound
from iasgd.executors import precompile
from iasgd.protocol import gate as G
from iasgd.protocol import workers as W

HIST_BINS = 1024  # staleness histogram bins; the last one counts every larger tau


class Status(str, Enum):
    """How a run ended (a str: it compares equal to, and is written as, its value)."""

    COMPLETED = "completed"
    TIME_BUDGET = "time_budget"
    DIVERGED = "diverged"
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__

    @property
    def words(self) -> str:
        """How a run's summary line says it: "stopped at its time budget"."""
        return {"time_budget": "stopped at its time budget"}.get(self.value, self.value)


@dataclass
class EpochRecord:
    epoch: int
    train_loss: float
    test_accuracy: float
    wall_s: float  # training time since the start, evaluation excluded
    samples_per_s: float  # applied samples per second of this epoch
    complete: bool = True  # False for an epoch cut short by the time budget
    staleness_hist: list[int] = field(default_factory=list)  # [k]: updates with tau = k
    # the step size the schedule gave the epoch's last update, before any
    # staleness-scaled factor (None in results written before it was recorded)
    lr: float | None = None


@dataclass
class RunResult:
    status: str  # a Status value; a stop requested through Hooks gives its own reason
    epochs: list[EpochRecord] = field(default_factory=list)
    params: np.ndarray | None = None
    train_time_s: float = 0.0
    samples: int = 0  # applied samples
    eval_time_s: float = 0.0
    computed: int = 0  # gradients computed
    applied: int = 0  # gradients applied (sync: its n per averaged update)
    dropped: int = 0  # thrown away by the drop gate
    intervals: int = 0  # intervals completed (algo interval)
    staleness_hist: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    staleness_max: int = 0
    staleness_bound: int | None = 0
    gate_wait_s: float = 0.0  # summed over workers
    gil_fraction: float = 0.0  # of the workers' wall time spent in Python
    max_concurrent_steps: int = 1  # most workers seen inside the compiled step at once
    bound_violations: int = 0  # updates applied outside their interval or its y - 1 (must be 0)
    diverged_at: dict | None = None  # {epoch, step} of the first non-finite loss
    loss_first: float | None = None  # smoothed loss at the end of epoch 1
    # [t_s, applied, y]: y of the open interval, seen at each monitor tick when it changed
    interval_trace: list[list[float]] = field(default_factory=list)
    threads_trace: list[list[float]] = field(default_factory=list)  # [t_s, applied, m]
    probe_log: list[dict] = field(default_factory=list)
    # [train_time_s, applied, test_accuracy] every eval_every applied updates
    # and at each epoch end (TrainConfig.eval_every > 0 only)
    evals: list[list[float]] = field(default_factory=list)
    # backend ray: nodes, server, staleness between nodes (iasgd.executors.ray_cluster)
    cluster: dict | None = None


@dataclass
class Live:
    """What the progress display shows while an epoch runs."""

    updates_per_s: float = 0.0
    y: int | None = None
    mean_tau: float = 0.0
    m: int | None = None


@dataclass
class Snapshot:
    """Everything needed to continue a run: arrays, and JSON-able metadata
    (position, random states, controller state, results so far)."""

    arrays: dict[str, np.ndarray]
    meta: dict


@dataclass
class Hooks:
    """Callbacks of a run; all optional. should_stop is polled several times a
    second and returns a reason (the run's status, e.g. "interrupted") to stop
    at the workers' next step; on_checkpoint receives a Snapshot every
    `checkpoint_every` epochs, after the last epoch, when a time budget cuts
    the run and when the run is stopped that way."""

    on_epoch_start: Callable[[int, int], None] = lambda epoch, num_samples: None
    on_progress: Callable[[int, Live], None] = lambda samples_done, live: None
    on_epoch_end: Callable[[EpochRecord], None] = lambda record: None
    should_stop: Callable[[], str | None] = lambda: None
    on_checkpoint: Callable[[Snapshot], None] = lambda snapshot: None


def result_meta(result: RunResult) -> dict:
    """The JSON-able part of a RunResult (params and histogram are arrays)."""
    meta = {k: v for k, v in vars(result).items() if k not in ("params", "staleness_hist")}
    meta["epochs"] = [asdict(e) for e in result.epochs]
    meta["status"] = str(result.status)
    return meta


def restore_result(meta: dict, params: np.ndarray, hist: np.ndarray) -> RunResult:
    fields = dict(meta)
    fields["epochs"] = [EpochRecord(**e) for e in fields["epochs"]]
    return RunResult(**fields, params=params, staleness_hist=hist)


def test_accuracy(model, params: np.ndarray, data, result: RunResult) -> float:
    """Accuracy of `params` on the test set; its time goes to eval_time_s
    (the first one's includes waiting for a cold start's child that compiles
    the evaluation while the run trains: iasgd.executors.precompile)."""
    t0 = time.perf_counter()
    precompile.finish_deferred()
    predictions = model.predict_images(params, data.x_test)
    result.eval_time_s += time.perf_counter() - t0
    return accuracy(predictions, data.y_test)


def load_evaluation(model, data, params: np.ndarray) -> None:
    """Load (or compile) what `test_accuracy` calls, before a run's clock
    starts: the prediction of one test image."""
    if data.x_test.shape[0]:
        model.predict_images(params, data.x_test[:1])


def record_eval(result: RunResult, model, data, params: np.ndarray, *, seconds: float,
                applied: int, accuracy: float | None = None) -> float:
    """Append [seconds, applied, test accuracy] to result.evals; evaluates
    unless `accuracy` is given (an epoch end's, already measured)."""
    if accuracy is None:
        accuracy = test_accuracy(model, params, data, result)
    result.evals.append([seconds, applied, accuracy])
    return accuracy


def summarize(result: RunResult, algo: str, counters: np.ndarray, state: np.ndarray,
              hist: np.ndarray, probe: np.ndarray) -> None:
    """The run-wide figures from the workers' counters (n, COUNTER_COLUMNS),
    the gate state, the run's staleness histogram and the probe array."""
    def total(column: int) -> int:
        return int(counters[:, column].sum())

    result.staleness_bound = staleness_bound(algo, state)
    result.bound_violations = total(W.VIOLATIONS)
    result.computed = total(W.COMPUTED)
    result.applied = total(W.APPLIED)
    result.dropped = total(W.DROPPED)
    result.intervals = int(state[G.INTERVALS])
    result.staleness_hist = hist
    result.staleness_max = int(counters[:, W.TAU_MAX].max())
    result.gate_wait_s = total(W.WAIT_NS) / 1e9
    result.max_concurrent_steps = int(probe[W.ACTIVE_MAX])

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


def time_to_target(time_s: Sequence[float], accuracy: Sequence[float | None],
                   target: float) -> float | None:
    """Training seconds until the test accuracy (fraction; None or NaN: not
    evaluated or diverged) first reaches `target` (fraction), interpolated
    linearly between the two evaluations around the crossing; the first
    evaluation itself when that one already reaches it. None: never. The one
    scoring of time to target: plots and bench/scaling.py use it."""
    before = None
    for t, acc in zip(time_s, accuracy, strict=True):
        if acc is None or not math.isfinite(acc):  # not evaluated, or a diverged run
            before = None
            continue
        if acc >= target:
            if before is None:
                return t
            t0, acc0 = before
            return t0 + (target - acc0) / (acc - acc0) * (t - t0)
        before = (t, acc)
    return None
