"""The configuration of a training run and its validation.

Errors name the fields as written in Python (`y_min`); the CLI shows the
same message with its flags (`--y-min`), so a knob has one name from the
command line to the results file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from iasgd import options as O
from iasgd import schedules as S
from iasgd.algorithms import ALGORITHMS, POLICIES
from iasgd.options import option
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
        return _FIELD.sub(lambda m: O.flag(m.group(1)), self.template)


_FIELD = re.compile(r"\{([a-z0-9_]+)\}")
BACKENDS = ("threads", "ray")
MAX_THREADS = 1024  # far beyond any CPU this runs on; a typo guard
# The --help groups of TrainConfig's options (iasgd.run adds its own around them).
TRAINING = "training"
ADAPTIVE = "adaptive strategies (defaults: the paper's artifact)"
CLUSTER = "cluster (nodes of --threads threads on Ray; docs/cluster.md)"


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a training run, each declared with its command-line
    option (iasgd.options): field `a_b` is `--a-b`."""

    algo: str = option("sequential", "; ".join(f"{a.name}: {a.help}" for a in ALGORITHMS.values()),
                       group=TRAINING, choices=ALGORITHMS)
    threads: int = option(1, f"worker threads n (at most {MAX_THREADS})", group=TRAINING,
                          parse=O.positive_int)
    interval: int = option(16, "interval size y of --algo interval: staleness stays <= y - 1",
                           group=TRAINING, metavar="Y", parse=O.positive_int)
    gate: str = option("wait", "interval policy; " + "; ".join(f"{p.name}: {p.help}"
                                                               for p in POLICIES.values()),
                       group=TRAINING, choices=POLICIES)
    batch_size: int = option(16, "mini-batch size b", group=TRAINING, parse=O.positive_int)
    lr: float = option(0.005, "step size eta", group=TRAINING, parse=O.positive_float)
    momentum: float = option(0.5, "heavy-ball momentum in [0, 1)", group=TRAINING,
                             parse=O.below_one)
    epochs: int = option(3, "epochs of ceil(N_train / b) applied updates", group=TRAINING,
                         parse=O.positive_int)
    time_budget: float | None = option(
        None, "stop after this much training time (evaluation excluded)", group=TRAINING,
        metavar="SECONDS", parse=O.positive_float, default_text="no limit")
    seed: int = option(0, "seed of initialisation and shuffling", group=TRAINING,
                       parse=O.integer)
    eval_every: int = option(
        0, "also measure the test accuracy every N applied updates, outside the training "
           "clock, into the results' evals (0: at epoch ends only)",
        group=TRAINING, metavar="N", parse=O.nonneg_int)
    # schedules of y (docs/algorithms.md)
    interval_schedule: str = option("fixed", "how y moves while training (algo interval)",
                                    group=ADAPTIVE, choices=S.INTERVAL_SCHEDULES)
    y0: int | None = option(None, "starting y of a schedule", group=ADAPTIVE,
                            parse=O.positive_int, default_text="--interval")
    y_min: int = option(4, "smallest y a schedule uses", group=ADAPTIVE, parse=O.positive_int)
    decay_every: int = option(4096, "decay: applied updates between decrements", group=ADAPTIVE,
                              metavar="Q", parse=O.positive_int)
    decay_by: int = option(1, "decay: decrement of y", group=ADAPTIVE, metavar="Z",
                           parse=O.positive_int)
    probe_offset: int = option(16, "probe: half-width of the probe window", group=ADAPTIVE,
                               metavar="W", parse=O.positive_int)
    probe_step: int = option(4, "probe: distance between probed values", group=ADAPTIVE,
                             metavar="S", parse=O.positive_int)
    probe_steps: int = option(1024, "probe and thread window: applied updates per probed value",
                              group=ADAPTIVE, metavar="P", parse=O.positive_int)
    exec_steps: int = option(8192, "probe and thread window: applied updates per execute phase",
                             group=ADAPTIVE, metavar="X", parse=O.positive_int)
    probe_loss_scale: float = option(
        0.9, "probe: window scale s = L * loss/loss_first + (1 - L)", group=ADAPTIVE,
        metavar="L", parse=O.unit_float)
    staleness_budget: float = option(
        0.15, "budget: how far the parameters may move between a gradient's read and its "
              "apply, in steps of lr / (1 - momentum); y = 1 + floor(B (1 - momentum) / lr) "
              "once the m active workers' own staleness, about 2 (m - 1), exceeds y - 1; "
              "--interval per worker until then",
        group=ADAPTIVE, metavar="B", parse=O.positive_float)
    loss_window: int | None = option(None, "steps in the smoothed training loss", group=ADAPTIVE,
                                     metavar="STEPS", parse=O.positive_int,
                                     default_text="3 epochs")
    # adaptive thread count
    threads_schedule: str = option(
        "fixed", "window: probe the number of active threads m (elastic baseline); cores: run "
                 "one thread per core the run has and park the rest",
        group=ADAPTIVE, choices=S.THREAD_SCHEDULES)
    window: int = option(8, "thread window: m is probed over m0 - w/2 .. m0 + w/2, clipped to "
                            "[1, --threads]", group=ADAPTIVE, metavar="w", parse=O.positive_int)
    m0: int | None = option(None, "thread window: starting m", group=ADAPTIVE,
                            parse=O.positive_int, default_text="--threads")
    # staleness-adaptive step size
    lr_schedule: str = option(
        "none", "staleness-adaptive step size: factor 1/(tau+1), exp(-beta tau), or TAIL-tau "
                "from the early staleness distribution", group=ADAPTIVE, choices=S.LR_SCHEDULES)
    tail_amplitude: float = option(1.0, "tail: factor 1 + A (1 - 2 F(tau))", group=ADAPTIVE,
                                   metavar="A", parse=O.unit_float)
    # where the threads run (iasgd.executors.cluster; docs/cluster.md)
    backend: str = option(
        "threads", "threads: this machine; ray: --nodes nodes exchanging updates with a "
                   "parameter server (needs pip install -e '.[ray]')",
        group=CLUSTER, choices=BACKENDS)
    nodes: int = option(2, "ray: node actors, each training with --threads threads",
                        group=CLUSTER, parse=O.positive_int)
    sync_every: int = option(16, "ray: updates a node applies between its exchanges with the "
                                 "server", group=CLUSTER, metavar="K", parse=O.positive_int)
    node_interval: int | None = option(
        None, "ray, --algo interval: y over node pushes, so staleness between nodes stays "
              "<= y - 1", group=CLUSTER, metavar="Y", parse=O.positive_int,
        default_text="--nodes")
    node_gate: str = option("wait", "ray, --algo interval: the cluster gate's policy (as --gate)",
                            group=CLUSTER, choices=POLICIES)

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
            if (self.interval_schedule not in ("per-worker", "budget")
                    and self.y_min > self.start_y):
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
        if not (math.isfinite(self.staleness_budget) and self.staleness_budget > 0):
            raise ConfigError(f"{{staleness_budget}} must be a finite number > 0, got "
                              f"{self.staleness_budget}")
        if self.loss_window is not None and self.loss_window < 1:
            raise ConfigError(f"{{loss_window}} must be >= 1, got {self.loss_window}")


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
