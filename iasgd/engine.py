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
from dataclasses import asdict, dataclass, field

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
    """Callbacks of a run; all optional. should_stop is polled several times a
    second and returns a reason (the run's status, e.g. "interrupted") to stop
    at the workers' next step; on_checkpoint receives a Snapshot every
    `checkpoint_every` epochs and when the run is stopped that way."""

    on_epoch_start: Callable[[int, int], None] = lambda epoch, num_samples: None
    on_progress: Callable[[int, Live], None] = lambda samples_done, live: None
    on_epoch_end: Callable[[EpochRecord], None] = lambda record: None
    should_stop: Callable[[], str | None] = lambda: None
    on_checkpoint: Callable[[Snapshot], None] = lambda snapshot: None


@dataclass
class Snapshot:
    """Everything needed to continue a run: arrays, and JSON-able metadata
    (position, random states, controller state, results so far)."""

    arrays: dict[str, np.ndarray]
    meta: dict


def _result_meta(result: RunResult) -> dict:
    """The JSON-able part of a RunResult (params and histogram are arrays)."""
    meta = {k: v for k, v in vars(result).items() if k not in ("params", "staleness_hist")}
    meta["epochs"] = [asdict(e) for e in result.epochs]
    return meta


def _restore_result(meta: dict, params: np.ndarray, hist: np.ndarray) -> RunResult:
    fields = dict(meta)
    fields["epochs"] = [EpochRecord(**e) for e in fields["epochs"]]
    return RunResult(**fields, params=params, staleness_hist=hist)


def shuffle_streams(seed: int) -> np.random.Generator:
    """The shuffling stream of a run, independent of the init stream."""
    return np.random.default_rng(np.random.SeedSequence([seed, 1]))


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    return math.ceil(n_train / batch_size)


class _SequentialRun:
    """Plain mini-batch SGD with momentum on one thread (see module doc). Its
    snapshot holds the position inside the epoch, so an interrupted run
    resumes bit-identically."""

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 resume: Snapshot | None = None):
        self.model, self.data, self.cfg = model, data, cfg
        self.images = data.x_train.reshape(data.x_train.shape[0], -1)
        self.steps = steps_per_epoch(self.images.shape[0], cfg.batch_size)
        self.ws = model.workspace(cfg.batch_size)
        self.rng = shuffle_streams(cfg.seed)
        if resume is None:
            params = model.init(cfg.seed)
            self.velocity = np.zeros_like(params)
            self.losses = np.zeros(self.steps, np.float64)
            self.order: np.ndarray | None = None  # this epoch's permutation, once drawn
            self.epoch, self.step, self.epoch_time = 1, 0, 0.0
            self.result = RunResult(status="completed", params=params)
        else:
            a, meta = resume.arrays, resume.meta
            self.velocity, self.losses = a["velocity"], a["losses"]
            self.order = a["order"] if meta["in_epoch"] else None
            self.epoch, self.step, self.epoch_time = meta["epoch"], meta["step"], meta["epoch_time"]
            self.rng.bit_generator.state = meta["rng"]
            self.result = _restore_result(meta["result"], a["params"], a["staleness_hist"])
            self.result.status = "completed"

    def snapshot(self) -> Snapshot:
        r = self.result
        arrays = {"params": r.params, "velocity": self.velocity, "losses": self.losses,
                  "staleness_hist": r.staleness_hist,
                  "order": self.order if self.order is not None else np.zeros(0, np.int64)}
        meta = {"epoch": self.epoch, "step": self.step, "epoch_time": self.epoch_time,
                "in_epoch": self.order is not None, "rng": self.rng.bit_generator.state,
                "result": _result_meta(r)}
        return Snapshot(arrays, meta)

    def run(self, hooks: Hooks, checkpoint_every: int = 0) -> RunResult:
        cfg, r, ws = self.cfg, self.result, self.ws
        n_train = self.images.shape[0]
        transform = self.model.image_transform
        labels = self.data.y_train
        chunk = 16  # grows to about CHUNK_SECONDS of work after the first call
        # Load (or compile) the kernels before the clock starts: zero steps.
        K.train_steps(r.params, self.velocity, ws.grad, ws.plan, ws.acts,
                      ws.dacts, ws.argmax, ws.labels, self.images, *transform, labels,
                      np.arange(n_train, dtype=np.int64), 0, 0, cfg.batch_size, cfg.lr,
                      cfg.momentum, self.losses)
        while self.epoch <= cfg.epochs:
            if self.order is None:
                self.order = self.rng.permutation(n_train).astype(np.int64)
                self.step, self.epoch_time = 0, 0.0
            hooks.on_epoch_start(self.epoch, n_train)
            while self.step < self.steps:
                count = min(chunk, self.steps - self.step)
                t0 = time.perf_counter()
                done = K.train_steps(r.params, self.velocity, ws.grad, ws.plan,
                                     ws.acts, ws.dacts, ws.argmax, ws.labels,
                                     self.images, *transform, labels, self.order, self.step,
                                     count, cfg.batch_size, cfg.lr, cfg.momentum, self.losses)
                dt = time.perf_counter() - t0
                self.epoch_time += dt
                self.step += done
                if done < count or not K.all_finite(r.params):
                    r.status = "diverged"
                    r.diverged_at = {"epoch": self.epoch, "step": self.step + 1}
                    break
                chunk = max(1, int(count * CHUNK_SECONDS / max(dt, 1e-9)))
                hooks.on_progress(min(self.step * cfg.batch_size, n_train),
                                  Live(updates_per_s=count / max(dt, 1e-9)))
                if _over_budget(cfg, r.train_time_s + self.epoch_time):
                    r.status = "time_budget"
                    break
                reason = hooks.should_stop()
                if reason:
                    r.status = reason
                    break
            if r.status not in ("completed", "time_budget", "diverged"):
                hooks.on_checkpoint(self.snapshot())  # mid-epoch: resume continues here
                return r
            self._record_epoch(hooks)
            if r.status != "completed":
                return r
            self.order, self.epoch = None, self.epoch + 1
            if checkpoint_every and (self.epoch - 1) % checkpoint_every == 0:
                hooks.on_checkpoint(self.snapshot())
        return r

    def _record_epoch(self, hooks: Hooks) -> None:
        cfg, r, step = self.cfg, self.result, self.step
        samples = min(step * cfg.batch_size, self.images.shape[0])
        r.train_time_s += self.epoch_time
        r.samples += samples
        r.computed += step
        r.applied += step
        r.staleness_hist[0] += step
        record = EpochRecord(
            epoch=self.epoch,
            train_loss=metrics.mean_step_loss(self.losses[:step], cfg.batch_size, samples),
            test_accuracy=_test_accuracy(self.model, r.params, self.data, r),
            wall_s=r.train_time_s,
            samples_per_s=samples / max(self.epoch_time, 1e-9),
            complete=step == self.steps,
            staleness_hist=[step],
        )
        r.epochs.append(record)
        hooks.on_epoch_end(record)


def _over_budget(cfg: TrainConfig, seconds: float) -> bool:
    return cfg.time_budget is not None and seconds >= cfg.time_budget


def _test_accuracy(model: Model, params: np.ndarray, data: Dataset, result: RunResult) -> float:
    t0 = time.perf_counter()
    predictions = model.predict_images(params, data.x_test)
    result.eval_time_s += time.perf_counter() - t0
    return metrics.accuracy(predictions, data.y_test)


class Controllers:
    """The schedules of one parallel run (threads here, or iasgd.sim): they
    read the applied count and the smoothed loss, and steer y (the gate's
    Y_NEXT), the active thread count m (the gate's M) and the step-size
    factors by staleness, recording what they did."""

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

    def new_gate(self) -> np.ndarray:
        """A gate state opening with the schedules' first y and m."""
        return G.new_state(self.y.value if self.y is not None else G.UNBOUNDED,
                           active=self.m.value if self.m is not None else self.cfg.threads)

    def step(self, now: float, applied: int, losses_written: int, state: np.ndarray,
             lr_factors: np.ndarray, staleness: Callable[[], np.ndarray]) -> None:
        """Look at the run and steer. now: training seconds so far; applied:
        updates applied; losses_written: losses the workers put in the
        monitor's ring; state: the gate; lr_factors: (HIST_BINS,) step-size
        factors, written in place; staleness: the run's histogram so far."""
        loss = self.monitor.window_mean(losses_written)
        first = self.result.loss_first
        if self.y is not None:
            y = self.y.update(applied, now, loss, first)
            if y != state[G.Y_NEXT] or not self.result.interval_trace:
                state[G.Y_NEXT] = y  # the next interval opens with it
                self.result.interval_trace.append([now, applied, y])
        if self.m is not None:
            m = self.m.update(applied, now, loss, first)
            if m != state[G.M] or not self.result.threads_trace:
                G.set_active(state, m)
                self.result.threads_trace.append([now, applied, m])
        if self.tail_sample_at is not None and applied >= self.tail_sample_at:
            lr_factors[:] = S.lr_factors("tail", HIST_BINS, self.cfg.threads,
                                         self.cfg.tail_amplitude, staleness())
            self.tail_sample_at = None

    def end_of_first_epoch(self, losses_written: int) -> None:
        self.result.loss_first = self.monitor.window_mean(losses_written)

    def logs(self) -> None:
        """The probe logs so far, into the result."""
        self.result.probe_log = [
            {"knob": kind, **entry}
            for kind, controller in (("interval", self.y), ("threads", self.m))
            if isinstance(controller, S.WindowProbe) for entry in controller.log]

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


class _Team:
    """The worker threads of one parallel run and everything they own."""

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig, params: np.ndarray,
                 control: Controllers):
        n, b, P = cfg.threads, cfg.batch_size, model.num_params
        self.model, self.cfg = model, cfg
        self.params = params
        self.velocity = np.zeros_like(params)
        self.state = control.new_gate()
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
        limit, counters = self.state[G.LIMIT], self.counters.copy()
        self.state[G.LIMIT] = self.state[G.TICKETS]  # no tickets: no step is taken
        self._worker_main(0, 0, 0)
        self._raise_first_error()
        self.state[G.LIMIT], self.counters[:] = limit, counters
        self.python_s[:] = self.alive_s[:] = 0

    def run_epoch(self, epoch: int, limit: int, segment: int,
                  on_tick: Callable[[], bool]) -> None:
        """Run all workers until `limit` gradients are applied since the start
        of the run (or a stop). on_tick is called every MONITOR_SECONDS and
        returns True to stop. segment: how often the run was resumed (it seeds
        the workers' random streams along with the epoch)."""
        self.state[G.LIMIT] = limit  # no worker runs: plain writes are safe
        quota = limit - self.total(W.APPLIED)  # sync: gradients left in this epoch
        threads = [threading.Thread(target=self._worker_main, args=(wid, epoch, quota, segment),
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

    def _worker_main(self, wid: int, epoch: int, quota: int, segment: int = 0) -> None:
        t0 = time.perf_counter()
        inside0 = self.counters[wid, W.STEPS_NS]
        try:
            seq = np.random.SeedSequence([self.cfg.seed, 2, wid, epoch, segment])
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
        common = (ws.acts, ws.dacts, ws.argmax, ws.labels, self.idx[wid], ws.plan,
                  self.images, *self.transform, self.labels)
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

    def steer(self, control: Controllers, now: float) -> None:
        """Let the schedules look at this team's run and steer it."""
        control.step(now, self.total(W.APPLIED), int(self.probe[W.LOSS_POS]), self.state,
                     self.lr_factors, lambda: self.run_hist + self.hist.sum(axis=0))

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


class _ParallelRun:
    """sync, async, hogwild or interval with cfg.threads worker threads. A
    snapshot taken between epochs or after a stop holds every shared array,
    counter and controller state; a resumed run continues from there (its
    thread interleaving, and so its exact numbers, differ)."""

    TEAM_ARRAYS = ("params", "velocity", "state", "probe", "counters", "hist", "losses",
                   "run_hist", "senses", "lr_factors", "ring")

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 resume: Snapshot | None = None):
        self.model, self.data, self.cfg = model, data, cfg
        self.quota = steps_per_epoch(data.x_train.shape[0], cfg.batch_size)
        self.result = RunResult(status="completed")
        self.control = Controllers(cfg, self.quota, self.result)
        self.team = _Team(model, data, cfg, model.init(cfg.seed), self.control)
        self.epoch, self.epoch_time, self.segment = 1, 0.0, 0
        if resume is not None:
            self._restore(resume)
        self.result.params = self.team.params

    def _restore(self, snap: Snapshot) -> None:
        team, meta = self.team, snap.meta
        for name in self.TEAM_ARRAYS:
            getattr(team, name)[...] = snap.arrays[name]
        team.state[G.STOP] = 0  # the stop that ended the last segment is over
        # a stop may have left sync's barrier half passed: start it afresh
        team.state[G.BARRIER_COUNT] = 0
        team.senses[:] = team.state[G.BARRIER_SENSE]
        self.epoch, self.epoch_time = meta["epoch"], meta["epoch_time"]
        self.segment = meta["segment"] + 1
        restored = _restore_result(meta["result"], team.params, team.run_hist)
        vars(self.result).update(vars(restored))
        self.result.status = "completed"
        self.control.restore(meta["control"])

    def snapshot(self) -> Snapshot:
        arrays = {name: getattr(self.team, name) for name in self.TEAM_ARRAYS}
        meta = {"epoch": self.epoch, "epoch_time": self.epoch_time, "segment": self.segment,
                "result": _result_meta(self.result), "control": self.control.state()}
        return Snapshot(arrays, meta)

    def run(self, hooks: Hooks, checkpoint_every: int = 0) -> RunResult:
        cfg, team, control, r = self.cfg, self.team, self.control, self.result
        team.warm_up()
        while self.epoch <= cfg.epochs:
            start = (self.epoch - 1) * self.quota  # applied updates before this epoch
            hooks.on_epoch_start(self.epoch, self.quota * cfg.batch_size)
            t0 = time.perf_counter() - self.epoch_time
            reason: list[str] = []

            def tick(t0: float = t0, start: int = start, reason: list = reason) -> bool:
                elapsed = time.perf_counter() - t0
                if not K.all_finite(team.params):  # a loss can stay finite on dead units
                    G.mark_diverged(team.state)
                team.steer(control, r.train_time_s + elapsed)
                hooks.on_progress((team.total(W.APPLIED) - start) * cfg.batch_size,
                                  team.live(start, elapsed))
                why = hooks.should_stop() or (
                    "time_budget" if _over_budget(cfg, r.train_time_s + elapsed) else None)
                if why and not reason:
                    reason.append(why)
                return bool(why)

            team.steer(control, r.train_time_s)
            team.run_epoch(self.epoch, self.epoch * self.quota, self.segment, tick)
            self.epoch_time = time.perf_counter() - t0
            if not K.all_finite(team.params):
                G.mark_diverged(team.state)
            applied = team.total(W.APPLIED) - start
            if team.state[G.DIVERGED]:
                r.status = "diverged"
                r.diverged_at = {"epoch": self.epoch, "step": applied + 1}
            elif reason:
                r.status = reason[0]
            if r.status not in ("completed", "time_budget", "diverged"):
                self._finish()
                hooks.on_checkpoint(self.snapshot())  # mid-epoch: resume continues here
                return r
            if self.epoch == 1:
                control.end_of_first_epoch(int(team.probe[W.LOSS_POS]))
            self._record_epoch(hooks, applied)
            if r.status != "completed":
                break
            self.epoch, self.epoch_time = self.epoch + 1, 0.0
            if checkpoint_every and (self.epoch - 1) % checkpoint_every == 0:
                self._finish()
                hooks.on_checkpoint(self.snapshot())
        self._finish()
        return r

    def _record_epoch(self, hooks: Hooks, applied: int) -> None:
        cfg, team, r = self.cfg, self.team, self.result
        r.train_time_s += self.epoch_time
        r.samples += applied * cfg.batch_size
        train_loss = float(team.losses.sum() / applied) if applied else float("nan")
        record = EpochRecord(
            epoch=self.epoch,
            train_loss=train_loss,
            test_accuracy=_test_accuracy(self.model, team.params, self.data, r),
            wall_s=r.train_time_s,
            samples_per_s=applied * cfg.batch_size / max(self.epoch_time, 1e-9),
            complete=applied == self.quota,
            staleness_hist=team.end_epoch_stats(),
        )
        r.epochs.append(record)
        hooks.on_epoch_end(record)

    def _finish(self) -> None:
        """Bring the run-wide figures of the result up to date."""
        self.control.logs()
        _collect_run_stats(self.team, self.result)


def staleness_bound(cfg: TrainConfig, interval_trace: list[list[float]]) -> int | None:
    """The largest staleness the algorithm allows (None: unbounded); with a
    schedule of y each interval's bound is its own y - 1, so the run's is the
    largest y used, minus 1."""
    if cfg.algo == "interval":
        return int(max(y for _, _, y in interval_trace)) - 1
    return 0 if cfg.algo in ("sequential", "sync") else None


def _collect_run_stats(team: _Team, result: RunResult) -> None:
    result.staleness_bound = staleness_bound(team.cfg, result.interval_trace)
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


def train(model: Model, data: Dataset, cfg: TrainConfig, hooks: Hooks | None = None, *,
          resume: Snapshot | None = None, checkpoint_every: int = 0) -> RunResult:
    """Run the algorithm that cfg.algo names, from the start or from a
    snapshot of the same configuration."""
    cfg.check()
    runner = _SequentialRun if cfg.algo == "sequential" else _ParallelRun
    return runner(model, data, cfg, resume).run(hooks or Hooks(), checkpoint_every)


