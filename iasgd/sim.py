"""Asynchrony simulator: the staleness of n workers, on one core.

It runs the same gradient math as the threaded engine, one step at a time,
but decides which parameter version each gradient reads and when it is
applied from a model of time: every step of a worker takes a duration drawn
from a step-time distribution (lognormal with a given spread, or samples
measured from real single-thread steps), and n workers share `cores` cores
in round-robin time slices of `quantum` seconds (with a core per worker they
simply run side by side). An event queue of core time slices drives the
same gate functions the real workers call (iasgd.gate: tickets, wait/drop
slots, interval opening), so the staleness it reports is exact for that
time model, and its wall time is simulated. Nothing it reports was measured
on n real cores: every output says "simulated".

Covered: hogwild and async (a read is a consistent snapshot taken when the
step starts; lock waits are not modelled), interval with either gate, and
sync (a round lasts as long as its n steps take on the cores, barrier costs
not modelled). The schedules of y, of the thread count m and of the step
size run as in the engine (engine.Controllers), called every
MONITOR_SECONDS of simulated time. A time budget is in simulated seconds.
A non-finite loss or parameter stops the run as diverged, as in the engine.
Not covered: sequential (one thread has nothing to simulate).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from iasgd import gate as G
from iasgd import kernels as K
from iasgd import metrics
from iasgd import schedules as S
from iasgd.data import Dataset
from iasgd.engine import (
    HIST_BINS,
    MONITOR_SECONDS,
    Controllers,
    EpochRecord,
    RunResult,
    TrainConfig,
    staleness_bound,
    steps_per_epoch,
)
from iasgd.models import Model

SIMULATED_ALGOS = ("sync", "async", "hogwild", "interval")


def lognormal_steps(mean_s: float, spread: float) -> Callable[[np.random.Generator], float]:
    """Step durations with mean `mean_s` seconds and sigma `spread` of log-time."""
    mu = math.log(mean_s) - spread**2 / 2
    return lambda rng: float(rng.lognormal(mu, spread))


def measured_steps(samples: np.ndarray) -> Callable[[np.random.Generator], float]:
    """Step durations drawn from measured ones (seconds)."""
    return lambda rng: float(samples[rng.integers(samples.size)])


def measure_step_times(model: Model, data: Dataset, batch_size: int,
                       steps: int = 200) -> np.ndarray:
    """Durations (s) of `steps` real single-thread training steps, after warm-up."""
    import time

    ws = model.workspace(batch_size)
    params = model.init(0)
    velocity = np.zeros_like(params)
    images = data.x_train.reshape(data.x_train.shape[0], -1)
    order = np.arange(images.shape[0], dtype=np.int64)
    per_epoch = images.shape[0] // batch_size
    losses = np.zeros(per_epoch)
    times = np.empty(steps)
    for s in range(steps + 1):  # step 0 is the warm-up
        t0 = time.perf_counter()
        K.train_steps(params, velocity, ws.grad, ws.plan, ws.acts, ws.dacts,
                      ws.argmax, ws.labels, images, *model.image_transform, data.y_train,
                      order, s % per_epoch, 1, batch_size, 0.0, 0.0, losses)
        if s:
            times[s - 1] = time.perf_counter() - t0
    return times


@dataclass
class _Worker:
    remaining: float = 0.0  # CPU seconds left in the current step
    gen: int = 0
    y: int = 0  # size of the interval its step belongs to
    v_read: int = 0
    reading: bool = True  # its next CPU time starts a step: slot (wait gate), then the read


@dataclass
class _Sim:
    """The event loop. A core runs a worker for a time slice; a worker that
    finishes its step inside its slice goes straight on with the next one (as
    under a real scheduler), otherwise it queues again. A step's slot (wait
    gate) and parameter read happen when its worker first gets a core."""

    model: Model
    data: Dataset
    cfg: TrainConfig
    step_time: Callable[[np.random.Generator], float]
    cores: int
    quantum: float
    result: RunResult
    now: float = 0.0
    hist: np.ndarray = field(default_factory=lambda: np.zeros(HIST_BINS, np.int64))

    def __post_init__(self) -> None:
        cfg, P = self.cfg, self.model.num_params
        quota = steps_per_epoch(self.data.x_train.shape[0], cfg.batch_size)
        self.control = Controllers(cfg, quota, self.result)
        self.state = self.control.new_gate()
        self.lr_factors = S.lr_factors(cfg.lr_schedule, HIST_BINS, cfg.threads)
        self.params = self.model.init(cfg.seed)
        self.velocity = np.zeros_like(self.params)
        self.snapshots = np.zeros((cfg.threads, P), np.float32)  # sync: the gradients
        self.batches = np.zeros((cfg.threads, cfg.batch_size), np.int64)
        self.ws = self.model.workspace(cfg.batch_size)
        self.images = self.data.x_train.reshape(self.data.x_train.shape[0], -1)
        self.rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 3]))
        self.workers = [_Worker() for _ in range(cfg.threads)]
        self.runnable: deque[int] = deque()
        self.waiting: deque[int] = deque()  # wait gate: holding a ticket, no slot
        self.parked: list[int] = []  # outside the active thread count m
        self.events: list[tuple[float, int, int, float, float]] = []
        self.free_cores = self.cores
        self.seq = 0
        self.computed = self.dropped = self.violations = 0
        self.losses_written = 0
        self.loss_sum = 0.0
        self.budget = cfg.time_budget if cfg.time_budget is not None else math.inf
        self.next_tick = 0.0
        self.stop: str | None = None  # "time_budget" or "diverged"
        self.waits_for_slot = self.cfg.algo == "interval" and self.cfg.gate == "wait"

    # ---- a worker's step

    def start_step(self, w: int) -> bool:
        """Take a ticket for the worker's next step; False: none left, or the
        worker is parked (outside the active count m)."""
        if w >= self.state[G.M]:
            self.parked.append(w)
            return False
        if not G.take_ticket(self.state):
            return False
        self.workers[w].reading = True
        return True

    def begin(self, w: int) -> bool:
        """First CPU time of a step: slot, then the read. False: no slot."""
        wk = self.workers[w]
        if self.waits_for_slot:
            gen = int(G.try_slot(self.state))
            if gen < 0:
                self.waiting.append(w)
                return False
        else:
            gen = int(G.generation(self.state))
        wk.gen, wk.y, wk.v_read, wk.reading = (gen, int(self.state[G.Y]),
                                               int(self.state[G.VERSION]), False)
        self.snapshots[w] = self.params  # the read: a consistent copy
        self.draw_batch(w)
        wk.remaining = self.step_time(self.rng)
        return True

    def draw_batch(self, w: int) -> None:
        self.batches[w] = self.rng.integers(0, self.images.shape[0], self.cfg.batch_size)

    def gradient(self, w: int, params: np.ndarray, grad: np.ndarray) -> float:
        """Loss and gradient (into grad) of worker w's batch at params."""
        ws, idx = self.ws, self.batches[w]
        n, D = idx.size, self.images.shape[1]
        K.gather_images(self.images, idx, *self.model.image_transform,
                        ws.acts[:n * D].reshape(n, D))
        ws.labels[:n] = self.data.y_train[idx]
        self.computed += 1
        return K.network_loss_and_grad(params, grad, ws.plan, ws.acts,
                                       ws.dacts, ws.argmax, ws.labels[:n])

    def record(self, tau: int, loss: float) -> None:
        """Account one applied gradient, its loss into the monitor's ring."""
        self.hist[min(tau, HIST_BINS - 1)] += 1
        self.loss_sum += loss
        ring = self.control.monitor.ring
        ring[self.losses_written % ring.size] = loss
        self.losses_written += 1

    def complete(self, w: int) -> None:
        wk, cfg = self.workers[w], self.cfg
        loss = self.gradient(w, self.snapshots[w], self.ws.grad)
        if not math.isfinite(loss):
            self.stop = "diverged"
            return
        if (cfg.algo == "interval" and cfg.gate == "drop"
                and not G.claim_slot(self.state, wk.gen)):
            self.dropped += 1
            G.return_ticket(self.state)
            return
        tau = int(G.begin_apply(self.state)) - wk.v_read
        if cfg.algo == "interval" and tau > wk.y - 1:
            self.violations += 1
        factor = self.lr_factors[min(tau, HIST_BINS - 1)]
        K.sgd_momentum_update(self.params, self.velocity, self.ws.grad, cfg.lr * factor,
                              cfg.momentum)
        self.record(tau, loss)
        if cfg.algo == "interval" and G.finish_apply(self.state):
            self.runnable.extend(self.waiting)  # woken: they try for a slot when they run
            self.waiting.clear()

    # ---- the schedules

    def steer(self) -> None:
        """What the engine's monitor does every MONITOR_SECONDS: check the
        parameters, let the schedules steer, wake workers that m lets in."""
        self.next_tick = self.now + MONITOR_SECONDS
        if not K.all_finite(self.params):
            self.stop = "diverged"
        self.control.step(self.now, self.applied(), self.losses_written, self.state,
                          self.lr_factors, lambda: self.hist.copy())
        woken = [w for w in self.parked if w < self.state[G.M]]
        self.parked = [w for w in self.parked if w >= self.state[G.M]]
        self.runnable.extend(w for w in woken if self.start_step(w))

    def applied(self) -> int:
        return int(self.hist.sum())

    # ---- cores and time slices

    def run_slice(self, w: int, budget: float) -> None:
        """Give worker w a core for up to `budget` seconds (its step started)."""
        slice_s = min(budget, self.workers[w].remaining)
        self.seq += 1
        heapq.heappush(self.events, (self.now + slice_s, self.seq, w, slice_s, budget - slice_s))

    def dispatch(self) -> None:
        while self.free_cores and self.runnable:
            w = self.runnable.popleft()
            if self.workers[w].reading and not self.begin(w):
                continue  # no slot: it waits without using the core
            self.free_cores -= 1
            self.run_slice(w, self.quantum)

    def run_epoch(self, limit: int) -> None:
        """Run until `limit` updates are applied since the start, the time
        budget is spent or the run diverges."""
        self.state[G.LIMIT] = limit
        if self.cfg.algo == "sync":
            self.run_sync_rounds(limit)
            return
        self.parked.clear()  # every worker starts the epoch afresh (or parks again)
        self.runnable.extend(w for w in range(self.cfg.threads) if self.start_step(w))
        self.dispatch()
        while self.events and self.stop is None:
            if self.events[0][0] >= self.budget:  # updates after the budget are not made
                self.now, self.stop = self.budget, "time_budget"
                break
            self.now, _, w, slice_s, left = heapq.heappop(self.events)
            if self.now >= self.next_tick:
                self.steer()
            wk = self.workers[w]
            wk.remaining -= slice_s
            if wk.remaining > 1e-12:  # its slice ran out: queue again
                self.runnable.append(w)
            else:
                self.complete(w)
                if self.start_step(w):
                    if left > 1e-12 and self.begin(w):
                        self.run_slice(w, left)  # goes on in the rest of its slice
                        self.dispatch()  # its apply may have woken waiters
                        continue
                    if w not in self.waiting:
                        self.runnable.append(w)
            self.free_cores += 1
            self.dispatch()

    def run_sync_rounds(self, limit: int) -> None:
        """Sync: rounds of up to n gradients on the same parameters, averaged
        into one update. A round lasts max(longest step, total / cores): the
        time n time-sliced steps take on the cores."""
        cfg, grads = self.cfg, self.snapshots
        while self.applied() < limit and self.stop is None:
            active = min(cfg.threads, limit - self.applied())
            steps = [self.step_time(self.rng) for _ in range(active)]
            round_s = max(max(steps), sum(steps) / self.cores)
            if self.now + round_s > self.budget:
                self.now, self.stop = self.budget, "time_budget"
                break
            losses = []
            for w in range(active):
                self.draw_batch(w)
                losses.append(self.gradient(w, self.params, grads[w]))
            if not all(math.isfinite(loss) for loss in losses):
                self.stop = "diverged"
                break
            K.mean_rows(grads, active, 0, grads.shape[1], self.ws.grad)
            K.sgd_momentum_update(self.params, self.velocity, self.ws.grad, cfg.lr, cfg.momentum)
            self.state[G.VERSION] += 1
            for loss in losses:
                self.record(0, loss)
            self.now += round_s
            if self.now >= self.next_tick:
                self.steer()


def simulate(model: Model, data: Dataset, cfg: TrainConfig,
             step_time: Callable[[np.random.Generator], float], cores: int | None = None,
             quantum: float = 0.004) -> RunResult:
    """Train as cfg says, with the staleness that cfg.threads workers on
    `cores` cores (default: one each) would produce under `step_time`.
    Returns a RunResult whose wall times (and time budget) are simulated
    seconds."""
    cfg.check()
    if cfg.algo not in SIMULATED_ALGOS:
        raise ValueError(f"the simulator covers --algo {', '.join(SIMULATED_ALGOS)}, "
                         f"not {cfg.algo}")
    cores = cores or cfg.threads
    result = RunResult(status="completed")
    sim = _Sim(model, data, cfg, step_time, cores,
               quantum if cores < cfg.threads else math.inf, result)
    result.params = sim.params
    quota = steps_per_epoch(data.x_train.shape[0], cfg.batch_size)
    for epoch in range(1, cfg.epochs + 1):
        start, applied_before = sim.now, sim.applied()
        hist_before, loss_before = sim.hist.copy(), sim.loss_sum
        sim.steer()
        sim.run_epoch(epoch * quota)
        if sim.stop is None and not K.all_finite(sim.params):
            sim.stop = "diverged"
        applied = sim.applied() - applied_before
        if sim.stop == "diverged":
            result.diverged_at = {"epoch": epoch, "step": applied + 1}
        if epoch == 1:
            sim.control.end_of_first_epoch(sim.losses_written)
        predictions = model.predict_images(sim.params, data.x_test)
        result.epochs.append(EpochRecord(
            epoch=epoch, train_loss=(sim.loss_sum - loss_before) / max(applied, 1),
            test_accuracy=metrics.accuracy(predictions, data.y_test), wall_s=sim.now,
            samples_per_s=applied * cfg.batch_size / max(sim.now - start, 1e-12),
            complete=applied == quota, staleness_hist=metrics.trimmed(sim.hist - hist_before)))
        if sim.stop is not None:
            result.status = sim.stop
            break
    sim.control.logs()
    result.train_time_s = sim.now
    result.applied = sim.applied()
    result.samples = result.applied * cfg.batch_size
    result.computed, result.dropped = sim.computed, sim.dropped
    result.bound_violations = sim.violations
    result.intervals = int(sim.state[G.INTERVALS])
    result.staleness_hist = sim.hist
    nonzero = np.flatnonzero(sim.hist)
    result.staleness_max = int(nonzero[-1]) if nonzero.size else 0
    result.staleness_bound = staleness_bound(cfg, result.interval_trace)
    return result
