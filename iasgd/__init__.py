"""iasgd: fast parallel SGD on the cores of one machine (and across machines
on Ray): Interval-Asynchrony and its baselines, with numba-compiled kernels.

The Python API, in one import:

    from iasgd import TrainConfig, build, load, train

    data = load("synthetic")                       # or "cifar10", ..., or "mine.npz"
    model = build("lenet", "synthetic")            # a preset or a layer spec
    result = train(model, data, TrainConfig(algo="interval", threads=4, epochs=1))
    print(result.epochs[-1].test_accuracy)

Layers, bottom up (docs/architecture.md): `nn` (kernels, models) and
`protocol` (atomics, gate, workers: compiled, nopython), `data`, then the
algorithm table, configuration, schedules and results at the top level, the
`executors` (sequential, threads, simulated, cluster, Ray) that drive the
protocol, `engine.train`, and the entry points `python -m iasgd.run` and
`python -m iasgd.plot`. The numba settings are in iasgd.compiled.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

# `python -m iasgd.run` imports this package first, then compiles and runs
# the command: Ctrl-C from here on is one line, not a traceback
# (iasgd.console). Only for that command: a library leaves signals alone.
_argv = getattr(sys, "orig_argv", [])
if "-m" in _argv and _argv[_argv.index("-m") + 1:][:1] == ["iasgd.run"]:
    from iasgd import console

    console.exit_quietly_while_importing()

# Where each name of the API lives. They load on first use, so that
# `python -m iasgd.run` can set up its Ctrl-C handling before numba loads.
_API = {"ConfigError": "iasgd.config", "TrainConfig": "iasgd.config",
        "DataError": "iasgd.data", "Dataset": "iasgd.data", "from_arrays": "iasgd.data",
        "load": "iasgd.data", "train": "iasgd.engine", "simulate": "iasgd.executors.simulated",
        "Model": "iasgd.nn.models", "build": "iasgd.nn.models",
        "EpochRecord": "iasgd.results", "Hooks": "iasgd.results", "RunResult": "iasgd.results",
        "Snapshot": "iasgd.results", "Status": "iasgd.results"}
__all__ = ["ConfigError", "DataError", "Dataset", "EpochRecord", "Hooks", "Model", "RunResult",
           "Snapshot", "Status", "TrainConfig", "build", "from_arrays", "load", "simulate",
           "train"]

if TYPE_CHECKING:
    from iasgd.config import ConfigError, TrainConfig
    from iasgd.data import DataError, Dataset, from_arrays, load
    from iasgd.engine import train
    from iasgd.executors.simulated import simulate
    from iasgd.nn.models import Model, build
    from iasgd.results import EpochRecord, Hooks, RunResult, Snapshot, Status


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'iasgd' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
