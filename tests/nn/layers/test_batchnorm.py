"""The batch-norm kind: its kernels against numpy and central finite
differences (float64), its place in the layout (running statistics after
the trained tensors), whole models with it against PyTorch (autograd in
train mode, the running statistics, SGD steps, the exported module in eval
mode) and against their own float64 specialisation's finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    assert_gradient_matches_float64_differences,
    assert_sgd_steps_match_torch,
    central_difference,
    torch_reference,
)

from iasgd.compiled import jit
from iasgd.export import load_weights, read_weights, save_weights, torch_module
from iasgd.nn import layers, models
from iasgd.nn import plan as P
from iasgd.nn.layers.batchnorm import (
    EPS,
    BatchNorm,
    batch_statistics,
    batchnorm_input_grad,
    batchnorm_weight_grad,
    normalise,
    statistics,
    statistics_lanes,
)

SHAPES = settings(max_examples=15, deadline=None)
SPECS = ["conv6k3s,bn,relu,pool,conv8k3s,bn,relu,pool,dense16,bn,relu,dense",
         "bn,conv4k3v,bn,relu,conv4k3v,bn,pool,dense",  # on the input; a ReLU fused into it
         "conv5k3,relu,bn,flatten,dense12,bn,dense",  # after a ReLU; on a vector
         "bn,relu,pool,dense"]  # fused into the pool on the input: no input gradient


def reference_bn(x: np.ndarray, gamma, beta, mean=None, var=None) -> np.ndarray:
    """Batch norm of (N, C, H, W), float64: by the batch's statistics (biased
    variance) unless mean and var are given."""
    if mean is None:
        mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    shape = (1, -1, 1, 1)
    return ((x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + EPS)
            * gamma.reshape(shape) + beta.reshape(shape))


@SHAPES
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(1, 5),
       st.integers(0, 3), st.booleans(), st.integers(0, 2**31 - 1))
def test_batchnorm_kernels(N, C, H, W, junk, relu, seed):
    """Statistics, both normalisations and both gradients on a wide map
    (junk columns hold garbage), float64, against numpy and finite differences."""
    if N * H * W < 2:
        return  # one value per channel: no variance
    rng = np.random.default_rng(seed)
    S = W + junk
    x = rng.standard_normal((N, C, H, S)) * 3 + 1
    gamma, beta = rng.standard_normal(C), rng.standard_normal(C)
    valid = x[..., :W]
    mean, var = np.empty(C), np.empty(C)
    batch_statistics(x, W, mean, var)
    np.testing.assert_allclose(mean, valid.mean(axis=(0, 2, 3)), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var, valid.var(axis=(0, 2, 3), ddof=1), rtol=1e-10, atol=1e-12)

    def forward(v: np.ndarray) -> np.ndarray:
        y = reference_bn(v.reshape(x.shape)[..., :W], gamma, beta)
        return np.maximum(y, 0) if relu else y

    y = np.zeros_like(x)
    normalise(x, W, gamma, beta, mean, var, True, relu, y)
    np.testing.assert_allclose(y[..., :W], forward(x), rtol=1e-9, atol=1e-9)
    running_mean, running_var = rng.standard_normal(C), rng.random(C) + 0.5
    normalise(x, W, gamma, beta, running_mean, running_var, False, False, y)
    np.testing.assert_allclose(y[..., :W], reference_bn(valid, gamma, beta, running_mean,
                                                        running_var), rtol=1e-9, atol=1e-9)

    R = rng.standard_normal((N, C, H, W))
    dy = np.zeros_like(x)
    dy[..., :W] = R
    if relu:  # the weight pass applies the fused ReLU's backward to dy first
        normalise(x, W, gamma, beta, mean, var, True, True, y)
        dy[..., :W] *= y[..., :W] > 0
    dgamma, dbeta = np.empty(C), np.empty(C)
    batchnorm_weight_grad(x, dy, W, mean, var, dgamma, dbeta)
    dx = np.full_like(x, np.nan)
    batchnorm_input_grad(x, dy, W, gamma, mean, var, dgamma, dbeta, dx)
    assert np.all(dx[..., W:] == 0)  # junk columns

    def loss_x(v: np.ndarray) -> float:
        return float(np.sum(R * forward(v)))

    flat = x.reshape(-1).copy()
    for i in rng.choice(flat.size, min(flat.size, 10), replace=False):
        if i % S < W:
            fd = central_difference(loss_x, flat, i)
            assert abs(fd - dx.flat[i]) < 1e-5 * max(1, abs(fd)), i
    for c in range(C):
        g = gamma.copy()
        want = (loss_with(gamma=g, c=c, x=valid, beta=beta, R=R, relu=relu))
        assert abs(want - dgamma[c]) < 1e-5 * max(1, abs(want))
        b = beta.copy()
        want = loss_with(gamma=gamma, c=c, x=valid, beta=b, R=R, relu=relu, of="beta")
        assert abs(want - dbeta[c]) < 1e-5 * max(1, abs(want))


@jit
def _statistics_lanes(x, width, mean, var):
    statistics_lanes(x, width, mean, var)


@jit
def _statistics(x, width, mean, var):
    statistics(x, width, mean, var)


@SHAPES
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 4), st.integers(1, 40),
       st.integers(0, 3), st.sampled_from([0.0, 1.0, 300.0]), st.integers(0, 2**31 - 1))
def test_statistics_in_vectors_match_numpy(N, C, H, W, junk, offset, seed):
    """The one-pass statistics in vectors (float32, rows of 1-40 values:
    part of a vector, one, several) against numpy in float64: junk columns
    are NaN, never read; a mean 300 standard deviations from 0 keeps the
    variance's digits (the sums are of x - x[0, c, 0, 0]). The dispatcher
    runs them on float32 where the vectors are available."""
    if N * H * W < 2:
        return
    rng = np.random.default_rng(seed)
    x = np.full((N, C, H, W + junk), np.nan, np.float32)
    x[..., :W] = rng.standard_normal((N, C, H, W)) + offset
    valid = x[..., :W].astype(np.float64)
    for kernel in (_statistics_lanes, _statistics):
        mean, var = np.full(C, np.nan, np.float32), np.full(C, np.nan, np.float32)
        kernel(x, W, mean, var)
        np.testing.assert_allclose(mean, valid.mean(axis=(0, 2, 3)), rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(var, valid.var(axis=(0, 2, 3), ddof=1), rtol=1e-4, atol=1e-6)


def loss_with(*, gamma, beta, c, x, R, relu, of="gamma") -> float:
    """The central difference of sum(R * bn(x)) in gamma[c] (or beta[c])."""
    target = gamma if of == "gamma" else beta

    def loss(v: np.ndarray) -> float:
        g, b = (v, beta) if of == "gamma" else (gamma, v)
        y = reference_bn(x, g, b)
        return float(np.sum(R * (np.maximum(y, 0) if relu else y)))

    return central_difference(loss, target.copy(), c)


def test_the_spec_layout_and_plan():
    assert models.parse_spec("conv4,BN,dense") == [models.Conv(4), BatchNorm(), models.Dense()]
    m = models.build(SPECS[1], "cifar10")
    assert m.spec == SPECS[1]
    names = [layers.row_op(row).name for row in m.workspace(2).plan]
    # the ReLU after the second bn is fused into it, the last bn into the pool
    assert names == ["bn", "conv", "bn", "conv", "bn+pool", "dense"]
    relu = [int(row[P.P_RELU]) for row in m.workspace(2).plan]
    assert relu == [0, 0, 1, 0, 0, 0]
    # the running statistics follow every trained tensor, in layer order
    names = [name for name, _, _ in m.layout]
    stats = [n for n in names if n.endswith(("running_mean", "running_var"))]
    assert names[-len(stats):] == stats == [f"bn{i}.{s}" for i in (1, 2, 3)
                                           for s in ("running_mean", "running_var")]
    assert m.num_trained == dict((n, off) for n, _, off in m.layout)["bn1.running_mean"]
    t = m.tensors(m.init(0))
    assert all(np.all(t[f"bn{i}.{s}"] == v) for i in (1, 2, 3)
               for s, v in (("weight", 1), ("bias", 0), ("running_mean", 0), ("running_var", 1)))
    # a model without batch norm: everything is trained, nothing moved
    lenet = models.build("lenet", "cifar10")
    assert lenet.num_trained == lenet.num_params
    # batch statistics need the whole batch in one pass: no slices
    assert m.workspace(256).slice_size == 256
    assert models.build("conv32k3s,relu,pool,dense", "cifar10").workspace(256).slice_size < 256
    with pytest.raises(ValueError, match="must be the dense output layer"):
        models.build("conv4,bn", "cifar10")


@pytest.mark.parametrize("spec", SPECS)
def test_gradients_match_finite_differences(spec):
    """The float32 gradient of the trained tensors against central
    differences of the network's own float64 specialisation."""
    model = models.build(spec, input_shape=(3, 11, 11), num_classes=4)
    params = model.init(4)
    rng = np.random.default_rng(1)
    params[:model.num_trained] += rng.normal(0, 0.1, model.num_trained).astype(np.float32)
    x = rng.random((5, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, 4, 5)
    assert_gradient_matches_float64_differences(model, params, x, y, rng)


# PyTorch, where installed (the `compare` extra)


@pytest.mark.parametrize("spec", SPECS)
def test_loss_gradients_and_statistics_match_autograd(spec):
    """Train mode, float32 against float64 autograd: each gradient within
    1e-5 of the largest of the network's, the batch's statistics (what the
    gradient holds for the running ones) against what PyTorch's update of
    its running statistics took."""
    torch, torch_net, _, _ = torch_reference()
    model = models.build(spec, input_shape=(3, 12, 11), num_classes=5)
    params = model.init(2)
    rng = np.random.default_rng(2)
    params[:model.num_trained] += rng.normal(0, 0.1, model.num_trained).astype(np.float32)
    x = rng.random((6, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, 5, 6)
    loss, grad = model.loss_and_grad(params, x, y)
    net = torch_net(model, params).double().train()
    xt = (torch.from_numpy(x).double() - models.INPUT_MEAN) / models.INPUT_STD
    ref = torch.nn.functional.cross_entropy(net(xt), torch.from_numpy(y))
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)
    ours, start = model.tensors(grad), model.tensors(params)
    largest = max(p.grad.abs().max().item() for p in net.parameters())
    for name, p in net.named_parameters():
        assert np.abs(ours[name] - p.grad.numpy()).max() <= 1e-5 * largest, name
    for name, b in net.named_buffers():
        if not b.is_floating_point():
            continue  # its batch count
        batch = (b.numpy() - 0.9 * start[name]) / 0.1  # torch: 0.9 running + 0.1 batch
        np.testing.assert_allclose(ours[name], batch, rtol=1e-5, atol=1e-5, err_msg=name)


def test_training_steps_and_evaluation_match_pytorch():
    """20 steps with momentum, weight decay and a ReLU fused into a bn, step
    by step against PyTorch's SGD on the same batches; then the running
    statistics and the eval-mode logits, and an export PyTorch loads strictly."""
    torch = pytest.importorskip("torch")
    model = models.build(SPECS[1], "cifar10")
    # float32 sums in another order, through 20 batch normalisations of 8 samples
    params, net = assert_sgd_steps_match_torch(model, lr=0.05, momentum=0.5, weight_decay=1e-3,
                                               tol=1e-4)
    rng = np.random.default_rng(1)
    x = rng.random((4, *model.input_shape)).astype(np.float32)
    with torch.no_grad():
        want = net.eval()((torch.from_numpy(x) - models.INPUT_MEAN) / models.INPUT_STD)
    np.testing.assert_allclose(model.logits(params, x), want.numpy(), rtol=1e-3, atol=1e-3)


def test_the_exported_module_and_a_torch_state_dict(tmp_path):
    torch = pytest.importorskip("torch")
    model = models.build(SPECS[2], "cifar10")
    params = model.init(3)
    rng = np.random.default_rng(3)
    params += rng.normal(0, 0.2, params.size).astype(np.float32)
    params[model.num_trained:] = np.abs(params[model.num_trained:])  # variances > 0
    net = torch_module(model)
    assert isinstance(net.bn1, torch.nn.BatchNorm2d) and isinstance(net.bn2, torch.nn.BatchNorm1d)
    saved = tmp_path / "w.npz"
    save_weights(saved, model, params)
    net.load_state_dict({name: torch.from_numpy(t) for name, t in read_weights(saved)[0].items()},
                        strict=True)
    x = rng.random((4, *model.input_shape)).astype(np.float32)
    with torch.no_grad():
        want = net.eval()((torch.from_numpy(x) - models.INPUT_MEAN) / models.INPUT_STD).numpy()
    np.testing.assert_allclose(model.logits(params, x), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(model.predict_images(params, (x * 255).astype(np.uint8)),
                                  model.predict(params, (x * 255).astype(np.uint8) / 255.0))
    # a state dict of PyTorch's own modules (their batch counts too) loads
    net.bn1.num_batches_tracked += 7
    torch.save(net.state_dict(), tmp_path / "plain.pt")
    np.testing.assert_array_equal(load_weights(tmp_path / "plain.pt", model), params)
    np.testing.assert_array_equal(load_weights(saved, model), params)
