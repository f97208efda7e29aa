"""What every dataset loader returns and raises: the Dataset container and DataError."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


class DataError(ValueError):
    """A dataset cannot be loaded; the message is one line: what is wrong, what to do."""


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
            problem = split_problem(x, y, image_shape, self.num_classes)
            if problem is not None:
                raise DataError(f"dataset {self.name!r}, {split} split: {problem}")
            image_shape = x.shape[1:]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        c, h, w = self.x_train.shape[1:]
        return (int(c), int(h), int(w))


def split_problem(x: Any, y: Any, image_shape: tuple[int, ...] | None,
                  num_classes: int) -> str | None:
    """Describe what is wrong with images x (N, C, H, W) and labels y (N,), or None if fine.

    image_shape: the (C, H, W) the images must have, or None for any.
    """
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 4:
        return f"images must be a uint8 array (N, C, H, W), got {describe(x)}"
    if not x.flags.c_contiguous:
        return "images must be C-contiguous"
    if image_shape is not None and x.shape[1:] != tuple(image_shape):
        return f"images have shape {x.shape[1:]} per item, expected {tuple(image_shape)}"
    if not isinstance(y, np.ndarray) or y.dtype != np.int64 or y.ndim != 1:
        return f"labels must be an int64 array (N,), got {describe(y)}"
    if len(x) != len(y):
        return f"{len(x)} images but {len(y)} labels"
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        return f"labels span [{y.min()}, {y.max()}], outside [0, {num_classes})"
    return None


def describe(value: Any) -> str:
    """Short type/dtype/shape description of value for error messages."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__


def one_line(error: BaseException) -> str:
    """str(error) on one line (some library messages span several)."""
    return " ".join(str(error).split()) or type(error).__name__
