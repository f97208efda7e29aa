"""Convolution passes in explicit vectors of 16 float32 lanes (iasgd.nn.simd),
for float32 maps on machines with AVX-512 (which convs: the conv kind's
PATH bits, iasgd.nn.layers.conv; measurements: bench/results/conv-paths.md).

Each `*_lanes` entry takes the weights in PyTorch's order and runs the
direct kernel instead on other dtypes (the tests' float64 finite
differences), which the vectors do not take.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from iasgd.compiled import jit_inline
from iasgd.nn import simd
from iasgd.nn.conv.direct import (
    conv3_backward_input,
    conv3_backward_weights,
    conv3_forward,
    conv5_backward_weights,
    conv5_forward,
)
from iasgd.nn.plan import copy_values, total

SIMD_BLOCK = 10  # output pixels per block of conv5_forward_simd
SIMD3_CHANNELS = 8  # output channels per block of conv3_forward_simd


# ------------------------------------------------- explicit-vector forward
#
# The direct forward runs each kernel row over the whole wide plane with its
# sums in memory: on LeNet-5's 14 x 14 planes that is 136 positions per
# loop. With the output channels in the 16 lanes of a vector
# (iasgd.nn.simd), a block of SIMD_BLOCK output pixels keeps one accumulator
# vector per pixel in registers through all C*k*k taps: each tap loads one
# vector of weights and multiplies it into every pixel's accumulator with
# that pixel's input value broadcast (about 2.5x the direct kernel's speed
# on LeNet-5's 6 -> 16 conv: bench/results/conv-paths.md).


@jit_inline
def conv5_forward_simd(x, wt, b, out, width, block):
    """conv_forward of a 5x5 kernel on float32 maps by explicit vectors, 16
    output channels at a time.

    x: (N, C, H, S); wt: (C*25*O,) the weights ordered (O/16, C, 5, 5, 16):
    each group of 16 output channels' taps together, so that a group's
    weights stay in L1; O a multiple of 16; b: (O,); out: (N, O, OH*S) wide;
    block: (SIMD_BLOCK*16,) scratch. Needs OW = width-4 >= SIMD_BLOCK: a
    row's last block is moved back to end at OW (its first pixels are
    computed twice, alike). k is a constant: LLVM unrolls the taps, which
    it cannot over a k it does not know (3x3: conv3_forward_simd).
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
        return lambda x, w, b, out, width, scratch: conv5_forward(x, w, b, out, width)

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
    return _reordered_taps(w, G, scratch, False)


@jit_inline
def _reordered_taps(w, G, scratch, flipped):
    """_grouped_taps's order of the weights w (O, C, k, k), or where
    `flipped` of the weights flipped in both directions and transposed,
    w'[c, o, a, b] = w[o, c, k-1-a, k-1-b] (the input gradient's conv),
    reordered (C/G, O, k, k, G); into the start of scratch, and that view.
    (Not of a transposed view: numba's transpose allocates, on every step.)"""
    O, C, k, _ = w.shape
    A, B = (C, O) if flipped else (O, C)
    wt = scratch[:C * k * k * O]
    for a in range(A):
        r = (a - a % G) * B * k * k + a % G
        for b in range(B):
            for kh in range(k):
                for kw in range(k):
                    if flipped:
                        wt[r] = w[b, a, k - 1 - kh, k - 1 - kw]
                    else:
                        wt[r] = w[a, b, kh, kw]
                    r += G
    return wt


# ------------------------------------------------- explicit-vector 3x3 forward
#
# The direct 3x3 forward keeps its sums in memory: each vector of pixels
# loads and stores four channels' sums for 12 FMAs. Here the lanes are 16
# output pixels of a row, and a block of SIMD3_CHANNELS output channels times
# two rows keeps its 16 sums in registers through all C*9 taps: each tap
# loads two input rows and broadcasts 8 weights for 16 FMAs, and the sums are
# stored once, straight into the output rows (about 2x the direct kernel's
# speed on vgg-small's convs: bench/results/conv-paths.md).


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
    xf = x.reshape((N, C * H * S))
    for n in range(N):
        conv3_lanes(xf[n], C, H, S, wt, b, out[n], 0, S, H - 2, width - 2)


@jit_inline
def conv3_lanes(xs, C, H, S, wt, b, on, start, T, OH, OW):
    """One sample's 3x3 conv by conv3_forward_simd's scheme: the input xs
    (C*H*S,) flat, C planes of H rows of stride S; wt as conv3_forward_simd's
    for O = b.size output channels; output pixel (i, j), i < OH, j < OW, of
    channel o written to on[o, start + i*T + j] (on: (O, >= start + OH*T)).
    Needs OW >= 16 and OH >= 2."""
    O = b.size
    L = simd.LANES
    G = SIMD3_CHANNELS
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
                        p0, q0 = _fma_rows(wt, t, top, bot, p0, q0)
                        p1, q1 = _fma_rows(wt, t + 1, top, bot, p1, q1)
                        p2, q2 = _fma_rows(wt, t + 2, top, bot, p2, q2)
                        p3, q3 = _fma_rows(wt, t + 3, top, bot, p3, q3)
                        p4, q4 = _fma_rows(wt, t + 4, top, bot, p4, q4)
                        p5, q5 = _fma_rows(wt, t + 5, top, bot, p5, q5)
                        p6, q6 = _fma_rows(wt, t + 6, top, bot, p6, q6)
                        p7, q7 = _fma_rows(wt, t + 7, top, bot, p7, q7)
                a = start + i * T + j
                _store_rows(o0, a, T, p0, q0)
                _store_rows(o1, a, T, p1, q1)
                _store_rows(o2, a, T, p2, q2)
                _store_rows(o3, a, T, p3, q3)
                _store_rows(o4, a, T, p4, q4)
                _store_rows(o5, a, T, p5, q5)
                _store_rows(o6, a, T, p6, q6)
                _store_rows(o7, a, T, p7, q7)


@jit_inline
def _fma_rows(wt, t, top, bot, p, q):
    """One output channel's sums of two output rows, p and q, after tap t:
    its weight wt[t] broadcast times the two input rows `top` and `bot`."""
    w = simd.splat_at(wt, t)
    return simd.fma(w, top, p), simd.fma(w, bot, q)


@jit_inline
def _store_rows(o, a, S, p, q):
    """The sums p and q of two output rows into the plane o, at a and a + S."""
    simd.store(o, a, p)
    simd.store(o, a + S, q)


def conv3_forward_lanes(x, w, b, out, width, scratch):
    """conv3_forward_simd on float32 maps, the weights w (O, C, 3, 3) first
    reordered into scratch (C*9*O floats); the direct kernel on other
    dtypes (the tests' float64 finite differences)."""


@overload(conv3_forward_lanes, jit_options={"fastmath": True})
def _conv3_forward_lanes(x, w, b, out, width, scratch):
    if x.dtype != types.float32:
        return lambda x, w, b, out, width, scratch: conv3_forward(x, w, b, out, width)

    def lanes(x, w, b, out, width, scratch):
        conv3_forward_simd(x, _grouped_taps(w, SIMD3_CHANNELS, scratch), b, out, width)
    return lanes


# ------------------------------------------- "same" 3x3 convs side by side
#
# conv3_lanes needs rows of 16 output pixels or more. A "same" 3x3 conv reads
# zeros around its map, so its map can be copied anywhere with zeros put
# around it: P samples' rows side by side, one zero column between each two
# (it is the right border of one and the left of the next), make one wide
# map whose valid conv holds every sample's output. On vgg-bn's 8 x 8 maps
# nine samples make rows of 80 outputs (72 of them the samples' pixels) for
# five vectors of 16 lanes. With a wide map P is 1 and the copy only pads.
#
# The input gradient of a "same" 3x3 conv is a "same" 3x3 conv itself: of the
# output gradient, with the weights flipped in both directions and their two
# channel axes swapped. It is run this way too, and writes the gradient of
# the input's interior only: a same conv's input border is padding, and the
# row that wrote it (a pad row, a pool) reads its gradient's interior only.
# Measurements: bench/results/conv-paths.md.


@jit_inline
def side_by_side(width):
    """How many samples of `width` output columns conv3_same_simd puts side
    by side: 1 from a vector's width on; else the count of at most 16 whose
    rows waste the fewest lanes, with at least a vector's width of outputs."""
    L = simd.LANES
    if width >= L:
        return 1
    best, kept = 0, 0.0
    for p in range(1, 17):
        outputs = p * (width + 1) - 1
        if outputs >= L:
            used = p * width / (L * ((outputs + L - 1) // L))
            if used >= kept:
                best, kept = p, used
    return best


@jit_inline
def conv3_same_simd(src, src_at, src_stride, wt, b, dst, dst_at, dst_stride, OH, OW, packed,
                    sums):
    """A "same" 3x3 conv of float32 maps by conv3_lanes, side_by_side(OW)
    samples at a time.

    src: (N, C, plane) the input maps, sample n's channel c pixel (i, j) at
    src[n, c, src_at + i*src_stride + j] (i < OH, j < OW); wt: as
    conv3_lanes's for O = b.size output channels (C*9*O,); dst: (N, O,
    plane), output pixel (i, j) written to dst[n, o, dst_at + i*dst_stride +
    j], nothing else written; packed: (C * (OH+2) * T,) scratch, T = P*(OW+1)
    + 1 with P = side_by_side(OW); sums: (O * OH * T,) scratch where P > 1.
    Needs OH >= 2.
    """
    N, C = src.shape[0], src.shape[1]
    O = b.size
    P = side_by_side(OW)
    T = P * (OW + 1) + 1
    planes = packed[:C * (OH + 2) * T].reshape((C, OH + 2, T))
    planes[:] = 0  # the zero border and columns between samples stay zero
    wide = OH * T if P > 1 else 0  # (no sums needed alone)
    outputs = sums[:O * wide].reshape((O, wide))
    for n0 in range(0, N, P):
        # (a last group of fewer samples leaves the others' maps in the rest:
        # the zero columns between keep them out of its outputs)
        for s in range(min(P, N - n0)):
            at = 1 + s * (OW + 1)
            for c in range(C):
                for i in range(OH):
                    a = src_at + i * src_stride
                    copy_values(src[n0 + s, c, a:a + OW], planes[c, i + 1, at:at + OW])
        if P == 1:
            conv3_lanes(packed, C, OH + 2, T, wt, b, dst[n0], dst_at, dst_stride, OH, OW)
            continue
        conv3_lanes(packed, C, OH + 2, T, wt, b, outputs, 0, T, OH, P * (OW + 1) - 1)
        for s in range(min(P, N - n0)):
            for o in range(O):
                for i in range(OH):
                    a = i * T + s * (OW + 1)
                    d = dst_at + i * dst_stride
                    copy_values(outputs[o, a:a + OW], dst[n0 + s, o, d:d + OW])


def same_scratch_floats(c: int, out: int, out_height: int, out_width: int) -> int:
    """Floats of scratch conv3_same_simd takes for a conv from c to `out`
    channels with out_height x out_width outputs (packed and sums)."""
    P = side_by_side.py_func(out_width)
    T = P * (out_width + 1) + 1
    return c * (out_height + 2) * T + (out * out_height * T if P > 1 else 0)


def conv3_same_forward_lanes(x, w, b, out, width, scratch):
    """The forward of a "same" 3x3 conv by conv3_same_simd on float32 maps,
    x (N, C, H, S) the padded input of valid width `width`, out (N, O, OH*S)
    wide (its valid columns written), the weights w (O, C, 3, 3) first
    reordered into scratch (C*9*O floats, then same_scratch_floats's); the
    direct kernel on other dtypes."""


@overload(conv3_same_forward_lanes, jit_options={"fastmath": True})
def _conv3_same_forward_lanes(x, w, b, out, width, scratch):
    if x.dtype != types.float32:
        return lambda x, w, b, out, width, scratch: conv3_forward(x, w, b, out, width)

    def lanes(x, w, b, out, width, scratch):
        N, C, H, S = x.shape
        wt = _grouped_taps(w, SIMD3_CHANNELS, scratch)
        rest = scratch[wt.size:]
        packed, sums = _packing(rest, C, b.size, H - 2, width - 2)
        conv3_same_simd(x.reshape((N, C, H * S)), S + 1, S, wt, b, out, 0, S, H - 2,
                        width - 2, packed, sums)
    return lanes


@jit_inline
def _packing(scratch, C, O, OH, OW):
    """conv3_same_simd's packed and sums scratch, from the start of scratch."""
    T = side_by_side(OW) * (OW + 1) + 1
    size = C * (OH + 2) * T
    return scratch[:size], scratch[size:size + O * OH * T]


def conv3_input_lanes(w, dout, dx, width, scratch):
    """The input gradient of a "same" 3x3 conv by conv3_same_simd on float32
    maps, the interior of dx (N, C, H, S) only (rows 1..H-2, columns
    1..width-2; the border and junk columns not written), from dout (N, O,
    OH*S) wide; the weights w (O, C, 3, 3) first flipped and reordered into
    scratch (C*9*O floats, then C zeros and same_scratch_floats(O, C, ...));
    the direct kernel on other dtypes (the tests' float64 finite
    differences), which writes all of dx."""


@overload(conv3_input_lanes, jit_options={"fastmath": True})
def _conv3_input_lanes(w, dout, dx, width, scratch):
    if dx.dtype != types.float32:
        return lambda w, dout, dx, width, scratch: conv3_backward_input(w, dout, dx, width)

    def lanes(w, dout, dx, width, scratch):
        N, C, H, S = dx.shape
        O = w.shape[0]
        wt = _reordered_taps(w, SIMD3_CHANNELS, scratch, True)
        zeros = scratch[wt.size:wt.size + C]
        zeros[:] = 0
        packed, sums = _packing(scratch[wt.size + C:], O, C, H - 2, width - 2)
        conv3_same_simd(dout, 0, S, wt, zeros, dx.reshape((N, C, H * S)), S + 1, S, H - 2,
                        width - 2, packed, sums)
    return lanes


def same_forward_scratch_floats(c: int, out: int, out_height: int, out_width: int) -> int:
    """Floats of scratch conv3_same_forward_lanes takes."""
    return c * 9 * out + same_scratch_floats(c, out, out_height, out_width)


def input_scratch_floats(c: int, out: int, out_height: int, out_width: int) -> int:
    """Floats of scratch conv3_input_lanes takes for a conv from c to `out`
    channels with out_height x out_width outputs."""
    return c * 9 * out + c + same_scratch_floats(out, c, out_height, out_width)


# The weight gradient sums, for each of the C*25 taps, one product per
# output pixel and sample. With 16 output channels in the lanes, a sample's
# output gradient is first copied position-major (one vector per pixel), and
# each kernel row's 5 taps keep two vectors of sums each in registers through
# all the row's pixels: one vector load and 10 multiply-adds per two pixels.
# The input values are broadcast by simd.splat_at: with splat(xs[p]), numba's
# check for a negative index cost half the speed (the weight gradient's
# measurements: bench/results/conv-paths.md).


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
            db[o] += total(dout[n, o, :(OH - 1) * S + OW])
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
                        a0, a1, a2, a3, a4 = _row_taps(e, xs, p, a0, a1, a2, a3, a4)
                        b0, b1, b2, b3, b4 = _row_taps(f, xs, p + 1, b0, b1, b2, b3, b4)
                    if OW % 2 == 1:
                        e = simd.load(lanes, q + (OW - 1) * L)
                        a0, a1, a2, a3, a4 = _row_taps(e, xs, r + OW - 1, a0, a1, a2, a3, a4)
                simd.store(sums, t, simd.add(a0, b0))
                simd.store(sums, t + L, simd.add(a1, b1))
                simd.store(sums, t + 2 * L, simd.add(a2, b2))
                simd.store(sums, t + 3 * L, simd.add(a3, b3))
                simd.store(sums, t + 4 * L, simd.add(a4, b4))
        taps = dw.reshape((O, C * 25))
        for t in range(C * 25):  # tap-major sums -> dw
            for o in range(L):
                taps[ob + o, t] = sums[t * L + o]


@jit_inline
def _row_taps(e, xs, p, a0, a1, a2, a3, a4):
    """A kernel row's five tap sums after one more output pixel: its
    gradient e (a vector of channels) times each tap's input value, xs[p]
    to xs[p + 4] broadcast."""
    return (simd.fma(e, simd.splat_at(xs, p), a0), simd.fma(e, simd.splat_at(xs, p + 1), a1),
            simd.fma(e, simd.splat_at(xs, p + 2), a2), simd.fma(e, simd.splat_at(xs, p + 3), a3),
            simd.fma(e, simd.splat_at(xs, p + 4), a4))


def conv5_weights_lanes(x, dout, dw, db, width, scratch):
    """conv5_backward_weights_simd on float32 maps; the direct kernel on
    other dtypes (the tests' float64 finite differences)."""


def _weights_lanes(stub, vectors, direct):
    """Compile calls of the weight gradient `stub` as `vectors` on float32
    maps, as the direct kernel `direct` (no scratch) on other dtypes."""
    @overload(stub, jit_options={"fastmath": True})
    def _lanes(x, dout, dw, db, width, scratch):
        if x.dtype != types.float32:
            return lambda x, dout, dw, db, width, scratch: direct(x, dout, dw, db, width)
        return lambda x, dout, dw, db, width, scratch: vectors(x, dout, dw, db, width, scratch)


_weights_lanes(conv5_weights_lanes, conv5_backward_weights_simd, conv5_backward_weights)


# The weight gradient of a 3x3 conv, output channels in the lanes as the 5x5
# one's, but two vectors of them (32 channels) by all nine taps of one input
# channel: 18 sums in registers through a sample's pixels, and per pixel two
# vector loads of the output gradient and nine broadcasts of input values
# for 18 multiply-adds (one vector of channels by three taps, the 5x5
# kernel's shape, would load about once per multiply-add). Measurements:
# bench/results/conv-paths.md.
SIMD3_WEIGHT_CHANNELS = 2 * simd.LANES  # output channels of a group
WEIGHTS3_BLOCK = 4096  # floats of output gradient a block of rows takes (16 KB of L1)


@jit_inline
def conv3_backward_weights_simd(x, dout, dw, db, width, scratch):
    """conv_backward_weights of a 3x3 kernel on float32 maps by explicit
    vectors, SIMD3_WEIGHT_CHANNELS output channels at a time.

    x: (N, C, H, S), valid width `width`; dout: (N, O, OH*S) wide, zero in
    junk columns; dw: (O, C, 3, 3) and db: (O,) are overwritten; O a
    multiple of SIMD3_WEIGHT_CHANNELS; scratch: (O*OH*OW + C*9*O + 256,)
    floats, for one sample's output gradient, group-major and position-major
    (O/G, OH*OW, G), the weight gradient's sums (O/G, C, 9, G) and a 16 x 16
    tile (_positions_major's).
    """
    N, C, H, S = x.shape
    O = db.size
    L = simd.LANES
    G = SIMD3_WEIGHT_CHANNELS
    OH, OW = H - 2, width - 2
    PX = OH * OW
    xf = x.reshape((N, C * H * S))
    lanes = scratch[:O * PX]
    sums = scratch[O * PX:O * PX + C * 9 * O]
    tile = scratch[O * PX + C * 9 * O:O * PX + C * 9 * O + L * L]
    df = dout.reshape(N * O * OH * S)
    zero = simd.splat(np.float32(0))
    rows = max(1, WEIGHTS3_BLOCK // (OW * G))
    for o in range(O):
        db[o] = 0
        for n in range(N):
            db[o] += total(dout[n, o, :(OH - 1) * S + OW])
    for t in range(0, C * 9 * O, L):
        simd.store(sums, t, zero)
    for n in range(N):
        _positions_major(df, n * O * OH * S, O, S, OH, OW, G, lanes, tile)
        xs = xf[n]
        for i0 in range(0, OH, rows):  # a block of rows, in L1 through (group, channel)
            for oc in range(O // G * C):
                og, c = oc // C * G, oc % C
                t = (og * C + c * G) * 9  # this group's and channel's 9 taps of sums
                a0, a1, a2 = _load3(sums, t, G)
                a3, a4, a5 = _load3(sums, t + 3 * G, G)
                a6, a7, a8 = _load3(sums, t + 6 * G, G)
                b0, b1, b2 = _load3(sums, t + L, G)
                b3, b4, b5 = _load3(sums, t + 3 * G + L, G)
                b6, b7, b8 = _load3(sums, t + 6 * G + L, G)
                for i in range(i0, min(i0 + rows, OH)):
                    r = (c * H + i) * S  # input row of output row i, kernel row 0
                    q = og * PX + i * OW * G
                    for j in range(OW):
                        e = simd.load(lanes, q + j * G)  # channels og .. og + 15
                        f = simd.load(lanes, q + j * G + L)  # og + 16 .. og + 31
                        p = r + j
                        a0, b0 = _tap_pair(e, f, xs, p, a0, b0)
                        a1, b1 = _tap_pair(e, f, xs, p + 1, a1, b1)
                        a2, b2 = _tap_pair(e, f, xs, p + 2, a2, b2)
                        a3, b3 = _tap_pair(e, f, xs, p + S, a3, b3)
                        a4, b4 = _tap_pair(e, f, xs, p + S + 1, a4, b4)
                        a5, b5 = _tap_pair(e, f, xs, p + S + 2, a5, b5)
                        a6, b6 = _tap_pair(e, f, xs, p + 2 * S, a6, b6)
                        a7, b7 = _tap_pair(e, f, xs, p + 2 * S + 1, a7, b7)
                        a8, b8 = _tap_pair(e, f, xs, p + 2 * S + 2, a8, b8)
                _store3(sums, t, G, a0, a1, a2)
                _store3(sums, t + 3 * G, G, a3, a4, a5)
                _store3(sums, t + 6 * G, G, a6, a7, a8)
                _store3(sums, t + L, G, b0, b1, b2)
                _store3(sums, t + 3 * G + L, G, b3, b4, b5)
                _store3(sums, t + 6 * G + L, G, b6, b7, b8)
    taps = dw.reshape((O, C * 9))
    for o in range(O):  # (O/G, C, 9, G) sums -> dw
        q = (o - o % G) * C * 9 + o % G
        for t in range(C * 9):
            taps[o, t] = sums[q + t * G]


@jit_inline
def _positions_major(df, at, O, S, OH, OW, G, lanes, tile):
    """One sample's output gradient, (O, OH*S) wide from df[at] (df: the
    batch's, flat), into lanes (O/G, OH*OW, G): group-major, then
    position-major; 16 channels by 16 columns of a row at a time, transposed
    in registers (simd.transpose). A row's last columns short of 16 go
    through tile (256 floats), read with the next row's or channel's first
    (not stored), unless that read would run past df's end."""
    L = simd.LANES
    PS = OH * S
    PX = OH * OW
    for og in range(0, O, G):
        for i in range(OH):
            q = og * PX + i * OW * G
            for h in range(0, G, L):
                src = at + (og + h) * PS + i * S  # channel og + h's row i
                for j in range(0, OW, L):
                    m = min(L, OW - j)
                    if m == L:
                        simd.transpose(df, src + j, PS, lanes, q + j * G + h, G)
                    elif src + j + (L - 1) * PS + L <= df.size:
                        simd.transpose(df, src + j, PS, tile, 0, L)
                        for p in range(m):
                            simd.store(lanes, q + (j + p) * G + h, simd.load(tile, p * L))
                    else:
                        for o in range(L):
                            for p in range(m):
                                lanes[q + (j + p) * G + h + o] = df[src + o * PS + j + p]


@jit_inline
def _tap_pair(e, f, xs, p, a, b):
    """One tap's sums of two vectors of channels, a and b, after one more
    output pixel: their gradients e and f times the tap's input value xs[p]
    broadcast."""
    v = simd.splat_at(xs, p)
    return simd.fma(e, v, a), simd.fma(f, v, b)


@jit_inline
def _load3(sums, t, G):
    """The three vectors of sums at t, t + G and t + 2G."""
    return simd.load(sums, t), simd.load(sums, t + G), simd.load(sums, t + 2 * G)


@jit_inline
def _store3(sums, t, G, a, b, c):
    """a, b and c stored at t, t + G and t + 2G of sums."""
    simd.store(sums, t, a)
    simd.store(sums, t + G, b)
    simd.store(sums, t + 2 * G, c)


def conv3_weights_lanes(x, dout, dw, db, width, scratch):
    """conv3_backward_weights_simd on float32 maps; the direct kernel on
    other dtypes (the tests' float64 finite differences)."""


_weights_lanes(conv3_weights_lanes, conv3_backward_weights_simd, conv3_backward_weights)


def weights3_scratch_floats(c: int, out: int, out_height: int, out_width: int) -> int:
    """Floats of scratch conv3_weights_lanes takes."""
    return out * out_height * out_width + c * 9 * out + simd.LANES ** 2
