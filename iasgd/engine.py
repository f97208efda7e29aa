"""Training: `train` runs a configuration with the executor its algorithm and
backend need, and is the one entry point of the Python API. It validates,
picks the executor and nothing else; what an epoch is, is written once in
iasgd.executors.epochs.

- sequential (iasgd.executors.sequential): one thread, mini-batch SGD with
  momentum, the training set reshuffled every epoch; bit-reproducible;
- the parallel algorithms: real threads (iasgd.executors.threads), nodes on a
  Ray cluster (iasgd.executors.ray_cluster, with `cfg.backend` "ray"), or
  simulated workers (iasgd.executors.simulated.simulate).
"""

from __future__ import annotations

import numpy as np

from iasgd.algorithms import ALGORITHMS
from iasgd.checkpoints import CheckpointError, check_fits, misfit
from iasgd.config import ConfigError, TrainConfig, check_data, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors import precompile
from iasgd.executors.sequential import SequentialRun
from iasgd.executors.threads import ThreadedRun, usable_cores
from iasgd.nn.models import Model
from iasgd.results import HIST_BINS, EpochRecord, Hooks, Live, RunResult, Snapshot, Status

__all__ = ["HIST_BINS", "CheckpointError", "ConfigError", "EpochRecord", "Hooks", "Live",
           "RunResult", "Snapshot", "Status", "TrainConfig", "check_data", "check_resume",
           "steps_per_epoch", "train"]

# What the resume of every executor reads from a snapshot's metadata: all
# that is checked of a Ray run's (iasgd.executors.ray_cluster) before it
# starts its cluster, besides the parameters.
RESUME_META = {"epoch": int, "epoch_time": float, "result": dict}


def train(model: Model, data: Dataset, cfg: TrainConfig, hooks: Hooks | None = None, *,
          resume: Snapshot | None = None, checkpoint_every: int = 0,
          address: str | None = None, init: np.ndarray | None = None) -> RunResult:
    """Run the algorithm that cfg.algo names, from the start (the model's
    initialisation with cfg.seed, or the (P,) parameters `init`, e.g. from
    iasgd.export.load_weights) or from a snapshot of the same configuration,
    on this machine's threads or (with cfg.backend "ray") on the Ray cluster
    at `address` (None: a local one).
    ConfigError on a configuration or data no run can use; CheckpointError
    on a snapshot this run cannot continue (check_resume, and each
    executor's check of the arrays it restores);
    iasgd.executors.ray_cluster.ClusterError when the cluster cannot run it."""
    cfg.check()
    check_data(model, data, cfg)
    if resume is not None:
        check_resume(model, cfg, resume)
    if init is not None:
        check_init(model, init, resume)
    if cfg.backend == "ray":
        from iasgd.executors.ray_cluster import RayRun  # Ray is an optional extra

        return RayRun(model, data, cfg, resume, address, init).run(hooks or Hooks(),
                                                                   checkpoint_every)
    runner = _runner(cfg)
    # an empty numba cache: compile side by side in child processes first
    precompile.compile_ahead(model, cfg.algo, lambda: runner(model, data, cfg, resume, init),
                             usable_cores())
    try:
        return runner(model, data, cfg, resume, init).run(hooks or Hooks(), checkpoint_every)
    finally:  # a run stopped before it evaluated: the evaluation's child still caches it
        precompile.finish_deferred()


def check_init(model: Model, init: np.ndarray, resume: Snapshot | None) -> None:
    """ConfigError (one line) unless `init` can start a run of `model`."""
    if resume is not None:
        raise ConfigError("a run starts from given parameters or resumes a checkpoint, not "
                          "both")
    if init.shape != (model.num_params,) or init.dtype != np.float32:
        raise ConfigError(f"the starting parameters are {init.dtype} {init.shape}; the model "
                          f"needs float32 ({model.num_params},)")


def check_resume(model: Model, cfg: TrainConfig, snapshot: Snapshot) -> None:
    """Raise CheckpointError (one line) unless `snapshot` was taken on cfg's
    backend and holds the metadata its executor reads and parameters of this
    model's size. Cheap and needs no data: the executor checks the rest of
    the arrays it restores, against its own, before it runs."""
    saved = snapshot.meta.get("backend", "threads") if isinstance(snapshot.meta, dict) else None
    if saved is not None and saved != cfg.backend:
        raise misfit(f"it was saved by a run on backend {saved}, this run's is {cfg.backend}")
    meta = RESUME_META if cfg.backend == "ray" else _runner(cfg).RESUME_META
    check_fits(snapshot, meta, {"params": ((model.num_params,), np.dtype(np.float32))})


def _runner(cfg: TrainConfig) -> type[ThreadedRun] | type[SequentialRun]:
    """The executor of cfg.algo on this machine."""
    return ThreadedRun if ALGORITHMS[cfg.algo].parallel else SequentialRun
