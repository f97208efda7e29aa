"""The global-average-pool kind: its kernels against numpy and central
finite differences (float64), whole models with it against their own
float64 specialisation's finite differences and against PyTorch (autograd,
SGD steps, the exported module)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    assert_export_computes_the_same_logits,
    assert_gradient_matches_float64_differences,
    assert_sgd_steps_match_torch,
    central_difference,
    torch_reference,
)

from iasgd.nn import layers, models
from iasgd.nn.layers.gap import GlobalAvgPool, global_mean_backward, global_mean_forward

SHAPES = settings(max_examples=15, deadline=None)
SPECS = ["conv6k3s,bn,relu,pool,conv8k3v,relu,gap,dense",
         "conv5k3,gap,dense16,relu,dense",  # a wide map (junk columns) into the pool
         "conv4k3,relu,gap,bn,relu,dense"]  # into batch norm on a vector


@SHAPES
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 9), st.integers(1, 9),
       st.integers(0, 3), st.integers(0, 2**31 - 1))
def test_gap_forward_and_backward(N, C, H, W, junk, seed):
    rng = np.random.default_rng(seed)
    width = W + junk  # a wide map: junk columns hold garbage
    x = rng.standard_normal((N, C, H, width))
    out = np.full((N, C), np.nan)
    global_mean_forward(x, W, out)
    np.testing.assert_allclose(out, x[..., :W].mean(axis=(2, 3)), rtol=1e-12, atol=1e-12)
    R = rng.standard_normal((N, C))
    dx = np.full_like(x, np.nan)
    global_mean_backward(R, W, dx)
    assert np.all(dx[..., W:] == 0)  # junk columns

    def loss(v):
        return float(np.sum(R * v.reshape(x.shape)[..., :W].mean(axis=(2, 3))))

    flat = x.ravel().copy()
    for i in rng.choice(flat.size, min(flat.size, 12), replace=False):
        assert abs(central_difference(loss, flat, i) - dx.flat[i]) < 1e-6


def test_the_spec_and_the_plan():
    assert models.parse_spec("conv4,GAP,dense") == [models.Conv(4), GlobalAvgPool(),
                                                     models.Dense()]
    m = models.build(SPECS[0], "cifar10")
    assert m.spec == SPECS[0]
    assert m.shapes[6].shape == (8,)  # the channels, whatever the plane
    names = [layers.row_op(row).name for row in m.workspace(2).plan]
    # a ReLU before it stays a row of its own (a mean and ReLU do not commute)
    assert names == ["pad", "conv", "bn+pool", "conv", "relu", "gap", "dense"]
    with pytest.raises(ValueError, match=r"gap .*needs an image"):
        models.build("flatten,gap,dense", "cifar10")


@pytest.mark.parametrize("spec", SPECS)
def test_gradients_match_finite_differences(spec):
    """The float32 gradient against central differences of the network's
    own float64 specialisation (its ops compiled for float64), through the
    op signature."""
    model = models.build(spec, input_shape=(3, 11, 10), num_classes=4)
    params = model.init(4)
    rng = np.random.default_rng(1)
    x = rng.random((3, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, 4, 3)
    assert_gradient_matches_float64_differences(model, params, x, y, rng)


# PyTorch, where installed (the `compare` extra)


def test_loss_and_gradients_match_autograd_written_by_hand():
    """float32 against float64 autograd of the same net written with
    torch.nn.functional (not iasgd's export): each tensor's error within
    1e-5 of its largest entry."""
    torch, _, _, _ = torch_reference()
    F = torch.nn.functional
    model = models.build("conv5k3,relu,gap,dense", input_shape=(3, 12, 11), num_classes=5)
    params = model.init(2)
    t = {name: torch.from_numpy(v.copy()).double().requires_grad_()
         for name, v in model.tensors(params).items()}
    rng = np.random.default_rng(2)
    x = rng.random((6, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, 5, 6)
    loss, grad = model.loss_and_grad(params, x, y)
    xt = (torch.from_numpy(x).double() - models.INPUT_MEAN) / models.INPUT_STD
    h = F.relu(F.conv2d(xt, t["conv1.weight"], t["conv1.bias"]))
    logits = F.linear(F.adaptive_avg_pool2d(h, 1).flatten(1), t["fc1.weight"], t["fc1.bias"])
    ref = F.cross_entropy(logits, torch.from_numpy(y))
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)
    for name, ours in model.tensors(grad).items():
        want = t[name].grad.numpy()
        assert np.abs(ours - want).max() <= 1e-5 * np.abs(want).max(), name


def test_training_steps_match_pytorch_sgd():
    """20 steps with momentum, step by step against PyTorch's SGD on the same
    batches from the same initial parameters (batch norm in train mode)."""
    assert_sgd_steps_match_torch(models.build(SPECS[0], "cifar10"), lr=0.01, momentum=0.5)


def test_the_exported_module_computes_the_same_logits():
    model = models.build(SPECS[1], "cifar10")
    assert_export_computes_the_same_logits(model, model.init(3), "AdaptiveAvgPool2d", "gap1")
