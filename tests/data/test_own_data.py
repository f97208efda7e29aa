"""A user's own data: .npz and HDF5 files and arrays in every accepted layout, their
validation (one-line DataErrors naming the file), the refusal of pickles, the cache, and a
file that trains end to end."""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from iasgd import data
from iasgd.data import DataError, Dataset, from_arrays
from iasgd.data import own as own_module

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def raises_data_error(match: str, names: str | None = None) -> Iterator[None]:
    """Expect a DataError whose message matches, is a single line and names `names`."""
    with pytest.raises(DataError, match=match) as info:
        yield
    message = str(info.value)
    assert "\n" not in message
    if names is not None:
        assert names in message


def reference(n: int = 40, shape: tuple[int, int, int] = (3, 5, 6), classes: int = 4,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (n, *shape) whose pixel [0, 0, 0] is their index, and labels (n,)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    x[:, 0, 0, 0] = np.arange(n)  # lets a test find each image again after a split
    y = np.arange(n, dtype=np.int64) % classes
    rng.shuffle(y)
    return x, y


def as_stored(x: np.ndarray, layout: str, dtype: str) -> np.ndarray:
    """uint8 NCHW images as a user would store them: in `layout` and `dtype` (floats in
    [0, 1])."""
    if layout == "nhwc":
        x = x.transpose(0, 2, 3, 1)
    elif layout == "nhw":
        x = x[:, 0]
    return (x / 255).astype(dtype) if dtype.startswith("float") else x.astype(dtype)


def write(path: Path, **arrays: Any) -> Path:
    """Write arrays to an .npz (np.savez) or an HDF5 file (datasets at the root; a `layout`
    goes to the root's attributes)."""
    if path.suffix.lower() == ".npz":
        with open(path, "wb") as f:  # a file object: savez would append .npz to .NPZ
            np.savez(f, **arrays)
    else:
        with h5py.File(path, "w") as f:
            for key, value in arrays.items():
                if key == "layout":
                    f.attrs[key] = value
                else:
                    f.create_dataset(key, data=value)
    return path


def indices(x: np.ndarray) -> np.ndarray:
    """The index each image of reference() carries in its first pixel."""
    return x[:, 0, 0, 0].astype(np.int64)


# --------------------------------------------------------------------------------------
# Every accepted layout, from .npz and HDF5
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npz", ".h5"])
@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc", "nhw"])
@pytest.mark.parametrize("with_test", [True, False], ids=["test-split", "held-out"])
def test_file_round_trip(suffix: str, dtype: str, layout: str, with_test: bool,
                         tmp_path: Path) -> None:
    shape = (1, 5, 6) if layout == "nhw" else (3, 5, 6)
    x, y = reference(shape=shape)
    x_test, y_test = reference(n=12, shape=shape, seed=1)
    arrays = {"x_train": as_stored(x, layout, dtype), "y_train": y}
    if with_test:
        arrays |= {"x_test": as_stored(x_test, layout, dtype), "y_test": y_test.astype(np.int32)}
    path = write(tmp_path / f"mine{suffix}", **arrays)

    dataset = data.load(str(path), data_dir=tmp_path / "cache", progress=False)

    assert dataset.name == path.name
    assert dataset.input_shape == shape and dataset.num_classes == 4
    for split in (dataset.x_train, dataset.x_test):
        assert split.dtype == np.uint8 and split.flags.c_contiguous and split.ndim == 4
    assert dataset.y_train.dtype == np.int64 and dataset.y_test.dtype == np.int64
    if with_test:
        np.testing.assert_array_equal(dataset.x_train, x)
        np.testing.assert_array_equal(dataset.y_train, y)
        np.testing.assert_array_equal(dataset.x_test, x_test)
        np.testing.assert_array_equal(dataset.y_test, y_test)
    else:
        train, test = indices(dataset.x_train), indices(dataset.x_test)
        assert len(test) == 4 and len(train) == 36  # round(0.1 * 40)
        assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)  # file order kept
        assert sorted([*train, *test]) == list(range(40))  # disjoint, nothing lost
        np.testing.assert_array_equal(dataset.x_train, x[train])
        np.testing.assert_array_equal(dataset.y_train, y[train])
        np.testing.assert_array_equal(dataset.x_test, x[test])
        np.testing.assert_array_equal(dataset.y_test, y[test])
    # The same again from the cache.
    cached = data.load(path, data_dir=tmp_path / "cache", progress=False)
    for key in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(cached, key), getattr(dataset, key))
    assert cached.name == dataset.name and cached.num_classes == dataset.num_classes


# Issue 41, item 9: the usual spellings of images and labels, each with and without a test
# split (Keras's x_test / y_test).
SPELLINGS = [("x", "y"), ("X", "y"), ("images", "labels"), ("data", "labels"),
             ("data", "targets"), ("x_train", "y_train")]


@pytest.mark.parametrize("suffix", [".npz", ".h5"])
@pytest.mark.parametrize("with_test", [True, False], ids=["test-split", "held-out"])
@pytest.mark.parametrize(("images", "labels"), SPELLINGS, ids=["/".join(s) for s in SPELLINGS])
def test_the_usual_names_of_images_and_labels(images: str, labels: str, with_test: bool,
                                              suffix: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    x, y = reference()
    x_test, y_test = reference(n=12, seed=1)
    arrays = {images: x, labels: y} | ({"x_test": x_test, "y_test": y_test} if with_test else {})
    path = write(tmp_path / f"mine{suffix}", **arrays)
    dataset = data.load(path, data_dir=tmp_path / "cache")
    if with_test:
        np.testing.assert_array_equal(dataset.x_train, x)
        np.testing.assert_array_equal(dataset.x_test, x_test)
        np.testing.assert_array_equal(dataset.y_test, y_test)
    else:  # held out as from_arrays holds them out
        same = from_arrays(x, y, verbose=False)
        np.testing.assert_array_equal(dataset.x_train, same.x_train)
        np.testing.assert_array_equal(dataset.y_test, same.y_test)
    summary = capsys.readouterr().err
    assert (f"images from {images!r}, labels from {labels!r}" in summary) == \
        (images != "x_train"), summary


@pytest.mark.parametrize("suffix", [".hdf5", ".NPZ", ".H5"])
def test_other_suffix_spellings(suffix: str, tmp_path: Path) -> None:
    x, y = reference()
    path = tmp_path / f"mine{suffix}"
    write(path, x_train=x, y_train=y)
    dataset = data.load(str(path), data_dir=tmp_path, progress=False)
    assert len(dataset.x_train) + len(dataset.x_test) == 40


def test_held_out_split_is_deterministic_seeded_and_sized(tmp_path: Path) -> None:
    x, y = reference(n=50)
    first = from_arrays(x, y, verbose=False)
    again = from_arrays(x, y, verbose=False)
    other_seed = from_arrays(x, y, seed=1, verbose=False)
    quarter = from_arrays(x, y, test_fraction=0.25, verbose=False)
    np.testing.assert_array_equal(indices(first.x_test), indices(again.x_test))
    assert set(indices(first.x_test)) != set(indices(other_seed.x_test))
    assert len(first.x_test) == 5 and len(quarter.x_test) == 12  # round(12.5) is 12
    assert len(from_arrays(x[:2], y[:2] % 2, verbose=False).x_test) == 1
    # A file holds out the same images as its arrays do.
    path = write(tmp_path / "m.npz", x_train=x, y_train=y)
    loaded = data.load(path, data_dir=tmp_path, progress=False)
    np.testing.assert_array_equal(loaded.x_test, first.x_test)


def test_first_load_says_what_it_did_in_one_line(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    x, y = reference(shape=(3, 5, 6))
    path = write(tmp_path / "m.npz", x_train=as_stored(x, "nhwc", "float32"), y_train=y)
    data.load(path, data_dir=tmp_path / "d")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert re.search(r"m\.npz: 36 train / 4 test images of 3x5x6 .*4 classes \(max label \+ 1\)"
                     r".*NHWC to NCHW.*float32.*held out 4 of 40 images.*seed 0.*cached in",
                     lines[0])
    data.load(path, data_dir=tmp_path / "d")  # from the cache: nothing to say
    assert capsys.readouterr().err == ""
    from_arrays(x, y, name="mine")
    assert capsys.readouterr().err.startswith("iasgd: mine: 36 train / 4 test")


# --------------------------------------------------------------------------------------
# Values and layouts
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_floats_k_over_255_come_back_as_k(dtype: str) -> None:
    x = (np.arange(256, dtype=np.float64) / 255).astype(dtype).reshape(4, 1, 8, 8)
    dataset = from_arrays(x, np.array([0, 1, 0, 1]), x, np.array([1, 0, 1, 0]),
                          verbose=False)
    np.testing.assert_array_equal(dataset.x_train.ravel(), np.arange(256))


def test_integer_images_in_range_and_column_labels_and_lists_accepted() -> None:
    x, y = reference(n=10, shape=(1, 3, 3))
    dataset = from_arrays(x.astype(np.int64).tolist(), y.reshape(-1, 1).astype(np.uint16),
                          verbose=False)
    assert dataset.x_train.dtype == np.uint8 and dataset.y_train.dtype == np.int64
    assert sorted(indices(dataset.x_train).tolist() + indices(dataset.x_test).tolist()) == \
        list(range(10))


def test_uint8_nchw_arrays_are_taken_as_they_are() -> None:
    x, y = reference()
    x_test, y_test = reference(n=5, seed=2)
    dataset = from_arrays(x, y, x_test, y_test, verbose=False)
    assert dataset.x_train is x or np.shares_memory(dataset.x_train, x)  # no copy needed


@pytest.mark.parametrize(("shape", "layout", "expected"), [
    ((6, 3, 8, 3), "auto", (3, 8, 3)),    # both axes look like channels: NCHW
    ((6, 3, 8, 3), "nhwc", (3, 3, 8)),    # unless told otherwise
    ((6, 1, 7, 1), "auto", (1, 7, 1)),
    ((6, 8, 8, 4), "nhwc", (4, 8, 8)),    # 4 channels: only when told
    ((6, 4, 8, 8), "nchw", (4, 8, 8)),
    ((6, 8, 9, 3), "auto", (3, 8, 9)),
    ((6, 1, 8, 9), "auto", (1, 8, 9)),
    ((6, 8, 9), "nhwc", (1, 8, 9)),       # (N, H, W): one channel whatever the layout
])
def test_layout_rules(shape: tuple[int, ...], layout: str, expected: tuple[int, ...]) -> None:
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) % 256
    dataset = from_arrays(x, np.arange(6) % 2, layout=layout, verbose=False)
    assert dataset.input_shape == expected
    channels_last = len(shape) == 4 and expected != shape[1:]
    nchw = x.transpose(0, 3, 1, 2) if channels_last else x.reshape(6, *expected)
    assert {tuple(img.ravel()) for img in np.concatenate([dataset.x_train, dataset.x_test])} \
        == {tuple(img.ravel()) for img in nchw.astype(np.uint8)}


@pytest.mark.parametrize(("shape", "layout", "read_as"), [
    ((6, 3, 8, 8), "nhwc", "8 channels of 3x8"),  # axis 1 looks like channels, axis 3 not
    ((6, 8, 8, 1), "nchw", "8 channels of 8x1"),
])
def test_a_layout_given_against_the_one_channel_axis_is_refused(shape, layout, read_as) -> None:
    x = np.zeros(shape, np.uint8)
    with pytest.raises(DataError, match=f"layout {layout} reads images of shape "
                                        rf"\({', '.join(map(str, shape))}\) as {read_as}"):
        from_arrays(x, np.arange(6) % 2, layout=layout, verbose=False)


@pytest.mark.parametrize("suffix", [".npz", ".h5"])
def test_layout_entry_in_the_file_and_the_argument_wins(suffix: str, tmp_path: Path) -> None:
    x, y = reference(shape=(4, 8, 8))  # 4 channels: the shape cannot tell
    stored = x.transpose(0, 2, 3, 1)
    path = write(tmp_path / f"rgba{suffix}", x_train=stored, y_train=y, layout="nhwc")
    assert data.load(path, data_dir=tmp_path / "a", progress=False).input_shape == (4, 8, 8)
    told = data.load(path, data_dir=tmp_path / "b", progress=False, layout="nchw")
    assert told.input_shape == (8, 8, 4)
    path.unlink()
    write(path, x_train=stored, y_train=y)
    with raises_data_error("cannot tell the channel axis.*layout='nchw' or 'nhwc'",
                           names=str(path)):
        data.load(path, data_dir=tmp_path / "c", progress=False)


# --------------------------------------------------------------------------------------
# Bad files: every one a one-line DataError naming the file and the problem
# --------------------------------------------------------------------------------------


def _x(n: int = 10) -> np.ndarray:
    return reference(n=n, shape=(1, 8, 8))[0]


def _y(n: int = 10) -> np.ndarray:
    return np.arange(n) % 3


# (id, arrays of the file, regex of the message); each is tried as .npz and as HDF5.
BAD_CONTENTS: list[tuple[str, dict[str, Any], str]] = [
    ("no-x_train", {"y_train": _y()},
     r"has labels \('y_train'\) but no images \(it holds: y_train\): store the training "
     "images as x_train"),
    ("no-y_train", {"x_train": _x()}, r"has images \('x_train'\) but no labels"),
    ("no-labels", {"images": _x(), "other": _y()},
     r"has images \('images'\) but no labels \(it holds: images, other\): store their "
     "integer labels as labels"),
    ("nothing", {"classes": _y(), "pixels": _x()},
     r"has no images and labels under a name iasgd reads \(it holds: classes, pixels\): "
     r"store them as x_train and y_train \(or x/y, X/y, images/labels"),
    ("no-pair", {"x": _x(), "labels": _y()},
     r"has images \('x'\) and labels \('labels'\) under names iasgd does not pair"),
    ("x_test-alone", {"x_train": _x(), "y_train": _y(), "x_test": _x()},
     "has x_test but no y_test: give both, or neither"),
    ("y_test-alone", {"x_train": _x(), "y_train": _y(), "y_test": _y()},
     "has y_test but no x_test"),
    ("images-2d", {"x_train": _x().reshape(10, 64), "y_train": _y()},
     r"x_train has shape \(10, 64\); images must be \(N, C, H, W\)"),
    ("images-5d", {"x_train": _x()[:, None], "y_train": _y()}, "x_train has shape"),
    ("images-empty", {"x_train": _x()[:0], "y_train": _y()[:0]}, "x_train is empty"),
    ("image-axis-empty", {"x_train": np.zeros((10, 1, 0, 8), np.uint8), "y_train": _y()},
     "empty image axis"),
    ("labels-2d", {"x_train": _x(), "y_train": np.zeros((10, 2), np.int64)},
     r"y_train has shape \(10, 2\); labels must be \(N,\)"),
    ("length-mismatch", {"x_train": _x(), "y_train": _y(9)},
     "10 images in x_train but 9 labels in y_train"),
    ("test-length-mismatch", {"x_train": _x(), "y_train": _y(), "x_test": _x(4),
                              "y_test": _y(5)}, "4 images in x_test but 5 labels in y_test"),
    ("labels-float", {"x_train": _x(), "y_train": _y().astype(np.float64)},
     "y_train has dtype float64; labels must be integer"),
    ("labels-bool", {"x_train": _x(), "y_train": _y() > 0}, "y_train has dtype bool"),
    ("labels-negative", {"x_train": _x(), "y_train": _y() - 1},
     "y_train holds the negative label -1"),
    ("test-labels-negative", {"x_train": _x(), "y_train": _y(), "x_test": _x(3),
                              "y_test": np.array([0, -2, 1])}, "y_test holds the negative"),
    ("labels-beyond-images", {"x_train": _x(), "y_train": _y() * 500},
     r"labels reach 1000, so classes = max label \+ 1 = 1,001, more than the 10 images"),
    ("nan", {"x_train": np.where(_x() > 200, np.nan, 0.5), "y_train": _y()},
     r"x_train holds [\d,]+ NaN or infinite value\(s\)"),
    ("inf", {"x_train": np.where(_x() > 200, -np.inf, 0.5).astype(np.float32),
             "y_train": _y()}, "NaN or infinite"),
    ("floats-above-1", {"x_train": _x() / 127.5, "y_train": _y()},
     r"x_train holds floats in \[0, 2\]; float images must be in \[0, 1\]: divide by 255"),
    ("floats-below-0", {"x_train": _x() / 255 - 0.5, "y_train": _y()},
     r"floats in \[-0\.5, 0\.5\]"),
    ("test-floats-above-1", {"x_train": _x(), "y_train": _y(), "x_test": _x(3) * 1.0,
                             "y_test": _y(3)}, "x_test holds floats in"),
    ("ints-beyond-255", {"x_train": _x().astype(np.int16) + 100, "y_train": _y()},
     r"x_train holds int16 values in \[100, 355\]; integer images must be in \[0, 255\]"),
    ("ints-negative", {"x_train": _x().astype(np.int32) - 1, "y_train": _y()},
     r"int32 values in \[-1, "),
    ("images-bool", {"x_train": _x() > 100, "y_train": _y()}, "x_train has dtype bool"),
    ("images-complex", {"x_train": _x() * 1j, "y_train": _y()},
     r"x_train has (dtype|HDF5 type) complex"),
    ("ambiguous-layout", {"x_train": np.zeros((10, 8, 8, 4), np.uint8), "y_train": _y()},
     r"cannot tell the channel axis of images of shape \(10, 8, 8, 4\)"),
    ("bad-layout-entry", {"x_train": _x(), "y_train": _y(), "layout": "hwc"},
     "its layout entry is 'hwc', not one of auto, nchw, nhwc"),
    ("test-other-size", {"x_train": _x(), "y_train": _y(),
                         "x_test": np.zeros((3, 1, 8, 9), np.uint8), "y_test": _y(3)},
     r"x_test images are \(1, 8, 9\) \(C, H, W\), x_train images \(1, 8, 8\)"),
    ("test-other-dims", {"x_train": _x(), "y_train": _y(),
                         "x_test": np.zeros((3, 8, 8), np.uint8), "y_test": _y(3)},
     "x_test has 3 dims, x_train 4"),
    ("one-image", {"x_train": _x(1), "y_train": _y(1)},
     "1 image cannot be split into train and test"),
]


@pytest.mark.parametrize("suffix", [".npz", ".h5"])
@pytest.mark.parametrize(("arrays", "message"), [(a, m) for _, a, m in BAD_CONTENTS],
                         ids=[case for case, _, _ in BAD_CONTENTS])
def test_bad_contents_are_one_line_errors(suffix: str, arrays: dict[str, Any], message: str,
                                          tmp_path: Path) -> None:
    path = write(tmp_path / f"bad{suffix}", **arrays)
    with raises_data_error(message, names=str(path)):
        data.load(str(path), data_dir=tmp_path, progress=False)
    assert not any(tmp_path.glob("*.h5.*.h5")) and not any(tmp_path.glob("*.npz.*.h5"))


def _truncated_npz(path: Path) -> None:
    np.savez(path, x_train=_x(200), y_train=_y(200))
    path.write_bytes(path.read_bytes()[:3000])


def _truncated_h5(path: Path) -> None:
    write(path, x_train=_x(200), y_train=_y(200))
    path.write_bytes(path.read_bytes()[:3000])


def _npy_as_npz(path: Path) -> None:
    with open(path, "wb") as f:
        np.save(f, _x())


def _npz_anyway(path: Path) -> None:
    """An .npz archive under whatever name `path` has."""
    with open(path, "wb") as f:
        np.savez(f, x_train=_x(), y_train=_y())


def _group_h5(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f.create_group("x_train")
        f["y_train"] = _y()


def _strings_h5(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f["x_train"] = np.array([b"a", b"b"])
        f["y_train"] = _y(2)


# (id, file name, writer (None: write nothing), regex of the message)
BAD_FILES: list[tuple[str, str, Callable[[Path], Any] | None, str]] = [
    ("no-such-file", "gone.npz", None, "gone.npz: no such file: check the path"),
    ("directory", "dir.h5", lambda p: p.mkdir(), r"dir\.h5 is not a file"),
    ("wrong-extension", "mine.csv", lambda p: p.write_text("1,2\n"),
     r"unknown file type '\.csv': store the data in an \.npz \(numpy\) or \.h5/\.hdf5"),
    ("no-extension", "mine", _npz_anyway,
     r"unknown file type '\(no suffix\)'"),
    ("garbage-npz", "g.npz", lambda p: p.write_bytes(b"not a zip at all" * 10),
     r"g\.npz is not an \.npz archive of arrays \(not a zip file"),
    ("empty-npz", "e.npz", lambda p: p.write_bytes(b""), "is empty, not an .npz archive"),
    ("truncated-npz", "t.npz", _truncated_npz, r"cannot read .*t\.npz"),
    ("npy-as-npz", "a.npz", _npy_as_npz, "holds a single .npy array, not an .npz archive"),
    ("pickle-as-npz", "p.npz", lambda p: p.write_bytes(pickle.dumps({"x_train": [1]})),
     "holds pickled Python objects, which iasgd never loads"),
    ("object-labels", "o.npz",
     lambda p: np.savez(p, x_train=_x(), y_train=np.array([1, "a"] * 5, dtype=object)),
     "y_train is an array of Python objects, which iasgd does not unpickle"),
    ("garbage-h5", "g.h5", lambda p: p.write_bytes(b"\x89HDF garbage" * 20),
     r"cannot read .*g\.h5 as HDF5 \(.*\): it is corrupt or not an HDF5 file"),
    ("npz-as-h5", "z.h5", _npz_anyway,
     "as HDF5"),
    ("truncated-h5", "t.hdf5", _truncated_h5, r"cannot read .*t\.hdf5"),
    ("group-h5", "grp.h5", _group_h5, "x_train is an HDF5 group, not a dataset"),
    ("strings-h5", "s.h5", _strings_h5, r"x_train has HDF5 type \|S1: store plain numeric"),
]


@pytest.mark.parametrize(("name", "writer", "message"), [(n, w, m) for _, n, w, m in BAD_FILES],
                         ids=[case for case, _, _, _ in BAD_FILES])
def test_bad_files_are_one_line_errors(name: str, writer: Callable[[Path], Any] | None,
                                       message: str, tmp_path: Path) -> None:
    path = tmp_path / name
    if writer is not None:
        writer(path)
    with raises_data_error(message, names=str(path)):
        data.load(str(path), data_dir=tmp_path / "cache", progress=False)


AMBIGUOUS = [
    ({"x": _x(), "X": _x(), "y": _y()}, "'x' and 'X'"),
    ({"images": _x(), "data": _x(), "labels": _y()}, "'images' and 'data'"),
    ({"x_train": _x(), "y_train": _y(), "x": _x(), "y": _y()}, "'x_train' and 'x'"),
    ({"data": _x(), "labels": _y(), "targets": _y()}, "'labels' and 'targets'"),
]


@pytest.mark.parametrize("suffix", [".npz", ".h5"])
@pytest.mark.parametrize(("arrays", "names"), AMBIGUOUS,
                         ids=[message for _, message in AMBIGUOUS])
def test_two_names_for_the_images_or_labels_are_one_line(arrays: dict[str, Any], names: str,
                                                          suffix: str, tmp_path: Path) -> None:
    path = write(tmp_path / f"mine{suffix}", **arrays)
    with raises_data_error(f"holds (images|labels) under two names, {names}: keep one",
                           names=str(path)):
        data.load(path, data_dir=tmp_path / "cache", progress=False)


# (id, what the file holds, regex of the message): files renamed .npz that are no archive
NOT_NPZ: list[tuple[str, Callable[[Path], Any], str]] = [
    ("text", lambda p: p.write_text("x,y\n0.5,1\n"),
     r"is not an \.npz archive of arrays \(not a zip file"),
    ("pickle", lambda p: p.write_bytes(pickle.dumps({"x_train": np.zeros(3)})),
     r"holds pickled Python objects, which iasgd never loads \(a pickle can run code\)"),
    ("pickle-protocol-0", lambda p: p.write_bytes(pickle.dumps([1, 2], protocol=0)),
     r"is not an \.npz archive of arrays"),
    ("empty", lambda p: p.write_bytes(b""), r"is empty, not an \.npz archive of arrays"),
]


@pytest.mark.parametrize(("writer", "message"), [(w, m) for _, w, m in NOT_NPZ],
                         ids=[case for case, _, _ in NOT_NPZ])
def test_a_file_that_is_no_npz_is_never_advised_to_be_unpickled(
        writer: Callable[[Path], Any], message: str, tmp_path: Path) -> None:
    """Issue 41, item 4a: not numpy's "load it unsafely using allow_pickle", which is the
    opposite of "a data file is data, never code", but what the file is and what to do."""
    path = tmp_path / "mine.npz"
    writer(path)
    with pytest.raises(DataError, match=message) as info:
        data.load(path, data_dir=tmp_path / "cache", progress=False)
    said = str(info.value)
    assert "\n" not in said and str(path) in said and "np.savez(" in said
    assert "allow_pickle" not in said and "unsafe" not in said and "trust" not in said, said


def test_unknown_name_mentions_files() -> None:
    with raises_data_error(r"unknown dataset 'mnist'.*or give the path of an \.npz"):
        data.load("mnist")


def test_bad_options_and_archive_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "m.npz", x_train=_x(), y_train=_y())
    for kwargs, message in [({"test_fraction": 0.0}, r"test_fraction must be a number in \(0, 1\)"),
                            ({"test_fraction": 1}, "test_fraction"),
                            ({"seed": -1}, "seed must be an int >= 0"),
                            ({"layout": "hwc"}, "layout must be one of auto, nchw, nhwc")]:
        with raises_data_error(message, names=str(path)):
            data.load(path, data_dir=tmp_path, progress=False, **kwargs)
        with raises_data_error(message, names="arrays"):
            from_arrays(_x(), _y(), verbose=False, **kwargs)
    with raises_data_error("archive .* is for the registry's datasets", names=str(path)):
        data.load(path, data_dir=tmp_path, archive=tmp_path / "c.tar.gz", progress=False)


def test_from_arrays_errors_name_the_arrays() -> None:
    with raises_data_error("^mine: y_train has dtype float64", names="mine"):
        from_arrays(_x(), _y() * 1.0, name="mine", verbose=False)
    with raises_data_error("^arrays: x_train is not an array"):
        from_arrays([[[1, 2]], [[1]]], [0, 1], verbose=False)
    with raises_data_error("^arrays: x_train holds Python objects"):
        from_arrays(np.array([None] * 4).reshape(1, 1, 2, 2), [0], verbose=False)


def test_is_own_file(tmp_path: Path) -> None:
    (tmp_path / "any.bin").write_bytes(b"")
    assert data.is_own_file("missing.npz") and data.is_own_file("x/y.HDF5")
    assert data.is_own_file(str(tmp_path / "any.bin"))  # exists: load says what is wrong
    assert not data.is_own_file("cifar10") and not data.is_own_file(str(tmp_path))


# --------------------------------------------------------------------------------------
# A file is data, never code
# --------------------------------------------------------------------------------------


class _Payload:
    """Unpickling this creates the directory `marker`: the side effect of running code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


@pytest.mark.parametrize("key", ["x_train", "y_train", "x_test", "y_test"])
def test_object_array_npz_is_refused_without_unpickling(key: str, tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    arrays: dict[str, Any] = {"x_train": _x(), "y_train": _y(), "x_test": _x(3),
                              "y_test": _y(3)}
    arrays[key] = np.array([_Payload(marker)], dtype=object)
    path = tmp_path / "evil.npz"
    np.savez(path, allow_pickle=True, **arrays)  # savez pickles object arrays
    with raises_data_error(f"{key} is an array of Python objects, which iasgd does not "
                           "unpickle", names=str(path)):
        data.load(path, data_dir=tmp_path / "cache", progress=False)
    assert not marker.exists()
    # The payload is live: numpy with allow_pickle=True runs it.
    np.load(path, allow_pickle=True)[key]
    assert marker.is_dir()


def test_pickle_renamed_npz_and_unused_object_member_run_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    path = tmp_path / "evil.npz"
    path.write_bytes(pickle.dumps({"x_train": _Payload(marker)}))
    with raises_data_error("not an .npz archive", names=str(path)):
        data.load(path, data_dir=tmp_path / "cache", progress=False)
    path.unlink()
    # An object array under a key the format does not use is never read.
    np.savez(path, x_train=_x(), y_train=_y(), notes=np.array([_Payload(marker)], object))
    assert data.load(path, data_dir=tmp_path / "cache", progress=False).num_classes == 3
    assert not marker.exists()


# --------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------


def test_no_cache_for_a_batch_larger_than_the_training_split(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41, item 4c: a run refuses a batch larger than the training split, so a load
    for it writes no cache and says nothing (issue 60, item 4: the run's error is the one
    line); one that fits caches the file."""
    path = write(tmp_path / "m.h5", x_train=_x(), y_train=_y())  # 9 train, 1 held out
    cache = tmp_path / "cache"
    dataset = data.load(path, data_dir=cache, batch_size=10)
    assert len(dataset.x_train) == 9 and not cache.exists()
    assert capsys.readouterr().err == ""
    data.load(path, data_dir=cache, batch_size=9, progress=False)
    assert len(list(cache.glob("m.h5.*.h5"))) == 1


def test_cache_is_named_after_file_and_path_and_spares_reading(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = reference()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write(tmp_path / "a" / "mine.npz", x_train=x, y_train=y)
    second = write(tmp_path / "b" / "mine.npz", x_train=x[:20], y_train=y[:20])
    cache_dir = tmp_path / "cache"
    assert len(data.load(first, data_dir=cache_dir, progress=False).x_train) == 36
    assert len(data.load(second, data_dir=cache_dir, progress=False).x_train) == 18
    caches = sorted(p.name for p in cache_dir.iterdir())
    assert len(caches) == 2 and all(re.fullmatch(r"mine\.npz\.[0-9a-f]{12}\.h5", c)
                                    for c in caches)
    with h5py.File(cache_dir / caches[0], "r") as f:
        assert f.attrs["dataset"] == "mine.npz" and '"test_fraction": 0.1' in f.attrs["conversion"]

    def no_reading(*args: object, **kwargs: object) -> None:
        raise AssertionError("read the file instead of the cache")

    monkeypatch.setattr(own_module, "read_file", no_reading)
    assert len(data.load(first, data_dir=cache_dir, progress=False).x_train) == 36
    assert len(data.load(second, data_dir=cache_dir, progress=False).x_train) == 18


def test_changed_file_or_options_are_read_again(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = reference()
    path = write(tmp_path / "mine.h5", x_train=x, y_train=y)
    load = lambda **kw: data.load(path, data_dir=tmp_path / "c", progress=False, **kw)  # noqa: E731
    assert len(load().x_test) == 4
    assert len(load(test_fraction=0.5).x_test) == 20  # other options: read again
    seeded = load(seed=3)
    assert set(indices(seeded.x_test)) != set(indices(load().x_test))
    path.unlink()
    write(path, x_train=x[:30], y_train=y[:30] % 2)  # changed content
    changed = load()
    assert len(changed.x_train) + len(changed.x_test) == 30 and changed.num_classes == 2
    # Touched, not changed: hashed again, not read again.
    os.utime(path, ns=(1, 1))
    monkeypatch.setattr(own_module, "read_file", lambda *a, **k: pytest.fail("read again"))
    assert len(load().x_train) == 27


def test_damaged_cache_is_an_error_and_unwritable_dir_a_warning(tmp_path: Path) -> None:
    x, y = reference()
    path = write(tmp_path / "mine.npz", x_train=x, y_train=y)
    data.load(path, data_dir=tmp_path / "c", progress=False)
    cache = next((tmp_path / "c").iterdir())
    cache.write_bytes(b"garbage")
    with raises_data_error("unreadable.*delete it", names=str(cache)):
        data.load(path, data_dir=tmp_path / "c", progress=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.warns(UserWarning, match="cannot write cache"):
        dataset = data.load(path, data_dir=blocker / "data", progress=False)
    assert isinstance(dataset, Dataset) and len(dataset.x_test) == 4


# --------------------------------------------------------------------------------------
# End to end, and the docs
# --------------------------------------------------------------------------------------


def test_a_file_trains_end_to_end(tmp_path: Path) -> None:
    from iasgd import TrainConfig, build, train

    made = data.synthetic(seed=0, n_train=600, n_test=10, shape=(1, 8, 8), num_classes=3)
    # Stored as a user might: float NHWC in [0, 1], no test split.
    path = write(tmp_path / "gray.npz", x_train=as_stored(made.x_train, "nhwc", "float32"),
                 y_train=made.y_train.astype(np.int32))
    dataset = data.load(str(path), data_dir=tmp_path, progress=False)
    model = build("mlp", None, input_shape=dataset.input_shape,
                  num_classes=dataset.num_classes, hidden=(16,))
    result = train(model, dataset, TrainConfig(epochs=1, batch_size=8, lr=0.02, seed=0))
    assert len(result.epochs) == 1
    assert result.epochs[0].test_accuracy > 0.5  # three balanced classes: chance is 1/3


def test_docs_examples_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # what the examples write stays out of the tree
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "data.md").read_text(), re.S)
    assert len(blocks) == 2
    namespace: dict[str, Any] = {}
    for i, block in enumerate(blocks):
        exec(compile(textwrap.dedent(block), f"docs/data.md[{i}]", "exec"), namespace)
    assert namespace["data"].name == "mine.npz" and namespace["same"].num_classes == 4
    assert data.load("mine.h5", progress=False).input_shape == (1, 8, 8)
