"""The gates a PyTorch training loop shares between its worker processes
(or threads), and the step that wraps a user's ordinary step.

    gate = IntervalGate(y=16)
    ...in each worker, on the shared model (model.share_memory()):
    with gate.step() as step:          # ticket and slot taken, V read
        loss = loss_fn(model(x), target)
        opt.zero_grad(); loss.backward()
        step.apply(opt.step)           # commit, write, close; step.tau known

Everything a gate knows lives in torch shared tensors (int64 state, rows,
histograms; float step-size factors and a loss ring), which pickle to the
workers as shared memory through torch.multiprocessing, as the model's own
tensors do. Each worker calls the compiled gate of iasgd.protocol on numpy
views of them (iasgd.torch.steps); the state is marked SHARED, so its
futexes wake sleepers in every process. Each worker (process or thread)
takes a row of its own at its first step.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.multiprocessing  # registers the shared-memory pickling of tensors

from iasgd.algorithms import ALGORITHMS, POLICIES
from iasgd.protocol import gate as G
from iasgd.protocol import workers as W
from iasgd.results import HIST_BINS, RunResult, summarize
from iasgd.schedules import (
    TAIL_SAMPLE,
    Fixed,
    LossMonitor,
    StalenessBudget,
    budget_interval,
    lr_factors,
)
from iasgd.torch import steps as S

UNLIMITED = 1 << 62  # tickets of a gate without max_updates


class Stopped(Exception):  # noqa: N818  (a signal, as StopIteration)
    """The gate was stopped (max_updates reached, stop(), a failed worker,
    Ctrl-C, the time budget): raised by Gate.step() instead of a step. A
    worker function that lets it out of Gate.run() ends normally."""


@dataclass
class GateReport:
    """What a gate saw, over every worker (the engine's RunResult figures
    where they apply)."""

    algo: str
    status: str  # iasgd.torch.steps.REASONS
    applied: int  # updates written (V counts these and `left`'s empty ones)
    computed: int  # gradients that reached apply (applied + dropped)
    dropped: int  # thrown away by the drop policy
    left: int  # steps given back without their write (raised, left, died)
    intervals: int  # intervals completed
    staleness_hist: np.ndarray  # [tau]: applied updates with that staleness
    staleness_max: int
    staleness_mean: float
    staleness_bound: int | None  # the largest y an interval opened with, - 1 (None: none)
    bound_violations: int  # updates applied outside their interval or past y - 1: must be 0
    gate_wait_s: float  # summed over workers: ticket and slot waits
    max_concurrent_steps: int
    workers: int  # rows taken
    y_trace: list[list[float]] = field(default_factory=list)  # [t_s, applied, y]
    failures: list[tuple[int, str]] = field(default_factory=list)  # Gate.run's: (rank, why)

    def line(self) -> str:
        bound = "unbounded" if self.staleness_bound is None else f"<= {self.staleness_bound}"
        return (f"{self.algo}: {self.applied} updates by {self.workers} workers, staleness "
                f"max {self.staleness_max} mean {self.staleness_mean:.2f} (bound {bound}), "
                f"{self.bound_violations} violations, {self.dropped} dropped, {self.left} "
                f"given back; {self.status}")


def _shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype).share_memory_()


class Gate:
    """A gate that worker processes share (pass it to them as an argument,
    like the model). Use IntervalGate, HogwildGate or AsyncGate.

    workers: rows to make (each worker process or thread takes one at its
    first step). max_updates: the gate allows that many updates, then stops
    every worker (Stopped); None: no limit. lr_schedule: the step-size
    factor by staleness that step.lr_factor gives (iasgd.schedules:
    "none", "inverse", "fleet", "tail"). loss_window: losses (passed to
    step.apply) that the smoothed loss of a loss-driven y schedule averages.
    """

    algo: str = ""

    def __init__(self, *, y: int = G.UNBOUNDED, policy: str = "wait", workers: int = 64,
                 max_updates: int | None = None, lr_schedule: str = "none",
                 schedule: Any = None, loss_window: int = 1024, bins: int = HIST_BINS):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if max_updates is not None and max_updates < 1:
            raise ValueError(f"max_updates must be >= 1 or None, got {max_updates}")
        self.code = ALGORITHMS[self.algo].code
        self.policy = policy
        self.wait = self.algo == "interval" and policy == "wait"
        self.drop = self.algo == "interval" and policy == "drop"
        self.workers = workers
        self.lr_schedule = lr_schedule
        self.schedule = schedule  # y's controller (interval), ticked by tick()
        self._state = _shared((G.STATE_SIZE,), torch.int64)
        self._state.numpy()[:] = G.new_state(
            min(y, G.MAX_Y) if y != G.UNBOUNDED else y,
            limit=UNLIMITED if max_updates is None else max_updates, shared=True)
        self._rows = _shared((workers, S.ROW), torch.int64)
        self._hist = _shared((workers, bins), torch.int64)
        self._control = _shared((S.CONTROL,), torch.int64)
        self._factors = _shared((bins,), torch.float32)
        self._factors.numpy()[:] = lr_factors(lr_schedule, bins, workers)
        self._ring = _shared((max(1, loss_window),), torch.float64)
        self._tail_at = TAIL_SAMPLE if lr_schedule == "tail" else None
        self._monitor: LossMonitor | None = None
        self._loss_first: float | None = None
        self._t0 = time.monotonic()
        self._y_trace: list[list[float]] = []
        self._views()

    # ---- shared memory, as numpy views in each process

    def _views(self) -> None:
        self.state = self._state.numpy()
        self.rows = self._rows.numpy()
        self.hists = self._hist.numpy()
        self.control = self._control.numpy()
        self.factors = self._factors.numpy()
        self.ring = self._ring.numpy()
        self._local = threading.local()

    def __getstate__(self) -> dict:
        keep = ("state", "rows", "hists", "control", "factors", "ring", "_local")
        return {k: v for k, v in vars(self).items() if k not in keep}

    def __setstate__(self, d: dict) -> None:
        vars(self).update(d)
        self._views()

    # ---- a worker's row

    def _row(self) -> int:
        """This worker's row (taken at its first step; a forked child takes
        a new one)."""
        local, pid = self._local, os.getpid()
        if getattr(local, "pid", None) != pid:
            r = S.claim_row(self.control, self.workers)
            if r < 0:
                raise RuntimeError(f"more workers than the gate's workers={self.workers}: "
                                   "make it with a larger workers=")
            self.rows[r, S.PID] = pid
            local.pid, local.row = pid, r
        return local.row

    # ---- the step

    def step(self, read: Callable[[], Any] | None = None) -> Step:
        """A step, as a context manager: entering takes the ticket (and, wait
        policy, a slot) and reads V; raises Stopped if the gate stopped.
        read: called at the read (under async's lock: e.g. copy the shared
        parameters into a private model for a consistent snapshot)."""
        return Step(self, read)

    @property
    def stopped(self) -> bool:
        return bool(self.state[G.STOP])

    @property
    def status(self) -> str:
        if self.state[G.EXPIRED] and not self.control[S.REASON]:
            return S.REASONS[S.TIME_BUDGET]
        return S.REASONS[int(self.control[S.REASON])]

    def stop(self, reason: int = S.STOPPED) -> None:
        """Every worker leaves at its next step (Stopped); sleepers wake."""
        S.stop(self.state, self.control, reason)

    def stop_after(self, seconds: float) -> None:
        """A time budget: workers stop at their first step after `seconds`
        from now (the gate's DEADLINE, checked by every step)."""
        self.state[G.DEADLINE] = time.monotonic_ns() + int(seconds * 1e9)

    def give_back(self, pid: int) -> int:
        """Return what the steps of process `pid` held (call once it is dead:
        its tickets and slots come back, its intervals close). Returns the
        steps that held something."""
        held = 0
        for r in range(min(int(self.control[S.NEXT_ROW]), self.workers)):
            if self.rows[r, S.PID] == pid:
                held += S.give_back(self.state, self.rows[r], self.control, self.code) != S.IDLE
        return held

    def warm(self) -> None:
        """Compile (or load from numba's cache) every compiled call on a
        scratch gate, so that the workers start at once."""
        state = G.new_state(2, limit=2, shared=True)
        row, hist = np.zeros(S.ROW, np.int64), np.zeros(8, np.int64)
        control, ring = np.zeros(S.CONTROL, np.int64), np.zeros(1)
        S.claim_row(control, 1)
        for code in (S.INTERVAL, S.ASYNC):
            if S.begin(state, row, control, code, True) >= 0:
                S.end_read(state, row)
                if S.start_write(state, row, control, code, False) >= 0:
                    S.end_write(state, row, hist, control, ring, code, math.nan)
        S.give_back(state, row, control, S.INTERVAL)
        S.wait_finished(state, 1)
        S.stop(state, control, S.STOPPED)

    # ---- the parent's look at the run

    def tick(self) -> None:
        """Steer the schedules (call a few times a second from one process,
        e.g. the parent; Gate.run does): y's controller writes the next
        interval's y, the tail step-size factors are fixed once TAIL_SAMPLE
        updates are in."""
        applied = int(self.rows[:, W.APPLIED].sum())
        now = time.monotonic() - self._t0
        if self.schedule is not None:
            if self._monitor is None:
                self._monitor = LossMonitor(self.ring.size)
                self._monitor.ring = self.ring  # the workers' losses, shared
            written = int(self.control[W.LOSS_POS])
            loss = self._monitor.window_mean(written)
            if self._loss_first is None and written >= self.ring.size:
                self._loss_first = loss
            y = self.schedule.update(applied, now, loss, self._loss_first)
            self.state[G.Y_NEXT] = max(1, min(int(y), G.MAX_Y))
            opened = int(self.state[G.Y])
            if not self._y_trace or self._y_trace[-1][2] != opened:
                self._y_trace.append([now, applied, opened])
        if self._tail_at is not None and applied >= self._tail_at:
            self.factors[:] = lr_factors("tail", self.factors.size, self.workers,
                                         staleness_sample=self.hists.sum(axis=0))
            self._tail_at = None

    def report(self) -> GateReport:
        """The figures so far (exact once the workers are done)."""
        used = max(1, min(int(self.control[S.NEXT_ROW]), self.workers))
        rows = self.rows[:used]
        result = RunResult(status=self.status)
        summarize(result, self.algo, rows[:, :W.COUNTER_COLUMNS], self.state,
                  self.hists[:used].sum(axis=0), self.control[:8])
        hist = result.staleness_hist
        top = int(np.flatnonzero(hist).max()) + 1 if hist.any() else 1
        return GateReport(
            algo=self.algo, status=self.status, applied=result.applied,
            computed=result.computed, dropped=result.dropped,
            left=int(rows[:, S.LEFT].sum()), intervals=result.intervals,
            staleness_hist=hist[:top].copy(), staleness_max=result.staleness_max,
            staleness_mean=float(rows[:, W.TAU_SUM].sum()) / max(result.applied, 1),
            staleness_bound=result.staleness_bound,
            bound_violations=result.bound_violations, gate_wait_s=result.gate_wait_s,
            max_concurrent_steps=result.max_concurrent_steps,
            workers=int(min(self.control[S.NEXT_ROW], self.workers)),
            y_trace=list(self._y_trace))

    def run(self, fn: Callable[..., Any], args: tuple = (), processes: int = 2,
            **options: Any) -> GateReport:
        """Run fn(rank, *args) in `processes` worker processes on this gate
        and supervise them (iasgd.torch.launch.run: Ctrl-C, failures,
        the schedules)."""
        from iasgd.torch.launch import run

        return run(self, fn, args, processes, **options)


class Step:
    """One step of one worker (Gate.step()). After entering: `gen` (the
    interval read in) and `v_read` (V at the read). After apply: `tau` (the
    update's staleness: updates applied between its read and its write),
    `lr_factor` (the gate's step-size factor for that tau) and `applied`
    (False: the drop policy dropped it)."""

    __slots__ = ("applied", "gate", "gen", "lr_factor", "read", "row", "tau", "v_read")

    def __init__(self, gate: Gate, read: Callable[[], Any] | None):
        self.gate, self.read = gate, read
        self.tau: int | None = None
        self.lr_factor = 1.0
        self.applied: bool | None = None

    def __enter__(self) -> Step:
        g = self.gate
        self.row = g._row()
        gen = S.begin(g.state, g.rows[self.row], g.control, g.code, g.wait)
        if gen < 0:
            raise Stopped(g.status)
        self.gen = gen
        self.v_read = int(g.rows[self.row, S.V_READ])
        try:
            if self.read is not None:
                self.read()
        except BaseException:
            # raised in the read: the `with` never calls __exit__ for a raising
            # __enter__, so the step gives back what it holds here (and async's lock)
            S.give_back(g.state, g.rows[self.row], g.control, g.code)
            raise
        finally:
            S.end_read(g.state, g.rows[self.row])
        return self

    def apply(self, fn: Callable[[], Any] | None = None, *, scale_lr: Any = None,
              loss: Any = None) -> bool:
        """Commit and write the update: fn() writes it (e.g. opt.step). With
        the drop policy an update whose interval closed or filled is dropped
        (False; fn is not called). scale_lr: an optimiser whose param_groups'
        lr are multiplied by lr_factor while fn runs. loss: the step's loss
        (a float or a tensor) for the gate's loss-driven schedules."""
        if self.applied is not None:
            raise RuntimeError("a step applies at most once")
        g = self.gate
        row = g.rows[self.row]
        tau = S.start_write(g.state, row, g.control, g.code, g.drop)
        if tau < 0:
            self.applied = False
            return False
        self.tau = tau
        self.lr_factor = float(g.factors[min(tau, g.factors.size - 1)])
        value = math.nan if loss is None else float(
            loss.detach() if isinstance(loss, torch.Tensor) else loss)
        if fn is not None:
            self._write(fn, scale_lr)
        S.end_write(g.state, row, g.hists[self.row], g.control, g.ring, g.code, value)
        self.applied = True
        return True

    def _write(self, fn: Callable[[], Any], scale_lr: Any) -> None:
        if scale_lr is None or self.lr_factor == 1.0:
            fn()
            return
        saved = [group["lr"] for group in scale_lr.param_groups]
        for group in scale_lr.param_groups:
            group["lr"] = group["lr"] * self.lr_factor
        try:
            fn()
        finally:
            for group, lr in zip(scale_lr.param_groups, saved, strict=True):
                group["lr"] = lr

    def __exit__(self, kind, err, tb) -> None:
        if self.applied is None or kind is not None:
            # raised, or left without applying: give back what the step holds
            S.give_back(self.gate.state, self.gate.rows[self.row], self.gate.control,
                        self.gate.code)


class IntervalGate(Gate):
    """Interval-Asynchrony: Hogwild! inside intervals of y applied updates
    that no step crosses, so every update's staleness is at most y - 1.

    y: the interval size, or a controller from iasgd.schedules (Decay,
    FollowLoss, WindowProbe, PerWorker, StalenessBudget: anything with
    `.value` and `.update(applied, now, loss, loss_first)`), which tick()
    follows. policy: "wait" (at most y steps start per interval; the others
    wait for the next) or "drop" (start freely, drop at commit an update
    whose interval closed or filled)."""

    algo = "interval"

    def __init__(self, y: Any = 16, *, policy: str = "wait", **options: Any):
        schedule = None if isinstance(y, int) else y
        first = y if isinstance(y, int) else int(y.value)
        if not 1 <= first <= G.MAX_Y:
            raise ValueError(f"interval size y must be in [1, {G.MAX_Y}], got {first}")
        if schedule is not None and isinstance(schedule, Fixed):
            schedule = None
        super().__init__(y=first, policy=policy, schedule=schedule, **options)

    @classmethod
    def budget(cls, lr: float, momentum: float, workers: int, *, per_worker: int = 32,
               budget: float = 0.15, y_min: int = 1, **options: Any) -> IntervalGate:
        """The staleness-budget y (docs/algorithms.md, "Staleness budget"):
        y = per_worker x workers while their own staleness, about
        2 (workers - 1), fits the budget's bound y_B - 1, y_B = 1 +
        floor(budget (1 - momentum) / lr); else max(y_min, y_B). `workers`
        is the processes that compute at once (the gate's rows default to it)."""
        rule = StalenessBudget(per_worker, workers, budget_interval(budget, lr, momentum), y_min)
        options.setdefault("workers", workers)
        return cls(int(rule.value), **options)


class HogwildGate(Gate):
    """No gate (the control): tickets and the staleness record only; workers
    read and write the shared parameters freely, as PyTorch's Hogwild!
    example does."""

    algo = "hogwild"


class AsyncGate(Gate):
    """Lock-based consistent asynchronous SGD: the read (Gate.step's `read`,
    e.g. a copy into a private model) and the write run under one lock."""

    algo = "async"
