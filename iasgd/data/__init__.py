"""The data: `load(name)` gives a Dataset (uint8 NCHW images, int64 labels).

- `registry`: what each dataset is (shape, classes, files, checksums, parser);
- `loader`: finds or downloads the files and goes through the cache;
- `formats`: the parsers of the official file layouts;
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
from iasgd.data.types import DataError, Dataset

__all__ = ["CACHE_FORMAT_VERSION", "DATASETS", "DATA_DIR_ENV", "DataError", "Dataset",
           "DatasetSpec", "load", "resolve_data_dir", "synthetic"]
