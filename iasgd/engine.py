"""Training loops: they orchestrate the compiled kernels and never do tensor
arithmetic themselves.

- `sequential`: one thread, mini-batch SGD with momentum, the training set
  reshuffled every epoch. Seeded and bit-reproducible.
- `sync`, `async`, `hogwild`, `interval`: `threads` Python threads, each making
  one call per epoch into a compiled worker loop (iasgd.workers) that runs with
  the GIL released on one shared parameter array. Workers draw their batches
  uniformly with replacement from their own random stream (seed, worker id,
  epoch). Between epochs the workers return, the main thread evaluates, and
  the next epoch's tickets are handed out (iasgd.gate), so every epoch holds
  exactly ceil(N_train / b) applied gradients.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from iasgd import gate as G
from iasgd import kernels as K
from iasgd import metrics
from iasgd import schedules as S
from iasgd import workers as W
from iasgd.data import Dataset
from iasgd.models import Model

ALGOS = ("sequential", "sync", "async", "hogwild", "interval")
_ALGO_CODES = {"async": W.ASYNC, "hogwild": W.HOGWILD, "interval": W.INTERVAL}

# A chunk of steps is one compiled call; between chunks Python updates the
# progress display and checks the time budget.
CHUNK_SECONDS = 0.1
MONITOR_SECONDS = 0.02  # how often the main thread looks at (and steers) running workers
HIST_BINS = 1024  # staleness histogram bins; the last one counts every larger tau
TAIL_SAMPLE = 2048  # tail step sizes: applied updates sampled before the CDF is fixed


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
    threads: int = 1
    interval: int = 16  # y of a fixed interval size, and y0 of a schedule by default
    gate: str = "wait"  # interval policy: drop or wait
    # schedules of y (ALGORITHMS.md; defaults are the artifact's)
    interval_schedule: str = "fixed"
    y0: int | None = None  # None: `interval`
    y_min: int = 4
    decay_every: int = 4096  # q
    decay_by: int = 1  # z
    probe_offset: int = 16  # W
    probe_step: int = 4  # S
    probe_steps: int = 1024  # P: applied updates per probe (also of the thread window)
    exec_steps: int = 8192  # X: applied updates per execute phase
    probe_loss_scale: float = 0.9  # L
    loss_window: int | None = None  # steps of the smoothed loss; None: 3 epochs
    # adaptive thread count
    threads_schedule: str = "fixed"
    window: int = 8  # w
    m0: int | None = None  # None: threads
    # staleness-adaptive step size
    lr_schedule: str = "none"
    tail_amplitude: float = 1.0

    @property
    def start_y(self) -> int:
        return self.y0 if self.y0 is not None else self.interval

    def check(self) -> None:
        """Raise ValueError (one line, naming knobs as CLI options) on a value
        or combination no run can use."""
        choices = {"algo": ALGOS, "gate": G.POLICIES,
                   "interval_schedule": S.INTERVAL_SCHEDULES,
                   "threads_schedule": S.THREAD_SCHEDULES, "lr_schedule": S.LR_SCHEDULES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {_option(name)} {getattr(self, name)!r}; "
                                 f"choose from {', '.join(allowed)}")
        for name in ("batch_size", "epochs", "threads", "interval", "y_min", "decay_every",
                     "decay_by", "probe_offset", "probe_step", "probe_steps", "exec_steps",
                     "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{_option(name)} must be >= 1, got {getattr(self, name)}")
        if self.algo == "sequential" and self.threads != 1:
            raise ValueError("--algo sequential runs one thread; pick --algo sync, async, "
                             "hogwild or interval for --threads > 1")
        self._check_schedules()

    def _check_schedules(self) -> None:
        staleness_algos = ("async", "hogwild", "interval")
        if self.interval_schedule != "fixed":
            if self.algo != "interval":
                raise ValueError(f"--interval-schedule {self.interval_schedule} applies to "
                                 "--algo interval only")
            if (self.interval_schedule == "probe"
                    and self.start_y + self.probe_offset < self.y_min):
                raise ValueError(f"the probe window --y0 {self.start_y} +- --probe-offset "
                                 f"{self.probe_offset} lies wholly below --y-min {self.y_min}")
            if self.y_min > self.start_y:
                raise ValueError(f"--y-min {self.y_min} is above --y0 {self.start_y}")
        if self.threads_schedule != "fixed" and self.algo not in staleness_algos:
            raise ValueError(f"--threads-schedule {self.threads_schedule} applies to --algo "
                             "async, hogwild or interval")
        if self.m0 is not None and not 1 <= self.m0 <= self.threads:
            raise ValueError(f"--m0 {self.m0} must lie in [1, --threads {self.threads}]")
        if self.lr_schedule != "none" and self.algo not in staleness_algos:
            raise ValueError(f"--lr-schedule {self.lr_schedule} applies to --algo async, "
                             "hogwild or interval (the others have no staleness)")
        for name in ("probe_loss_scale", "tail_amplitude"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{_option(name)} must be in [0, 1], got {getattr(self, name)}")
        if self.loss_window is not None and self.loss_window < 1:
            raise ValueError(f"--loss-window must be >= 1, got {self.loss_window}")


def _option(field_name: str) -> str:
    """The CLI spelling of a TrainConfig field."""
    return "--" + field_name.replace("_", "-")


@dataclass
class EpochRecord:
    epoch: int
    train_loss: float
    test_accuracy: float
    wall_s: float  # training time since the start, evaluation excluded
    samples_per_s: float  # applied samples per second of this epoch
    complete: bool = True  # False for an epoch cut short by the time budget
    staleness_hist: list[int] = field(default_factory=list)  # [k]: updates with tau = k


@dataclass
class RunResult:
    status: str  # "completed" or "time_budget"
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
    bound_violations: int = 0  # updates whose tau exceeded their interval's y - 1 (must be 0)
    diverged_at: dict | None = None  # {epoch, step} of the first non-finite loss
    loss_first: float | None = None  # smoothed loss at the end of epoch 1
    interval_trace: list[list[float]] = field(default_factory=list)  # [t_s, applied, y]
    threads_trace: list[list[float]] = field(default_factory=list)  # [t_s, applied, m]
    probe_log: list[dict] = field(default_factory=list)


@dataclass
class Live:
    """What the progress display shows while an epoch runs."""

    updates_per_s: float = 0.0
    y: int | None = None
    mean_tau: float = 0.0
    m: int | None = None


@dataclass
class Hooks:
    """Callbacks for the display; all optional."""

    on_epoch_start: Callable[[int, int], None] = lambda epoch, num_samples: None
    on_progress: Callable[[int, Live], None] = lambda samples_done, live: None
    on_epoch_end: Callable[[EpochRecord], None] = lambda record: None


def shuffle_streams(seed: int) -> np.random.Generator:
    """The shuffling stream of a run, independent of the init stream."""
    return np.random.default_rng(np.random.SeedSequence([seed, 1]))


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    return math.ceil(n_train / batch_size)


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
    steps = steps_per_epoch(n_train, cfg.batch_size)
    losses = np.zeros(steps, np.float64)
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
        while step < steps:
            count = min(chunk, steps - step)
            t0 = time.perf_counter()
            done = K.train_steps(params, velocity, ws.grad, ws.plan.conv, ws.plan.dense,
                                 ws.acts, ws.dacts, ws.argmax, ws.labels, images, *transform,
                                 labels, order, step, count, cfg.batch_size, cfg.lr,
                                 cfg.momentum, losses)
            dt = time.perf_counter() - t0
            epoch_time += dt
            step += done
            if done < count or not K.all_finite(params):
                result.status = "diverged"
                result.diverged_at = {"epoch": epoch, "step": step + 1}
                break
            chunk = max(1, int(count * CHUNK_SECONDS / max(dt, 1e-9)))
            hooks.on_progress(min(step * cfg.batch_size, n_train),
                              Live(updates_per_s=count / max(dt, 1e-9)))
            if _over_budget(cfg, result.train_time_s + epoch_time):
                break
        samples = min(step * cfg.batch_size, n_train)
        result.train_time_s += epoch_time
        result.samples += samples
        result.computed += step
        result.applied += step
        result.staleness_hist[0] += step
        record = EpochRecord(
            epoch=epoch,
            train_loss=metrics.mean_step_loss(losses[:step], cfg.batch_size, samples),
            test_accuracy=_test_accuracy(model, params, data, result),
            wall_s=result.train_time_s,
            samples_per_s=samples / max(epoch_time, 1e-9),
            complete=step == steps,
            staleness_hist=[step],
        )
        result.epochs.append(record)
        hooks.on_epoch_end(record)
        if result.status == "diverged":
            break
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


class _Controllers:
    """The schedules of one parallel run: they read the smoothed loss and the
    applied count, and steer y (the gate's Y_NEXT), the active thread count m
    (the gate's M) and the step-size factors, recording what they did."""

    def __init__(self, cfg: TrainConfig, quota: int, result: RunResult):
        self.cfg, self.result = cfg, result
        self.monitor = S.LossMonitor(cfg.loss_window or 3 * quota)
        self.y = self._interval_controller(cfg) if cfg.algo == "interval" else None
        self.m = None
        if cfg.threads_schedule == "window":
            self.m = S.thread_window(cfg.threads, cfg.m0 or cfg.threads, cfg.window,
                                     cfg.probe_steps, cfg.exec_steps)
        self.tail_sample_at = min(TAIL_SAMPLE, quota) if cfg.lr_schedule == "tail" else None

    @staticmethod
    def _interval_controller(cfg: TrainConfig):
        y0 = cfg.start_y
        if cfg.interval_schedule == "decay":
            return S.Decay(y0, cfg.y_min, cfg.decay_every, cfg.decay_by)
        if cfg.interval_schedule == "follow-loss":
            return S.FollowLoss(y0, cfg.y_min)
        if cfg.interval_schedule == "probe":
            return S.WindowProbe(start=y0, offset=cfg.probe_offset, step=cfg.probe_step,
                                 probe_steps=cfg.probe_steps, exec_steps=cfg.exec_steps,
                                 loss_scale=cfg.probe_loss_scale, low=cfg.y_min)
        return S.Fixed(y0)

    def initial_y(self) -> int:
        return self.y.value if self.y is not None else G.UNBOUNDED

    def step(self, team: _Team, now: float) -> None:
        """Look at the run now (`now`: training seconds so far) and steer."""
        applied = team.total(W.APPLIED)
        loss = self.monitor.window_mean(int(team.probe[W.LOSS_POS]))
        first = self.result.loss_first
        if self.y is not None:
            y = self.y.update(applied, now, loss, first)
            if y != team.state[G.Y_NEXT] or not self.result.interval_trace:
                team.state[G.Y_NEXT] = y  # the next interval opens with it
                self.result.interval_trace.append([now, applied, y])
        if self.m is not None:
            m = self.m.update(applied, now, loss, first)
            if m != team.state[G.M] or not self.result.threads_trace:
                G.set_active(team.state, m)
                self.result.threads_trace.append([now, applied, m])
        if self.tail_sample_at is not None and applied >= self.tail_sample_at:
            sample = team.run_hist + team.hist.sum(axis=0)
            team.lr_factors[:] = S.lr_factors("tail", HIST_BINS, self.cfg.threads,
                                              self.cfg.tail_amplitude, sample)
            self.tail_sample_at = None

    def end_of_epoch(self, team: _Team, epoch: int) -> None:
        if epoch == 0:
            self.result.loss_first = self.monitor.window_mean(int(team.probe[W.LOSS_POS]))

    def logs(self) -> None:
        for controller in (self.y, self.m):
            if isinstance(controller, S.WindowProbe):
                kind = "interval" if controller is self.y else "threads"
                self.result.probe_log += [{"knob": kind, **entry} for entry in controller.log]


class _Team:
    """The worker threads of one parallel run and everything they own."""

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig, params: np.ndarray,
                 control: _Controllers):
        n, b, P = cfg.threads, cfg.batch_size, model.num_params
        self.model, self.cfg = model, cfg
        self.params = params
        self.velocity = np.zeros_like(params)
        self.state = G.new_state(control.initial_y(),
                                 active=control.m.value if control.m else n)
        self.ring = control.monitor.ring
        self.probe = np.zeros(8, np.int64)
        self.images = data.x_train.reshape(data.x_train.shape[0], -1)
        self.labels = data.y_train
        self.transform = model.image_transform
        self.ws = [model.workspace(b) for _ in range(n)]
        self.idx = np.zeros((n, b), np.int64)
        # async reads a consistent snapshot into a private copy; sync averages
        # the rows of one (n, P) gradient array
        self.local = np.zeros((n, P if cfg.algo == "async" else 1), np.float32)
        self.grads = np.zeros((n, P if cfg.algo == "sync" else 1), np.float32)
        self.senses = np.zeros((n, 1), np.int64)
        self.lr_factors = S.lr_factors(cfg.lr_schedule, HIST_BINS, n)  # tail: ones until sampled
        self.counters = np.zeros((n, W.COUNTER_COLUMNS), np.int64)
        # this epoch's staleness histogram and loss sum of each worker, folded
        # into run_hist and the epoch record when the epoch ends
        self.hist = np.zeros((n, HIST_BINS), np.int64)
        self.losses = np.zeros((n, 1), np.float64)
        self.run_hist = np.zeros(HIST_BINS, np.int64)
        self.python_s = np.zeros(n)
        self.alive_s = np.zeros(n)
        self.errors: list[tuple[int, BaseException]] = []

    def warm_up(self) -> None:
        """Load (or compile) the worker loop before the clock starts: a call
        with no tickets returns at once."""
        self._worker_main(0, 0, 0)
        self._raise_first_error()
        self.counters[:] = 0
        self.python_s[:] = self.alive_s[:] = 0
        self.probe[:] = 0

    def run_epoch(self, epoch: int, quota: int, on_tick: Callable[[], bool]) -> None:
        """Run all workers until `quota` more gradients are applied (or a stop).
        on_tick is called every MONITOR_SECONDS and returns True to stop."""
        self.state[G.LIMIT] += quota  # no worker runs: plain writes are safe
        threads = [threading.Thread(target=self._worker_main, args=(wid, epoch, quota),
                                    name=f"iasgd-worker-{wid}", daemon=True)
                   for wid in range(self.cfg.threads)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(MONITOR_SECONDS)
                if t.is_alive() and on_tick():
                    G.request_stop(self.state)
        self._raise_first_error()

    def _raise_first_error(self) -> None:
        if self.errors:
            wid, err = self.errors[0]
            raise RuntimeError(f"worker {wid} failed: {type(err).__name__}: {err}") from err

    def _worker_main(self, wid: int, epoch: int, quota: int) -> None:
        t0 = time.perf_counter()
        inside0 = self.counters[wid, W.STEPS_NS]
        try:
            seq = np.random.SeedSequence([self.cfg.seed, 2, wid, epoch])
            W.seed_stream(int(seq.generate_state(1)[0]))
            self._call_loop(wid, epoch, quota)
        except BaseException as err:  # stop everyone, hand the error to the caller
            self.errors.append((wid, err))
            G.request_stop(self.state)
        finally:
            alive = time.perf_counter() - t0
            inside = (self.counters[wid, W.STEPS_NS] - inside0) / 1e9
            self.alive_s[wid] += alive
            self.python_s[wid] += max(alive - inside, 0.0)

    def _call_loop(self, wid: int, epoch: int, quota: int) -> None:
        cfg, ws = self.cfg, self.ws[wid]
        common = (ws.acts, ws.dacts, ws.argmax, ws.labels, self.idx[wid], ws.plan.conv,
                  ws.plan.dense, self.images, *self.transform, self.labels)
        if cfg.algo == "sync":
            W.sync_worker(wid, cfg.threads, quota, self.state, self.probe, self.params,
                          self.velocity, self.grads, *common, cfg.lr, cfg.momentum,
                          self.counters[wid], self.hist[wid], self.losses[wid], self.ring,
                          self.senses[wid])
        else:
            policy = G.WAIT if cfg.gate == "wait" else G.DROP
            W.async_worker(wid, _ALGO_CODES[cfg.algo], policy, self.state, self.probe,
                           self.params, self.velocity, self.local[wid], ws.grad, *common,
                           cfg.lr, cfg.momentum, self.lr_factors, self.counters[wid],
                           self.hist[wid], self.losses[wid], self.ring)

    def end_epoch_stats(self) -> list[int]:
        """Fold this epoch's per-worker histograms into the run's; reset them
        and the loss sums for the next epoch. Returns the epoch's histogram."""
        epoch_hist = self.hist.sum(axis=0)
        self.run_hist += epoch_hist
        self.hist[:] = 0
        self.losses[:] = 0
        return metrics.trimmed(epoch_hist)

    def total(self, column: int) -> int:
        return int(self.counters[:, column].sum())

    def live(self, applied_before: int, seconds: float) -> Live:
        applied = self.total(W.APPLIED)
        y = int(self.state[G.Y]) if self.cfg.algo == "interval" else None
        m = int(self.state[G.M]) if self.cfg.threads_schedule != "fixed" else None
        return Live(updates_per_s=(applied - applied_before) / max(seconds, 1e-9), y=y,
                    mean_tau=self.total(W.TAU_SUM) / max(applied, 1), m=m)


def train_parallel(model: Model, data: Dataset, cfg: TrainConfig,
                   hooks: Hooks | None = None) -> RunResult:
    """sync, async, hogwild or interval with cfg.threads worker threads."""
    hooks = hooks or Hooks()
    n_train = data.x_train.shape[0]
    quota = steps_per_epoch(n_train, cfg.batch_size)
    result = RunResult(status="completed")
    control = _Controllers(cfg, quota, result)
    team = _Team(model, data, cfg, model.init(cfg.seed), control)
    result.params = team.params
    team.warm_up()
    for epoch in range(cfg.epochs):
        hooks.on_epoch_start(epoch + 1, quota * cfg.batch_size)
        applied_before = team.total(W.APPLIED)
        t0 = time.perf_counter()

        def tick(t0: float = t0, applied_before: int = applied_before) -> bool:
            elapsed = time.perf_counter() - t0
            if not K.all_finite(team.params):  # a loss can stay finite on dead units
                G.mark_diverged(team.state)
            control.step(team, result.train_time_s + elapsed)
            done = team.total(W.APPLIED) - applied_before
            hooks.on_progress(done * cfg.batch_size, team.live(applied_before, elapsed))
            return _over_budget(cfg, result.train_time_s + elapsed)

        control.step(team, result.train_time_s)
        team.run_epoch(epoch, quota, tick)
        epoch_time = time.perf_counter() - t0
        control.end_of_epoch(team, epoch)
        if not K.all_finite(team.params):
            G.mark_diverged(team.state)
        applied = team.total(W.APPLIED) - applied_before
        hooks.on_progress(applied * cfg.batch_size, team.live(applied_before, epoch_time))
        result.train_time_s += epoch_time
        result.samples += applied * cfg.batch_size
        train_loss = float(team.losses.sum() / applied) if applied else float("nan")
        record = EpochRecord(
            epoch=epoch + 1,
            train_loss=train_loss,
            test_accuracy=_test_accuracy(model, team.params, data, result),
            wall_s=result.train_time_s,
            samples_per_s=applied * cfg.batch_size / max(epoch_time, 1e-9),
            complete=applied == quota,
            staleness_hist=team.end_epoch_stats(),
        )
        result.epochs.append(record)
        hooks.on_epoch_end(record)
        if team.state[G.DIVERGED]:
            result.status = "diverged"
            result.diverged_at = {"epoch": epoch + 1, "step": applied + 1}
            break
        if G.stopped(team.state):
            result.status = "time_budget"
            break
    control.logs()
    _collect_run_stats(team, result)
    return result


def _collect_run_stats(team: _Team, result: RunResult) -> None:
    cfg = team.cfg
    if cfg.algo == "interval":  # each interval's bound is its own y - 1
        result.staleness_bound = int(max(y for _, _, y in result.interval_trace)) - 1
    else:
        result.staleness_bound = 0 if cfg.algo == "sync" else None
    result.bound_violations = team.total(W.VIOLATIONS)
    result.computed = team.total(W.COMPUTED)
    result.applied = team.total(W.APPLIED)
    result.dropped = team.total(W.DROPPED)
    result.intervals = int(team.state[G.INTERVALS])
    result.staleness_hist = team.run_hist
    result.staleness_max = int(team.counters[:, W.TAU_MAX].max())
    result.gate_wait_s = team.total(W.WAIT_NS) / 1e9
    result.gil_fraction = float(team.python_s.sum() / max(team.alive_s.sum(), 1e-9))
    result.max_concurrent_steps = int(team.probe[W.ACTIVE_MAX])


def train(model: Model, data: Dataset, cfg: TrainConfig, hooks: Hooks | None = None) -> RunResult:
    """Run the algorithm that cfg.algo names."""
    cfg.check()
    if cfg.algo == "sequential":
        return train_sequential(model, data, cfg, hooks)
    return train_parallel(model, data, cfg, hooks)
