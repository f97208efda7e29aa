"""What every executor shares, written once: the run under the one-thread
BLAS limit, the epoch's record, the evaluations inside an epoch, the
monitor's tick and the restore of a result. The epoch loop that calls
them is iasgd.executors.epochs.

An executor (a subclass of `ExecutorBase`) writes only how its steps run
and how time passes:

    train_epoch(hooks)     run the epoch's updates (epochs.train_in_chunks
                           cuts them at the eval_every boundaries); returns
                           the updates applied
    close_epoch(applied)   the epoch's figures for its record (EpochEnd),
                           the run's totals brought up to date
    params_now()           the parameters as they stand (to evaluate)
    train_seconds()        training seconds of the run so far
    applied_so_far()       updates applied since the start of the run
    progress(seconds)      what the progress display shows now
    steer(seconds)         the schedules look at the run (parallel runs)
    check_diverged()       mark the run diverged if its parameters are not
                           finite; True if it has diverged (then nothing
                           is evaluated inside the epoch)
    exclude(seconds)       leave an evaluation's seconds out of training time

and, besides, next_epoch, finish and snapshot (epochs.Executor).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from iasgd.config import TrainConfig
from iasgd.data import Dataset
from iasgd.executors.epochs import TrainingClock, run_epochs
from iasgd.nn import network
from iasgd.nn.blas import single_threaded_blas
from iasgd.nn.models import Model
from iasgd.results import (
    EpochRecord,
    Hooks,
    Live,
    RunResult,
    Status,
    load_evaluation,
    record_eval,
    restore_result,
    test_accuracy,
)

QUIET = Hooks()  # the hooks of a monitor that shows nothing and takes no stop (the simulator)


def one_thread_blas_for_good() -> None:
    """The one-thread BLAS limit of every run (ExecutorBase.run), for the
    rest of this process: a Ray node's process trains that node alone, its
    warm-up included, so the limit never needs lifting."""
    single_threaded_blas()


def first_params(model: Model, cfg: TrainConfig, init: np.ndarray | None) -> np.ndarray:
    """A run's starting parameters: `init` (a copy), else the model's
    initialisation with cfg.seed."""
    return model.init(cfg.seed) if init is None else init.copy()


def mean_loss(loss_sum: float, applied: int) -> float:
    """The mean loss of `applied` updates whose losses sum to loss_sum."""
    return float(loss_sum / applied) if applied else float("nan")


@dataclass
class EpochEnd:
    """What an epoch leaves for its record (ExecutorBase.close_epoch)."""

    params: np.ndarray  # the parameters to evaluate
    seconds: float  # the epoch's training time
    end_s: float  # the run's training time at the epoch's end
    train_loss: float
    samples: int  # samples applied in the epoch
    hist: list[int]  # their staleness histogram, trailing zeros trimmed
    done: int  # updates applied since the start of the run


class ExecutorBase:
    """An executor of iasgd.executors.epochs (module doc: what a subclass
    writes). The defaults here suit an executor on a real clock that keeps
    the epoch's training time in self.clock (a TrainingClock)."""

    model: Model
    data: Dataset
    cfg: TrainConfig
    result: RunResult
    epoch: int  # the epoch being trained, or next to train (1-based)
    quota: int  # updates in an epoch
    clock: TrainingClock

    # ------------------------------------------------------------ the run

    def run(self, hooks: Hooks, checkpoint_every: int = 0) -> RunResult:
        """Run the remaining epochs, every one under the one-thread BLAS
        limit: the kernels' GEMMs take one core per worker thread (with
        BLAS's default of one thread per core each call would start a team
        and oversubscribe the cores the workers run on)."""
        with single_threaded_blas():
            self.start_run()
            try:
                return run_epochs(self, hooks, checkpoint_every)
            finally:
                self.end_run()

    def start_run(self) -> None:
        """Before the first epoch: load the compiled code, start workers."""

    def end_run(self) -> None:
        """After the last epoch, or an error: stop what start_run started."""

    def epoch_samples(self) -> int:
        return self.quota * self.cfg.batch_size

    def next_epoch(self) -> None:
        self.epoch, self.epoch_time = self.epoch + 1, 0.0

    def scheduled_lr(self, done: int) -> float:
        """The step size the run's schedule (--lr-warmup, --lr-decay) gives
        its update number `done` - 1, before any staleness-scaled factor."""
        sgd = self.cfg.sgd(self.data.x_train.shape[0], self.model.num_trained)
        return float(network.scheduled_lr.py_func(sgd, max(done - 1, 0)))

    def load_evaluation(self) -> None:
        """Load (or compile) what the evaluation calls."""
        load_evaluation(self.model, self.data, self.params_now())

    def restore_totals(self, meta: dict, params: np.ndarray, hist: np.ndarray) -> None:
        """The result as a snapshot's metadata left it, to go on from."""
        vars(self.result).update(vars(restore_result(meta, params, hist)))
        self.result.status = Status.COMPLETED

    # ---------------------------------------------------------- an epoch

    def record_epoch(self, hooks: Hooks, applied: int) -> None:
        """Evaluate, append the epoch's record (and, with eval_every, its
        evaluation) and call hooks.on_epoch_end."""
        end, r = self.close_epoch(applied), self.result
        record = EpochRecord(
            epoch=self.epoch,
            train_loss=end.train_loss,
            test_accuracy=test_accuracy(self.model, end.params, self.data, r),
            wall_s=end.end_s,
            samples_per_s=end.samples / max(end.seconds, 1e-9),
            complete=applied == self.quota,
            staleness_hist=end.hist,
            lr=self.scheduled_lr(end.done),
        )
        r.epochs.append(record)
        if self.cfg.eval_every:
            record_eval(r, self.model, self.data, end.params, seconds=end.end_s,
                        applied=end.done, accuracy=record.test_accuracy)
        hooks.on_epoch_end(record)

    def evaluate_inside_epoch(self) -> bool:
        """At an eval_every boundary, every allowed update applied: append
        the test accuracy to result.evals, its time left out of training.
        False if the parameters diverged."""
        # the clock goes on from the time recorded: all that follows it
        # (the divergence check included) is left out of training
        t, seconds = time.perf_counter(), self.train_seconds()
        self.hold_deadline()
        try:
            if self.check_diverged():
                return False
            record_eval(self.result, self.model, self.data, self.params_now(),
                        seconds=seconds, applied=self.applied_so_far())
            return True
        finally:
            self.exclude(time.perf_counter() - t)

    def tick(self, hooks: Hooks) -> str | None:
        """The monitor's look at a run while an epoch trains (every
        MONITOR_SECONDS, and where a stretch of updates ends): a stop asked
        for first (with many threads per core the monitor may get a core
        only every few hundred ms), then divergence (a loss can stay finite
        on dead units), the schedules' steering, the progress display and
        the time budget. Returns why the run must stop, or None."""
        why = hooks.should_stop()
        if why:
            return why
        seconds = self.train_seconds()
        diverged = self.check_diverged()
        self.steer(seconds)
        hooks.on_progress(*self.progress(seconds))
        if diverged:
            return Status.DIVERGED
        if self.cfg.over_budget(seconds):
            return Status.TIME_BUDGET
        return None

    # ------------------------------------- defaults, for a real clock

    def train_seconds(self) -> float:
        return self.result.train_time_s + self.clock.elapsed()

    def hold_deadline(self) -> None:
        """An evaluation starts: no time budget runs out until exclude()."""

    def exclude(self, seconds: float) -> None:
        self.clock.exclude(seconds)

    def steer(self, seconds: float) -> None:
        """No schedules to steer."""

    def check_diverged(self) -> bool:
        """Mark the run diverged if its parameters are not finite (a loss
        can stay finite on dead units); True if it has diverged."""
        raise NotImplementedError

    def progress(self, seconds: float) -> tuple[int, Live]:
        raise NotImplementedError

    # ------------------------------------------------ each executor's own

    def train_epoch(self, hooks: Hooks) -> int:
        raise NotImplementedError

    def close_epoch(self, applied: int) -> EpochEnd:
        raise NotImplementedError

    def params_now(self) -> np.ndarray:
        raise NotImplementedError

    def applied_so_far(self) -> int:
        raise NotImplementedError
