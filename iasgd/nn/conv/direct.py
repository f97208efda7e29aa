"""Direct convolutions for 3x3 and 5x5 kernels, hand-unrolled: the taps live
in registers and several channels share every load.

Layout and contracts: iasgd.nn.plan (wide rows of stride S; gradients zero
in the junk columns). Each kernel takes x (N, C, H, S) with valid width
`width` <= S and weights (O, C, k, k):

- `conv{k}_forward(x, w, b, out, width)`: out (N, O, (H-k+1)*S), wide rows
  (valid columns < width-k+1), the valid convolution plus bias;
- `conv{k}_backward_weights(x, dout, dw, db, width)`: dout (N, O, OH*S)
  wide, zero in junk columns; dw (O, C, k, k) and db (O,) overwritten;
- `conv{k}_backward_input(w, dout, dx, width)`: dx (N, C, H, S) overwritten,
  zero in its junk columns (>= width).

The kernels loop over (channel, kernel row) pairs in one loop (`row // k,
row % k`), not in two: LLVM unrolls a loop of a constant k rows, and
compiling k copies of the pixel loop costs compile time for no speed
(bench/results/conv-paths.md).

The 3x3 and 5x5 families are kept apart: each takes a different number of
channels per pass (the register budget of 3 vs 5 taps per row).
"""

from __future__ import annotations

from iasgd.compiled import jit_inline
from iasgd.nn.plan import total


@jit_inline
def conv5_forward(x, w, b, out, width):
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
def conv5_backward_weights(x, dout, dw, db, width):
    N, C, H, S = x.shape
    O = dw.shape[0]
    L = (H - 5) * S + (width - 4)
    xf = x.reshape((N, C, H * S))
    dw[:] = 0
    db[:] = 0
    for n in range(N):
        for o in range(O):
            db[o] += total(dout[n, o, :L])
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
def conv5_backward_input(w, dout, dx, width):
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
def conv3_forward(x, w, b, out, width):
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
def conv3_backward_weights(x, dout, dw, db, width):
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
            db[o] += total(dout[n, o, :L])
        # Four output channels share every input load: 12 sums over the plane
        # (12 independent FMA chains hide the FMA latency), 7 loads per 12 FMAs;
        # faster than two channels at a time (bench/results/conv-paths.md).
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
def conv3_backward_input(w, dout, dx, width):
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
