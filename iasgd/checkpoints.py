"""Checkpoints: one HDF5 file per run state, written atomically.

Layout: root attributes `format` ("iasgd-checkpoint") and `version`; string
datasets `config` (the run's configuration, JSON) and `meta` (the engine's
snapshot metadata, JSON: position, random states, controller state, results
so far; datasets, since attributes are limited to 64 KiB); group `arrays`
with one dataset per snapshot array (parameters, momentum, gate state,
counters, histograms, the loss ring, ...).
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from iasgd import files
from iasgd.results import Snapshot

FORMAT = "iasgd-checkpoint"
VERSION = 2  # 2: the gate state of persistent workers (DONE, deadline, ...)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line."""


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
