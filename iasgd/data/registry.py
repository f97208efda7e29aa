"""The datasets iasgd knows: one declaration each, read by the loader, the cache,
the downloader, the CLI's --dataset choices and the models' input sizes.

Adding a dataset is one `DatasetSpec` in `DATASETS` plus, for a new file format,
its parser in iasgd.data.formats (signature ``parse(spec, sources) -> Dataset``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from iasgd.data import formats
from iasgd.data.synthetic import synthetic
from iasgd.data.types import Dataset

# Where the Debian package dataset-fashion-mnist installs the four idx files.
SYSTEM_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


@dataclass(frozen=True)
class RemoteFile:
    """One official file: its name, where to download it and its md5."""

    name: str
    url: str
    md5: str


@dataclass(frozen=True)
class DatasetSpec:
    """Declaration of one dataset.

    name: the --dataset choice; the cache is <data_dir>/<name>.h5.
    input_shape: (C, H, W) of one image; num_classes: labels are in [0, num_classes).
    source: where its data comes from --
      "archive": one file, files[0], looked up as <data_dir>/<files[0].name> or given
                 as --archive FILE (any name, any checksum);
      "directory": several files, looked up in <data_dir>/<name>/, then in system_dirs,
                 or given as --archive DIR; each may be there gzipped or not (name
                 without .gz);
      "generated": no files, made in memory by `generate` (not cached).
    files: the official files in the order `parse` reads them, downloaded from their URLs
        and checked against their md5 when absent locally.
    parse: the parser of those files (iasgd.data.formats); layout: what it needs to know about
        their layout (e.g. a formats.CifarLayout).
    files_label: how one-line errors name the files ("pass the ...", "put the ... in").
    system_dirs, system_hint: where a system package installs the files, and how to get it.
    """

    name: str
    input_shape: tuple[int, int, int]
    num_classes: int
    source: Literal["archive", "directory", "generated"]
    files: tuple[RemoteFile, ...] = ()
    parse: Callable[[DatasetSpec, Sequence[Path]], Dataset] | None = None
    layout: Any = None
    files_label: str = ""
    system_dirs: tuple[Path, ...] = ()
    system_hint: str = ""
    generate: Callable[[], Dataset] | None = None

    @property
    def cache_name(self) -> str:
        """File name of its HDF5 cache in the data directory."""
        return f"{self.name}.h5"


_FASHION_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"

DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in (
    DatasetSpec(
        name="cifar10", input_shape=(3, 32, 32), num_classes=10, source="archive",
        files=(RemoteFile("cifar-10-python.tar.gz",
                          "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                          "c58f30108f718f92721af3b95e74349a"),),
        parse=formats.read_cifar_archive,
        layout=formats.CifarLayout(
            train_members=tuple(f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)),
            test_member="cifar-10-batches-py/test_batch", label_key=b"labels"),
        files_label="cifar-10-python.tar.gz tarball (official layout)",
    ),
    DatasetSpec(
        name="cifar100", input_shape=(3, 32, 32), num_classes=100, source="archive",
        files=(RemoteFile("cifar-100-python.tar.gz",
                          "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                          "eb9058c3a382ffc7106e4002c42a8d85"),),
        parse=formats.read_cifar_archive,
        layout=formats.CifarLayout(train_members=("cifar-100-python/train",),
                                   test_member="cifar-100-python/test",
                                   label_key=b"fine_labels"),
        files_label="cifar-100-python.tar.gz tarball (official layout)",
    ),
    DatasetSpec(
        name="fashion-mnist", input_shape=(1, 28, 28), num_classes=10, source="directory",
        # Order matters: train images, train labels, test images, test labels.
        files=tuple(RemoteFile(name, _FASHION_URL + name, md5) for name, md5 in (
            ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
            ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
            ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
            ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
        )),
        parse=formats.read_idx_dataset,
        files_label="four Fashion-MNIST idx files",
        system_dirs=(SYSTEM_FASHION_MNIST_DIR,),
        system_hint="install the Debian package dataset-fashion-mnist",
    ),
    DatasetSpec(
        name="synthetic", input_shape=(3, 32, 32), num_classes=10, source="generated",
        generate=synthetic,
    ),
)}
