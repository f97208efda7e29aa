"""Models: layouts, initialisation, and loss_and_grad / predict against a
numpy/scipy forward pass and central finite differences on every tensor."""

from __future__ import annotations

import math

import numpy as np
import pytest
from reference import central_difference, network_logits, softmax_xent

from iasgd import kernels as K
from iasgd import models


@pytest.mark.parametrize(("dataset", "count"), [
    ("cifar10", 52_202), ("cifar100", 69_656), ("fashion-mnist", 34_622), ("synthetic", 52_202),
])
def test_lenet_parameter_counts_match_the_paper(dataset, count):
    assert models.build("lenet", dataset).num_params == count


def test_lenet_layout_follows_pytorch_shapes_and_tiles_the_array():
    m = models.build("lenet", "cifar10")
    shapes = {name: shape for name, shape, _ in m.layout}
    assert shapes == {
        "conv1.weight": (6, 3, 5, 5), "conv1.bias": (6,),
        "conv2.weight": (16, 6, 5, 5), "conv2.bias": (16,),
        "fc1.weight": (120, 400), "fc1.bias": (120,),
        "fc2.weight": (10, 120), "fc2.bias": (10,),
    }
    end = 0
    for _, shape, off in m.layout:
        assert off == end
        end += math.prod(shape)
    assert end == m.num_params


def test_mlp_hidden_widths():
    m = models.build("mlp", "fashion-mnist", hidden=(64, 32))
    assert [s for _, s, _ in m.layout] == [(64, 784), (64,), (32, 64), (32,), (10, 32), (10,)]


def test_init_is_seeded_and_bounded_like_pytorch():
    m = models.build("lenet", "cifar10")
    a, b, c = m.init(1), m.init(1), m.init(2)
    assert a.dtype == np.float32 and a.shape == (m.num_params,)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    t = m.tensors(a)
    for name, fan_in in (("conv1", 75), ("conv2", 150), ("fc1", 400), ("fc2", 120)):
        for part in ("weight", "bias"):
            v = t[f"{name}.{part}"]
            bound = 1 / math.sqrt(fan_in)
            assert np.abs(v).max() <= bound
            if part == "weight":  # enough draws to fill the interval
                assert np.abs(v).max() > 0.9 * bound


SMALL_MODELS = {
    "lenet-cifar10": lambda: models.build("lenet", "cifar10"),
    "lenet-cifar100": lambda: models.build("lenet", "cifar100"),
    "lenet-fashion": lambda: models.build("lenet", "fashion-mnist"),
    "lenet-odd-input": lambda: models.build("lenet", input_shape=(2, 17, 19), num_classes=3),
    "mlp": lambda: models.build("mlp", input_shape=(1, 6, 5), num_classes=4, hidden=(7, 5)),
}


@pytest.fixture(params=sorted(SMALL_MODELS))
def model(request):
    return SMALL_MODELS[request.param]()


def batch(model, n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, n)
    return x, y


def test_forward_matches_numpy_reference(model):
    params = model.init(3)
    x, y = batch(model, 5)
    ref = network_logits(model, params, x)
    np.testing.assert_allclose(model.logits(params, x), ref, rtol=1e-4, atol=1e-5)
    loss, _ = model.loss_and_grad(params, x, y)
    assert loss == pytest.approx(softmax_xent(ref, y), rel=1e-5)
    np.testing.assert_array_equal(model.predict(params, x), np.argmax(ref, axis=1))


def test_loss_and_grad_matches_finite_differences_on_every_tensor(model):
    """The float32 gradient against central differences of the network's own
    float64 specialisation, 4 random coordinates of every tensor."""
    params = model.init(4)
    x, y = batch(model, 3, seed=1)
    _, grad = model.loss_and_grad(params, x, y)
    ws = model.workspace(3)
    acts, dacts = np.zeros(ws.plan.acts_size), np.zeros(ws.plan.acts_size)
    g64 = np.zeros(model.num_params)

    def loss64(p):
        acts[: x.size] = (x.ravel() - models.INPUT_MEAN) / models.INPUT_STD
        return K.network_loss_and_grad(p, g64, ws.plan.conv, ws.plan.dense, acts, dacts,
                                       ws.argmax, y)

    p64 = params.astype(np.float64)
    rng = np.random.default_rng(5)
    for name, shape, off in model.layout:
        for j in rng.choice(math.prod(shape), min(4, math.prod(shape)), replace=False):
            fd = central_difference(loss64, p64, off + j, eps=1e-6)
            assert abs(fd - grad[off + j]) <= 1e-4 * max(abs(fd), 1e-2), name


def test_predict_images_matches_predict_on_float_inputs():
    m = models.build("lenet", "fashion-mnist")
    params = m.init(0)
    rng = np.random.default_rng(6)
    images = rng.integers(0, 256, (23, 1, 28, 28), dtype=np.uint8)
    want = m.predict(params, images.astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(m.predict_images(params, images, batch=10), want)


def test_bad_arguments_are_clear_errors():
    m = models.build("mlp", input_shape=(1, 2, 2), num_classes=3, hidden=(4,))
    p = m.init(0)
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="labels must lie in"):
        m.loss_and_grad(p, x, np.array([0, 3]))
    with pytest.raises(ValueError, match="params must be float32"):
        m.loss_and_grad(p.astype(np.float64), x, np.array([0, 1]))
    with pytest.raises(ValueError, match="inputs must be"):
        m.predict(p, np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="unknown model"):
        models.build("resnet", "cifar10")
    with pytest.raises(ValueError, match="too small"):
        models.build("lenet", input_shape=(1, 8, 8), num_classes=2)
    with pytest.raises(ValueError, match="mlp model only"):
        models.build("lenet", "cifar10", hidden=(3,))
