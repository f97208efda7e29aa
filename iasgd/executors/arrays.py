"""The arrays of a run's parallel workers, built in one place: what they
share (parameters, velocity, the gate's state, the probe, the step-size
table, the loss ring), what each owns (workspace, random stream, counters,
this epoch's staleness histogram and loss sum) and the bundles of
iasgd.protocol.workers that the compiled steps take. The threads executor
and the simulator both build theirs here, so a field added to a bundle is
added once.
"""

from __future__ import annotations

import numpy as np

from iasgd.algorithms import ALGORITHMS, POLICIES
from iasgd.config import TrainConfig
from iasgd.data import Dataset
from iasgd.executors.base import EpochEnd, mean_loss
from iasgd.nn.augment import augment_argument, image_inputs
from iasgd.nn.models import Model
from iasgd.nn.plan import knobs_argument
from iasgd.protocol import gate as G
from iasgd.protocol import workers as W
from iasgd.results import HIST_BINS, RunResult, summarize, trimmed
from iasgd.schedules import Controllers, lr_factors


class WorkerArrays:
    """Every array that n = cfg.threads workers share or own, P = the model's
    parameter count.

    one_workspace: the steps run one at a time (the simulator), so every
    worker shares one workspace and every algorithm reads a private copy of
    the parameters into its row of `local` (n, P). Otherwise (real threads)
    each worker has its own workspace, `local` has P columns only for an
    algorithm that reads a snapshot (async), and `grads` has P columns only
    for sync, whose rounds average the rows.
    """

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig, params: np.ndarray,
                 control: Controllers, *, one_workspace: bool = False):
        n, P = cfg.threads, model.num_params
        algo = ALGORITHMS[cfg.algo]
        self.params = params  # (P,) float32
        self.velocity = np.zeros_like(params)  # (P,) float32
        self.state = control.new_gate()  # iasgd.protocol.gate's state
        self.ring = control.monitor.ring  # the losses the loss monitor reads
        self.probe = np.zeros(8, np.int64)  # steps running now, their maximum, losses written
        self.lr_factors = lr_factors(cfg.lr_schedule, HIST_BINS, n)  # by tau; tail: ones at first
        self.cfg, self.control = cfg, control
        self.local = np.zeros((n, P if algo.snapshot or one_workspace else 1), np.float32)
        self.grads = np.zeros((n, P if algo.loop == "sync" else 1), np.float32)
        self.senses = np.zeros((n, 1), np.int64)  # sync's barrier sense of each worker
        self.rngs = np.zeros((n, 1), np.uint64)  # seeded by seed_streams
        self.counters = np.zeros((n, W.COUNTER_COLUMNS), np.int64)
        # this epoch's staleness histogram and loss sum of each worker, folded
        # into run_hist and the epoch's record when the epoch ends
        self.hist = np.zeros((n, HIST_BINS), np.int64)
        self.losses = np.zeros((n, 1), np.float64)
        self.run_hist = np.zeros(HIST_BINS, np.int64)
        self.rule = W.StepRule(max(algo.code, 0), POLICIES[cfg.gate].code,
                               cfg.sgd(data.x_train.shape[0], model.num_trained))
        self.shared = W.Shared(self.state, self.probe, self.params, self.velocity,
                               self.lr_factors, self.ring)
        images = data.x_train.reshape(data.x_train.shape[0], -1)
        self.inputs = image_inputs(images, data.y_train, model.image_transform,
                                   model.input_shape, cfg.augment, cfg.crop_padding)
        # the steps' flags (iasgd.protocol.workers): None compiles no augmentation
        # and only the paper's update
        self.augment = augment_argument(self.inputs)
        self.knobs = knobs_argument(self.rule.sgd, P)
        one = model.workspace(cfg.batch_size) if one_workspace else None
        self.own = [W.new_own(one if one is not None else model.workspace(cfg.batch_size),
                              self.local[w], self.counters[w], self.hist[w], self.losses[w],
                              self.rngs[w])
                    for w in range(n)]

    def seed_streams(self, seed: int, segment: int) -> None:
        """Seed each worker's random stream; segment: how often the run was
        resumed (a resumed run draws new batches)."""
        for wid in range(self.rngs.shape[0]):
            self.rngs[wid] = W.stream_seed(seed, wid, segment)

    def total(self, column: int) -> int:
        """A counter column (iasgd.protocol.workers) summed over the workers."""
        return int(self.counters[:, column].sum())

    def staleness_so_far(self) -> np.ndarray:
        """(HIST_BINS,) the run's staleness histogram, this epoch included."""
        return self.run_hist + self.hist.sum(axis=0)

    def end_epoch_stats(self) -> tuple[np.ndarray, float]:
        """Fold this epoch's per-worker histograms into the run's; reset them
        and the loss sums. Returns the epoch's histogram and loss sum."""
        epoch_hist, loss_sum = self.hist.sum(axis=0), float(self.losses.sum())
        self.run_hist += epoch_hist
        self.hist[:] = 0
        self.losses[:] = 0
        return epoch_hist, loss_sum

    def steer(self, now: float) -> None:
        """Let the schedules look at the run (now: its training seconds) and steer."""
        self.control.step(now, self.total(W.APPLIED), int(self.probe[W.LOSS_POS]), self.state,
                          self.lr_factors, self.staleness_so_far)

    def close_epoch(self, epoch: int, applied: int, seconds: float, end_s: float) -> EpochEnd:
        """The figures of an epoch of `applied` updates that trained `seconds`
        and ended at `end_s` (iasgd.executors.base); its statistics folded
        into the run's (end_epoch_stats)."""
        if epoch == 1:
            self.control.end_of_first_epoch(int(self.probe[W.LOSS_POS]))
        hist, loss_sum = self.end_epoch_stats()
        return EpochEnd(self.params, seconds, end_s, mean_loss(loss_sum, applied),
                        applied * self.cfg.batch_size, trimmed(hist), int(self.state[G.DONE]))

    def summarize(self, result: RunResult) -> None:
        """The run-wide figures of the result, from the counters and the gate."""
        self.control.logs()
        summarize(result, self.cfg.algo, self.counters, self.state, self.run_hist, self.probe)
