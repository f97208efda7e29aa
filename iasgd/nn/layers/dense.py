"""Dense (fully connected) layers: out = a @ w.T + b, weights (out, in) as
PyTorch's Linear. A dense layer on a map flattens it first (C order); the
last layer of every model is a dense output layer (its width: the class
count). A ReLU right after it is fused into its row (P_RELU).

The forward and the weight gradient take eight rows of inputs and two
output rows at a time: sixteen sums or FMAs per eight vector loads, and
inputs in blocks of DENSE_BLOCK columns (8 rows: 16 KB) that stay in L1
while every output row's block passes by. The input gradient keeps simpler
loops (four weight rows a pass): the same scheme ran it faster alone, but
its op compiled in over twice the time, and it is a small part of every
preset's step (mlp's first layer has none).

BLAS (np.dot) only for the gradients from BLAS_MIN_ROWS rows, where it
overtakes the loops; the forward's loops beat it at every size tried
(the measurements: bench/results/dense-paths.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from iasgd.compiled import jit_inline
from iasgd.nn.kinds import Kind, LayerShape, Lowering, Params, RowOp, Shape, Sizing
from iasgd.nn.layers.flatten import to_vector
from iasgd.nn.layers.relu import relu_backward_inplace, relu_inplace
from iasgd.nn.plan import (
    P_C,
    P_CO,
    P_GRAD,
    P_RELU,
    P_WOFF,
    bias,
    input2,
    nothing,
    output2,
    view2,
)

BLAS_MIN_ROWS = 32
DENSE_BLOCK = 512  # input columns per block of the dense loops


@dataclass(frozen=True)
class Dense:
    """Fully connected; out=None only for the output layer (the class count)."""

    out: int | None = None

    def spec(self) -> str:
        return "dense" if self.out is None else f"dense{self.out}"


@jit_inline
def dense_forward(a, w, b, out):
    """out = a @ w.T + b.  a: (N, I); w: (O, I); b: (O,); out: (N, O).

    Each pass takes eight samples and two weight rows: sixteen sums in
    registers, each weight load shared by eight samples and each input load
    by two outputs. Where a group has fewer than eight samples it repeats its
    last (computed, not stored), and an odd last output is paired with itself
    (its sums stored once): one loop body for every shape (faster than one
    weight row a pass: bench/results/dense-paths.md).
    """
    N, I = a.shape
    O = w.shape[0]
    zero = w.dtype.type(0)
    for i0 in range(0, I, DENSE_BLOCK):
        i1 = min(i0 + DENSE_BLOCK, I)
        for n in range(0, N, 8):
            a0, a1, a2, a3, a4, a5, a6, a7 = _eight_rows(a, n, i0, i1)
            for o in range(0, O, 2):
                p = min(o + 1, O - 1)
                wo, wp = w[o][i0:i1], w[p][i0:i1]
                s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
                t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = zero
                for i in range(i1 - i0):
                    x, y = wo[i], wp[i]
                    c0, c1, c2, c3 = a0[i], a1[i], a2[i], a3[i]
                    c4, c5, c6, c7 = a4[i], a5[i], a6[i], a7[i]
                    s0 += x * c0
                    s1 += x * c1
                    s2 += x * c2
                    s3 += x * c3
                    s4 += x * c4
                    s5 += x * c5
                    s6 += x * c6
                    s7 += x * c7
                    t0 += y * c0
                    t1 += y * c1
                    t2 += y * c2
                    t3 += y * c3
                    t4 += y * c4
                    t5 += y * c5
                    t6 += y * c6
                    t7 += y * c7
                _store_sums(out, n, o, b[o], i0 == 0, (s0, s1, s2, s3, s4, s5, s6, s7))
                if p != o:  # an odd last output's partner is itself: its sums once
                    _store_sums(out, n, p, b[p], i0 == 0, (t0, t1, t2, t3, t4, t5, t6, t7))


@jit_inline
def _store_sums(out, n, o, bias, first, sums):
    """out[n + k, o] = bias + sums[k] (first block) or += sums[k] (later
    blocks), for the k with n + k < N."""
    for k, s in enumerate(sums):
        if n + k < out.shape[0]:
            out[n + k, o] = (s + bias) if first else out[n + k, o] + s


@jit_inline
def _eight_rows(a, n, i0, i1):
    """Columns i0:i1 of rows n .. n+7 of the (N, I) array a, 1-d and
    contiguous; the last row N-1 stands in for those past it."""
    last = a.shape[0] - 1
    return (a[n][i0:i1], a[min(n + 1, last)][i0:i1], a[min(n + 2, last)][i0:i1],
            a[min(n + 3, last)][i0:i1], a[min(n + 4, last)][i0:i1],
            a[min(n + 5, last)][i0:i1], a[min(n + 6, last)][i0:i1],
            a[min(n + 7, last)][i0:i1])


@jit_inline
def dense_backward_weights(a, dout, dw, db):
    """dw = dout.T @ a, db = sum over rows of dout (both overwritten).

    a: (N, I); dout: (N, O); dw: (O, I); db: (O,).
    """
    N = a.shape[0]
    if N >= BLAS_MIN_ROWS:
        np.dot(dout.T, a, dw)
    else:
        _weight_gradient(a, dout, dw)
    for o in range(db.size):
        s = db.dtype.type(0)
        for n in range(N):
            s += dout[n, o]
        db[o] = s


@jit_inline
def _weight_gradient(a, dout, dw):
    """dw[o] = sum over n of dout[n, o] * a[n] (overwritten), in passes of
    eight samples and two rows of dw.

    The first pass stores its sums (no zeroing, no load of dw), later passes
    add theirs. A short last group reads row N-1 in place of the rows past
    it and weighs them 0; an odd last row of dw is paired with itself, its
    partner's coefficients 0, and the partner is stored first so the real
    sums land last. The weights are factors, not branches, and the rows are
    written out rather than taken from the forward's _eight_rows (whose
    indices the coefficients need too): both compile faster
    (bench/results/dense-paths.md).
    """
    N, I = a.shape
    O = dw.shape[0]
    last = N - 1
    for n in range(0, N, 8):
        first = n == 0
        n1, n2, n3, n4 = min(n + 1, last), min(n + 2, last), min(n + 3, last), min(n + 4, last)
        n5, n6, n7 = min(n + 5, last), min(n + 6, last), min(n + 7, last)
        f1, f2, f3, f4 = (dw.dtype.type(n + 1 <= last), dw.dtype.type(n + 2 <= last),
                          dw.dtype.type(n + 3 <= last), dw.dtype.type(n + 4 <= last))
        f5, f6, f7 = (dw.dtype.type(n + 5 <= last), dw.dtype.type(n + 6 <= last),
                      dw.dtype.type(n + 7 <= last))
        for i0 in range(0, I, DENSE_BLOCK):
            i1 = min(i0 + DENSE_BLOCK, I)
            a0, a1, a2, a3 = a[n][i0:i1], a[n1][i0:i1], a[n2][i0:i1], a[n3][i0:i1]
            a4, a5, a6, a7 = a[n4][i0:i1], a[n5][i0:i1], a[n6][i0:i1], a[n7][i0:i1]
            for o in range(0, O, 2):
                p = min(o + 1, O - 1)
                g0, g1, g2, g3 = (dout[n, o], dout[n1, o] * f1, dout[n2, o] * f2,
                                  dout[n3, o] * f3)
                g4, g5, g6, g7 = (dout[n4, o] * f4, dout[n5, o] * f5, dout[n6, o] * f6,
                                  dout[n7, o] * f7)
                fp = dw.dtype.type(p != o)  # an odd last row, paired with itself
                h0, h1, h2, h3 = (dout[n, p] * fp, dout[n1, p] * f1 * fp, dout[n2, p] * f2 * fp,
                                  dout[n3, p] * f3 * fp)
                h4, h5, h6, h7 = (dout[n4, p] * f4 * fp, dout[n5, p] * f5 * fp,
                                  dout[n6, p] * f6 * fp, dout[n7, p] * f7 * fp)
                do, dp = dw[o][i0:i1], dw[p][i0:i1]
                for i in range(i1 - i0):
                    x0, x1, x2, x3 = a0[i], a1[i], a2[i], a3[i]
                    x4, x5, x6, x7 = a4[i], a5[i], a6[i], a7[i]
                    u = (g0 * x0 + g1 * x1 + g2 * x2 + g3 * x3
                         + g4 * x4 + g5 * x5 + g6 * x6 + g7 * x7)
                    v = (h0 * x0 + h1 * x1 + h2 * x2 + h3 * x3
                         + h4 * x4 + h5 * x5 + h6 * x6 + h7 * x7)
                    if first:
                        dp[i] = v
                        do[i] = u
                    else:
                        dp[i] += v
                        do[i] += u


@jit_inline
def dense_backward_input(w, dout, da):
    """da = dout @ w (overwritten).  w: (O, I); dout: (N, O); da: (N, I).

    Four weight rows per pass over a row of da, with the rows outermost:
    the weights stream through the cache once per batch, not once per sample.
    """
    N, O = dout.shape
    I = w.shape[1]
    if N >= BLAS_MIN_ROWS:
        np.dot(dout, w, da)
        return
    da[:] = 0
    o = 0
    while o + 4 <= O:
        w0, w1, w2, w3 = w[o], w[o + 1], w[o + 2], w[o + 3]
        for n in range(N):
            row = da[n]
            g0, g1, g2, g3 = dout[n, o], dout[n, o + 1], dout[n, o + 2], dout[n, o + 3]
            for i in range(I):
                row[i] += g0 * w0[i] + g1 * w1[i] + g2 * w2[i] + g3 * w3[i]
        o += 4
    while o < O:
        wo = w[o]
        for n in range(N):
            row = da[n]
            g = dout[n, o]
            for i in range(I):
                row[i] += g * wo[i]
        o += 1



# ------------------------------------------------------------------ its row


def dense_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    z = output2(acts, row, n)
    dense_forward(input2(acts, row, n), _weights(params, row), bias(params, row), z)
    if row[P_RELU]:
        relu_inplace(z)


def dense_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    """Also takes the fused ReLU out of the output gradient, in place, so
    dense_input_op (which runs after it) sees the pre-activation's."""
    row = plan[i]
    dz = output2(dacts, row, n)
    if row[P_RELU]:
        relu_backward_inplace(dz, output2(acts, row, n))
    dense_backward_weights(input2(acts, row, n), dz, _weights(grad, row), bias(grad, row))


def dense_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    dense_backward_input(_weights(params, row), output2(dacts, row, n), input2(dacts, row, n))


@jit_inline
def _weights(flat, row):
    return view2(flat, row[P_WOFF], row[P_CO], row[P_C])


def _passes(row: Any) -> tuple:
    return dense_forward_op, dense_weights_op, dense_input_op if row[P_GRAD] else nothing


def _flops(row: Any, n: int) -> tuple[float, float]:
    one = 2.0 * n * row[P_CO] * row[P_C]
    return one, one * (2 if row[P_GRAD] else 1)  # weights (+ input) gradient


def _label(row: Any) -> str:
    return f"dense {row[P_C]}->{row[P_CO]}" + (" +relu" if row[P_RELU] else "")


ROW = RowOp("dense", _passes, {dense_forward_op: 1.3, dense_weights_op: 1.3, dense_input_op: 1.3},
            _flops, _label, relu_after=True)


def _shape(layer: Dense, shape: Shape, sizing: Sizing) -> tuple[Shape, Params]:
    width = layer.out if layer.out is not None else sizing.num_classes
    if sizing.last and width != sizing.num_classes:
        raise ValueError(f"the output layer {layer.spec()} must have {sizing.num_classes} "
                         f"outputs, the class count (write 'dense' to take it)")
    if layer.out is None and not sizing.last:
        raise ValueError(f"{sizing.where}: only the output layer may omit its width")
    if width < 1:
        raise ValueError(f"{sizing.where}: zero outputs")
    return (width,), (("weight", (width, math.prod(shape))), ("bias", (width,)))


def _lower(lo: Lowering, ls: LayerShape, nxt: LayerShape | None) -> None:
    to_vector(lo)
    out = ls.shape[0]
    z = lo.alloc(out)
    lo.emit(ROW, out, 1, 1, 1, z, woff=lo.offset(f"{ls.name}.weight"),
            boff=lo.offset(f"{ls.name}.bias"))
    lo.has_params = True
    lo.move(z, out, 1, 1, 1)


def _torch(ls: LayerShape, shape: Shape) -> list[tuple[str, Any]]:
    from torch import nn

    flat = [("flatten", nn.Flatten())] if len(shape) == 3 else []  # a map: flattened first
    return [*flat, ("fc", nn.Linear(math.prod(shape), ls.shape[0]))]


KIND = Kind("dense", Dense, r"dense(?P<out>\d*)", "dense<N>",
            lambda m: Dense(int(m["out"]) if m["out"] else None), _shape, _lower, _torch,
            (ROW,), order=50, prefix="fc", output=True)
