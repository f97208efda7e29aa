"""The HDF5 cache of a dataset: <data_dir>/<name>.h5, written atomically, checked on read.

The cache records the sha256 of the source files it was built from and their
(path, size, mtime) fingerprint: a cache is current while the sources' content is
unchanged, and the fingerprint spares hashing a 170 MB archive on every load.  The cache of
a user's own file (iasgd.data.own) also records how it was converted (test fraction,
seed, layout) and is rebuilt when that changes; its shape and class count are its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from iasgd.data.types import DataError, Dataset, one_line, split_problem
from iasgd.files import replacing

if TYPE_CHECKING:
    from iasgd.data.registry import DatasetSpec

# Bump when the layout or meaning of the HDF5 cache changes: older caches are rebuilt.
CACHE_FORMAT_VERSION = 1

_CHUNK_BYTES = 1 << 20
_CACHE_KEYS = ("x_train", "y_train", "x_test", "y_test")


def sha256_of_files(paths: Sequence[Path]) -> str:
    """Space-separated sha256 hex digests of the files, in order (read in chunks)."""
    digests = []
    for path in paths:
        sha = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while chunk := f.read(_CHUNK_BYTES):
                    sha.update(chunk)
        except OSError as error:
            raise DataError(f"cannot read {path} ({one_line(error)}): check that it is a "
                            "readable file") from error
        digests.append(sha.hexdigest())
    return " ".join(digests)


def fingerprint(paths: Sequence[Path]) -> str:
    """JSON of (absolute path, size, mtime_ns) per file: if unchanged, the content is
    assumed unchanged, which spares hashing a 170 MB archive on every load."""
    entries = []
    for path in paths:
        stat = path.stat()
        entries.append([str(path.absolute()), stat.st_size, stat.st_mtime_ns])
    return json.dumps(entries)


def load_if_current(spec: DatasetSpec, cache: Path, sources: list[Path] | None
                    ) -> Dataset | None:
    """The cached dataset, or None when it must be rebuilt from `sources`.

    Rebuilt when the cache format is old or the sources' content changed; with no sources
    the cache alone is used.  A damaged cache is a DataError, never silently used.
    """
    return _load_if_current(cache, spec.name, sources, spec.input_shape, spec.num_classes)


def load_converted_if_current(cache: Path, name: str, source: Path, conversion: str
                              ) -> Dataset | None:
    """The cached dataset read from a user's file `source`, or None when it must be re-read.

    As load_if_current, and also re-read when the file was converted with other options
    (`conversion`, recorded by write_or_warn); the images' shape and the class count are
    the cache's own, checked for consistency.
    """
    return _load_if_current(cache, name, [source], None, None, conversion)


def _load_if_current(cache: Path, name: str, sources: list[Path] | None,
                     input_shape: tuple[int, int, int] | None, num_classes: int | None,
                     conversion: str = "") -> Dataset | None:
    """load_if_current for a dataset `name` of the given (C, H, W) and class count, or of
    those the cache records when None."""
    attrs = _read_cache_attrs(cache, name)
    if attrs.version != CACHE_FORMAT_VERSION:
        if sources is None:
            raise DataError(f"cache {cache} has format {attrs.version}, this iasgd needs "
                            f"{CACHE_FORMAT_VERSION} and the source files are not found: "
                            "provide them (or --archive) to rebuild it")
        return None
    if attrs.conversion != conversion:
        return None
    new_fingerprint = None
    if sources is not None and fingerprint(sources) != attrs.source_fingerprint:
        if sha256_of_files(sources) != attrs.source_sha256:
            return None
        new_fingerprint = fingerprint(sources)
    if num_classes is None:
        if attrs.num_classes is None:
            raise DataError(f"cache {cache} lacks attribute num_classes: delete it so that it "
                            "is rebuilt from the source")
        num_classes = attrs.num_classes
    dataset = _read_cache_arrays(cache, name, input_shape, num_classes)
    if new_fingerprint is not None:
        # Same content under a new path or mtime: record it so the next load skips hashing.
        write_or_warn(cache, dataset, attrs.source_sha256, new_fingerprint, conversion)
    return dataset


@contextlib.contextmanager
def _open_cache(cache: Path) -> Iterator[h5py.File]:
    """Open the cache read-only; any failure to open or read it becomes a DataError."""
    try:
        # No HDF5 file locking: caches are never modified in place (see _write_cache),
        # and locking fails on some network file systems.
        with h5py.File(cache, "r", locking=False) as f:
            yield f
    except DataError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as error:
        # h5py reports a damaged file as OSError mostly, but not only.
        raise DataError(f"cache {cache} is unreadable ({one_line(error)}): delete it so "
                        "that it is rebuilt from the source") from error


@dataclass(frozen=True)
class _CacheAttrs:
    """What a cache records besides its arrays."""

    version: int
    source_sha256: str
    source_fingerprint: str
    num_classes: int | None  # None: not recorded
    conversion: str  # "" for the registry's datasets, which are not converted by options


def _read_cache_attrs(cache: Path, name: str) -> _CacheAttrs:
    """The attributes stored in the cache of dataset `name`."""
    with _open_cache(cache) as f:
        attrs = dict(f.attrs)
    missing = [k for k in ("format_version", "dataset", "source_sha256", "source_fingerprint")
               if k not in attrs]
    if missing:
        raise DataError(f"cache {cache} lacks attribute(s) {', '.join(missing)}: delete it "
                        "so that it is rebuilt from the source")
    if _as_str(attrs["dataset"]) != name:
        raise DataError(f"cache {cache} holds dataset {_as_str(attrs['dataset'])!r}, not "
                        f"{name!r}: delete it so that it is rebuilt from the source")
    num_classes = attrs.get("num_classes")
    return _CacheAttrs(int(attrs["format_version"]), _as_str(attrs["source_sha256"]),
                       _as_str(attrs["source_fingerprint"]),
                       None if num_classes is None else int(num_classes),
                       _as_str(attrs.get("conversion", "")))


def _as_str(value: Any) -> str:
    """An HDF5 string attribute as str (h5py may return bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_cache_arrays(cache: Path, name: str, input_shape: tuple[int, int, int] | None,
                       num_classes: int) -> Dataset:
    """Read x/y train/test from the cache of dataset `name` and check them against its
    (C, H, W) (None: any, the same for both splits) and class count."""
    advice = "delete it so that it is rebuilt from the source"
    arrays = {}
    with _open_cache(cache) as f:
        missing = [k for k in _CACHE_KEYS if not isinstance(f.get(k), h5py.Dataset)]
        if missing:
            raise DataError(f"cache {cache} lacks {', '.join(missing)}: {advice}")
        for key in _CACHE_KEYS:
            stored = f[key]
            expected_ndim = 4 if key.startswith("x") else 1
            if stored.ndim != expected_ndim or not np.issubdtype(stored.dtype, np.integer):
                raise DataError(f"cache {cache}: {key} is {stored.dtype} {stored.shape}, "
                                f"expected an integer array of {expected_ndim} dims: {advice}")
            arrays[key] = stored[()]
    arrays["y_train"] = arrays["y_train"].astype(np.int64, copy=False)
    arrays["y_test"] = arrays["y_test"].astype(np.int64, copy=False)
    image_shape = input_shape
    for split in ("train", "test"):
        problem = split_problem(arrays[f"x_{split}"], arrays[f"y_{split}"],
                                 image_shape, num_classes)
        if problem is not None:
            raise DataError(f"cache {cache}, {split} split: {problem}: {advice}")
        image_shape = arrays[f"x_{split}"].shape[1:]  # the test split must match the train's
    return Dataset(name, num_classes=num_classes, **arrays)


def write_or_warn(cache: Path, dataset: Dataset, source_sha256: str,
                  fingerprint: str, conversion: str = "") -> None:
    """Write the cache; if that fails (read-only data dir, disk full) warn and go on.

    conversion: how a user's file was converted (its options as a string), "" for the
    registry's datasets.
    """
    try:
        _write_cache(cache, dataset, source_sha256, fingerprint, conversion)
    except OSError as error:
        warnings.warn(f"cannot write cache {cache} ({one_line(error)}): the data will be "
                      "read from the source again next time", stacklevel=3)


def _write_cache(cache: Path, dataset: Dataset, source_sha256: str, fingerprint: str,
                 conversion: str = "") -> None:
    """Write dataset to cache atomically (iasgd.files.replacing): a crash or a concurrent
    reader never sees a half-written cache."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    with replacing(cache) as temporary, h5py.File(temporary, "w") as f:
        for key in _CACHE_KEYS:
            # Contiguous and uncompressed: reading 180 MB back then takes ~0.1 s.
            f.create_dataset(key, data=getattr(dataset, key))
        f.attrs["format_version"] = CACHE_FORMAT_VERSION
        f.attrs["dataset"] = dataset.name
        f.attrs["num_classes"] = dataset.num_classes
        f.attrs["source_sha256"] = source_sha256
        f.attrs["source_fingerprint"] = fingerprint
        if conversion:  # absent means "" (the registry's caches never had it)
            f.attrs["conversion"] = conversion
