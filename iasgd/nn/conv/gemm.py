"""Convolutions of any odd k by im2col + GEMM.

A block of samples' inputs becomes one column matrix (C*k*k, B*OH*R) and
BLAS multiplies it (numba's np.dot calls scipy's BLAS without the GIL and
without allocating). Each row of output positions takes R columns: its OW
valid ones where the wide layout's junk columns (iasgd.nn.plan) would be an
eighth or more of the multiply-adds (on an 8x8 output in rows of 10, a
fifth), else all S of the wide row, which im2col then copies in one run a
tap. Blocks of about GEMM_COLUMNS positions keep the products large enough
for BLAS to run near its best and the weight gradient's accumulations few.
It serves the sizes without a direct kernel, and the passes of the convs
with enough channels for BLAS to run near its best (the rule:
iasgd.nn.layers.conv; the measurements: bench/results/conv-paths.md).

The scratch arrays are flat and each block's matrices are views of their
first floats, contiguous whatever the block's size (the last may be short).
"""

from __future__ import annotations

import numpy as np

from iasgd.compiled import jit_inline
from iasgd.nn.plan import add_values, copy_values, total

# Output positions a block of samples aims at: with 512 columns BLAS ran
# vgg-bn's 64 -> 128 conv's three products 5-7 % faster than with one
# sample's 80 (numpy, one thread), and the weight gradient sums one product
# per block instead of one per sample.
GEMM_COLUMNS = 512


@jit_inline
def column_stride(S, OW):
    """R, the columns a row of output positions takes: OW where the S - OW
    junk columns would be an eighth of S or more, else S."""
    return OW if (S - OW) * 8 >= S else S


@jit_inline
def block_samples(positions):
    """Samples per GEMM block for `positions` (OH*R) columns each."""
    return max(1, GEMM_COLUMNS // positions)


@jit_inline
def block_geometry(H, S, width, k):
    """(OH, OW, R, P, B) of a k x k conv on H rows of S floats, `width` of
    them valid: the output's rows and valid columns, the columns a row of
    outputs takes (column_stride), a sample's columns and the samples of a
    block."""
    OH, OW = H - k + 1, width - k + 1
    R = column_stride(S, OW)
    P = OH * R
    return OH, OW, R, P, block_samples(P)


def scratch_sizes(ckk: int, out: int, out_height: int, out_width: int,
                  stride: int) -> tuple[int, int]:
    """Floats of scratch the three passes need in acts and in dacts, for a
    conv of ckk taps to `out` channels on (out_height, out_width) outputs in
    rows of `stride`: the forward the columns and the product, the weight
    gradient the columns (acts) and the output gradient and two (C*k*k, O)
    sums (dacts), the input gradient the output gradient and its columns
    (dacts)."""
    positions = out_height * column_stride.py_func(stride, out_width)
    cols = block_samples.py_func(positions) * positions
    return (ckk + out) * cols, out * cols + max(2 * ckk * out, ckk * cols)


@jit_inline
def block_view(flat, rows, cols):
    """The (rows, cols) matrix on flat's first rows*cols floats."""
    return flat[:rows * cols].reshape((rows, cols))


@jit_inline
def im2col(xf, S, k, OH, OW, R, col, at):
    """One sample's columns from column `at` of col (C*k*k, >= at + OH*R):
    col[(c*k + kh)*k + kw, at + i*R + j] = xf[c, (i + kh)*S + kw + j] for
    j < OW; for R = S the junk columns j >= OW hold what the wide rows do
    there (they meet zeros in the output gradient) or 0 after the last row.

    xf: (C, H*S) a wide input plane per channel."""
    C = xf.shape[0]
    L = (OH - 1) * S + OW  # one tap's run over the wide rows
    r = 0
    for c in range(C):
        src = xf[c]
        for kh in range(k):
            for kw in range(k):
                dst = col[r, at:at + OH * R]
                off = kh * S + kw
                if R == S:
                    copy_values(src[off:off + L], dst)
                    dst[L:] = 0
                else:
                    for i in range(OH):
                        copy_values(src[off + i * S:off + i * S + OW], dst[i * R:i * R + OW])
                r += 1


@jit_inline
def col2im(dcol, S, k, OH, OW, R, at, dxf):
    """im2col's transpose: dxf (C, H*S) = the sum of one sample's columns of
    dcol (from `at`) at their input positions (overwritten). Junk columns of
    dxf stay 0 where dcol's junk columns are 0 (they are: the output
    gradient's are, gather_output)."""
    C = dxf.shape[0]
    L = (OH - 1) * S + OW
    dxf[:] = 0
    r = 0
    for c in range(C):
        dst = dxf[c]
        for kh in range(k):
            for kw in range(k):
                src = dcol[r, at:at + OH * R]
                off = kh * S + kw
                if R == S:
                    add_values(src[:L], dst[off:off + L])
                else:
                    for i in range(OH):
                        add_values(src[i * R:i * R + OW], dst[off + i * S:off + i * S + OW])
                r += 1


@jit_inline
def gather_output(dout, OH, OW, R, D, at):
    """One sample's output gradient dout (O, OH*S) wide into D's columns
    from `at`: its valid positions, and 0 in the junk ones where R > OW."""
    O = dout.shape[0]
    S = dout.shape[1] // OH
    for q in range(O):
        src = dout[q]
        dst = D[q, at:at + OH * R]
        for i in range(OH):
            copy_values(src[i * S:i * S + OW], dst[i * R:i * R + OW])
            dst[i * R + OW:(i + 1) * R] = 0


@jit_inline
def output_block(dout, n0, nb, OH, OW, R, df):
    """The output gradients of samples n0 .. n0 + nb - 1 as one (O, nb*OH*R)
    matrix: dout[n0] itself where that is it (one sample in rows of S, its
    junk columns 0 as every output gradient's are), else gathered into df."""
    O, OL = dout.shape[1], dout.shape[2]
    if nb == 1 and R * OH == OL:
        return dout[n0]
    D = block_view(df, O, nb * OH * R)
    for s in range(nb):
        gather_output(dout[n0 + s], OH, OW, R, D, s * OH * R)
    return D


@jit_inline
def conv_forward_gemm(x, w2, b, out, width, colf, resf):
    """conv_forward of any odd k by im2col + GEMM, a block of samples at a time.

    x: (N, C, H, S); w2: (O, C*k*k) (the weights, flat per output channel);
    b: (O,); out: (N, O, OH*S) wide, junk columns 0; colf, resf: flat scratch
    of (C*k*k) and O times a block's columns.
    """
    N, C, H, S = x.shape
    O, CKK = w2.shape
    k = kernel_size(CKK, C)
    OH, OW, R, P, B = block_geometry(H, S, width, k)
    xf = x.reshape((N, C, H * S))
    for n0 in range(0, N, B):
        nb = min(B, N - n0)
        col = block_view(colf, CKK, nb * P)
        # one sample in rows of S: the product lands in place, bias added there
        res = out[n0] if nb == 1 and out.shape[2] == P else block_view(resf, O, nb * P)
        for s in range(nb):
            im2col(xf[n0 + s], S, k, OH, OW, R, col, s * P)
        np.dot(w2, col, res)
        for s in range(nb):
            for q in range(O):
                bq = b[q]
                for i in range(OH):
                    o = out[n0 + s, q, i * S:(i + 1) * S]
                    v = res[q, s * P + i * R:s * P + i * R + OW]
                    for j in range(OW):
                        o[j] = v[j] + bq
                    o[OW:] = 0


@jit_inline
def conv_backward_weights_gemm(x, dout, dw2, db, width, colf, df, acc, tmp):
    """conv_backward_weights by im2col + GEMM: dw2 (O, C*k*k) = the sum over
    blocks of D @ col.T, computed transposed (col @ D.T, BLAS's faster
    orientation here: bench/results/conv-paths.md); db (O,) the sums of dout
    over the valid positions (both overwritten). dout: (N, O, OH*S) wide;
    colf, df: flat scratch of (C*k*k) and O times a block's columns; acc
    and tmp: (C*k*k, O) scratch."""
    N, C, H, S = x.shape
    O, CKK = dw2.shape
    k = kernel_size(CKK, C)
    OH, OW, R, P, B = block_geometry(H, S, width, k)
    xf = x.reshape((N, C, H * S))
    db[:] = 0
    for n0 in range(0, N, B):
        nb = min(B, N - n0)
        col = block_view(colf, CKK, nb * P)
        for s in range(nb):
            im2col(xf[n0 + s], S, k, OH, OW, R, col, s * P)
        D = output_block(dout, n0, nb, OH, OW, R, df)
        for q in range(O):
            db[q] += total(D[q])
        if n0 == 0:
            np.dot(col, D.T, acc)
        else:
            np.dot(col, D.T, tmp)
            for r in range(CKK):
                add_values(tmp[r], acc[r])
    for q in range(O):
        for r in range(CKK):
            dw2[q, r] = acc[r, q]


@jit_inline
def conv_backward_input_gemm(w2, dout, dx, width, df, dcolf):
    """conv_backward_input by GEMM + col2im: dcol = w2.T @ D for a block's
    output gradients D, scattered into dx (N, C, H, S), overwritten, zero in
    its junk columns. df, dcolf: flat scratch of O and (C*k*k) times a
    block's columns."""
    N, C, H, S = dx.shape
    CKK = w2.shape[1]
    k = kernel_size(CKK, C)
    OH, OW, R, P, B = block_geometry(H, S, width, k)
    dxf = dx.reshape((N, C, H * S))
    for n0 in range(0, N, B):
        nb = min(B, N - n0)
        D = output_block(dout, n0, nb, OH, OW, R, df)
        dcol = block_view(dcolf, CKK, nb * P)
        np.dot(w2.T, D, dcol)
        for s in range(nb):
            col2im(dcol, S, k, OH, OW, R, s * P, dxf[n0 + s])


@jit_inline
def kernel_size(CKK, C):
    """k from C*k*k and C."""
    k = 1
    while k * k * C < CKK:
        k += 1
    return k
