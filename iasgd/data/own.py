"""A user's own data: images and integer labels from numpy arrays, an .npz or an HDF5 file.

The format (docs/data.md): arrays ``x_train`` (images), ``y_train`` (labels) and optionally
``x_test``, ``y_test``; in an .npz file those keys, in an HDF5 file those datasets at the
root.  The training pair may also be called x/y, X/y, images/labels, data/labels or
data/targets (`pick_keys`).  Images are uint8 in [0, 255] (or any integer type with
values there) or float in [0, 1], shaped (N, C, H, W), (N, H, W, C) or (N, H, W); labels
are integers >= 0, shaped (N,) or (N, 1), and the class count is the largest label + 1.
Without a test split, `test_fraction` of the images are held out as one, chosen by a
seeded permutation.

`from_arrays` validates and converts arrays into a Dataset (uint8 NCHW, int64 labels);
`read_file` reads a file into the same.  A file is data, never code: an .npz is read with
``allow_pickle=False`` and HDF5 holds no pickles.  Every problem is a one-line DataError
naming the file (or the arrays' name), what is wrong and what to do.  The loader
(iasgd.data.loader) caches what `read_file` returns.
"""

from __future__ import annotations

import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from iasgd.data.types import DataError, Dataset, describe, one_line

OWN_FILE_SUFFIXES = (".npz", ".h5", ".hdf5")
DEFAULT_TEST_FRACTION = 0.1
LAYOUTS = ("auto", "nchw", "nhwc")

# The names a file may give its training images and labels, as pairs: only a pair found
# whole counts, so that another array that happens to be called `data` is no clash.
# The test split, if any, is x_test and y_test (Keras's names) whatever the pair.
_TRAIN_PAIRS = (("x_train", "y_train"), ("x", "y"), ("X", "y"), ("images", "labels"),
                ("data", "labels"), ("data", "targets"))
_IMAGE_NAMES = tuple(dict.fromkeys(images for images, _ in _TRAIN_PAIRS))
_LABEL_NAMES = tuple(dict.fromkeys(labels for _, labels in _TRAIN_PAIRS))
_PAIRS_TEXT = ", ".join(f"{a}/{b}" for a, b in _TRAIN_PAIRS[1:])
# What layout="auto" takes for a channel axis: grayscale and RGB.  Anything else (RGBA,
# multispectral) is too easily confused with a small height or width to be guessed.
_CHANNEL_COUNTS = (1, 3)
# Conversion works on slices of about this many elements: a float32 CIFAR-sized array is
# converted without a second full-size float temporary.
_CHUNK_ELEMENTS = 1 << 22
_FORMAT_HINT = "np.savez(path, x_train=..., y_train=...) (see docs/data.md)"
# How np.load tells an .npz (a zip archive) and an .npy from what it takes for a pickle.
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"
_PICKLE_PROTO = 0x80  # the first byte of a pickle of protocol 2 or later


def is_own_file(name: str) -> bool:
    """True when `name` is meant as a file of the user's own rather than a registry dataset:
    it ends in .npz, .h5 or .hdf5 (existing or not, so that a typo is "no such file"), or
    it is an existing file.  Registry names are checked first by the loader."""
    return Path(name).suffix.lower() in OWN_FILE_SUFFIXES or Path(name).expanduser().is_file()


def check_options(where: str, test_fraction: float, seed: int, layout: str) -> None:
    """DataError (one line) unless 0 < test_fraction < 1, seed is an int >= 0 and layout
    is one of LAYOUTS."""
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, int | float | np.floating) \
            or not 0 < test_fraction < 1:
        raise DataError(f"{where}: test_fraction must be a number in (0, 1), got "
                        f"{test_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise DataError(f"{where}: seed must be an int >= 0, got {seed!r}")
    if layout not in LAYOUTS:
        raise DataError(f"{where}: layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")


def from_arrays(x_train: Any, y_train: Any, x_test: Any = None, y_test: Any = None, *,
                name: str = "arrays", test_fraction: float = DEFAULT_TEST_FRACTION,
                seed: int = 0, layout: str = "auto", verbose: bool = True) -> Dataset:
    """A Dataset from images and integer labels, validated and converted.

    x_train, x_test: images (N, C, H, W), (N, H, W, C) or (N, H, W) (one channel); uint8,
        another integer type with values in [0, 255], or float with values in [0, 1]
        (scaled by 255 and rounded to uint8).
    y_train, y_test: labels (N,) or (N, 1), integers >= 0; classes = max label + 1.
    x_test and y_test come together; without them, round(test_fraction * N) (at least 1)
    images are held out as the test split by a permutation drawn from `seed`; both splits
    keep the images' order.
    layout: "auto" (see `layout_of`), or "nchw" / "nhwc" to say where the channels are.
    name: the Dataset's name, and how errors name the arrays.
    verbose: print a one-line summary on stderr (shape, classes, what was converted or
        held out).
    The result may share memory with arrays that are already uint8 (N, C, H, W) C-contiguous
    and int64 (N,).  Raises DataError with a one-line message.
    """
    dataset, summary = convert(x_train, y_train, x_test, y_test, name=name, where=name,
                               test_fraction=test_fraction, seed=seed, layout=layout)
    if verbose:
        print(f"iasgd: {summary}", file=sys.stderr)
    return dataset


def convert(x_train: Any, y_train: Any, x_test: Any, y_test: Any, *, name: str, where: str,
            test_fraction: float, seed: int, layout: str,
            train_keys: tuple[str, str] = ("x_train", "y_train")) -> tuple[Dataset, str]:
    """`from_arrays` without printing: the Dataset and its one-line summary.

    where: how errors name the source (a file's path, or the arrays' name).
    train_keys: how errors name the training images and labels (a file's own names).
    """
    check_options(where, test_fraction, seed, layout)
    x_key, y_key = train_keys
    if (x_test is None) != (y_test is None):
        given, absent = ("x_test", "y_test") if y_test is None else ("y_test", "x_test")
        raise DataError(f"{where} has {given} but no {absent}: give both, or neither to hold "
                        f"out test_fraction of the training images")
    notes: list[str] = []
    if train_keys != ("x_train", "y_train"):
        notes.append(f"images from {x_key!r}, labels from {y_key!r}")
    images = _images(x_train, x_key, where)
    labels = _labels(y_train, y_key, where, len(images), x_key)
    channels_last, layout_note = layout_of(images, layout, where)
    notes += [layout_note] if layout_note else []
    notes += _conversion_notes(images)
    train_ndim = images.ndim
    x_tr = to_nchw_uint8(images, channels_last)
    if x_test is not None:
        test_images = _images(x_test, "x_test", where)
        y_te = _labels(y_test, "y_test", where, len(test_images), "x_test")
        if test_images.ndim != train_ndim:
            raise DataError(f"{where}: x_test has {test_images.ndim} dims, {x_key} "
                            f"{train_ndim}: store both splits in the same layout")
        x_te = to_nchw_uint8(test_images, channels_last)
        if x_te.shape[1:] != x_tr.shape[1:]:
            raise DataError(f"{where}: x_test images are {_chw(x_te)} (C, H, W), {x_key} "
                            f"images {_chw(x_tr)}: store both splits in the same layout "
                            "and size")
        y_tr = labels
    else:
        x_tr, y_tr, x_te, y_te, note = _hold_out(x_tr, labels, test_fraction, seed, where)
        notes.append(note)
    num_classes = _num_classes(y_tr, y_te, len(x_tr) + len(x_te), where)
    y_tr, y_te = y_tr.astype(np.int64, copy=False), y_te.astype(np.int64, copy=False)
    untrained = np.flatnonzero(np.bincount(y_tr, minlength=num_classes) == 0)
    if len(untrained):
        shown = ", ".join(str(c) for c in untrained[:5]) + (", ..." if len(untrained) > 5 else "")
        notes.append(f"{len(untrained)} class(es) without a training image ({shown})")
    dataset = Dataset(name, x_tr, y_tr, x_te, y_te, num_classes)
    summary = (f"{name}: {len(x_tr):,} train / {len(x_te):,} test images of "
               f"{'x'.join(map(str, dataset.input_shape))} (C x H x W), {num_classes} classes "
               "(max label + 1)")
    return dataset, "; ".join([summary, *notes])


def layout_of(images: np.ndarray, layout: str, where: str = "images") -> tuple[bool, str | None]:
    """(channels last?, a note for the summary or None) for images of 3 or 4 dims.

    (N, H, W) is one channel whatever `layout`.  For (N, A, B, D) and layout "auto": a
    channel axis is one of 1 or 3 entries; A alone -> NCHW, D alone -> NHWC, both -> NCHW
    (iasgd's own layout; said in the note), neither -> DataError asking for `layout`.
    """
    if images.ndim == 3:
        return False, "(N, H, W) images read as one channel"
    a, d = images.shape[1], images.shape[3]
    first, last = a in _CHANNEL_COUNTS, d in _CHANNEL_COUNTS
    if layout != "auto":
        _check_layout_given(images.shape, layout, first, last, where)
    if layout == "nchw":
        return False, None
    if layout == "nhwc":
        return True, "channels moved first (NHWC to NCHW)"
    if first and last:
        return False, (f"axes 1 and 3 ({a} and {d}) could both be channels: read as NCHW "
                       "(pass layout='nhwc' if the channels are last)")
    if first:
        return False, None
    if last:
        return True, "channels moved first (NHWC to NCHW)"
    raise DataError(f"{where}: cannot tell the channel axis of images of shape {images.shape} "
                    f"(neither axis 1 nor axis 3 has 1 or 3 entries): pass layout='nchw' or "
                    "'nhwc' (in a file: a 'layout' entry, see docs/data.md)")


def _check_layout_given(shape: tuple[int, ...], layout: str, first: bool, last: bool,
                        where: str) -> None:
    """DataError when the `layout` given puts the channels on the axis that does not
    look like one (not 1 or 3 entries) while the other axis does: the images would be
    read as, say, 32 channels of 3x32, and the model would be blamed for it."""
    wrong = (layout == "nhwc" and first and not last) or (layout == "nchw" and last and not first)
    if not wrong:
        return
    _, a, b, d = shape
    c, h, w = (d, a, b) if layout == "nhwc" else (a, b, d)
    other, axis = ("nchw", 1) if layout == "nhwc" else ("nhwc", 3)
    raise DataError(f"{where}: layout {layout} reads images of shape {shape} as {c} channels "
                    f"of {h}x{w}, but axis {axis} holds {shape[axis]} entries, as channels do: "
                    f"pass layout '{other}' or 'auto'")


def to_nchw_uint8(images: np.ndarray, channels_last: bool) -> np.ndarray:
    """Validated images (see `_images`) as uint8 (N, C, H, W), C-contiguous.

    Floats in [0, 1] become rint(x * 255); integers in [0, 255] are cast.  Converted in
    slices, so the only full-size temporary is the uint8 result.
    """
    if images.ndim == 3:
        view = images[:, None]
    elif channels_last:
        view = images.transpose(0, 3, 1, 2)
    else:
        view = images
    if view.dtype == np.uint8:
        return np.ascontiguousarray(view)
    out = np.empty(view.shape, dtype=np.uint8)
    per_image = max(1, int(np.prod(view.shape[1:])))
    step = max(1, _CHUNK_ELEMENTS // per_image)
    is_float = view.dtype.kind == "f"
    # float16 has too few mantissa bits to scale k/255 back to k exactly; float64 keeps its own.
    work = np.float64 if view.dtype == np.float64 else np.float32
    for start in range(0, len(view), step):
        part = view[start:start + step]
        if is_float:
            part = np.rint(part.astype(work) * work(255))
        out[start:start + step] = part  # values are in [0, 255]: the cast is exact
    return out


def read_file(path: Path, *, test_fraction: float = DEFAULT_TEST_FRACTION, seed: int = 0,
              layout: str = "auto") -> tuple[Dataset, str]:
    """Read a user's .npz or HDF5 file (see the module docstring) into a Dataset named after
    the file; also return the one-line summary.  An explicit `layout` overrides the file's
    own 'layout' entry.  Raises DataError (one line) for any problem."""
    path = check_path(path)
    check_options(str(path), test_fraction, seed, layout)
    if path.suffix.lower() == ".npz":
        arrays, keys, file_layout = _read_npz(path)
    else:
        arrays, keys, file_layout = _read_hdf5(path)
    if layout == "auto" and file_layout is not None:
        if file_layout not in LAYOUTS:
            raise DataError(f"{path}: its layout entry is {file_layout!r}, not one of "
                            f"{', '.join(LAYOUTS)}: fix or remove it")
        layout = file_layout
    return convert(arrays["x_train"], arrays["y_train"], arrays.get("x_test"),
                   arrays.get("y_test"), name=path.name, where=str(path),
                   test_fraction=test_fraction, seed=seed, layout=layout,
                   train_keys=(keys["x_train"], keys["y_train"]))


def pick_keys(present: list[str], path: str | Path) -> dict[str, str]:
    """Which of a file's arrays (`present`, their names) are x_train, y_train and, if the
    file has them, x_test and y_test: role -> the file's name.  The training images and
    labels are the one pair of _TRAIN_PAIRS the file holds whole; DataError (one line)
    when there is none (saying what the file holds) or when two pairs give the images, or
    the labels, two names."""
    have = set(present)
    pairs = [pair for pair in _TRAIN_PAIRS if pair[0] in have and pair[1] in have]
    for role, names in (("images", [p[0] for p in pairs]), ("labels", [p[1] for p in pairs])):
        names = list(dict.fromkeys(names))
        if len(names) > 1:
            raise DataError(f"{path} holds {role} under two names, {names[0]!r} and "
                            f"{names[1]!r}: keep one (or rename the other) so that it is clear "
                            f"which to train on")
    if not pairs:
        raise DataError(_no_pair(present, path))
    keys = {"x_train": pairs[0][0], "y_train": pairs[0][1]}
    keys.update({key: key for key in ("x_test", "y_test") if key in have})
    return keys


def _no_pair(present: list[str], path: str | Path) -> str:
    """The message for a file without a whole pair of training images and labels."""
    holds = ", ".join(present[:10]) + (", ..." if len(present) > 10 else "") or "nothing"
    images = [name for name in _IMAGE_NAMES if name in present]
    labels = [name for name in _LABEL_NAMES if name in present]
    if images and labels:
        return (f"{path} has images ({images[0]!r}) and labels ({labels[0]!r}) under names "
                f"iasgd does not pair (it holds: {holds}): name them x_train/y_train or "
                f"{_PAIRS_TEXT} (see docs/data.md)")
    if images:
        partner = next(b for a, b in _TRAIN_PAIRS if a == images[0])
        return (f"{path} has images ({images[0]!r}) but no labels (it holds: {holds}): store "
                f"their integer labels as {partner}")
    if labels:
        partner = next(a for a, b in _TRAIN_PAIRS if b == labels[0])
        return (f"{path} has labels ({labels[0]!r}) but no images (it holds: {holds}): store "
                f"the training images as {partner}")
    return (f"{path} has no images and labels under a name iasgd reads (it holds: {holds}): "
            f"store them as x_train and y_train (or {_PAIRS_TEXT}; see docs/data.md)")


def check_path(path: str | Path) -> Path:
    """path (user-expanded) if it is an existing file with a known suffix, else DataError."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"{path}: no such file: check the path (a dataset of your own is an "
                        f".npz, .h5 or .hdf5 file)")
    if not path.is_file():
        raise DataError(f"{path} is not a file: give an .npz, .h5 or .hdf5 file")
    if path.suffix.lower() not in OWN_FILE_SUFFIXES:
        raise DataError(f"{path}: unknown file type {path.suffix or '(no suffix)'!r}: store "
                        f"the data in an .npz (numpy) or .h5/.hdf5 (HDF5) file, e.g. with "
                        f"{_FORMAT_HINT}")
    return path


# --------------------------------------------------------------------------------------
# Reading the files: arrays by key, the keys present, and the optional layout entry
# --------------------------------------------------------------------------------------


def npz_problem(path: Path, kind: str = "arrays") -> str | None:
    """What keeps the file `path` from being an .npz (a zip) or an .npy, in words that
    follow its name ("is empty, not an .npz archive of arrays"); None if it starts like
    one. numpy takes anything else for a pickle and answers with its advice to load it
    unsafely, the opposite of what iasgd does with a file. OSError if unreadable."""
    with open(path, "rb") as f:
        head = f.read(len(_NPY_MAGIC))
    if head.startswith(_ZIP_MAGICS) or head.startswith(_NPY_MAGIC):
        return None
    if not head:
        return f"is empty, not an .npz archive of {kind}"
    if head[0] == _PICKLE_PROTO:
        return (f"is not an .npz archive of {kind}: it holds pickled Python objects, which "
                "iasgd never loads (a pickle can run code)")
    return (f"is not an .npz archive of {kind} (not a zip file: a text file, or another "
            "format renamed .npz?)")


def _check_npz_header(path: Path) -> None:
    """DataError unless the file starts like an .npz or an .npy (npz_problem)."""
    try:
        problem = npz_problem(path)
    except OSError as error:
        raise DataError(f"cannot read {path} ({one_line(error)}): check that it is a "
                        "readable file") from error
    if problem is not None:
        raise DataError(f"{path} {problem}: save plain numeric arrays with {_FORMAT_HINT}")


def _read_npz(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str], str | None]:
    """The arrays of an .npz by role (x_train, ...: `pick_keys`), the file's name of each
    role, and its 'layout' entry (or None)."""
    corrupt = (f"it is not an .npz archive or it is corrupt; write it with {_FORMAT_HINT}")
    _check_npz_header(path)
    try:
        # allow_pickle=False: a pickle can run code, and images and labels need none.
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        # numpy takes anything that is neither a zip nor an .npy for a pickle, and refuses it.
        raise DataError(f"cannot read {path} ({one_line(error)}): {corrupt}") from error
    if isinstance(loaded, np.ndarray):
        raise DataError(f"{path} holds a single .npy array, not an .npz archive of named "
                        f"arrays: write it with {_FORMAT_HINT}")
    with loaded as npz:
        present = list(npz.files)
        keys = pick_keys(present, path)
        arrays = {role: _npz_member(npz, key, path) for role, key in keys.items()}
        file_layout = None
        if "layout" in present:
            file_layout = _as_layout(_npz_member(npz, "layout", path), path)
    return arrays, keys, file_layout


def _npz_member(npz: Any, key: str, path: Path) -> np.ndarray:
    """npz[key], refusing object arrays (numpy would have to unpickle them)."""
    try:
        return npz[key]
    except ValueError as error:
        if "allow_pickle" in str(error):  # numpy: "Object arrays cannot be loaded when ..."
            raise DataError(f"{path}: {key} is an array of Python objects, which iasgd does "
                            "not unpickle (a pickle can run code): store plain numeric arrays "
                            "(uint8 or float images, integer labels)") from error
        raise DataError(f"cannot read {key} in {path} ({one_line(error)}): the file is "
                        f"corrupt; write it again with {_FORMAT_HINT}") from error
    except (OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as error:
        raise DataError(f"cannot read {key} in {path} ({one_line(error)}): the file is "
                        f"corrupt or truncated; write it again with {_FORMAT_HINT}") from error


def _read_hdf5(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str], str | None]:
    """The datasets at the root of an HDF5 file by role (x_train, ...: `pick_keys`), the
    file's name of each role, and the root's 'layout' attribute (or None)."""
    try:
        # No file locking, as for the caches: read-only, and locking fails on some NFS.
        with h5py.File(path, "r", locking=False) as f:
            keys = pick_keys(list(f.keys()), path)
            arrays = {}
            for role, key in keys.items():
                node = f[key]
                if not isinstance(node, h5py.Dataset):
                    raise DataError(f"{path}: {key} is an HDF5 group, not a dataset: store "
                                    "the array itself at the file's root")
                if node.dtype.kind not in "biuf":
                    raise DataError(f"{path}: {key} has HDF5 type {node.dtype}: store plain "
                                    "numeric arrays (uint8 or float images, integer labels)")
                arrays[role] = node[()]
            raw_layout = f.attrs.get("layout")
    except DataError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as error:
        # h5py reports a damaged or non-HDF5 file as OSError mostly, but not only.
        raise DataError(f"cannot read {path} as HDF5 ({one_line(error)}): it is corrupt or "
                        "not an HDF5 file; write x_train and y_train with h5py "
                        "(see docs/data.md)") from error
    file_layout = None if raw_layout is None else _as_layout(raw_layout, path)
    return arrays, keys, file_layout


def _as_layout(value: Any, path: Path) -> str:
    """A file's 'layout' entry (a str, bytes or a one-element string array) as str."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "SU" and value.size == 1:
        value = value.reshape(()).item()
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if not isinstance(value, str):
        raise DataError(f"{path}: its layout entry is {describe(value)}, not a string: store "
                        "'nchw' or 'nhwc' (or nothing)")
    return value.lower()


# --------------------------------------------------------------------------------------
# Validation: every check names the array, what is wrong and what to do
# --------------------------------------------------------------------------------------


def _as_array(value: Any, key: str, where: str) -> np.ndarray:
    """value as a numpy array of numbers (no copy of an array); DataError otherwise."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as error:  # ragged nested lists
        raise DataError(f"{where}: {key} is not an array ({one_line(error)}): give a numpy "
                        "array") from error
    if array.dtype.hasobject:
        raise DataError(f"{where}: {key} holds Python objects ({describe(array)}): give a "
                        "numeric array")
    return array


def _images(value: Any, key: str, where: str) -> np.ndarray:
    """Images checked (3 or 4 dims, not empty, uint8 / integers in [0, 255] / finite floats
    in [0, 1]) but not converted."""
    images = _as_array(value, key, where)
    if images.ndim not in (3, 4):
        raise DataError(f"{where}: {key} has shape {images.shape}; images must be "
                        "(N, C, H, W), (N, H, W, C) or (N, H, W): reshape them")
    if images.shape[0] == 0:
        raise DataError(f"{where}: {key} is empty (shape {images.shape}): store at least one "
                        "image")
    if 0 in images.shape:
        raise DataError(f"{where}: {key} has shape {images.shape}, with an empty image axis: "
                        "store images of at least 1x1 pixel")
    kind = images.dtype.kind
    if kind in "iu" and images.dtype != np.uint8:
        low, high = int(images.min()), int(images.max())
        if low < 0 or high > 255:
            raise DataError(f"{where}: {key} holds {images.dtype} values in [{low}, {high}]; "
                            "integer images must be in [0, 255]: rescale them, or store "
                            "floats in [0, 1]")
    elif kind == "f":
        # min and max are NaN or infinite exactly when some value is: no full-size mask.
        low, high = images.min(), images.max()
        if not (np.isfinite(low) and np.isfinite(high)):
            bad = int(np.count_nonzero(~np.isfinite(images)))
            raise DataError(f"{where}: {key} holds {bad:,} NaN or infinite value(s): fix or "
                            "drop those images")
        if low < 0 or high > 1:
            raise DataError(f"{where}: {key} holds floats in [{float(low):g}, {float(high):g}]; "
                            "float images must be in [0, 1]: divide by 255 (or by their "
                            "maximum), or store uint8")
    elif kind != "u":
        raise DataError(f"{where}: {key} has dtype {images.dtype}; images must be uint8 "
                        "(0..255) or float (0..1)")
    return images


def _labels(value: Any, key: str, where: str, n_images: int, images_key: str) -> np.ndarray:
    """Labels checked (integers >= 0, (N,) or (N, 1), one per image) as (N,), dtype kept."""
    labels = _as_array(value, key, where)
    if labels.ndim == 2 and labels.shape[1] == 1:  # e.g. Keras' CIFAR labels are (N, 1)
        labels = labels[:, 0]
    if labels.ndim != 1:
        raise DataError(f"{where}: {key} has shape {labels.shape}; labels must be (N,) or "
                        "(N, 1): one class index per image")
    if labels.dtype.kind not in "iu":
        raise DataError(f"{where}: {key} has dtype {labels.dtype}; labels must be integer "
                        "class indices 0, 1, ...: store y.astype(np.int64)")
    if len(labels) != n_images:
        raise DataError(f"{where}: {n_images:,} images in {images_key} but {len(labels):,} "
                        f"labels in {key}: store one label per image")
    low = int(labels.min())
    if low < 0:
        raise DataError(f"{where}: {key} holds the negative label {low}; labels must be class "
                        "indices 0, 1, ...: map them onto 0..K-1")
    return labels


def _num_classes(y_train: np.ndarray, y_test: np.ndarray, n_images: int, where: str) -> int:
    """max label (of both splits) + 1; DataError when that exceeds the number of images,
    which means the labels are not class indices (ids, or another encoding)."""
    high = max(int(y_train.max()), int(y_test.max()))
    if high + 1 > n_images:
        raise DataError(f"{where}: labels reach {high}, so classes = max label + 1 = "
                        f"{high + 1:,}, more than the {n_images:,} images: labels must be "
                        "class indices 0..K-1 (map them onto that range)")
    return high + 1


def _hold_out(images: np.ndarray, labels: np.ndarray, fraction: float, seed: int, where: str
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """Split uint8 images (N, C, H, W) and labels (N,) into train and test: round(fraction
    * N) test images (1..N-1) drawn by a permutation from `seed`, both in their original
    order.  Not stratified: a rare class may land in one split only."""
    n = len(images)
    if n < 2:
        raise DataError(f"{where}: {n} image cannot be split into train and test: store "
                        "x_test and y_test, or more images")
    n_test = min(max(1, round(fraction * n)), n - 1)
    order = np.random.default_rng(seed).permutation(n)
    test = np.sort(order[:n_test])
    train = np.sort(order[n_test:])
    note = (f"no x_test/y_test: held out {n_test:,} of {n:,} images (test_fraction "
            f"{fraction:g}, seed {seed}) as the test split")
    return images[train], labels[train], images[test], labels[test], note


def _conversion_notes(images: np.ndarray) -> list[str]:
    """What to_nchw_uint8 will do to the values, for the summary."""
    if images.dtype.kind == "f":
        return [f"{images.dtype} images in [0, 1] scaled to uint8 (rounded x * 255)"]
    if images.dtype != np.uint8:
        return [f"{images.dtype} images cast to uint8"]
    return []


def _chw(images: np.ndarray) -> tuple[int, ...]:
    """(C, H, W) of uint8 NCHW images, as plain ints."""
    return tuple(int(s) for s in images.shape[1:])
