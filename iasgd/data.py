"""Datasets as uint8 image arrays: CIFAR-10, CIFAR-100, Fashion-MNIST and a synthetic set.

Every dataset is a :class:`Dataset` holding ``x`` as uint8 ``(N, C, H, W)`` (C-contiguous)
and ``y`` as int64 ``(N,)``.  Real datasets come from their official files (an archive or,
for Fashion-MNIST, four idx files), which are looked up locally and otherwise downloaded.
The first load converts them to ``<data_dir>/<name>.h5``; later loads read that cache,
which takes a fraction of a second.

This is the only module of ``iasgd`` that does file or network I/O.  Every problem with
the data (missing, corrupt, unexpected layout) is raised as :class:`DataError`, whose
message is one line saying what is wrong and what to do.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import io
import json
import os
import pickle
import sys
import tarfile
import urllib.error
import urllib.request
import warnings
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import h5py
import numpy as np
from tqdm import tqdm

from iasgd.metrics import replacing

DATASETS: tuple[str, ...] = ("cifar10", "cifar100", "fashion-mnist", "synthetic")

# Bump when the layout or meaning of the HDF5 cache changes: older caches are rebuilt.
CACHE_FORMAT_VERSION = 1

# Where the Debian package dataset-fashion-mnist installs the four idx files.
SYSTEM_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

DATA_DIR_ENV = "IASGD_DATA"

_CHUNK_BYTES = 1 << 20
_CACHE_KEYS = ("x_train", "y_train", "x_test", "y_test")


class DataError(ValueError):
    """A dataset cannot be loaded; the message is one line: what is wrong, what to do."""


# --------------------------------------------------------------------------------------
# The dataset container
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    """Train and test splits of one image-classification dataset.

    x_train: uint8 (N, C, H, W), C-contiguous; y_train: int64 (N,) in [0, num_classes).
    x_test:  uint8 (M, C, H, W), C-contiguous; y_test:  int64 (M,) in [0, num_classes).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    def __post_init__(self) -> None:
        if not isinstance(self.num_classes, int | np.integer) or self.num_classes < 1:
            raise DataError(f"dataset {self.name!r}: num_classes must be a positive int, "
                            f"got {self.num_classes!r}")
        image_shape = None  # the train split sets the shape the test split must match
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            problem = _split_problem(x, y, image_shape, self.num_classes)
            if problem is not None:
                raise DataError(f"dataset {self.name!r}, {split} split: {problem}")
            image_shape = x.shape[1:]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        c, h, w = self.x_train.shape[1:]
        return (int(c), int(h), int(w))


def _split_problem(x: Any, y: Any, image_shape: tuple[int, ...] | None,
                   num_classes: int) -> str | None:
    """Describe what is wrong with images x (N, C, H, W) and labels y (N,), or None if fine.

    image_shape: the (C, H, W) the images must have, or None for any.
    """
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 4:
        return f"images must be a uint8 array (N, C, H, W), got {_describe(x)}"
    if not x.flags.c_contiguous:
        return "images must be C-contiguous"
    if image_shape is not None and x.shape[1:] != tuple(image_shape):
        return f"images have shape {x.shape[1:]} per item, expected {tuple(image_shape)}"
    if not isinstance(y, np.ndarray) or y.dtype != np.int64 or y.ndim != 1:
        return f"labels must be an int64 array (N,), got {_describe(y)}"
    if len(x) != len(y):
        return f"{len(x)} images but {len(y)} labels"
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        return f"labels span [{y.min()}, {y.max()}], outside [0, {num_classes})"
    return None


def _describe(value: Any) -> str:
    """Short type/dtype/shape description of value for error messages."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__


# --------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """The data directory: data_dir if given, else $IASGD_DATA if set, else ./data (absolute)."""
    if data_dir is None or str(data_dir) == "":
        data_dir = os.environ.get(DATA_DIR_ENV) or "data"
    return Path(data_dir).expanduser().absolute()


def load(name: str, data_dir: str | Path | None = None, archive: str | Path | None = None,
         progress: bool = True) -> Dataset:
    """Load dataset `name` (one of DATASETS), from the HDF5 cache when it is current.

    archive: the source to use instead of the official file name in data_dir: for CIFAR a
    tar archive in the official layout (any file name, any checksum), for fashion-mnist a
    directory holding the four idx files.  progress: show download progress and say when
    the cache is built (on stderr).  The cache is skipped, with a warning, when data_dir is
    not writable.
    """
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}")
    if name == "synthetic":
        return synthetic()
    root = resolve_data_dir(data_dir)
    cache = root / f"{name}.h5"
    sources = _find_local_sources(name, root, archive)
    if cache.exists():
        dataset = _load_cache_if_current(name, cache, sources)
        if dataset is not None:
            return dataset
    if sources is None:
        sources = _download_sources(name, root, progress)
    if progress:
        origin = sources[0] if len(sources) == 1 else f"{sources[0].parent}/"
        print(f"iasgd: converting {name} from {origin} to {cache} (only once)",
              file=sys.stderr)
    dataset = _parse_sources(name, sources)
    _write_cache_or_warn(cache, dataset, _sha256_of_files(sources), _fingerprint(sources))
    return dataset


# --------------------------------------------------------------------------------------
# Official sources
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RemoteFile:
    """One official file: its name, where to download it and its md5."""

    name: str
    url: str
    md5: str


@dataclass(frozen=True)
class _CifarSpec:
    """Official layout of one CIFAR "python version" archive."""

    archive: _RemoteFile
    train_members: tuple[str, ...]
    test_member: str
    label_key: bytes
    num_classes: int


_CIFAR: dict[str, _CifarSpec] = {
    "cifar10": _CifarSpec(
        archive=_RemoteFile("cifar-10-python.tar.gz",
                            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                            "c58f30108f718f92721af3b95e74349a"),
        train_members=tuple(f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)),
        test_member="cifar-10-batches-py/test_batch",
        label_key=b"labels",
        num_classes=10,
    ),
    "cifar100": _CifarSpec(
        archive=_RemoteFile("cifar-100-python.tar.gz",
                            "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                            "eb9058c3a382ffc7106e4002c42a8d85"),
        train_members=("cifar-100-python/train",),
        test_member="cifar-100-python/test",
        label_key=b"fine_labels",
        num_classes=100,
    ),
}
_CIFAR_IMAGE_SHAPE = (3, 32, 32)

_FASHION_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
# Order matters: train images, train labels, test images, test labels.
_FASHION_FILES: tuple[_RemoteFile, ...] = tuple(
    _RemoteFile(name, _FASHION_URL + name, md5) for name, md5 in (
        ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
        ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
        ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
        ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
    ))
_FASHION_IMAGE_SHAPE = (1, 28, 28)
_FASHION_NUM_CLASSES = 10


def _image_shape(name: str) -> tuple[int, int, int]:
    """(C, H, W) of the real dataset `name`."""
    return _FASHION_IMAGE_SHAPE if name == "fashion-mnist" else _CIFAR_IMAGE_SHAPE


def _num_classes(name: str) -> int:
    """Number of classes of the real dataset `name`."""
    return _FASHION_NUM_CLASSES if name == "fashion-mnist" else _CIFAR[name].num_classes


def _find_local_sources(name: str, root: Path, archive: str | Path | None) -> list[Path] | None:
    """Source files of `name` already on disk (no download), or None when there are none.

    An explicit `archive` must exist; files found locally are used whatever their checksum,
    since the user (or a distribution package) put them there on purpose.
    """
    if name == "fashion-mnist":
        return _find_fashion_files(root, archive)
    spec = _CIFAR[name]
    if archive is not None:
        path = Path(archive).expanduser()
        if not path.is_file():
            raise DataError(f"archive {path} does not exist or is not a file: pass the "
                            f"{spec.archive.name} tarball (official layout)")
        return [path]
    path = root / spec.archive.name
    return [path] if path.is_file() else None


def _find_fashion_files(root: Path, archive: str | Path | None) -> list[Path] | None:
    """The four Fashion-MNIST idx files, from `archive` (a directory), else
    <root>/fashion-mnist/, else SYSTEM_FASHION_MNIST_DIR; None when no place has all four."""
    if archive is not None:
        directory = Path(archive).expanduser()
        if not directory.is_dir():
            raise DataError(f"archive {directory} must be a directory holding the four "
                            f"Fashion-MNIST idx files ({_FASHION_FILES[0].name}, ...)")
        files = _idx_files_in(directory)
        if files is None:
            names = ", ".join(remote.name for remote in _FASHION_FILES)
            raise DataError(f"{directory} does not hold all four Fashion-MNIST idx files "
                            f"({names}; gzipped or not): put them there")
        return files
    for directory in (root / "fashion-mnist", SYSTEM_FASHION_MNIST_DIR):
        files = _idx_files_in(directory)
        if files is not None:
            return files
    return None


def _idx_files_in(directory: Path) -> list[Path] | None:
    """The four Fashion-MNIST files in directory, in _FASHION_FILES order, or None unless
    all four are there."""
    found = [_idx_file_in(directory, remote.name) for remote in _FASHION_FILES]
    present = [path for path in found if path is not None]
    return present if len(present) == len(found) else None


def _idx_file_in(directory: Path, gz_name: str) -> Path | None:
    """directory/gz_name, else its uncompressed twin (name without .gz), else None."""
    for candidate in (directory / gz_name, directory / gz_name.removesuffix(".gz")):
        if candidate.is_file():
            return candidate
    return None


def _download_sources(name: str, root: Path, progress: bool) -> list[Path]:
    """Download the official files of `name` into root (fashion-mnist: root/fashion-mnist)."""
    if name == "fashion-mnist":
        directory = root / "fashion-mnist"
        advice = (f"put the four Fashion-MNIST idx files in {directory}/ (or install the "
                  "Debian package dataset-fashion-mnist) or pass --archive DIR")
        return [_idx_file_in(directory, remote.name)
                or _download(remote, directory, progress, advice)
                for remote in _FASHION_FILES]
    remote = _CIFAR[name].archive
    return [_download(remote, root, progress, f"put it in {root}/ or pass --archive PATH")]


def _download(remote: _RemoteFile, directory: Path, progress: bool, advice: str) -> Path:
    """Download remote into directory/remote.name via a temporary name; check its md5.

    A failed download or a wrong md5 leaves nothing behind and raises DataError(advice).
    """
    destination = directory / remote.name
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"cannot create {directory} ({_one_line(error)}): {advice}") from error
    with replacing(destination) as partial:  # renamed into place only if it checks out
        try:
            with open(partial, "wb") as out:
                md5 = _copy_url_to_file(remote.url, out, remote.name, progress)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
            raise DataError(f"cannot download {remote.name} from {remote.url} "
                            f"({_one_line(error)}): {advice}") from error
        if md5 != remote.md5:
            raise DataError(f"downloaded {remote.name} has md5 {md5}, expected {remote.md5} "
                            f"(deleted it): retry, or {advice}")
    return destination


def _copy_url_to_file(url: str, out: IO[bytes], label: str, progress: bool) -> str:
    """Stream url into out with a tqdm bar; return the md5 hex digest of what was written."""
    md5 = hashlib.md5(usedforsecurity=False)
    with urllib.request.urlopen(url, timeout=60) as response:
        headers = getattr(response, "headers", None)
        length = headers.get("Content-Length") if headers is not None else None
        total = int(length) if length and str(length).isdigit() else None
        with tqdm(total=total, unit="B", unit_scale=True, desc=label,
                  disable=not progress) as bar:
            while chunk := response.read(_CHUNK_BYTES):
                out.write(chunk)
                md5.update(chunk)
                bar.update(len(chunk))
    return md5.hexdigest()


def _one_line(error: BaseException) -> str:
    """str(error) on one line (some library messages span several)."""
    return " ".join(str(error).split()) or type(error).__name__


# --------------------------------------------------------------------------------------
# Parsing the official formats
# --------------------------------------------------------------------------------------


def _parse_sources(name: str, sources: Sequence[Path]) -> Dataset:
    """Read the dataset from its official files (one CIFAR archive or four idx files)."""
    if name == "fashion-mnist":
        return _read_fashion_mnist(sources)
    return _read_cifar_archive(sources[0], name)


def _read_cifar_archive(path: Path, name: str) -> Dataset:
    """Read a CIFAR "python version" tar archive (any compression) into a Dataset."""
    spec = _CIFAR[name]
    batches = _read_cifar_members(path, spec)
    x_test, y_test = batches.pop(spec.test_member)
    train = [batches.pop(m) for m in spec.train_members]
    y_train = np.concatenate([y for _, y in train])
    train_images = [x for x, _ in train]
    del train  # so that _stack_releasing frees each batch as soon as it is copied
    x_train = _stack_releasing(train_images)
    return Dataset(name, x_train, y_train, x_test, y_test, spec.num_classes)


def _read_cifar_members(path: Path, spec: _CifarSpec
                        ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Member name -> (images (n, 3, 32, 32) uint8, labels (n,) int64) for the train and
    test members of spec; DataError if one is absent.

    Reads the archive as a stream: one pass of decompression, whatever the member order
    (random access into a .tar.gz would decompress it again for every member).
    """
    wanted = {*spec.train_members, spec.test_member}
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
        raise DataError(f"cannot read archive {path} ({_one_line(error)}): it is corrupt, "
                        f"truncated or not a tar archive; re-download {spec.archive.name}"
                        ) from error
    missing = sorted(wanted - batches.keys())
    if missing:
        raise DataError(f"{path} lacks member(s) {', '.join(missing)}: it is not the "
                        f"official {spec.archive.name} layout; re-download it")
    return batches


def _read_cifar_batch(fileobj: IO[bytes], where: str, spec: _CifarSpec
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Unpickle one batch dict and check it: images (n, 3, 32, 32) uint8, labels (n,) int64."""
    try:
        batch = _NumpyOnlyUnpickler(fileobj, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, ImportError, OverflowError, MemoryError, tarfile.TarError,
            zlib.error, OSError) as error:
        raise DataError(f"cannot unpickle {where} ({_one_line(error)}): the archive is "
                        "corrupt or not in the official layout; re-download it") from error
    if not isinstance(batch, dict) or b"data" not in batch or spec.label_key not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else _describe(batch)
        raise DataError(f"{where} is not a CIFAR batch (need a dict with b'data' and "
                        f"{spec.label_key!r}, got {keys}); re-download the archive")
    flat = batch[b"data"]
    row = int(np.prod(_CIFAR_IMAGE_SHAPE))
    if not isinstance(flat, np.ndarray) or flat.dtype != np.uint8 or flat.ndim != 2 \
            or flat.shape[1] != row:
        raise DataError(f"{where}: b'data' must be uint8 (n, {row}), got {_describe(flat)}; "
                        "re-download the archive")
    labels = _labels_array(batch[spec.label_key], where)
    images = np.ascontiguousarray(flat).reshape(len(flat), *_CIFAR_IMAGE_SHAPE)
    problem = _split_problem(images, labels, _CIFAR_IMAGE_SHAPE, spec.num_classes)
    if problem is not None:
        raise DataError(f"{where}: {problem}; re-download the archive")
    return images, labels


def _labels_array(labels: Any, where: str) -> np.ndarray:
    """labels (a list of ints or an integer array) as int64 (n,)."""
    try:
        array = np.asarray(labels)
    except (ValueError, TypeError) as error:
        raise DataError(f"{where}: labels are not a list of ints ({_one_line(error)})") \
            from error
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise DataError(f"{where}: labels must be a flat list of ints, got {_describe(array)}; "
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


def _read_fashion_mnist(files: Sequence[Path]) -> Dataset:
    """Read the four Fashion-MNIST idx files (train images, train labels, test images,
    test labels) into a Dataset with images (N, 1, 28, 28)."""
    splits = []
    for images_path, labels_path in ((files[0], files[1]), (files[2], files[3])):
        images = _read_idx(images_path, ndim=3)
        labels = _read_idx(labels_path, ndim=1).astype(np.int64)
        if images.shape[1:] != _FASHION_IMAGE_SHAPE[1:]:
            raise DataError(f"{images_path} holds {images.shape[1:]} images, expected "
                            f"{_FASHION_IMAGE_SHAPE[1:]}; re-download it")
        images = images.reshape(len(images), *_FASHION_IMAGE_SHAPE)
        problem = _split_problem(images, labels, _FASHION_IMAGE_SHAPE, _FASHION_NUM_CLASSES)
        if problem is not None:
            raise DataError(f"{images_path} / {labels_path}: {problem}; re-download them")
        splits.append((images, labels))
    (x_train, y_train), (x_test, y_test) = splits
    return Dataset("fashion-mnist", x_train, y_train, x_test, y_test, _FASHION_NUM_CLASSES)


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
        raise DataError(f"cannot read {path} ({_one_line(error)}): it is corrupt or "
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


# --------------------------------------------------------------------------------------
# HDF5 cache
# --------------------------------------------------------------------------------------


def _sha256_of_files(paths: Sequence[Path]) -> str:
    """Space-separated sha256 hex digests of the files, in order (read in chunks)."""
    digests = []
    for path in paths:
        sha = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while chunk := f.read(_CHUNK_BYTES):
                    sha.update(chunk)
        except OSError as error:
            raise DataError(f"cannot read {path} ({_one_line(error)}): check that it is a "
                            "readable file") from error
        digests.append(sha.hexdigest())
    return " ".join(digests)


def _fingerprint(paths: Sequence[Path]) -> str:
    """JSON of (absolute path, size, mtime_ns) per file: if unchanged, the content is
    assumed unchanged, which spares hashing a 170 MB archive on every load."""
    entries = []
    for path in paths:
        stat = path.stat()
        entries.append([str(path.absolute()), stat.st_size, stat.st_mtime_ns])
    return json.dumps(entries)


def _load_cache_if_current(name: str, cache: Path, sources: list[Path] | None
                           ) -> Dataset | None:
    """The cached dataset, or None when it must be rebuilt from `sources`.

    Rebuilt when the cache format is old or the sources' content changed; with no sources
    the cache alone is used.  A damaged cache is a DataError, never silently used.
    """
    version, source_sha256, fingerprint = _read_cache_attrs(cache, name)
    if version != CACHE_FORMAT_VERSION:
        if sources is None:
            raise DataError(f"cache {cache} has format {version}, this iasgd needs "
                            f"{CACHE_FORMAT_VERSION} and the source files are not found: "
                            "provide them (or --archive) to rebuild it")
        return None
    new_fingerprint = None
    if sources is not None and _fingerprint(sources) != fingerprint:
        if _sha256_of_files(sources) != source_sha256:
            return None
        new_fingerprint = _fingerprint(sources)
    dataset = _read_cache_arrays(cache, name)
    if new_fingerprint is not None:
        # Same content under a new path or mtime: record it so the next load skips hashing.
        _write_cache_or_warn(cache, dataset, source_sha256, new_fingerprint)
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
        raise DataError(f"cache {cache} is unreadable ({_one_line(error)}): delete it so "
                        "that it is rebuilt from the source") from error


def _read_cache_attrs(cache: Path, name: str) -> tuple[int, str, str]:
    """(format version, source sha256, source fingerprint) stored in the cache."""
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
    return (int(attrs["format_version"]), _as_str(attrs["source_sha256"]),
            _as_str(attrs["source_fingerprint"]))


def _as_str(value: Any) -> str:
    """An HDF5 string attribute as str (h5py may return bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_cache_arrays(cache: Path, name: str) -> Dataset:
    """Read x/y train/test from the cache of dataset `name` and check them."""
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
    for split in ("train", "test"):
        problem = _split_problem(arrays[f"x_{split}"], arrays[f"y_{split}"],
                                 _image_shape(name), _num_classes(name))
        if problem is not None:
            raise DataError(f"cache {cache}, {split} split: {problem}: {advice}")
    return Dataset(name, num_classes=_num_classes(name), **arrays)


def _write_cache_or_warn(cache: Path, dataset: Dataset, source_sha256: str,
                         fingerprint: str) -> None:
    """Write the cache; if that fails (read-only data dir, disk full) warn and go on."""
    try:
        _write_cache(cache, dataset, source_sha256, fingerprint)
    except OSError as error:
        warnings.warn(f"cannot write cache {cache} ({_one_line(error)}): the data will be "
                      "read from the source again next time", stacklevel=3)


def _write_cache(cache: Path, dataset: Dataset, source_sha256: str, fingerprint: str) -> None:
    """Write dataset to cache atomically (metrics.replacing): a crash or a concurrent
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


# --------------------------------------------------------------------------------------
# Synthetic data
# --------------------------------------------------------------------------------------

_SYNTHETIC_MAX_SHIFT = 2  # pixels, each way
_SYNTHETIC_GRID = 4  # prototypes are bilinear upsamplings of a GRID x GRID random image
_SYNTHETIC_NOISE_SHIFT = 2  # noise = random byte >> 2, i.e. uniform in [0, 64) - 32


def synthetic(seed: int = 0, n_train: int = 4000, n_test: int = 1000,
              shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10) -> Dataset:
    """A learnable image dataset, deterministic for a seed, generated in memory.

    Each class has a random smooth prototype image; a sample is its class prototype,
    shifted by up to 2 pixels each way, plus uniform pixel noise in [-32, 32).  Classes
    are balanced (counts differ by at most one) and shuffled.  Images uint8 (N, *shape).
    """
    if n_train < 1 or n_test < 1 or num_classes < 1 or len(shape) != 3 or min(shape) < 1:
        raise DataError(f"synthetic needs n_train, n_test, num_classes >= 1 and a (C, H, W) "
                        f"shape, got n_train={n_train}, n_test={n_test}, "
                        f"num_classes={num_classes}, shape={shape}")
    rng = np.random.default_rng(seed)
    c, h, w = (int(s) for s in shape)
    margin = _SYNTHETIC_MAX_SHIFT
    prototypes = _smooth_prototypes(rng, num_classes, (c, h + 2 * margin, w + 2 * margin))
    variants = _shifted_crops(prototypes, h, w)
    x_train, y_train = _synthetic_split(rng, variants, n_train)
    x_test, y_test = _synthetic_split(rng, variants, n_test)
    return Dataset("synthetic", x_train, y_train, x_test, y_test, num_classes)


def _smooth_prototypes(rng: np.random.Generator, num_classes: int,
                       shape: tuple[int, int, int]) -> np.ndarray:
    """float32 (K, C, H, W) in [32, 224]: random GRID x GRID images upsampled bilinearly."""
    c, h, w = shape
    coarse = rng.uniform(32, 224, size=(num_classes, c, _SYNTHETIC_GRID, _SYNTHETIC_GRID))
    up_h = _bilinear_matrix(h, _SYNTHETIC_GRID)
    up_w = _bilinear_matrix(w, _SYNTHETIC_GRID)
    return np.einsum("hi,kcij,wj->kchw", up_h, coarse, up_w).astype(np.float32)


def _bilinear_matrix(n_out: int, n_in: int) -> np.ndarray:
    """(n_out, n_in) matrix that linearly interpolates n_in samples onto n_out points."""
    position = np.linspace(0, n_in - 1, n_out)
    low = np.clip(np.floor(position).astype(int), 0, max(n_in - 2, 0))
    frac = position - low
    matrix = np.zeros((n_out, n_in))
    matrix[np.arange(n_out), low] = 1 - frac
    if n_in > 1:
        matrix[np.arange(n_out), low + 1] += frac
    return matrix


def _shifted_crops(prototypes: np.ndarray, h: int, w: int) -> np.ndarray:
    """int16 (K, S, C, h, w): every h x w crop of the padded prototypes, S = (2*shift+1)^2."""
    padded_h, padded_w = prototypes.shape[2:]
    crops = [prototypes[:, :, dy:dy + h, dx:dx + w]
             for dy in range(padded_h - h + 1) for dx in range(padded_w - w + 1)]
    return np.rint(np.stack(crops, axis=1)).astype(np.int16)


def _synthetic_split(rng: np.random.Generator, variants: np.ndarray,
                     n: int) -> tuple[np.ndarray, np.ndarray]:
    """n samples: images uint8 (n, C, H, W) and balanced shuffled labels int64 (n,)."""
    num_classes, num_shifts = variants.shape[:2]
    labels = rng.permutation(np.arange(n, dtype=np.int64) % num_classes)
    shifts = rng.integers(0, num_shifts, size=n)
    images = variants[labels, shifts]
    # Raw generator bits viewed as bytes: ~10x faster than rng.integers for 15 M values.
    size = images.size
    noise_bytes = rng.bit_generator.random_raw(-(-size // 8)).view(np.uint8)[:size]
    noise = (noise_bytes >> _SYNTHETIC_NOISE_SHIFT).astype(np.int16).reshape(images.shape)
    images += noise - (128 >> _SYNTHETIC_NOISE_SHIFT)
    return np.clip(images, 0, 255).astype(np.uint8), labels
