"""The sweep file: every run of a `bench/scaling.py` thread sweep in one JSON
document, which the script writes (and, while it runs, `<name>.partial.json`
after each run) and `python -m iasgd.plot` and the other benches read. This
module is its one definition: the document's keys, a run's `Record`, the
format's version, how a file is written (atomically) and read back (a
`SweepError` of one line for a file that is not a sweep).

    {"version": 1,
     "options": {...},   the sweep's options by Python name (--threads, --lrs, ...)
     "simulated": bool, "machine": {...}, "date": "2026-11-30", "sweep_seconds": s,
     "summary": {LR: {ALGO: {THREADS: ...}}}, "headline": [...],  (the report's tables)
     "runs": {ALGO: {THREADS: [Record, ...]}}}

ALGO is a name of `ALGOS`, THREADS a thread count as a string (a JSON key),
and each list holds one record per (lr, seed) in the order they ran. A
partial file holds `version`, `options`, `runs` and `seconds` alone.

Older files read as they are: without `version` (they are version 1);
records without lr and seed (before --lrs: the sweep's one lr, and the seed
is the record's place among those of its lr, `tagged`); without `evals`
(epoch ends only); options with one `target_accuracy` (`upgraded`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from iasgd import files
from iasgd.algorithms import VARIANTS
from iasgd.config import TrainConfig

VERSION = 1  # the format this iasgd writes, and the newest it reads
ALGOS = VARIANTS  # the sweep's algorithm names -> their run options
PLOTTED = ("staleness_hist", "curve")  # what every reader of a record needs
REPORTED = ("samples_per_s", "staleness_mean", "staleness_max", "acceptance_rate",
            "final_accuracy")  # and what bench/scaling.py's tables need besides


class Record(TypedDict, total=False):
    """One run of a sweep, as `record` makes it; times are seconds of
    training (simulated ones in a simulated sweep), accuracies in [0, 1]
    (null where not finite). Files older than a key lack it."""

    lr: float
    seed: int
    samples_per_s: float  # applied samples per second
    staleness_mean: float
    staleness_max: int
    staleness_hist: list[int]  # [k]: applied updates with staleness k (last bin: >= k)
    acceptance_rate: float  # applied / computed
    final_accuracy: float | None
    status: str  # completed, time_budget, diverged, interrupted; a sweep's own stop: target_reached
    eval_time_s: float  # evaluation, outside the training clock
    curve: list[list[float]]  # [t_s, test accuracy] at each epoch end
    evals: list[list[float]]  # [t_s, applied, test accuracy] every --eval-every updates
    time_to_target_s: dict[str, float | None]  # by target ("0.55"), set when reported
    updates_to_target: dict[str, float | None]  # the same in applied updates, with evals
    foreign_cpu: float | None  # share of the CPUs other processes used during the run


class SweepError(ValueError):
    """A file that is not a sweep this iasgd reads; the message is one line."""


def record(doc: dict[str, Any], lr: float, seed: int) -> Record:
    """The record of one run from its results document
    (`results.results_document`), before it is scored."""
    return {
        "lr": lr, "seed": seed, "samples_per_s": doc["samples_per_s"],
        "staleness_mean": doc["staleness"]["mean"], "staleness_max": doc["staleness"]["max"],
        "staleness_hist": doc["staleness"]["hist"], "acceptance_rate": doc["acceptance_rate"],
        "final_accuracy": doc["final_test_accuracy"], "status": str(doc["status"]),
        "eval_time_s": doc["eval_time_s"],
        "curve": [[e["wall_s"], e["test_accuracy"]] for e in doc["epochs"]],
        "evals": doc["evals"],
    }


def accuracy_points(run: Record) -> list[list[float]]:
    """[t_s, accuracy] of every evaluation of a run: its evals when it has
    them (they include the epoch ends), else its epoch ends."""
    if run.get("evals"):
        return [[t, acc] for t, _, acc in run["evals"]]
    return run["curve"]


def tagged(records: Sequence[Record], lr: float | None) -> list[Record]:
    """The records of one (algorithm, threads), each with its lr and seed:
    a record older than --lrs has neither (its sweep ran `lr` alone, and its
    seed is its place among the records of its lr)."""
    out: list[Record] = []
    seen: dict[Any, int] = {}
    for run in records:
        run = {"lr": lr, **run}
        run.setdefault("seed", seen.get(run["lr"], 0))
        seen[run["lr"]] = seen.get(run["lr"], 0) + 1
        out.append(run)
    return out


def upgraded(options: dict[str, Any]) -> dict[str, Any]:
    """A sweep's options with the knobs of newer sweeps: older files name one
    target_accuracy, run one lr, evaluate at epoch ends only, have no
    staleness budget and train for a time budget without a recipe."""
    options = dict(options)
    target = options.pop("target_accuracy", 0.5)
    options.setdefault("targets", [target])
    options.setdefault("lrs", [options.get("lr", TrainConfig.lr)])
    options.setdefault("eval_every", 0)
    options.setdefault("staleness_budget", TrainConfig.staleness_budget)
    options.setdefault("epochs", None)
    options.setdefault("recipe", None)
    options.setdefault("stop_at_target", False)
    return options


def write(path: str | Path, doc: dict[str, Any]) -> None:
    """Write a sweep document (or a partial one) to `path` with this
    format's version, atomically: a reader never sees half a file."""
    files.write_json_atomic(path, {"version": VERSION, **doc})


def read(path: str | Path, fields: Sequence[str] = PLOTTED) -> dict[str, Any]:
    """The sweep document in `path`, checked (`check`); SweepError, one
    line, for a file that cannot be read, is not JSON or is not a sweep."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise SweepError(f"{path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise SweepError(f"{path} is not JSON ({e.msg} at line {e.lineno})") from None
    return check(doc, str(path), fields)


def is_sweep(doc: Any) -> bool:
    """Whether a JSON document claims to be a sweep (it has options and runs)."""
    return isinstance(doc, dict) and "options" in doc and "runs" in doc


def check(doc: Any, source: str, fields: Sequence[str] = PLOTTED) -> dict[str, Any]:
    """`doc` if it is a sweep whose records have `fields` (the staleness
    histogram and the curve are checked to the number); else SweepError,
    one line that names `source` and what is wrong."""
    version = doc.get("version", 1) if is_sweep(doc) else 1
    if _whole(version) and version > VERSION:
        raise SweepError(f"{source} is a bench/scaling.py sweep of format version {version}, "
                         f"newer than this iasgd reads ({VERSION}); update iasgd")
    problem = _problem(doc, fields)
    if problem is not None:
        raise SweepError(f"{source} is not a bench/scaling.py sweep ({problem}); name the "
                         "JSON file a sweep wrote")
    return doc


def _problem(doc: Any, fields: Sequence[str]) -> str | None:
    """What keeps `doc` from being a sweep, in a few words; None if nothing."""
    if not is_sweep(doc):
        return "no options and runs" if isinstance(doc, dict) else "not a JSON object"
    version = doc.get("version", 1)
    if not _whole(version) or version < 1:
        return f"version {version!r} is not a format version"
    if not isinstance(doc["options"], dict):
        return "options is not an object"
    if not isinstance(doc["runs"], dict):
        return "runs is not an object"
    for algo, by_threads in doc["runs"].items():
        if not isinstance(by_threads, dict):
            return f"runs[{algo}] is not an object of thread counts"
        for threads, runs in by_threads.items():
            where = f"runs[{algo}][{threads}]"
            if not threads.isdigit():
                return f"{where}: {threads} is not a thread count"
            if not isinstance(runs, list):
                return f"{where} is not a list of runs"
            for i, run in enumerate(runs):
                problem = _record_problem(run, fields)
                if problem:
                    return f"{where}[{i}] {problem}"
    return None


def _record_problem(run: Any, fields: Sequence[str]) -> str | None:
    if not isinstance(run, dict):
        return "is not an object"
    missing = [f for f in fields if f not in run]
    if missing:
        return f"has no {', '.join(missing)}"
    shapes = (("staleness_hist", _counts, "a list of counts"),
              ("curve", lambda v: _rows(v, 2), "a list of [seconds, accuracy]"),
              ("evals", lambda v: v is None or _rows(v, 3),
               "a list of [seconds, applied, accuracy]"),
              ("seed", _whole, "a whole number"))
    for key, fits, shape in shapes:
        if key in run and not fits(run[key]):
            return f"{key} is not {shape}"
    return None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _counts(value: Any) -> bool:
    return isinstance(value, list) and all(_whole(v) and v >= 0 for v in value)


def _rows(value: Any, width: int) -> bool:
    """A list of rows of `width` numbers each (the last, an accuracy, may be null)."""
    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    return isinstance(value, list) and all(
        isinstance(row, list) and len(row) == width and all(map(number, row[:-1]))
        and (row[-1] is None or number(row[-1])) for row in value)
