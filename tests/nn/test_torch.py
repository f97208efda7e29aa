"""Gradients against PyTorch's autograd: the presets and random small specs
(hypothesis), the same parameters copied into an equivalent torch.nn net
(bench/torch_reference.py). Skipped where torch is not installed (the
`compare` extra; .ci/run installs it). The step-by-step training comparison is
in test_kernels.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from torch_reference import torch_net  # noqa: E402

from iasgd.nn import models  # noqa: E402

# float32 kernels against float64 autograd, per tensor, relative to the
# largest entry of the sum of its per-sample gradients' absolute values (the
# batch's gradient where they do not cancel): float32 sums of up to a few
# thousand terms
GRAD_RTOL = 1e-4


def check_against_autograd(model: models.Model, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    params = model.init(seed)
    x = rng.random((n, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, n)
    loss, grad = model.loss_and_grad(params, x, y)

    net = torch_net(model, params).double()
    xt = (torch.from_numpy(x).double() - models.INPUT_MEAN) / models.INPUT_STD
    ref = torch.nn.functional.cross_entropy(net(xt), torch.from_numpy(y))
    ref.backward()
    batch_grad = {name: p.grad.numpy().copy() for name, p in net.named_parameters()}
    assert loss == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)
    # the batch's gradient is a sum of one gradient per sample, which can
    # nearly cancel (two samples, two classes: the output bias); float32
    # rounding is relative to the terms, not to what is left of their sum
    terms = {name: np.zeros(p.shape) for name, p in net.named_parameters()}
    for i in range(n):
        net.zero_grad()
        one = torch.nn.functional.cross_entropy(net(xt[i:i + 1]), torch.from_numpy(y[i:i + 1]))
        (one / n).backward()
        for name, p in net.named_parameters():
            terms[name] += np.abs(p.grad.numpy())
    ours = model.tensors(grad)
    for name, want in batch_grad.items():
        scale = max(float(terms[name].max()), 1e-6)
        err = float(np.abs(ours[name] - want).max()) / scale
        assert err < GRAD_RTOL, f"{model.spec}: {name} relative error {err:.2e}"


@pytest.mark.parametrize(("preset", "dataset"), [
    ("lenet", "cifar10"), ("lenet", "cifar100"), ("lenet", "fashion-mnist"),
    ("mlp", "cifar10"), ("vgg-small", "cifar10"), ("vgg-small", "fashion-mnist"),
])
def test_preset_gradients_match_autograd(preset, dataset):
    torch.set_num_threads(1)
    check_against_autograd(models.build(preset, dataset), n=5, seed=0)


def test_a_batch_in_slices_matches_autograd():
    torch.set_num_threads(1)
    model = models.build("lenet", "cifar10")
    assert model.workspace(21).slice_size == 16  # 16 + 5
    check_against_autograd(model, n=21, seed=1)


@st.composite
def small_specs(draw) -> tuple[str, tuple[int, int, int], int]:
    """A random small spec: conv blocks (any odd kernel up to 5, either
    padding, optional ReLU and pool), optional flatten, up to two hidden dense
    layers, the output layer; with an input shape and class count."""
    layers = []
    for _ in range(draw(st.integers(0, 3))):
        k = draw(st.sampled_from([1, 3, 5]))
        layers.append(f"conv{draw(st.integers(1, 5))}k{k}{draw(st.sampled_from('sv'))}")
        if draw(st.booleans()):
            layers.append("relu")
        if draw(st.booleans()):
            layers.append("pool")
    if draw(st.booleans()):
        layers.append("flatten")
    for _ in range(draw(st.integers(0, 2))):
        layers.append(f"dense{draw(st.integers(1, 9))}")
        if draw(st.booleans()):
            layers.append("relu")
    layers.append("dense")
    shape = (draw(st.integers(1, 3)), draw(st.integers(4, 13)), draw(st.integers(4, 13)))
    return ",".join(layers), shape, draw(st.integers(2, 5))


@settings(max_examples=25, deadline=None)
@given(small_specs(), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_random_spec_gradients_match_autograd(case, n, seed):
    spec, shape, classes = case
    try:
        model = models.build(spec, input_shape=shape, num_classes=classes)
    except ValueError:
        assume(False)  # e.g. too many pools for the map: not a valid net
    torch.set_num_threads(1)
    check_against_autograd(model, n, seed)
