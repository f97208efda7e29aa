"""Compiled forward/backward kernels for small CNNs and MLPs.

Every function here is a pure function on arrays, compiled by numba with the GIL
released: no I/O, no Python objects, no allocation on the training path. Results
go into arrays the caller preallocated (a worker's workspace and gradient buffer).

Conventions
- Activations are float32, NCHW (or (N, D) for dense layers), C-contiguous.
- Every convolution is 5x5, valid, stride 1. It writes *wide* rows: for an input
  of width W the output plane is stored as (OH, W), so an (OH, OW) = (H-4, W-4)
  result occupies columns ow < OW and the last 4 columns of each row are junk.
  This turns the whole plane into one long contiguous loop per kernel row, which
  LLVM vectorises well; short rows of 10 or 28 would not. Gradients flowing back
  into a wide plane must be zero in the junk columns (the pooling backward
  guarantees it).
- Weights follow PyTorch: conv (out, in, 5, 5), dense (out, in).

The whole network is described to the compiled code by two int64 tables (a
"plan", built by `iasgd.models`): one row per conv block (conv + ReLU + 2x2
max-pool) and one row per dense layer, holding sizes and offsets into the flat
parameter array and into the workspace. The column names are below.
"""

from __future__ import annotations

import numpy as np

from iasgd.compiled import jit_fastmath as jit

KSIZE = 5  # every convolution in the models is 5x5

# Columns of a conv-plan row (one conv5 + ReLU + maxpool2 block).
C_CIN, C_COUT, C_H, C_W, C_WOFF, C_BOFF, C_XOFF, C_ZOFF, C_POFF, C_AOFF = range(10)
CONV_COLUMNS = 10
# Columns of a dense-plan row. D_RELU is 1 for hidden layers, 0 for the logits.
D_IN, D_OUT, D_WOFF, D_BOFF, D_XOFF, D_ZOFF, D_RELU = range(7)
DENSE_COLUMNS = 7


# ---------------------------------------------------------------- convolution


@jit
def conv5_forward(x, w, b, out):
    """Valid 5x5 convolution plus bias, in wide layout.

    x: (N, C, H, W); w: (O, C, 5, 5); b: (O,); out: (N, O, (H-4)*W), wide rows.
    """
    N, C, H, W = x.shape
    O = w.shape[0]
    L = (H - 5) * W + (W - 4)  # last valid flat position + 1
    xf = x.reshape((N, C, H * W))
    for n in range(N):
        for o in range(0, O - 1, 2):  # two output channels share every input load
            a0 = out[n, o, :L]
            a1 = out[n, o + 1, :L]
            a0[:] = b[o]
            a1[:] = b[o + 1]
            for c in range(C):
                for kh in range(KSIZE):
                    r = xf[n, c, kh * W:]  # kernel row kh: tap kw reads r[p + kw]
                    w0, w1, w2, w3, w4 = _taps(w, o, c, kh)
                    v0, v1, v2, v3, v4 = _taps(w, o + 1, c, kh)
                    for p in range(L):
                        y0, y1, y2, y3, y4 = r[p], r[p + 1], r[p + 2], r[p + 3], r[p + 4]
                        a0[p] += w0 * y0 + w1 * y1 + w2 * y2 + w3 * y3 + w4 * y4
                        a1[p] += v0 * y0 + v1 * y1 + v2 * y2 + v3 * y3 + v4 * y4
        if O % 2 == 1:
            o = O - 1
            a0 = out[n, o, :L]
            a0[:] = b[o]
            for c in range(C):
                for kh in range(KSIZE):
                    r = xf[n, c, kh * W:]
                    w0, w1, w2, w3, w4 = _taps(w, o, c, kh)
                    for p in range(L):
                        a0[p] += (w0 * r[p] + w1 * r[p + 1] + w2 * r[p + 2] + w3 * r[p + 3]
                                  + w4 * r[p + 4])


@jit
def conv5_backward_weights(x, dout, dw, db):
    """Gradients of a 5x5 convolution with respect to its weights and bias.

    x: (N, C, H, W) the layer input; dout: (N, O, (H-4)*W) wide, zero in junk
    columns; dw: (O, C, 5, 5) and db: (O,) are overwritten.
    """
    N, C, H, W = x.shape
    O = dw.shape[0]
    L = (H - 5) * W + (W - 4)
    xf = x.reshape((N, C, H * W))
    dw[:] = 0
    db[:] = 0
    for n in range(N):
        for o in range(O):
            db[o] += _sum(dout[n, o, :L])
        for o in range(0, O - 1, 2):
            d0 = dout[n, o, :L]
            d1 = dout[n, o + 1, :L]
            for c in range(C):
                for kh in range(KSIZE):
                    r = xf[n, c, kh * W:]
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
            for c in range(C):
                for kh in range(KSIZE):
                    r = xf[n, c, kh * W:]
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


@jit
def conv5_backward_input(w, dout, dx):
    """Gradient of a 5x5 convolution with respect to its input.

    w: (O, C, 5, 5); dout: (N, O, (H-4)*W) wide, zero in junk columns;
    dx: (N, C, H, W) is overwritten.
    """
    N, C, H, W = dx.shape
    O = w.shape[0]
    L = (H - 5) * W + (W - 4)
    dxf = dx.reshape((N, C, H * W))
    dxf[:] = 0
    # Kernel row kh adds t[i] += sum_k w[o, c, kh, k] * d[i - k] to t = dx[c, kh*W:].
    # For i >= 4 all five taps exist (d[L:L+4] are junk columns, hence zero),
    # so one vectorised loop covers i in [4, L+4); i < 4 is the short head.
    for n in range(N):
        for c in range(0, C - 1, 2):  # two input channels share every load of d
            for o in range(O):
                d = dout[n, o]
                for kh in range(KSIZE):
                    t0 = dxf[n, c, kh * W:]
                    t1 = dxf[n, c + 1, kh * W:]
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
            for o in range(O):
                d = dout[n, o]
                for kh in range(KSIZE):
                    t0 = dxf[n, c, kh * W:]
                    w0, w1, w2, w3, w4 = _taps(w, o, c, kh)
                    m0 = t0[4:]
                    for j in range(L):
                        m0[j] += (w0 * d[j + 4] + w1 * d[j + 3] + w2 * d[j + 2] + w3 * d[j + 1]
                                  + w4 * d[j])
                    _input_grad_head(t0, d, w0, w1, w2, w3)


@jit
def _input_grad_head(t, d, w0, w1, w2, w3):
    """t[i] += sum_{k <= i} w_k d[i - k] for i < 4, where taps fall before d."""
    t[0] += w0 * d[0]
    t[1] += w0 * d[1] + w1 * d[0]
    t[2] += w0 * d[2] + w1 * d[1] + w2 * d[0]
    t[3] += w0 * d[3] + w1 * d[2] + w2 * d[1] + w3 * d[0]


@jit
def _taps(w, o, c, kh):
    return w[o, c, kh, 0], w[o, c, kh, 1], w[o, c, kh, 2], w[o, c, kh, 3], w[o, c, kh, 4]


@jit
def _add_taps(dw, o, c, kh, a0, a1, a2, a3, a4):
    dw[o, c, kh, 0] += a0
    dw[o, c, kh, 1] += a1
    dw[o, c, kh, 2] += a2
    dw[o, c, kh, 3] += a3
    dw[o, c, kh, 4] += a4


@jit
def _sum(v):
    s = v.dtype.type(0)
    for i in range(v.size):
        s += v[i]
    return s


# ------------------------------------------------------- ReLU + 2x2 max-pool


@jit
def relu_maxpool2_forward(z, width, out, argmax):
    """ReLU of the 2x2 max-pool of a wide conv output (floor for odd sizes).

    z: (N, C, OH*width) wide, valid columns < width-4; out: (N, C, OH//2, OW//2);
    argmax: int32, same shape as out, receives the flat index into the wide plane
    of each window's maximum (first one on ties), for the backward pass.
    """
    N, C, PH, PW = out.shape
    for n in range(N):
        for c in range(C):
            plane = z[n, c]
            o = out[n, c].reshape(PH * PW)
            a = argmax[n, c].reshape(PH * PW)
            for i in range(PH):
                for j in range(PW):
                    k = 2 * i * width + 2 * j
                    best = k
                    m = plane[k]
                    for cand in (k + 1, k + width, k + width + 1):
                        if plane[cand] > m:
                            best, m = cand, plane[cand]
                    a[i * PW + j] = best
                    o[i * PW + j] = max(m, 0)


@jit
def relu_maxpool2_backward(dout, out, argmax, dz):
    """Route pooled gradients back to the window maxima that were positive.

    dout, out, argmax: (N, C, PH, PW); dz: (N, C, OH*width) wide, overwritten
    (zero everywhere else, junk columns included).
    """
    N, C, PH, PW = dout.shape
    dz[:] = 0
    for n in range(N):
        for c in range(C):
            for i in range(PH):
                for j in range(PW):
                    if out[n, c, i, j] > 0:
                        dz[n, c, argmax[n, c, i, j]] = dout[n, c, i, j]


# --------------------------------------------------------------------- dense


@jit
def dense_forward(a, w, b, out):
    """out = a @ w.T + b.  a: (N, I); w: (O, I); b: (O,); out: (N, O)."""
    N, I = a.shape
    O = w.shape[0]
    for n in range(N):
        an = a[n]
        for o in range(O):
            wo = w[o]
            s = b[o]
            for i in range(I):
                s += wo[i] * an[i]
            out[n, o] = s


@jit
def dense_backward_weights(a, dout, dw, db):
    """dw = dout.T @ a, db = sum over rows of dout (both overwritten).

    a: (N, I); dout: (N, O); dw: (O, I); db: (O,).
    """
    N, I = a.shape
    O = dw.shape[0]
    dw[:] = 0
    db[:] = 0
    for o in range(O):
        row = dw[o]
        for n in range(N):
            g = dout[n, o]
            db[o] += g
            an = a[n]
            for i in range(I):
                row[i] += g * an[i]


@jit
def dense_backward_input(w, dout, da):
    """da = dout @ w (overwritten).  w: (O, I); dout: (N, O); da: (N, I)."""
    N, O = dout.shape
    I = w.shape[1]
    da[:] = 0
    for n in range(N):
        row = da[n]
        for o in range(O):
            g = dout[n, o]
            wo = w[o]
            for i in range(I):
                row[i] += g * wo[i]


@jit
def relu_inplace(z):
    """z = max(z, 0), any shape (flat view taken)."""
    f = z.reshape(z.size)
    for i in range(f.size):
        if f[i] < 0:
            f[i] = 0


@jit
def relu_backward_inplace(dz, z):
    """dz *= (z > 0), where z holds the ReLU *output*; same shapes."""
    df = dz.reshape(dz.size)
    zf = z.reshape(z.size)
    for i in range(df.size):
        if zf[i] <= 0:
            df[i] = 0


# -------------------------------------------------------------------- loss


@jit
def softmax_cross_entropy(logits, labels, dlogits):
    """Batch-mean softmax cross-entropy and its gradient.

    logits: (N, K); labels: (N,) ints in [0, K); dlogits: (N, K) overwritten
    with d(mean loss)/d(logits). Returns the mean loss (float64).
    """
    N, K = logits.shape
    total = 0.0
    inv_n = logits.dtype.type(1.0 / N)
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
    return total / N


@jit
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


@jit
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


# ---------------------------------------------------------- whole network


@jit
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


@jit
def affine_copy(src, scale, shift, dst):
    """dst = src * scale + shift elementwise (same size, any shapes)."""
    s = src.reshape(src.size)
    d = dst.reshape(dst.size)
    a = d.dtype.type(scale)
    c = d.dtype.type(shift)
    for i in range(s.size):
        d[i] = s[i] * a + c


@jit
def network_forward(params, conv_plan, dense_plan, acts, argmax, n):
    """Forward pass of n samples whose input already sits in acts[: n * D].

    Writes every activation into `acts` (and pooling indices into `argmax`) at
    the plan's offsets; the logits end at dense_plan[-1]'s output offset.
    """
    for row in conv_plan:
        cin, cout, h, w = row[C_CIN], row[C_COUT], row[C_H], row[C_W]
        oh, ow = h - KSIZE + 1, w - KSIZE + 1
        x = _view4(acts, row[C_XOFF], n, cin, h, w)
        z = _view3(acts, row[C_ZOFF], n, cout, oh * w)
        p = _view4(acts, row[C_POFF], n, cout, oh // 2, ow // 2)
        am = _view4(argmax, row[C_AOFF], n, cout, oh // 2, ow // 2)
        wt = _view4(params, row[C_WOFF], cout, cin, KSIZE, KSIZE)
        conv5_forward(x, wt, params[row[C_BOFF]:row[C_BOFF] + cout], z)
        relu_maxpool2_forward(z, w, p, am)
    for row in dense_plan:
        din, dout = row[D_IN], row[D_OUT]
        a = _view2(acts, row[D_XOFF], n, din)
        z = _view2(acts, row[D_ZOFF], n, dout)
        wt = _view2(params, row[D_WOFF], dout, din)
        dense_forward(a, wt, params[row[D_BOFF]:row[D_BOFF] + dout], z)
        if row[D_RELU]:
            relu_inplace(z)


@jit
def network_backward(params, grad, conv_plan, dense_plan, acts, dacts, argmax, n):
    """Backward pass after network_forward, from dlogits already in `dacts`.

    Overwrites every entry of `grad` (same layout as params); `dacts` mirrors
    the layout of `acts` and receives the activation gradients.
    """
    for k in range(dense_plan.shape[0] - 1, -1, -1):
        row = dense_plan[k]
        din, dout = row[D_IN], row[D_OUT]
        a = _view2(acts, row[D_XOFF], n, din)
        z = _view2(acts, row[D_ZOFF], n, dout)
        dz = _view2(dacts, row[D_ZOFF], n, dout)
        if row[D_RELU]:
            relu_backward_inplace(dz, z)
        dense_backward_weights(a, dz, _view2(grad, row[D_WOFF], dout, din),
                               grad[row[D_BOFF]:row[D_BOFF] + dout])
        if k > 0 or conv_plan.shape[0] > 0:  # the input needs no gradient
            dense_backward_input(_view2(params, row[D_WOFF], dout, din), dz,
                                 _view2(dacts, row[D_XOFF], n, din))
    for k in range(conv_plan.shape[0] - 1, -1, -1):
        row = conv_plan[k]
        cin, cout, h, w = row[C_CIN], row[C_COUT], row[C_H], row[C_W]
        oh, ow = h - KSIZE + 1, w - KSIZE + 1
        x = _view4(acts, row[C_XOFF], n, cin, h, w)
        p = _view4(acts, row[C_POFF], n, cout, oh // 2, ow // 2)
        dp = _view4(dacts, row[C_POFF], n, cout, oh // 2, ow // 2)
        am = _view4(argmax, row[C_AOFF], n, cout, oh // 2, ow // 2)
        dz = _view3(dacts, row[C_ZOFF], n, cout, oh * w)
        relu_maxpool2_backward(dp, p, am, dz)
        conv5_backward_weights(x, dz, _view4(grad, row[C_WOFF], cout, cin, KSIZE, KSIZE),
                               grad[row[C_BOFF]:row[C_BOFF] + cout])
        if k > 0:
            conv5_backward_input(_view4(params, row[C_WOFF], cout, cin, KSIZE, KSIZE), dz,
                                 _view4(dacts, row[C_XOFF], n, cin, h, w))


@jit
def network_loss_and_grad(params, grad, conv_plan, dense_plan, acts, dacts, argmax, labels):
    """Mean loss of the batch whose input sits in acts; gradient into grad."""
    n = labels.size
    last = dense_plan[-1]
    network_forward(params, conv_plan, dense_plan, acts, argmax, n)
    logits = _view2(acts, last[D_ZOFF], n, last[D_OUT])
    dlogits = _view2(dacts, last[D_ZOFF], n, last[D_OUT])
    loss = softmax_cross_entropy(logits, labels, dlogits)
    network_backward(params, grad, conv_plan, dense_plan, acts, dacts, argmax, n)
    return loss


@jit
def train_steps(params, velocity, grad, conv_plan, dense_plan, acts, dacts, argmax,
                batch_labels, images, scale, shift, labels, order, first_step, num_steps,
                batch_size, lr, momentum, losses):
    """Run num_steps of sequential mini-batch SGD with momentum; returns the
    number of steps applied, fewer if a loss is not finite (that step's update
    is not applied: the run has diverged).

    Step s (from first_step) trains on images[order[s*b : (s+1)*b]] (the last
    batch of an epoch may be shorter), transformed to images * scale + shift.
    images: (M, D) uint8; labels: (M,)
    int64; order: (M,) int64 permutation; losses[s] receives step s's loss.
    batch_labels: (batch_size,) int64 scratch.
    """
    total = order.size
    D = images.shape[1]
    for s in range(first_step, first_step + num_steps):
        start = s * batch_size
        n = min(batch_size, total - start)
        idx = order[start:start + n]
        gather_images(images, idx, scale, shift, _view2(acts, 0, n, D))
        bl = batch_labels[:n]
        for i in range(n):
            bl[i] = labels[idx[i]]
        losses[s] = network_loss_and_grad(params, grad, conv_plan, dense_plan,
                                          acts, dacts, argmax, bl)
        if not np.isfinite(losses[s]):
            return s - first_step
        sgd_momentum_update(params, velocity, grad, lr, momentum)
    return num_steps


@jit
def predict_images(params, conv_plan, dense_plan, acts, argmax, capacity, images,
                   scale, shift, out):
    """Predicted labels of all rows of images ((M, D) uint8, transformed to
    images * scale + shift) into out ((M,) int64), in batches of at most
    `capacity` (the workspace's batch size)."""
    M, D = images.shape
    last = dense_plan[-1]
    for start in range(0, M, capacity):
        n = min(capacity, M - start)
        affine_copy(images[start:start + n], scale, shift, _view2(acts, 0, n, D))
        network_forward(params, conv_plan, dense_plan, acts, argmax, n)
        argmax_rows(_view2(acts, last[D_ZOFF], n, last[D_OUT]), out[start:start + n])


@jit
def _view2(flat, off, a, b):
    return flat[off:off + a * b].reshape((a, b))


@jit
def _view3(flat, off, a, b, c):
    return flat[off:off + a * b * c].reshape((a, b, c))


@jit
def _view4(flat, off, a, b, c, d):
    return flat[off:off + a * b * c * d].reshape((a, b, c, d))
