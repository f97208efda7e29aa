"""The weight gradients of convolutions in explicit vectors of 16 float32
lanes (iasgd.nn.simd), output channels in the lanes, for float32 maps on
machines with AVX-512 (which convs: the conv kind's PATH bits,
iasgd.nn.layers.conv; measurements: bench/results/conv-paths.md). The
forwards and the input gradient are in iasgd.nn.conv.vector.

Each `*_lanes` entry runs the direct kernel instead on other dtypes (the
tests' float64 finite differences), which the vectors do not take.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from iasgd.compiled import jit_inline
from iasgd.nn import simd
from iasgd.nn.conv.direct import conv3_backward_weights, conv5_backward_weights
from iasgd.nn.plan import total

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
