"""The average-pool kind: its kernels against numpy and central finite
differences (float64), whole models with it against their own float64
specialisation's finite differences and against PyTorch (autograd, SGD
steps, the exported module)."""

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
from iasgd.nn.layers.avgpool import AvgPool, avgpool2_backward, avgpool2_forward

SHAPES = settings(max_examples=15, deadline=None)
SPECS = ["conv6k3s,relu,avgpool,conv8k3s,relu,avgpool,dense16,relu,dense",
         "avgpool,conv4k3,relu,avgpool,dense",
         "conv5k3,relu,avgpool,relu,flatten,dense"]  # odd 11x11 -> 5x5, a ReLU after it


def avgpool2(z: np.ndarray) -> np.ndarray:
    """2x2 average pool (floor) of (N, C, H, W), float64."""
    N, C, H, W = z.shape
    z = z[:, :, : H // 2 * 2, : W // 2 * 2]
    return z.reshape(N, C, H // 2, 2, W // 2, 2).mean(axis=(3, 5))


@SHAPES
@given(st.integers(1, 3), st.integers(1, 4), st.integers(2, 9), st.integers(2, 9),
       st.integers(0, 3), st.integers(0, 2), st.integers(0, 2**31 - 1))
def test_avgpool_forward_and_backward(N, C, H, W, junk, border, seed):
    rng = np.random.default_rng(seed)
    width = W + junk  # a wide map: junk columns hold garbage
    z = rng.standard_normal((N, C, H, width))
    zw = z.reshape(N, C, H * width).copy()
    PH, PW = H // 2, W // 2
    out = np.full((N, C, PH + 2 * border, PW + 2 * border), np.nan)
    avgpool2_forward(zw, width, out, border)
    inside = out[:, :, border:border + PH, border:border + PW]
    np.testing.assert_allclose(inside, avgpool2(z[..., :W]), rtol=1e-12, atol=1e-12)
    R = rng.standard_normal(inside.shape)
    dz = np.full_like(zw, np.nan)
    avgpool2_backward(R, width, dz)
    assert np.all(dz.reshape(N, C, H, width)[..., W:] == 0)  # junk columns

    def loss(v):
        return float(np.sum(R * avgpool2(v.reshape(N, C, H, width)[..., :W])))

    for i in rng.choice(zw.size, min(zw.size, 12), replace=False):
        assert abs(central_difference(loss, zw, i) - dz.flat[i]) < 1e-6


def test_the_spec_and_the_plan():
    assert models.parse_spec("conv4,AvgPool,dense") == [models.Conv(4), AvgPool(),
                                                         models.Dense()]
    m = models.build(SPECS[0], "cifar10")
    assert m.spec == SPECS[0]
    names = [layers.row_op(row).name for row in m.workspace(2).plan]
    # the second conv's padding: the average pool writes inside its zero border;
    # the ReLUs before the pools stay rows of their own (mean and ReLU do not commute)
    assert names == ["pad", "conv", "relu", "avgpool", "conv", "relu", "avgpool", "dense",
                     "dense"]
    with pytest.raises(ValueError, match="too small for a 2x2 pool"):
        models.build("avgpool," * 6 + "dense", "cifar10")


@pytest.mark.parametrize("spec", SPECS)
def test_gradients_match_finite_differences(spec):
    """The float32 gradient against central differences of the network's
    own float64 specialisation (its ops compiled for float64), through the
    op signature."""
    model = models.build(spec, input_shape=(3, 11, 11), num_classes=4)
    params = model.init(4)
    rng = np.random.default_rng(1)
    x = rng.random((3, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, 4, 3)
    assert_gradient_matches_float64_differences(model, params, x, y, rng)


# PyTorch, where installed (the `compare` extra)


@pytest.mark.parametrize("spec", SPECS)
def test_loss_and_gradients_match_autograd(spec):
    """float32 against float64 autograd: each tensor's error within 1e-5 of
    its largest entry (float32 rounding through a few layers)."""
    torch, torch_net, _, _ = torch_reference()
    model = models.build(spec, input_shape=(3, 12, 11), num_classes=5)
    params = model.init(2)
    rng = np.random.default_rng(2)
    x = rng.random((6, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, 5, 6)
    loss, grad = model.loss_and_grad(params, x, y)
    net = torch_net(model, params).double()
    xt = (torch.from_numpy(x).double() - models.INPUT_MEAN) / models.INPUT_STD
    ref = torch.nn.functional.cross_entropy(net(xt), torch.from_numpy(y))
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)
    ours = model.tensors(grad)
    for name, p in net.named_parameters():
        want = p.grad.numpy()
        assert np.abs(ours[name] - want).max() <= 1e-5 * np.abs(want).max(), name


def test_training_steps_match_pytorch_sgd():
    """20 steps with momentum, step by step against PyTorch's SGD on the same
    batches from the same initial parameters."""
    assert_sgd_steps_match_torch(models.build(SPECS[0], "cifar10"), lr=0.01, momentum=0.5)


def test_the_exported_module_computes_the_same_logits():
    model = models.build(SPECS[1], "cifar10")
    assert_export_computes_the_same_logits(model, model.init(3), "AvgPool2d", "avgpool1")
