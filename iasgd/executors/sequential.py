"""The sequential executor: plain mini-batch SGD with momentum on one thread,
the training set reshuffled every epoch. Seeded and bit-reproducible; its
snapshot holds the position inside the epoch, so an interrupted run
resumes bit-identically.
"""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np

from iasgd.checkpoints import ArraySpec, check_fits
from iasgd.config import TrainConfig, eval_points, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors import precompile
from iasgd.executors.epochs import run_epochs
from iasgd.nn import kernels as K
from iasgd.nn.blas import single_threaded_blas
from iasgd.nn.models import Model
from iasgd.results import (
    EpochRecord,
    Hooks,
    Live,
    RunResult,
    Snapshot,
    Status,
    load_evaluation,
    mean_step_loss,
    record_eval,
    restore_result,
    result_meta,
    test_accuracy,
)

# A chunk of steps is one compiled call; between chunks Python updates the
# progress display and checks the time budget.
CHUNK_SECONDS = 0.1


def shuffle_streams(seed: int) -> np.random.Generator:
    """The shuffling stream of a run, independent of the init stream."""
    return np.random.default_rng(np.random.SeedSequence([seed, 1]))


class SequentialRun:
    """One thread (see module doc); an Executor of iasgd.executors.epochs."""

    # what a resume reads from a snapshot's metadata, with its JSON type
    RESUME_META: ClassVar[dict[str, type]] = {
        "epoch": int, "step": int, "epoch_time": float, "in_epoch": bool, "rng": dict,
        "result": dict}

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 resume: Snapshot | None = None, init: np.ndarray | None = None):
        self.model, self.data, self.cfg = model, data, cfg
        self.images = data.x_train.reshape(data.x_train.shape[0], -1)
        self.steps = steps_per_epoch(self.images.shape[0], cfg.batch_size)
        self.ws = model.workspace(cfg.batch_size)
        self.rng = shuffle_streams(cfg.seed)
        self.chunk = 16  # steps per compiled call; grows to about CHUNK_SECONDS of work
        if resume is None:
            params = model.init(cfg.seed) if init is None else init.copy()
            self.velocity = np.zeros_like(params)
            self.losses = np.zeros(self.steps, np.float64)
            self.order: np.ndarray | None = None  # this epoch's permutation, once drawn
            self.epoch, self.step, self.epoch_time = 1, 0, 0.0
            self.result = RunResult(status=Status.COMPLETED, params=params)
        else:
            check_fits(resume, self.RESUME_META)  # first: resume_arrays reads in_epoch
            check_fits(resume, arrays=self.resume_arrays(resume.meta["in_epoch"]))
            a, meta = resume.arrays, resume.meta
            self.velocity, self.losses = a["velocity"], a["losses"]
            self.order = a["order"] if meta["in_epoch"] else None
            self.epoch, self.step, self.epoch_time = meta["epoch"], meta["step"], meta["epoch_time"]
            self.rng.bit_generator.state = meta["rng"]
            self.result = restore_result(meta["result"], a["params"], a["staleness_hist"])
            self.result.status = Status.COMPLETED
        r = self.result
        self.weights = K.Weights(r.params, self.velocity)
        self.inputs = K.Images(self.images, data.y_train, *model.image_transform)

    def resume_arrays(self, in_epoch: bool) -> dict[str, ArraySpec]:
        """The shape and dtype of each array a resume takes from a snapshot;
        the compiled steps use them as they are, so they must be exact.
        in_epoch: the snapshot was taken inside an epoch (it holds the
        epoch's order of the training samples)."""
        params = ((self.model.num_params,), np.dtype(np.float32))
        return {"params": params, "velocity": params,
                "losses": ((self.steps,), np.dtype(np.float64)),
                "staleness_hist": ((1,), np.dtype(np.int64)),  # tau is always 0
                "order": ((self.images.shape[0] if in_epoch else 0,), np.dtype(np.int64))}

    def snapshot(self) -> Snapshot:
        r = self.result
        arrays = {"params": r.params, "velocity": self.velocity, "losses": self.losses,
                  "staleness_hist": r.staleness_hist,
                  "order": self.order if self.order is not None else np.zeros(0, np.int64)}
        meta = {"epoch": self.epoch, "step": self.step, "epoch_time": self.epoch_time,
                "in_epoch": self.order is not None, "rng": self.rng.bit_generator.state,
                "result": result_meta(r)}
        return Snapshot(arrays, meta)

    def load_steps(self) -> None:
        """Load (or compile) the steps: a call of zero steps."""
        n_train = self.images.shape[0]
        K.train_steps(self.weights, self.ws.buffers, self.inputs,
                      K.Steps(np.arange(n_train, dtype=np.int64), 0, 0, self.cfg.batch_size,
                              self.cfg.lr, self.cfg.momentum), self.losses)

    def load_evaluation(self) -> None:
        """Load (or compile) what the evaluation calls."""
        load_evaluation(self.model, self.data, self.result.params)

    def run(self, hooks: Hooks, checkpoint_every: int = 0) -> RunResult:
        precompile.load_kernels(self)
        with single_threaded_blas():  # the kernels' GEMMs: one core
            return run_epochs(self, hooks, checkpoint_every)

    def epoch_samples(self) -> int:
        return self.images.shape[0]

    def train_epoch(self, hooks: Hooks) -> int:
        cfg, r = self.cfg, self.result
        n_train = self.images.shape[0]
        if self.order is None:
            self.order = self.rng.permutation(n_train).astype(np.int64)
            self.step, self.epoch_time = 0, 0.0
        while self.step < self.steps:
            # a chunk ends at the next eval_every boundary (applied since the start)
            count = min(self.chunk, eval_points(r.applied + self.step, r.applied + self.steps,
                                                cfg.eval_every)[0] - r.applied - self.step)
            t0 = time.perf_counter()
            steps = K.Steps(self.order, self.step, count, cfg.batch_size, cfg.lr, cfg.momentum)
            done = K.train_steps(self.weights, self.ws.buffers, self.inputs, steps, self.losses)
            dt = time.perf_counter() - t0
            self.epoch_time += dt
            self.step += done
            if done < count or not K.all_finite(r.params):
                r.status = Status.DIVERGED
                r.diverged_at = {"epoch": self.epoch, "step": self.step + 1}
                break
            self.chunk = max(1, int(count * CHUNK_SECONDS / max(dt, 1e-9)))
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
        return self.step

    def record_epoch(self, hooks: Hooks, applied: int) -> None:
        cfg, r = self.cfg, self.result
        samples = min(applied * cfg.batch_size, self.images.shape[0])
        r.train_time_s += self.epoch_time
        r.samples += samples
        r.computed += applied
        r.applied += applied
        r.staleness_hist[0] += applied
        record = EpochRecord(
            epoch=self.epoch,
            train_loss=mean_step_loss(self.losses[:applied], cfg.batch_size, samples),
            test_accuracy=test_accuracy(self.model, r.params, self.data, r),
            wall_s=r.train_time_s,
            samples_per_s=samples / max(self.epoch_time, 1e-9),
            complete=applied == self.steps,
            staleness_hist=[applied],
        )
        r.epochs.append(record)
        if cfg.eval_every:
            record_eval(r, self.model, self.data, r.params, seconds=r.train_time_s,
                        applied=r.applied, accuracy=record.test_accuracy)
        hooks.on_epoch_end(record)

    def next_epoch(self) -> None:
        self.order, self.epoch = None, self.epoch + 1

    def finish(self) -> None:
        """Nothing to gather: the result is kept up to date as the run goes."""
