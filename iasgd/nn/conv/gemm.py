"""Convolutions of any odd k by im2col + GEMM.

A sample's input becomes the (C*k*k, OH*S) column matrix, one contiguous
copy per row thanks to the wide layout (iasgd.nn.plan), and BLAS multiplies
it (numba's np.dot calls scipy's BLAS without the GIL and without
allocating). It serves the sizes without a direct kernel, and the gradients
of the convs with enough channels for BLAS to run near its best (the rule:
iasgd.nn.layers.conv; the measurements: bench/results/conv-paths.md).
"""

from __future__ import annotations

import numpy as np

from iasgd.compiled import jit_inline
from iasgd.nn.plan import copy_values, total


@jit_inline
def im2col(xf, S, k, L, col):
    """The column matrix of one sample: col[(c*k + kh)*k + kw, p] =
    xf[c, kh*S + kw + p] for p < L, zero for L <= p < OH*S (col's width).

    xf: (C, H*S) a wide input plane per channel; L = (H-k)*S + width-k+1,
    one past the last valid output position. Output position p = i*S + j
    (j < OW valid, the rest junk columns) then is col[:, p] . w[o].
    """
    C = xf.shape[0]
    r = 0
    for c in range(C):
        for kh in range(k):
            for kw in range(k):
                off = kh * S + kw
                copy_values(xf[c, off:off + L], col[r, :L])
                col[r, L:] = 0
                r += 1


@jit_inline
def col2im(dcol, S, k, L, dxf):
    """im2col's transpose: dxf (C, H*S) = the sum of dcol's rows at their
    offsets (overwritten). Junk columns of dxf stay zero when dcol is zero
    in the junk output columns (dout is)."""
    C = dxf.shape[0]
    dxf[:] = 0
    r = 0
    for c in range(C):
        for kh in range(k):
            for kw in range(k):
                t = dxf[c, kh * S + kw:kh * S + kw + L]
                d = dcol[r, :L]
                for p in range(L):
                    t[p] += d[p]
                r += 1


@jit_inline
def conv_forward_gemm(x, w2, b, out, width, col):
    """conv_forward of any odd k by im2col + GEMM, sample by sample.

    x: (N, C, H, S); w2: (O, C*k*k) (the weights, flat per output channel);
    b: (O,); out: (N, O, OH*S) wide; col: (C*k*k, OH*S) scratch.
    """
    N, C, H, S = x.shape
    O, CKK = w2.shape
    k = kernel_size(CKK, C)
    L = (H - k) * S + (width - k + 1)
    xf = x.reshape((N, C, H * S))
    for n in range(N):
        im2col(xf[n], S, k, L, col)
        o = out[n]
        np.dot(w2, col, o)
        for q in range(O):
            row = o[q]
            bq = b[q]
            for p in range(row.size):
                row[p] += bq


@jit_inline
def conv_backward_weights_gemm(x, dout, dw2, db, width, col, acc, tmp):
    """conv_backward_weights by im2col + GEMM: dw2 (O, C*k*k) = the sum over
    samples of dout[n] @ col[n].T, computed transposed (col[n] @ dout[n].T,
    BLAS's faster orientation here: bench/results/conv-paths.md); db (O,)
    the sums of dout (both overwritten). col: (C*k*k, OH*S), acc and tmp: (C*k*k, O) scratch."""
    N, C, H, S = x.shape
    O, CKK = dw2.shape
    k = kernel_size(CKK, C)
    L = (H - k) * S + (width - k + 1)
    xf = x.reshape((N, C, H * S))
    db[:] = 0
    acc[:] = 0
    for n in range(N):
        im2col(xf[n], S, k, L, col)
        if n == 0:
            np.dot(col, dout[n].T, acc)
        else:
            np.dot(col, dout[n].T, tmp)
            for r in range(CKK):
                a = acc[r]
                t = tmp[r]
                for q in range(O):
                    a[q] += t[q]
        for q in range(O):
            db[q] += total(dout[n, q, :L])
    for q in range(O):
        for r in range(CKK):
            dw2[q, r] = acc[r, q]


@jit_inline
def conv_backward_input_gemm(w2, dout, dx, width, dcol):
    """conv_backward_input by GEMM + col2im: dcol = w2.T @ dout[n], then
    scattered into dx (N, C, H, S), overwritten, zero in its junk columns.
    dcol: (C*k*k, OH*S) scratch."""
    N, C, H, S = dx.shape
    k = kernel_size(w2.shape[1], C)
    L = (H - k) * S + (width - k + 1)
    dxf = dx.reshape((N, C, H * S))
    for n in range(N):
        np.dot(w2.T, dout[n], dcol)
        col2im(dcol, S, k, L, dxf[n])



@jit_inline
def kernel_size(CKK, C):
    """k from C*k*k and C."""
    k = 1
    while k * k * C < CKK:
        k += 1
    return k
