"""The simulated executor: the staleness of n workers, on one core.

It runs the algorithms' steps exactly as the threads do, through the same
compiled calls (iasgd.protocol.gate for tickets, slots and intervals; iasgd.protocol.workers'
read_step, compute_step, apply_step, and sync's round_gradient and
apply_round; the same counters, histograms and loss ring; the same epoch
recorder and run summary), and decides only *when* each step happens, from
a model of time: every step of a worker takes a duration drawn from a
step-time distribution (lognormal with a given spread, or samples measured
from real single-thread steps), and n workers share `cores` cores in
round-robin time slices of `quantum` seconds (with a core per worker they
simply run side by side). A step's ticket, slot and read happen when its
worker first gets a core, its gradient and apply when its time is used up;
the read is a consistent snapshot (lock waits are not modelled, so async and
hogwild coincide). sync: a round lasts max(longest step, total / cores),
barrier costs not modelled. The schedules steer every MONITOR_SECONDS of
simulated time, and a time budget is in simulated seconds. Nothing it
reports was measured on n real cores: every output says "simulated".

Each worker owns its random stream, as on threads: one simulated worker on a
core draws the same batches, and so trains to the same parameters, as one
real thread.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from iasgd.algorithms import ALGORITHMS
from iasgd.config import ConfigError, TrainConfig, check_data, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors.arrays import WorkerArrays
from iasgd.executors.epochs import run_epochs
from iasgd.nn import kernels as K
from iasgd.nn.models import Model
from iasgd.protocol import gate as G
from iasgd.protocol import workers as W
from iasgd.results import Hooks, RunResult, Status, record_epoch, summarize
from iasgd.schedules import MONITOR_SECONDS, Controllers

SIMULATED_ALGOS = tuple(a.name for a in ALGORITHMS.values() if a.simulated)


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
        K.train_steps(K.Weights(params, velocity), ws.buffers,
                      K.Images(images, data.y_train, *model.image_transform),
                      K.Steps(order, s % per_epoch, 1, batch_size, 0.0, 0.0), losses)
        if s:
            times[s - 1] = time.perf_counter() - t0
    return times


@dataclass
class _Worker:
    remaining: float = 0.0  # CPU seconds left in the current step
    gen: int = 0
    v_read: int = 0
    reading: bool = True  # its next CPU time starts a step: slot (wait gate), then the read


class _Sim(WorkerArrays):
    """The event loop, on the workers' arrays (iasgd.executors.arrays). A
    core runs a worker for a time slice; a worker that finishes its step
    inside its slice goes straight on with the next one (as under a real
    scheduler), otherwise it queues again."""

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 step_time: Callable[[np.random.Generator], float], cores: int, quantum: float,
                 result: RunResult, params: np.ndarray):
        quota = steps_per_epoch(data.x_train.shape[0], cfg.batch_size)
        control = Controllers(cfg, quota, result)
        # steps run one at a time: one workspace, and every read is a copy
        super().__init__(model, data, cfg, params, control, one_workspace=True)
        self.seed_streams(cfg.seed, 0)
        self.cfg, self.step_time, self.cores, self.quantum = cfg, step_time, cores, quantum
        self.result, self.quota, self.control = result, quota, control
        self.rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 3]))  # step times
        self.workers = [_Worker() for _ in range(cfg.threads)]
        self.runnable: deque[int] = deque()
        self.waiting: deque[int] = deque()  # wait gate: holding a ticket, no slot
        self.parked: list[int] = []  # outside the active thread count m
        self.events: list[tuple[float, int, int, float, float]] = []
        self.free_cores = cores
        self.seq = 0
        self.now = 0.0
        self.budget = cfg.time_budget if cfg.time_budget is not None else math.inf
        self.next_tick = 0.0
        self.stop: Status | None = None
        self.waits_for_slot = ALGORITHMS[cfg.algo].bound == "interval" and cfg.gate == "wait"

    def applied(self) -> int:
        return int(self.counters[:, W.APPLIED].sum())

    # ---- a worker's step: the calls async_worker makes, one at a time

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
        wk.gen, wk.reading = gen, False
        wk.v_read = int(W.read_step(self.plan, self.shared, self.inputs, self.own[w], True))
        wk.remaining = self.step_time(self.rng)
        return True

    def complete(self, w: int) -> None:
        wk, own = self.workers[w], self.own[w]
        W.gather_batch(self.inputs, own)
        loss = W.compute_step(self.shared, own, own.local)
        if W.apply_step(wk.gen, wk.v_read, loss, self.plan, self.shared, own) < 0:
            self.stop = Status.DIVERGED
        elif self.waits_for_slot and self.state[G.GEN_TAKEN] & 0xFFFFFFFF == 0:
            self.runnable.extend(self.waiting)  # an interval opened: they try for a slot
            self.waiting.clear()

    # ---- the schedules

    def steer(self) -> None:
        """What the threads' monitor does every MONITOR_SECONDS: check the
        parameters, let the schedules steer, wake workers that m lets in."""
        self.next_tick = self.now + MONITOR_SECONDS
        if not K.all_finite(self.params):
            self.stop = Status.DIVERGED
        self.control.step(self.now, self.applied(), int(self.probe[W.LOSS_POS]), self.state,
                          self.lr_factors, self.staleness_so_far)
        woken = [w for w in self.parked if w < self.state[G.M]]
        self.parked = [w for w in self.parked if w >= self.state[G.M]]
        self.runnable.extend(w for w in woken if self.start_step(w))

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
        G.allow(self.state, limit)
        if ALGORITHMS[self.cfg.algo].loop == "sync":
            self.run_sync_rounds(limit)
            return
        self.parked.clear()  # every worker starts the epoch afresh (or parks again)
        self.runnable.extend(w for w in range(self.cfg.threads) if self.start_step(w))
        self.dispatch()
        while self.events and self.stop is None:
            if self.events[0][0] >= self.budget:  # updates after the budget are not made
                self.now, self.stop = self.budget, Status.TIME_BUDGET
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
                if self.stop is None and self.start_step(w):
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
        P = self.params.size
        while self.applied() < limit and self.stop is None:
            active = min(self.cfg.threads, limit - self.applied())
            steps = [self.step_time(self.rng) for _ in range(active)]
            round_s = max(max(steps), sum(steps) / self.cores)
            if self.now + round_s > self.budget:
                self.now, self.stop = self.budget, Status.TIME_BUDGET
                break
            losses = [W.round_gradient(self.shared, self.inputs, self.own[w], self.grads[w])
                      for w in range(active)]
            if not all(math.isfinite(loss) for loss in losses):
                self.stop = Status.DIVERGED
                break
            W.apply_round(self.plan, self.shared, self.grads, active, 0, P,
                          self.own[0].grad)
            for w, loss in enumerate(losses):
                W.record_update(self.own[w], self.shared, 0, loss)
            self.state[G.VERSION] += 1
            G.settle_many(self.state, active)
            self.now += round_s
            if self.now >= self.next_tick:
                self.steer()


class SimulatedRun:
    """The simulator as an Executor of iasgd.executors.epochs: epochs of
    simulated time. Its runs are not checkpointed."""

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 step_time: Callable[[np.random.Generator], float], cores: int, quantum: float,
                 init: np.ndarray | None = None):
        self.model, self.data, self.cfg = model, data, cfg
        self.result = RunResult(status=Status.COMPLETED)
        params = model.init(cfg.seed) if init is None else init.copy()
        self.sim = _Sim(model, data, cfg, step_time, cores, quantum, self.result, params)
        self.result.params = self.sim.params
        self.epoch = 1
        self.epoch_start = 0.0  # simulated seconds

    def epoch_samples(self) -> int:
        return self.sim.quota * self.cfg.batch_size

    def train_epoch(self, hooks: Hooks) -> int:
        sim, r = self.sim, self.result
        self.epoch_start, applied_before = sim.now, sim.applied()
        sim.steer()
        sim.run_epoch(self.epoch * sim.quota)
        if sim.stop is None and not K.all_finite(sim.params):
            sim.stop = Status.DIVERGED
        applied = sim.applied() - applied_before
        if sim.stop == Status.DIVERGED:
            r.diverged_at = {"epoch": self.epoch, "step": applied + 1}
        if sim.stop is not None:
            r.status = sim.stop
        return applied

    def record_epoch(self, hooks: Hooks, applied: int) -> None:
        sim = self.sim
        if self.epoch == 1:
            sim.control.end_of_first_epoch(int(sim.probe[W.LOSS_POS]))
        hist, loss_sum = sim.end_epoch_stats()
        record = record_epoch(self.result, self.model, self.data, sim.params, epoch=self.epoch,
                              applied=applied, quota=sim.quota, batch_size=self.cfg.batch_size,
                              seconds=sim.now - self.epoch_start, loss_sum=loss_sum, hist=hist,
                              end_s=sim.now)
        hooks.on_epoch_end(record)

    def next_epoch(self) -> None:
        self.epoch += 1

    def finish(self) -> None:
        sim, r = self.sim, self.result
        sim.control.logs()
        r.train_time_s = sim.now
        r.samples = sim.applied() * self.cfg.batch_size
        summarize(r, self.cfg.algo, sim.counters, sim.state, sim.run_hist, sim.probe)

    def snapshot(self) -> None:
        """Simulated runs are not checkpointed."""


def simulate(model: Model, data: Dataset, cfg: TrainConfig,
             step_time: Callable[[np.random.Generator], float], cores: int | None = None,
             quantum: float = 0.004, hooks: Hooks | None = None,
             init: np.ndarray | None = None) -> RunResult:
    """Train as cfg says, with the staleness that cfg.threads workers on
    `cores` cores (default: one each) would produce under `step_time`.
    Returns a RunResult whose wall times (and time budget) are simulated
    seconds. hooks: on_epoch_start and on_epoch_end are called (at simulated
    epoch ends); progress and stop requests are not. init: (P,) the starting
    parameters (default: the model's initialisation with cfg.seed)."""
    cfg.check()
    check_data(model, data, cfg)
    if cfg.eval_every:
        raise ConfigError("{eval_every} is not simulated: simulated runs evaluate at epoch ends "
                          "(at no simulated cost); set {eval_every} 0")
    if cfg.algo not in SIMULATED_ALGOS:
        raise ValueError(f"the simulator covers --algo {', '.join(SIMULATED_ALGOS)}, "
                         f"not {cfg.algo}")
    cores = cores or cfg.threads
    run = SimulatedRun(model, data, cfg, step_time, cores,
                       quantum if cores < cfg.threads else math.inf, init)
    return run_epochs(run, hooks or Hooks())
