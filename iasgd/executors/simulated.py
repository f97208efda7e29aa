"""The simulated executor: the staleness of n workers, on one core.

It runs the algorithms' steps exactly as the threads do, through the same
compiled calls (iasgd.protocol.gate for tickets, slots and intervals; iasgd.protocol.workers'
read_step, compute_step, apply_step, and sync's round_gradient and
apply_round; the same counters, histograms and loss ring; the same epoch
loop, evaluation points, epoch recorder and run summary), and decides only
*when* each step happens, from a model of time: every step of a worker
takes a duration drawn from a step-time distribution (lognormal with a
given spread, or samples measured from real single-thread steps), and n
workers share `cores` cores in round-robin time slices of `quantum` seconds
(with a core per worker they simply run side by side). What the machine
adds is `Costs`: contention between busy cores, cold caches after a switch,
async's lock held through its copy and its write, and live reads (a
Hogwild! step cut by its slice reads the layers it has not reached when it
resumes). sync: a round lasts max(longest step, total / cores), barrier
costs not modelled. Epoch ends and eval_every boundaries drain the steps
under way, as on threads; the time budget is checked before each step, so
the steps under way at it finish and apply. The schedules steer every
MONITOR_SECONDS of simulated time. Nothing it reports was measured on n
real cores: every output says "simulated". docs/simulator.md has the model
and its parameters.

Each worker owns its random stream, as on threads: one simulated worker on a
core draws the same batches, and so trains to the same parameters, as one
real thread.

The executor is here; its model of time is iasgd.executors.sim_costs and its
event loop iasgd.executors.sim_events.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from iasgd.algorithms import ALGORITHMS
from iasgd.config import TrainConfig, check_data, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors.base import QUIET, EpochEnd, ExecutorBase, first_params
from iasgd.executors.epochs import train_in_chunks
from iasgd.executors.sim_costs import (
    FORWARD_SHARE,
    Costs,
    forward_positions,
    lognormal_steps,
    measure_sections,
    measure_step_times,
    measured_steps,
)
from iasgd.executors.sim_events import Simulation
from iasgd.nn.models import Model
from iasgd.nn.network import all_finite
from iasgd.protocol import gate as G
from iasgd.results import Hooks, Live, RunResult, Status
from iasgd.schedules import Controllers

__all__ = ["FORWARD_SHARE", "SIMULATED_ALGOS", "Costs", "SimulatedRun", "forward_positions",
           "lognormal_steps", "measure_sections", "measure_step_times", "measured_steps",
           "simulate"]

SIMULATED_ALGOS = tuple(a.name for a in ALGORITHMS.values() if a.simulated)


class SimulatedRun(ExecutorBase):
    """The simulator as an executor: epochs of simulated time, cut at
    eval_every boundaries as the threads' are (an evaluation costs no
    simulated time). Its monitor ticks every MONITOR_SECONDS of simulated
    time and takes the run's stop requests (a target reached, an interrupt)
    but shows no progress. Its runs are not checkpointed."""

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 step_time: Callable[[np.random.Generator], float], cores: int, quantum: float,
                 init: np.ndarray | None = None, costs: Costs | None = None):
        self.model, self.data, self.cfg = model, data, cfg
        self.quota = steps_per_epoch(data.x_train.shape[0], cfg.batch_size)
        self.result = RunResult(status=Status.COMPLETED)
        control = Controllers(cfg, self.quota, self.result, cores=cores)
        self.sim = Simulation(model, data, cfg, step_time, cores, quantum, control,
                        first_params(model, cfg, init), costs or Costs(), self.monitor)
        self.result.params = self.sim.params
        self.epoch = 1
        self.epoch_start = 0.0  # simulated seconds
        self.stop_requests = QUIET

    def train_epoch(self, hooks: Hooks) -> int:
        sim, r = self.sim, self.result
        self.stop_requests = Hooks(should_stop=hooks.should_stop)
        self.epoch_start, applied_before = sim.now, sim.applied()
        sim.tick()
        train_in_chunks(self.applied_so_far, self.epoch * self.quota,
                        self.cfg.eval_every, run_until=sim.run_until,
                        stopped=lambda: sim.stop is not None,
                        out_of_time=lambda: sim.stop == Status.TIME_BUDGET,
                        evaluate=self.evaluate_inside_epoch)
        self.check_diverged()
        applied = sim.applied() - applied_before
        if sim.stop == Status.DIVERGED:
            r.diverged_at = {"epoch": self.epoch, "step": applied + 1}
        if sim.stop is not None:
            r.status = sim.stop
        return applied

    def monitor(self) -> None:
        """The monitor's tick (ExecutorBase.tick), on simulated time."""
        why = self.tick(self.stop_requests)
        if why:
            self.sim.stop_run(why)

    def check_diverged(self) -> bool:
        sim = self.sim
        if sim.stop is None and not all_finite(sim.params):
            sim.stop_run(Status.DIVERGED)
        return sim.stop == Status.DIVERGED

    def steer(self, seconds: float) -> None:
        self.sim.steer(seconds)

    def progress(self, seconds: float) -> tuple[int, Live]:
        applied = self.sim.applied() - (self.epoch - 1) * self.quota
        return applied * self.cfg.batch_size, Live()

    def params_now(self) -> np.ndarray:
        return self.sim.params

    def applied_so_far(self) -> int:
        return int(self.sim.state[G.DONE])

    def train_seconds(self) -> float:
        return self.sim.now

    def exclude(self, seconds: float) -> None:
        """Nothing: an evaluation takes no simulated time."""

    def close_epoch(self, applied: int) -> EpochEnd:
        sim = self.sim
        return sim.close_epoch(self.epoch, applied, sim.now - self.epoch_start, sim.now)

    def next_epoch(self) -> None:
        self.epoch += 1

    def finish(self) -> None:
        sim, r = self.sim, self.result
        sim.summarize(r)
        r.train_time_s = sim.now
        r.samples = sim.applied() * self.cfg.batch_size

    def snapshot(self) -> None:
        """Simulated runs are not checkpointed."""


def simulate(model: Model, data: Dataset, cfg: TrainConfig,
             step_time: Callable[[np.random.Generator], float], cores: int | None = None,
             quantum: float = 0.004, hooks: Hooks | None = None,
             init: np.ndarray | None = None, costs: Costs | None = None) -> RunResult:
    """Train as cfg says, with the staleness that cfg.threads workers on
    `cores` cores (default: one each) would produce under `step_time`, time
    slices of `quantum` seconds (with fewer cores than workers) and the
    machine's `costs` (default: none). Returns a RunResult whose wall times
    (and time budget) are simulated seconds. hooks: on_epoch_start and
    on_epoch_end are called (at simulated epoch ends) and should_stop at
    every monitor tick; on_progress is not. init: (P,) the starting parameters (default: the
    model's initialisation with cfg.seed)."""
    cfg.check()
    check_data(model, data, cfg)
    if cfg.algo not in SIMULATED_ALGOS:
        raise ValueError(f"the simulator covers --algo {', '.join(SIMULATED_ALGOS)}, "
                         f"not {cfg.algo}")
    if not quantum > 0:
        raise ValueError(f"the time slice must be positive, got {quantum} s")
    cores = cores or cfg.threads
    run = SimulatedRun(model, data, cfg, step_time, cores,
                       quantum if cores < cfg.threads else math.inf, init, costs)
    return run.run(hooks or Hooks())
