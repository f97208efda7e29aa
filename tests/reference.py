"""Slow, obviously-correct numpy/scipy references the compiled kernels are
checked against, and a central finite-difference helper."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.signal import correlate
from scipy.special import logsumexp


def conv2d_valid(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, C, H, W) x (O, C, k, k) -> (N, O, H-k+1, W-k+1), float64, via scipy."""
    N, C, H, W = x.shape
    O, _, k, _ = w.shape
    out = np.zeros((N, O, H - k + 1, W - k + 1))
    for n in range(N):
        for o in range(O):
            for c in range(C):
                out[n, o] += correlate(x[n, c].astype(np.float64), w[o, c].astype(np.float64),
                                       mode="valid")
            out[n, o] += b[o]
    return out


def relu_maxpool2(z: np.ndarray) -> np.ndarray:
    """ReLU then 2x2 max-pool (floor) of (N, C, H, W)."""
    N, C, H, W = z.shape
    z = z[:, :, : H // 2 * 2, : W // 2 * 2]
    pooled = z.reshape(N, C, H // 2, 2, W // 2, 2).max(axis=(3, 5))
    return np.maximum(pooled, 0)


def softmax_xent(logits: np.ndarray, labels: np.ndarray) -> float:
    """Batch-mean cross-entropy of softmax(logits)."""
    logits = logits.astype(np.float64)
    return float(np.mean(logsumexp(logits, axis=1) - logits[np.arange(len(labels)), labels]))


def network_logits(model, params: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Forward pass of a models.Model written with numpy/scipy, by tensor name,
    in PyTorch's conventions (flatten in C order of (C, H, W)); x in [0, 1]."""
    t = {name: params[off:off + int(np.prod(shape))].reshape(shape).astype(np.float64)
         for name, shape, off in model.layout}
    from iasgd.models import INPUT_MEAN, INPUT_STD

    a = (x.reshape(x.shape[0], *model.input_shape).astype(np.float64) - INPUT_MEAN) / INPUT_STD
    for i in range(1, len(model.arch.conv_channels) + 1):
        a = relu_maxpool2(conv2d_valid(a, t[f"conv{i}.weight"], t[f"conv{i}.bias"]))
    a = a.reshape(a.shape[0], -1)
    layers = len(model.arch.hidden) + 1
    for i in range(1, layers + 1):
        a = a @ t[f"fc{i}.weight"].T + t[f"fc{i}.bias"]
        if i < layers:
            a = np.maximum(a, 0)
    return a


def central_difference(f: Callable[[np.ndarray], float], x: np.ndarray, index: int,
                       eps: float = 1e-6) -> float:
    """d f / d x.flat[index] by central differences (x is float64, restored)."""
    flat = x.reshape(-1)
    keep = flat[index]
    flat[index] = keep + eps
    up = f(x)
    flat[index] = keep - eps
    down = f(x)
    flat[index] = keep
    return (up - down) / (2 * eps)
