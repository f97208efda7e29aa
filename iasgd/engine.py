"""Training: `train` runs a configuration with the executor its algorithm
needs, and is the one entry point of the Python API. Runners orchestrate the
compiled kernels and never do tensor arithmetic themselves.

- `sequential` (here): one thread, mini-batch SGD with momentum, the training
  set reshuffled every epoch. Seeded and bit-reproducible.
- the parallel algorithms: real threads (iasgd.executors.threads), or simulated
  workers (iasgd.executors.simulated, through `simulate`).
"""

from __future__ import annotations

import time

import numpy as np

from iasgd import results
from iasgd.algorithms import ALGORITHMS
from iasgd.config import ConfigError, TrainConfig, check_data, eval_points, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors.threads import ThreadedRun, checkpoint_due
from iasgd.nn import kernels as K
from iasgd.nn.models import Model
from iasgd.results import (
    HIST_BINS,
    EpochRecord,
    Hooks,
    Live,
    RunResult,
    Snapshot,
    Status,
    record_eval,
    restore_result,
    result_meta,
    test_accuracy,
)

__all__ = ["HIST_BINS", "ConfigError", "EpochRecord", "Hooks", "Live", "RunResult", "Snapshot",
           "Status", "TrainConfig", "check_data", "steps_per_epoch", "train"]

# A chunk of steps is one compiled call; between chunks Python updates the
# progress display and checks the time budget.
CHUNK_SECONDS = 0.1


def shuffle_streams(seed: int) -> np.random.Generator:
    """The shuffling stream of a run, independent of the init stream."""
    return np.random.default_rng(np.random.SeedSequence([seed, 1]))


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
            self.result = RunResult(status=Status.COMPLETED, params=params)
        else:
            a, meta = resume.arrays, resume.meta
            self.velocity, self.losses = a["velocity"], a["losses"]
            self.order = a["order"] if meta["in_epoch"] else None
            self.epoch, self.step, self.epoch_time = meta["epoch"], meta["step"], meta["epoch_time"]
            self.rng.bit_generator.state = meta["rng"]
            self.result = restore_result(meta["result"], a["params"], a["staleness_hist"])
            self.result.status = Status.COMPLETED

    def snapshot(self) -> Snapshot:
        r = self.result
        arrays = {"params": r.params, "velocity": self.velocity, "losses": self.losses,
                  "staleness_hist": r.staleness_hist,
                  "order": self.order if self.order is not None else np.zeros(0, np.int64)}
        meta = {"epoch": self.epoch, "step": self.step, "epoch_time": self.epoch_time,
                "in_epoch": self.order is not None, "rng": self.rng.bit_generator.state,
                "result": result_meta(r)}
        return Snapshot(arrays, meta)

    def run(self, hooks: Hooks, checkpoint_every: int = 0) -> RunResult:
        cfg, r, ws = self.cfg, self.result, self.ws
        n_train = self.images.shape[0]
        weights, buffers = K.Weights(r.params, self.velocity), ws.buffers
        data = K.Images(self.images, self.data.y_train, *self.model.image_transform)
        chunk = 16  # grows to about CHUNK_SECONDS of work after the first call
        # Load (or compile) the kernels before the clock starts: zero steps.
        K.train_steps(weights, buffers, data, K.Steps(np.arange(n_train, dtype=np.int64), 0, 0,
                                                      cfg.batch_size, cfg.lr, cfg.momentum),
                      self.losses)
        while self.epoch <= cfg.epochs:
            if self.order is None:
                self.order = self.rng.permutation(n_train).astype(np.int64)
                self.step, self.epoch_time = 0, 0.0
            hooks.on_epoch_start(self.epoch, n_train)
            while self.step < self.steps:
                # a chunk ends at the next eval_every boundary (applied since the start)
                count = min(chunk, eval_points(r.applied + self.step, r.applied + self.steps,
                                               cfg.eval_every)[0] - r.applied - self.step)
                t0 = time.perf_counter()
                steps = K.Steps(self.order, self.step, count, cfg.batch_size, cfg.lr,
                                cfg.momentum)
                done = K.train_steps(weights, buffers, data, steps, self.losses)
                dt = time.perf_counter() - t0
                self.epoch_time += dt
                self.step += done
                if done < count or not K.all_finite(r.params):
                    r.status = Status.DIVERGED
                    r.diverged_at = {"epoch": self.epoch, "step": self.step + 1}
                    break
                chunk = max(1, int(count * CHUNK_SECONDS / max(dt, 1e-9)))
                hooks.on_progress(min(self.step * cfg.batch_size, n_train),
                                  Live(updates_per_s=count / max(dt, 1e-9)))
                if cfg.over_budget(r.train_time_s + self.epoch_time):
                    r.status = Status.TIME_BUDGET
                    break
                if (cfg.eval_every and self.step < self.steps
                        and (r.applied + self.step) % cfg.eval_every == 0):
                    record_eval(r, self.model, self.data, r.params,  # before a stop: a resume
                                seconds=r.train_time_s + self.epoch_time,  # goes on after it
                                applied=r.applied + self.step)
                reason = hooks.should_stop()
                if reason:
                    r.status = reason
                    break
            if r.status not in (Status.COMPLETED, Status.TIME_BUDGET, Status.DIVERGED):
                hooks.on_checkpoint(self.snapshot())  # mid-epoch: resume continues here
                return r
            if r.status == Status.TIME_BUDGET:  # before the cut epoch is recorded: a resume ends it
                hooks.on_checkpoint(self.snapshot())
            self._record_epoch(hooks)
            if r.status != Status.COMPLETED:
                return r
            self.order, self.epoch = None, self.epoch + 1
            if checkpoint_due(self.epoch, cfg.epochs, checkpoint_every):
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
            train_loss=results.mean_step_loss(self.losses[:step], cfg.batch_size, samples),
            test_accuracy=test_accuracy(self.model, r.params, self.data, r),
            wall_s=r.train_time_s,
            samples_per_s=samples / max(self.epoch_time, 1e-9),
            complete=step == self.steps,
            staleness_hist=[step],
        )
        r.epochs.append(record)
        if cfg.eval_every:
            record_eval(r, self.model, self.data, r.params, seconds=r.train_time_s,
                        applied=r.applied, accuracy=record.test_accuracy)
        hooks.on_epoch_end(record)


def train(model: Model, data: Dataset, cfg: TrainConfig, hooks: Hooks | None = None, *,
          resume: Snapshot | None = None, checkpoint_every: int = 0,
          address: str | None = None) -> RunResult:
    """Run the algorithm that cfg.algo names, from the start or from a
    snapshot of the same configuration, on this machine's threads or (with
    cfg.backend "ray") on the Ray cluster at `address` (None: a local one).
    ConfigError on a configuration or data no run can use;
    iasgd.executors.ray_cluster.ClusterError when the cluster cannot run it."""
    cfg.check()
    check_data(model, data, cfg)
    if cfg.backend == "ray":
        from iasgd.executors.ray_cluster import RayRun  # Ray is an optional extra

        return RayRun(model, data, cfg, resume, address).run(hooks or Hooks(), checkpoint_every)
    runner = ThreadedRun if ALGORITHMS[cfg.algo].parallel else _SequentialRun
    return runner(model, data, cfg, resume).run(hooks or Hooks(), checkpoint_every)
