"""Checkpoints: one HDF5 file per run state, written atomically.

Layout: root attributes `format` ("iasgd-checkpoint") and `version`; string
datasets `config` (the run's configuration, JSON) and `meta` (the engine's
snapshot metadata, JSON: position, random states, controller state, results
so far; datasets, since attributes are limited to 64 KiB); group `arrays`
with one dataset per snapshot array (parameters, momentum, gate state,
counters, histograms, the loss ring, ...).

`check_fits` compares a loaded snapshot with what a run restores from it
(the executors say what that is), so that a checkpoint of another model,
configuration or version is a one-line error rather than a crash.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from numbers import Real
from pathlib import Path

import h5py
import numpy as np

from iasgd import files
from iasgd.results import Snapshot

FORMAT = "iasgd-checkpoint"
VERSION = 2  # 2: the gate state of persistent workers (DONE, deadline, ...)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line."""


# An array a run restores: its exact shape and dtype.
ArraySpec = tuple[tuple[int, ...], np.dtype]


def check_fits(snapshot: Snapshot, meta: Mapping[str, type] | None = None,
               arrays: Mapping[str, ArraySpec] | None = None) -> None:
    """Raise CheckpointError (one line, naming the first misfit) unless the
    snapshot's metadata hold every key of `meta` with a value of its type
    (float: any real number) and its arrays every one of `arrays` with
    exactly that shape and dtype: what a run restores from it."""
    for problem in (_meta_problem(snapshot.meta, meta or {}),
                    _array_problem(snapshot.arrays, arrays or {})):
        if problem:
            raise misfit(problem)


def misfit(problem: str) -> CheckpointError:
    """The error of a checkpoint that does not fit the run resuming it;
    problem: what is wrong with it, e.g. "it lacks the array 'params'"."""
    return CheckpointError(f"the checkpoint does not fit this run: {problem} (a checkpoint of "
                           "another model, configuration or iasgd version?); use a checkpoint "
                           "of this run, or start afresh")


def _meta_problem(saved: object, needed: Mapping[str, type]) -> str | None:
    if not isinstance(saved, dict):
        return "its metadata are not a JSON object"
    for key, kind in needed.items():
        if key not in saved:
            return f"its metadata lack {key!r}"
        if not _is_a(saved[key], kind):
            return f"its metadata {key!r} is {saved[key]!r}, not a JSON {kind.__name__}"
    return None


def _is_a(value: object, kind: type) -> bool:
    """Whether a JSON value is of `kind`: a bool is no int (as it is to Python),
    and any number will do for a float (one may have been written as 0)."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, Real if kind is float else kind)


def _array_problem(saved: Mapping[str, np.ndarray], needed: Mapping[str, ArraySpec]) -> str | None:
    for name, (shape, dtype) in needed.items():
        if name not in saved:
            return f"it lacks the array {name!r}"
        array = saved[name]
        if array.shape != tuple(shape) or array.dtype != dtype:
            return (f"its array {name!r} is {array.dtype} of shape {array.shape}, this run's is "
                    f"{np.dtype(dtype)} of shape {tuple(shape)}")
    return None


def save(path: str | Path, config: dict, snapshot: Snapshot) -> None:
    """Write the snapshot and the run's configuration to `path`, via a
    temporary file in the same directory and a rename: an interrupted write
    never leaves a half-written checkpoint, and an older one survives."""
    with files.replacing(path) as tmp, h5py.File(tmp, "w") as f:
        f.attrs["format"] = FORMAT
        f.attrs["version"] = VERSION
        f["config"] = json.dumps(config)
        f["meta"] = json.dumps(snapshot.meta)  # may hold inf: Python reads it back
        group = f.create_group("arrays")
        for name, array in snapshot.arrays.items():
            group.create_dataset(name, data=array)


def load(path: str | Path) -> tuple[dict, Snapshot]:
    """(config, snapshot) from a checkpoint; CheckpointError if it is missing,
    corrupt, truncated or not an iasgd checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise CheckpointError(f"{path} is not an iasgd checkpoint")
            if int(f.attrs.get("version", -1)) != VERSION:
                raise CheckpointError(f"{path} has checkpoint version {f.attrs.get('version')}, "
                                      f"this iasgd reads version {VERSION}")
            config = json.loads(f["config"][()])
            meta = json.loads(f["meta"][()])
            arrays = {name: np.array(f["arrays"][name]) for name in f["arrays"]}
    except CheckpointError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({e}); "
                              "use another one or start afresh") from None
    return config, Snapshot(arrays, meta)
