""""Same" 3x3 convolutions by Winograd's minimal filtering F(2x2, 3x3), for
float32 maps on machines with AVX-512 (which convs: `usable`, and the conv
kind's PATH bits, iasgd.nn.layers.conv; measurements:
bench/results/conv-paths.md).

A 2x2 block of outputs of a 3x3 correlation takes 36 multiplications
directly; Winograd's algorithm gets it from the 4x4 block of input under it
with 16. The input tile d and each kernel g are transformed, V = B^T d B
and U = G g G^T (4x4 each); for each of the 16 positions the products are
summed over the input channels, M = sum_c U V, a matrix product (tiles x
input channels) times (input channels x output channels); and the sums are
transformed back, Y = A^T M A. 2.25x fewer multiply-adds than the direct
conv, for the transforms' adds and the memory of V and M (4x the input's
and the output's size); the rounding differs from the direct sum's by a
few units in the last place.

Channels go in the lanes throughout, so that every transform is whole
vectors of arithmetic: a sample's input is first copied channel-minor (16
channels by 16 pixels at a time, transposed in registers: simd.transpose),
the products keep two vectors of output channels by 8 tiles of sums in
registers (two loads and eight broadcasts per 16 multiply-adds, as the
direct conv's conv3_lanes), and the outputs are transposed back into
channel planes.

The input gradient of a same conv is a same conv (iasgd.nn.conv.vector):
of the output gradient, with the weights flipped and their channel axes
swapped, which the weight transform does as it reads them.
"""

from __future__ import annotations

import numpy as np

from iasgd.compiled import jit_inline
from iasgd.nn import simd
from iasgd.nn.conv import vector

GROUP = 2 * simd.LANES  # output channels of a block of sums: two vectors
TILES = 8  # tiles of a block of sums
POSITIONS = 16  # entries of a transformed 4x4 tile


@jit_inline
def usable(C, O, OH, OW):
    """Whether a same conv from C to O channels with OH x OW outputs runs
    here: even sizes, a sample's tiles in whole blocks of TILES, the input
    channels in whole vectors, the output channels in whole GROUPs."""
    return (OH > 0 and OW > 0 and OH % 2 == 0 and OW % 2 == 0
            and (OH // 2) * (OW // 2) % TILES == 0
            and C % simd.LANES == 0 and O % GROUP == 0)


@jit_inline
def chunk_samples(C, T):
    """Samples whose tiles one pass of the products takes: as many as keep
    their transformed input V (16 x tiles x C floats) within about 256 KB
    (of a 1 MB L2, beside U and the sums), at least one."""
    return max(1, 65536 // (POSITIONS * T * C))


@jit_inline
def position_stride(floats):
    """Floats from one position's part of U, V or M to the next: `floats`
    and a cache line more, so that the 16 are not 16 lines of the same L1
    set (at strides of 4 KB multiples they were, and the transforms ran at
    a third of their speed)."""
    return floats + simd.LANES


def scratch_floats(c: int, out: int, out_height: int, out_width: int, stride: int) -> int:
    """Floats of scratch conv3_winograd takes for a conv from c to `out`
    channels whose output rows lie `stride` apart: U, the kernels
    reordered, one sample's padded input, and a chunk of samples' V, sums
    M of one group of output channels, and outputs; and a 16 x 16 tile. 0
    where it does not run (usable)."""
    if not usable.py_func(c, out, out_height, out_width):
        return 0
    tiles = (out_height // 2) * (out_width // 2)
    k = chunk_samples.py_func(c, tiles)
    padded = (out_height + 2) * (out_width + 2) * c
    positions = -(-out_height * stride // simd.LANES) * simd.LANES
    lines = POSITIONS * simd.LANES  # U's, V's and M's position strides' extra lines
    return (POSITIONS * c * out + 9 * c * out + padded + 3 * lines
            + k * (POSITIONS * tiles * (c + GROUP) + positions * out) + simd.LANES ** 2)


@jit_inline
def conv3_winograd(src, src_at, src_stride, w, flipped, b, dst, dst_at, dst_stride, OH, OW,
                   scratch):
    """A "same" 3x3 conv of float32 maps by F(2x2, 3x3), with
    vector.conv3_same_simd's contract for its maps: src (N, C, plane), sample
    n's channel c pixel (i, j) at src[n, c, src_at + i*src_stride + j];
    dst (N, O, plane), output pixel (i, j) written to dst[n, o, dst_at +
    i*dst_stride + j], nothing else written. The kernels: w (O, C, 3, 3),
    or where `flipped` w (C, O, 3, 3) flipped in both directions with its
    channel axes swapped (the input gradient's conv); b (O,). scratch:
    scratch_floats(C, O, OH, OW, dst_stride) floats. Needs usable(C, O, OH, OW)."""
    N, C = src.shape[0], src.shape[1]
    O = b.size
    L = simd.LANES
    T = (OH // 2) * (OW // 2)  # tiles of a sample
    K = chunk_samples(C, T)
    PH, PW = OH + 2, OW + 2
    us = position_stride(C * O)
    vs = position_stride(K * T * C)
    ms = position_stride(K * T * GROUP)
    a = POSITIONS * us
    U = scratch[:a]
    taps = scratch[a:a + 9 * C * O]
    a += 9 * C * O
    padded = scratch[a:a + PH * PW * C]
    a += PH * PW * C
    V = scratch[a:a + POSITIONS * vs]
    a += POSITIONS * vs
    M = scratch[a:a + POSITIONS * ms]
    a += POSITIONS * ms
    YP = (OH * dst_stride + L - 1) // L * L  # positions of a sample's outputs
    Y = scratch[a:a + K * YP * O]
    tile = scratch[scratch.size - L * L:]
    _transform_weights(w, flipped, taps, U, C, O, us)
    padded[:] = 0  # its border stays zero
    planes = src.reshape(src.size)
    for n0 in range(0, N, K):
        k = min(K, N - n0)
        for s in range(k):
            _channels_minor(planes, (n0 + s) * src.shape[1] * src.shape[2] + src_at,
                            src.shape[2], src_stride, C, OH, OW, padded, PW, tile)
            _input_transform(padded, C, PW, OH // 2, OW // 2, V, s * T, vs)
        # a group of output channels at a time: its sums, then its outputs
        for o in range(0, O, GROUP):
            _products(U, V, M, C, O, us, vs, ms, k * T, o)
            for s in range(k):
                _output_transform(M, b, O, ms, s * T, o, OH // 2, OW // 2, dst_stride,
                                  Y[s * YP * O:(s + 1) * YP * O])
        for s in range(k):
            _channel_planes(Y[s * YP * O:(s + 1) * YP * O], O, OH, dst_stride, OW,
                            dst[n0 + s].reshape(dst.shape[1] * dst.shape[2]), dst.shape[2],
                            dst_at, tile)


@jit_inline
def _transform_weights(w, flipped, taps, U, C, O, step):
    """U[k, c, o] = (G g G^T)[k] of the kernel g from input channel c to
    output channel o, (16, C, O); the kernels first reordered taps[c, tap,
    o] (9, C, O) so that 16 output channels are one vector. G = [[1, 0,
    0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]."""
    L = simd.LANES
    vector._reordered_taps(w, O, taps, flipped)  # one group of all O channels: (C, 9, O)
    half = simd.splat(np.float32(0.5))
    for c in range(C):
        for o in range(0, O, L):
            at = (c * 9) * O + o
            g0, g1, g2 = (simd.load(taps, at), simd.load(taps, at + O),
                          simd.load(taps, at + 2 * O))
            g3, g4, g5 = (simd.load(taps, at + 3 * O), simd.load(taps, at + 4 * O),
                          simd.load(taps, at + 5 * O))
            g6, g7, g8 = (simd.load(taps, at + 6 * O), simd.load(taps, at + 7 * O),
                          simd.load(taps, at + 8 * O))
            u = c * O + o
            # G g: four rows of three, each row times G^T
            _times_gt(U, u, step, 0, g0, g1, g2, half)
            _times_gt(U, u, step, 4, _half_sum(g0, g3, g6, half), _half_sum(g1, g4, g7, half),
                      _half_sum(g2, g5, g8, half), half)
            _times_gt(U, u, step, 8, _half_diff(g0, g3, g6, half),
                      _half_diff(g1, g4, g7, half), _half_diff(g2, g5, g8, half), half)
            _times_gt(U, u, step, 12, g6, g7, g8, half)


@jit_inline
def _half_sum(a, b, c, half):
    """(a + b + c) / 2."""
    return simd.mul(simd.add(simd.add(a, b), c), half)


@jit_inline
def _half_diff(a, b, c, half):
    """(a - b + c) / 2."""
    return simd.mul(simd.add(simd.sub(a, b), c), half)


@jit_inline
def _times_gt(U, u, step, k, h0, h1, h2, half):
    """A row (h0, h1, h2) of G g times G^T: positions k..k+3 of U."""
    simd.store(U, u + k * step, h0)
    simd.store(U, u + (k + 1) * step, _half_sum(h0, h1, h2, half))
    simd.store(U, u + (k + 2) * step, _half_diff(h0, h1, h2, half))
    simd.store(U, u + (k + 3) * step, h2)


@jit_inline
def _channels_minor(planes, at, plane, stride, C, OH, OW, padded, PW, tile):
    """One sample's C input maps, pixel (i, j) of channel c at planes[at +
    c*plane + i*stride + j], into padded (OH + 2, PW, C) at row i + 1,
    column j + 1 (the border is left as it is): 16 channels by up to 16
    pixels of a row at a time, transposed in registers; a block short of
    16 pixels through tile, unless its 16 would run past the planes' end."""
    L = simd.LANES
    for c in range(0, C, L):
        for i in range(OH):
            src = at + c * plane + i * stride
            for j in range(0, OW, L):
                dst = ((i + 1) * PW + j + 1) * C + c
                m = min(L, OW - j)
                if m == L:
                    simd.transpose(planes, src + j, plane, padded, dst, C)
                elif src + j + (L - 1) * plane + L <= planes.size:
                    simd.transpose(planes, src + j, plane, tile, 0, L)
                    for p in range(m):
                        simd.store(padded, dst + p * C, simd.load(tile, p * L))
                else:
                    for r in range(L):
                        for p in range(m):
                            padded[dst + p * C + r] = planes[src + r * plane + j + p]


@jit_inline
def _input_transform(padded, C, PW, TH, TW, V, first, step):
    """V[k, first + t, c] = (B^T d B)[k] of tile t = ty*TW + tx, d the 4x4
    block of the padded input (PH, PW, C) from (2ty, 2tx); V (16, T, C).
    B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]."""
    L = simd.LANES
    for ty in range(TH):
        for tx in range(TW):
            v = (first + ty * TW + tx) * C
            for c in range(0, C, L):
                r0 = (2 * ty * PW + 2 * tx) * C + c
                r1, r2, r3 = r0 + PW * C, r0 + 2 * PW * C, r0 + 3 * PW * C
                # B^T d, column by column: four rows of four
                a0, a1, a2, a3 = _bt_column(padded, r0, r1, r2, r3)
                b0, b1, b2, b3 = _bt_column(padded, r0 + C, r1 + C, r2 + C, r3 + C)
                e0, e1, e2, e3 = _bt_column(padded, r0 + 2 * C, r1 + 2 * C, r2 + 2 * C,
                                            r3 + 2 * C)
                f0, f1, f2, f3 = _bt_column(padded, r0 + 3 * C, r1 + 3 * C, r2 + 3 * C,
                                            r3 + 3 * C)
                # each row times B
                _times_b(V, v + c, step, 0, a0, b0, e0, f0)
                _times_b(V, v + c, step, 4, a1, b1, e1, f1)
                _times_b(V, v + c, step, 8, a2, b2, e2, f2)
                _times_b(V, v + c, step, 12, a3, b3, e3, f3)


@jit_inline
def _bt_column(x, p0, p1, p2, p3):
    """B^T times a column (x[p0], x[p1], x[p2], x[p3]) of vectors."""
    d0, d1, d2, d3 = simd.load(x, p0), simd.load(x, p1), simd.load(x, p2), simd.load(x, p3)
    return simd.sub(d0, d2), simd.add(d1, d2), simd.sub(d2, d1), simd.sub(d1, d3)


@jit_inline
def _times_b(V, v, step, k, t0, t1, t2, t3):
    """A row (t0, t1, t2, t3) of B^T d times B: positions k..k+3 of V."""
    simd.store(V, v + k * step, simd.sub(t0, t2))
    simd.store(V, v + (k + 1) * step, simd.add(t1, t2))
    simd.store(V, v + (k + 2) * step, simd.sub(t2, t1))
    simd.store(V, v + (k + 3) * step, simd.sub(t1, t3))


@jit_inline
def _products(U, V, M, C, O, us, vs, ms, used, o):
    """M[k, t, :] = sum over c of V[k, t, c] U[k, c, o:o + GROUP] for each
    position k and tile t < used; V (16, T, C), M (16, T, GROUP). In
    explicit vectors: the group's two vectors of output channels by TILES
    tiles of sums in registers through the C input channels."""
    L = simd.LANES
    for k in range(POSITIONS):
        u0, v0, m0 = k * us + o, k * vs, k * ms
        for t in range(0, used, TILES):
            a0 = b0 = a1 = b1 = a2 = b2 = a3 = b3 = simd.splat(np.float32(0))
            a4 = b4 = a5 = b5 = a6 = b6 = a7 = b7 = a0
            v = v0 + t * C
            for c in range(C):
                lo = simd.load(U, u0 + c * O)
                hi = simd.load(U, u0 + c * O + L)
                a0, b0 = _fma2(V, v + c, lo, hi, a0, b0)
                a1, b1 = _fma2(V, v + C + c, lo, hi, a1, b1)
                a2, b2 = _fma2(V, v + 2 * C + c, lo, hi, a2, b2)
                a3, b3 = _fma2(V, v + 3 * C + c, lo, hi, a3, b3)
                a4, b4 = _fma2(V, v + 4 * C + c, lo, hi, a4, b4)
                a5, b5 = _fma2(V, v + 5 * C + c, lo, hi, a5, b5)
                a6, b6 = _fma2(V, v + 6 * C + c, lo, hi, a6, b6)
                a7, b7 = _fma2(V, v + 7 * C + c, lo, hi, a7, b7)
            m = m0 + t * GROUP
            _store2(M, m, a0, b0)
            _store2(M, m + GROUP, a1, b1)
            _store2(M, m + 2 * GROUP, a2, b2)
            _store2(M, m + 3 * GROUP, a3, b3)
            _store2(M, m + 4 * GROUP, a4, b4)
            _store2(M, m + 5 * GROUP, a5, b5)
            _store2(M, m + 6 * GROUP, a6, b6)
            _store2(M, m + 7 * GROUP, a7, b7)


@jit_inline
def _fma2(V, at, lo, hi, a, b):
    """One tile's two vectors of sums after one more input channel: V[at]
    broadcast times the channel's two vectors of transformed weights."""
    x = simd.splat_at(V, at)
    return simd.fma(lo, x, a), simd.fma(hi, x, b)


@jit_inline
def _store2(M, at, a, b):
    simd.store(M, at, a)
    simd.store(M, at + simd.LANES, b)


@jit_inline
def _output_transform(M, b, O, step, first, o0, TH, TW, stride, Y):
    """Y[i*stride + j, o0:o0 + GROUP] = (A^T m A) + b of the sums m = M[:,
    first + t, :] of one sample's tiles t (M (16, T, GROUP): one group's),
    (i, j) the output pixel; Y (positions, O). A^T = [[1, 1, 1, 0], [0, 1,
    -1, -1]]."""
    L = simd.LANES
    for t in range(TH * TW):
        ty = t // TW  # (once a tile)
        tx = t - ty * TW
        top = (2 * ty * stride + 2 * tx) * O + o0
        bot = top + stride * O
        for h in range(0, GROUP, L):
            m = (first + t) * GROUP + h
            bias = simd.load(b, o0 + h)
            # A^T m: two rows of four, column by column
            p0, q0 = _at_column(M, m, step, 0)
            p1, q1 = _at_column(M, m, step, 1)
            p2, q2 = _at_column(M, m, step, 2)
            p3, q3 = _at_column(M, m, step, 3)
            # each row times A
            simd.store(Y, top + h, simd.add(simd.add(simd.add(p0, p1), p2), bias))
            simd.store(Y, top + O + h, simd.add(simd.sub(simd.sub(p1, p2), p3), bias))
            simd.store(Y, bot + h, simd.add(simd.add(simd.add(q0, q1), q2), bias))
            simd.store(Y, bot + O + h, simd.add(simd.sub(simd.sub(q1, q2), q3), bias))


@jit_inline
def _at_column(M, m, step, j):
    """A^T times column j of a tile's sums (positions j, 4 + j, 8 + j, 12 + j)."""
    m0 = simd.load(M, m + j * step)
    m1 = simd.load(M, m + (4 + j) * step)
    m2 = simd.load(M, m + (8 + j) * step)
    m3 = simd.load(M, m + (12 + j) * step)
    return simd.add(simd.add(m0, m1), m2), simd.sub(simd.sub(m1, m2), m3)


@jit_inline
def _channel_planes(Y, O, rows, stride, width, out, plane, at, tile):
    """Y (rows*stride rounded up to 16, O) channel-minor, pixel (i, j) at
    position i*stride + j, into out's planes: channel o's to out[o*plane + at
    + i*stride + j] for i < rows, j < width, nothing else written; 16
    positions by 16 channels at a time, transposed in registers, the
    positions past a row's width masked off."""
    L = simd.LANES
    for q in range(0, rows * stride, L):
        bits = 0
        for lane in range(L):
            if (q + lane) % stride < width and q + lane < rows * stride:
                bits |= 1 << lane
        if bits == 0:
            continue
        for o in range(0, O, L):
            if bits == (1 << L) - 1:
                simd.transpose(Y, q * O + o, O, out, o * plane + at + q, plane)
                continue
            simd.transpose(Y, q * O + o, O, tile, 0, L)
            for r in range(L):
                simd.store_masked(out, (o + r) * plane + at + q, simd.load(tile, r * L), bits)
