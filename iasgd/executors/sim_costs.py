"""The simulator's model of time (iasgd.executors.simulated;
docs/simulator.md): how long a step takes (drawn from a lognormal, or from
measured single-thread steps), what the machine adds to it (`Costs`), and
when a step's forward pass reads each layer (`forward_positions`, for live
reads).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from iasgd.data import Dataset
from iasgd.nn import network as N
from iasgd.nn.augment import augment_argument, image_inputs
from iasgd.nn.blas import single_threaded_blas
from iasgd.nn.models import Model
from iasgd.nn.plan import Steps, Weights, knobs_argument, plain_sgd


def lognormal_steps(mean_s: float, spread: float) -> Callable[[np.random.Generator], float]:
    """Step durations with mean `mean_s` seconds and sigma `spread` of log-time."""
    mu = math.log(mean_s) - spread**2 / 2
    return lambda rng: float(rng.lognormal(mu, spread))


def measured_steps(samples: np.ndarray) -> Callable[[np.random.Generator], float]:
    """Step durations drawn from measured ones (seconds)."""
    return lambda rng: float(samples[rng.integers(samples.size)])


def measure_step_times(model: Model, data: Dataset, batch_size: int,
                       steps: int = 200, augment: str = "none",
                       crop_padding: int = 4) -> np.ndarray:
    """Durations (s) of `steps` real single-thread training steps (their
    batches augmented as --augment and --crop-padding say), after warm-up,
    less what a call from Python costs (typing and unboxing its arguments,
    the median of as many calls of no step): real workers run their steps
    inside one compiled loop and never pay it."""
    ws = model.workspace(batch_size)
    params = model.init(0)
    velocity = np.zeros_like(params)
    images = data.x_train.reshape(data.x_train.shape[0], -1)
    order = np.arange(images.shape[0], dtype=np.int64)
    per_epoch = images.shape[0] // batch_size
    losses = np.zeros(per_epoch)
    times, calls = np.empty(steps), np.empty(steps)
    sgd = plain_sgd(0.0, 0.0)
    knobs = knobs_argument(sgd, params.size)
    inputs = image_inputs(images, data.y_train, model.image_transform, model.input_shape, augment,
                          crop_padding)
    with single_threaded_blas():  # as the workers run
        for s in range(steps + 1):  # round 0 is the warm-up
            for n, out in ((1, times), (0, calls)):
                t0 = time.perf_counter()
                N.train_steps(Weights(params, velocity), ws.buffers, inputs,
                              Steps(order, s % per_epoch, n, batch_size, sgd, 0),
                              losses, augment_argument(inputs), knobs)
                if s:
                    out[s - 1] = time.perf_counter() - t0
    return np.maximum(times - float(np.median(calls)), 1e-6)


def measure_sections(model: Model, repeats: int = 200) -> tuple[float, float]:
    """CPU seconds of (async's copy of the P parameters into its snapshot,
    one update's write: momentum and parameters) on this machine, the medians
    of `repeats` timings after a warm-up; the critical sections of Costs."""
    params = model.init(0)
    local, velocity, grad = np.zeros_like(params), np.zeros_like(params), np.zeros_like(params)
    copy, write = np.empty(repeats), np.empty(repeats)
    for i in range(repeats + 1):  # round 0 is the warm-up
        t0 = time.perf_counter()
        local[:] = params
        t1 = time.perf_counter()
        N.sgd_momentum_update(params, velocity, grad, 0.0, plain_sgd(0.0, 0.0), 0)
        t2 = time.perf_counter()
        if i:
            copy[i - 1], write[i - 1] = t1 - t0, t2 - t1
    return float(np.median(copy)), float(np.median(write))


@dataclass(frozen=True)
class Costs:
    """What the machine adds to the drawn single-thread step times, and how
    a step reads (docs/simulator.md, "What it models"); seconds are CPU
    seconds of the worker's core. The default: steps take exactly their
    drawn time and async's lock is never waited for, so async and hogwild
    differ only in what a cut step reads.

    contention: a step that begins while k cores compute steps (itself
        included; sim_events.Simulation.busy) takes (1 + contention *
        (k - 1)) times its drawn time: what the cores cost each other on
        the shared array (its cache lines move between cores) and in
        memory bandwidth.
    switch_s: CPU time a time-sliced worker spends again when it gets a
        core back for a step that the end of its slice cut (its caches went
        cold while the others ran); once per step, so that a switch longer
        than a slice still lets the step end; never charged when every
        worker has its own core.
    read_s: async's copy of the parameters, made holding the lock (not in
        the drawn step time: a single-thread step copies nothing).
    apply_s: the update's write, the last apply_s of the drawn step time
        (async: holding the lock).
    live_reads: hogwild and interval read the shared array as they compute
        (no snapshot; async copies it under its lock): a step cut by the
        end of its slice reads, when it resumes, the current values of the
        layers its forward pass has not reached yet (forward_positions).
        Off: the whole read is the snapshot taken when the step began
        (what the simulator did before issue 22).
    slice_spread: the scheduler's slices are not all one quantum long (a
        slice ends at a timer tick after the thread's share is used, other
        threads' wake-ups cut it): each lasts quantum * U(1 - s, 1 + s).
        0: every slice is exactly one quantum.
    """

    contention: float = 0.0
    switch_s: float = 0.0
    read_s: float = 0.0
    apply_s: float = 0.0
    live_reads: bool = True
    slice_spread: float = 0.0


FORWARD_SHARE = 1 / 3  # of a step's compute: the backward pass costs about twice the forward


def forward_positions(model: Model) -> list[tuple[int, float]]:
    """(offset of a layer's first parameter, when the forward pass reads it
    as a share of the step's compute in [0, FORWARD_SHARE)) for each layer
    with parameters, in order: the forward pass reaches each layer after
    the multiply-adds of the layers before it (conv: out * h * w * in * k *
    k; dense: out * in; the others about one per output)."""
    offsets = {name: off for name, _, off in model.layout}
    work, marks = 0.0, []
    for ls in model.shapes:
        if ls.params:
            marks.append((offsets[ls.params[0][0]], work))
        weight = ls.params[0][1] if ls.params else ()
        work += float(np.prod(ls.shape)) * (float(np.prod(weight[1:])) if weight else 1.0)
    return [(off, FORWARD_SHARE * done / work) for off, done in marks]
