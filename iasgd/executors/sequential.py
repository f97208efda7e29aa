"""The sequential executor: plain mini-batch SGD with momentum on one thread,
the training set reshuffled every epoch (and, with --augment, each step's
samples augmented with codes from a stream of the seed, the epoch and the
step). Seeded and bit-reproducible; its
snapshot holds the position inside the epoch, so an interrupted run
resumes bit-identically.
"""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np

from iasgd.checkpoints import ArraySpec, check_fits
from iasgd.config import TrainConfig, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors import precompile
from iasgd.executors.base import EpochEnd, ExecutorBase, first_params
from iasgd.executors.epochs import train_in_chunks
from iasgd.nn import network as N
from iasgd.nn.augment import augment_argument, image_inputs
from iasgd.nn.models import Model
from iasgd.nn.plan import Steps, Weights, knobs_argument
from iasgd.results import Hooks, Live, RunResult, Snapshot, Status, mean_step_loss, result_meta

# A chunk of steps is one compiled call; between chunks Python updates the
# progress display and checks the time budget.
CHUNK_SECONDS = 0.1


def shuffle_streams(seed: int) -> np.random.Generator:
    """The shuffling stream of a run, independent of the init stream."""
    return np.random.default_rng(np.random.SeedSequence([seed, 1]))


def augment_seed(seed: int, epoch: int) -> np.uint64:
    """The seed of epoch `epoch`'s augmentation codes (iasgd.nn.augment.seed_step
    takes each step's stream from it), independent of the other streams."""
    return np.random.SeedSequence([seed, 3, epoch]).generate_state(1, np.uint64)[0]


class SequentialRun(ExecutorBase):
    """One thread (see module doc)."""

    # what a resume reads from a snapshot's metadata, with its JSON type
    RESUME_META: ClassVar[dict[str, type]] = {
        "epoch": int, "step": int, "epoch_time": float, "in_epoch": bool, "rng": dict,
        "result": dict}

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 resume: Snapshot | None = None, init: np.ndarray | None = None):
        self.model, self.data, self.cfg = model, data, cfg
        self.images = data.x_train.reshape(data.x_train.shape[0], -1)
        self.quota = steps_per_epoch(self.images.shape[0], cfg.batch_size)
        self.ws = model.workspace(cfg.batch_size)
        self.rng = shuffle_streams(cfg.seed)
        self.chunk = 16  # steps per compiled call; grows to about CHUNK_SECONDS of work
        if resume is None:
            params = first_params(model, cfg, init)
            self.velocity = np.zeros_like(params)
            self.losses = np.zeros(self.quota, np.float64)
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
            self.result = RunResult(status=Status.COMPLETED)
            self.restore_totals(meta["result"], a["params"], a["staleness_hist"])
        r = self.result
        self.weights = Weights(r.params, self.velocity)
        self.inputs = image_inputs(self.images, data.y_train, model.image_transform,
                                   model.input_shape, cfg.augment, cfg.crop_padding)
        self.augment = augment_argument(self.inputs)
        self.knobs = knobs_argument(cfg.sgd(self.images.shape[0], model.num_trained),
                                    model.num_params)

    def resume_arrays(self, in_epoch: bool) -> dict[str, ArraySpec]:
        """The shape and dtype of each array a resume takes from a snapshot;
        the compiled steps use them as they are, so they must be exact.
        in_epoch: the snapshot was taken inside an epoch (it holds the
        epoch's order of the training samples)."""
        params = ((self.model.num_params,), np.dtype(np.float32))
        return {"params": params, "velocity": params,
                "losses": ((self.quota,), np.dtype(np.float64)),
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
        N.train_steps(self.weights, self.ws.buffers, self.inputs,
                      Steps(np.arange(n_train, dtype=np.int64), 0, 0, self.cfg.batch_size,
                            self.cfg.sgd(n_train, self.model.num_trained), 0), self.losses,
                      self.augment, self.knobs)

    def start_run(self) -> None:
        precompile.load_kernels(self)

    def train_epoch(self, hooks: Hooks) -> int:
        r = self.result
        if self.order is None:
            self.order = self.rng.permutation(self.images.shape[0]).astype(np.int64)
            self.step, self.epoch_time = 0, 0.0
        self._hooks, self._reason = hooks, None
        train_in_chunks(self.applied_so_far, r.applied + self.quota, self.cfg.eval_every,
                        run_until=self._run_until, stopped=lambda: self._reason is not None,
                        out_of_time=lambda: self._reason == Status.TIME_BUDGET,
                        evaluate=self.evaluate_inside_epoch)
        if self._reason is not None:
            r.status = self._reason
        return self.step

    def _run_until(self, limit: int) -> None:
        """Compiled calls of `chunk` steps each until `limit` updates (since
        the start of the run) are applied, the parameters diverge or the
        monitor's tick between two calls says stop (self._reason)."""
        cfg, r = self.cfg, self.result
        while self.applied_so_far() < limit:
            count = min(self.chunk, limit - self.applied_so_far())
            t0 = time.perf_counter()
            steps = Steps(self.order, self.step, count, cfg.batch_size,
                          cfg.sgd(self.images.shape[0], self.model.num_trained), r.applied,
                          augment_seed(cfg.seed, self.epoch))
            done = N.train_steps(self.weights, self.ws.buffers, self.inputs, steps, self.losses,
                                 self.augment, self.knobs)
            dt = time.perf_counter() - t0
            self.epoch_time += dt
            self.step += done
            if done < count or not N.all_finite(r.params):
                self._reason = Status.DIVERGED
                r.diverged_at = {"epoch": self.epoch, "step": self.step + 1}
                return
            self.chunk = max(1, int(count * CHUNK_SECONDS / max(dt, 1e-9)))
            self._rate = count / max(dt, 1e-9)
            self._reason = self.tick(self._hooks)
            if self._reason:
                return

    def progress(self, seconds: float) -> tuple[int, Live]:
        return (min(self.step * self.cfg.batch_size, self.images.shape[0]),
                Live(updates_per_s=self._rate))

    def check_diverged(self) -> bool:
        """The parameters are checked after every compiled call (_run_until)."""
        return self._reason == Status.DIVERGED

    def params_now(self) -> np.ndarray:
        return self.result.params

    def applied_so_far(self) -> int:
        return self.result.applied + self.step

    def train_seconds(self) -> float:
        return self.result.train_time_s + self.epoch_time

    def exclude(self, seconds: float) -> None:
        """Nothing: epoch_time counts the compiled calls only."""

    def close_epoch(self, applied: int) -> EpochEnd:
        cfg, r = self.cfg, self.result
        samples = min(applied * cfg.batch_size, self.images.shape[0])
        r.train_time_s += self.epoch_time
        r.samples += samples
        r.computed += applied
        r.applied += applied
        r.staleness_hist[0] += applied
        return EpochEnd(r.params, self.epoch_time, r.train_time_s,
                        mean_step_loss(self.losses[:applied], cfg.batch_size, samples), samples,
                        [applied], r.applied)

    def next_epoch(self) -> None:
        self.order, self.epoch = None, self.epoch + 1

    def finish(self) -> None:
        """Nothing to gather: the result is kept up to date as the run goes."""
