"""Command line: `python -m iasgd.run [options]` trains one model and writes
its results JSON. `--help` lists every option with its default.

Bad input is one line on stderr and exit code 2, before any work is done.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

import numpy as np

from iasgd import checkpoints, engine, export, files, results
from iasgd import data as datasets
from iasgd import options as O
from iasgd import schedules as S
from iasgd.algorithms import ALGORITHMS
from iasgd.config import ADAPTIVE, CLUSTER, MAX_THREADS, TRAINING, ConfigError, TrainConfig
from iasgd.executors import precompile
from iasgd.executors import simulated as sim
from iasgd.executors.threads import usable_cores
from iasgd.nn import models
from iasgd.options import option

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_DIVERGED = 3
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class UsageError(Exception):
    """Invalid input; the message is one line that says what to do."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        raise UsageError(message)


MODEL_AND_DATA = "model and data"
SIMULATION = "simulation (staleness of many threads, computed on one core)"
OUTPUT = "output"
GROUPS = (MODEL_AND_DATA, TRAINING, ADAPTIVE, SIMULATION, CLUSTER, OUTPUT)  # --help's order


# Here rather than in iasgd.config: these are the command line's own options
# (the data, the simulator, the cluster's address, the output), which neither
# the engine nor TrainConfig take, and they need iasgd.data and iasgd.nn.
@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The options of a run besides TrainConfig's, each declared with its
    command-line option (iasgd.options): field `a_b` is `--a-b`."""

    dataset: str = option(
        "cifar10", f"training data: one of {', '.join(datasets.DATASETS)} (synthetic needs no "
                   "files), or your own .npz or HDF5 file of images and labels (docs/data.md)",
        group=MODEL_AND_DATA, metavar="DATASET", parse=lambda text: dataset_name(text))
    model: str = option(
        "lenet", "a preset: lenet (LeNet-5 as in the paper), mlp (dense layers with ReLU), "
                 "vgg-small (two 3x3 conv blocks of 32 and 64 channels); or a layer spec such "
                 "as conv32k3s,relu,pool,dense128,relu,dense (grammar: docs/models.md)",
        group=MODEL_AND_DATA, metavar="MODEL")
    hidden: tuple[int, ...] | None = option(
        None, "hidden widths of the mlp, comma-separated", group=MODEL_AND_DATA,
        parse=O.widths, default_text=",".join(map(str, models.DEFAULT_HIDDEN)))
    data_dir: str | None = option(None, "where archives and caches live", group=MODEL_AND_DATA,
                                  default_text=f"${datasets.DATA_DIR_ENV}, else ./data")
    archive: str | None = option(
        None, "dataset archive under another name or path (for Fashion-MNIST: the directory "
              "of its four .gz files)", group=MODEL_AND_DATA)
    test_fraction: float = option(
        datasets.DEFAULT_TEST_FRACTION, "your own file without a test split: the share of its "
        "images held out as one (the same ones for every --seed)", group=MODEL_AND_DATA,
        metavar="F", parse=O.unit_float)
    layout: str = option("auto", "your own file: where its images' channels are (auto: "
                                 "docs/data.md's rule)", group=MODEL_AND_DATA,
                         choices=datasets.LAYOUTS)
    init: str | None = option(
        None, "start from these parameters: an export (python -m iasgd.export) or another "
              "run's checkpoint of the same model, to fine-tune", group=MODEL_AND_DATA,
        metavar="FILE", default_text="the model's initialisation with --seed")
    simulate: bool = option(
        False, "simulate --threads workers instead of running them (sync, async, hogwild, "
               "interval, with their schedules); times, throughput and --time-budget are in "
               "simulated seconds", group=SIMULATION)
    sim_cores: int | None = option(None, "cores the simulated workers share", group=SIMULATION,
                                   parse=O.positive_int, default_text="one each")
    sim_step_spread: float | None = option(
        None, "lognormal step times with this spread around the measured mean",
        group=SIMULATION, metavar="SIGMA", parse=O.positive_float,
        default_text="draw from measured single-thread step times")
    sim_quantum: float = option(
        0.004, "simulated time slice of a worker when workers share cores (Linux at HZ=250: "
               "a tick)", group=SIMULATION, metavar="SECONDS", parse=O.positive_float)
    sim_contention: float = option(
        0.0, "each other busy core makes a simulated step this much longer (a fraction; "
             "bench/contention.py measures it)", group=SIMULATION, metavar="C",
        parse=O.unit_float)
    sim_switch: float | None = option(
        None, "CPU seconds a time-sliced simulated worker loses when it resumes a step its "
              "time slice cut (cold caches; bench/contention.py fits it)", group=SIMULATION,
        metavar="SECONDS", parse=O.positive_float, default_text="none")
    sim_snapshot_reads: bool = option(
        False, "simulated hogwild and interval steps read a snapshot of the parameters when "
               "they begin, instead of the shared array as they compute", group=SIMULATION)
    address: str | None = option(
        None, "ray: the cluster to join (auto: the one this machine belongs to)", group=CLUSTER,
        metavar="HOST:PORT", default_text="start a local Ray with --nodes node actors")
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
        default_text="beside --out, as NAME.ckpt.h5")
    checkpoint_every: int = option(
        0, "also write the checkpoint every this many epochs (0: only at the end and when "
           "stopped)", group=OUTPUT, metavar="EPOCHS", parse=O.nonneg_int)
    no_checkpoint: bool = option(
        False, "write no checkpoint at all (a stopped run cannot be resumed)", group=OUTPUT)
    resume: str | None = option(
        None, "continue the run saved in this checkpoint, with its configuration (--epochs, "
              "--time-budget and output options may change), writing beside it unless --out "
              "is given", group=OUTPUT, metavar="PATH")


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and cross-check the options; raise UsageError on bad input. With
    --resume, the options of the run are checked by resumed_args, once merged
    with those saved in the checkpoint."""
    args = build_parser().parse_args(argv)
    _check_command_line(args)
    if args.resume is None:
        check_options(args)
    return args


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


def own_data(args: argparse.Namespace) -> bool:
    """The run trains on a user's own file: the model is sized once it is loaded."""
    return args.dataset not in datasets.DATASETS


def check_options(args: argparse.Namespace) -> None:
    """The options of a run (a resumed one's merged with its checkpoint's)
    fit together; its --model spec is made canonical. UsageError if not."""
    if args.hidden is not None and args.model != "mlp":
        raise UsageError("--hidden applies to --model mlp only")
    # a bad spec is one line and exit 2, before any data is loaded (a user's own
    # file: once it is loaded and its images' shape is known, in build_model)
    if not own_data(args):
        args.model = canonical_model(args.model, args.dataset, args.hidden)
    if args.threads > MAX_THREADS:
        raise UsageError(f"--threads {args.threads} is more than {MAX_THREADS}; "
                         "use at most a few times the number of cores")
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    _check_writable_file("--out", args.out)
    if args.checkpoint is not None:
        _check_writable_file("--checkpoint", args.checkpoint)
    try:
        train_config(args).check()
    except ConfigError as e:
        raise UsageError(e.for_cli()) from None
    if args.simulate and args.algo not in sim.SIMULATED_ALGOS:
        raise UsageError(f"--simulate covers --algo {', '.join(sim.SIMULATED_ALGOS)}; "
                         f"--algo {args.algo} runs one thread, so run it for real")
    if args.backend == "ray":
        _check_ray(args)
    elif args.address is not None:
        raise UsageError("--address applies to --backend ray; add --backend ray or drop it")


def canonical_model(model: str, dataset: str, hidden: tuple[int, ...] | None) -> str:
    """A preset's name, or a spec in its canonical spelling (as it is recorded,
    and compared on resume); UsageError if it does not build on `dataset`."""
    try:
        built = models.build(model, dataset, hidden=hidden)
    except ValueError as e:
        raise UsageError(f"--model {model}: {e}") from None
    return model if model in models.MODELS else built.spec


def _check_ray(args: argparse.Namespace) -> None:
    """--backend ray: Ray is installed and the options fit a cluster run."""
    if args.simulate:
        raise UsageError("--simulate runs on this machine; drop --backend ray or --simulate")
    if importlib.util.find_spec("ray") is None:
        raise UsageError("--backend ray needs Ray, which is not installed: "
                         "pip install -e '.[ray]'")
    if args.address not in (None, "auto"):
        from iasgd.executors.ray_cluster import UnreachableClusterError, check_reachable

        try:
            check_reachable(args.address)
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


def run_config(args: argparse.Namespace) -> dict:
    """The full configuration as written to the results file."""
    cfg = vars(args).copy()
    if cfg["hidden"] is None and args.model == "mlp":
        cfg["hidden"] = list(models.DEFAULT_HIDDEN)
    elif cfg["hidden"] is not None:
        cfg["hidden"] = list(cfg["hidden"])
    return cfg


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of the options: each of its fields, taken by name (a
    field missing from `args` is an AttributeError, never its default)."""
    return TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})


class Display:
    """Live progress bar within an epoch, one line per epoch, a summary."""

    def __init__(self, quiet: bool, epochs: int):
        self.quiet = quiet
        self.epochs = epochs
        self.bar = None

    def say(self, line: str) -> None:
        if not self.quiet:
            print(line, flush=True)

    def compiling(self, seconds: int) -> None:
        """The kernels are about to be compiled (an empty numba cache)."""
        self.say(f"compiling kernels, first run only, about {seconds} s")
        self._compile_t0 = time.perf_counter()

    def compiled(self) -> None:
        """Compilation is over: say how long it took (once; only after `compiling`)."""
        t0 = vars(self).pop("_compile_t0", None)
        if t0 is not None:
            self.say(f"kernels compiled in {time.perf_counter() - t0:.1f} s; later runs load "
                     "them from numba's cache")

    def epoch_start(self, epoch: int, num_samples: int) -> None:
        self.compiled()  # the engine compiles before the first epoch starts
        if self.quiet:
            return
        from tqdm import tqdm  # progress bars are a solved problem; tqdm solves it

        self.bar = tqdm(total=num_samples, desc=f"epoch {epoch}/{self.epochs}", unit="sample",
                        unit_scale=True, leave=False, file=sys.stderr, dynamic_ncols=True,
                        disable=None)  # None: no bar when stderr is not a terminal
        self._done = 0

    def progress(self, samples_done: int, live: engine.Live) -> None:
        if self.bar is None:
            return
        parts = [f"{live.updates_per_s:,.0f} upd/s"]
        if live.y is not None:
            parts.append(f"y={live.y}")
        if live.m is not None:
            parts.append(f"m={live.m}")
        parts.append(f"mean tau {live.mean_tau:.2f}")
        self.bar.set_postfix_str(", ".join(parts), refresh=False)
        self.bar.update(samples_done - self._done)
        self._done = samples_done

    def epoch_end(self, r: engine.EpochRecord) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        cut = "" if r.complete else "  (cut short by --time-budget)"
        self.say(f"epoch {r.epoch:3d}  train loss {r.train_loss:.4f}  test acc "
                 f"{100 * r.test_accuracy:6.2f}%  elapsed {r.wall_s:7.1f}s  "
                 f"{r.samples_per_s:,.0f} samples/s{cut}")


class Interrupts:
    """SIGINT / SIGTERM: the first asks the run to stop at the workers' next
    step and save; a second Ctrl-C exits at once."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            print("iasgd: interrupted again: exiting now without saving", file=sys.stderr)
            os._exit(EXIT_SIGINT)
        self.signum = signum
        print("iasgd: stopping at the next step to save a checkpoint and the results "
              "(Ctrl-C again quits at once)", file=sys.stderr, flush=True)

    def reason(self) -> str | None:
        return "interrupted" if self.signum is not None else None

    def exit_code(self) -> int:
        return EXIT_SIGTERM if self.signum == signal.SIGTERM else EXIT_SIGINT


def default_checkpoint(out: str) -> str:
    """results.json -> results.ckpt.h5, beside the results."""
    path = Path(out)
    return str(path.with_name(path.stem + ".ckpt.h5"))


def resumed_out(checkpoint: str, saved_out: str) -> str:
    """Where a resume without --out writes its results: the results file of
    the run saved in `checkpoint`, beside it. That is the saved --out's file
    name when the checkpoint was saved beside it (default_checkpoint), so a
    relative --out is found from any folder; else NAME.json for a checkpoint
    NAME.ckpt.h5, NAME.h5 or NAME."""
    path = Path(checkpoint)
    beside = path.with_name(Path(saved_out).name)
    if default_checkpoint(str(beside)) == str(path):
        return str(beside)
    return str(path.with_name(path.name.removesuffix(".h5").removesuffix(".ckpt") + ".json"))


# Options a resumed run may change; everything else is the saved run's.
RESUME_MAY_CHANGE = {"epochs", "time_budget", "out", "quiet", "checkpoint", "checkpoint_every",
                     "no_checkpoint", "data_dir", "archive", "resume"}
# Options of this command only, never the saved run's: a flag cannot be unset.
NOT_INHERITED = {"quiet"}


def resumed_args(args: argparse.Namespace,
                 argv: list[str]) -> tuple[argparse.Namespace, engine.Snapshot]:
    """The saved run's options, with those RESUME_MAY_CHANGE taken from the
    command line and its outputs (resumed_outputs), checked; and the
    snapshot, checked against them. A resume that asks for another model,
    dataset or training option is refused."""
    saved, snapshot = checkpoints.load(args.resume)
    given = {tok.split("=")[0][2:].replace("-", "_") for tok in argv if tok.startswith("--")}
    if "model" in given:  # compared in the spelling the saved run recorded
        args.model = canonical_model(args.model, saved.get("dataset", args.dataset), args.hidden)
    for name in sorted(given - RESUME_MAY_CHANGE):
        if name in saved and saved[name] != _comparable(getattr(args, name)):
            what = ("model or dataset" if name in ("model", "dataset", "hidden")
                    else "training options")
            raise UsageError(f"--resume {args.resume} continues a run with {O.flag(name)} "
                             f"{saved[name]}, not {getattr(args, name)}: a resume cannot change "
                             f"the {what}; start a new run instead")
    # An option the saved run lacks (an older iasgd) is this command line's, default or given.
    merged = {**vars(args), **saved, **{k: getattr(args, k) for k in RESUME_MAY_CHANGE
                                        if k in given or k in NOT_INHERITED}}
    merged.update(resumed_outputs(args, saved, given))
    if merged.get("hidden") is not None:
        merged["hidden"] = tuple(merged["hidden"])
    merged = argparse.Namespace(**merged)
    check_options(merged)
    try:  # a user's own file: engine.train checks it, once the model is sized
        if not own_data(merged):
            engine.check_resume(models.build(merged.model, merged.dataset, hidden=merged.hidden),
                                train_config(merged), snapshot)
    except checkpoints.CheckpointError as e:
        raise UsageError(f"--resume {args.resume}: {e}") from None
    _check_work_left(merged, snapshot)
    return merged, snapshot


def resumed_outputs(args: argparse.Namespace, saved: dict, given: set[str]) -> dict:
    """Where a resume writes (out, checkpoint): with --out there, and its
    checkpoint beside it (or at --checkpoint), as any run's; without, it
    extends the results file of the run it resumes (resumed_out) and the
    checkpoint it resumes, unless that results file is another run's. Never
    the saved run's own --out and --checkpoint: relative, they were paths
    from another folder."""
    if "out" in given:
        return {"out": args.out, "checkpoint": args.checkpoint}
    out = resumed_out(args.resume, saved.get("out", args.out))
    _check_results_of(out, saved, args.resume)
    checkpoint = args.checkpoint if "checkpoint" in given or args.no_checkpoint else args.resume
    return {"out": out, "checkpoint": checkpoint}


def _check_results_of(out: str, saved: dict, resume: str) -> None:
    """`out`, if it exists, holds the results of the run saved in the checkpoint
    `resume` (the same training options): a resume never writes over another
    run's results unless told to with --out."""
    path = Path(out)
    if not path.exists():
        return
    try:
        theirs = _training_options(json.loads(path.read_text())["config"])
        same = theirs == _training_options(saved)
    except (OSError, ValueError, KeyError, TypeError):  # unreadable, not JSON, not results
        same = False
    if not same:
        raise UsageError(f"--resume {resume}: {out} holds another run's results, not those of "
                         "the run it resumes; give --out to say where its results go")


def _training_options(config: dict) -> dict:
    """A run configuration without the options a resume may change."""
    return {k: _comparable(v) for k, v in config.items() if k not in RESUME_MAY_CHANGE}


def _check_work_left(args: argparse.Namespace, snapshot: engine.Snapshot) -> None:
    """A resume that would train nothing is refused: all --epochs done, or the
    --time-budget already spent (training seconds)."""
    meta = snapshot.meta
    done = meta.get("epoch", 1) - 1  # epochs finished; `epoch` is the next one to run
    if done >= args.epochs:
        raise UsageError(f"--resume {args.resume}: the run has finished {done} epochs, "
                         f"--epochs is {args.epochs}; give --epochs more than {done} to "
                         "extend it")
    spent = meta.get("result", {}).get("train_time_s", 0.0) + meta.get("epoch_time", 0.0)
    if args.time_budget is not None and spent >= args.time_budget:
        raise UsageError(f"--resume {args.resume}: the run has trained {spent:.1f}s, "
                         f"--time-budget is {args.time_budget:g}; give a larger --time-budget "
                         "to continue it")


def _comparable(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    snapshot = None
    try:
        args = parse_args(argv)
        if args.resume:
            args, snapshot = resumed_args(args, argv)
        display = Display(args.quiet, args.epochs)
        t0 = time.perf_counter()
        data = datasets.load(args.dataset, args.data_dir, args.archive, progress=not args.quiet,
                             test_fraction=args.test_fraction, layout=args.layout,
                             batch_size=args.batch_size)  # too large: no cache written
        model = build_model(args, data)
        init = export.load_weights(args.init, model) if args.init else None
    except (UsageError, datasets.DataError, checkpoints.CheckpointError, ValueError) as e:
        print(f"iasgd: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        engine.check_data(model, data, train_config(args))
    except ConfigError as e:
        print(f"iasgd: error: {e.for_cli()}", file=sys.stderr)
        return EXIT_USAGE
    need, have = workspace_bytes(model, args), physical_memory_bytes()
    if need > have:
        print(f"iasgd: error: {args.threads} workers at --batch-size {args.batch_size} need "
              f"{need / 2**30:.1f} GiB of workspace, more than this machine's "
              f"{have / 2**30:.1f} GiB; use fewer --threads or a smaller --batch-size",
              file=sys.stderr)
        return EXIT_USAGE
    display.say(describe(args, model, data, time.perf_counter() - t0))
    if not args.quiet:
        plan = models.activation_plan(model.arch, model.layout, 1).table
        seconds = precompile.compile_estimate(args.algo, plan, usable_cores(), args.simulate)
        if seconds:
            display.compiling(seconds)
    if args.simulate:
        return simulate_and_report(args, model, data, display, init)
    return train_and_report(args, model, data, display, snapshot, init)


def build_model(args: argparse.Namespace, data: datasets.Dataset) -> models.Model:
    """The run's model, sized for its dataset (a user's own file: for the
    images and classes it holds, its spec then recorded canonically)."""
    if not own_data(args):
        return models.build(args.model, args.dataset, hidden=args.hidden)
    try:
        model = models.build(args.model, None, input_shape=data.input_shape,
                             num_classes=data.num_classes, hidden=args.hidden)
    except ValueError as e:
        raise UsageError(f"--model {args.model} on {data.name}: {e}") from None
    if args.model not in models.MODELS:
        args.model = model.spec
    # recorded (results, checkpoint): the model rebuilds from them without the file
    args.input_shape, args.num_classes = list(model.input_shape), model.num_classes
    return model


def simulate_and_report(args: argparse.Namespace, model: models.Model, data: datasets.Dataset,
                        display: Display, init: np.ndarray | None = None) -> int:
    """--simulate: the run's staleness and loss from iasgd.executors.simulated; times simulated."""
    precompile.compile_ahead(model, args.algo, None, usable_cores())  # the layer ops
    measured = sim.measure_step_times(model, data, args.batch_size)
    display.compiled()
    if args.sim_step_spread is None:
        step_time, how = sim.measured_steps(measured), "measured single-thread step times"
    else:
        step_time = sim.lognormal_steps(float(measured.mean()), args.sim_step_spread)
        how = f"lognormal, mean {1e3 * measured.mean():.2f} ms, spread {args.sim_step_spread}"
    cores = args.sim_cores or args.threads
    display.say(f"SIMULATED: {args.threads} workers on {cores} cores, step times {how}")
    read_s, apply_s = sim.measure_sections(model)
    costs = sim.Costs(contention=args.sim_contention, switch_s=args.sim_switch or 0.0,
                      read_s=read_s, apply_s=apply_s, live_reads=not args.sim_snapshot_reads)
    result = sim.simulate(model, data, train_config(args), step_time, cores=cores,
                          quantum=args.sim_quantum, init=init, costs=costs)
    for record in result.epochs:
        display.epoch_end(record)
    document = results.results_document(run_config(args), result, model.num_params)
    document["simulated"] = {"cores": cores, "step_times": how,
                             "step_time_mean_s": float(measured.mean()),
                             "quantum_s": args.sim_quantum, "costs": dataclasses.asdict(costs),
                             "note": "wall times and throughput are simulated, not measured"}
    files.write_json_atomic(args.out, document)
    report(display, document, args.out)
    return diverged_exit(result, args)


def workspace_bytes(model: models.Model, args: argparse.Namespace) -> int:
    """Memory of the workers' buffers: activations and their gradients (float32)
    plus a gradient and a parameter copy each."""
    acts = model.plan(args.batch_size).acts_size
    return args.threads * (8 * acts + 8 * model.num_params)


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def interval_text(args: argparse.Namespace) -> str:
    """How the run sets y, for its first line (iasgd.schedules.interval_rule)."""
    return S.interval_rule(train_config(args))


def describe(args: argparse.Namespace, model: models.Model, data: datasets.Dataset,
             load_s: float) -> str:
    algo = args.algo if args.threads == 1 else f"{args.algo} x {args.threads} threads"
    if ALGORITHMS[args.algo].bound == "interval":
        algo += f", {interval_text(args)}, gate {args.gate}"
    if args.backend == "ray":
        where = "a local Ray" if args.address is None else args.address
        algo += (f"; on {args.nodes} Ray nodes ({where}), exchanging every {args.sync_every} "
                 "updates")
        if ALGORITHMS[args.algo].bound == "interval":
            algo += f", node interval {args.node_interval or args.nodes}, gate {args.node_gate}"
    resumed = f"; resuming {args.resume}" if args.resume else ""
    return (f"{args.model} ({model.num_params:,} parameters) on {args.dataset} "
            f"({data.x_train.shape[0]:,} train / {data.x_test.shape[0]:,} test, loaded in "
            f"{load_s:.1f}s); {algo}, b={args.batch_size}, lr={args.lr:g}, "
            f"momentum={args.momentum:g}{resumed}")


def train_and_report(args: argparse.Namespace, model: models.Model, data: datasets.Dataset,
                     display: Display, snapshot: object, init: np.ndarray | None = None) -> int:
    config = run_config(args)
    checkpoint_path = args.checkpoint or default_checkpoint(args.out)
    saved: list[str] = []

    def write_checkpoint(snap: engine.Snapshot) -> None:
        if not args.no_checkpoint:
            checkpoints.save(checkpoint_path, config, snap)
            saved.append(checkpoint_path)

    interrupts = Interrupts()
    interrupts.install()
    hooks = engine.Hooks(display.epoch_start, display.progress, display.epoch_end,
                         should_stop=interrupts.reason, on_checkpoint=write_checkpoint)
    try:
        result = engine.train(model, data, train_config(args), hooks, resume=snapshot,
                              checkpoint_every=args.checkpoint_every, address=args.address,
                              init=init)
    except checkpoints.CheckpointError as e:  # an array the executor restores does not fit
        print(f"iasgd: error: --resume {args.resume}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as e:  # a worker or every node failed; the others have stopped
        lost = getattr(e, "result", None)  # a cluster lost for good: its results so far
        if lost is not None:
            document = results.results_document(config, lost, model.num_params)
            document["checkpoint"] = saved[-1] if saved else None
            files.write_json_atomic(args.out, document)
        print(f"iasgd: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", EXIT_FAILED)  # a cluster never reached: 2
    document = results.results_document(config, result, model.num_params)
    document["checkpoint"] = saved[-1] if saved else None
    files.write_json_atomic(args.out, document)
    report(display, document, args.out)
    if result.status == "interrupted":
        where = (f"checkpoint in {checkpoint_path}, results so far in {args.out}; continue "
                 f"with --resume {checkpoint_path}" if saved else
                 f"results so far in {args.out} (no checkpoint: --no-checkpoint)")
        print(f"iasgd: interrupted; {where}", file=sys.stderr)
        return interrupts.exit_code()
    if saved and result.diverged_at is None:
        more = ("a larger --time-budget" if result.status == "time_budget"
                else f"--epochs {2 * args.epochs}")
        display.say(f"checkpoint in {checkpoint_path}; to train on: python -m iasgd.run "
                    f"--resume {checkpoint_path} {more}")
    return diverged_exit(result, args)


def diverged_exit(result: engine.RunResult, args: argparse.Namespace) -> int:
    """EXIT_DIVERGED, with one line saying where, if the run diverged; else 0."""
    if result.diverged_at is None:
        return 0
    where = result.diverged_at
    print(f"iasgd: diverged at epoch {where['epoch']}, step {where['step']}: the loss is "
          f"not finite; try a smaller --lr (it was {args.lr:g}); results so far in "
          f"{args.out}", file=sys.stderr)
    return EXIT_DIVERGED


def report(display: Display, document: dict, out: str) -> None:
    acc = document["final_test_accuracy"]
    acc_text = "n/a" if acc is None else f"{100 * acc:.2f}%"
    st = document["staleness"]
    bound = "unbounded" if st["bound"] is None else f"bound {st['bound']}"
    display.say(f"{document['status']}: {len(document['epochs'])} epochs in "
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
