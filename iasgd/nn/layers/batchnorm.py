"""Batch normalisation (PyTorch's BatchNorm2d on a map, BatchNorm1d on a
vector): each channel is normalised by its mean and variance, then scaled
and shifted by its trained `weight` and `bias`.

Training normalises by the batch's statistics (over the samples and, on a
map, its pixels; the biased variance) and keeps them in the gradient's
entries of the running statistics, the unbiased variance as PyTorch keeps
it; the update then moves `running_mean` and `running_var` a tenth of the
way to them (iasgd.nn.network.sgd_momentum_update). Prediction normalises by
the running statistics. The running statistics live in the flat parameter
array after every trained tensor, so the workers share them, checkpoints
and exports hold them, and the gate covers their writes like any update's
(docs/algorithms.md, "Batch normalisation").

Its row writes a map of its own (the input stays for the backward), wide
rows like its input; a ReLU right after it is fused into it. Right before a
max-pool it is no row of its own: the pool's row does its work
(iasgd.nn.layers.pool, BN_ROW, with the statistics and passes here). The weight
gradient pass also applies that ReLU's backward, and the input gradient
pass reads the weight gradient it just wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import types
from numba.extending import overload

from iasgd.compiled import jit_inline
from iasgd.nn import simd
from iasgd.nn.kinds import Kind, LayerShape, Lowering, Params, RowOp, Shape, Sizing
from iasgd.nn.layers.relu import relu_backward_inplace
from iasgd.nn.plan import (
    P_BOFF,
    P_C,
    P_GRAD,
    P_H,
    P_RELU,
    P_SOFF,
    P_W,
    P_WOFF,
    input4,
    nothing,
    output4,
)

EPS = 1e-5  # added to the variance, as PyTorch's default


@dataclass(frozen=True)
class BatchNorm:
    """Batch normalisation of each channel (of a map) or feature (of a vector)."""

    def spec(self) -> str:
        return "bn"


@jit_inline
def batch_statistics(x, width, mean, var):
    """mean[c] and the unbiased variance var[c] of channel c of x (N, C, H, S)
    over N, H and the first `width` columns (the rest is junk). Two passes,
    each row's sum in x's dtype and the channel's in float64."""
    N, C, H, _ = x.shape
    m = N * H * width
    for c in range(C):
        s = 0.0
        for n in range(N):
            for i in range(H):
                r = x[n, c, i]
                t = x.dtype.type(0)
                for j in range(width):
                    t += r[j]
                s += t
        mu = s / m
        mu_x = x.dtype.type(mu)
        q = 0.0
        for n in range(N):
            for i in range(H):
                r = x[n, c, i]
                t = x.dtype.type(0)
                for j in range(width):
                    d = r[j] - mu_x
                    t += d * d
                q += t
        mean[c] = mu
        var[c] = q / max(m - 1, 1)


def statistics(x, width, mean, var):
    """batch_statistics of float32 maps by statistics_lanes; batch_statistics
    itself on other dtypes (the tests' float64)."""


@overload(statistics, jit_options={"fastmath": True})
def _statistics(x, width, mean, var):
    if x.dtype != types.float32 or not simd.available():
        return lambda x, width, mean, var: batch_statistics(x, width, mean, var)
    return lambda x, width, mean, var: statistics_lanes(x, width, mean, var)


@jit_inline
def statistics_lanes(x, width, mean, var):
    """batch_statistics of float32 maps in one pass, by vectors of 16 lanes:
    the sums of d = x - K and of d * d, K the channel's first value (so that
    the variance, (sum d^2 - (sum d)^2 / m) / (m - 1), does not lose the
    digits a large mean would cancel); a row's lanes past `width` are not
    read (masked loads), a plane's sums are added up in float64."""
    N, C, H, S = x.shape
    L = simd.LANES
    m = N * H * width
    xf = x.reshape((N, C * H * S))
    for c in range(C):
        shift = x[0, c, 0, 0]
        k = simd.splat(shift)
        s = 0.0
        q = 0.0
        for n in range(N):
            xs = xf[n]
            ds = dq = simd.splat(np.float32(0))
            for i in range(H):
                r = (c * H + i) * S
                for j in range(0, width, L):
                    d = simd.sub(simd.load_first(xs, r + j, width - j, shift), k)
                    ds = simd.add(ds, d)
                    dq = simd.fma(d, d, dq)
            s += simd.total(ds)
            q += simd.total(dq)
        mean[c] = shift + s / m
        var[c] = max(q - s * s / m, 0.0) / max(m - 1, 1)


@jit_inline
def inverse_std(var_c, m, training):
    """1 / sqrt(variance + EPS) of a channel whose stored variance is var_c:
    unbiased over m values when training (normalisation uses the biased
    one), the running variance otherwise."""
    v = var_c * (m - 1) / m if training else var_c
    return 1.0 / np.sqrt(v + EPS)


@jit_inline
def normalise(x, width, gamma, beta, mean, var, training, relu, y):
    """y = (x - mean) / sqrt(var + EPS) * gamma + beta per channel on the
    first `width` columns of x, y (N, C, H, S) (then ReLU if `relu`)."""
    N, C, H, _ = x.shape
    m = N * H * width
    for c in range(C):
        a = gamma[c] * inverse_std(var[c], m, training)
        b = x.dtype.type(beta[c] - mean[c] * a)
        a = x.dtype.type(a)
        for n in range(N):
            for i in range(H):
                r = x[n, c, i]
                o = y[n, c, i]
                for j in range(width):
                    o[j] = r[j] * a + b
                if relu:
                    for j in range(width):
                        if o[j] < 0:
                            o[j] = 0


@jit_inline
def batchnorm_weight_grad(x, dy, width, mean, var, dgamma, dbeta):
    """dgamma[c] = sum(dy * xhat), dbeta[c] = sum(dy) over channel c's valid
    entries, xhat = (x - mean) / sqrt(biased var + EPS) by the batch's statistics."""
    N, C, H, _ = x.shape
    m = N * H * width
    for c in range(C):
        mu = x.dtype.type(mean[c])
        g = 0.0
        d = 0.0
        for n in range(N):
            for i in range(H):
                r = x[n, c, i]
                e = dy[n, c, i]
                tg = x.dtype.type(0)
                td = x.dtype.type(0)
                for j in range(width):
                    tg += e[j] * (r[j] - mu)
                    td += e[j]
                g += tg
                d += td
        dgamma[c] = g * inverse_std(var[c], m, True)
        dbeta[c] = d


@jit_inline
def batchnorm_input_grad(x, dy, width, gamma, mean, var, dgamma, dbeta, dx):
    """dx = gamma / (m sigma) (m dy - dbeta - xhat dgamma) per channel of m
    valid entries (train mode: the batch's statistics), 0 on junk columns."""
    N, C, H, S = x.shape
    m = N * H * width
    for c in range(C):
        inv = inverse_std(var[c], m, True)
        k = x.dtype.type(gamma[c] * inv)
        mu = x.dtype.type(mean[c])
        sg = x.dtype.type(dgamma[c] / m)
        db = x.dtype.type(dbeta[c] / m)
        inv_x = x.dtype.type(inv)
        for n in range(N):
            for i in range(H):
                r = x[n, c, i]
                e = dy[n, c, i]
                o = dx[n, c, i]
                for j in range(width):
                    o[j] = k * (e[j] - db - (r[j] - mu) * inv_x * sg)
                for j in range(width, S):
                    o[j] = 0


# ------------------------------------------------------------------ its row


@jit_inline
def channels(flat, row, off):
    """A row's per-channel tensor at `off` inside the parameters or the gradient."""
    return flat[off:off + row[P_C]]


def batchnorm_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    x, y, C, gamma = input4(acts, row, n), output4(acts, row, n), row[P_C], row[P_WOFF]
    beta, mean, var = row[P_BOFF], row[P_SOFF], row[P_SOFF] + row[P_C]
    if grad.size == params.size:  # training: the batch's statistics, kept for the update
        statistics(x, row[P_W], grad[mean:mean + C], grad[var:var + C])
        normalise(x, row[P_W], params[gamma:gamma + C], params[beta:beta + C],
                  grad[mean:mean + C], grad[var:var + C], True, row[P_RELU] != 0, y)
    else:  # prediction: the running statistics
        normalise(x, row[P_W], params[gamma:gamma + C], params[beta:beta + C],
                  params[mean:mean + C], params[var:var + C], False, row[P_RELU] != 0, y)


def batchnorm_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    dy, C = output4(dacts, row, n), row[P_C]
    if row[P_RELU]:
        relu_backward_inplace(dy, output4(acts, row, n))
    batchnorm_weight_grad(input4(acts, row, n), dy, row[P_W],
                          channels(grad, row, row[P_SOFF]),
                          channels(grad, row, row[P_SOFF] + C),
                          channels(grad, row, row[P_WOFF]), channels(grad, row, row[P_BOFF]))


def batchnorm_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    C = row[P_C]
    batchnorm_input_grad(input4(acts, row, n), output4(dacts, row, n), row[P_W],
                         channels(params, row, row[P_WOFF]),
                         channels(grad, row, row[P_SOFF]),
                         channels(grad, row, row[P_SOFF] + C),
                         channels(grad, row, row[P_WOFF]), channels(grad, row, row[P_BOFF]),
                         input4(dacts, row, n))


def _passes(row: np.ndarray) -> tuple[Any, Any, Any]:
    return (batchnorm_forward_op, batchnorm_weights_op,
            batchnorm_input_op if row[P_GRAD] else nothing)


def _flops(row: np.ndarray, n: int) -> tuple[float, float]:
    """About 5 FLOPs an entry forward (statistics, normalisation), 8 backward."""
    size = n * row[P_C] * row[P_H] * row[P_W]
    return 5.0 * size, 8.0 * size


def _label(row: np.ndarray) -> str:
    return (f"bn {row[P_C]}x{row[P_H]}x{row[P_W]}" + (" +relu" if row[P_RELU] else ""))


ROW = RowOp("bn", _passes, {batchnorm_forward_op: 1.0, batchnorm_weights_op: 1.0,
                            batchnorm_input_op: 1.0}, _flops, _label, relu_after=True)


# ------------------------------------------------------------------ the kind


def _shape(layer: BatchNorm, shape: Shape, sizing: Sizing) -> tuple[Shape, Params]:
    c = shape[0]
    return shape, (("weight", (c,)), ("bias", (c,)), ("running_mean", (c,)),
                   ("running_var", (c,)))


def _lower(lo: Lowering, ls: LayerShape, nxt: LayerShape | None) -> None:
    c, h, w, s = lo.c, lo.h, lo.w, lo.s
    z = lo.alloc(c * h * s)  # wide rows: the input's stride
    lo.emit(ROW, c, h, w, s, z, woff=lo.offset(f"{ls.name}.weight"),
            boff=lo.offset(f"{ls.name}.bias"), soff=lo.offset(f"{ls.name}.running_mean"))
    lo.has_params = True
    lo.move(z, c, h, w, s)


def _torch(ls: LayerShape, shape: Shape) -> list[tuple[str, Any]]:
    from torch import nn

    return [("bn", nn.BatchNorm2d(shape[0]) if len(shape) == 3 else nn.BatchNorm1d(shape[0]))]


KIND = Kind("batchnorm", BatchNorm, r"bn", "bn", lambda m: BatchNorm(), _shape, _lower, _torch,
            (ROW,), order=15, prefix="bn", statistics=("running_mean", "running_var"),
            initial={"weight": 1.0, "bias": 0.0, "running_mean": 0.0, "running_var": 1.0},
            whole_batch=True, torch_only={"num_batches_tracked": 0})  # momentum fixed: unused
