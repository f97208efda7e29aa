"""A learnable synthetic image dataset, generated in memory (no files)."""

from __future__ import annotations

import numpy as np

from iasgd.data.types import DataError, Dataset

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
