"""Controllers that move a knob while training, and the loss monitor they read.

Every controller is plain Python with no threads and no clock of its own:
`update(applied, now, loss, loss_first)` gets the number of applied updates,
the training time in seconds, the smoothed loss and its value at the end of
epoch 1 (None until then), and returns the knob's value from now on. The
engine calls it a few dozen times a second and writes the value where the
workers read it (the interval size into the gate's Y_NEXT, so it takes effect
when the next interval opens; the thread count into the gate's M).

Interval size y (ALGORITHMS.md, "Choosing y while training"):
- Fixed:      y0 throughout.
- Decay:      y = max(y_min, y0 - z * (applied // q)).
- Probe:      alternate probe phases (y + W, y + W - S, ..., y - W, P updates
              each, loss slope of each measured) and execute phases (the
              steepest descent's y for X updates); each new window is centred
              on the last choice, scaled by s = L * loss / loss_first + (1 - L).
- FollowLoss: y = max(y_min, round(y0 * ((1 - c) * loss / loss_first + c))),
              c = x0 / (x0 - 1).
- PerWorker:  y = y0 * m, m the workers active now.
- StalenessBudget: y = y0 * m while 2 (m - 1) <= y_B - 1, else max(y_min, y_B),
              y_B = 1 + floor(B (1 - momentum) / lr).
Thread count m: Window probes m over w values top-down, then executes the best;
Cores runs min(n, cores) of the n threads and parks the rest.

Staleness-adaptive step size: `lr_factors` gives the factor for each tau.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from iasgd.algorithms import ALGORITHMS
from iasgd.protocol import gate as G

if TYPE_CHECKING:
    from iasgd.config import TrainConfig
    from iasgd.results import RunResult

INTERVAL_SCHEDULES = ("fixed", "decay", "probe", "follow-loss", "per-worker", "budget")
THREAD_SCHEDULES = ("fixed", "window", "cores")
LR_SCHEDULES = ("none", "inverse", "fleet", "tail")
# the step size over the run (iasgd.nn.network.scheduled_lr); the position is its code
LR_DECAYS = ("none", "cosine", "linear")


# -------------------------------------------------------------- loss monitor


class LossMonitor:
    """Smoothed training loss from a ring buffer that workers fill.

    Workers write each applied step's loss at ring[pos % size] with pos from
    an atomic counter (iasgd.protocol.workers); this class only reads, so it never
    stops them. `window_mean()` is the mean of the last `size` losses (fewer
    at the start); `ema()` an exponential moving average with weight `alpha`
    per step over the losses written since the previous call.
    """

    def __init__(self, size: int, alpha: float = 0.001):
        if size < 1:
            raise ValueError(f"loss window must be >= 1 step, got {size}")
        self.ring = np.zeros(size, np.float64)
        self.alpha = alpha
        self._ema: float | None = None
        self._ema_pos = 0

    def window_mean(self, pos: int) -> float | None:
        """Mean of the last min(pos, size) losses; pos = losses written so far."""
        count = min(pos, self.ring.size)
        if count == 0:
            return None
        return float(self.ring[:count].mean()) if pos < self.ring.size else float(self.ring.mean())

    def ema(self, pos: int) -> float | None:
        """Fold the losses written since the last call into the moving average."""
        first = max(self._ema_pos, pos - self.ring.size)  # older ones are overwritten
        for p in range(first, pos):
            x = float(self.ring[p % self.ring.size])
            self._ema = x if self._ema is None else (1 - self.alpha) * self._ema + self.alpha * x
        self._ema_pos = pos
        return self._ema


# ------------------------------------------------------------ interval size


@dataclass
class Fixed:
    value: int

    def update(self, applied: int, now: float, loss: float | None,
               loss_first: float | None) -> int:
        return self.value


@dataclass
class PerWorker:
    """y = per_worker x the workers active now (m; Controllers keeps
    `workers` current). The interval grows with the cores a run keeps busy:
    its closing wait (about half a step of one worker, once per interval)
    stays the same share of it, about 1 / (2 per_worker), and with y >= m no
    core idles for want of a slot. Staleness is then bounded by y - 1 and in
    practice set by the m workers computing at once (tau about m - 1)."""

    per_worker: int
    workers: int

    @property
    def value(self) -> int:
        return self.per_worker * self.workers

    def update(self, applied: int, now: float, loss: float | None,
               loss_first: float | None) -> int:
        return self.value


def budget_interval(budget: float, lr: float, momentum: float) -> int:
    """The largest y whose bound keeps a stale update within `budget`:
    1 + floor(budget (1 - momentum) / lr). A gradient read tau applies ago
    meets parameters that moved about tau heavy-ball steps of lr / (1 -
    momentum) since (the gradient norm as unit); y - 1 such steps fit in
    `budget`. lr 0 (no movement) fits any y: G.MAX_Y."""
    if lr <= 0:
        return G.MAX_Y
    # the small slack keeps 0.15 * 0.5 / 0.005 = 15 from flooring to 14
    return min(G.MAX_Y, 1 + math.floor(budget * (1 - momentum) / lr + 1e-9))


@dataclass
class StalenessBudget(PerWorker):
    """y from the step size and the workers active now (docs/algorithms.md,
    "Staleness budget"). m workers computing at once make staleness of up to
    about 2 (m - 1) with no gate at all (mean m - 1). While that fits the
    budget's bound, budget_y - 1, the gate only has to cost nothing: y =
    per_worker x m, as PerWorker. With more workers the bound has to do the
    work: y = max(y_min, budget_y), and the workers beyond y wait for a slot,
    which costs cores but keeps every update within the budget."""

    budget_y: int = G.MAX_Y
    y_min: int = 1

    @property
    def beyond(self) -> int:
        """y once the workers' own staleness outgrows the budget."""
        return max(self.y_min, self.budget_y)

    @property
    def value(self) -> int:
        if 2 * (self.workers - 1) <= self.budget_y - 1:
            return self.per_worker * self.workers
        return self.beyond


@dataclass
class Decay:
    """y = max(y_min, y0 - by * (applied // every))."""

    y0: int
    y_min: int = 4
    every: int = 4096
    by: int = 1
    value: int = 0

    def __post_init__(self) -> None:
        self.value = self.y0

    def update(self, applied: int, now: float, loss: float | None,
               loss_first: float | None) -> int:
        self.value = max(self.y_min, self.y0 - self.by * (applied // self.every))
        return self.value


@dataclass
class FollowLoss:
    """y falls linearly with the loss, reaching 0 at x0 * loss_first."""

    y0: int = 512
    y_min: int = 4
    x0: float = 0.2
    value: int = 0

    def __post_init__(self) -> None:
        self.value = self.y0

    def update(self, applied: int, now: float, loss: float | None,
               loss_first: float | None) -> int:
        if loss is None or not loss_first:
            self.value = self.y0
        else:
            c = self.x0 / (self.x0 - 1)
            self.value = max(self.y_min, round(self.y0 * ((1 - c) * loss / loss_first + c)))
        return self.value


@dataclass
class WindowProbe:
    """Alternate probe and execute phases over an integer knob.

    A probe phase tries `candidates(centre, offset, step)` in order, each for
    `probe_steps` applied updates, and measures each one's loss slope (loss
    change per second). The execute phase then runs the steepest descent's
    value for `exec_steps` updates, and the next probe window is centred on
    it, its offset and step scaled by s = L * loss / loss_first + (1 - L).
    """

    start: int
    offset: int
    step: int
    probe_steps: int
    exec_steps: int
    loss_scale: float
    low: int  # values below are clipped, and end the probe phase
    high: int | None = None  # values above are clipped (the thread count)
    log: list[dict] = field(default_factory=list)
    value: int = 0

    def __post_init__(self) -> None:
        self.centre = self.start
        self.queue = self.candidates(self.start, self.offset, self.step)
        self.results: list[tuple[float, int]] = []  # (slope, value) of this phase
        self.mark: tuple[int, float, float | None] | None = None  # start of the current phase
        self.executing_until: int | None = None
        self.value = self.queue[0]

    def candidates(self, centre: int, offset: int, step: int) -> list[int]:
        """centre + offset, centre + offset - step, ... down to centre - offset;
        clipped to [low, high], the first value at or below `low` last."""
        values: list[int] = []
        v = centre + offset
        while v >= centre - offset:
            clipped = min(v, self.high) if self.high is not None else v
            clipped = max(clipped, self.low)
            if not values or values[-1] != clipped:
                values.append(clipped)
            if clipped <= self.low:
                break
            v -= step
        return values

    def update(self, applied: int, now: float, loss: float | None,
               loss_first: float | None) -> int:
        if self.mark is None:
            self.mark = (applied, now, loss)
            return self.value
        if self.executing_until is not None:
            if applied >= self.executing_until:
                self._start_probe_phase(applied, now, loss, loss_first)
            return self.value
        start_applied, start_t, start_loss = self.mark
        if start_loss is None:  # no loss estimate yet: measure from the first one
            self.mark = (applied, now, loss)
            return self.value
        if applied - start_applied < self.probe_steps:
            return self.value
        slope = _slope(start_loss, loss, now - start_t)
        self.results.append((slope, self.value))
        self.log.append({"t_s": now, "applied": applied, "value": self.value,
                         "slope": slope})
        self.queue.pop(0)
        self.mark = (applied, now, loss)
        if self.queue:
            self.value = self.queue[0]
        else:
            self._execute_best(applied, now)
        return self.value

    def _execute_best(self, applied: int, now: float) -> None:
        _, best = min(self.results, key=lambda r: (r[0], -r[1]))
        self.log.append({"t_s": now, "applied": applied, "chosen": best})
        self.value = self.centre = best
        self.executing_until = applied + self.exec_steps
        self.results = []

    def _start_probe_phase(self, applied: int, now: float, loss: float | None,
                           loss_first: float | None) -> None:
        s = 1.0
        if loss is not None and loss_first:
            s = self.loss_scale * loss / loss_first + (1 - self.loss_scale)
        step = max(1, round(self.step * s))
        offset = max(step, round(self.offset * s))
        self.queue = self.candidates(self.centre, offset, step)
        self.value = self.queue[0]
        self.executing_until = None
        self.mark = (applied, now, loss)


def _slope(start: float | None, end: float | None, seconds: float) -> float:
    """Loss change per second; +inf when unknown (so it is never chosen)."""
    if start is None or end is None or seconds <= 0 or not math.isfinite(end - start):
        return math.inf
    return (end - start) / seconds


def thread_window(n: int, m0: int, window: int, probe_steps: int,
                  exec_steps: int) -> WindowProbe:
    """The elastic thread-count controller: `window` values of m, top down
    from the centre, clipped to [1, n]."""
    half = window // 2
    return WindowProbe(start=m0, offset=half, step=1, probe_steps=probe_steps,
                       exec_steps=exec_steps, loss_scale=0.0, low=1, high=n)


def fitted_workers(threads: int, cores: int | None) -> int:
    """Active workers of the `cores` thread schedule: one per core. More
    threads than cores compute no faster (they take turns on the cores) but
    make every gradient staler and every switch colder; the surplus sleeps
    (parked, at no CPU cost) and stays ready for a machine with more cores."""
    return threads if cores is None else max(1, min(threads, cores))


# --------------------------------------------------------- step size by tau


def lr_factors(schedule: str, bins: int, threads: int, amplitude: float = 1.0,
               staleness_sample: np.ndarray | None = None) -> np.ndarray:
    """Step-size factor for tau = 0 .. bins-1 (the last entry serves larger tau).

    inverse: 1 / (tau + 1); fleet: exp(-beta tau), beta = 2/(n+1) ln(1 + (n+1)/2);
    tail: 1 + A (1 - 2 F(tau)), F the mid-point CDF of `staleness_sample` (a
    histogram): F(tau) = P(t < tau) + P(t = tau) / 2.
    """
    tau = np.arange(bins, dtype=np.float64)
    if schedule == "none":
        factors = np.ones(bins)
    elif schedule == "inverse":
        factors = 1.0 / (tau + 1.0)
    elif schedule == "fleet":
        beta = 2.0 / (threads + 1) * math.log(1 + (threads + 1) / 2)
        factors = np.exp(-beta * tau)
    elif schedule == "tail":
        if staleness_sample is None or staleness_sample.sum() == 0:
            factors = np.ones(bins)
        else:
            hist = np.zeros(bins)
            hist[: min(bins, staleness_sample.size)] = staleness_sample[:bins]
            # mid-point CDF, P(t < tau) + P(t = tau) / 2: its mean over the
            # sample is exactly 1/2 for any distribution, so the mean factor
            # is 1, and a one-point sample (every tau equal) leaves the step
            # size unscaled (the plain CDF would zero it at A = 1)
            p = hist / hist.sum()
            cdf = np.cumsum(p) - p / 2
            factors = 1.0 + amplitude * (1.0 - 2.0 * cdf)
    else:
        raise ValueError(f"unknown lr schedule {schedule!r}; choose from {', '.join(LR_SCHEDULES)}")
    return factors.astype(np.float32)


# ------------------------------------------------- the controllers of a run

MONITOR_SECONDS = 0.02  # how often the controllers look at (and steer) a running run
TAIL_SAMPLE = 2048  # tail step sizes: applied updates sampled before the CDF is fixed


def interval_controller(cfg: TrainConfig, workers: int):
    """The controller of y that `cfg` asks for, starting with `workers` active."""
    y0 = cfg.start_y
    if cfg.interval_schedule == "budget":
        return StalenessBudget(y0, workers, budget_interval(cfg.staleness_budget, cfg.lr,
                                                             cfg.momentum), cfg.y_min)
    if cfg.interval_schedule == "per-worker":
        return PerWorker(y0, workers)
    if cfg.interval_schedule == "decay":
        return Decay(y0, cfg.y_min, cfg.decay_every, cfg.decay_by)
    if cfg.interval_schedule == "follow-loss":
        return FollowLoss(y0, cfg.y_min)
    if cfg.interval_schedule == "probe":
        return WindowProbe(start=y0, offset=cfg.probe_offset, step=cfg.probe_step,
                           probe_steps=cfg.probe_steps, exec_steps=cfg.exec_steps,
                           loss_scale=cfg.probe_loss_scale, low=cfg.y_min)
    return Fixed(y0)


def interval_rule(cfg: TrainConfig) -> str:
    """How the run sets y, in words: "y=16", or its schedule's rule."""
    controller = interval_controller(cfg, 1)
    if isinstance(controller, StalenessBudget):
        return (f"y={cfg.start_y} per active worker while they fit staleness budget "
                f"{cfg.staleness_budget:g}, else {controller.beyond}")
    if isinstance(controller, PerWorker):
        return f"y={cfg.start_y} per active worker"
    if isinstance(controller, Fixed):
        return f"y={cfg.start_y}"
    return f"y {cfg.interval_schedule} from {cfg.start_y}"


class Controllers:
    """The schedules of one parallel run (threads or simulated): they
    read the applied count and the smoothed loss, and steer y (the gate's
    Y_NEXT), the active thread count m (the gate's M) and the step-size
    factors by staleness, recording what they did."""

    def __init__(self, cfg: TrainConfig, quota: int, result: RunResult,
                 cores: int | None = None):
        """cores: the cores the run's workers share (None: one each), which
        the `cores` thread schedule fits the active workers to."""
        self.cfg, self.result = cfg, result
        self.monitor = LossMonitor(cfg.loss_window or 3 * quota)
        interval = ALGORITHMS[cfg.algo].bound == "interval"
        self.m = None
        if cfg.threads_schedule == "window":
            self.m = thread_window(cfg.threads, cfg.m0 or cfg.threads, cfg.window,
                                   cfg.probe_steps, cfg.exec_steps)
        elif cfg.threads_schedule == "cores":
            self.m = Fixed(fitted_workers(cfg.threads, cores))
        m0 = self.m.value if self.m is not None else cfg.threads
        self.y = interval_controller(cfg, m0) if interval else None
        self.tail_sample_at = min(TAIL_SAMPLE, quota) if cfg.lr_schedule == "tail" else None

    def new_gate(self) -> np.ndarray:
        """A gate state opening with the schedules' first y and m."""
        return G.new_state(min(self.y.value, G.MAX_Y) if self.y is not None else G.UNBOUNDED,
                           active=self.m.value if self.m is not None else self.cfg.threads)

    def step(self, now: float, applied: int, losses_written: int, state: np.ndarray,
             factors: np.ndarray, staleness: Callable[[], np.ndarray]) -> None:
        """Look at the run and steer. now: training seconds so far; applied:
        updates applied; losses_written: losses the workers put in the
        monitor's ring; state: the gate; factors: (bins,) step-size
        factors, written in place; staleness: the run's histogram so far."""
        loss = self.monitor.window_mean(losses_written)
        first = self.result.loss_first
        if self.m is not None:
            m = self.m.update(applied, now, loss, first)
            if m != state[G.M] or not self.result.threads_trace:
                G.set_active(state, m)
                self.result.threads_trace.append([now, applied, m])
        if isinstance(self.y, PerWorker):
            self.y.workers = int(state[G.M])
        if self.y is not None:
            # the trace holds the y of the interval open now, as it changes;
            # a value put in Y_NEXT and replaced before any interval opened
            # with it never bounded an update, so it is not recorded
            trace, opened = self.result.interval_trace, int(state[G.Y])
            if not trace or trace[-1][2] != opened:
                trace.append([now, applied, opened])
            state[G.Y_NEXT] = min(self.y.update(applied, now, loss, first), G.MAX_Y)
        if self.tail_sample_at is not None and applied >= self.tail_sample_at:
            factors[:] = lr_factors("tail", factors.size, self.cfg.threads,
                                         self.cfg.tail_amplitude, staleness())
            self.tail_sample_at = None

    def end_of_first_epoch(self, losses_written: int) -> None:
        self.result.loss_first = self.monitor.window_mean(losses_written)

    def logs(self) -> None:
        """The probe logs so far, into the result."""
        self.result.probe_log = [
            {"knob": kind, **entry}
            for kind, controller in (("interval", self.y), ("threads", self.m))
            if isinstance(controller, WindowProbe) for entry in controller.log]

    def state(self) -> dict:
        """JSON-able state of every controller (the ring is saved with the team)."""
        return {"y": vars(self.y) if self.y else None, "m": vars(self.m) if self.m else None,
                "tail_sample_at": self.tail_sample_at,
                "ema": [self.monitor._ema, self.monitor._ema_pos]}

    def restore(self, state: dict) -> None:
        for controller, saved in ((self.y, state["y"]), (self.m, state["m"])):
            if controller is not None and saved is not None:
                vars(controller).update(saved)
        self.tail_sample_at = state["tail_sample_at"]
        self.monitor._ema, self.monitor._ema_pos = state["ema"]


