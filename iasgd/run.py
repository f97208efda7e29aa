"""Command line: `python -m iasgd.run [options]` trains one model and writes
its results JSON. `--help` lists every option with its default.

Bad input is one line on stderr and exit code 2, before any work is done.
The options travel typed from here on: a TrainConfig (checked where it is
made) and a RunOptions.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

import numpy as np

from iasgd import checkpoints, console, engine, export, files, results, resume
from iasgd import data as datasets
from iasgd import options as O
from iasgd import schedules as S
from iasgd.algorithms import ALGORITHMS, VARIANTS
from iasgd.config import (
    ADAPTIVE,
    CLUSTER,
    TRAINING,
    ConfigError,
    TrainConfig,
    variant_conflict,
)
from iasgd.console import EXIT_SIGINT, EXIT_SIGTERM, Display, Interrupts, error
from iasgd.executors import precompile
from iasgd.executors import simulated as sim
from iasgd.executors.threads import usable_cores
from iasgd.nn import models
from iasgd.options import Applies, UsageError, option
from iasgd.recipes import RECIPES, with_recipe
from iasgd.resume import default_checkpoint

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_DIVERGED = 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        raise UsageError(message)


MODEL_AND_DATA = "model and data"
SIMULATION = "simulation (staleness of many threads, computed on one core)"
OUTPUT = "output"
GROUPS = (MODEL_AND_DATA, TRAINING, ADAPTIVE, SIMULATION, CLUSTER, OUTPUT)  # --help's order


OWN_FILE = Applies("{dataset} of your own file", lambda run: run.dataset not in datasets.DATASETS)
ARCHIVED = Applies("{dataset} " + ", ".join(d for d in datasets.DATASETS if d != "synthetic"),
                   lambda run: run.dataset in datasets.DATASETS and run.dataset != "synthetic")
SIMULATED = Applies("{simulate}", lambda run: run.simulate)
REAL = Applies("runs without {simulate}", lambda run: not run.simulate)
CHECKPOINTED = Applies("runs without {simulate} or {no_checkpoint}",
                       lambda run: not run.simulate and not run.no_checkpoint)


# Here rather than in iasgd.config: these are the command line's own options
# (the data, the simulator, the cluster's address, the output), which neither
# the engine nor TrainConfig take, and they need iasgd.data and iasgd.nn.
@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The options of a run besides TrainConfig's, each declared with its
    command-line option (iasgd.options): field `a_b` is `--a-b`."""

    recipe: str | None = option(
        None, "; ".join(f"{name}: {r.help}" for name, r in RECIPES.items())
        + " (it sets those options where the command line does not: iasgd/recipes.py)",
        group=MODEL_AND_DATA, choices=RECIPES, default_text="none")
    dataset: str = option(
        "cifar10", f"training data: one of {', '.join(datasets.DATASETS)} (synthetic needs no "
                   "files), or your own .npz or HDF5 file of images and labels (docs/data.md)",
        group=MODEL_AND_DATA, metavar="DATASET", parse=lambda text: dataset_name(text))
    model: str = option(
        "lenet", "a preset: lenet (LeNet-5 as in the paper), mlp (dense layers with ReLU), "
                 "vgg-small (two 3x3 conv blocks of 32 and 64 channels), vgg-bn (three blocks "
                 "of 32, 64 and 128 channels with batch norm); or a layer spec such "
                 "as conv32k3s,relu,pool,dense128,relu,dense (grammar: docs/models.md)",
        group=MODEL_AND_DATA, metavar="MODEL")
    hidden: tuple[int, ...] | None = option(
        None, "hidden widths of the mlp, comma-separated", group=MODEL_AND_DATA,
        parse=O.widths, default_text=",".join(map(str, models.DEFAULT_HIDDEN)),
        applies=Applies("{model} mlp", lambda run: run.model == "mlp"))
    data_dir: str | None = option(None, "where archives and caches live", group=MODEL_AND_DATA,
                                  default_text=f"${datasets.DATA_DIR_ENV}, else ./data")
    archive: str | None = option(
        None, "dataset archive under another name or path (for Fashion-MNIST: the directory "
              "of its four .gz files)", group=MODEL_AND_DATA, applies=ARCHIVED)
    test_fraction: float = option(
        datasets.DEFAULT_TEST_FRACTION, "your own file without a test split: the share of its "
        "images held out as one (the same ones for every --seed)", group=MODEL_AND_DATA,
        metavar="F", parse=O.unit_float, applies=OWN_FILE)
    layout: str = option("auto", "your own file: where its images' channels are (auto: "
                                 "docs/data.md's rule)", group=MODEL_AND_DATA,
                         choices=datasets.LAYOUTS, applies=OWN_FILE)
    init: str | None = option(
        None, "start from these parameters: an export (python -m iasgd.export) or another "
              "run's checkpoint of the same model, to fine-tune", group=MODEL_AND_DATA,
        metavar="FILE", default_text="the model's initialisation with --seed")
    simulate: bool = option(
        False, "simulate --threads workers instead of running them (sync, async, hogwild, "
               "interval, with their schedules); times, throughput and --time-budget are in "
               "simulated seconds", group=SIMULATION)
    sim_cores: int | None = option(None, "cores the simulated workers share", group=SIMULATION,
                                   parse=O.positive_int, default_text="one each",
                                   applies=SIMULATED)
    sim_step_spread: float | None = option(
        None, "lognormal step times with this spread around the measured mean",
        group=SIMULATION, metavar="SIGMA", parse=O.positive_float,
        default_text="draw from measured single-thread step times", applies=SIMULATED)
    sim_quantum: float = option(
        0.004, "simulated time slice of a worker when workers share cores (Linux at HZ=250: "
               "a tick)", group=SIMULATION, metavar="SECONDS", parse=O.positive_float,
        applies=SIMULATED)
    sim_contention: float = option(
        0.0, "each other busy core makes a simulated step this much longer (a fraction; "
             "bench/contention.py measures it)", group=SIMULATION, metavar="C",
        parse=O.unit_float, applies=SIMULATED)
    sim_switch: float | None = option(
        None, "CPU seconds a time-sliced simulated worker loses when it resumes a step its "
              "time slice cut (cold caches; bench/contention.py fits it)", group=SIMULATION,
        metavar="SECONDS", parse=O.positive_float, default_text="none", applies=SIMULATED)
    sim_snapshot_reads: bool = option(
        False, "simulated hogwild and interval steps read a snapshot of the parameters when "
               "they begin, instead of the shared array as they compute", group=SIMULATION,
        applies=SIMULATED)
    address: str | None = option(
        None, "ray: the cluster to join (auto: the one this machine belongs to)", group=CLUSTER,
        metavar="HOST:PORT", default_text="start a local Ray with --nodes node actors",
        applies=Applies("{backend} ray", lambda run: run.backend == "ray"))
    out: str = option("results.json", "results JSON (config, status, per-epoch records), "
                                      "written atomically; a --resume without --out extends "
                                      "the results of the run it resumes, beside its checkpoint",
                      group=OUTPUT)
    quiet: bool = option(False, "print only errors", group=OUTPUT)
    checkpoint: str | None = option(
        None, "checkpoint file (HDF5), written at the end of the run (--resume it with more "
              "--epochs to extend the run), on Ctrl-C/SIGTERM and every --checkpoint-every "
              "epochs; a --resume without --out writes the checkpoint it resumes",
        group=OUTPUT, metavar="PATH",
        default_text="beside --out, as NAME.ckpt.h5", applies=CHECKPOINTED)
    checkpoint_every: int = option(
        0, "also write the checkpoint every this many epochs (0: only at the end and when "
           "stopped)", group=OUTPUT, metavar="EPOCHS", parse=O.nonneg_int,
        applies=CHECKPOINTED)
    no_checkpoint: bool = option(
        False, "write no checkpoint at all (a stopped run cannot be resumed)", group=OUTPUT,
        applies=REAL)
    resume: str | None = option(
        None, "continue the run saved in this checkpoint, with its configuration (--epochs, "
              "--time-budget and output options may change), writing beside it unless --out "
              "is given", group=OUTPUT, metavar="PATH", applies=REAL)


EXIT_CODES = {0: "completed, or stopped by --time-budget",
              EXIT_FAILED: "failed (a worker or every node)",
              EXIT_USAGE: "bad input: one line on stderr, before any work",
              EXIT_DIVERGED: "diverged (the loss is not finite); the results so far are written",
              EXIT_SIGINT: "Ctrl-C: stopped, with a checkpoint (unless --no-checkpoint) and the "
                           "results so far",
              EXIT_SIGTERM: "SIGTERM: stopped, as for Ctrl-C"}
EPILOG = "\n".join([
    "examples:",
    "  python -m iasgd.run --dataset synthetic --algo interval --threads 8",
    "  python -m iasgd.run --resume results.ckpt.h5 --epochs 6   (train a saved run on)",
    "",
    "exit codes:",
    *(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES.items())])


def build_parser() -> argparse.ArgumentParser:
    """The parser of every option: one flag per field of TrainConfig and RunOptions."""
    p = _Parser(
        prog="python -m iasgd.run",
        description="Train a small CNN or MLP with parallel SGD, on the threads of this machine\n"
                    "or on the nodes of a Ray cluster, and write its results JSON.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the epilog's lines as written
        allow_abbrev=False,  # a resume must see exactly which options were given
    )
    O.add_options(p, TrainConfig, RunOptions, groups=GROUPS)
    return p


def command_line(argv: list[str]) -> tuple[TrainConfig, RunOptions, engine.Snapshot | None]:
    """The run's options, checked (a resumed one's merged with those saved in
    its checkpoint), and the snapshot a --resume continues. UsageError on bad
    input."""
    args = build_parser().parse_args(argv)
    given = given_options(argv)
    _check_command_line(args)
    values, snapshot = vars(args), None
    if args.recipe and not args.resume:  # a resume has the recipe's values in its checkpoint
        values = with_recipe(values, args.recipe, given)
    if args.resume:
        saved, snapshot = checkpoints.load(args.resume)
        if "model" in given:  # compared in the spelling the saved run recorded
            args.model = canonical_model(args.model, saved.get("dataset", args.dataset),
                                         args.hidden)
        values = resume.resumed_values(args, saved, given)
    cfg, opts = checked(values, given)
    if snapshot is not None:
        _check_resume(cfg, opts, snapshot)
    return cfg, opts, snapshot


def given_options(argv: list[str]) -> set[str]:
    """The fields of the options named on the command line."""
    return {tok.split("=")[0][2:].replace("-", "_") for tok in argv if tok.startswith("--")}


def _check_command_line(args: argparse.Namespace) -> None:
    """The options that contradict each other as given, whatever a resumed
    checkpoint holds."""
    if args.no_checkpoint and (args.checkpoint is not None or args.checkpoint_every):
        other = "--checkpoint" if args.checkpoint is not None else "--checkpoint-every"
        raise UsageError(f"--no-checkpoint and {other} contradict each other; drop one")
    if args.archive is not None and not Path(args.archive).exists():
        raise UsageError(f"--archive {args.archive}: no such file or directory")
    if args.simulate and args.resume:
        raise UsageError("--simulate runs are not checkpointed, so there is nothing to "
                         "--resume; drop one of the two")
    if args.init and args.resume:
        raise UsageError("--resume continues a run with its own parameters; --init starts "
                         "a new one from given parameters: drop one of the two")


def dataset_name(text: str) -> str:
    """--dataset: a registry name, or a user's own data file (as an absolute
    path, so that a resume from another folder finds it)."""
    if text in datasets.DATASETS:
        return text
    if datasets.is_own_file(text):
        return str(Path(text).expanduser().resolve())
    raise argparse.ArgumentTypeError(
        f"unknown dataset {text!r}: choose one of {', '.join(datasets.DATASETS)}, or give an "
        ".npz or HDF5 file of your own (docs/data.md)")


def own_data(dataset: str) -> bool:
    """The run trains on a user's own file: the model is sized once it is loaded."""
    return dataset not in datasets.DATASETS


def checked(values: dict, given: set[str]) -> tuple[TrainConfig, RunOptions]:
    """The TrainConfig and RunOptions of a run's option values (a resumed
    one's merged with its checkpoint's), with its --variant filled in and
    its --model spec made canonical. UsageError unless they fit together,
    and unless each option given, or set to other than its default, has an
    effect on this run."""
    _check_variant_flags(values, given)
    args = argparse.Namespace(**values)
    changed = {f.name for f in dataclasses.fields(RunOptions)
               if getattr(args, f.name) != f.default}
    found = O.inapplicable(RunOptions, args, sorted(given | changed))
    if found is not None:
        raise UsageError(O.as_flags(O.does_nothing(*found)))
    # a bad spec is one line and exit 2, before any data is loaded (a user's own
    # file: once it is loaded and its images' shape is known, in build_model)
    if not own_data(args.dataset):
        args.model = canonical_model(args.model, args.dataset, args.hidden)
    _check_writable_file("--out", args.out)
    if args.checkpoint is not None:
        _check_writable_file("--checkpoint", args.checkpoint)
    try:
        cfg = train_config(args)
        cfg.check_applies(sorted(given & {f.name for f in dataclasses.fields(TrainConfig)}))
    except ConfigError as e:
        raise UsageError(e.for_cli()) from None
    opts = run_options(args)
    if opts.simulate and cfg.algo not in sim.SIMULATED_ALGOS:
        raise UsageError(f"--simulate covers --algo {', '.join(sim.SIMULATED_ALGOS)}; "
                         f"--algo {cfg.algo} runs one thread, so run it for real")
    if cfg.backend == "ray":
        _check_ray(opts)
    return cfg, opts


def _check_variant_flags(values: dict, given: set[str]) -> None:
    """A flag beside --variant may repeat what the variant sets, not change it
    (even to the option's default, which TrainConfig cannot tell from unset)."""
    name = values.get("variant")
    for field, value in VARIANTS.get(name, {}).items():
        if field in given and values[field] != value:
            raise UsageError(variant_conflict(name, field, values[field]).for_cli())


def canonical_model(model: str, dataset: str, hidden: tuple[int, ...] | None) -> str:
    """A preset's name, or a spec in its canonical spelling (as it is recorded,
    and compared on resume); UsageError if it does not build on `dataset`."""
    try:
        built = models.build(model, dataset, hidden=hidden)
    except ValueError as e:
        raise UsageError(f"--model {model}: {e}") from None
    return model if model in models.MODELS else built.spec


def _check_ray(opts: RunOptions) -> None:
    """--backend ray: Ray is installed and the cluster at --address answers."""
    if opts.simulate:
        raise UsageError("--simulate runs on this machine; drop --backend ray or --simulate")
    if importlib.util.find_spec("ray") is None:
        raise UsageError("--backend ray needs Ray, which is not installed: "
                         "pip install -e '.[ray]'")
    if opts.address not in (None, "auto"):
        from iasgd.executors.ray_cluster import UnreachableClusterError, check_reachable

        try:
            check_reachable(opts.address)
        except UnreachableClusterError as e:
            raise UsageError(str(e)) from None


def _check_writable_file(flag: str, path: str) -> None:
    """The file can be created: its directory exists and takes a new file
    (tried for real: permission bits say nothing for root or a read-only mount)."""
    directory = Path(path).resolve().parent
    if Path(path).is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a file name")
    if not directory.is_dir():
        raise UsageError(f"{flag} {path}: directory {directory} does not exist; create it first")
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write in {directory} ({e.strerror})") from None


def run_config(cfg: TrainConfig, opts: RunOptions, model: models.Model) -> dict:
    """The full configuration as written to the results file and the
    checkpoint; a user's own file's with the input shape and class count
    too, so that its model rebuilds without the file."""
    config = {**dataclasses.asdict(opts), **dataclasses.asdict(cfg)}
    if config["hidden"] is None and opts.model == "mlp":
        config["hidden"] = list(models.DEFAULT_HIDDEN)
    elif config["hidden"] is not None:
        config["hidden"] = list(config["hidden"])
    if own_data(opts.dataset):
        config.update(input_shape=list(model.input_shape), num_classes=model.num_classes)
    return config


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of the options: each of its fields, taken by name (a
    field missing from `args` is an AttributeError, never its default)."""
    return TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})


def run_options(args: argparse.Namespace) -> RunOptions:
    """The RunOptions of the options, each field taken by name as train_config does."""
    return RunOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RunOptions)})


def _check_resume(cfg: TrainConfig, opts: RunOptions, snapshot: engine.Snapshot) -> None:
    """The snapshot fits the run (a user's own file: engine.train checks it,
    once the model is sized) and leaves work to do."""
    try:
        if not own_data(opts.dataset):
            engine.check_resume(models.build(opts.model, opts.dataset, hidden=opts.hidden),
                                cfg, snapshot)
    except checkpoints.CheckpointError as e:
        raise UsageError(f"--resume {opts.resume}: {e}") from None
    resume.check_work_left(cfg, opts, snapshot)


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (sys.argv's); returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    handlers = {signum: signal.getsignal(signum) for signum in console.SIGNALS}
    console.stop_by_exception()
    try:
        return _main(argv)
    except console.Stopped as e:
        error("stopped before training started; nothing was written")
        return e.exit_code
    finally:  # as they were (a caller's, in-process)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _main(argv: list[str]) -> int:
    try:
        cfg, opts, snapshot = command_line(argv)
        display = Display(opts.quiet, cfg.epochs)
        t0 = time.perf_counter()
        # a file of your own is accepted (model, data, memory) before anything is
        # said of it or cached: a refused run leaves its one line and nothing else
        data = datasets.load(opts.dataset, opts.data_dir, opts.archive, progress=not opts.quiet,
                             test_fraction=opts.test_fraction, layout=opts.layout,
                             batch_size=cfg.batch_size, check=lambda d: accept(opts, cfg, d))
        model, opts, init = accept(opts, cfg, data)
    except ConfigError as e:
        error(f"error: {e.for_cli()}")
        return EXIT_USAGE
    except (UsageError, datasets.DataError, checkpoints.CheckpointError, ValueError) as e:
        error(f"error: {e}")
        return EXIT_USAGE
    display.say(describe(cfg, opts, model, data, time.perf_counter() - t0))
    if not opts.quiet:
        plan = models.lower(model.arch, model.layout, 1).table
        seconds = precompile.compile_estimate(cfg.algo, plan, usable_cores(), opts.simulate)
        if seconds:
            display.compiling(compile_range(seconds, usable_cores()))
    if opts.simulate:
        return simulate_and_report(cfg, opts, model, data, display, init)
    return train_and_report(cfg, opts, model, data, display, snapshot, init)


def accept(opts: RunOptions, cfg: TrainConfig, data: datasets.Dataset
           ) -> tuple[models.Model, RunOptions, np.ndarray | None]:
    """The run's model (and options, its spec recorded canonically) and the
    weights it starts from (--init), once the data, the batch and the memory
    fit it; else the one-line error (UsageError, DataError, ...)."""
    model, opts = build_model(opts, data)
    init = export.load_weights(opts.init, model) if opts.init else None
    engine.check_data(model, data, cfg)
    _check_memory(model, cfg)
    return model, opts, init


def compile_range(seconds: int, cores: int) -> tuple[int, int]:
    """What an estimate of `seconds` on idle `cores` may take now: up to as
    much longer as the load of the last minute leaves fewer cores free."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return seconds, max(seconds + 1, round(seconds * (1 + load / max(cores, 1))))


def _check_memory(model: models.Model, cfg: TrainConfig) -> None:
    need, have = workspace_bytes(model, cfg), physical_memory_bytes()
    if need > have:
        raise UsageError(f"{cfg.threads} workers at --batch-size {cfg.batch_size} need "
                         f"{need / 2**30:.1f} GiB of workspace, more than this machine's "
                         f"{have / 2**30:.1f} GiB; use fewer --threads or a smaller --batch-size")


def build_model(opts: RunOptions, data: datasets.Dataset) -> tuple[models.Model, RunOptions]:
    """The run's model, sized for its dataset (a user's own file: for the
    images and classes it holds, its spec then recorded canonically)."""
    if not own_data(opts.dataset):
        return models.build(opts.model, opts.dataset, hidden=opts.hidden), opts
    try:
        model = models.build(opts.model, None, input_shape=data.input_shape,
                             num_classes=data.num_classes, hidden=opts.hidden)
    except ValueError as e:
        raise UsageError(f"--model {opts.model} on {data.name}: {e}") from None
    if opts.model not in models.MODELS:
        opts = dataclasses.replace(opts, model=model.spec)
    return model, opts


def simulate_and_report(cfg: TrainConfig, opts: RunOptions, model: models.Model,
                        data: datasets.Dataset, display: Display,
                        init: np.ndarray | None = None) -> int:
    """--simulate: the run's staleness and loss from iasgd.executors.simulated; times simulated."""
    precompile.compile_ahead(model, cfg.algo, None, usable_cores())  # the layer ops
    measured = sim.measure_step_times(model, data, cfg.batch_size, augment=cfg.augment,
                                      crop_padding=cfg.crop_padding)
    display.compiled()
    if opts.sim_step_spread is None:
        step_time, how = sim.measured_steps(measured), "measured single-thread step times"
    else:
        step_time = sim.lognormal_steps(float(measured.mean()), opts.sim_step_spread)
        how = f"lognormal, mean {1e3 * measured.mean():.2f} ms, spread {opts.sim_step_spread}"
    cores = opts.sim_cores or cfg.threads
    display.say(f"SIMULATED: {cfg.threads} workers on {cores} cores, step times {how}")
    read_s, apply_s = sim.measure_sections(model)
    costs = sim.Costs(contention=opts.sim_contention, switch_s=opts.sim_switch or 0.0,
                      read_s=read_s, apply_s=apply_s, live_reads=not opts.sim_snapshot_reads)
    interrupts = Interrupts(saves="the results")
    interrupts.install()
    hooks = engine.Hooks(on_epoch_end=display.epoch_end, should_stop=interrupts.reason)
    result = sim.simulate(model, data, cfg, step_time, cores=cores, quantum=opts.sim_quantum,
                          hooks=hooks, init=init, costs=costs)
    document = results.results_document(run_config(cfg, opts, model), result, model.num_params)
    document["simulated"] = {"cores": cores, "step_times": how,
                             "step_time_mean_s": float(measured.mean()),
                             "quantum_s": opts.sim_quantum, "costs": dataclasses.asdict(costs),
                             "note": "wall times and throughput are simulated, not measured"}
    if not write_results(opts.out, document, None):
        return EXIT_USAGE
    report(display, document, opts.out)
    if interrupts.signum is not None:
        error(f"interrupted; the simulated results so far are in {opts.out}")
        return interrupts.exit_code()
    return diverged_exit(result, cfg, opts)


def write_results(out: str, document: dict, checkpoint: str | None) -> bool:
    """Write the results file; False, with one line saying so, if it cannot be
    written (a full disk, a folder gone), where the checkpoint still is."""
    try:
        files.write_json_atomic(out, document)
    except OSError as e:
        kept = f"; the checkpoint is in {checkpoint}" if checkpoint else ""
        error(f"error: cannot write the results to {out} ({e.strerror or e}){kept}")
        return False
    return True


def workspace_bytes(model: models.Model, cfg: TrainConfig) -> int:
    """Memory of the workers' buffers: activations and their gradients (float32)
    plus a gradient and a parameter copy each."""
    acts = model.lowered(cfg.batch_size).acts_size
    return cfg.threads * (8 * acts + 8 * model.num_params)


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def interval_text(cfg: TrainConfig) -> str:
    """How the run sets y, for its first line (iasgd.schedules.interval_rule)."""
    return S.interval_rule(cfg)


def describe(cfg: TrainConfig, opts: RunOptions, model: models.Model, data: datasets.Dataset,
             load_s: float) -> str:
    algo = cfg.algo if cfg.threads == 1 else f"{cfg.algo} x {cfg.threads} threads"
    if cfg.variant is not None and cfg.variant != cfg.algo:
        algo = f"{cfg.variant} ({algo})"
    if ALGORITHMS[cfg.algo].bound == "interval":
        algo += f", {interval_text(cfg)}, gate {cfg.gate}"
    if cfg.backend == "ray":
        where = "a local Ray" if opts.address is None else opts.address
        algo += (f"; on {cfg.nodes} Ray nodes ({where}), exchanging every {cfg.sync_every} "
                 "updates")
        if ALGORITHMS[cfg.algo].bound == "interval":
            algo += f", node interval {cfg.node_interval or cfg.nodes}, gate {cfg.node_gate}"
    resumed = f"; resuming {opts.resume}" if opts.resume else ""
    return (f"{opts.model} ({model.num_params:,} parameters) on {opts.dataset} "
            f"({data.x_train.shape[0]:,} train / {data.x_test.shape[0]:,} test, loaded in "
            f"{load_s:.1f}s); {algo}, b={cfg.batch_size}, lr={cfg.lr:g}, "
            f"momentum={cfg.momentum:g}{_sgd_extras(cfg)}{resumed}")


def _sgd_extras(cfg: TrainConfig) -> str:
    """The banner's words for the SGD knobs beyond the paper's, where set."""
    extras = [", nesterov" if cfg.nesterov else "",
              f", weight decay {cfg.weight_decay:g}" if cfg.weight_decay else "",
              f", label smoothing {cfg.label_smoothing:g}" if cfg.label_smoothing else "",
              f", warm-up {cfg.lr_warmup:.0%}" if cfg.lr_warmup else "",
              f", {cfg.lr_decay} decay" if cfg.lr_decay != "none" else "",
              f", augment {cfg.augment}" if cfg.augment != "none" else "",
              f" (padding {cfg.crop_padding})" if "crop" in cfg.augment else ""]
    return "".join(extras)


def train_and_report(cfg: TrainConfig, opts: RunOptions, model: models.Model,
                     data: datasets.Dataset, display: Display, snapshot: object,
                     init: np.ndarray | None = None) -> int:
    config = run_config(cfg, opts, model)
    checkpoint_path = opts.checkpoint or default_checkpoint(opts.out)
    saved: list[str] = []

    def write_checkpoint(snap: engine.Snapshot) -> None:
        if not opts.no_checkpoint:
            checkpoints.save(checkpoint_path, config, snap)
            saved.append(checkpoint_path)

    interrupts = Interrupts()
    interrupts.install()
    hooks = engine.Hooks(display.epoch_start, display.progress, display.epoch_end,
                         should_stop=interrupts.reason, on_checkpoint=write_checkpoint)
    try:
        result = engine.train(model, data, cfg, hooks, resume=snapshot,
                              checkpoint_every=opts.checkpoint_every, address=opts.address,
                              init=init)
    except checkpoints.CheckpointError as e:  # an array the executor restores does not fit
        error(f"error: --resume {opts.resume}: {e}")
        return EXIT_USAGE
    except RuntimeError as e:  # a worker or every node failed; the others have stopped
        lost = getattr(e, "result", None)  # a cluster lost for good: its results so far
        if lost is not None:
            document = results.results_document(config, lost, model.num_params)
            document["checkpoint"] = saved[-1] if saved else None
            write_results(opts.out, document, document["checkpoint"])
        error(f"error: {e}")
        return getattr(e, "exit_code", EXIT_FAILED)  # a cluster never reached: 2
    document = results.results_document(config, result, model.num_params)
    document["checkpoint"] = saved[-1] if saved else None
    if not write_results(opts.out, document, document["checkpoint"]):
        return EXIT_USAGE
    report(display, document, opts.out)
    resume_command = f"python -m iasgd.run --resume {shlex.quote(checkpoint_path)}"
    if result.status == "interrupted":
        where = (f"checkpoint in {checkpoint_path}, results so far in {opts.out}; continue "
                 f"with: {resume_command}" if saved else
                 f"results so far in {opts.out} (no checkpoint: --no-checkpoint)")
        error(f"interrupted; {where}")
        return interrupts.exit_code()
    if interrupts.signum is not None:  # after the last step: the run is whole
        error(f"interrupted as the run ended; its results are in {opts.out}")
        return interrupts.exit_code()
    if saved and result.diverged_at is None:
        more = (f"--time-budget {2 * cfg.time_budget:g}" if result.status == "time_budget"
                else f"--epochs {2 * cfg.epochs}")
        display.say(f"checkpoint in {checkpoint_path}; to train on: {resume_command} {more}")
    return diverged_exit(result, cfg, opts)


def diverged_exit(result: engine.RunResult, cfg: TrainConfig, opts: RunOptions) -> int:
    """EXIT_DIVERGED, with one line saying where, if the run diverged; else 0."""
    if result.diverged_at is None:
        return 0
    where = result.diverged_at
    error(f"diverged at epoch {where['epoch']}, step {where['step']}: the loss is not finite; "
          f"try a smaller --lr (it was {cfg.lr:g}); results so far in {opts.out}")
    return EXIT_DIVERGED


def report(display: Display, document: dict, out: str) -> None:
    acc = document["final_test_accuracy"]
    acc_text = "n/a" if acc is None else f"{100 * acc:.2f}%"
    st = document["staleness"]
    bound = "unbounded" if st["bound"] is None else f"bound {st['bound']}"
    epochs = len(document["epochs"])
    display.say(f"{results.Status(document['status']).words}: {epochs} "
                f"epoch{'' if epochs == 1 else 's'} in "
                f"{document['train_time_s']:.1f}s training ({document['samples_per_s']:,.0f} "
                f"samples/s), final test accuracy {acc_text}")
    levels = f"staleness mean {st['mean']:.2f} max {st['max']} ({bound})"
    between = (document.get("cluster") or {}).get("node_staleness")
    if between:  # a cluster run: within its nodes, then between them
        node_bound = ("unbounded" if between["bound"] is None
                      else f"bound {between['bound']}")
        levels = (f"{levels.replace('staleness', 'staleness within nodes')}, between nodes "
                  f"mean {between['mean']:.2f} max {between['max']} ({node_bound})")
    display.say(f"{levels}; {document['applied']:,} of {document['computed']:,} gradients "
                f"applied ({100 * document['acceptance_rate']:.1f}%); results in {out}")


if __name__ == "__main__":
    sys.exit(main())
