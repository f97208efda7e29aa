"""Resuming a run from its checkpoint (`python -m iasgd.run --resume`): which
options a resume takes from the saved run and which from its command line,
where it writes, and what it refuses (another model, dataset or training
option; nothing left to train; another run's results in the way).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from iasgd import options as O
from iasgd.config import TrainConfig
from iasgd.options import UsageError

if TYPE_CHECKING:
    from iasgd.results import Snapshot
    from iasgd.run import RunOptions


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


def resumed_values(args: argparse.Namespace, saved: dict, given: set[str]) -> dict:
    """The option values of the run saved with the configuration `saved`,
    with those RESUME_MAY_CHANGE taken from the command line `args` (the
    fields `given` there) and its outputs (resumed_outputs). UsageError if
    it asks for another model, dataset or training option."""
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
    return _without_what_did_nothing(merged)


def _without_what_did_nothing(values: dict) -> dict:
    """A saved run's training options that had no effect on it (an older
    iasgd took them silently) at their defaults, which is what they were to
    that run; else its resume would be refused for an option no one can drop."""
    run = argparse.Namespace(**values)
    return {**values, **{f.name: f.default for f in dataclasses.fields(TrainConfig)
                         if O.applies(f) is not None and not O.applies(f).test(run)}}


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


def check_work_left(cfg: TrainConfig, opts: RunOptions, snapshot: Snapshot) -> None:
    """A resume that would train nothing is refused: all --epochs done, or the
    --time-budget already spent (training seconds)."""
    meta = snapshot.meta
    done = meta.get("epoch", 1) - 1  # epochs finished; `epoch` is the next one to run
    if done >= cfg.epochs:
        raise UsageError(f"--resume {opts.resume}: the run has finished {done} epochs, "
                         f"--epochs is {cfg.epochs}; give --epochs more than {done} to "
                         "extend it")
    spent = meta.get("result", {}).get("train_time_s", 0.0) + meta.get("epoch_time", 0.0)
    if cfg.time_budget is not None and spent >= cfg.time_budget:
        raise UsageError(f"--resume {opts.resume}: the run has trained {spent:.1f}s, "
                         f"--time-budget is {cfg.time_budget:g}; give a larger --time-budget "
                         "to continue it")


def _comparable(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value
