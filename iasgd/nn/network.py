"""The network passes over a plan (iasgd.nn.plan): forward, loss and
gradient, whole training steps and batched prediction, and what a step
needs besides the layers (softmax cross-entropy, SGD with momentum, the
gathering of a batch).

The passes call each row's op functions through the plan's op table
(Net.ops, iasgd.nn.ops), never a layer's kernel directly: called through a
pointer, an op's code is compiled once, by itself, and only when a plan
uses it (numba would otherwise re-optimise and re-emit every kernel in every
function that calls it, at every level, and compile every kernel any plan
could use).
"""

from __future__ import annotations

import numpy as np

from iasgd.compiled import jit_fastmath as jit
from iasgd.compiled import jit_inline
from iasgd.nn import augment as A
from iasgd.nn.plan import P_C, P_CO, P_DW, P_DX, P_FWD, P_H, P_S, P_ZOFF, view2

# -------------------------------------------------------------------- loss


@jit_inline
def softmax_cross_entropy(logits, labels, dlogits, batch, smoothing):
    """Softmax cross-entropy of N samples of a batch of `batch`, and its gradient.

    logits: (N, K); labels: (N,) ints in [0, K); dlogits: (N, K) overwritten
    with d(batch-mean loss)/d(logits). smoothing: nn.CrossEntropyLoss's
    label_smoothing eps, the target being (1 - eps) on the label plus eps / K
    on every class. Returns these samples' share of the batch-mean loss
    (float64): their mean when N == batch.
    """
    N, K = logits.shape
    total = 0.0
    inv_n = logits.dtype.type(1.0 / batch)
    eps = logits.dtype.type(smoothing)
    spread = eps / K * inv_n  # every class's share of the smoothed target, per sample
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
        inv_s = 1 / s
        if smoothing == 0.0:
            total += np.log(s) + m - z[labels[n]]
            for k in range(K):
                dlogits[n, k] *= inv_s * inv_n
            dlogits[n, labels[n]] -= inv_n
        else:
            z_mean = 0.0
            for k in range(K):
                z_mean += z[k]
                dlogits[n, k] = dlogits[n, k] * inv_s * inv_n - spread
            z_mean /= K
            total += np.log(s) + m - (1 - smoothing) * z[labels[n]] - smoothing * z_mean
            dlogits[n, labels[n]] -= (1 - eps) * inv_n
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


# Running statistics move this fraction of the way to their batch's values
# at every update (PyTorch's BatchNorm momentum default).
STATISTICS_MOMENTUM = 0.1


@jit_inline
def heavy_ball_update(params, velocity, grad, lr, momentum):
    """The paper's step (PyTorch's SGD with momentum and no other knob):
    v = momentum * v + grad; params -= lr * v."""
    mu = params.dtype.type(momentum)
    eta = params.dtype.type(lr)
    for i in range(params.size):
        v = mu * velocity[i] + grad[i]
        velocity[i] = v
        params[i] -= eta * v


@jit_inline
def sgd_momentum_update(params, velocity, grad, lr, sgd, first):
    """One update of parameters [first, first + params.size) of the model's
    flat arrays (params, velocity, grad are those entries).

    The trained ones (below sgd.trained) take torch.optim.SGD's step
    (dampening 0) with step size `lr` and sgd's (an Sgd's) other knobs:
    g = grad + weight_decay * params; v = momentum * v + g;
    params -= lr * (g + momentum * v if nesterov else v). The running
    statistics after them (batch norm's), for which the gradient holds the
    batch's statistics, move STATISTICS_MOMENTUM of the way to those.
    """
    t = min(max(sgd.trained - first, 0), params.size)
    mu = params.dtype.type(sgd.momentum)
    eta = params.dtype.type(lr)
    if sgd.weight_decay == 0.0 and not sgd.nesterov:
        heavy_ball_update(params[:t], velocity[:t], grad[:t], lr, sgd.momentum)
    else:
        decay = params.dtype.type(sgd.weight_decay)
        for i in range(t):
            g = grad[i] + decay * params[i]
            v = mu * velocity[i] + g
            velocity[i] = v
            if sgd.nesterov:
                v = g + mu * v
            params[i] -= eta * v
    m = params.dtype.type(STATISTICS_MOMENTUM)
    for i in range(t, params.size):
        params[i] += m * (grad[i] - params[i])


@jit_inline
def apply_update(params, velocity, grad, sgd, update, factor, first, knobs):
    """The run's update number `update` (0-based) of parameters [first,
    first + params.size) by grad, at `factor` times sgd's scheduled step
    size: heavy_ball_update where knobs is None (the paper's step,
    iasgd.nn.plan.knobs_argument: the same bits as the full update would
    give, and numba compiles nothing else), else sgd_momentum_update with
    every knob of sgd. The one update of every executor's steps."""
    if knobs is None:
        heavy_ball_update(params, velocity, grad, sgd.lr * factor, sgd.momentum)
    else:
        sgd_momentum_update(params, velocity, grad, scheduled_lr(sgd, update) * factor, sgd,
                            first)


@jit_inline
def loss_smoothing(sgd, knobs):
    """The loss's label smoothing: sgd's, or the constant 0 where knobs is
    None (the paper's step), which lets LLVM drop the smoothing's code."""
    return 0.0 if knobs is None else sgd.label_smoothing


@jit_inline
def scheduled_lr(sgd, update):
    """The step size of the run's update number `update` (0-based) under
    sgd's (an Sgd's) schedule: a linear warm-up over the first sgd.warmup
    updates ((update + 1) / warmup of sgd.lr), then over the rest of the
    sgd.planned updates sgd.decay: 0 constant, 1 cosine lr (1 + cos(pi x)) / 2,
    2 linear lr (1 - x), x the fraction of them done (1 beyond the plan)."""
    if update < sgd.warmup:
        return sgd.lr * (update + 1) / sgd.warmup
    if sgd.decay == 0:
        return sgd.lr
    x = min((update - sgd.warmup) / max(sgd.planned - sgd.warmup, 1), 1.0)
    if sgd.decay == 1:
        return sgd.lr * 0.5 * (1.0 + np.cos(np.pi * x))
    return sgd.lr * (1.0 - x)


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
def affine_copy(src, scale, shift, dst):
    """dst = src * scale + shift elementwise (same size, any shapes)."""
    s = src.reshape(src.size)
    d = dst.reshape(dst.size)
    a = d.dtype.type(scale)
    c = d.dtype.type(shift)
    for i in range(s.size):
        d[i] = s[i] * a + c



@jit_inline
def network_forward(params, grad, net, acts, argmax, n):
    """Forward pass of n <= net.slice_size samples whose input already sits in
    acts[: n * D].

    net: a Net (the plan table and its ops). Runs the plan's rows in order,
    writing every activation into `acts` (and pooling indices into `argmax`)
    at the plan's offsets; the logits are the last row's (a dense op's) output.
    grad: the gradient (params' size) of a training pass, whose batch-norm
    rows normalise by the batch's statistics and keep them there for the
    update; any shorter array (prediction) normalises by the running ones.
    The forward ops touch no other entry of grad, and not dacts.
    """
    plan = net.plan
    for i in range(plan.shape[0]):
        net.ops[plan[i, P_FWD]](params, grad, plan, i, acts, acts, argmax, n)


@jit_inline
def network_loss_and_grad(params, grad, net, acts, dacts, argmax, labels, smoothing):
    """Mean loss of the batch whose input sits in acts (label smoothing
    `smoothing`: softmax_cross_entropy); gradient into grad.

    Every entry of `grad` (same layout as params) is overwritten; `dacts`
    mirrors the layout of `acts` and receives the activation gradients.
    A batch larger than net.slice_size runs through the network in slices of
    net.slice_size samples, each moved to the front of the input first: the
    first slice's gradient goes into grad, every later one's into the
    partial gradient that follows the activation gradients in dacts
    (dacts[acts.size:], P floats) and is added to grad.
    """
    # Written out in one function: numba copies an inlined function's code
    # at every level it is inlined through, and a slice pass of its own and
    # helpers for the copy and the sum compiled slower
    # (bench/results/compile-times.md).
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
        network_forward(params, into, net, acts, argmax, m)
        logits = view2(acts, last[P_ZOFF], m, last[P_CO])
        dlogits = view2(dacts, last[P_ZOFF], m, last[P_CO])
        loss += softmax_cross_entropy(logits, labels[start:start + m], dlogits, n, smoothing)
        for i in range(plan.shape[0] - 1, -1, -1):
            net.ops[plan[i, P_DW]](params, into, plan, i, acts, dacts, argmax, m)
            net.ops[plan[i, P_DX]](params, into, plan, i, acts, dacts, argmax, m)
        if start > 0:
            for i in range(grad.size):
                grad[i] += part[i]
    return loss


@jit
def train_steps(weights, buffers, data, steps, losses, augment, knobs):
    """Run steps.count steps of sequential mini-batch SGD (steps.sgd);
    returns the number of steps applied, fewer if a loss is not finite (that
    step's update is not applied: the run has diverged).

    Step s (from steps.first) trains on images[order[s*b : (s+1)*b]] (the
    last batch of an epoch may be shorter), augmented as data says with the
    codes of step s's stream (iasgd.nn.augment.seed_step from
    steps.aug_seed) where `augment` is True, not augmented where it is None
    (pass iasgd.nn.augment.augment_argument(data): with None the augmenting
    code is not compiled at all); losses[s] receives its loss. `knobs`:
    None where steps.sgd is the paper's step (iasgd.nn.plan.knobs_argument:
    heavy ball at a constant step size on hard labels, every parameter
    trained), whose steps then compile nothing of the other knobs; True
    otherwise. The bundles (Weights, Buffers, Images, Steps) are described
    in iasgd.nn.plan.
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
        if augment is not None:  # step s's codes from its own stream (a resume draws them again)
            A.seed_step(buffers.aug_rng, steps.aug_seed, s)
            A.draw_codes(buffers.codes, n, data.pad, data.flip, buffers.aug_rng)
            A.gather_augmented(data.images, idx, buffers.codes, data.shape, data.scale,
                               data.shift, view2(acts, 0, n, D))
        else:
            gather_images(data.images, idx, data.scale, data.shift, view2(acts, 0, n, D))
        bl = bl_all[:n]
        for i in range(n):
            bl[i] = data.labels[idx[i]]
        smoothing = loss_smoothing(steps.sgd, knobs)
        losses[s] = network_loss_and_grad(params, buffers.grad, buffers.net, acts,
                                          buffers.dacts, buffers.argmax, bl, smoothing)
        if not np.isfinite(losses[s]):
            return s - steps.first
        apply_update(params, velocity, buffers.grad, steps.sgd, steps.epoch_start + s, 1.0, 0,
                     knobs)
    return steps.count


@jit
def predict_images(params, net, acts, argmax, images, scale, shift, out):
    """Predicted labels of all rows of images ((M, D) uint8, transformed to
    images * scale + shift) into out ((M,) int64), net.slice_size rows at a time."""
    M, D = images.shape
    last = net.plan[-1]
    for start in range(0, M, net.slice_size):
        n = min(net.slice_size, M - start)
        affine_copy(images[start:start + n], scale, shift, view2(acts, 0, n, D))
        network_forward(params, acts[:0], net, acts, argmax, n)
        argmax_rows(view2(acts, last[P_ZOFF], n, last[P_CO]), out[start:start + n])

