"""The configuration of a training run and its validation.

Errors name the fields as written in Python (`y_min`); the CLI shows the
same message with its flags (`--y-min`), so a knob has one name from the
command line to the results file.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

from iasgd import options as O
from iasgd import schedules as S
from iasgd.algorithms import ALGORITHMS, POLICIES, VARIANTS
from iasgd.nn.augment import AUGMENTS
from iasgd.nn.plan import ALL_TRAINED, Sgd
from iasgd.options import Applies, option
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
        return O.as_fields(self.template)

    def for_cli(self) -> str:
        return O.as_flags(self.template)


BACKENDS = ("threads", "ray")
MAX_THREADS = 1024  # far beyond any CPU this runs on; a typo guard
# The --help groups of TrainConfig's options (iasgd.run adds its own around them).
TRAINING = "training"
ADAPTIVE = "adaptive strategies (defaults: the paper's artifact)"
CLUSTER = "cluster (nodes of --threads threads on Ray; docs/cluster.md)"


# Where the options that are not for every run have an effect (docs/cli.md's
# "applies to" column); one set anywhere else is refused (TrainConfig.check).
def _schedule_is(*names: str) -> Applies:
    return Applies("{interval_schedule} " + ", ".join(names),
                   lambda c: c.interval_schedule in names)


# a thread count alone means a parallel run was meant: say how to ask for one
PARALLEL = Applies("{algo} " + ", ".join(a.name for a in ALGORITHMS.values() if a.parallel),
                   lambda c: ALGORITHMS[c.algo].parallel,
                   fix="for a parallel run add {variant} interval-budget (the one to use) or "
                       "one of those, else remove {option}")
STALE = Applies("{algo} " + ", ".join(a.name for a in ALGORITHMS.values() if a.stale),
                lambda c: ALGORITHMS[c.algo].stale)
INTERVAL = Applies("{algo} interval", lambda c: ALGORITHMS[c.algo].bound == "interval")
MOVING_Y = Applies("{interval_schedule} other than fixed", lambda c: c.interval_schedule != "fixed")
THREAD_WINDOW = Applies("{threads_schedule} window", lambda c: c.threads_schedule == "window")
PROBES = Applies("{interval_schedule} probe or {threads_schedule} window",
                 lambda c: c.interval_schedule == "probe" or c.threads_schedule == "window")
LOSS_READERS = Applies("{interval_schedule} probe, follow-loss or {threads_schedule} window",
                       lambda c: c.interval_schedule in ("probe", "follow-loss")
                       or c.threads_schedule == "window")
TAIL = Applies("{lr_schedule} tail", lambda c: c.lr_schedule == "tail")
WITH_MOMENTUM = Applies("{momentum} > 0", lambda c: c.momentum > 0)
CROP = Applies("{augment} crop or crop,flip",
              lambda c: AUGMENTS.get(c.augment, (False, False))[0])
# a node of a cluster counts its own updates, not the run's
THIS_MACHINE = Applies("{backend} threads", lambda c: c.backend == "threads")
RAY = Applies("{backend} ray", lambda c: c.backend == "ray")
RAY_INTERVAL = Applies("{backend} ray with {algo} interval",
                       lambda c: c.backend == "ray" and ALGORITHMS[c.algo].bound == "interval")


def describe_variant(name: str) -> str:
    """A variant's fields as flags: "--algo interval --lr-schedule tail"."""
    return " ".join(f"{O.flag(k)} {v}" for k, v in VARIANTS[name].items())


def variant_conflict(variant: str, name: str, value: object) -> ConfigError:
    """Field `name` set to `value` beside a variant that sets it otherwise."""
    return ConfigError(f"{{variant}} {variant} is {describe_variant(variant)}; {{{name}}} "
                       f"{value} contradicts it: drop one")


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a training run, each declared with its command-line
    option (iasgd.options): field `a_b` is `--a-b`."""

    algo: str = option("sequential", "; ".join(f"{a.name}: {a.help}" for a in ALGORITHMS.values()),
                       group=TRAINING, choices=ALGORITHMS)
    variant: str | None = option(
        None, "a named configuration: the options it stands for, which a flag beside it may "
              "repeat but not change: "
              + "; ".join(f"{name}: {describe_variant(name)}" for name in VARIANTS),
        group=TRAINING, choices=VARIANTS, default_text="none")
    threads: int = option(1, f"worker threads n (at most {MAX_THREADS})", group=TRAINING,
                          parse=O.positive_int, applies=PARALLEL)
    interval: int = option(16, "interval size y of --algo interval: staleness stays <= y - 1",
                           group=TRAINING, metavar="Y", parse=O.positive_int, applies=INTERVAL)
    gate: str = option("wait", "interval policy; " + "; ".join(f"{p.name}: {p.help}"
                                                               for p in POLICIES.values()),
                       group=TRAINING, choices=POLICIES, applies=INTERVAL)
    batch_size: int = option(16, "mini-batch size b", group=TRAINING, parse=O.positive_int)
    lr: float = option(0.005, "step size eta", group=TRAINING, parse=O.positive_float)
    momentum: float = option(0.5, "heavy-ball momentum in [0, 1)", group=TRAINING,
                             parse=O.below_one)
    nesterov: bool = option(False, "Nesterov momentum, as torch.optim.SGD's nesterov=True",
                            group=TRAINING, applies=WITH_MOMENTUM)
    weight_decay: float = option(
        0.0, "L2 penalty: weight_decay * parameters added to every gradient before momentum, "
             "as torch.optim.SGD's weight_decay", group=TRAINING, metavar="WD",
        parse=O.nonneg_float)
    label_smoothing: float = option(
        0.0, "label smoothing eps in [0, 1) of the cross-entropy, as "
             "nn.CrossEntropyLoss's label_smoothing: the target is 1 - eps on the label plus "
             "eps / classes on every class", group=TRAINING, metavar="EPS", parse=O.below_one)
    augment: str = option(
        "none", "random augmentation of every training sample, as torchvision's "
                "RandomCrop(W, padding=--crop-padding) then RandomHorizontalFlip() on the uint8 "
                "image: crop (a random shift, zero padding), flip (mirrored with probability "
                "1/2) or crop,flip (both); drawn from the run's random streams, so a seed fixes "
                "them", group=TRAINING, choices=AUGMENTS, metavar="KIND")
    crop_padding: int = option(
        4, "the random crop's zero padding: the image shifts by up to N pixels each way",
        group=TRAINING, metavar="N", parse=O.positive_int, applies=CROP)
    lr_decay: str = option(
        "none", "the step size over the run's planned updates (--epochs of them): none "
                "(constant); cosine: lr (1 + cos(pi x)) / 2; linear: lr (1 - x); x the fraction "
                "of the updates after the warm-up done", group=TRAINING, choices=S.LR_DECAYS,
        applies=THIS_MACHINE)
    lr_warmup: float = option(
        0.0, "the first FRACTION of the planned updates raise the step size linearly to lr "
             "((k + 1) / W of it at update k of W)", group=TRAINING, metavar="FRACTION",
        parse=O.below_one, applies=THIS_MACHINE)
    epochs: int = option(3, "epochs of ceil(N_train / b) applied updates", group=TRAINING,
                         parse=O.positive_int)
    time_budget: float | None = option(
        None, "stop after this much training time (evaluation excluded)", group=TRAINING,
        metavar="SECONDS", parse=O.positive_float, default_text="no limit")
    seed: int = option(0, "seed of initialisation and shuffling (>= 0)", group=TRAINING,
                       parse=O.nonneg_int)
    eval_every: int = option(
        0, "also measure the test accuracy every N applied updates, outside the training "
           "clock, into the results' evals (0: at epoch ends only)",
        group=TRAINING, metavar="N", parse=O.nonneg_int)
    # schedules of y (docs/algorithms.md)
    interval_schedule: str = option(
        "fixed", "how y moves while training: fixed (--interval throughout); decay (y falls by "
                 "--decay-by every --decay-every updates, down to --y-min); probe (tries the y "
                 "values around the current one and keeps the one whose loss falls fastest); "
                 "follow-loss (y shrinks with the smoothed training loss against loss_first, "
                 "its value at the end of epoch 1, down to --y-min); per-worker (--interval "
                 "per active worker); budget (per-worker while the workers' own staleness "
                 "fits --staleness-budget, the budget's y beyond)",
        group=ADAPTIVE, choices=S.INTERVAL_SCHEDULES, applies=INTERVAL)
    y0: int | None = option(None, "starting y of a schedule", group=ADAPTIVE,
                            parse=O.positive_int, default_text="--interval", applies=MOVING_Y)
    y_min: int = option(4, "smallest y a schedule uses", group=ADAPTIVE, parse=O.positive_int,
                        applies=_schedule_is("decay", "probe", "follow-loss", "budget"))
    decay_every: int = option(4096, "decay: applied updates between decrements", group=ADAPTIVE,
                              metavar="Q", parse=O.positive_int, applies=_schedule_is("decay"))
    decay_by: int = option(1, "decay: decrement of y", group=ADAPTIVE, metavar="Z",
                           parse=O.positive_int, applies=_schedule_is("decay"))
    probe_offset: int = option(16, "probe: half-width of the probe window", group=ADAPTIVE,
                               metavar="W", parse=O.positive_int, applies=_schedule_is("probe"))
    probe_step: int = option(4, "probe: distance between probed values", group=ADAPTIVE,
                             metavar="S", parse=O.positive_int, applies=_schedule_is("probe"))
    probe_steps: int = option(1024, "probe and thread window: applied updates per probed value",
                              group=ADAPTIVE, metavar="P", parse=O.positive_int, applies=PROBES)
    exec_steps: int = option(8192, "probe and thread window: applied updates per execute phase",
                             group=ADAPTIVE, metavar="X", parse=O.positive_int, applies=PROBES)
    probe_loss_scale: float = option(
        0.9, "probe: how much the training loss narrows each new window: its half-width is "
             "scaled by s = L * loss / loss_first + (1 - L), loss_first being the smoothed "
             "loss at the end of epoch 1", group=ADAPTIVE,
        metavar="L", parse=O.unit_float, applies=_schedule_is("probe"))
    staleness_budget: float = option(
        0.15, "budget: how far the parameters may move between a gradient's read and its "
              "apply, in steps of lr / (1 - momentum); y = 1 + floor(B (1 - momentum) / lr) "
              "once the m active workers' own staleness, about 2 (m - 1), exceeds y - 1; "
              "--interval per worker until then",
        group=ADAPTIVE, metavar="B", parse=O.positive_float, applies=_schedule_is("budget"))
    loss_window: int | None = option(
        None, "probe, follow-loss and the thread window: applied updates over which the "
              "training loss they read is averaged", group=ADAPTIVE, metavar="STEPS",
        parse=O.positive_int, default_text="3 epochs", applies=LOSS_READERS)
    # adaptive thread count
    threads_schedule: str = option(
        "fixed", "window: probe the number of active threads m (elastic baseline); cores: run "
                 "one thread per core the run has and park the rest",
        group=ADAPTIVE, choices=S.THREAD_SCHEDULES, applies=STALE)
    window: int = option(8, "thread window: m is probed over m0 - w/2 .. m0 + w/2, clipped to "
                            "[1, --threads]", group=ADAPTIVE, metavar="w", parse=O.positive_int,
                         applies=THREAD_WINDOW)
    m0: int | None = option(None, "thread window: starting m", group=ADAPTIVE,
                            parse=O.positive_int, default_text="--threads",
                            applies=THREAD_WINDOW)
    # staleness-adaptive step size
    lr_schedule: str = option(
        "none", "staleness-adaptive step size, a factor of lr for an update of staleness tau: "
                "inverse 1/(tau+1); fleet (FLeet) exp(-beta tau), beta = 2 ln(1 + (n+1)/2) / "
                "(n+1) for n --threads (inverse's factor at tau = (n+1)/2); tail (TAIL-tau) "
                "1 + A (1 - 2 F(tau)), F the staleness distribution of the first updates",
        group=ADAPTIVE, choices=S.LR_SCHEDULES, applies=STALE)
    tail_amplitude: float = option(1.0, "tail: A of the factor 1 + A (1 - 2 F(tau))",
                                   group=ADAPTIVE, metavar="A", parse=O.unit_float, applies=TAIL)
    # where the threads run (iasgd.executors.cluster; docs/cluster.md)
    backend: str = option(
        "threads", "threads: this machine; ray: --nodes nodes exchanging updates with a "
                   "parameter server (needs pip install -e '.[ray]')",
        group=CLUSTER, choices=BACKENDS)
    nodes: int = option(2, "ray: node actors, each training with --threads threads",
                        group=CLUSTER, parse=O.positive_int, applies=RAY)
    sync_every: int = option(16, "ray: updates a node applies between its exchanges with the "
                                 "server", group=CLUSTER, metavar="K", parse=O.positive_int,
                             applies=RAY)
    node_interval: int | None = option(
        None, "ray, --algo interval: y over node pushes, so staleness between nodes stays "
              "<= y - 1", group=CLUSTER, metavar="Y", parse=O.positive_int,
        default_text="--nodes", applies=RAY_INTERVAL)
    node_gate: str = option("wait", "ray, --algo interval: the cluster gate's policy (as --gate)",
                            group=CLUSTER, choices=POLICIES, applies=RAY_INTERVAL)

    def __post_init__(self) -> None:
        """Fill in the fields the variant sets that are left at their defaults
        (one set to another value contradicts it: check() refuses it), then
        check. The command line refuses a flag that names a field the variant
        sets with another value, even its default."""
        if self.variant in VARIANTS:
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            for name, value in VARIANTS[self.variant].items():
                if getattr(self, name) == defaults[name]:
                    object.__setattr__(self, name, value)
        self.check()

    @property
    def start_y(self) -> int:
        return self.y0 if self.y0 is not None else self.interval

    def planned_updates(self, n_train: int) -> int:
        """The updates the run's --epochs make on n_train samples."""
        return self.epochs * steps_per_epoch(n_train, self.batch_size)

    def sgd(self, n_train: int, trained: int = ALL_TRAINED) -> Sgd:
        """The step's hyper-parameters as the compiled code takes them, the
        step size's schedule planned over --epochs of n_train samples, for a
        model whose first `trained` parameters are trained (Model.num_trained;
        running statistics follow)."""
        planned = self.planned_updates(n_train)
        return Sgd(float(self.lr), float(self.momentum), float(self.weight_decay),
                   bool(self.nesterov), float(self.label_smoothing),
                   S.LR_DECAYS.index(self.lr_decay), round(self.lr_warmup * planned), planned,
                   int(trained))

    def over_budget(self, seconds: float) -> bool:
        """`seconds` of training have spent the time budget."""
        return self.time_budget is not None and seconds >= self.time_budget

    def check(self) -> None:
        """Raise ConfigError (one line) on a value or combination no run can use."""
        choices = {"algo": ALGORITHMS, "gate": POLICIES, "node_gate": POLICIES,
                   "backend": BACKENDS, "variant": {None: None, **VARIANTS},
                   "interval_schedule": S.INTERVAL_SCHEDULES,
                   "threads_schedule": S.THREAD_SCHEDULES, "lr_schedule": S.LR_SCHEDULES,
                   "lr_decay": S.LR_DECAYS, "augment": AUGMENTS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"unknown {{{name}}} {getattr(self, name)!r}; "
                                  f"choose from {', '.join(allowed)}")
        for name in ("batch_size", "epochs", "threads", "interval", "y_min", "decay_every",
                     "decay_by", "probe_offset", "probe_step", "probe_steps", "exec_steps",
                     "window", "nodes", "sync_every", "node_interval", "crop_padding"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{{{name}}} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{{{name}}} must be >= 0, got {getattr(self, name)}")
        if self.threads > MAX_THREADS:
            raise ConfigError(f"{{threads}} {self.threads} is more than {MAX_THREADS}; use at "
                              "most a few times the number of cores")
        for name in ("interval", "y0", "node_interval"):
            if (getattr(self, name) or 0) > G.MAX_Y:
                raise ConfigError(f"{{{name}}} must be <= {G.MAX_Y}, got {getattr(self, name)}")
        for name in ("lr", "momentum", "time_budget", "weight_decay", "label_smoothing",
                     "lr_warmup"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{{{name}}} must be a finite number >= 0, got {value}")
        for name in ("momentum", "label_smoothing", "lr_warmup"):
            if getattr(self, name) >= 1:
                raise ConfigError(f"{{{name}}} must be below 1, got {getattr(self, name)}")
        if self.backend == "ray" and not ALGORITHMS[self.algo].parallel:
            raise ConfigError(f"{{backend}} ray runs a parallel {{algo}}, not {self.algo}; "
                              "pick one of " + ", ".join(a for a in ALGORITHMS
                                                         if ALGORITHMS[a].parallel))
        self._check_variant()
        self.check_applies([f.name for f in dataclasses.fields(self)
                            if getattr(self, f.name) != f.default])
        self._check_schedules()

    def check_applies(self, names: list[str]) -> None:
        """ConfigError unless each field of `names` has an effect on this run
        (the command line asks this of the options it was given, whatever
        their values; check() of those that differ from their defaults)."""
        found = O.inapplicable(TrainConfig, self, names)
        if found is not None:
            raise ConfigError(O.does_nothing(*found))

    def _check_variant(self) -> None:
        for name, value in VARIANTS.get(self.variant, {}).items():
            if getattr(self, name) != value:
                raise variant_conflict(self.variant, name, getattr(self, name))

    def _check_schedules(self) -> None:
        if self.interval_schedule != "fixed":
            if (self.interval_schedule == "probe"
                    and self.start_y + self.probe_offset < self.y_min):
                raise ConfigError(f"the probe window {{y0}} {self.start_y} +- {{probe_offset}} "
                                  f"{self.probe_offset} lies wholly below {{y_min}} {self.y_min}")
            if (self.interval_schedule not in ("per-worker", "budget")
                    and self.y_min > self.start_y):
                raise ConfigError(f"{{y_min}} {self.y_min} is above {{y0}} {self.start_y}")
        if self.m0 is not None and not 1 <= self.m0 <= self.threads:
            raise ConfigError(f"{{m0}} {self.m0} must lie in [1, {{threads}} {self.threads}]")
        for name in ("probe_loss_scale", "tail_amplitude"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{{{name}}} must be in [0, 1], got {getattr(self, name)}")
        if not (math.isfinite(self.staleness_budget) and self.staleness_budget > 0):
            raise ConfigError(f"{{staleness_budget}} must be a finite number > 0, got "
                              f"{self.staleness_budget}")
        if self.loss_window is not None and self.loss_window < 1:
            raise ConfigError(f"{{loss_window}} must be >= 1, got {self.loss_window}")


def config_where_it_applies(**fields: object) -> TrainConfig:
    """The TrainConfig of `fields`, less those that would do nothing in it:
    a sweep gives its knobs once for every algorithm it compares."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    while True:
        # judged against the run the variant makes (its algorithm, its schedules)
        made = VARIANTS.get(fields.get("variant"), {})  # type: ignore[call-overload]
        run = SimpleNamespace(**{**defaults, **made, **fields})
        found = O.inapplicable(TrainConfig, run, [k for k, v in fields.items()
                                                  if v != defaults[k]])
        if found is None:
            return TrainConfig(**fields)
        fields = {k: v for k, v in fields.items() if k != found[0]}


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
