"""The network floor beside the layers: the loss, the SGD update, the
gathering of a batch, and whole training steps against PyTorch's SGD."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import central_difference, softmax_xent

from iasgd.nn import network as N
from iasgd.nn import plan as P
from iasgd.nn.blas import single_threaded_blas
from iasgd.schedules import LR_DECAYS

SHAPES = settings(max_examples=15, deadline=None)


@SHAPES
@given(st.integers(1, 6), st.integers(2, 12), st.floats(0.1, 30), st.integers(0, 2**31 - 1),
       st.sampled_from([0.0, 0.1, 0.37]))
def test_softmax_cross_entropy(n, k, scale, seed, eps):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, k)) * scale
    labels = rng.integers(0, k, n)
    d32 = np.zeros((n, k), np.float32)
    loss32 = N.softmax_cross_entropy(logits.astype(np.float32), labels, d32, n, eps)
    assert loss32 == pytest.approx(softmax_xent(logits, labels, eps), rel=1e-5, abs=1e-5)
    d = np.zeros((n, k))
    loss = N.softmax_cross_entropy(logits, labels, d, n, eps)
    assert loss == pytest.approx(softmax_xent(logits, labels, eps), rel=1e-12, abs=1e-12)
    for i in rng.choice(logits.size, min(logits.size, 6), replace=False):
        fd = central_difference(lambda v: softmax_xent(v, labels, eps), logits, i)
        assert abs(fd - d.flat[i]) < 1e-6
    # a batch in two slices: their shares add up to the whole batch's loss and gradient
    cut = n // 2
    parts = np.zeros((n, k))
    share = (N.softmax_cross_entropy(logits[:cut], labels[:cut], parts[:cut], n, eps)
             + N.softmax_cross_entropy(logits[cut:], labels[cut:], parts[cut:], n, eps))
    assert share == pytest.approx(loss, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(parts, d, rtol=1e-12, atol=1e-15)


def test_softmax_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[1e4, 0.0, -1e4]], np.float32)
    d = np.zeros_like(logits)
    assert N.softmax_cross_entropy(logits, np.array([1]), d, 1, 0.0) == pytest.approx(1e4)
    assert np.all(np.isfinite(d))


@SHAPES
@given(st.sampled_from([0.0, 0.5, 0.9]), st.sampled_from([0.0, 5e-4, 0.1]), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_sgd_momentum_update_matches_formula(momentum, decay, nesterov, seed):
    # torch.optim.SGD's documented step, dampening 0 (float64 here)
    rng = np.random.default_rng(seed)
    p, v, g = (rng.standard_normal(50).astype(np.float32) for _ in range(3))
    d_p = g.astype(np.float64) + decay * p
    want_v = momentum * v + d_p
    want_p = p - 0.1 * (d_p + momentum * want_v if nesterov else want_v)
    N.sgd_momentum_update(p, v, g, 0.1, P.plain_sgd(0.1, momentum)._replace(
        weight_decay=decay, nesterov=nesterov), 0)
    # float32 with fused multiply-add: agree to a few ulps
    np.testing.assert_allclose(v, want_v, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(p, want_p, rtol=1e-6, atol=1e-6)


@SHAPES
@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_running_statistics_follow_their_batch_in_any_slice(trained, lo, hi, decay, seed):
    """Entries from sgd.trained on are running statistics: they move
    STATISTICS_MOMENTUM of the way to the gradient's (the batch's) values,
    untouched by momentum, weight decay and the step size; the trained ones
    take the step. Updating [lo, hi) as a slice of its own (a sync round's
    share) gives the same entries as updating the whole arrays."""
    lo, hi = min(lo, hi), max(lo, hi)
    rng = np.random.default_rng(seed)
    p, v, g = (rng.standard_normal(50).astype(np.float32) for _ in range(3))
    sgd = P.plain_sgd(0.1, 0.9, trained)._replace(weight_decay=0.01 if decay else 0.0)
    whole_p, whole_v = p.copy(), v.copy()
    N.sgd_momentum_update(whole_p, whole_v, g, 0.1, sgd, 0)
    stats = slice(min(trained, 50), 50)
    m = np.float32(N.STATISTICS_MOMENTUM)
    # float32, fused multiply-add: a few ulps
    np.testing.assert_allclose(whole_p[stats], p[stats] + m * (g[stats] - p[stats]), rtol=1e-6,
                               atol=1e-7)
    np.testing.assert_array_equal(whole_v[stats], v[stats])
    trained_part = P.plain_sgd(0.1, 0.9)._replace(weight_decay=sgd.weight_decay)
    want_p, want_v = p[:trained].copy(), v[:trained].copy()
    N.sgd_momentum_update(want_p, want_v, g[:trained], 0.1, trained_part, 0)
    np.testing.assert_array_equal(whole_p[:trained], want_p)
    np.testing.assert_array_equal(whole_v[:trained], want_v)
    part_p, part_v = p[lo:hi].copy(), v[lo:hi].copy()
    N.sgd_momentum_update(part_p, part_v, g[lo:hi], 0.1, sgd, lo)
    np.testing.assert_array_equal(part_p, whole_p[lo:hi])
    np.testing.assert_array_equal(part_v, whole_v[lo:hi])


def test_gather_images_transforms_rows():
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (10, 12), dtype=np.uint8)
    idx = np.array([3, 3, 9, 0])
    x = np.zeros((4, 12), np.float32)
    N.gather_images(images, idx, 2 / 255, -1.0, x)
    np.testing.assert_allclose(x, images[idx] * (2 / 255) - 1, rtol=1e-6, atol=1e-6)


def test_affine_copy():
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    dst = np.zeros(6, np.float32)
    N.affine_copy(src, 2.0, -1.0, dst)
    np.testing.assert_array_equal(dst, np.arange(6) * 2 - 1)


def test_argmax_rows_takes_first_maximum():
    scores = np.array([[1.0, 3.0, 3.0], [5.0, 5.0, 0.0]], np.float32)
    out = np.zeros(2, np.int64)
    N.argmax_rows(scores, out)
    assert out.tolist() == [1, 0]


def reference_lr(lr: float, decay: str, warmup: int, planned: int, update: int) -> float:
    """The documented schedule (docs/algorithms.md), in plain Python."""
    if update < warmup:
        return lr * (update + 1) / warmup
    x = min((update - warmup) / max(planned - warmup, 1), 1.0)
    return {"none": lr, "cosine": lr * (1 + math.cos(math.pi * x)) / 2,
            "linear": lr * (1 - x)}[decay]


@SHAPES
@given(st.sampled_from(LR_DECAYS), st.integers(0, 50), st.integers(1, 400),
       st.integers(0, 500), st.floats(1e-4, 1.0))
def test_scheduled_lr_is_the_formula(decay, warmup, planned, update, lr):
    sgd = P.plain_sgd(lr, 0.0)._replace(decay=LR_DECAYS.index(decay), warmup=min(warmup, planned),
                                       planned=planned)
    want = reference_lr(lr, decay, min(warmup, planned), planned, update)
    assert N.scheduled_lr(sgd, update) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert 0 <= N.scheduled_lr(sgd, update) <= lr


def test_the_default_schedule_is_the_step_size_itself():
    sgd = P.plain_sgd(0.0123, 0.5)
    assert all(N.scheduled_lr(sgd, u) == 0.0123 for u in (0, 1, 10**9))


@pytest.mark.parametrize("knob", [{"weight_decay": 5e-4}, {"nesterov": True},
                                  {"label_smoothing": 0.1}, {"decay": 1}, {"warmup": 3},
                                  {"trained": 99}])
def test_only_the_papers_step_leaves_the_other_knobs_out_of_the_steps(knob):
    """knobs_argument: None (train_steps compiles none of the other knobs)
    for plain_sgd's step whatever its run's length, True as soon as any
    other knob is set, or a parameter is a running statistic."""
    paper = P.plain_sgd(0.01, 0.9)._replace(planned=1000, trained=100)
    assert P.knobs_argument(paper, 100) is None
    assert P.knobs_argument(paper._replace(**knob), 100) is True


def test_the_papers_steps_are_the_same_with_the_knobs_compiled_or_not():
    """train_steps of plain_sgd's step with knobs None (heavy_ball_update)
    and True (scheduled_lr and sgd_momentum_update): the same bits."""
    from iasgd.nn import models
    model = models.build("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=(6,))
    rng = np.random.default_rng(0)
    b, steps = 4, 6
    data = P.Images(rng.integers(0, 256, (b * steps, 16), dtype=np.uint8),
                    rng.integers(0, 3, b * steps), 0.01, -0.5)
    runs = []
    for knobs in (None, True):
        params = model.init(1)
        weights = P.Weights(params, np.zeros_like(params))
        losses = np.zeros(steps)
        N.train_steps(weights, model.workspace(b).buffers, data,
                      P.Steps(np.arange(b * steps), 0, steps, b, P.plain_sgd(0.1, 0.5), 0),
                      losses, None, knobs)
        runs.append((params.tobytes(), weights.velocity.tobytes(), losses.tobytes()))
    assert runs[0] == runs[1]


def torch_schedule(torch, opt, sgd: P.Sgd):
    """sgd's schedule built from PyTorch's own schedulers: LinearLR from
    1/W over the warm-up, then CosineAnnealingLR or LinearLR to 0."""
    from torch.optim import lr_scheduler as L
    rest = sgd.planned - sgd.warmup
    after = (L.CosineAnnealingLR(opt, T_max=rest) if sgd.decay == 1
             else L.LinearLR(opt, 1.0, 0.0, total_iters=rest) if sgd.decay == 2
             else L.ConstantLR(opt, 1.0, total_iters=0))
    if not sgd.warmup:
        return after
    warm = L.LinearLR(opt, 1 / sgd.warmup, 1.0, total_iters=sgd.warmup - 1)
    return L.SequentialLR(opt, [warm, after], milestones=[sgd.warmup])


# every knob beyond the paper's
RECIPE_SGD = P.Sgd(0.005, 0.9, 5e-3, True, 0.1, 1, 8, 40, P.ALL_TRAINED)


@pytest.mark.parametrize(("preset", "sgd"), [("lenet", P.plain_sgd(0.005, 0.5)),
                                             ("vgg-small", P.plain_sgd(0.005, 0.5)),
                                             ("lenet", RECIPE_SGD),
                                             ("lenet", RECIPE_SGD._replace(decay=2))])
def test_train_steps_match_pytorch_sgd(preset, sgd):
    """40 steps of LeNet-5 / vgg-small with momentum (and Nesterov, weight
    decay, label smoothing and a warm-up then cosine or linear decay), step
    by step against PyTorch's SGD, cross-entropy and schedulers on the same
    batches from the same initial parameters."""
    torch = pytest.importorskip("torch")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from torch_reference import torch_flat_params, torch_inputs, torch_net

    from iasgd.nn import models

    torch.set_num_threads(1)
    m = models.build(preset, "cifar10")
    params = m.init(0)
    net = torch_net(m, params)
    opt = torch.optim.SGD(net.parameters(), lr=sgd.lr, momentum=sgd.momentum,
                          weight_decay=sgd.weight_decay, nesterov=sgd.nesterov)
    schedule = torch_schedule(torch, opt, sgd)
    rng = np.random.default_rng(0)
    steps, b = 40, 16
    images = rng.integers(0, 256, (steps * b, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, steps * b)
    ws = m.workspace(b)
    # two "epochs" of 20 steps, each its own call over its own order; the
    # second's schedule goes on from the 20 updates of the first
    weights = P.Weights(params, np.zeros_like(params))
    inputs = P.Images(images.reshape(steps * b, -1), labels, *m.image_transform)
    half = steps // 2
    losses = np.zeros(steps)
    for epoch_start in (0, half):
        order = np.arange(epoch_start * b, (epoch_start + half) * b)
        N.train_steps(weights, ws.buffers, inputs, P.Steps(order, 0, half, b, sgd, epoch_start),
                      losses[epoch_start:], None, P.knobs_argument(sgd, params.size))
    for s in range(steps):
        batch = slice(s * b, (s + 1) * b)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch_inputs(images[batch])),
                                                 torch.from_numpy(labels[batch]),
                                                 label_smoothing=sgd.label_smoothing)
        loss.backward()
        assert opt.param_groups[0]["lr"] == pytest.approx(N.scheduled_lr(sgd, s), rel=1e-6)
        opt.step()
        schedule.step()
        assert losses[s] == pytest.approx(loss.item(), abs=1e-5)
    # float32 sums in another order; seen: 1.5e-8 (lenet), 1.8e-7 (vgg-small)
    np.testing.assert_allclose(params, torch_flat_params(net), atol=1e-6)


def test_single_threaded_blas_limits_the_blas_the_kernels_call():
    """numba's np.dot calls scipy's OpenBLAS: inside the context it (and any
    other BLAS loaded) runs one thread; the limits come back after."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with single_threaded_blas():
        blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
        assert any("scipy" in i["filepath"] and "64_" not in i["filepath"] for i in blas)
        assert all(i["num_threads"] == 1 for i in blas)
