"""2x2 max-pool, stride 2, floor for odd sizes (PyTorch's max_pool2d(x, 2)).

It reads a wide map (a conv's output, row stride S) and writes a compact
one. A ReLU right before it is fused into it (max and ReLU commute), and
when the next layer wants a zero border around its input (a "same" conv)
the pool writes inside that border, so the conv needs no pad row. Each
window's maximum is remembered (argmax, the first on ties) for the
backward pass.

A batch norm right before it (a ReLU between or not) is fused into it too,
as one row: each window's four inputs are normalised as the pool reads
them. As two rows the batch norm wrote a whole map that only the pool read,
and backward the pool wrote a whole map of gradients, zero but at the
maxima, that the batch norm read twice; fused, forward writes the pooled
map alone, and backward the batch norm's sums run over the pooled
gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iasgd.compiled import jit_inline
from iasgd.nn.kinds import Kind, LayerShape, Lowering, Params, RowOp, Shape, Sizing, image
from iasgd.nn.layers import batchnorm, kind_of
from iasgd.nn.layers.batchnorm import channels
from iasgd.nn.plan import (
    P_AOFF,
    P_BOFF,
    P_C,
    P_CO,
    P_GRAD,
    P_H,
    P_K,
    P_OH,
    P_OS,
    P_OW,
    P_RELU,
    P_S,
    P_SOFF,
    P_W,
    P_WOFF,
    P_XOFF,
    P_ZOFF,
    input4,
    nothing,
    view3,
    view4,
)


@dataclass(frozen=True)
class Pool:
    """2x2 max-pool, stride 2 (floor for odd sizes)."""

    def spec(self) -> str:
        return "pool"


@jit_inline
def maxpool2_forward(z, width, out, border, argmax, relu):
    """The 2x2 max-pool of a wide map (floor for odd sizes), and its ReLU
    where `relu`.

    z: (N, C, H*width) with row stride `width`; out: the whole output map
    (N, C, PH + 2B, PW + 2B), the pooled (PH, PW) = argmax's shape inside a
    border of B = `border` pixels (the padding of a "same" conv that
    follows; the border itself is not written); argmax: int32 (N, C, PH,
    PW), receives the flat index into the wide plane of each window's
    maximum (the first one on ties), for the backward pass.
    """
    # Rows of a C-contiguous map and a window's maximum found by selects, not
    # a loop over candidates: LLVM vectorises the row (bench/results/conv-paths.md).
    N, C, PH, PW = argmax.shape
    for n in range(N):
        for c in range(C):
            for i in range(PH):
                top, r0, r1, o = window_rows(z, out, n, c, i, width, border)
                a = argmax[n, c, i]
                for j in range(PW):
                    m, off = r0[2 * j], 0  # the first maximum wins ties
                    if r0[2 * j + 1] > m:
                        m, off = r0[2 * j + 1], 1
                    if r1[2 * j] > m:
                        m, off = r1[2 * j], width
                    if r1[2 * j + 1] > m:
                        m, off = r1[2 * j + 1], width + 1
                    a[j] = top + 2 * j + off
                    o[j] = max(m, 0) if relu else m


@jit_inline
def maxpool2_backward(dout, out, argmax, dz, relu):
    """Route pooled gradients back to the window maxima (those that were
    positive, where `relu`).

    dout, out, argmax: (N, C, PH, PW); dz: (N, C, H*width) wide, overwritten
    (zero everywhere else, junk columns included).
    """
    N, C, PH, PW = dout.shape
    dz[:] = 0
    for n in range(N):
        for c in range(C):
            for i in range(PH):
                for j in range(PW):
                    if not relu or out[n, c, i, j] > 0:
                        dz[n, c, argmax[n, c, i, j]] = dout[n, c, i, j]


# ------------------------------------- a batch norm before it, fused


@jit_inline
def bn_maxpool2_forward(x, width, gamma, beta, mean, var, training, out, border, argmax,
                        relu):
    """maxpool2_forward of batchnorm.normalise(x) (then its ReLU where
    `relu`), the normalised map never written: each window's four values
    are normalised as the pool reads them, the same arithmetic as
    normalise's (the pooled values and argmax are the two rows').

    x: (N, C, H, S) wide, `width` valid columns; gamma, beta, mean, var:
    (C,), the batch's statistics (`training`, unbiased variance) or the
    running ones; out, border, argmax: as maxpool2_forward's.
    """
    N, C, PH, PW = argmax.shape
    H, S = x.shape[2], x.shape[3]
    z = x.reshape((N, C, H * S))
    m = N * H * width
    # sample by sample, a channel's constants again for each plane: at b = 64
    # 5-25 % faster (both passes) than channel by channel, whose planes lie a
    # sample's maps apart
    for n in range(N):
        for c in range(C):
            a = gamma[c] * batchnorm.inverse_std(var[c], m, training)
            b = x.dtype.type(beta[c] - mean[c] * a)
            a = x.dtype.type(a)
            for i in range(PH):
                top, r0, r1, o = window_rows(z, out, n, c, i, S, border)
                am = argmax[n, c, i]
                for j in range(PW):
                    m0, off = r0[2 * j] * a + b, 0  # the first maximum wins ties
                    v = r0[2 * j + 1] * a + b
                    if v > m0:
                        m0, off = v, 1
                    v = r1[2 * j] * a + b
                    if v > m0:
                        m0, off = v, S
                    v = r1[2 * j + 1] * a + b
                    if v > m0:
                        m0, off = v, S + 1
                    am[j] = top + 2 * j + off
                    o[j] = max(m0, 0) if relu else m0


@jit_inline
def bn_maxpool2_weight_grad(x, dout, out, argmax, width, mean, var, relu, dgamma, dbeta):
    """batchnorm_weight_grad where the batch norm's output gradient is the
    pool's backward: dout at each window's maximum (where it passed the
    ReLU, `relu`), zero elsewhere; so both sums run over the pooled
    positions. Where `relu`, dout is first zeroed in place where the ReLU
    stopped it (as batch norm's own weight pass does with its fused ReLU),
    so that the input pass adds it without looking (a branch in its
    scatter cost 0.6 ms of 1.6 on vgg-bn's first block, b = 64).
    x: (N, C, H, S); dout, out, argmax: (N, C, PH, PW)."""
    N, C, PH, PW = argmax.shape
    H, S = x.shape[2], x.shape[3]
    z = x.reshape((N, C, H * S))
    m = N * H * width
    for c in range(C):
        mu = x.dtype.type(mean[c])
        g = 0.0
        d = 0.0
        for n in range(N):
            plane = z[n, c]
            for i in range(PH):
                e, o, am = dout[n, c, i], out[n, c, i], argmax[n, c, i]
                tg = x.dtype.type(0)
                td = x.dtype.type(0)
                if relu:  # its backward, in place: the input pass adds dout as it is
                    for j in range(PW):
                        if o[j] <= 0:
                            e[j] = 0
                for j in range(PW):
                    tg += e[j] * (plane[am[j]] - mu)
                    td += e[j]
                g += tg
                d += td
        dgamma[c] = g * batchnorm.inverse_std(var[c], m, True)
        dbeta[c] = d


@jit_inline
def bn_maxpool2_input_grad(x, dout, argmax, width, gamma, mean, var, dgamma, dbeta, dx):
    """batchnorm_input_grad of the same output gradient: the part every
    entry gets from the sums, gamma / (m sigma) (- dbeta - xhat dgamma),
    then gamma / sigma dout added at the maxima; dout as the weight pass
    left it (ReLU applied). dx (N, C, H, S), overwritten, 0 on junk columns."""
    N, C, PH, PW = argmax.shape
    H, S = x.shape[2], x.shape[3]
    z, dz = x.reshape((N, C, H * S)), dx.reshape((N, C, H * S))
    m = N * H * width
    for n in range(N):  # sample by sample, as bn_maxpool2_forward
        for c in range(C):
            inv = batchnorm.inverse_std(var[c], m, True)
            k = x.dtype.type(gamma[c] * inv)
            mu = x.dtype.type(mean[c])
            sg = x.dtype.type(dgamma[c] / m)
            db = x.dtype.type(dbeta[c] / m)
            inv_x = x.dtype.type(inv)
            # the whole plane in one loop, junk columns too (LLVM vectorises
            # it, where rows of 8 ran half a vector), then those zeroed
            r, plane = z[n, c], dz[n, c]
            for j in range(H * S):
                plane[j] = k * (-db - (r[j] - mu) * inv_x * sg)
            for i in range(H):
                for j in range(i * S + width, (i + 1) * S):
                    plane[j] = 0
            for i in range(PH):
                e, am = dout[n, c, i], argmax[n, c, i]
                for j in range(PW):
                    plane[am[j]] += k * e[j]


# ------------------------------------------- what the 2x2 pools share
# (this max-pool and iasgd.nn.layers.avgpool): a window row's views, the
# views of a pool row's maps, its output shape and its lowering.


@jit_inline
def window_rows(z, out, n, c, i, width, border):
    """Output row i of plane (n, c) and the input rows its windows cover:
    (top, r0, r1, o), r0 and r1 the two rows of the wide plane z[n, c] (row
    stride `width`) from its flat position `top` on, o the row's values in
    out[n, c] (N, C, PH + 2B, PW + 2B), inside its border of B = `border`."""
    plane = z[n, c]
    top = 2 * i * width
    return (top, plane[top:top + width], plane[top + width:top + 2 * width],
            out[n, c, border + i, border:out.shape[3] - border])


@jit_inline
def wide_input(flat, row, n):
    """A pool row's input (n, C, H*S), wide planes, inside acts or dacts."""
    return view3(flat, row[P_XOFF], n, row[P_C], row[P_H] * row[P_S])


@jit_inline
def pool_map(flat, row, n):
    """A pool row's whole output map (n, CO, OH + 2K, OS): the pooled values
    inside a zero border of K pixels when it is the input of a "same" conv."""
    return view4(flat, row[P_ZOFF], n, row[P_CO], row[P_OH] + 2 * row[P_K], row[P_OS])


@jit_inline
def pooled(flat, row, n):
    """A pool row's (n, CO, OH, OW) output inside its map (pool_map)."""
    B = row[P_K]
    return pool_map(flat, row, n)[:, :, B:B + row[P_OH], B:B + row[P_OW]]


def pool_shape(layer: Any, shape: Shape, sizing: Sizing) -> tuple[Shape, Params]:
    """The output shape of a 2x2 pool, stride 2, floor for odd sizes."""
    c, h, w = image(shape, sizing.where)
    if h < 2 or w < 2:
        raise ValueError(f"{sizing.where}: its {h}x{w} input is too small for a 2x2 pool")
    return (c, h // 2, w // 2), ()


def lower_pool(lo: Lowering, nxt: LayerShape | None, op: RowOp, **columns: int) -> list[int]:
    """A 2x2 pool's row of `op` (and its other `columns`, Lowering.emit's),
    its map written inside the zero border the next layer wants (a "same"
    conv's padding); returns the row."""
    c, ph, pw = lo.c, lo.h // 2, lo.w // 2
    b = kind_of(nxt.layer).border(nxt.layer) if nxt is not None else 0
    z = lo.alloc(c * (ph + 2 * b) * (pw + 2 * b))
    row = lo.emit(op, c, ph, pw, pw + 2 * b, z, k=b, **columns)
    lo.move(z, c, ph + 2 * b, pw + 2 * b, pw + 2 * b, border=b)
    return row


# ------------------------------------------------------------------ its row


def pool_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    maxpool2_forward(wide_input(acts, row, n), row[P_S], pool_map(acts, row, n), row[P_K],
                     _argmax4(argmax, row, n), row[P_RELU] != 0)


def pool_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    maxpool2_backward(pooled(dacts, row, n), pooled(acts, row, n), _argmax4(argmax, row, n),
                      wide_input(dacts, row, n), row[P_RELU] != 0)


@jit_inline
def _argmax4(argmax, row, n):
    return view4(argmax, row[P_AOFF], n, row[P_CO], row[P_OH], row[P_OW])


def _label(row: Any) -> str:
    return f"pool {row[P_C]}x{row[P_H]}x{row[P_W]}" + (" +relu" if row[P_RELU] else "")


ROW = RowOp.without_weights("pool", pool_forward_op, pool_input_op, label=_label)


# ---------------------------------------- the row of a batch norm and a pool
# Its input columns (XOFF, C, H, W, S) are the batch norm's input, WOFF,
# BOFF and SOFF its tensors; the rest are the pool's.


def bn_pool_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    x, C, mean, var = input4(acts, row, n), row[P_C], row[P_SOFF], row[P_SOFF] + row[P_C]
    gamma, beta = channels(params, row, row[P_WOFF]), channels(params, row, row[P_BOFF])
    out, border, am, relu = pool_map(acts, row, n), row[P_K], _argmax4(argmax, row, n), row[P_RELU]
    if grad.size == params.size:  # training: the batch's statistics, kept for the update
        batchnorm.statistics(x, row[P_W], grad[mean:mean + C], grad[var:var + C])
        bn_maxpool2_forward(x, row[P_W], gamma, beta, grad[mean:mean + C], grad[var:var + C],
                            True, out, border, am, relu != 0)
    else:  # prediction: the running statistics
        bn_maxpool2_forward(x, row[P_W], gamma, beta, params[mean:mean + C],
                            params[var:var + C], False, out, border, am, relu != 0)


def bn_pool_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    mean, var = channels(grad, row, row[P_SOFF]), channels(grad, row, row[P_SOFF] + row[P_C])
    bn_maxpool2_weight_grad(input4(acts, row, n), pooled(dacts, row, n), pooled(acts, row, n),
                            _argmax4(argmax, row, n), row[P_W], mean, var, row[P_RELU] != 0,
                            channels(grad, row, row[P_WOFF]), channels(grad, row, row[P_BOFF]))


def bn_pool_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    mean, var = channels(grad, row, row[P_SOFF]), channels(grad, row, row[P_SOFF] + row[P_C])
    bn_maxpool2_input_grad(input4(acts, row, n), pooled(dacts, row, n), _argmax4(argmax, row, n),
                           row[P_W], channels(params, row, row[P_WOFF]), mean, var,
                           channels(grad, row, row[P_WOFF]), channels(grad, row, row[P_BOFF]),
                           input4(dacts, row, n))


def _bn_passes(row: Any) -> tuple[Any, Any, Any]:
    return (bn_pool_forward_op, bn_pool_weights_op,
            bn_pool_input_op if row[P_GRAD] else nothing)


def _bn_label(row: Any) -> str:
    return f"bn+pool {row[P_C]}x{row[P_H]}x{row[P_W]}" + (" +relu" if row[P_RELU] else "")


BN_ROW = RowOp("bn+pool", _bn_passes, {bn_pool_forward_op: 1.0, bn_pool_weights_op: 1.0,
                                       bn_pool_input_op: 1.0}, batchnorm.ROW.flops, _bn_label)


def _lower(lo: Lowering, ls: LayerShape, nxt: LayerShape | None) -> None:
    argmax = lo.alloc_argmax(lo.c * (lo.h // 2) * (lo.w // 2))
    bn = lo.take_back(batchnorm.ROW)
    if bn is None:
        lower_pool(lo, nxt, ROW, aoff=argmax, relu=lo.fused_relu())
        return
    row = lower_pool(lo, nxt, BN_ROW, aoff=argmax, relu=lo.fused_relu(), woff=bn[P_WOFF],
                     boff=bn[P_BOFF], soff=bn[P_SOFF])
    row[P_GRAD] = bn[P_GRAD]  # the batch norm's input's, not after its own parameters


def _torch(ls: LayerShape, shape: Shape) -> list[tuple[str, Any]]:
    from torch import nn

    return [("pool", nn.MaxPool2d(2))]


KIND = Kind("pool", Pool, r"pool", "pool", lambda m: Pool(), pool_shape, _lower, _torch,
            (ROW, BN_ROW),
            order=30, relu_before=True)
