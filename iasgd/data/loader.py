"""Load a dataset by name (CIFAR-10, CIFAR-100, Fashion-MNIST or a synthetic set) or a
user's own .npz / HDF5 file by its path.

Every dataset is a :class:`Dataset` holding ``x`` as uint8 ``(N, C, H, W)`` (C-contiguous)
and ``y`` as int64 ``(N,)``.  Real datasets come from their official files (an archive or,
for Fashion-MNIST, four idx files), which are looked up locally and otherwise downloaded.
The first load converts them to ``<data_dir>/<name>.h5``; later loads read that cache,
which takes a fraction of a second.  A user's own file (iasgd.data.own) goes through the
same cache, ``<data_dir>/<file name>.<hash of its path>.h5``.

What each dataset is (shape, classes, files, checksums, parser) is declared in
iasgd.data.registry; this module finds or downloads its files and goes through the cache
(iasgd.data.cache).  The parsers (iasgd.data.formats), the cache and this module are the only
ones in ``iasgd`` that do file or network I/O.  Every problem with the data (missing,
corrupt, unexpected layout) is raised as :class:`DataError`, whose message is one line
saying what is wrong and what to do.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from tqdm import tqdm

from iasgd.data import cache as h5cache
from iasgd.data import own
from iasgd.data.cache import CACHE_FORMAT_VERSION
from iasgd.data.own import DEFAULT_TEST_FRACTION
from iasgd.data.registry import DATASETS, DatasetSpec, RemoteFile
from iasgd.data.synthetic import synthetic
from iasgd.data.types import DataError, Dataset, one_line
from iasgd.files import replacing

__all__ = ["CACHE_FORMAT_VERSION", "DATASETS", "DATA_DIR_ENV", "DEFAULT_TEST_FRACTION",
           "DataError", "Dataset", "DatasetSpec", "load", "resolve_data_dir", "synthetic"]

DATA_DIR_ENV = "IASGD_DATA"

_CHUNK_BYTES = 1 << 20
# Bump when iasgd.data.own converts a file differently: caches of older conversions are
# rebuilt (the conversion options, this included, are recorded in the cache).
_OWN_CONVERSION_VERSION = 1


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """The data directory: data_dir if given, else $IASGD_DATA if set, else ./data (absolute)."""
    if data_dir is None or str(data_dir) == "":
        data_dir = os.environ.get(DATA_DIR_ENV) or "data"
    return Path(data_dir).expanduser().absolute()


def load(name: str | Path, data_dir: str | Path | None = None, archive: str | Path | None = None,
         progress: bool = True, *, test_fraction: float = DEFAULT_TEST_FRACTION,
         seed: int = 0, layout: str = "auto", batch_size: int | None = None,
         check: Callable[[Dataset], object] | None = None) -> Dataset:
    """Load dataset `name` (one of DATASETS, or the path of a user's own .npz, .h5 or .hdf5
    file), from the HDF5 cache when it is current.

    archive: the source to use instead of the official file name in data_dir: for an
    "archive" dataset (CIFAR) the archive in the official layout (any file name, any
    checksum), for a "directory" dataset (fashion-mnist) a directory holding its files.
    progress: show download progress and say when the cache is built (on stderr).  The
    cache is skipped, with a warning, when data_dir is not writable.
    test_fraction, seed, layout: for a user's own file only (iasgd.data.own.from_arrays):
    the share of images held out as the test split when the file has none, the seed of that
    split, and where the images' channels are ("auto", "nchw", "nhwc"; "auto" uses the
    file's own 'layout' entry if it has one).  Registry datasets ignore them.
    batch_size: the batch size the data is loaded for, where known: a user's file with
    fewer training images is read but not cached, since the run refuses that batch size
    (iasgd.config.check_data) and should leave nothing behind.  Registry datasets ignore it.
    check: for a user's file read anew, called with the dataset before its summary is said
    and its cache written; what it raises propagates (a run refuses the file's model or
    options there, and leaves nothing behind).  Registry datasets ignore it.
    """
    spec = DATASETS.get(str(name))
    if spec is None and own.is_own_file(str(name)):
        return _load_own_file(Path(name), data_dir, archive, progress,
                              test_fraction=test_fraction, seed=seed, layout=layout,
                              batch_size=batch_size, check=check)
    if spec is None:
        raise DataError(f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}, or "
                        "give the path of an .npz, .h5 or .hdf5 file of your own")
    if spec.generate is not None:
        return spec.generate()
    root = resolve_data_dir(data_dir)
    cache = root / spec.cache_name
    sources = _find_local_sources(spec, root, archive)
    if cache.exists():
        dataset = h5cache.load_if_current(spec, cache, sources)
        if dataset is not None:
            return dataset
    if sources is None:
        sources = _download_sources(spec, root, progress)
    if progress:
        origin = sources[0] if len(sources) == 1 else f"{sources[0].parent}/"
        print(f"iasgd: converting {name} from {origin} to {cache} (only once)",
              file=sys.stderr)
    try:
        dataset = _parse_sources(spec, sources)
    except DataError as error:
        if archive is None:  # the official files, found or downloaded: re-download them
            raise
        raise _not_the_archive(spec, archive, error) from error
    h5cache.write_or_warn(cache, dataset, h5cache.sha256_of_files(sources),
                          h5cache.fingerprint(sources))
    return dataset


def _load_own_file(path: Path, data_dir: str | Path | None, archive: str | Path | None,
                   progress: bool, *, test_fraction: float, seed: int, layout: str,
                   batch_size: int | None = None,
                   check: Callable[[Dataset], object] | None = None) -> Dataset:
    """A user's .npz / HDF5 file, validated and converted by iasgd.data.own, through the
    cache <data_dir>/<file name>.<12 hex of sha256(absolute path)>.h5.

    The path's hash in the cache's name keeps files of the same name in different folders
    apart; the file's sha256 in the cache makes a changed file be read again.  No cache is
    written for a training split smaller than batch_size (a run refuses it).
    """
    path = own.check_path(path)
    own.check_options(str(path), test_fraction, seed, layout)
    if archive is not None:
        raise DataError(f"archive ({archive}) is for the registry's datasets; {path} is its "
                        "own source: drop the archive")
    root = resolve_data_dir(data_dir)
    path_hash = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    cache = root / f"{path.name}.{path_hash}.h5"
    conversion = json.dumps({"version": _OWN_CONVERSION_VERSION,
                             "test_fraction": float(test_fraction),
                             "seed": int(seed), "layout": layout}, sort_keys=True)
    if cache.exists():
        dataset = h5cache.load_converted_if_current(cache, path.name, path, conversion)
        if dataset is not None:
            return dataset
    # Hashed before reading: if the file changes meanwhile, the next load sees a new
    # fingerprint and hash and reads it again, instead of trusting a stale cache.
    source_fingerprint = h5cache.fingerprint([path])
    source_sha256 = h5cache.sha256_of_files([path])
    dataset, summary = own.read_file(path, test_fraction=test_fraction, seed=seed,
                                     layout=layout)
    if batch_size is not None and batch_size > len(dataset.x_train):
        return dataset  # the run refuses it in one line: nothing said, nothing cached
    if check is not None:
        check(dataset)
    if progress:
        print(f"iasgd: {summary} (cached in {cache})", file=sys.stderr)
    h5cache.write_or_warn(cache, dataset, source_sha256, source_fingerprint, conversion)
    return dataset


def _not_the_archive(spec: DatasetSpec, archive: str | Path, error: DataError) -> DataError:
    """The error of an archive the user gave that the parser refused: the parser's reason
    without its advice to re-download (the user supplied the file; nothing was downloaded)."""
    reason = re.sub(r"[;:,]?\s*re-download\b.*$", "", str(error))
    kind = "archive" if spec.source == "archive" else "directory"
    return DataError(f"{Path(archive).expanduser()}, the archive given, is not a valid "
                     f"{spec.name} {kind} ({reason}): check the path, or give the "
                     f"{spec.files_label}")


def _parse_sources(spec: DatasetSpec, sources: Sequence[Path]) -> Dataset:
    """Read the dataset from its official files with its declared parser."""
    assert spec.parse is not None  # every file-backed spec declares one
    return spec.parse(spec, sources)


# --------------------------------------------------------------------------------------
# Finding the official files on disk
# --------------------------------------------------------------------------------------


def _find_local_sources(spec: DatasetSpec, root: Path, archive: str | Path | None
                        ) -> list[Path] | None:
    """Source files of `spec` already on disk (no download), or None when there are none.

    An explicit `archive` must exist; files found locally are used whatever their checksum,
    since the user (or a distribution package) put them there on purpose.
    """
    if spec.source == "directory":
        return _find_directory_files(spec, root, archive)
    if archive is not None:
        path = Path(archive).expanduser()
        if not path.is_file():
            raise DataError(f"archive {path} does not exist or is not a file: pass the "
                            f"{spec.files_label}")
        return [path]
    path = root / spec.files[0].name
    return [path] if path.is_file() else None


def _find_directory_files(spec: DatasetSpec, root: Path, archive: str | Path | None
                          ) -> list[Path] | None:
    """All files of a "directory" dataset, from `archive` (a directory), else
    <root>/<name>/, else spec.system_dirs; None when no place has them all."""
    if archive is not None:
        directory = Path(archive).expanduser()
        if not directory.is_dir():
            raise DataError(f"archive {directory} must be a directory holding the "
                            f"{spec.files_label} ({spec.files[0].name}, ...)")
        files = _files_in(directory, spec)
        if files is None:
            names = ", ".join(remote.name for remote in spec.files)
            raise DataError(f"{directory} does not hold all {spec.files_label} "
                            f"({names}; gzipped or not): put them there")
        return files
    for directory in (root / spec.name, *spec.system_dirs):
        files = _files_in(directory, spec)
        if files is not None:
            return files
    return None


def _files_in(directory: Path, spec: DatasetSpec) -> list[Path] | None:
    """The files of spec in directory, in spec.files order, or None unless all are there."""
    found = [_file_in(directory, remote.name) for remote in spec.files]
    present = [path for path in found if path is not None]
    return present if len(present) == len(found) else None


def _file_in(directory: Path, gz_name: str) -> Path | None:
    """directory/gz_name, else its uncompressed twin (name without .gz), else None."""
    for candidate in (directory / gz_name, directory / gz_name.removesuffix(".gz")):
        if candidate.is_file():
            return candidate
    return None


# --------------------------------------------------------------------------------------
# Downloading them
# --------------------------------------------------------------------------------------


def _download_sources(spec: DatasetSpec, root: Path, progress: bool) -> list[Path]:
    """Download the official files of `spec` into root ("directory" datasets: root/<name>),
    keeping those already there."""
    if spec.source == "directory":
        directory = root / spec.name
        system = f" (or {spec.system_hint})" if spec.system_hint else ""
        advice = (f"put the {spec.files_label} in {directory}/{system} "
                  "or pass --archive DIR")
        return [_file_in(directory, remote.name)
                or _download(remote, directory, progress, advice)
                for remote in spec.files]
    return [_download(spec.files[0], root, progress, f"put it in {root}/ or pass --archive PATH")]


def _download(remote: RemoteFile, directory: Path, progress: bool, advice: str) -> Path:
    """Download remote into directory/remote.name via a temporary name; check its md5.

    A failed download or a wrong md5 leaves nothing behind and raises DataError(advice).
    """
    destination = directory / remote.name
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"cannot create {directory} ({one_line(error)}): {advice}") from error
    with replacing(destination) as partial:  # renamed into place only if it checks out
        try:
            with open(partial, "wb") as out:
                md5 = _copy_url_to_file(remote.url, out, remote.name, progress)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
            raise DataError(f"cannot download {remote.name} from {remote.url} "
                            f"({one_line(error)}): {advice}") from error
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
