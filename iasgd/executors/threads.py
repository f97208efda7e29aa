"""The threads executor: sync, async, hogwild and interval on real threads of
one machine, sharing one parameter array.

The worker threads are started once, before the clock, and live for the
whole run, each in one call of a compiled loop (iasgd.protocol.workers) with the GIL
released. An epoch is an allowance of exactly ceil(N_train / b) tickets
(iasgd.protocol.gate): the main thread allows them, looks at the run every
MONITOR_SECONDS while they are applied (progress, divergence, the schedules'
steering, stop requests) and, once all are written, evaluates while the
workers sleep. The workers stop themselves at the time budget's deadline.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from iasgd.algorithms import ALGORITHMS
from iasgd.checkpoints import check_fits
from iasgd.config import TrainConfig, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors import precompile
from iasgd.executors.arrays import WorkerArrays
from iasgd.executors.base import EpochEnd, ExecutorBase, first_params
from iasgd.executors.epochs import TrainingClock, train_in_chunks
from iasgd.nn.models import Model
from iasgd.nn.network import all_finite
from iasgd.protocol import gate as G
from iasgd.protocol import workers as W
from iasgd.results import Hooks, Live, RunResult, Snapshot, Status, result_meta
from iasgd.schedules import MONITOR_SECONDS, Controllers

WORKER_NICE = 10  # added to an oversubscribed worker's nice value (Linux)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS
    says, else every core of the machine)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _yield_to_the_main_thread() -> None:
    """Lower this worker thread's priority. With more workers than cores the
    main thread, which steers the run and stops it on Ctrl-C, would otherwise
    wait behind every runnable worker (measured: no tick for 3 s with 128
    workers on 2 cores); the workers still share the cores among themselves
    as before. Linux gives each thread its own nice value; elsewhere, or
    where the call is refused, nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid)
                                                 + WORKER_NICE))


class Team(WorkerArrays):
    """The worker threads of one run, on the arrays they share or own
    (iasgd.executors.arrays)."""

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig, params: np.ndarray,
                 control: Controllers):
        super().__init__(model, data, cfg, params, control)
        self.python_s = np.zeros(cfg.threads)
        self.alive_s = np.zeros(cfg.threads)
        self.errors: list[tuple[int, BaseException]] = []
        self.threads: list[threading.Thread] = []

    def warm_up(self) -> None:
        """Load (or compile) the worker loop before the clock starts: a call
        on a stopped copy of the gate returns at once."""
        state, counters = self.state.copy(), self.counters.copy()
        self.state[G.STOP], self.state[G.LIMIT] = 1, self.state[G.DONE]
        try:
            self._call_loop(0)
        except Exception as err:
            self.errors.append((0, err))
        finally:
            self.state[:], self.counters[:] = state, counters
        self._raise_first_error()

    def start(self, segment: int) -> None:
        """Start every worker thread and wait until all are running; they
        sleep until the first allowance. segment: how often the run was
        resumed (it seeds the workers' random streams)."""
        self.seed_streams(self.cfg.seed, segment)
        ready = [threading.Event() for _ in range(self.cfg.threads)]
        self.threads = [threading.Thread(target=self._worker_main, args=(wid, ready[wid]),
                                         name=f"iasgd-worker-{wid}", daemon=True)
                        for wid in range(self.cfg.threads)]
        for t in self.threads:
            t.start()
        for event in ready:
            event.wait()

    def run_until(self, limit: int, on_tick: Callable[[], bool]) -> None:
        """Allow updates until `limit` applied since the start of the run and
        return when all are written and recorded, or when the run stopped and
        every worker has left. on_tick is called every MONITOR_SECONDS and
        returns True to stop."""
        G.allow(self.state, limit)
        timeout_us = int(MONITOR_SECONDS * 1e6)
        while not G.wait_settled(self.state, timeout_us):
            if on_tick() or self.errors:
                G.request_stop(self.state)
        if G.stopped(self.state):
            self.join()
        self._raise_first_error()

    def join(self) -> None:
        """Stop the workers (they leave at their next check) and wait for them."""
        G.request_stop(self.state)
        for t in self.threads:
            t.join()
        self.threads = []

    def _raise_first_error(self) -> None:
        if self.errors:
            wid, err = self.errors[0]
            raise RuntimeError(f"worker {wid} failed: {type(err).__name__}: {err}") from err

    def _worker_main(self, wid: int, ready: threading.Event) -> None:
        t0 = time.perf_counter()
        inside0 = self.counters[wid, W.STEPS_NS]
        try:
            if self.cfg.threads > usable_cores():
                _yield_to_the_main_thread()
            ready.set()
            self._call_loop(wid)
        except BaseException as err:  # stop everyone, hand the error to the caller
            self.errors.append((wid, err))
            G.abort(self.state)
        finally:
            ready.set()
            alive = time.perf_counter() - t0
            inside = (self.counters[wid, W.STEPS_NS] - inside0) / 1e9
            self.alive_s[wid] += alive
            self.python_s[wid] += max(alive - inside, 0.0)

    def _call_loop(self, wid: int) -> None:
        if ALGORITHMS[self.cfg.algo].loop == "sync":
            W.sync_worker(wid, self.cfg.threads, self.rule, self.shared, self.inputs,
                          self.own[wid], self.grads, self.senses[wid], self.augment, self.knobs)
        else:
            W.async_worker(wid, self.rule, self.shared, self.inputs, self.own[wid], self.augment,
                           self.knobs)

    def check_diverged(self) -> bool:
        """Mark the run diverged if the parameters are not finite (a loss can
        stay finite on dead units); True if it has diverged."""
        if not all_finite(self.params):
            G.mark_diverged(self.state)
        return bool(self.state[G.DIVERGED])

    def live(self, applied_before: int, seconds: float) -> Live:
        applied = self.total(W.APPLIED)
        y = int(self.state[G.Y]) if ALGORITHMS[self.cfg.algo].bound == "interval" else None
        m = int(self.state[G.M]) if self.cfg.threads_schedule != "fixed" else None
        return Live(updates_per_s=(applied - applied_before) / max(seconds, 1e-9), y=y,
                    mean_tau=self.total(W.TAU_SUM) / max(applied, 1), m=m)


class ThreadedRun(ExecutorBase):
    """A parallel algorithm with cfg.threads worker threads. A snapshot taken
    between epochs or after a stop holds every shared array, counter and
    controller state; a resumed run continues from there (its thread
    interleaving, and so its exact numbers, differ)."""

    TEAM_ARRAYS = ("params", "velocity", "state", "probe", "counters", "hist", "losses",
                   "run_hist", "senses", "lr_factors", "ring")
    # what a resume reads from a snapshot's metadata, with its JSON type
    RESUME_META: ClassVar[dict[str, type]] = {
        "epoch": int, "epoch_time": float, "segment": int, "result": dict, "control": dict}

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 resume: Snapshot | None = None, init: np.ndarray | None = None):
        self.model, self.data, self.cfg = model, data, cfg
        self.quota = steps_per_epoch(data.x_train.shape[0], cfg.batch_size)
        self.result = RunResult(status=Status.COMPLETED)
        self.control = Controllers(cfg, self.quota, self.result, cores=usable_cores())
        self.team = Team(model, data, cfg, first_params(model, cfg, init), self.control)
        self.epoch, self.epoch_time, self.segment = 1, 0.0, 0
        if resume is not None:
            self._restore(resume)
        self.result.params = self.team.params

    def _restore(self, snap: Snapshot) -> None:
        team, meta = self.team, snap.meta
        # each saved array must be exactly the team's own: a copy of another
        # shape would fail, or broadcast silently, and another dtype be cast
        check_fits(snap, self.RESUME_META,
                   {name: (getattr(team, name).shape, getattr(team, name).dtype)
                    for name in self.TEAM_ARRAYS})
        for name in self.TEAM_ARRAYS:
            getattr(team, name)[...] = snap.arrays[name]
        # the stop that ended the last segment, and its deadline, are over
        team.state[[G.STOP, G.EXPIRED, G.DEADLINE, G.ABORT]] = 0
        team.state[G.BARRIER_COUNT] = 0  # a stop leaves sync between rounds
        team.senses[:] = team.state[G.BARRIER_SENSE]
        self.epoch, self.epoch_time = meta["epoch"], meta["epoch_time"]
        self.segment = meta["segment"] + 1
        self.restore_totals(meta["result"], team.params, team.run_hist)
        self.control.restore(meta["control"])

    def snapshot(self) -> Snapshot:
        arrays = {name: getattr(self.team, name) for name in self.TEAM_ARRAYS}
        meta = {"epoch": self.epoch, "epoch_time": self.epoch_time, "segment": self.segment,
                "result": result_meta(self.result), "control": self.control.state()}
        return Snapshot(arrays, meta)

    def load_steps(self) -> None:
        """Load (or compile) the worker loop."""
        self.team.warm_up()

    def start_run(self) -> None:
        precompile.load_kernels(self)
        self.team.start(self.segment)

    def end_run(self) -> None:
        self.team.join()
        self.finish()  # the workers' own time (gil_fraction) is known once they left

    def train_epoch(self, hooks: Hooks) -> int:
        cfg, team, r = self.cfg, self.team, self.result
        self._start = (self.epoch - 1) * self.quota  # applied updates before this epoch
        self.clock = TrainingClock(self.epoch_time)
        self._hooks, self._reason = hooks, None
        team.steer(r.train_time_s)
        if cfg.time_budget is not None:  # the workers stop themselves on time
            spent = self.train_seconds()
            team.state[G.DEADLINE] = time.monotonic_ns() + int((cfg.time_budget - spent) * 1e9)
        train_in_chunks(
            self.applied_so_far, self.epoch * self.quota, cfg.eval_every,
            run_until=self._run_chunk,
            stopped=lambda: bool(self._reason) or G.stopped(team.state),
            out_of_time=lambda: bool(team.state[G.EXPIRED])
            or self._reason == Status.TIME_BUDGET,
            evaluate=self.evaluate_inside_epoch)
        self.epoch_time = self.clock.elapsed()
        if team.state[G.EXPIRED] and not self._reason:
            self._reason = Status.TIME_BUDGET
        self.check_diverged()
        applied = team.total(W.APPLIED) - self._start
        if team.state[G.DIVERGED]:
            r.status = Status.DIVERGED
            r.diverged_at = {"epoch": self.epoch, "step": applied + 1}
        elif self._reason:
            r.status = self._reason
        return applied

    def _run_chunk(self, limit: int) -> None:
        """Allow the updates up to `limit` and wait for them (Team.run_until);
        at a boundary inside the epoch, tick once more: a chunk shorter than
        MONITOR_SECONDS (a fast machine, a small eval_every) saw no tick, and
        a stop asked for meanwhile would otherwise wait for one that is long."""
        team = self.team
        team.run_until(limit, self._tick)
        if limit < self.epoch * self.quota and not G.stopped(team.state) and self._tick():
            team.join()

    def _tick(self) -> bool:
        """The monitor's tick (ExecutorBase.tick); True: stop the workers
        (self._reason says why)."""
        why = self.tick(self._hooks)
        if why and why != Status.DIVERGED:  # a divergence stops the workers itself
            self._reason = self._reason or why
        return bool(why)

    def check_diverged(self) -> bool:
        return self.team.check_diverged()

    def steer(self, seconds: float) -> None:
        self.team.steer(seconds)

    def progress(self, seconds: float) -> tuple[int, Live]:
        team = self.team
        return ((team.total(W.APPLIED) - self._start) * self.cfg.batch_size,
                team.live(self._start, self.clock.elapsed()))

    def params_now(self) -> np.ndarray:
        return self.team.params

    def applied_so_far(self) -> int:
        return int(self.team.state[G.DONE])

    def hold_deadline(self) -> None:
        """Workers waiting at the boundary look at their deadline every
        SAFETY_US: while an evaluation runs they have none (0), or a long
        evaluation would spend the budget."""
        if self.cfg.time_budget is not None:
            self._held_deadline = int(self.team.state[G.DEADLINE])
            self.team.state[G.DEADLINE] = 0

    def exclude(self, seconds: float) -> None:
        """An evaluation's seconds: out of the training clock, and the
        workers' deadline, held since, moved on by as much."""
        self.clock.exclude(seconds)
        if self.cfg.time_budget is not None:
            self.team.state[G.DEADLINE] = self._held_deadline + int(seconds * 1e9)

    def close_epoch(self, applied: int) -> EpochEnd:
        r = self.result
        r.train_time_s += self.epoch_time
        r.samples += applied * self.cfg.batch_size
        return self.team.close_epoch(self.epoch, applied, self.epoch_time, r.train_time_s)

    def finish(self) -> None:
        """Bring the run-wide figures of the result up to date."""
        team = self.team
        team.summarize(self.result)
        self.result.gil_fraction = float(team.python_s.sum() / max(team.alive_s.sum(), 1e-9))
