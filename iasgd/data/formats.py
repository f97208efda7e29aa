"""Parsers of the official dataset file formats, one per format.

A parser has the signature ``parse(spec, sources) -> Dataset``: `spec` is the
dataset's declaration (iasgd.data.registry.DatasetSpec: its input shape, class count,
official files and, in `spec.layout`, what the parser needs to know about the
layout), `sources` the paths of its files on disk, in `spec.files` order.  Every
problem is a one-line DataError that says to re-download.
"""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from iasgd.data.types import DataError, Dataset, describe, one_line, split_problem

if TYPE_CHECKING:
    from iasgd.data.registry import DatasetSpec

# --------------------------------------------------------------------------------------
# CIFAR "python version": one tar archive of pickled batches
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CifarLayout:
    """Members of a CIFAR "python version" archive and the key of their labels."""

    train_members: tuple[str, ...]
    test_member: str
    label_key: bytes


def read_cifar_archive(spec: DatasetSpec, sources: Sequence[Path]) -> Dataset:
    """Read a CIFAR "python version" tar archive (any compression), sources[0], into a
    Dataset with images (N, *spec.input_shape); spec.layout is a CifarLayout."""
    layout: CifarLayout = spec.layout
    batches = _read_cifar_members(sources[0], spec)
    x_test, y_test = batches.pop(layout.test_member)
    train = [batches.pop(m) for m in layout.train_members]
    y_train = np.concatenate([y for _, y in train])
    train_images = [x for x, _ in train]
    del train  # so that _stack_releasing frees each batch as soon as it is copied
    x_train = _stack_releasing(train_images)
    return Dataset(spec.name, x_train, y_train, x_test, y_test, spec.num_classes)


def _read_cifar_members(path: Path, spec: DatasetSpec
                        ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Member name -> (images (n, C, H, W) uint8, labels (n,) int64) for the train and
    test members of spec.layout; DataError if one is absent.

    Reads the archive as a stream: one pass of decompression, whatever the member order
    (random access into a .tar.gz would decompress it again for every member).
    """
    layout: CifarLayout = spec.layout
    wanted = {*layout.train_members, layout.test_member}
    official = spec.files[0].name
    batches: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                key = member.name.removeprefix("./")
                if key in wanted and key not in batches and member.isfile():
                    fileobj = tar.extractfile(member)
                    assert fileobj is not None  # a regular file always has one
                    batches[key] = _read_cifar_batch(fileobj, f"{path}:{key}", spec)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        raise DataError(f"cannot read archive {path} ({one_line(error)}): it is corrupt, "
                        f"truncated or not a tar archive; re-download {official}") from error
    missing = sorted(wanted - batches.keys())
    if missing:
        raise DataError(f"{path} lacks member(s) {', '.join(missing)}: it is not the "
                        f"official {official} layout; re-download it")
    return batches


def _read_cifar_batch(fileobj: IO[bytes], where: str, spec: DatasetSpec
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Unpickle one batch dict and check it: images (n, C, H, W) uint8, labels (n,) int64."""
    label_key = spec.layout.label_key
    try:
        batch = _NumpyOnlyUnpickler(fileobj, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, ImportError, OverflowError, MemoryError, tarfile.TarError,
            zlib.error, OSError) as error:
        raise DataError(f"cannot unpickle {where} ({one_line(error)}): the archive is "
                        "corrupt or not in the official layout; re-download it") from error
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else describe(batch)
        raise DataError(f"{where} is not a CIFAR batch (need a dict with b'data' and "
                        f"{label_key!r}, got {keys}); re-download the archive")
    flat = batch[b"data"]
    row = int(np.prod(spec.input_shape))
    if not isinstance(flat, np.ndarray) or flat.dtype != np.uint8 or flat.ndim != 2 \
            or flat.shape[1] != row:
        raise DataError(f"{where}: b'data' must be uint8 (n, {row}), got {describe(flat)}; "
                        "re-download the archive")
    labels = _labels_array(batch[label_key], where)
    images = np.ascontiguousarray(flat).reshape(len(flat), *spec.input_shape)
    problem = split_problem(images, labels, spec.input_shape, spec.num_classes)
    if problem is not None:
        raise DataError(f"{where}: {problem}; re-download the archive")
    return images, labels
def _labels_array(labels: Any, where: str) -> np.ndarray:
    """labels (a list of ints or an integer array) as int64 (n,)."""
    try:
        array = np.asarray(labels)
    except (ValueError, TypeError) as error:
        raise DataError(f"{where}: labels are not a list of ints ({one_line(error)})") \
            from error
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise DataError(f"{where}: labels must be a flat list of ints, got {describe(array)}; "
                        "re-download the archive")
    return array.astype(np.int64)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that builds only numpy arrays: a pickle is code, an archive from the net
    is not trusted, and CIFAR batches need nothing else."""

    _ALLOWED = frozenset({
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        # Python 3 writes bytes as _codecs.encode(str, "latin1") at pickle protocol 2.
        ("_codecs", "encode"),
    })

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _stack_releasing(parts: list[np.ndarray]) -> np.ndarray:
    """np.concatenate(parts) along axis 0, emptying `parts` as it goes.

    np.empty pages are only touched as they are filled and each part is freed once copied,
    so peak memory stays near one copy of the data instead of two.
    """
    total = sum(len(p) for p in parts)
    out = np.empty((total, *parts[0].shape[1:]), dtype=parts[0].dtype)
    start = 0
    while parts:
        part = parts.pop(0)
        out[start:start + len(part)] = part
        start += len(part)
        del part
    return out


# --------------------------------------------------------------------------------------
# idx: four files (train images, train labels, test images, test labels), gzipped or not
# --------------------------------------------------------------------------------------


def read_idx_dataset(spec: DatasetSpec, sources: Sequence[Path]) -> Dataset:
    """Read four idx files (train images, train labels, test images, test labels) into a
    Dataset with images (N, *spec.input_shape); grayscale, so spec.input_shape is (1, H, W)."""
    shape = spec.input_shape
    splits = []
    for images_path, labels_path in ((sources[0], sources[1]), (sources[2], sources[3])):
        images = _read_idx(images_path, ndim=3)
        labels = _read_idx(labels_path, ndim=1).astype(np.int64)
        if images.shape[1:] != shape[1:]:
            raise DataError(f"{images_path} holds {images.shape[1:]} images, expected "
                            f"{shape[1:]}; re-download it")
        images = images.reshape(len(images), *shape)
        problem = split_problem(images, labels, shape, spec.num_classes)
        if problem is not None:
            raise DataError(f"{images_path} / {labels_path}: {problem}; re-download them")
        splits.append((images, labels))
    (x_train, y_train), (x_test, y_test) = splits
    return Dataset(spec.name, x_train, y_train, x_test, y_test, spec.num_classes)


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    """Read an idx file of unsigned bytes (gzipped or not) into a uint8 array of `ndim` dims.

    Layout: 2 zero bytes, type code 0x08 (ubyte), number of dims, each dim as a big-endian
    uint32, then the data in C order.  The data must fill the file exactly.
    """
    try:
        with _open_maybe_gzip(path) as f:
            magic = f.read(4)
            if len(magic) != 4 or magic[:2] != b"\0\0" or magic[2] != 0x08 \
                    or magic[3] != ndim:
                raise DataError(f"{path} is not an idx file of {ndim}-d unsigned bytes "
                                f"(header {magic.hex() or 'empty'}); re-download it")
            dims_raw = f.read(4 * ndim)
            if len(dims_raw) != 4 * ndim:
                raise DataError(f"{path} is truncated in its header; re-download it")
            dims = tuple(int(d) for d in np.frombuffer(dims_raw, dtype=">u4"))
            data = np.empty(dims, dtype=np.uint8)
            filled = _read_into(f, data)
            if filled != data.size or f.read(1):
                raise DataError(f"{path} holds {'fewer' if filled < data.size else 'more'} "
                                f"bytes than its header's shape {dims}; re-download it")
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"cannot read {path} ({one_line(error)}): it is corrupt or "
                        "truncated; re-download it") from error
    return data


def _open_maybe_gzip(path: Path) -> io.BufferedIOBase:
    """Open path for binary reading, decompressing it if it starts with the gzip magic."""
    with open(path, "rb") as probe:
        is_gzip = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if is_gzip else open(path, "rb")


def _read_into(f: io.BufferedIOBase, out: np.ndarray) -> int:
    """Fill the contiguous array out from f; return the number of bytes read (short at EOF)."""
    view = memoryview(out).cast("B")
    filled = 0
    while filled < len(view):
        n = f.readinto(view[filled:])
        if not n:
            break
        filled += n
    return filled
