"""Compiled forward/backward kernels for small CNNs and MLPs.

Every function here is a pure function on arrays, compiled by numba with the GIL
released: no I/O, no Python objects, no allocation on the training path. Results
go into arrays the caller preallocated (a worker's workspace and gradient buffer).
Some passes call BLAS (numba's three-argument np.dot, which calls scipy's
OpenBLAS without the GIL and without allocating): run them under
`iasgd.nn.blas.single_threaded_blas()` (the executors do), one BLAS thread per worker thread.
The 5x5 conv forward has a kernel in explicit vectors too (iasgd.nn.simd).

Conventions
- Activations are float32, C-contiguous, NCHW with a *row stride* S >= the
  valid width W: a plane is H rows of S floats, of which the first W hold the
  map and the rest are junk. Dense activations are (N, D).
- A convolution is k x k (k odd), valid, stride 1 ("same" padding is a pad op
  in front of it, which models.py inserts). It reads an input of row stride S
  and writes its output with the *same* row stride ("wide" rows): an (OH, OW) =
  (H-k+1, W-k+1) result occupies columns ow < OW of (OH, S) rows. This turns the
  whole plane into one long contiguous loop per kernel row, which LLVM
  vectorises well; short rows of 10 or 16 would not. Gradients flowing back
  into a wide plane are zero in the junk columns (every backward guarantees
  it), so junk never reaches a weight gradient.
- Weights follow PyTorch: conv (out, in, k, k), dense (out, in).

The whole network is described to the compiled code by one int64 table, the
*plan* (built by `iasgd.nn.models`): one row per op, in forward order, holding the
op code, the input and output shapes, and offsets into the flat parameter
array, the activation workspace and the pooling-index workspace. The columns
are named below; unused ones are 0. Each row's passes (forward, weight
gradient, input gradient) are `*_op` functions below, called through a table
of compiled pointers (`Net.ops`, built by `iasgd.nn.ops`).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import types
from numba.extending import overload

from iasgd.compiled import jit_fastmath as jit
from iasgd.compiled import jit_inline
from iasgd.nn import simd

# train_steps' arguments in bundles (named tuples, which numba passes as one):
# params, velocity: (P,) float32; grad: (P,); net: the network (Net below);
# acts, dacts, argmax: the workspace; batch_labels: (b,) int64 scratch;
# images (M, D) uint8 -> images * scale + shift; labels (M,) int64;
# order: (M,) int64 permutation; first, count: the steps to run; lr, momentum.
Weights = namedtuple("Weights", ["params", "velocity"])
Buffers = namedtuple("Buffers", ["grad", "net", "acts", "dacts", "argmax", "batch_labels"])
Images = namedtuple("Images", ["images", "labels", "scale", "shift"])
Steps = namedtuple("Steps", ["order", "first", "count", "batch_size", "lr", "momentum"])
# A network as the compiled code runs it: the int64 plan table, the table of
# compiled ops its rows' P_FWD, P_DW and P_DX columns index (iasgd.nn.ops),
# and `slice_size`: how many samples a pass runs on at most (the capacity of the
# plan's activations; network_loss_and_grad runs a larger batch in slices).
Net = namedtuple("Net", ["plan", "ops", "slice_size"])

# Op codes of a plan row.
OP_CONV = 0     # valid k x k conv: (C, H, W; S) -> (CO, OH, OW; S), weights at WOFF/BOFF
OP_PAD = 1      # zero border of K pixels: (C, H, W; S) -> (C, H+2K, W+2K; W+2K)
OP_RELU = 2     # in place on (C, H, W; S) at XOFF == ZOFF
OP_POOL = 3     # 2x2 max-pool, floor: (C, H, W; S) -> (C, H//2, W//2; W//2); RELU fuses a
                # ReLU; K > 0: written inside a zero border of K (OS = W//2 + 2K), the
                # padding of the "same" conv that follows
OP_FLATTEN = 4  # compact copy (C, H, W; S) -> (C*H*W,), only for S > W (S == W is free)
OP_DENSE = 5    # (C,) -> (CO,), weights at WOFF/BOFF; RELU fuses a ReLU on the output
OP_NAMES = ("conv", "pad", "relu", "pool", "flatten", "dense")

# Columns of a plan row: input (C, H, W) with row stride S at XOFF; output
# (CO, OH, OW) with row stride OS at ZOFF (dense tensors: H = W = S = 1); K:
# kernel size (conv) or border (pad); AOFF: pooling indices; GRAD: 1 if the
# op's input needs a gradient (an op before it has parameters), else its
# backward stops at its own weights (a pool's K: see OP_POOL). GEMM (conv): which passes run as
# im2col + BLAS GEMM instead of the direct kernels (GEMM_* bits, chosen by
# models.py); COFF: where their per-sample scratch (the column matrix, and
# the partial weight gradient) starts in acts (forward) and dacts (backward).
# FWD, DW, DX: the positions in the op table (Net.ops) of the row's forward,
# weight-gradient and input-gradient functions (iasgd.nn.ops fills them in).
(P_OP, P_C, P_H, P_W, P_S, P_CO, P_OH, P_OW, P_OS, P_K, P_XOFF, P_ZOFF, P_WOFF, P_BOFF,
 P_AOFF, P_RELU, P_GRAD, P_GEMM, P_COFF, P_FWD, P_DW, P_DX) = range(22)
PLAN_COLUMNS = 22

# GEMM bits of a conv row: which passes run as GEMMs (any kernel size; the
# direct kernels exist for 3x3 and 5x5 only), and SIMD_FORWARD: the forward
# runs as conv5_forward_simd or conv3_forward_simd, SIMD_WEIGHTS: the weight
# gradient of a 5x5 conv as conv5_backward_weights_simd (explicit vectors;
# which convs: models.conv_paths).
GEMM_FORWARD = 1
GEMM_WEIGHTS = 2
GEMM_INPUT = 4
GEMM_ALL = GEMM_FORWARD | GEMM_WEIGHTS | GEMM_INPUT
SIMD_FORWARD = 8
SIMD_WEIGHTS = 16
SIMD_BLOCK = 10  # output pixels per block of conv5_forward_simd
SIMD3_CHANNELS = 8  # output channels per block of conv3_forward_simd


# ---------------------------------------------------------------- convolution
#
# Two ways, chosen per conv and pass by the plan (P_GEMM, set in models.py):
# - direct kernels for 3x3 and 5x5, hand-unrolled (the taps live in registers
#   and several channels share every load): one entry point per pass
#   (conv_forward, conv_backward_weights, conv_backward_input) dispatches on k;
# - im2col + GEMM for any odd k (conv_*_gemm): a sample's input becomes the
#   (C*k*k, OH*S) column matrix, one contiguous copy per row thanks to the wide
#   layout, and BLAS multiplies it (numba's np.dot calls scipy's BLAS without
#   the GIL and without allocating). It serves the sizes without a direct
#   kernel, and the gradients of the convs with enough channels for BLAS to
#   run near its best (models.conv_paths has the rule and the measurements);
#   on the presets' shapes the direct forward stays as fast or faster.
#
# The direct kernels loop over (channel, kernel row) pairs in one loop
# (`row // k, row % k`), not in two: LLVM unrolls a loop of a constant k
# rows, and compiling k copies of the pixel loop cost 0.2-0.4 s per op of a
# cold start (1 s for the vector weight gradient), for no speed.


@jit
def conv_forward(x, w, b, out, width):
    """Valid k x k convolution plus bias, in wide layout (k = 3 or 5: the
    direct kernels; conv_forward_gemm takes any k).

    x: (N, C, H, S) with valid width `width` <= S; w: (O, C, k, k); b: (O,);
    out: (N, O, (H-k+1)*S), wide rows (valid columns < width-k+1).
    """
    if w.shape[2] == 5:
        _conv5_forward(x, w, b, out, width)
    else:
        _conv3_forward(x, w, b, out, width)


@jit
def conv_backward_weights(x, dout, dw, db, width):
    """Gradients of a k x k convolution with respect to its weights and bias.

    x: (N, C, H, S) the layer input (valid width `width`); dout: (N, O, OH*S)
    wide, zero in junk columns; dw: (O, C, k, k) and db: (O,) are overwritten.
    """
    if dw.shape[2] == 5:
        _conv5_backward_weights(x, dout, dw, db, width)
    else:
        _conv3_backward_weights(x, dout, dw, db, width)


@jit
def conv_backward_input(w, dout, dx, width):
    """Gradient of a k x k convolution with respect to its input.

    w: (O, C, k, k); dout: (N, O, OH*S) wide, zero in junk columns; dx: (N, C,
    H, S) is overwritten, zero in its junk columns (>= width).
    """
    if w.shape[2] == 5:
        _conv5_backward_input(w, dout, dx, width)
    else:
        _conv3_backward_input(w, dout, dx, width)


@jit
def conv5_forward(x, w, b, out):
    """conv_forward of a 5x5 kernel on a dense (N, C, H, W) input."""
    conv_forward(x, w, b, out, x.shape[3])


@jit
def conv5_backward_weights(x, dout, dw, db):
    """conv_backward_weights of a 5x5 kernel on a dense (N, C, H, W) input."""
    conv_backward_weights(x, dout, dw, db, x.shape[3])


@jit
def conv5_backward_input(w, dout, dx):
    """conv_backward_input of a 5x5 kernel into a dense (N, C, H, W) input."""
    conv_backward_input(w, dout, dx, dx.shape[3])


@jit_inline
def _conv5_forward(x, w, b, out, width):
    N, C, H, S = x.shape
    O = w.shape[0]
    L = (H - 5) * S + (width - 4)  # last valid flat position + 1
    P = (H - 4) * S  # the output plane
    xf = x.reshape((N, C, H * S))
    for n in range(N):
        for o in range(0, O - 1, 2):  # two output channels share every input load
            a0 = out[n, o, :P]
            a1 = out[n, o + 1, :P]
            a0[:] = b[o]
            a1[:] = b[o + 1]
            for row in range(C * 5):
                c, kh = row // 5, row % 5
                r = xf[n, c, kh * S:]  # kernel row kh: tap kw reads r[p + kw]
                w0, w1, w2, w3, w4 = _taps(w, o, c, kh)
                v0, v1, v2, v3, v4 = _taps(w, o + 1, c, kh)
                M = _span(L, P, kh == 4 and n == N - 1 and c == C - 1)
                for p in range(M):
                    y0, y1, y2, y3, y4 = r[p], r[p + 1], r[p + 2], r[p + 3], r[p + 4]
                    a0[p] += w0 * y0 + w1 * y1 + w2 * y2 + w3 * y3 + w4 * y4
                    a1[p] += v0 * y0 + v1 * y1 + v2 * y2 + v3 * y3 + v4 * y4
        if O % 2 == 1:
            o = O - 1
            a0 = out[n, o, :P]
            a0[:] = b[o]
            for row in range(C * 5):
                c, kh = row // 5, row % 5
                r = xf[n, c, kh * S:]
                w0, w1, w2, w3, w4 = _taps(w, o, c, kh)
                M = _span(L, P, kh == 4 and n == N - 1 and c == C - 1)
                for p in range(M):
                    a0[p] += (w0 * r[p] + w1 * r[p + 1] + w2 * r[p + 2] + w3 * r[p + 3]
                              + w4 * r[p + 4])


@jit_inline
def _conv5_backward_weights(x, dout, dw, db, width):
    N, C, H, S = x.shape
    O = dw.shape[0]
    L = (H - 5) * S + (width - 4)
    xf = x.reshape((N, C, H * S))
    dw[:] = 0
    db[:] = 0
    for n in range(N):
        for o in range(O):
            db[o] += _sum(dout[n, o, :L])
        for o in range(0, O - 1, 2):
            d0 = dout[n, o, :L]
            d1 = dout[n, o + 1, :L]
            for row in range(C * 5):
                c, kh = row // 5, row % 5
                r = xf[n, c, kh * S:]
                z = x.dtype.type(0)
                a0 = a1 = a2 = a3 = a4 = z
                b0 = b1 = b2 = b3 = b4 = z
                for p in range(L):
                    e, f = d0[p], d1[p]
                    y0, y1, y2, y3, y4 = r[p], r[p + 1], r[p + 2], r[p + 3], r[p + 4]
                    a0 += e * y0
                    a1 += e * y1
                    a2 += e * y2
                    a3 += e * y3
                    a4 += e * y4
                    b0 += f * y0
                    b1 += f * y1
                    b2 += f * y2
                    b3 += f * y3
                    b4 += f * y4
                _add_taps(dw, o, c, kh, a0, a1, a2, a3, a4)
                _add_taps(dw, o + 1, c, kh, b0, b1, b2, b3, b4)
        if O % 2 == 1:
            o = O - 1
            d0 = dout[n, o, :L]
            for row in range(C * 5):
                c, kh = row // 5, row % 5
                r = xf[n, c, kh * S:]
                z = x.dtype.type(0)
                a0 = a1 = a2 = a3 = a4 = z
                for p in range(L):
                    e = d0[p]
                    a0 += e * r[p]
                    a1 += e * r[p + 1]
                    a2 += e * r[p + 2]
                    a3 += e * r[p + 3]
                    a4 += e * r[p + 4]
                _add_taps(dw, o, c, kh, a0, a1, a2, a3, a4)


@jit_inline
def _conv5_backward_input(w, dout, dx, width):
    N, C, H, S = dx.shape
    O = w.shape[0]
    L = (H - 5) * S + (width - 4)
    dxf = dx.reshape((N, C, H * S))
    dxf[:] = 0
    # Kernel row kh adds t[i] += sum_k w[o, c, kh, k] * d[i - k] to t = dx[c, kh*S:].
    # For i >= 4 all five taps exist (d[L:L+4] are junk columns, hence zero),
    # so one vectorised loop covers i in [4, L+4); i < 4 is the short head.
    for n in range(N):
        for c in range(0, C - 1, 2):  # two input channels share every load of d
            for row in range(O * 5):
                o, kh = row // 5, row % 5
                d = dout[n, o]
                t0 = dxf[n, c, kh * S:]
                t1 = dxf[n, c + 1, kh * S:]
                w0, w1, w2, w3, w4 = _taps(w, o, c, kh)
                v0, v1, v2, v3, v4 = _taps(w, o, c + 1, kh)
                m0 = t0[4:]
                m1 = t1[4:]
                for j in range(L):
                    e0, e1, e2, e3, e4 = d[j + 4], d[j + 3], d[j + 2], d[j + 1], d[j]
                    m0[j] += w0 * e0 + w1 * e1 + w2 * e2 + w3 * e3 + w4 * e4
                    m1[j] += v0 * e0 + v1 * e1 + v2 * e2 + v3 * e3 + v4 * e4
                _input_grad_head(t0, d, w0, w1, w2, w3)
                _input_grad_head(t1, d, v0, v1, v2, v3)
        if C % 2 == 1:
            c = C - 1
            for row in range(O * 5):
                o, kh = row // 5, row % 5
                d = dout[n, o]
                t0 = dxf[n, c, kh * S:]
                w0, w1, w2, w3, w4 = _taps(w, o, c, kh)
                m0 = t0[4:]
                for j in range(L):
                    m0[j] += (w0 * d[j + 4] + w1 * d[j + 3] + w2 * d[j + 2] + w3 * d[j + 1]
                              + w4 * d[j])
                _input_grad_head(t0, d, w0, w1, w2, w3)


@jit_inline
def _conv3_forward(x, w, b, out, width):
    N, C, H, S = x.shape
    O = w.shape[0]
    L = (H - 3) * S + (width - 2)
    P = (H - 2) * S
    xf = x.reshape((N, C, H * S))
    for n in range(N):
        # Four output channels share every input load: 12 taps, 4 accumulators
        # and 3 inputs fit AVX2's 16 registers, and each vector of inputs feeds
        # 12 FMAs against 4 loads and 4 stores of accumulators.
        o = 0
        while o + 4 <= O:
            a0 = out[n, o, :P]
            a1 = out[n, o + 1, :P]
            a2 = out[n, o + 2, :P]
            a3 = out[n, o + 3, :P]
            a0[:] = b[o]
            a1[:] = b[o + 1]
            a2[:] = b[o + 2]
            a3[:] = b[o + 3]
            for row in range(C * 3):
                c, kh = row // 3, row % 3
                r = xf[n, c, kh * S:]
                w0, w1, w2 = _taps3(w, o, c, kh)
                u0, u1, u2 = _taps3(w, o + 1, c, kh)
                v0, v1, v2 = _taps3(w, o + 2, c, kh)
                s0, s1, s2 = _taps3(w, o + 3, c, kh)
                M = _span(L, P, kh == 2 and n == N - 1 and c == C - 1)
                for p in range(M):
                    y0, y1, y2 = r[p], r[p + 1], r[p + 2]
                    a0[p] += w0 * y0 + w1 * y1 + w2 * y2
                    a1[p] += u0 * y0 + u1 * y1 + u2 * y2
                    a2[p] += v0 * y0 + v1 * y1 + v2 * y2
                    a3[p] += s0 * y0 + s1 * y1 + s2 * y2
            o += 4
        while o < O:
            a0 = out[n, o, :P]
            a0[:] = b[o]
            for row in range(C * 3):
                c, kh = row // 3, row % 3
                r = xf[n, c, kh * S:]
                w0, w1, w2 = _taps3(w, o, c, kh)
                M = _span(L, P, kh == 2 and n == N - 1 and c == C - 1)
                for p in range(M):
                    a0[p] += w0 * r[p] + w1 * r[p + 1] + w2 * r[p + 2]
            o += 1


@jit_inline
def _conv3_backward_weights(x, dout, dw, db, width):
    N, C, H, S = x.shape
    O = dw.shape[0]
    L = (H - 3) * S + (width - 2)
    P = (H - 2) * S
    xf = x.reshape((N, C, H * S))
    dw[:] = 0
    db[:] = 0
    z = x.dtype.type(0)
    for n in range(N):
        for o in range(O):
            db[o] += _sum(dout[n, o, :L])
        # Four output channels share every input load: 12 sums over the plane
        # (12 independent FMA chains hide the FMA latency), 7 loads per 12 FMAs;
        # measured 15-25 % faster than two channels at a time.
        o = 0
        while o + 4 <= O:
            d0 = dout[n, o, :P]  # junk columns of dout are zero: see _span
            d1 = dout[n, o + 1, :P]
            d2 = dout[n, o + 2, :P]
            d3 = dout[n, o + 3, :P]
            for row in range(C * 3):
                c, kh = row // 3, row % 3
                r = xf[n, c, kh * S:]
                a0 = a1 = a2 = b0 = b1 = b2 = z
                c0 = c1 = c2 = e0 = e1 = e2 = z
                for p in range(_span(L, P, kh == 2 and n == N - 1 and c == C - 1)):
                    y0, y1, y2 = r[p], r[p + 1], r[p + 2]
                    f0, f1, f2, f3 = d0[p], d1[p], d2[p], d3[p]
                    a0 += f0 * y0
                    a1 += f0 * y1
                    a2 += f0 * y2
                    b0 += f1 * y0
                    b1 += f1 * y1
                    b2 += f1 * y2
                    c0 += f2 * y0
                    c1 += f2 * y1
                    c2 += f2 * y2
                    e0 += f3 * y0
                    e1 += f3 * y1
                    e2 += f3 * y2
                _add_taps3(dw, o, c, kh, a0, a1, a2)
                _add_taps3(dw, o + 1, c, kh, b0, b1, b2)
                _add_taps3(dw, o + 2, c, kh, c0, c1, c2)
                _add_taps3(dw, o + 3, c, kh, e0, e1, e2)
            o += 4
        while o < O:
            d0 = dout[n, o, :L]
            for row in range(C * 3):
                c, kh = row // 3, row % 3
                r = xf[n, c, kh * S:]
                a0 = a1 = a2 = z
                for p in range(L):
                    e = d0[p]
                    a0 += e * r[p]
                    a1 += e * r[p + 1]
                    a2 += e * r[p + 2]
                _add_taps3(dw, o, c, kh, a0, a1, a2)
            o += 1


@jit_inline
def _conv3_backward_input(w, dout, dx, width):
    N, C, H, S = dx.shape
    O = w.shape[0]
    L = (H - 3) * S + (width - 2)
    dxf = dx.reshape((N, C, H * S))
    dxf[:] = 0
    # As for 5x5: t[i] += w0 d[i] + w1 d[i-1] + w2 d[i-2] over i in [2, L+2)
    # (d[L:L+2] are junk columns, zero), plus a head of two.
    for n in range(N):
        c = 0
        while c + 4 <= C:  # four input channels share every load of d
            for row in range(O * 3):
                o, kh = row // 3, row % 3
                d = dout[n, o]
                t0 = dxf[n, c, kh * S:]
                t1 = dxf[n, c + 1, kh * S:]
                t2 = dxf[n, c + 2, kh * S:]
                t3 = dxf[n, c + 3, kh * S:]
                w0, w1, w2 = _taps3(w, o, c, kh)
                u0, u1, u2 = _taps3(w, o, c + 1, kh)
                v0, v1, v2 = _taps3(w, o, c + 2, kh)
                s0, s1, s2 = _taps3(w, o, c + 3, kh)
                m0, m1, m2, m3 = t0[2:], t1[2:], t2[2:], t3[2:]
                for j in range(L):
                    e0, e1, e2 = d[j + 2], d[j + 1], d[j]
                    m0[j] += w0 * e0 + w1 * e1 + w2 * e2
                    m1[j] += u0 * e0 + u1 * e1 + u2 * e2
                    m2[j] += v0 * e0 + v1 * e1 + v2 * e2
                    m3[j] += s0 * e0 + s1 * e1 + s2 * e2
                _input_grad_head3(t0, d, w0, w1)
                _input_grad_head3(t1, d, u0, u1)
                _input_grad_head3(t2, d, v0, v1)
                _input_grad_head3(t3, d, s0, s1)
            c += 4
        while c < C:
            for row in range(O * 3):
                o, kh = row // 3, row % 3
                d = dout[n, o]
                t0 = dxf[n, c, kh * S:]
                w0, w1, w2 = _taps3(w, o, c, kh)
                m0 = t0[2:]
                for j in range(L):
                    m0[j] += w0 * d[j + 2] + w1 * d[j + 1] + w2 * d[j]
                _input_grad_head3(t0, d, w0, w1)
            c += 1


@jit_inline
def _span(L, P, last):
    """How far a vectorised loop over a wide plane runs: the valid span L
    rounded up to whole AVX vectors of 8 when that stays inside the plane of
    P, so that no scalar tail loop follows (on vgg-small's 16x18 planes the
    tail cost a fifth of the time). The extra positions are junk columns (and
    their gradients zero); their reads of the kernel's last row run up to k-1
    values into the next plane, which exists unless this is the array's last
    plane (`last`): that one keeps L."""
    M = (L + 7) // 8 * 8
    if last or M > P:
        return L
    return M


@jit_inline
def _taps3(w, o, c, kh):
    return w[o, c, kh, 0], w[o, c, kh, 1], w[o, c, kh, 2]


@jit_inline
def _add_taps3(dw, o, c, kh, a0, a1, a2):
    dw[o, c, kh, 0] += a0
    dw[o, c, kh, 1] += a1
    dw[o, c, kh, 2] += a2


@jit_inline
def _input_grad_head3(t, d, w0, w1):
    """t[i] += sum_{k <= i} w_k d[i - k] for i < 2, where taps fall before d."""
    t[0] += w0 * d[0]
    t[1] += w0 * d[1] + w1 * d[0]


# ------------------------------------------------------- im2col + GEMM conv


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
    k = _kernel_size(CKK, C)
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
    BLAS's faster orientation here: 64-80 vs 53 GFLOP/s on vgg-small's 32 ->
    64 conv, 63 vs 33 on LeNet-5's 6 -> 16); db (O,) the sums of dout (both
    overwritten). col: (C*k*k, OH*S), acc and tmp: (C*k*k, O) scratch."""
    N, C, H, S = x.shape
    O, CKK = dw2.shape
    k = _kernel_size(CKK, C)
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
            db[q] += _sum(dout[n, q, :L])
    for q in range(O):
        for r in range(CKK):
            dw2[q, r] = acc[r, q]


@jit_inline
def conv_backward_input_gemm(w2, dout, dx, width, dcol):
    """conv_backward_input by GEMM + col2im: dcol = w2.T @ dout[n], then
    scattered into dx (N, C, H, S), overwritten, zero in its junk columns.
    dcol: (C*k*k, OH*S) scratch."""
    N, C, H, S = dx.shape
    k = _kernel_size(w2.shape[1], C)
    L = (H - k) * S + (width - k + 1)
    dxf = dx.reshape((N, C, H * S))
    for n in range(N):
        np.dot(w2.T, dout[n], dcol)
        col2im(dcol, S, k, L, dxf[n])


# ------------------------------------------------- explicit-vector forward
#
# The direct forward runs each kernel row over the whole wide plane with its
# sums in memory: on LeNet-5's 14 x 14 planes that is 136 positions per loop
# and 50-60 GFLOP/s. With the output channels in the 16 lanes of a vector
# (iasgd.nn.simd), a block of SIMD_BLOCK output pixels keeps one accumulator
# vector per pixel in registers through all C*k*k taps: each tap loads one
# vector of weights and multiplies it into every pixel's accumulator with
# that pixel's input value broadcast. LeNet-5's 6 -> 16 conv: 125-170
# GFLOP/s alone against 54-60.


@jit_inline
def conv5_forward_simd(x, wt, b, out, width, block):
    """conv_forward of a 5x5 kernel on float32 maps by explicit vectors, 16
    output channels at a time.

    x: (N, C, H, S); wt: (C*25*O,) the weights ordered (O/16, C, 5, 5, 16):
    each group of 16 output channels' taps together, so that a group's
    weights stay in L1; O a multiple of 16; b: (O,); out: (N, O, OH*S) wide;
    block: (SIMD_BLOCK*16,) scratch. Needs OW = width-4 >= SIMD_BLOCK: a
    row's last block is moved back to end at OW (its first pixels are
    computed twice, alike). k is a constant: LLVM unrolls the taps (1.9x
    faster than a loop over a k it does not know; 3x3: conv3_forward_simd).
    """
    N, C, H, S = x.shape
    O = b.size
    L = simd.LANES
    OH, OW = H - 4, width - 4
    xf = x.reshape((N, C * H * S))
    for n in range(N):
        xs = xf[n]
        for ob in range(0, O, L):
            bias = simd.load(b, ob)
            group = ob * C * 25  # = (ob / L) * (C*25*L)
            for i in range(OH):
                j = 0
                while j < OW:
                    j = min(j, OW - SIMD_BLOCK)
                    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = bias
                    for c in range(C):
                        for kh in range(5):
                            r = (c * H + i + kh) * S + j
                            taps = group + (c * 5 + kh) * 5 * L
                            for kw in range(5):
                                w = simd.load(wt, taps + kw * L)
                                q = r + kw
                                a0 = simd.fma(w, simd.splat(xs[q]), a0)
                                a1 = simd.fma(w, simd.splat(xs[q + 1]), a1)
                                a2 = simd.fma(w, simd.splat(xs[q + 2]), a2)
                                a3 = simd.fma(w, simd.splat(xs[q + 3]), a3)
                                a4 = simd.fma(w, simd.splat(xs[q + 4]), a4)
                                a5 = simd.fma(w, simd.splat(xs[q + 5]), a5)
                                a6 = simd.fma(w, simd.splat(xs[q + 6]), a6)
                                a7 = simd.fma(w, simd.splat(xs[q + 7]), a7)
                                a8 = simd.fma(w, simd.splat(xs[q + 8]), a8)
                                a9 = simd.fma(w, simd.splat(xs[q + 9]), a9)
                    simd.store(block, 0, a0)
                    simd.store(block, L, a1)
                    simd.store(block, 2 * L, a2)
                    simd.store(block, 3 * L, a3)
                    simd.store(block, 4 * L, a4)
                    simd.store(block, 5 * L, a5)
                    simd.store(block, 6 * L, a6)
                    simd.store(block, 7 * L, a7)
                    simd.store(block, 8 * L, a8)
                    simd.store(block, 9 * L, a9)
                    for p in range(SIMD_BLOCK):  # pixel-major block -> channel planes
                        for o in range(L):
                            out[n, ob + o, i * S + j + p] = block[p * L + o]
                    j += SIMD_BLOCK


def conv5_forward_lanes(x, w, b, out, width, scratch):
    """conv5_forward_simd on float32 maps, the weights w (O, C, 5, 5) first
    reordered into scratch (C*25*O + SIMD_BLOCK*16 floats); the direct
    kernel on other dtypes, which the vectors do not take (the tests'
    float64 finite differences)."""


@overload(conv5_forward_lanes, jit_options={"fastmath": True})
def _conv5_forward_lanes(x, w, b, out, width, scratch):
    if x.dtype != types.float32:
        return lambda x, w, b, out, width, scratch: _conv5_forward(x, w, b, out, width)

    def lanes(x, w, b, out, width, scratch):
        wt = _grouped_taps(w, simd.LANES, scratch)
        conv5_forward_simd(x, wt, b, out, width,
                           scratch[wt.size:wt.size + SIMD_BLOCK * simd.LANES])
    return lanes


@jit_inline
def _grouped_taps(w, G, scratch):
    """The weights w (O, C, k, k) reordered (O/G, C, k, k, G) into the start
    of scratch, and that view: each group of G output channels' taps
    together, a tap's G channels side by side (the vector forwards' order)."""
    O, C, k, _ = w.shape
    wt = scratch[:C * k * k * O]
    for o in range(O):
        r = (o - o % G) * C * k * k + o % G
        for c in range(C):
            for kh in range(k):
                for kw in range(k):
                    wt[r] = w[o, c, kh, kw]
                    r += G
    return wt


# ------------------------------------------------- explicit-vector 3x3 forward
#
# The direct 3x3 forward keeps its sums in memory: each vector of pixels
# loads and stores four channels' sums for 12 FMAs. Here the lanes are 16
# output pixels of a row, and a block of SIMD3_CHANNELS output channels times
# two rows keeps its 16 sums in registers through all C*9 taps: each tap
# loads two input rows and broadcasts 8 weights for 16 FMAs, and the sums are
# stored once, straight into the output rows. vgg-small, alone, b = 8,
# GFLOP/s direct vs vectors: 32 -> 64 on 16 x 16 98 vs 228, 3 -> 32 on
# 32 x 32 91 vs 171.


@jit_inline
def conv3_forward_simd(x, wt, b, out, width):
    """conv_forward of a 3x3 kernel on float32 maps by explicit vectors.

    x: (N, C, H, S); wt: (C*9*O,) the weights ordered (O/8, C, 3, 3, 8):
    each group of SIMD3_CHANNELS output channels' taps together; O a multiple
    of 8; b: (O,); out: (N, O, OH*S) wide (only valid columns written).
    Needs OW = width-2 >= 16 and OH = H-2 >= 2: a row's last block of 16
    columns is moved back to end at OW, and an odd last row pairs with the
    row before it (those pixels are computed twice, alike).
    """
    N, C, H, S = x.shape
    O = b.size
    L = simd.LANES
    G = SIMD3_CHANNELS
    OH, OW = H - 2, width - 2
    xf = x.reshape((N, C * H * S))
    for n in range(N):
        xs = xf[n]
        on = out[n]
        for ob in range(0, O, G):
            group = ob * C * 9  # = (ob / G) * (C*9*G)
            o0, o1, o2, o3 = on[ob], on[ob + 1], on[ob + 2], on[ob + 3]
            o4, o5, o6, o7 = on[ob + 4], on[ob + 5], on[ob + 6], on[ob + 7]
            for i0 in range(0, OH, 2):
                i = min(i0, OH - 2)
                for j0 in range(0, OW, L):
                    j = min(j0, OW - L)
                    p0 = q0 = simd.splat_at(b, ob)
                    p1 = q1 = simd.splat_at(b, ob + 1)
                    p2 = q2 = simd.splat_at(b, ob + 2)
                    p3 = q3 = simd.splat_at(b, ob + 3)
                    p4 = q4 = simd.splat_at(b, ob + 4)
                    p5 = q5 = simd.splat_at(b, ob + 5)
                    p6 = q6 = simd.splat_at(b, ob + 6)
                    p7 = q7 = simd.splat_at(b, ob + 7)
                    for row in range(C * 3):  # (channel, kernel row)
                        r = (row // 3 * H + i + row % 3) * S + j
                        for kw in range(3):
                            top = simd.load(xs, r + kw)  # input row i + kh
                            bot = simd.load(xs, r + S + kw)  # and i + 1 + kh
                            t = group + (row * 3 + kw) * G
                            w = simd.splat_at(wt, t)
                            p0, q0 = simd.fma(w, top, p0), simd.fma(w, bot, q0)
                            w = simd.splat_at(wt, t + 1)
                            p1, q1 = simd.fma(w, top, p1), simd.fma(w, bot, q1)
                            w = simd.splat_at(wt, t + 2)
                            p2, q2 = simd.fma(w, top, p2), simd.fma(w, bot, q2)
                            w = simd.splat_at(wt, t + 3)
                            p3, q3 = simd.fma(w, top, p3), simd.fma(w, bot, q3)
                            w = simd.splat_at(wt, t + 4)
                            p4, q4 = simd.fma(w, top, p4), simd.fma(w, bot, q4)
                            w = simd.splat_at(wt, t + 5)
                            p5, q5 = simd.fma(w, top, p5), simd.fma(w, bot, q5)
                            w = simd.splat_at(wt, t + 6)
                            p6, q6 = simd.fma(w, top, p6), simd.fma(w, bot, q6)
                            w = simd.splat_at(wt, t + 7)
                            p7, q7 = simd.fma(w, top, p7), simd.fma(w, bot, q7)
                    a = i * S + j
                    simd.store(o0, a, p0)
                    simd.store(o0, a + S, q0)
                    simd.store(o1, a, p1)
                    simd.store(o1, a + S, q1)
                    simd.store(o2, a, p2)
                    simd.store(o2, a + S, q2)
                    simd.store(o3, a, p3)
                    simd.store(o3, a + S, q3)
                    simd.store(o4, a, p4)
                    simd.store(o4, a + S, q4)
                    simd.store(o5, a, p5)
                    simd.store(o5, a + S, q5)
                    simd.store(o6, a, p6)
                    simd.store(o6, a + S, q6)
                    simd.store(o7, a, p7)
                    simd.store(o7, a + S, q7)


def conv3_forward_lanes(x, w, b, out, width, scratch):
    """conv3_forward_simd on float32 maps, the weights w (O, C, 3, 3) first
    reordered into scratch (C*9*O floats); the direct kernel on other
    dtypes (the tests' float64 finite differences)."""


@overload(conv3_forward_lanes, jit_options={"fastmath": True})
def _conv3_forward_lanes(x, w, b, out, width, scratch):
    if x.dtype != types.float32:
        return lambda x, w, b, out, width, scratch: _conv3_forward(x, w, b, out, width)

    def lanes(x, w, b, out, width, scratch):
        conv3_forward_simd(x, _grouped_taps(w, SIMD3_CHANNELS, scratch), b, out, width)
    return lanes


# The weight gradient sums, for each of the C*25 taps, one product per
# output pixel and sample. With 16 output channels in the lanes, a sample's
# output gradient is first copied position-major (one vector per pixel), and
# each kernel row's 5 taps keep two vectors of sums each in registers through
# all the row's pixels: one vector load and 10 multiply-adds per two pixels.
# The input values are broadcast by simd.splat_at: with splat(xs[p]), numba's
# check for a negative index cost half the speed. LeNet-5's 6 -> 16 conv, b =
# 16, alone: 141 GFLOP/s against the direct kernel's 57-70.


@jit_inline
def conv5_backward_weights_simd(x, dout, dw, db, width, scratch):
    """conv_backward_weights of a 5x5 kernel on float32 maps by explicit
    vectors, 16 output channels at a time.

    x: (N, C, H, S), valid width `width`; dout: (N, O, OH*S) wide, zero in
    junk columns; dw: (O, C, 5, 5) and db: (O,) are overwritten; O a multiple
    of 16; scratch: (OH*OW*16 + C*25*16,) floats, for one sample's output
    gradient of a group, position-major (OH*OW, 16), and the group's weight
    gradient, tap-major (C, 5, 5, 16).
    """
    N, C, H, S = x.shape
    O = db.size
    L = simd.LANES
    OH, OW = H - 4, width - 4
    xf = x.reshape((N, C * H * S))
    lanes = scratch[:OH * OW * L]
    sums = scratch[OH * OW * L:(OH * OW + C * 25) * L]
    zero = simd.splat(np.float32(0))
    for o in range(O):
        db[o] = 0
        for n in range(N):
            db[o] += _sum(dout[n, o, :(OH - 1) * S + OW])
    for ob in range(0, O, L):
        for t in range(C * 25):
            simd.store(sums, t * L, zero)
        for n in range(N):
            # (with `range(L)`, LLVM would unroll the copy 16 times: 0.5 s more)
            for o in range(ob, ob + L):
                d = dout[n, o]
                for i in range(OH):
                    for j in range(OW):
                        lanes[(i * OW + j) * L + o - ob] = d[i * S + j]
            xs = xf[n]
            for row in range(C * 5):  # one loop: see "The direct kernels loop"
                c, kh = row // 5, row % 5
                t = row * 5 * L
                a0, a1, a2, a3, a4 = (simd.load(sums, t), simd.load(sums, t + L),
                                      simd.load(sums, t + 2 * L), simd.load(sums, t + 3 * L),
                                      simd.load(sums, t + 4 * L))
                b0 = b1 = b2 = b3 = b4 = zero  # the odd pixels' sums
                for i in range(OH):
                    r = (c * H + i + kh) * S  # input row of output row i, kernel row kh
                    q = i * OW * L
                    for j in range(0, OW - 1, 2):
                        e = simd.load(lanes, q + j * L)
                        f = simd.load(lanes, q + (j + 1) * L)
                        p = r + j
                        a0 = simd.fma(e, simd.splat_at(xs, p), a0)
                        a1 = simd.fma(e, simd.splat_at(xs, p + 1), a1)
                        a2 = simd.fma(e, simd.splat_at(xs, p + 2), a2)
                        a3 = simd.fma(e, simd.splat_at(xs, p + 3), a3)
                        a4 = simd.fma(e, simd.splat_at(xs, p + 4), a4)
                        b0 = simd.fma(f, simd.splat_at(xs, p + 1), b0)
                        b1 = simd.fma(f, simd.splat_at(xs, p + 2), b1)
                        b2 = simd.fma(f, simd.splat_at(xs, p + 3), b2)
                        b3 = simd.fma(f, simd.splat_at(xs, p + 4), b3)
                        b4 = simd.fma(f, simd.splat_at(xs, p + 5), b4)
                    if OW % 2 == 1:
                        e = simd.load(lanes, q + (OW - 1) * L)
                        p = r + OW - 1
                        a0 = simd.fma(e, simd.splat_at(xs, p), a0)
                        a1 = simd.fma(e, simd.splat_at(xs, p + 1), a1)
                        a2 = simd.fma(e, simd.splat_at(xs, p + 2), a2)
                        a3 = simd.fma(e, simd.splat_at(xs, p + 3), a3)
                        a4 = simd.fma(e, simd.splat_at(xs, p + 4), a4)
                simd.store(sums, t, simd.add(a0, b0))
                simd.store(sums, t + L, simd.add(a1, b1))
                simd.store(sums, t + 2 * L, simd.add(a2, b2))
                simd.store(sums, t + 3 * L, simd.add(a3, b3))
                simd.store(sums, t + 4 * L, simd.add(a4, b4))
        taps = dw.reshape((O, C * 25))
        for t in range(C * 25):  # tap-major sums -> dw
            for o in range(L):
                taps[ob + o, t] = sums[t * L + o]


def conv5_weights_lanes(x, dout, dw, db, width, scratch):
    """conv5_backward_weights_simd on float32 maps; the direct kernel on
    other dtypes (the tests' float64 finite differences)."""


@overload(conv5_weights_lanes, jit_options={"fastmath": True})
def _conv5_weights_lanes(x, dout, dw, db, width, scratch):
    if x.dtype != types.float32:
        return lambda x, dout, dw, db, width, scratch: _conv5_backward_weights(x, dout, dw, db,
                                                                                width)
    return lambda x, dout, dw, db, width, scratch: conv5_backward_weights_simd(
        x, dout, dw, db, width, scratch)


@jit_inline
def _kernel_size(CKK, C):
    """k from C*k*k and C."""
    k = 1
    while k * k * C < CKK:
        k += 1
    return k


# ------------------------------------------------------------ pad and flatten


@jit_inline
def pad_forward(x, width, border, out):
    """Copy x (N, C, H, S), valid width `width`, into the middle of out (N, C,
    H+2B, width+2B) and zero the border B around it (every element written)."""
    N, C, H, _ = x.shape
    for n in range(N):
        for c in range(C):
            y = out[n, c]
            for i in range(border):
                y[i, :] = 0
                y[H + border + i, :] = 0
            for i in range(H):
                row = y[border + i]
                row[:border] = 0
                copy_values(x[n, c, i, :width], row[border:border + width])
                row[border + width:] = 0


@jit_inline
def pad_backward(dout, width, border, dx):
    """dx (N, C, H, S) = the middle of dout (N, C, H+2B, width+2B); junk
    columns of dx (>= width) are zeroed."""
    N, C, H, _ = dx.shape
    for n in range(N):
        for c in range(C):
            for i in range(H):
                row = dx[n, c, i]
                copy_values(dout[n, c, border + i, border:border + width], row[:width])
                row[width:] = 0


@jit_inline
def flatten_forward(x, width, out):
    """out (N, C*H*width) = the valid columns of x (N, C, H, S), in C order."""
    N, C, H, _ = x.shape
    for n in range(N):
        y = out[n]
        for c in range(C):
            for i in range(H):
                base = (c * H + i) * width
                copy_values(x[n, c, i, :width], y[base:base + width])


@jit_inline
def flatten_backward(dout, width, dx):
    """dx (N, C, H, S) = dout (N, C*H*width) unflattened; junk columns zeroed."""
    N, C, H, _ = dx.shape
    for n in range(N):
        d = dout[n]
        for c in range(C):
            for i in range(H):
                base = (c * H + i) * width
                copy_values(d[base:base + width], dx[n, c, i, :width])
                dx[n, c, i, width:] = 0


@jit_inline
def _input_grad_head(t, d, w0, w1, w2, w3):
    """t[i] += sum_{k <= i} w_k d[i - k] for i < 4, where taps fall before d."""
    t[0] += w0 * d[0]
    t[1] += w0 * d[1] + w1 * d[0]
    t[2] += w0 * d[2] + w1 * d[1] + w2 * d[0]
    t[3] += w0 * d[3] + w1 * d[2] + w2 * d[1] + w3 * d[0]


@jit_inline
def _taps(w, o, c, kh):
    return w[o, c, kh, 0], w[o, c, kh, 1], w[o, c, kh, 2], w[o, c, kh, 3], w[o, c, kh, 4]


@jit_inline
def _add_taps(dw, o, c, kh, a0, a1, a2, a3, a4):
    dw[o, c, kh, 0] += a0
    dw[o, c, kh, 1] += a1
    dw[o, c, kh, 2] += a2
    dw[o, c, kh, 3] += a3
    dw[o, c, kh, 4] += a4


@jit_inline
def _sum(v):
    s = v.dtype.type(0)
    for i in range(v.size):
        s += v[i]
    return s


# ------------------------------------------------------------- 2x2 max-pool


@jit
def relu_maxpool2_forward(z, width, out, argmax):
    """ReLU of the 2x2 max-pool of a wide map (floor for odd sizes).

    z: (N, C, H*width) with row stride `width`; out: (N, C, H//2, W//2) for the
    valid width W <= width; argmax: int32, same shape as out, receives the flat
    index into the wide plane of each window's maximum (first one on ties), for
    the backward pass.
    """
    _maxpool2_forward(z, width, out, 0, argmax, True)


@jit
def maxpool2_forward(z, width, out, argmax):
    """relu_maxpool2_forward without the ReLU."""
    _maxpool2_forward(z, width, out, 0, argmax, False)


@jit_inline
def _maxpool2_forward(z, width, out, border, argmax, relu):
    # out: the whole output map, C-contiguous, with the pooled (PH, PW) =
    # argmax's shape inside a border of `border` pixels (the padding of a
    # "same" conv that follows: models.py fuses it into the pool). Rows of a
    # C-contiguous map and a window's maximum found by selects, not a loop
    # over candidates: LLVM vectorises the row (1.4-2.8x faster alone).
    N, C, PH, PW = argmax.shape
    for n in range(N):
        for c in range(C):
            plane = z[n, c]
            for i in range(PH):
                top = 2 * i * width
                r0 = plane[top:top + width]
                r1 = plane[top + width:top + 2 * width]
                o = out[n, c, border + i, border:border + PW]
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


@jit
def relu_maxpool2_backward(dout, out, argmax, dz):
    """Route pooled gradients back to the window maxima that were positive.

    dout, out, argmax: (N, C, PH, PW); dz: (N, C, H*width) wide, overwritten
    (zero everywhere else, junk columns included).
    """
    _maxpool2_backward(dout, out, argmax, dz, True)


@jit
def maxpool2_backward(dout, out, argmax, dz):
    """relu_maxpool2_backward without the ReLU: every window's maximum gets it."""
    _maxpool2_backward(dout, out, argmax, dz, False)


@jit_inline
def _maxpool2_backward(dout, out, argmax, dz, relu):
    N, C, PH, PW = dout.shape
    dz[:] = 0
    for n in range(N):
        for c in range(C):
            for i in range(PH):
                for j in range(PW):
                    if not relu or out[n, c, i, j] > 0:
                        dz[n, c, argmax[n, c, i, j]] = dout[n, c, i, j]


# --------------------------------------------------------------------- dense
#
# The forward and the weight gradient take eight rows of inputs and two
# output rows at a time: sixteen sums or FMAs per eight vector loads, and
# inputs in blocks of DENSE_BLOCK columns (8 rows: 16 KB) that stay in L1
# while every output row's block passes by. The input gradient keeps simpler
# loops (four weight rows a pass): the same scheme ran it 1.0-1.7x faster
# alone (0.7x with 10 outputs), but its op compiled in 1.7-1.9 s instead of
# 0.6-0.8 s, and it is a small part of every preset's step (mlp's first
# layer has none).
#
# BLAS (np.dot) only for the gradients from BLAS_MIN_ROWS rows. Single
# threaded, alone, loops vs BLAS in microseconds (one run on an AVX-512 core
# whose BLAS runs 256-bit code):
# - forward: faster at every size tried, 8-256 rows (3072 -> 128 at 8 rows:
#   45 vs 188; at 64: 292 vs 561; at 256: 1,861 vs 1,998), so never BLAS;
# - weight gradient: 42 vs 90 (3072 -> 128, 8 rows), 113 vs 148 (16 rows),
#   but 302 vs 269 at 32 rows and 3,160 vs 2,189 at 256;
# - input gradient (its four-row loops): 125 vs 240 (128 -> 4096, 8 rows),
#   247 vs 309 (16 rows), but 587 vs 471 at 32 rows (128 -> 128: 16 vs 15).
BLAS_MIN_ROWS = 32
DENSE_BLOCK = 512  # input columns per block of the dense loops


@jit_inline
def dense_forward(a, w, b, out):
    """out = a @ w.T + b.  a: (N, I); w: (O, I); b: (O,); out: (N, O).

    Each pass takes eight samples and two weight rows: sixteen sums in
    registers, each weight load shared by eight samples and each input load
    by two outputs. Where a group has fewer than eight samples it repeats its
    last (computed, not stored), and an odd last output is paired with itself
    (its sums stored once): one loop body for every shape. mlp's first layer
    at b = 8, alone: 45 us with one weight row a pass, 37 us now.
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
    sums land last. The weights are factors, not branches: numba's inlining
    pass took 0.6-1.0 s over the branches, 0.3 s now. The rows are written
    out rather than taken from the forward's _eight_rows, whose indices the
    coefficients need too: calling it compiled in 1.15-1.36 s against
    0.97-1.03 (this kernel alone). mlp's first layer at b = 8, alone:
    101-126 us with four samples and one row of dw a pass, 42-57 us now.
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


@jit_inline
def relu_inplace(z):
    """z = max(z, 0), any shape (flat view taken)."""
    f = z.reshape(z.size)
    for i in range(f.size):
        if f[i] < 0:
            f[i] = 0


@jit_inline
def relu_backward_inplace(dz, z):
    """dz *= (z > 0), where z holds the ReLU *output*; same shapes."""
    df = dz.reshape(dz.size)
    zf = z.reshape(z.size)
    for i in range(df.size):
        if zf[i] <= 0:
            df[i] = 0


# -------------------------------------------------------------------- loss


@jit_inline
def softmax_cross_entropy(logits, labels, dlogits, batch):
    """Softmax cross-entropy of N samples of a batch of `batch`, and its gradient.

    logits: (N, K); labels: (N,) ints in [0, K); dlogits: (N, K) overwritten
    with d(batch-mean loss)/d(logits). Returns these samples' share of the
    batch-mean loss (float64): their mean when N == batch.
    """
    N, K = logits.shape
    total = 0.0
    inv_n = logits.dtype.type(1.0 / batch)
    for n in range(N):
        z = logits[n]
        m = z[0]
        for k in range(1, K):
            m = max(m, z[k])
        s = z.dtype.type(0)
        for k in range(K):
            e = np.exp(z[k] - m)
            dlogits[n, k] = e
            s += e
        total += np.log(s) + m - z[labels[n]]
        inv_s = 1 / s
        for k in range(K):
            dlogits[n, k] *= inv_s * inv_n
        dlogits[n, labels[n]] -= inv_n
    return total / batch


@jit_inline
def argmax_rows(scores, out):
    """out[n] = index of the largest entry of scores[n] (first on ties)."""
    N, K = scores.shape
    for n in range(N):
        best = 0
        for k in range(1, K):
            if scores[n, k] > scores[n, best]:
                best = k
        out[n] = best


# ---------------------------------------------------------------- optimiser


@jit_inline
def sgd_momentum_update(params, velocity, grad, lr, momentum):
    """PyTorch-style heavy ball: v = momentum * v + grad; params -= lr * v."""
    mu = params.dtype.type(momentum)
    eta = params.dtype.type(lr)
    for i in range(params.size):
        v = mu * velocity[i] + grad[i]
        velocity[i] = v
        params[i] -= eta * v


@jit
def all_finite(values):
    """True if no entry of the 1-d array is NaN or infinite."""
    for i in range(values.size):  # noqa: SIM110 (numba compiles loops, not generators)
        if not np.isfinite(values[i]):
            return False
    return True


@jit
def mean_rows(rows, count, lo, hi, out):
    """out[j] = mean of rows[:count, lo + j] for j < hi - lo (out may be a
    slice of one of those rows: each column is read before it is written)."""
    inv = rows.dtype.type(1.0 / count)
    for j in range(hi - lo):
        s = rows.dtype.type(0)
        for k in range(count):
            s += rows[k, lo + j]
        out[j] = s * inv


# ---------------------------------------------- a cluster node's exchange


@jit
def difference(a, b, out):
    """out = a - b, elementwise ((P,) each): a node's accumulated update,
    its parameters minus those of its last pull."""
    for i in range(out.size):
        out[i] = a[i] - b[i]


@jit
def add_scaled(params, delta, scale):
    """params += scale * delta ((P,) each): the server applies a push (or a
    sync round's sum of pushes, scaled by 1 / pushes)."""
    s = params.dtype.type(scale)
    for i in range(params.size):
        params[i] += s * delta[i]


@jit
def rebase(params, base, delta, fresh):
    """params += fresh - (base + delta) ((P,) each): a node moves onto the
    parameters it just pulled and keeps the updates its threads applied
    since it pushed `delta` (taken as params - base). Written as one add
    per parameter, so it races with the threads' updates as Hogwild! does."""
    for i in range(params.size):
        params[i] += fresh[i] - base[i] - delta[i]


# ---------------------------------------------------------- whole network


@jit_inline
def gather_images(images, idx, scale, shift, x):
    """x[i] = images[idx[i]] * scale + shift, as float32 (the input transform).

    images: (M, D) uint8; idx: (N,) row indices; x: (N, D) float32.
    """
    a = np.float32(scale)
    c = np.float32(shift)
    D = images.shape[1]
    for i in range(idx.size):
        src = images[idx[i]]
        dst = x[i]
        for k in range(D):
            dst[k] = src[k] * a + c


@jit_inline
def copy_values(src, dst):
    """dst[i] = src[i] for the 1-D arrays' src.size elements. A loop, not slice
    assignment: numba compiles a shape-mismatch error path for every slice
    assignment (string formatting, ~2 s of compile time per caller's flags)."""
    for i in range(src.size):
        dst[i] = src[i]


@jit_inline
def affine_copy(src, scale, shift, dst):
    """dst = src * scale + shift elementwise (same size, any shapes)."""
    s = src.reshape(src.size)
    d = dst.reshape(dst.size)
    a = d.dtype.type(scale)
    c = d.dtype.type(shift)
    for i in range(s.size):
        d[i] = s[i] * a + c


# The ops of a plan row, one plain function each, all with the same
# signature (params, grad, plan, i, acts, dacts, argmax, n): the forward of
# row i, the gradient of its parameters ("weights"), the gradient of its
# input ("input"). iasgd.nn.ops compiles each as a C callback, only those a
# plan uses, and puts them in the table (Net.ops) that the network passes
# below call through the row's P_FWD, P_DW and P_DX indices. Called through
# a pointer, an op's code is compiled once: numba would otherwise re-optimise
# and re-emit every kernel in every function that calls it, at every level
# (most of a cold start's time), and compile every kernel any plan could use.
# The forward ops leave grad and dacts alone; n is the batch's sample count.


def nothing(params, grad, plan, i, acts, dacts, argmax, n):
    """A pass that has nothing to do (a row without weights; an input that
    needs no gradient)."""


def conv5_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    x, z, b = _conv_io(params, plan, i, acts, n)
    _conv5_forward(x, _conv_weights(params, row), b, z, row[P_W])


def conv3_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    x, z, b = _conv_io(params, plan, i, acts, n)
    _conv3_forward(x, _conv_weights(params, row), b, z, row[P_W])


def conv3_simd_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    x, z, b = _conv_io(params, plan, i, acts, n)
    conv3_forward_lanes(x, _conv_weights(params, row), b, z, row[P_W], acts[row[P_COFF]:])


def conv5_simd_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    x, z, b = _conv_io(params, plan, i, acts, n)
    conv5_forward_lanes(x, _conv_weights(params, row), b, z, row[P_W], acts[row[P_COFF]:])


def conv_gemm_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    x, z, b = _conv_io(params, plan, i, acts, n)
    CKK, OL = row[P_C] * row[P_K] * row[P_K], row[P_OH] * row[P_OS]
    conv_forward_gemm(x, _view2(params, row[P_WOFF], row[P_CO], CKK), b, z, row[P_W],
                      _view2(acts, row[P_COFF], CKK, OL))


def pad_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    pad_forward(_input4(acts, row, n), row[P_W], row[P_K], _output4(acts, row, n))


def relu_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    relu_inplace(acts[row[P_XOFF]:row[P_XOFF] + n * row[P_C] * row[P_H] * row[P_S]])


def pool_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    _maxpool2_forward(_view3(acts, row[P_XOFF], n, row[P_C], row[P_H] * row[P_S]), row[P_S],
                      _pool_map(acts, row, n), row[P_K], _argmax4(argmax, row, n),
                      row[P_RELU] != 0)


def flatten_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    flatten_forward(_input4(acts, row, n), row[P_W], _view2(acts, row[P_ZOFF], n, row[P_CO]))


def dense_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    z = _view2(acts, row[P_ZOFF], n, row[P_CO])
    dense_forward(_view2(acts, row[P_XOFF], n, row[P_C]), _dense_weights(params, row),
                  params[row[P_BOFF]:row[P_BOFF] + row[P_CO]], z)
    if row[P_RELU]:
        relu_inplace(z)


def conv5_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    x, dz, db = _conv_grads(grad, plan, i, acts, dacts, n)
    _conv5_backward_weights(x, dz, _conv_weights(grad, row), db, row[P_W])


def conv5_simd_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    x, dz, db = _conv_grads(grad, plan, i, acts, dacts, n)
    conv5_weights_lanes(x, dz, _conv_weights(grad, row), db, row[P_W], dacts[row[P_COFF]:])


def conv3_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    x, dz, db = _conv_grads(grad, plan, i, acts, dacts, n)
    _conv3_backward_weights(x, dz, _conv_weights(grad, row), db, row[P_W])


def conv_gemm_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    x, dz, db = _conv_grads(grad, plan, i, acts, dacts, n)
    CO, CKK = row[P_CO], row[P_C] * row[P_K] * row[P_K]
    conv_backward_weights_gemm(x, dz, _view2(grad, row[P_WOFF], CO, CKK), db, row[P_W],
                               _view2(acts, row[P_COFF], CKK, row[P_OH] * row[P_OS]),
                               _view2(dacts, row[P_COFF], CKK, CO),
                               _view2(dacts, row[P_COFF] + CKK * CO, CKK, CO))


def conv5_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    _conv5_backward_input(_conv_weights(params, row), _output_grad3(dacts, row, n),
                          _input4(dacts, row, n), row[P_W])


def conv3_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    _conv3_backward_input(_conv_weights(params, row), _output_grad3(dacts, row, n),
                          _input4(dacts, row, n), row[P_W])


def conv_gemm_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    CKK = row[P_C] * row[P_K] * row[P_K]
    conv_backward_input_gemm(_view2(params, row[P_WOFF], row[P_CO], CKK),
                             _output_grad3(dacts, row, n), _input4(dacts, row, n), row[P_W],
                             _view2(dacts, row[P_COFF], CKK, row[P_OH] * row[P_OS]))


def pad_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    pad_backward(_output4(dacts, row, n), row[P_W], row[P_K], _input4(dacts, row, n))


def relu_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    size = n * row[P_C] * row[P_H] * row[P_S]
    relu_backward_inplace(dacts[row[P_XOFF]:row[P_XOFF] + size],
                          acts[row[P_XOFF]:row[P_XOFF] + size])


def pool_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    _maxpool2_backward(_pooled(dacts, row, n), _pooled(acts, row, n), _argmax4(argmax, row, n),
                       _view3(dacts, row[P_XOFF], n, row[P_C], row[P_H] * row[P_S]),
                       row[P_RELU] != 0)


def flatten_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    flatten_backward(_view2(dacts, row[P_ZOFF], n, row[P_CO]), row[P_W],
                     _input4(dacts, row, n))


def dense_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    """Also takes the fused ReLU out of the output gradient, in place, so
    dense_input_op (which runs after it) sees the pre-activation's."""
    row = plan[i]
    dz = _view2(dacts, row[P_ZOFF], n, row[P_CO])
    if row[P_RELU]:
        relu_backward_inplace(dz, _view2(acts, row[P_ZOFF], n, row[P_CO]))
    dense_backward_weights(_view2(acts, row[P_XOFF], n, row[P_C]), dz,
                           _dense_weights(grad, row), grad[row[P_BOFF]:row[P_BOFF] + row[P_CO]])


def dense_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    dense_backward_input(_dense_weights(params, row), _view2(dacts, row[P_ZOFF], n, row[P_CO]),
                         _view2(dacts, row[P_XOFF], n, row[P_C]))


@jit_inline
def _conv_io(params, plan, i, acts, n):
    """A conv row's input (n, C, H, S), wide output (n, CO, OH*OS) and bias."""
    row = plan[i]
    return (_input4(acts, row, n), _view3(acts, row[P_ZOFF], n, row[P_CO], row[P_OH] * row[P_OS]),
            params[row[P_BOFF]:row[P_BOFF] + row[P_CO]])


@jit_inline
def _conv_grads(grad, plan, i, acts, dacts, n):
    """A conv row's input, output gradient and bias gradient."""
    row = plan[i]
    return (_input4(acts, row, n), _output_grad3(dacts, row, n),
            grad[row[P_BOFF]:row[P_BOFF] + row[P_CO]])


@jit_inline
def _conv_weights(flat, row):
    k = row[P_K]
    return _view4(flat, row[P_WOFF], row[P_CO], row[P_C], k, k)


@jit_inline
def _dense_weights(flat, row):
    return _view2(flat, row[P_WOFF], row[P_CO], row[P_C])


@jit_inline
def _input4(flat, row, n):
    return _view4(flat, row[P_XOFF], n, row[P_C], row[P_H], row[P_S])


@jit_inline
def _output4(flat, row, n):
    return _view4(flat, row[P_ZOFF], n, row[P_CO], row[P_OH], row[P_OS])


@jit_inline
def _output_grad3(flat, row, n):
    return _view3(flat, row[P_ZOFF], n, row[P_CO], row[P_OH] * row[P_OS])


@jit_inline
def _argmax4(argmax, row, n):
    return _view4(argmax, row[P_AOFF], n, row[P_CO], row[P_OH], row[P_OW])


@jit_inline
def network_forward(params, net, acts, argmax, n):
    """Forward pass of n <= net.slice_size samples whose input already sits in
    acts[: n * D].

    net: a Net (the plan table and its ops). Runs the plan's rows in order,
    writing every activation into `acts` (and pooling indices into `argmax`)
    at the plan's offsets; the logits are the last row's (a dense op's) output.
    """
    plan = net.plan
    for i in range(plan.shape[0]):  # forward ops touch neither grad nor dacts
        net.ops[plan[i, P_FWD]](params, acts, plan, i, acts, acts, argmax, n)


@jit_inline
def network_loss_and_grad(params, grad, net, acts, dacts, argmax, labels):
    """Mean loss of the batch whose input sits in acts; gradient into grad.

    Every entry of `grad` (same layout as params) is overwritten; `dacts`
    mirrors the layout of `acts` and receives the activation gradients.
    A batch larger than net.slice_size runs through the network in slices of
    net.slice_size samples, each moved to the front of the input first: the
    first slice's gradient goes into grad, every later one's into the
    partial gradient that follows the activation gradients in dacts
    (dacts[acts.size:], P floats) and is added to grad.
    """
    # Written out in one function: numba copies an inlined function's code
    # at every level it is inlined through. With a slice pass of its own
    # and helpers for the copy and the sum, train_steps compiled in 0.8 s
    # more than before slices (2.57 vs 1.76 s); written out, 0.3-0.5 s more.
    plan = net.plan
    n = labels.size
    last = plan[-1]
    D = plan[0, P_C] * plan[0, P_H] * plan[0, P_S]  # floats of one sample's input
    part = dacts[acts.size:acts.size + grad.size]
    loss = 0.0
    for start in range(0, n, net.slice_size):
        m = min(net.slice_size, n - start)
        if start > 0:
            for i in range(start * D, (start + m) * D):
                acts[i - start * D] = acts[i]
        into = grad if start == 0 else part
        network_forward(params, net, acts, argmax, m)
        logits = _view2(acts, last[P_ZOFF], m, last[P_CO])
        dlogits = _view2(dacts, last[P_ZOFF], m, last[P_CO])
        loss += softmax_cross_entropy(logits, labels[start:start + m], dlogits, n)
        for i in range(plan.shape[0] - 1, -1, -1):
            net.ops[plan[i, P_DW]](params, into, plan, i, acts, dacts, argmax, m)
            net.ops[plan[i, P_DX]](params, into, plan, i, acts, dacts, argmax, m)
        if start > 0:
            for i in range(grad.size):
                grad[i] += part[i]
    return loss


@jit
def train_steps(weights, buffers, data, steps, losses):
    """Run steps.count steps of sequential mini-batch SGD with momentum;
    returns the number of steps applied, fewer if a loss is not finite (that
    step's update is not applied: the run has diverged).

    Step s (from steps.first) trains on images[order[s*b : (s+1)*b]] (the
    last batch of an epoch may be shorter); losses[s] receives its loss. The
    bundles are described above (Weights, Buffers, Images, Steps).
    """
    params, velocity = weights.params, weights.velocity
    acts, bl_all = buffers.acts, buffers.batch_labels
    order, b = steps.order, steps.batch_size
    total = order.size
    D = data.images.shape[1]
    for s in range(steps.first, steps.first + steps.count):
        start = s * b
        n = min(b, total - start)
        idx = order[start:start + n]
        gather_images(data.images, idx, data.scale, data.shift, _view2(acts, 0, n, D))
        bl = bl_all[:n]
        for i in range(n):
            bl[i] = data.labels[idx[i]]
        losses[s] = network_loss_and_grad(params, buffers.grad, buffers.net, acts,
                                          buffers.dacts, buffers.argmax, bl)
        if not np.isfinite(losses[s]):
            return s - steps.first
        sgd_momentum_update(params, velocity, buffers.grad, steps.lr, steps.momentum)
    return steps.count


@jit
def predict_images(params, net, acts, argmax, images, scale, shift, out):
    """Predicted labels of all rows of images ((M, D) uint8, transformed to
    images * scale + shift) into out ((M,) int64), net.slice_size rows at a time."""
    M, D = images.shape
    last = net.plan[-1]
    for start in range(0, M, net.slice_size):
        n = min(net.slice_size, M - start)
        affine_copy(images[start:start + n], scale, shift, _view2(acts, 0, n, D))
        network_forward(params, net, acts, argmax, n)
        argmax_rows(_view2(acts, last[P_ZOFF], n, last[P_CO]), out[start:start + n])


@jit_inline
def _pool_map(flat, row, n):
    """A pool row's whole output map (n, CO, OH + 2K, OS): the pooled values
    inside a zero border of K pixels when it is the input of a "same" conv."""
    return _view4(flat, row[P_ZOFF], n, row[P_CO], row[P_OH] + 2 * row[P_K], row[P_OS])


@jit_inline
def _pooled(flat, row, n):
    """A pool row's (n, CO, OH, OW) output inside its map (_pool_map)."""
    B = row[P_K]
    return _pool_map(flat, row, n)[:, :, B:B + row[P_OH], B:B + row[P_OW]]


@jit_inline
def _view2(flat, off, a, b):
    return flat[off:off + a * b].reshape((a, b))


@jit_inline
def _view3(flat, off, a, b, c):
    return flat[off:off + a * b * c].reshape((a, b, c))


@jit_inline
def _view4(flat, off, a, b, c, d):
    return flat[off:off + a * b * c * d].reshape((a, b, c, d))
