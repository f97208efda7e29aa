"""The data: `load(name)` gives a Dataset (uint8 NCHW images, int64 labels).

`name` is a registry dataset (cifar10, cifar100, fashion-mnist, synthetic) or the path of
a user's own .npz / .h5 / .hdf5 file; `from_arrays` makes a Dataset of a user's arrays
(the format and its rules: docs/data.md).

- `registry`: what each dataset is (shape, classes, files, checksums, parser);
- `loader`: finds or downloads the files and goes through the cache;
- `formats`: the parsers of the official file layouts;
- `own`: a user's own arrays and files: their validation and conversion;
- `cache`: the HDF5 cache that later loads read in a fraction of a second;
- `synthetic`: a small generated problem that needs no files;
- `types`: Dataset and DataError.
"""

from iasgd.data.loader import (
    CACHE_FORMAT_VERSION,
    DATA_DIR_ENV,
    DATASETS,
    DatasetSpec,
    load,
    resolve_data_dir,
    synthetic,
)
from iasgd.data.own import (
    DEFAULT_TEST_FRACTION,
    LAYOUTS,
    OWN_FILE_SUFFIXES,
    from_arrays,
    is_own_file,
)
from iasgd.data.types import DataError, Dataset

__all__ = ["CACHE_FORMAT_VERSION", "DATASETS", "DATA_DIR_ENV", "DEFAULT_TEST_FRACTION",
           "LAYOUTS", "OWN_FILE_SUFFIXES", "DataError", "Dataset", "DatasetSpec", "from_arrays",
           "is_own_file", "load", "resolve_data_dir", "synthetic"]
