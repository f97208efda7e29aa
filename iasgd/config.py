"""The configuration of a training run and its validation.

Errors name the fields as written in Python (`y_min`); the CLI shows the
same message with its flags (`--y-min`), so a knob has one name from the
command line to the results file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from iasgd import schedules as S
from iasgd.algorithms import ALGORITHMS, POLICIES
from iasgd.protocol import gate as G

if TYPE_CHECKING:
    from iasgd.data import Dataset
    from iasgd.nn.models import Model


class ConfigError(ValueError):
    """A value or combination no run can use. The message names fields as
    `{field}`: str() shows `field`, for_cli() shows `--field`."""

    def __init__(self, template: str):
        super().__init__(template)
        self.template = template

    def __str__(self) -> str:
        return _FIELD.sub(lambda m: m.group(1), self.template)

    def for_cli(self) -> str:
        return _FIELD.sub(lambda m: "--" + m.group(1).replace("_", "-"), self.template)


_FIELD = re.compile(r"\{([a-z0-9_]+)\}")
BACKENDS = ("threads", "ray")


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a training run; the CLI option of field `a_b` is `--a-b`."""

    batch_size: int = 16
    lr: float = 0.005
    momentum: float = 0.5
    epochs: int = 3
    time_budget: float | None = None  # seconds of training, evaluation excluded
    seed: int = 0
    # evaluate the test accuracy every this many applied updates (0: at epoch
    # ends only), outside the training clock; into RunResult.evals
    eval_every: int = 0
    algo: str = "sequential"  # a name in iasgd.algorithms.ALGORITHMS
    threads: int = 1
    interval: int = 16  # y of a fixed interval size, and y0 of a schedule by default
    gate: str = "wait"  # interval policy, a name in iasgd.algorithms.POLICIES
    # schedules of y (docs/algorithms.md; defaults are the paper artifact's)
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
    # where the threads run: "threads" (this machine) or "ray" (nodes of
    # `threads` threads each, exchanging updates with a parameter server;
    # iasgd.executors.cluster)
    backend: str = "threads"
    nodes: int = 2  # ray: node actors (each trains with `threads` threads)
    sync_every: int = 16  # ray: K, updates a node applies between its exchanges
    node_interval: int | None = None  # ray, algo interval: y over node pushes (None: nodes)
    node_gate: str = "wait"  # ray, algo interval: the cluster gate's policy

    @property
    def start_y(self) -> int:
        return self.y0 if self.y0 is not None else self.interval

    def over_budget(self, seconds: float) -> bool:
        """`seconds` of training have spent the time budget."""
        return self.time_budget is not None and seconds >= self.time_budget

    def check(self) -> None:
        """Raise ConfigError (one line) on a value or combination no run can use."""
        choices = {"algo": ALGORITHMS, "gate": POLICIES, "node_gate": POLICIES,
                   "backend": BACKENDS,
                   "interval_schedule": S.INTERVAL_SCHEDULES,
                   "threads_schedule": S.THREAD_SCHEDULES, "lr_schedule": S.LR_SCHEDULES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"unknown {{{name}}} {getattr(self, name)!r}; "
                                  f"choose from {', '.join(allowed)}")
        for name in ("batch_size", "epochs", "threads", "interval", "y_min", "decay_every",
                     "decay_by", "probe_offset", "probe_step", "probe_steps", "exec_steps",
                     "window", "nodes", "sync_every", "node_interval"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{{{name}}} must be >= 1, got {getattr(self, name)}")
        if self.eval_every < 0:
            raise ConfigError(f"{{eval_every}} must be >= 0, got {self.eval_every}")
        for name in ("interval", "y0", "node_interval"):
            if (getattr(self, name) or 0) > G.MAX_Y:
                raise ConfigError(f"{{{name}}} must be <= {G.MAX_Y}, got {getattr(self, name)}")
        for name in ("lr", "momentum", "time_budget"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{{{name}}} must be a finite number >= 0, got {value}")
        if not ALGORITHMS[self.algo].parallel and self.threads != 1:
            parallel = ", ".join(a for a in ALGORITHMS if ALGORITHMS[a].parallel)
            raise ConfigError(f"{{algo}} {self.algo} runs one thread; pick {{algo}} one of "
                              f"{parallel} for {{threads}} > 1")
        if self.backend == "ray" and not ALGORITHMS[self.algo].parallel:
            raise ConfigError(f"{{backend}} ray runs a parallel {{algo}}, not {self.algo}; "
                              "pick one of " + ", ".join(a for a in ALGORITHMS
                                                         if ALGORITHMS[a].parallel))
        self._check_schedules()

    def _check_schedules(self) -> None:
        stale = ", ".join(a.name for a in ALGORITHMS.values() if a.stale)
        if self.interval_schedule != "fixed":
            if ALGORITHMS[self.algo].bound != "interval":
                raise ConfigError(f"{{interval_schedule}} {self.interval_schedule} applies to "
                                  "{algo} interval only")
            if (self.interval_schedule == "probe"
                    and self.start_y + self.probe_offset < self.y_min):
                raise ConfigError(f"the probe window {{y0}} {self.start_y} +- {{probe_offset}} "
                                  f"{self.probe_offset} lies wholly below {{y_min}} {self.y_min}")
            if self.y_min > self.start_y:
                raise ConfigError(f"{{y_min}} {self.y_min} is above {{y0}} {self.start_y}")
        if self.threads_schedule != "fixed" and not ALGORITHMS[self.algo].stale:
            raise ConfigError(f"{{threads_schedule}} {self.threads_schedule} applies to "
                              f"{{algo}} {stale}")
        if self.m0 is not None and not 1 <= self.m0 <= self.threads:
            raise ConfigError(f"{{m0}} {self.m0} must lie in [1, {{threads}} {self.threads}]")
        if self.lr_schedule != "none" and not ALGORITHMS[self.algo].stale:
            raise ConfigError(f"{{lr_schedule}} {self.lr_schedule} applies to {{algo}} {stale} "
                              "(the others have no staleness)")
        for name in ("probe_loss_scale", "tail_amplitude"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{{{name}}} must be in [0, 1], got {getattr(self, name)}")
        if self.loss_window is not None and self.loss_window < 1:
            raise ConfigError(f"{{loss_window}} must be >= 1, got {self.loss_window}")


FIELDS = tuple(f.name for f in fields(TrainConfig))


def eval_points(done: int, end: int, every: int) -> list[int]:
    """Where a stretch of updates from `done` to `end` (applied since the
    start of the run) stops: each multiple of `every` strictly between the
    two, then `end`. every 0: only `end`."""
    if every <= 0:
        return [end]
    return [*range((done // every + 1) * every, end, every), end]


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    """Updates in an epoch: ceil(n_train / batch_size)."""
    return math.ceil(n_train / batch_size)


def check_data(model: Model, data: Dataset, cfg: TrainConfig) -> None:
    """ConfigError (one line) if the data cannot train the model as configured."""
    if data.input_shape != model.input_shape:
        raise ConfigError(f"{data.name} images are {data.input_shape}, the model expects "
                          f"{model.input_shape}")
    if int(data.y_train.max(initial=0)) >= model.num_classes:
        raise ConfigError(f"{data.name} has labels up to {int(data.y_train.max())}, the model "
                          f"has {model.num_classes} classes")
    if cfg.batch_size > data.x_train.shape[0]:
        raise ConfigError(f"{{batch_size}} {cfg.batch_size} is larger than the training set "
                          f"({data.x_train.shape[0]:,} images)")
