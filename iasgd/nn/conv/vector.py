"""Convolution passes in explicit vectors of 16 float32 lanes (iasgd.nn.simd),
for float32 maps on machines with AVX-512 (which convs: the conv kind's
PATH bits, iasgd.nn.layers.conv; measurements: bench/results/conv-paths.md):
the forwards and the input gradient; the weight gradients are in
iasgd.nn.conv.vector_weights.

Each `*_lanes` entry takes the weights in PyTorch's order and runs the
direct kernel instead on other dtypes (the tests' float64 finite
differences), which the vectors do not take. The same convs' entries run
Winograd's F(2x2, 3x3) where it applies (iasgd.nn.conv.winograd.usable).
"""

from __future__ import annotations

from numba import types
from numba.extending import overload

from iasgd.compiled import jit_inline
from iasgd.nn import simd
from iasgd.nn.conv import winograd
from iasgd.nn.conv.direct import (
    conv3_backward_input,
    conv3_forward,
    conv5_forward,
)
from iasgd.nn.plan import copy_values

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
        conv3_lanes(xf[n], C, H, S, wt, b, out[n], 0, S, H - 2, width - 2, 0)


@jit_inline
def conv3_lanes(xs, C, H, S, wt, b, on, start, T, OH, OW, seg):
    """One sample's 3x3 conv by conv3_forward_simd's scheme: the input xs
    (C*H*S,) flat, C planes of H rows of stride S; wt as conv3_forward_simd's
    for O = b.size output channels; output pixel (i, j), i < OH, j < OW, of
    channel o written to on[o, start + i*T + j] (on: (O, >= start + OH*T)).
    Where seg > 0 the rows hold maps of seg columns side by side: an output
    in a map's first column does not read the column before it, one in its
    last not the column after it (those lanes' loads are masked off), as if
    each map had a zero border of its own. Needs OW >= 16 and OH >= 2."""
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
                left, right = map_edges(j, seg)
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
                    t = group + row * 3 * G
                    for kw in range(3):  # LLVM unrolls it: each tap's mask is known
                        bits = left if kw == 0 else (right if kw == 2 else ALL_LANES)
                        top = simd.load_masked(xs, r + kw, bits)  # input row i + kh
                        bot = simd.load_masked(xs, r + S + kw, bits)  # and i + 1 + kh
                        u = t + kw * G
                        p0, q0 = _fma_rows(wt, u, top, bot, p0, q0)
                        p1, q1 = _fma_rows(wt, u + 1, top, bot, p1, q1)
                        p2, q2 = _fma_rows(wt, u + 2, top, bot, p2, q2)
                        p3, q3 = _fma_rows(wt, u + 3, top, bot, p3, q3)
                        p4, q4 = _fma_rows(wt, u + 4, top, bot, p4, q4)
                        p5, q5 = _fma_rows(wt, u + 5, top, bot, p5, q5)
                        p6, q6 = _fma_rows(wt, u + 6, top, bot, p6, q6)
                        p7, q7 = _fma_rows(wt, u + 7, top, bot, p7, q7)
                a = start + i * T + j
                _store_rows(o0, a, T, p0, q0)
                _store_rows(o1, a, T, p1, q1)
                _store_rows(o2, a, T, p2, q2)
                _store_rows(o3, a, T, p3, q3)
                _store_rows(o4, a, T, p4, q4)
                _store_rows(o5, a, T, p5, q5)
                _store_rows(o6, a, T, p6, q6)
                _store_rows(o7, a, T, p7, q7)


ALL_LANES = (1 << simd.LANES) - 1


@jit_inline
def map_edges(j, seg):
    """The lane masks (bit l for lane l) of the vector of outputs j..j+15
    whose left and right neighbours lie in the same map of `seg` columns
    (outputs j + l in map (j + l) // seg); all lanes where seg is 0."""
    if seg == 0:
        return ALL_LANES, ALL_LANES
    left = right = 0
    for lane in range(simd.LANES):
        col = (j + lane) % seg
        if col != 0:
            left |= 1 << lane
        if col != seg - 1:
            right |= 1 << lane
    return left, right


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
# zeros around its map, so P samples' rows can be copied side by side into
# one wide map, with a zero column at each end and zero rows above and
# below: its conv holds every sample's output, if an output in a map's first
# column does not read the column before it (the last column of the map to
# its left) nor one in its last column the column after it. conv3_lanes
# masks those lanes' loads off (simd.load_masked: a load, no arithmetic),
# so every lane computes a pixel: vgg-bn's 8 x 8 maps fill their vectors
# two by two. (With a zero column between each two maps instead, sixteen
# made rows of 143 outputs in nine vectors, one lane in nine wasted.) How
# many go side by side depends on the slice too: P is the count whose
# groups take the fewest vectors. With a wide map P is 1 and the copy only
# pads.
#
# The input gradient of a "same" 3x3 conv is a "same" 3x3 conv itself: of the
# output gradient, with the weights flipped in both directions and their two
# channel axes swapped. It is run this way too, and writes the gradient of
# the input's interior only: a same conv's input border is padding, and the
# row that wrote it (a pad row, a pool) reads its gradient's interior only.
# Measurements: bench/results/conv-paths.md.


@jit_inline
def side_by_side(width, n):
    """How many samples of `width` output columns conv3_same_simd puts side
    by side in a slice of n: 1 from a vector's width on; else the count P
    of at most 16 whose groups (ceil(n / P) of them, a last one short) take
    the fewest vectors of outputs a row, each group's row at least a
    vector wide; the smaller on ties."""
    L = simd.LANES
    if width >= L:
        return 1
    best, fewest = 0, 0
    for p in range(1, 17):
        outputs = p * width
        if outputs >= L:
            vectors = (n + p - 1) // p * ((outputs + L - 1) // L)
            if best == 0 or vectors < fewest:
                best, fewest = p, vectors
    return best


def most_side_by_side(width: int, n: int) -> int:
    """The most samples side_by_side puts side by side in any slice of at
    most n (what conv3_same_simd's scratch is sized for)."""
    most = 1
    for m in range(1, n + 1 if width < simd.LANES else 1):
        most = max(most, side_by_side.py_func(width, m))
        if most == 16:  # none puts more
            break
    return most


@jit_inline
def packed_stride(P, OW):
    """The row stride of conv3_same_simd's packed maps: P maps of OW
    columns side by side between two zero columns."""
    return P * OW + 2


@jit_inline
def conv3_same_simd(src, src_at, src_stride, wt, b, dst, dst_at, dst_stride, OH, OW, packed,
                    sums):
    """A "same" 3x3 conv of float32 maps by conv3_lanes, side_by_side(OW, N)
    samples at a time.

    src: (N, C, plane) the input maps, sample n's channel c pixel (i, j) at
    src[n, c, src_at + i*src_stride + j] (i < OH, j < OW); wt: as
    conv3_lanes's for O = b.size output channels (C*9*O,); dst: (N, O,
    plane), output pixel (i, j) written to dst[n, o, dst_at + i*dst_stride +
    j], nothing else written; packed: (C * (OH+2) * T,) scratch, T =
    packed_stride(P, OW) with P = side_by_side(OW, N); sums: (O * OH * T,)
    scratch where P > 1. Needs OH >= 2.
    """
    N, C = src.shape[0], src.shape[1]
    O = b.size
    P = side_by_side(OW, N)
    T = packed_stride(P, OW)
    planes = packed[:C * (OH + 2) * T].reshape((C, OH + 2, T))
    planes[:] = 0  # the zero rows and columns around the maps stay zero
    wide = OH * T if P > 1 else 0  # (no sums needed alone)
    outputs = sums[:O * wide].reshape((O, wide))
    for n0 in range(0, N, P):
        # (a last group of fewer samples leaves the others' maps in the rest:
        # their outputs are computed and not copied)
        for s in range(min(P, N - n0)):
            at = 1 + s * OW
            for c in range(C):
                for i in range(OH):
                    a = src_at + i * src_stride
                    copy_values(src[n0 + s, c, a:a + OW], planes[c, i + 1, at:at + OW])
        if P == 1:
            conv3_lanes(packed, C, OH + 2, T, wt, b, dst[n0], dst_at, dst_stride, OH, OW, 0)
            continue
        conv3_lanes(packed, C, OH + 2, T, wt, b, outputs, 0, T, OH, P * OW, OW)
        for s in range(min(P, N - n0)):
            for o in range(O):
                for i in range(OH):
                    a = i * T + s * OW
                    d = dst_at + i * dst_stride
                    copy_values(outputs[o, a:a + OW], dst[n0 + s, o, d:d + OW])


def same_scratch_floats(c: int, out: int, out_height: int, out_width: int, n: int) -> int:
    """Floats of scratch conv3_same_simd takes for a conv from c to `out`
    channels with out_height x out_width outputs (packed and sums), on
    slices of at most n samples."""
    P = most_side_by_side(out_width, n)
    T = packed_stride.py_func(P, out_width)
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
        if winograd.usable(C, b.size, H - 2, width - 2):
            winograd.conv3_winograd(x.reshape((N, C, H * S)), S + 1, S, w, False, b, out, 0, S,
                                    H - 2, width - 2, scratch)
            return
        wt = _grouped_taps(w, SIMD3_CHANNELS, scratch)
        rest = scratch[wt.size:]
        packed, sums = _packing(rest, N, C, b.size, H - 2, width - 2)
        conv3_same_simd(x.reshape((N, C, H * S)), S + 1, S, wt, b, out, 0, S, H - 2,
                        width - 2, packed, sums)
    return lanes


@jit_inline
def _packing(scratch, N, C, O, OH, OW):
    """conv3_same_simd's packed and sums scratch for N samples, from the
    start of scratch."""
    T = packed_stride(side_by_side(OW, N), OW)
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
        if winograd.usable(O, C, H - 2, width - 2):
            zeros = scratch[:C]
            zeros[:] = 0
            winograd.conv3_winograd(dout, 0, S, w, True, zeros, dx.reshape((N, C, H * S)), S + 1,
                                    S, H - 2, width - 2, scratch[C:])
            return
        wt = _reordered_taps(w, SIMD3_CHANNELS, scratch, True)
        zeros = scratch[wt.size:wt.size + C]
        zeros[:] = 0
        packed, sums = _packing(scratch[wt.size + C:], N, O, C, H - 2, width - 2)
        conv3_same_simd(dout, 0, S, wt, zeros, dx.reshape((N, C, H * S)), S + 1, S, H - 2,
                        width - 2, packed, sums)
    return lanes


def same_forward_scratch_floats(c: int, out: int, out_height: int, out_width: int,
                                n: int, stride: int) -> int:
    """Floats of scratch conv3_same_forward_lanes takes on slices of at most
    n, its maps' rows `stride` apart."""
    return max(c * 9 * out + same_scratch_floats(c, out, out_height, out_width, n),
               winograd.scratch_floats(c, out, out_height, out_width, stride))


def input_scratch_floats(c: int, out: int, out_height: int, out_width: int, n: int,
                         stride: int) -> int:
    """Floats of scratch conv3_input_lanes takes for a conv from c to `out`
    channels with out_height x out_width outputs, on slices of at most n,
    its maps' rows `stride` apart."""
    return c + max(c * 9 * out + same_scratch_floats(out, c, out_height, out_width, n),
                   winograd.scratch_floats(out, c, out_height, out_width, stride))
