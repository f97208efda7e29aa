"""Training loops: they orchestrate the compiled kernels and never do tensor
arithmetic themselves.

`sequential`: one thread, mini-batch SGD with momentum, the training set
reshuffled every epoch. Seeded and bit-reproducible: the same seed gives the
same parameters and losses.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from iasgd import kernels as K
from iasgd import metrics
from iasgd.data import Dataset
from iasgd.models import Model

ALGOS = ("sequential",)

# A chunk of steps is one compiled call; between chunks Python updates the
# progress display and checks the time budget.
CHUNK_SECONDS = 0.1


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a training run; names match the CLI options."""

    batch_size: int = 16
    lr: float = 0.005
    momentum: float = 0.5
    epochs: int = 3
    time_budget: float | None = None  # seconds of training, evaluation excluded
    seed: int = 0
    algo: str = "sequential"


@dataclass
class EpochRecord:
    epoch: int
    train_loss: float
    test_accuracy: float
    wall_s: float  # training time since the start, evaluation excluded
    samples_per_s: float
    complete: bool = True  # False for an epoch cut short by the time budget


@dataclass
class RunResult:
    status: str  # "completed" or "time_budget"
    epochs: list[EpochRecord] = field(default_factory=list)
    params: np.ndarray | None = None
    train_time_s: float = 0.0
    samples: int = 0
    eval_time_s: float = 0.0


@dataclass
class Hooks:
    """Callbacks for the display; all optional."""

    on_epoch_start: Callable[[int, int], None] = lambda epoch, num_samples: None
    on_progress: Callable[[int], None] = lambda samples_done: None
    on_epoch_end: Callable[[EpochRecord], None] = lambda record: None


def shuffle_streams(seed: int) -> np.random.Generator:
    """The shuffling stream of a run, independent of the init stream."""
    return np.random.default_rng(np.random.SeedSequence([seed, 1]))


def train_sequential(model: Model, data: Dataset, cfg: TrainConfig,
                     hooks: Hooks | None = None) -> RunResult:
    """Plain mini-batch SGD with momentum on one thread (see module doc)."""
    hooks = hooks or Hooks()
    params = model.init(cfg.seed)
    velocity = np.zeros_like(params)
    ws = model.workspace(cfg.batch_size)
    images = data.x_train.reshape(data.x_train.shape[0], -1)
    labels = data.y_train
    transform = model.image_transform
    n_train = images.shape[0]
    steps_per_epoch = math.ceil(n_train / cfg.batch_size)
    losses = np.zeros(steps_per_epoch, np.float64)
    rng = shuffle_streams(cfg.seed)
    result = RunResult(status="completed", params=params)
    chunk = 16  # grows to about CHUNK_SECONDS of work after the first call
    # Load (or compile) the kernels before the clock starts: zero steps.
    K.train_steps(params, velocity, ws.grad, ws.plan.conv, ws.plan.dense, ws.acts, ws.dacts,
                  ws.argmax, ws.labels, images, *transform, labels,
                  np.arange(n_train, dtype=np.int64),
                  0, 0, cfg.batch_size, cfg.lr, cfg.momentum, losses)

    for epoch in range(1, cfg.epochs + 1):
        order = rng.permutation(n_train).astype(np.int64)
        hooks.on_epoch_start(epoch, n_train)
        epoch_time, step = 0.0, 0
        while step < steps_per_epoch:
            count = min(chunk, steps_per_epoch - step)
            t0 = time.perf_counter()
            K.train_steps(params, velocity, ws.grad, ws.plan.conv, ws.plan.dense,
                          ws.acts, ws.dacts, ws.argmax, ws.labels, images, *transform, labels,
                          order, step, count, cfg.batch_size, cfg.lr, cfg.momentum, losses)
            dt = time.perf_counter() - t0
            epoch_time += dt
            step += count
            chunk = max(1, int(count * CHUNK_SECONDS / max(dt, 1e-9)))
            hooks.on_progress(min(step * cfg.batch_size, n_train))
            if _over_budget(cfg, result.train_time_s + epoch_time):
                break
        samples = min(step * cfg.batch_size, n_train)
        result.train_time_s += epoch_time
        result.samples += samples
        record = EpochRecord(
            epoch=epoch,
            train_loss=metrics.mean_step_loss(losses[:step], cfg.batch_size, samples),
            test_accuracy=_test_accuracy(model, params, data, result),
            wall_s=result.train_time_s,
            samples_per_s=samples / max(epoch_time, 1e-9),
            complete=step == steps_per_epoch,
        )
        result.epochs.append(record)
        hooks.on_epoch_end(record)
        if _over_budget(cfg, result.train_time_s):
            result.status = "time_budget"
            break
    return result


def _over_budget(cfg: TrainConfig, seconds: float) -> bool:
    return cfg.time_budget is not None and seconds >= cfg.time_budget


def _test_accuracy(model: Model, params: np.ndarray, data: Dataset, result: RunResult) -> float:
    t0 = time.perf_counter()
    predictions = model.predict_images(params, data.x_test)
    result.eval_time_s += time.perf_counter() - t0
    return metrics.accuracy(predictions, data.y_test)


def train(model: Model, data: Dataset, cfg: TrainConfig, hooks: Hooks | None = None) -> RunResult:
    """Run the algorithm that cfg.algo names."""
    if cfg.algo == "sequential":
        return train_sequential(model, data, cfg, hooks)
    raise ValueError(f"unknown algo {cfg.algo!r}; choose from {', '.join(ALGOS)}")
