"""Models: layouts, initialisation, and loss_and_grad / predict against a
numpy/scipy forward pass and central finite differences on every tensor."""

from __future__ import annotations

import math
import pickle
import re

import numpy as np
import pytest
from reference import central_difference, network_logits, softmax_xent

from iasgd.nn import layers, models, network, ops
from iasgd.nn import plan as P
from iasgd.nn.layers import conv as C
from iasgd.nn.models import Conv, Dense, Flatten, Pool, ReLU


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
    "vgg-small": lambda: models.build("vgg-small", "cifar10"),
    # every op: same and valid convs of several sizes, pools with and without
    # a fused ReLU, a ReLU in place on a wide map, a flatten of junk columns
    "spec-mixed": lambda: models.build("conv4k3s,relu,conv3k5,pool,relu,conv2k1,flatten,"
                                       "dense6,relu,dense", input_shape=(2, 9, 11),
                                       num_classes=3),
    "spec-wide-flatten": lambda: models.build("conv3k3s,dense5,relu,relu,dense",
                                              input_shape=(1, 5, 4), num_classes=2),
    "spec-pool-first": lambda: models.build("pool,conv2k7s,relu,pool,dense",
                                            input_shape=(3, 8, 9), num_classes=4),
    # pools that write inside the next conv's zero border (odd sizes, 3x3 and
    # 5x5 direct kernels), a pool after a valid conv's wide rows
    "spec-pool-padding": lambda: models.build("conv3k3,relu,pool,conv4k5s,pool,conv2k3s,dense",
                                              input_shape=(2, 13, 11), num_classes=3),
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
    acts, dacts = np.zeros(ws.acts_size), np.zeros(ws.acts_size)
    g64 = np.zeros(model.num_params)
    net64 = ops.network(ws.plan, ws.slice_size, np.float64)

    def loss64(p):
        acts[: x.size] = (x.ravel() - models.INPUT_MEAN) / models.INPUT_STD
        return network.network_loss_and_grad(p, g64, net64, acts, dacts, ws.argmax, y, 0.0)

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
    assert m.workspace(23, backward=False).slice_size == 16
    np.testing.assert_array_equal(m.predict_images(params, images, batch=23), want)  # 16 + 7


def test_the_slice_rule_slices_large_batches_of_small_models_only():
    lenet = models.build("lenet", "cifar10")
    assert lenet.workspace(64).slice_size == models.SLICE_SAMPLES == 16
    assert lenet.workspace(16).slice_size == 16
    assert lenet.workspace(8).slice_size == 8  # one slice: no partial gradient
    assert lenet.workspace(8).dacts.size == lenet.workspace(8).acts_size
    for name in ("mlp", "vgg-small"):  # parameters larger than the cache
        assert models.build(name, "cifar10").workspace(64).slice_size == 64
    tiny = models.build("conv2k3,relu,pool,dense", input_shape=(1, 8, 8), num_classes=3)
    assert tiny.workspace(64).slice_size == 64  # activations that fit in the cache


def whole_batch_workspace(model, capacity):
    """A workspace that runs every batch whole, whatever the slice rule says."""
    lowered = models.lower(model.arch, model.layout, capacity)
    return models.Workspace(lowered, model.num_params, capacity)


def test_a_batch_in_slices_has_the_whole_batch_loss_and_gradient():
    """LeNet-5 runs 40 samples as slices of 16, 16 and 8: the same loss and
    gradient as in one pass (float32 sums in another order: 1e-5 of the
    largest entry of each tensor), whatever the buffers held before."""
    m = models.build("lenet", "cifar10")
    params = m.init(2)
    x, y = batch(m, 40, seed=3)
    sliced, whole = m.workspace(40), whole_batch_workspace(m, 40)
    assert (sliced.slice_size, whole.slice_size) == (16, 40)
    results = []
    for ws in (sliced, whole):
        ws.grad[:] = np.nan
        ws.dacts[:] = np.nan
        m._load_inputs(x.reshape(40, -1), ws)
        loss = network.network_loss_and_grad(params, ws.grad, ws.net, ws.acts, ws.dacts,
                                             ws.argmax, y, 0.0)
        results.append((loss, m.tensors(ws.grad.copy())))
    (loss, grads), (want_loss, want) = results
    assert loss == pytest.approx(want_loss, rel=1e-6)
    for name, g in grads.items():
        scale = float(np.abs(want[name]).max())
        assert float(np.abs(g - want[name]).max()) <= 1e-5 * scale, name
    ref = network_logits(m, params, x)
    np.testing.assert_allclose(m.logits(params, x), ref, rtol=1e-4, atol=1e-5)  # in slices
    assert loss == pytest.approx(softmax_xent(ref, y), rel=1e-5)


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


def test_vgg_small_layout_and_summary():
    m = models.build("vgg-small", "cifar10")
    assert [(name, shape) for name, shape, _ in m.layout] == [
        ("conv1.weight", (32, 3, 3, 3)), ("conv1.bias", (32,)),
        ("conv2.weight", (64, 32, 3, 3)), ("conv2.bias", (64,)),
        ("fc1.weight", (128, 4096)), ("fc1.bias", (128,)),
        ("fc2.weight", (10, 128)), ("fc2.bias", (10,)),
    ]
    assert m.num_params == 545_098
    lines = m.summary().splitlines()
    assert lines[2].split() == ["conv1", "conv32k3s", "32x32x32", "896"]
    assert lines[-1].split() == ["total", "545,098"]
    assert [line.split()[-2] for line in lines[2:-1]] == [
        "32x32x32", "32x32x32", "32x16x16", "64x16x16", "64x16x16", "64x8x8", "128", "128",
        "10"]


def test_a_layer_list_a_spec_and_a_preset_are_the_same_model():
    layers = [Conv(32, 3, "same"), ReLU(), Pool(), Conv(64, 3, "same"), ReLU(), Pool(),
              Dense(128), ReLU(), Dense()]
    by_list = models.build(layers, "cifar10")
    by_spec = models.build("conv32k3s,relu,pool,conv64k3s,relu,pool,dense128,relu,dense10",
                           "cifar10")
    preset = models.build("vgg-small", "cifar10")
    assert by_list.layout == by_spec.layout == preset.layout
    assert by_list.spec == preset.spec == models.VGG_SMALL
    assert by_spec.spec == models.VGG_SMALL + "10"  # the class count, written out
    np.testing.assert_array_equal(by_list.workspace(3).plan, preset.workspace(3).plan)
    # lenet is the layer list it always was
    assert models.build("lenet", "cifar10").spec == (
        "conv6k5v,relu,pool,conv16k5v,relu,pool,dense120,relu,dense")


def test_spec_grammar_round_trips():
    spec = "conv8k5s,relu,pool,conv4,flatten,dense7,relu,dense"
    layers = models.parse_spec(spec)
    assert layers == [Conv(8, 5, "same"), ReLU(), Pool(), Conv(4, 3, "valid"), Flatten(),
                      Dense(7), ReLU(), Dense()]
    assert models.parse_spec(models.spec_string(layers)) == layers
    assert models.parse_spec(" Conv8K5S , RELU,dense ") == [Conv(8, 5, "same"), ReLU(), Dense()]


@pytest.mark.parametrize(("spec", "message"), [
    ("conv8,tanh,dense", "unknown layer 'tanh' (layer 2)"),
    ("", "unknown layer ''"),
    ("conv0k3,dense", "zero channels"),
    ("dense0,dense", "zero outputs"),
    ("conv8k4,dense", "kernel size must be odd"),
    ("conv8k33,dense", "too small for a 33x33 valid conv"),
    ("conv8k3s," + "pool," * 6 + "dense", "pool (layer 7): its 1x1 input is too small"),
    ("dense16,conv8,dense", "flattened before"),
    ("flatten,pool,dense", "flattened before"),
    ("conv8k3,relu", "last layer must be the dense output layer"),
    ("conv8k3,dense5", "must have 10 outputs"),
    ("dense,dense", "only the output layer may omit its width"),
])
def test_bad_specs_are_one_clear_line(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        models.build(spec, "cifar10")
    assert "\n" not in str(info.value)


def test_plan_fuses_relus_and_skips_free_flattens():
    ops = [layers.row_op(row).name for row in models.build("lenet", "cifar10").workspace(2).plan]
    assert ops == ["conv", "pool", "conv", "pool", "dense", "dense"]
    plan = models.build("vgg-small", "cifar10").workspace(2).plan
    # the second conv's padding: the first pool writes inside a zero border
    assert [layers.row_op(row).name for row in plan] == [
        "pad", "conv", "pool", "conv", "pool", "dense", "dense"]
    assert plan[2, P.P_K] == 1 and plan[2, P.P_OS] == 18 and plan[3, P.P_S] == 18
    assert plan[:, P.P_RELU].tolist() == [0, 0, 1, 0, 1, 1, 0]
    # nothing before the first conv needs a gradient
    assert plan[:, P.P_GRAD].tolist() == [0, 0, 1, 1, 1, 1, 1]
    # where the machine has AVX-512 both convs run their forwards and weight
    # gradients as vectors, the same conv from 32 channels its forward as a
    # same conv (by Winograd's F(2x2, 3x3)) and its input gradient; else the
    # 64-channel conv's gradients are GEMMs. Its scratch is last
    vectors = C.SIMD_FORWARD | C.SIMD_WEIGHTS if C.SIMD else 0
    gemms = 0 if C.SIMD else C.GEMM_WEIGHTS | C.GEMM_INPUT
    inputs = C.SIMD_INPUT | C.SIMD_SAME if C.SIMD else 0
    assert plan[:, P.P_PATH].tolist() == [0, vectors, 0, gemms | inputs | vectors, 0, 0, 0]
    # (the largest pass's: by Winograd the forward's transformed and reordered
    # weights, a padded sample, and two samples' transformed input, sums of a
    # group of 32 channels and outputs (their rows 18 apart, 288 positions),
    # the positions' extra lines and a tile; more than the input gradient's
    # (one sample at a time) and the weight gradient's 64 * 16 * 16 + 32 * 9
    # * 64 + 256; as GEMMs a block of one sample in wide rows, 16 x 18
    # columns: 2 junk of 18 are under an eighth; 32 * 9 taps' columns and 64
    # channels' products)
    winograd = (16 * 32 * 64 + 9 * 32 * 64 + 18 * 18 * 32 + 3 * 16 * 16
                + 2 * (16 * 64 * (32 + 32) + 288 * 64) + 16 * 16)
    scratch = winograd if C.SIMD else (32 * 9 + 64) * 16 * 18
    assert plan[3, P.P_COFF] == models.build("vgg-small", "cifar10").workspace(2).acts_size \
        - scratch
    # a kernel size without direct kernels runs every pass as GEMMs
    plan = models.build("conv4k7s,relu,conv3k1,dense", "cifar10").workspace(2).plan
    assert plan[plan[:, P.P_OP] == layers.CODES[C.ROW], P.P_PATH].tolist() == [C.GEMM_ALL] * 2
    # LeNet-5's second conv's forward and weight gradient (16 channels, 150
    # taps, a 5 KB input) run as vectors where the machine has AVX-512, not
    # its first conv's (6 channels)
    simd = C.SIMD_FORWARD | C.SIMD_WEIGHTS if C.SIMD else 0
    plan = models.build("lenet", "cifar10").workspace(2).plan
    assert plan[plan[:, P.P_OP] == layers.CODES[C.ROW], P.P_PATH].tolist() == [0, simd]
    # a 3x3 conv's forward runs as vectors with whole blocks of
    # vector.SIMD3_CHANNELS output channels and a vector's width of columns
    for spec, vectors in (("conv8k3,relu,dense", True), ("conv12k3,relu,dense", False),
                          ("pool,pool,conv8k3,relu,dense", False)):
        plan = models.build(spec, "cifar10").workspace(2).plan
        want = C.SIMD_FORWARD if vectors and C.SIMD else 0
        assert plan[plan[:, P.P_OP] == layers.CODES[C.ROW], P.P_PATH].tolist() == [want], spec
    plan = models.build("conv3k3s,relu,dense", "cifar10").workspace(2).plan
    assert [layers.row_op(row).name for row in plan] == [
        "pad", "conv", "relu", "flatten", "dense"]


@pytest.mark.parametrize(("name", "b"), [
    *((name, 4) for name in models.MODELS), ("pool,conv3k5s,relu,conv2k1,flatten,dense", 4),
    ("lenet", 20),  # in slices of 16 and 4
])
def test_the_training_step_allocates_nothing(name, b):
    """numba's runtime counts every array it allocates: a call of train_steps
    allocates only its arguments' wrappers, the same for 0 steps as for 6."""
    from numba.core.runtime import _nrt_python, rtsys

    m = models.build(name, "cifar10")
    params = m.init(0)
    ws = m.workspace(b)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6 * b, m.input_size), dtype=np.uint8)
    labels = rng.integers(0, 10, 6 * b)

    def allocations(steps: int) -> int:
        before = rtsys.get_allocation_stats().alloc
        network.train_steps(P.Weights(params, np.zeros_like(params)), ws.buffers,
                      P.Images(images, labels, *m.image_transform),
                      P.Steps(np.arange(6 * b), 0, steps, b, P.plain_sgd(0.001, 0.5), 0),
                      np.zeros(6), None, None)
        return rtsys.get_allocation_stats().alloc - before

    was_enabled = _nrt_python.memsys_stats_enabled()
    _nrt_python.memsys_enable_stats()
    try:
        allocations(1)  # compile
        assert allocations(6) == allocations(0)
    finally:
        if not was_enabled:
            _nrt_python.memsys_disable_stats()


def test_read_only_parameters_run_as_writable_ones():
    """Ray's object store hands out read-only arrays: the network passes take
    them (the layer ops only read the parameters) and compute the same."""
    m = models.build("lenet", "cifar10")
    params = m.init(0)
    frozen = params.copy()
    frozen.setflags(write=False)
    x, y = batch(m, 4)
    np.testing.assert_array_equal(m.logits(frozen, x), m.logits(params, x))
    images = np.random.default_rng(0).integers(0, 256, (3, 3, 32, 32), dtype=np.uint8)
    np.testing.assert_array_equal(m.predict_images(frozen, images),
                                  m.predict_images(params, images))
    assert m.loss_and_grad(frozen, x, y)[0] == m.loss_and_grad(params, x, y)[0]


def test_a_model_pickles_with_its_evaluation_workspace():
    """Ray sends a Model (with the workspace its evaluation keeps) to each
    node actor: the copy rebuilds its compiled ops and predicts the same."""
    m = models.build("lenet", "cifar10")
    params = m.init(0)
    images = np.random.default_rng(1).integers(0, 256, (5, 3, 32, 32), dtype=np.uint8)
    want = m.predict_images(params, images, batch=4)
    copy = pickle.loads(pickle.dumps(m))
    np.testing.assert_array_equal(copy.predict_images(params, images, batch=4), want)


def test_summary_columns_line_up_whatever_a_spec_s_length():
    m = models.build("vgg-bn", "cifar10")
    lines = m.summary().splitlines()[1:]
    assert any(len(line.split()[0] + line.split()[1]) > 14 for line in lines[1:-1])
    ends = {len(line) for line in lines}  # right-aligned counts end in one column
    shapes = {line.index(line.split()[-2]) + len(line.split()[-2])
              for line in lines[1:-1]}
    assert len(ends) == 1 and len(shapes) == 1
