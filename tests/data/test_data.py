"""Tests for iasgd.data: tiny archives in the official layouts, the HDF5 cache, errors."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import os
import pickle
import struct
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

from iasgd.data import DataError, Dataset
from iasgd.data import cache as h5cache
from iasgd.data import loader as data

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_TRAIN = [f"{CIFAR10_DIR}/data_batch_{i}" for i in range(1, 6)]
CIFAR10_TEST = f"{CIFAR10_DIR}/test_batch"
FASHION_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


# --------------------------------------------------------------------------------------
# Helpers that write tiny files in the official layouts
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def raises_data_error(match: str) -> Iterator[None]:
    """Expect a DataError whose message matches and is a single line."""
    with pytest.raises(DataError, match=match) as info:
        yield
    assert "\n" not in str(info.value)


def cifar_batch(rng: np.random.Generator, rows: int, num_classes: int,
                label_key: bytes = b"labels") -> dict:
    """A batch dict like the official ones: b'data' uint8 (rows, 3072) and labels list."""
    batch = {
        b"batch_label": b"a tiny batch",
        b"data": rng.integers(0, 256, size=(rows, 3072), dtype=np.uint8),
        label_key: [int(v) for v in rng.integers(0, num_classes, size=rows)],
        b"filenames": [b"img_%d.png" % i for i in range(rows)],
    }
    if label_key == b"fine_labels":
        batch[b"coarse_labels"] = [v // 5 for v in batch[label_key]]
    return batch


def cifar10_members(seed: int = 0, rows: int = 3, test_rows: int = 4) -> dict[str, object]:
    """Member name -> unpickled content of a tiny CIFAR-10 archive (all official members)."""
    rng = np.random.default_rng(seed)
    members: dict[str, object] = {name: cifar_batch(rng, rows, 10) for name in CIFAR10_TRAIN}
    members[CIFAR10_TEST] = cifar_batch(rng, test_rows, 10)
    members[f"{CIFAR10_DIR}/batches.meta"] = {b"label_names": [b"c%d" % i for i in range(10)],
                                              b"num_cases_per_batch": rows}
    return members


def write_tar(path: Path, members: dict[str, object], mode: str = "w:gz") -> Path:
    """Write a tar archive whose members are pickles (protocol 2, like the official ones),
    or raw bytes where the value is bytes."""
    with tarfile.open(path, mode) as tar:
        for name, content in members.items():
            raw = content if isinstance(content, bytes) else pickle.dumps(content, protocol=2)
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


def expected_cifar(members: dict[str, object], train: list[str], test: str,
                   label_key: bytes = b"labels") -> tuple[np.ndarray, ...]:
    """(x_train, y_train, x_test, y_test) that loading the members must give."""
    def images(name: str) -> np.ndarray:
        return members[name][b"data"].reshape(-1, 3, 32, 32)  # type: ignore[index]

    def labels(name: str) -> np.ndarray:
        return np.asarray(members[name][label_key], dtype=np.int64)  # type: ignore[index]

    return (np.concatenate([images(n) for n in train]), np.concatenate([labels(n) for n in train]),
            images(test), labels(test))


def assert_matches(dataset: Dataset, expected: tuple[np.ndarray, ...]) -> None:
    """dataset's arrays equal expected exactly, with the promised dtypes and layout."""
    for got, want in zip((dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test),
                         expected, strict=True):
        assert got.dtype == want.dtype
        assert got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)


def python2_pickle(data: np.ndarray, labels: list[int]) -> bytes:
    """A batch pickled the way the official archive was (Python 2 cPickle, protocol 2):
    {'data': array, 'labels': [...]} with str keys and numpy.core.multiarray._reconstruct.
    Python 3 cannot write this (it pickles bytes via _codecs.encode), so it is spelled out
    opcode by opcode."""
    def string(b: bytes) -> bytes:  # SHORT_BINSTRING: a Python 2 str
        return b"U" + bytes([len(b)]) + b

    def integer(v: int) -> bytes:  # BININT1 / BININT2
        return b"K" + bytes([v]) if v < 256 else b"M" + struct.pack("<H", v)

    rows, cols = data.shape
    array = (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + integer(0)
             + b"\x85" + string(b"b") + b"\x87R"  # _reconstruct(ndarray, (0,), 'b')
             + b"(" + integer(1) + integer(rows) + integer(cols) + b"\x86"  # state: version, shape
             + b"cnumpy\ndtype\n" + string(b"u1") + integer(0) + integer(1) + b"\x87R"
             + b"(" + integer(3) + string(b"|") + b"NNN" + b"J\xff\xff\xff\xff" * 2
             + integer(0) + b"tb"  # dtype state
             + b"\x89" + b"T" + struct.pack("<I", data.nbytes) + data.tobytes() + b"tb")
    label_list = b"](" + b"".join(integer(v) for v in labels) + b"e"
    return b"\x80\x02}(" + string(b"data") + array + string(b"labels") + label_list + b"u."


def idx_bytes(array: np.ndarray) -> bytes:
    """The idx encoding of a uint8 array: magic, big-endian dims, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def fashion_arrays(seed: int = 0, n_train: int = 6, n_test: int = 4) -> list[np.ndarray]:
    """[train images, train labels, test images, test labels] of a tiny Fashion-MNIST."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
            rng.integers(0, 10, size=n_train).astype(np.uint8),
            rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
            rng.integers(0, 10, size=n_test).astype(np.uint8)]


def write_fashion(directory: Path, arrays: list[np.ndarray], compress: bool = True) -> Path:
    """Write the four idx files (gzipped, or not) into directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in zip(FASHION_NAMES, arrays, strict=True):
        raw = idx_bytes(array)
        if compress:
            (directory / f"{name}.gz").write_bytes(gzip.compress(raw))
        else:
            (directory / name).write_bytes(raw)
    return directory


def leftovers(directory: Path) -> list[str]:
    """Temporary files (.tmp / .part) left in directory."""
    return sorted(p.name for p in directory.rglob("*") if p.name.endswith((".tmp", ".part")))


def use_system_dir(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Make `directory` the system directory of Fashion-MNIST (the Debian package's)."""
    spec = data.DATASETS["fashion-mnist"]
    monkeypatch.setitem(data.DATASETS, "fashion-mnist",
                        dataclasses.replace(spec, system_dirs=(directory,)))


@pytest.fixture(autouse=True)
def no_system_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep tests independent of the machine: no system Fashion-MNIST, no network, no
    $IASGD_DATA."""
    use_system_dir(monkeypatch, tmp_path / "no-system-dir")
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)

    def no_network(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)


@pytest.fixture
def cifar10_dir(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """A data dir holding a tiny cifar-10-python.tar.gz; returns (dir, its members)."""
    root = tmp_path / "data"
    root.mkdir()
    members = cifar10_members()
    write_tar(root / "cifar-10-python.tar.gz", members)
    return root, members


# --------------------------------------------------------------------------------------
# Data directory and names
# --------------------------------------------------------------------------------------


def test_resolve_data_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert data.resolve_data_dir(None) == tmp_path / "data"
    monkeypatch.setenv("IASGD_DATA", str(tmp_path / "from-env"))
    assert data.resolve_data_dir(None) == tmp_path / "from-env"
    assert data.resolve_data_dir(tmp_path / "explicit") == tmp_path / "explicit"
    assert data.resolve_data_dir("relative") == tmp_path / "relative"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data.resolve_data_dir("~/d") == tmp_path / "home" / "d"


def test_unknown_dataset_lists_choices() -> None:
    with raises_data_error("unknown dataset 'mnist'.*cifar10, cifar100, fashion-mnist"):
        data.load("mnist")


def test_load_synthetic_is_default_synthetic(tmp_path: Path) -> None:
    loaded, made = data.load("synthetic", data_dir=tmp_path), data.synthetic()
    assert loaded.name == "synthetic"
    np.testing.assert_array_equal(loaded.x_train, made.x_train)
    np.testing.assert_array_equal(loaded.y_test, made.y_test)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 round trips and the cache
# --------------------------------------------------------------------------------------


def test_cifar10_round_trip_and_cache_written(cifar10_dir: tuple[Path, dict]) -> None:
    root, members = cifar10_dir
    dataset = data.load("cifar10", data_dir=root, progress=False)
    assert dataset.name == "cifar10" and dataset.num_classes == 10
    assert dataset.x_train.shape == (15, 3, 32, 32) and dataset.x_test.shape == (4, 3, 32, 32)
    assert dataset.input_shape == (3, 32, 32)
    assert_matches(dataset, expected_cifar(members, CIFAR10_TRAIN, CIFAR10_TEST))
    cache = root / "cifar10.h5"
    assert cache.is_file()
    assert leftovers(root) == []
    with h5py.File(cache, "r") as f:
        assert set(f) == {"x_train", "y_train", "x_test", "y_test"}
        assert f.attrs["format_version"] == data.CACHE_FORMAT_VERSION
        digest = hashlib.sha256((root / "cifar-10-python.tar.gz").read_bytes()).hexdigest()
        assert f.attrs["source_sha256"] == digest


def test_cifar10_members_in_any_order_and_uncompressed_tar(tmp_path: Path) -> None:
    members = dict(reversed(list(cifar10_members(seed=3).items())))
    archive = write_tar(tmp_path / "any-name.tar", members, mode="w")
    dataset = data.load("cifar10", data_dir=tmp_path / "d", archive=archive, progress=False)
    assert_matches(dataset, expected_cifar(members, CIFAR10_TRAIN, CIFAR10_TEST))


@pytest.mark.filterwarnings("error")
def test_python2_pickles_like_the_official_archive(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    batches = {name: (rng.integers(0, 256, (2, 3072), dtype=np.uint8),
                      [int(v) for v in rng.integers(0, 10, 2)])
               for name in [*CIFAR10_TRAIN, CIFAR10_TEST]}
    members = {name: python2_pickle(*batch) for name, batch in batches.items()}
    write_tar(tmp_path / "cifar-10-python.tar.gz", members)
    dataset = data.load("cifar10", data_dir=tmp_path, progress=False)
    expected = {name: {b"data": x, b"labels": y} for name, (x, y) in batches.items()}
    assert_matches(dataset, expected_cifar(expected, CIFAR10_TRAIN, CIFAR10_TEST))


def test_second_load_reads_cache_without_parsing(cifar10_dir: tuple[Path, dict],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    root, members = cifar10_dir
    data.load("cifar10", data_dir=root, progress=False)

    def must_not_parse(*args: object) -> None:
        raise AssertionError("archive parsed although the cache is current")

    monkeypatch.setattr(data, "_parse_sources", must_not_parse)
    dataset = data.load("cifar10", data_dir=root, progress=False)
    assert_matches(dataset, expected_cifar(members, CIFAR10_TRAIN, CIFAR10_TEST))


def test_cache_alone_is_enough_when_source_is_gone(cifar10_dir: tuple[Path, dict]) -> None:
    root, members = cifar10_dir
    data.load("cifar10", data_dir=root, progress=False)
    (root / "cifar-10-python.tar.gz").unlink()
    dataset = data.load("cifar10", data_dir=root, progress=False)
    assert_matches(dataset, expected_cifar(members, CIFAR10_TRAIN, CIFAR10_TEST))


def test_touched_source_is_rehashed_once_not_reparsed(cifar10_dir: tuple[Path, dict],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = cifar10_dir
    data.load("cifar10", data_dir=root, progress=False)
    archive = root / "cifar-10-python.tar.gz"
    os.utime(archive, ns=(1_000_000_000, 1_000_000_000))
    hashes = []
    real_sha256 = h5cache.sha256_of_files
    monkeypatch.setattr(h5cache, "sha256_of_files",
                        lambda p: hashes.append(p) or real_sha256(p))
    monkeypatch.setattr(data, "_parse_sources", lambda *a: pytest.fail("re-parsed"))
    data.load("cifar10", data_dir=root, progress=False)
    assert len(hashes) == 1  # same content: the new mtime is recorded in the cache
    data.load("cifar10", data_dir=root, progress=False)
    assert len(hashes) == 1
    assert leftovers(root) == []


def test_changed_source_rebuilds_cache(cifar10_dir: tuple[Path, dict]) -> None:
    root, _ = cifar10_dir
    data.load("cifar10", data_dir=root, progress=False)
    members = cifar10_members(seed=7, rows=2, test_rows=1)
    write_tar(root / "cifar-10-python.tar.gz", members)
    dataset = data.load("cifar10", data_dir=root, progress=False)
    assert_matches(dataset, expected_cifar(members, CIFAR10_TRAIN, CIFAR10_TEST))
    (root / "cifar-10-python.tar.gz").unlink()
    assert_matches(data.load("cifar10", data_dir=root, progress=False),
                   expected_cifar(members, CIFAR10_TRAIN, CIFAR10_TEST))


def test_explicit_archive_wins_over_data_dir_file(cifar10_dir: tuple[Path, dict],
                                                  tmp_path: Path) -> None:
    root, _ = cifar10_dir
    data.load("cifar10", data_dir=root, progress=False)
    other = cifar10_members(seed=9)
    archive = write_tar(tmp_path / "cifar-10-jpeg-python.tar.gz", other)
    dataset = data.load("cifar10", data_dir=root, archive=archive, progress=False)
    assert_matches(dataset, expected_cifar(other, CIFAR10_TRAIN, CIFAR10_TEST))


def test_cifar100_round_trip_uses_fine_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    members = {"cifar-100-python/train": cifar_batch(rng, 7, 100, b"fine_labels"),
               "cifar-100-python/test": cifar_batch(rng, 5, 100, b"fine_labels"),
               "cifar-100-python/meta": {b"fine_label_names": [b"x"] * 100}}
    members["cifar-100-python/train"][b"fine_labels"][0] = 99  # type: ignore[index]
    write_tar(tmp_path / "cifar-100-python.tar.gz", members)
    dataset = data.load("cifar100", data_dir=tmp_path, progress=False)
    assert dataset.num_classes == 100
    assert_matches(dataset, expected_cifar(members, ["cifar-100-python/train"],
                                           "cifar-100-python/test", b"fine_labels"))
    assert (tmp_path / "cifar100.h5").is_file()


def test_unwritable_data_dir_still_loads_with_warning(tmp_path: Path) -> None:
    members = cifar10_members()
    archive = write_tar(tmp_path / "c.tar.gz", members)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.warns(UserWarning, match="cannot write cache"):
        dataset = data.load("cifar10", data_dir=blocker / "data", archive=archive,
                            progress=False)
    assert_matches(dataset, expected_cifar(members, CIFAR10_TRAIN, CIFAR10_TEST))


# --------------------------------------------------------------------------------------
# Bad archives
# --------------------------------------------------------------------------------------


def _without(members: dict, name: str) -> dict:
    return {k: v for k, v in members.items() if k != name}


def _with_batch(members: dict, name: str, **changes: object) -> dict:
    batch = dict(members[name])
    batch.update({k.encode(): v for k, v in changes.items()})
    return {**members, name: batch}


class _Evil:
    def __reduce__(self) -> tuple:
        return (os.getcwd, ())


BAD_MEMBERS = {
    "missing member": (_without(cifar10_members(), CIFAR10_TRAIN[2]), "lacks member.*data_batch_3"),
    "wrong shape": (_with_batch(cifar10_members(), CIFAR10_TEST,
                                data=np.zeros((4, 3071), np.uint8)), r"uint8 \(n, 3072\)"),
    "wrong dtype": (_with_batch(cifar10_members(), CIFAR10_TEST,
                                data=np.zeros((4, 3072), np.int64)), r"uint8 \(n, 3072\)"),
    "label out of range": (_with_batch(cifar10_members(), CIFAR10_TRAIN[0], labels=[0, 10, 1]),
                           r"outside \[0, 10\)"),
    "count mismatch": (_with_batch(cifar10_members(), CIFAR10_TRAIN[1], labels=[1, 2]),
                       "3 images but 2 labels"),
    "labels not ints": (_with_batch(cifar10_members(), CIFAR10_TRAIN[1], labels=["a", "b", "c"]),
                        "labels must be a flat list of ints"),
    "missing key": ({**cifar10_members(), CIFAR10_TEST: {b"data": np.zeros((1, 3072), np.uint8)}},
                    "not a CIFAR batch"),
    "not a dict": ({**cifar10_members(), CIFAR10_TEST: [1, 2, 3]}, "not a CIFAR batch"),
    "garbage pickle": ({**cifar10_members(), CIFAR10_TEST: b"\x80\x02garbage"}, "cannot unpickle"),
    "truncated pickle": ({**cifar10_members(),
                          CIFAR10_TEST: pickle.dumps(cifar10_members()[CIFAR10_TEST],
                                                     protocol=2)[:500]}, "cannot unpickle"),
    "code in pickle": ({**cifar10_members(), CIFAR10_TEST: _Evil()}, "refusing to load"),
}


@pytest.mark.parametrize("case", list(BAD_MEMBERS))
def test_bad_archive_content_is_data_error(case: str, tmp_path: Path) -> None:
    members, message = BAD_MEMBERS[case]
    write_tar(tmp_path / "cifar-10-python.tar.gz", members)
    with raises_data_error(message):
        data.load("cifar10", data_dir=tmp_path, progress=False)
    assert not (tmp_path / "cifar10.h5").exists()


def test_garbage_archive_is_data_error(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"this is not an archive\n" * 100)
    with raises_data_error("cannot read archive .*cifar-10-python.tar.gz.*re-download"):
        data.load("cifar10", data_dir=tmp_path, progress=False)


def test_truncated_archive_is_data_error(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "cifar-10-python.tar.gz", cifar10_members(rows=50))
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with raises_data_error("cifar-10-python.tar.gz"):
        data.load("cifar10", data_dir=tmp_path, progress=False)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100", "fashion-mnist"])
def test_an_archive_given_that_is_not_the_dataset_is_not_to_be_re_downloaded(
        dataset: str, tmp_path: Path) -> None:
    """Issue 41, item 4b: the file the user gave (--archive) is said not to be a valid archive
    of the dataset, without advice to re-download a file the user supplied."""
    if dataset == "fashion-mnist":  # a directory of the four files, one of them not idx
        archive = write_fashion(tmp_path / "raw", fashion_arrays())
        (archive / "train-labels-idx1-ubyte.gz").write_bytes(b"hostname\n")
    else:
        archive = tmp_path / "hostname"
        archive.write_text("hostname\n")
    with pytest.raises(DataError) as info:
        data.load(dataset, data_dir=tmp_path / "d", archive=archive, progress=False)
    said = str(info.value)
    assert "\n" not in said and "download" not in said, said
    assert said.startswith(f"{archive}, the archive given, is not a valid {dataset} "), said
    assert data.DATASETS[dataset].files_label in said
    assert not (tmp_path / "d" / f"{dataset}.h5").exists()


def test_explicit_archive_must_exist(tmp_path: Path) -> None:
    with raises_data_error("archive .*nope.tar.gz does not exist"):
        data.load("cifar10", data_dir=tmp_path, archive=tmp_path / "nope.tar.gz")


# --------------------------------------------------------------------------------------
# Bad caches
# --------------------------------------------------------------------------------------


def test_garbage_cache_is_data_error(cifar10_dir: tuple[Path, dict]) -> None:
    root, _ = cifar10_dir
    (root / "cifar10.h5").write_bytes(b"garbage" * 100)
    with raises_data_error("cache .*cifar10.h5 .*delete it"):
        data.load("cifar10", data_dir=root, progress=False)


def test_truncated_cache_is_data_error(cifar10_dir: tuple[Path, dict]) -> None:
    root, _ = cifar10_dir
    data.load("cifar10", data_dir=root, progress=False)
    cache = root / "cifar10.h5"
    cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])
    with raises_data_error("cache .*cifar10.h5.*delete it"):
        data.load("cifar10", data_dir=root, progress=False)


@pytest.mark.parametrize("damage", ["missing key", "wrong shape", "missing attribute",
                                    "other dataset", "bad labels"])
def test_damaged_cache_is_data_error(damage: str, cifar10_dir: tuple[Path, dict]) -> None:
    root, _ = cifar10_dir
    data.load("cifar10", data_dir=root, progress=False)
    with h5py.File(root / "cifar10.h5", "r+") as f:
        if damage == "missing key":
            del f["y_test"]
        elif damage == "wrong shape":
            del f["x_train"]
            f["x_train"] = np.zeros((15, 3, 31, 31), np.uint8)
        elif damage == "missing attribute":
            del f.attrs["source_sha256"]
        elif damage == "other dataset":
            f.attrs["dataset"] = "cifar100"
        else:
            f["y_train"][0] = 42
    with raises_data_error("cache .*cifar10.h5.*delete it"):
        data.load("cifar10", data_dir=root, progress=False)


def test_old_cache_format_rebuilt_from_source_or_error(cifar10_dir: tuple[Path, dict]) -> None:
    root, members = cifar10_dir
    data.load("cifar10", data_dir=root, progress=False)
    cache = root / "cifar10.h5"
    with h5py.File(cache, "r+") as f:
        f.attrs["format_version"] = 0
    assert_matches(data.load("cifar10", data_dir=root, progress=False),
                   expected_cifar(members, CIFAR10_TRAIN, CIFAR10_TEST))
    with h5py.File(cache, "r") as f:
        assert f.attrs["format_version"] == data.CACHE_FORMAT_VERSION
    with h5py.File(cache, "r+") as f:
        f.attrs["format_version"] = 0
    (root / "cifar-10-python.tar.gz").unlink()
    with raises_data_error("cache .*format 0.*not found"):
        data.load("cifar10", data_dir=root, progress=False)


# --------------------------------------------------------------------------------------
# Downloads (the network is replaced by fakes)
# --------------------------------------------------------------------------------------


def test_missing_archive_and_failed_download_names_file_and_dir(tmp_path: Path) -> None:
    with raises_data_error(f"cannot download cifar-10-python.tar.gz .*network disabled.*"
                           f"put it in {tmp_path}/ or pass --archive"):
        data.load("cifar10", data_dir=tmp_path, progress=False)
    assert leftovers(tmp_path) == [] and not (tmp_path / "cifar-10-python.tar.gz").exists()


def _serve(monkeypatch: pytest.MonkeyPatch, payload: bytes) -> None:
    """Make urlopen answer every URL with payload."""
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: io.BytesIO(payload))


def test_download_with_wrong_md5_is_deleted(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _serve(monkeypatch, b"not the real archive")
    with raises_data_error("downloaded cifar-100-python.tar.gz has md5 .* expected "
                           "eb9058c3a382ffc7106e4002c42a8d85"):
        data.load("cifar100", data_dir=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_download_with_right_md5_is_kept_and_loaded(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    members = cifar10_members()
    payload = write_tar(tmp_path / "served.tar.gz", members).read_bytes()
    spec = data.DATASETS["cifar10"]
    md5 = hashlib.md5(payload).hexdigest()
    monkeypatch.setitem(data.DATASETS, "cifar10", dataclasses.replace(
        spec, files=(dataclasses.replace(spec.files[0], md5=md5),)))
    _serve(monkeypatch, payload)
    root = tmp_path / "new" / "data"
    dataset = data.load("cifar10", data_dir=root, progress=True)
    assert_matches(dataset, expected_cifar(members, CIFAR10_TRAIN, CIFAR10_TEST))
    assert (root / "cifar-10-python.tar.gz").read_bytes() == payload
    assert leftovers(root) == []


def test_fashion_download_failure_says_where_to_put_files(tmp_path: Path) -> None:
    with raises_data_error("cannot download train-images-idx3-ubyte.gz .*"
                           f"{tmp_path}/fashion-mnist/.*dataset-fashion-mnist"):
        data.load("fashion-mnist", data_dir=tmp_path, progress=False)


# --------------------------------------------------------------------------------------
# Fashion-MNIST
# --------------------------------------------------------------------------------------


def _assert_fashion(dataset: Dataset, arrays: list[np.ndarray]) -> None:
    assert dataset.name == "fashion-mnist" and dataset.input_shape == (1, 28, 28)
    assert_matches(dataset, (arrays[0][:, None], arrays[1].astype(np.int64),
                             arrays[2][:, None], arrays[3].astype(np.int64)))


def test_fashion_round_trip_from_data_dir_then_cache(tmp_path: Path) -> None:
    arrays = fashion_arrays()
    write_fashion(tmp_path / "fashion-mnist", arrays)
    _assert_fashion(data.load("fashion-mnist", data_dir=tmp_path, progress=False), arrays)
    assert (tmp_path / "fashion-mnist.h5").is_file()
    for path in (tmp_path / "fashion-mnist").iterdir():
        path.unlink()
    _assert_fashion(data.load("fashion-mnist", data_dir=tmp_path, progress=False), arrays)


def test_fashion_from_archive_dir_uncompressed(tmp_path: Path) -> None:
    arrays = fashion_arrays(seed=2)
    source = write_fashion(tmp_path / "raw", arrays, compress=False)
    _assert_fashion(data.load("fashion-mnist", data_dir=tmp_path / "d", archive=source,
                              progress=False), arrays)


def test_fashion_from_system_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = fashion_arrays(seed=4)
    use_system_dir(monkeypatch, write_fashion(tmp_path / "sys", arrays))
    _assert_fashion(data.load("fashion-mnist", data_dir=tmp_path / "d", progress=False), arrays)


def test_fashion_archive_must_be_complete_dir(tmp_path: Path) -> None:
    source = write_fashion(tmp_path / "raw", fashion_arrays())
    (source / "t10k-labels-idx1-ubyte.gz").unlink()
    with raises_data_error("does not hold all four Fashion-MNIST idx files"):
        data.load("fashion-mnist", data_dir=tmp_path, archive=source)
    with raises_data_error("must be a directory"):
        data.load("fashion-mnist", data_dir=tmp_path, archive=source / "train-images-idx3-ubyte.gz")


def _corrupt_fashion(case: str, directory: Path) -> None:
    arrays = fashion_arrays()
    if case == "labels out of range":
        arrays[1][0] = 10
    if case == "count mismatch":
        arrays[3] = arrays[3][:-1]
    if case == "wrong image size":
        arrays[0] = arrays[0][:, :27]
    write_fashion(directory, arrays)
    images = directory / "train-images-idx3-ubyte.gz"
    raw = gzip.decompress(images.read_bytes())
    if case == "bad magic":
        images.write_bytes(gzip.compress(b"\x00\x00\x0d\x03" + raw[4:]))
    elif case == "short data":
        images.write_bytes(gzip.compress(raw[:-5]))
    elif case == "trailing data":
        images.write_bytes(gzip.compress(raw + b"x"))
    elif case == "truncated gzip":
        packed = gzip.compress(raw)
        images.write_bytes(packed[: len(packed) // 2])
    elif case == "not gzip, not idx":
        images.write_bytes(b"hello")


@pytest.mark.parametrize("case, message", [
    ("bad magic", "not an idx file of 3-d unsigned bytes"),
    ("short data", "fewer bytes than its header's shape"),
    ("trailing data", "more bytes than its header's shape"),
    ("truncated gzip", "cannot read .*train-images-idx3-ubyte.gz"),
    ("not gzip, not idx", "not an idx file"),
    ("labels out of range", r"outside \[0, 10\)"),
    ("count mismatch", "4 images but 3 labels"),
    ("wrong image size", r"holds \(27, 28\) images, expected \(28, 28\)"),
])
def test_bad_fashion_files_are_data_error(case: str, message: str, tmp_path: Path) -> None:
    _corrupt_fashion(case, tmp_path / "fashion-mnist")
    with raises_data_error(message):
        data.load("fashion-mnist", data_dir=tmp_path, progress=False)


def test_real_fashion_mnist_from_debian_package(tmp_path: Path) -> None:
    system_dir = Path("/usr/share/datasets/fashion-mnist")
    if data._files_in(system_dir, data.DATASETS["fashion-mnist"]) is None:
        pytest.skip(f"{system_dir} lacks the Fashion-MNIST files (apt-get install "
                    "dataset-fashion-mnist)")
    dataset = data.load("fashion-mnist", data_dir=tmp_path, archive=system_dir, progress=False)
    assert dataset.x_train.shape == (60000, 1, 28, 28)
    assert dataset.x_test.shape == (10000, 1, 28, 28)
    np.testing.assert_array_equal(np.bincount(dataset.y_train), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(dataset.y_test), [1000] * 10)
    cached = data.load("fashion-mnist", data_dir=tmp_path, archive=system_dir, progress=False)
    np.testing.assert_array_equal(cached.x_test, dataset.x_test)


# --------------------------------------------------------------------------------------
# Dataset and synthetic data
# --------------------------------------------------------------------------------------


def test_dataset_rejects_wrong_arrays() -> None:
    x = np.zeros((4, 1, 2, 2), np.uint8)
    y = np.zeros(4, np.int64)
    assert Dataset("t", x, y, x, y, 2).input_shape == (1, 2, 2)
    with raises_data_error("uint8"):
        Dataset("t", x.astype(np.float32), y, x, y, 2)
    with raises_data_error("int64"):
        Dataset("t", x, y.astype(np.int32), x, y, 2)
    with raises_data_error("C-contiguous"):
        Dataset("t", x[:, :, :, ::-1], y, x, y, 2)
    with raises_data_error("test split.*per item"):
        Dataset("t", x, y, np.zeros((4, 1, 3, 3), np.uint8), y, 2)
    with raises_data_error(r"outside \[0, 2\)"):
        Dataset("t", x, y + 2, x, y, 2)


def test_synthetic_shapes_dtypes_balance() -> None:
    dataset = data.synthetic(seed=0, n_train=1003, n_test=200, shape=(3, 16, 12),
                             num_classes=7)
    assert dataset.x_train.shape == (1003, 3, 16, 12) and dataset.x_train.dtype == np.uint8
    assert dataset.y_train.dtype == np.int64 and dataset.x_test.shape == (200, 3, 16, 12)
    assert dataset.x_train.flags.c_contiguous and dataset.num_classes == 7
    counts = np.bincount(dataset.y_train, minlength=7)
    assert counts.max() - counts.min() <= 1
    assert len(np.unique(dataset.x_train)) > 100  # uses the pixel range, not a few levels


def test_synthetic_deterministic_per_seed() -> None:
    a, b, c = data.synthetic(seed=5), data.synthetic(seed=5), data.synthetic(seed=6)
    for key in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
    assert not np.array_equal(a.x_train, c.x_train)


def test_synthetic_is_quick() -> None:
    data.synthetic(seed=1)  # warm up imports
    start = time.perf_counter()
    data.synthetic(seed=2)
    assert time.perf_counter() - start < 1.0  # ~0.04 s; loose bound for busy machines


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 28, 28)])
def test_synthetic_is_learnable_by_nearest_class_mean(shape: tuple[int, int, int]) -> None:
    dataset = data.synthetic(seed=3, shape=shape)
    x_train = dataset.x_train.reshape(len(dataset.x_train), -1).astype(np.float32)
    x_test = dataset.x_test.reshape(len(dataset.x_test), -1).astype(np.float32)
    means = np.stack([x_train[dataset.y_train == k].mean(axis=0)
                      for k in range(dataset.num_classes)])
    distances = (x_test**2).sum(1)[:, None] - 2 * x_test @ means.T + (means**2).sum(1)[None]
    accuracy = (distances.argmin(axis=1) == dataset.y_test).mean()
    assert accuracy > 0.9


def test_synthetic_rejects_bad_arguments() -> None:
    with raises_data_error("synthetic needs"):
        data.synthetic(n_train=0)
    with raises_data_error("synthetic needs"):
        data.synthetic(shape=(3, 32))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# The registry: every declaration agrees with what its parser produces
# --------------------------------------------------------------------------------------


def _write_cifar100(root: Path) -> None:
    rng = np.random.default_rng(1)
    write_tar(root / "cifar-100-python.tar.gz",
              {"cifar-100-python/train": cifar_batch(rng, 7, 100, b"fine_labels"),
               "cifar-100-python/test": cifar_batch(rng, 5, 100, b"fine_labels")})


# How to write each declared dataset's official files, tiny, into a data dir (None:
# generated, no files).  A new declaration needs an entry: see the test below.
TINY_SOURCES = {
    "cifar10": lambda root: write_tar(root / "cifar-10-python.tar.gz", cifar10_members()),
    "cifar100": _write_cifar100,
    "fashion-mnist": lambda root: write_fashion(root / "fashion-mnist", fashion_arrays()),
    "synthetic": None,
}


def test_every_declared_dataset_has_tiny_sources_here() -> None:
    assert set(TINY_SOURCES) == set(data.DATASETS)


@pytest.mark.parametrize("name", sorted(data.DATASETS))
def test_declared_shape_and_classes_match_the_parser(name: str, tmp_path: Path) -> None:
    spec = data.DATASETS[name]
    assert spec.name == name and spec.cache_name == f"{name}.h5"
    writer = TINY_SOURCES[name]
    if writer is None:
        assert spec.source == "generated" and spec.files == () and spec.generate is not None
    else:
        assert spec.source in ("archive", "directory") and spec.parse is not None
        assert spec.files and spec.files_label
        assert all(len(f.md5) == 32 and f.url.startswith(("http://", "https://"))
                   for f in spec.files)
        writer(tmp_path)
    dataset = data.load(name, data_dir=tmp_path, progress=False)
    assert dataset.name == name
    assert dataset.input_shape == spec.input_shape
    assert dataset.x_test.shape[1:] == spec.input_shape
    assert dataset.num_classes == spec.num_classes
    if writer is not None:  # read back through the cache: the same declaration checks it
        assert (tmp_path / spec.cache_name).is_file()
        cached = data.load(name, data_dir=tmp_path, progress=False)
        assert cached.input_shape == spec.input_shape


def test_models_size_from_the_registry() -> None:
    from iasgd.nn import models
    for name, spec in data.DATASETS.items():
        model = models.build("mlp", name, hidden=(4,))
        assert model.input_shape == spec.input_shape
        assert model.arch.num_classes == spec.num_classes


def test_cli_dataset_takes_the_registry_or_a_file(tmp_path: Path) -> None:
    from iasgd import run
    parser = run.build_parser()
    for name in data.DATASETS:
        assert parser.parse_args(["--dataset", name]).dataset == name
    mine = tmp_path / "mine.npz"
    assert parser.parse_args(["--dataset", str(mine)]).dataset == str(mine.resolve())
    with pytest.raises(run.UsageError, match=r"unknown dataset 'cifar11'.*cifar10.*npz"):
        parser.parse_args(["--dataset", "cifar11"])
