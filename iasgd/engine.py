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

from iasgd.algorithms import ALGORITHMS
from iasgd.config import ConfigError, TrainConfig, check_data, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors.sequential import SequentialRun
from iasgd.executors.threads import ThreadedRun
from iasgd.nn.models import Model
from iasgd.results import HIST_BINS, EpochRecord, Hooks, Live, RunResult, Snapshot, Status

__all__ = ["HIST_BINS", "ConfigError", "EpochRecord", "Hooks", "Live", "RunResult", "Snapshot",
           "Status", "TrainConfig", "check_data", "steps_per_epoch", "train"]


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
    runner = ThreadedRun if ALGORITHMS[cfg.algo].parallel else SequentialRun
    return runner(model, data, cfg, resume).run(hooks or Hooks(), checkpoint_every)
