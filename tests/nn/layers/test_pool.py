"""The max-pool kind's kernels against numpy and central finite differences,
with and without the fused ReLU; with a batch norm fused in, against the two
rows' kernels (each checked against numpy and finite differences in
test_batchnorm.py, where whole models with the fusion meet autograd)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import central_difference, maxpool2, relu_maxpool2

from iasgd.nn import layers, models
from iasgd.nn import plan as P
from iasgd.nn.layers.batchnorm import (
    batch_statistics,
    batchnorm_input_grad,
    batchnorm_weight_grad,
    normalise,
)
from iasgd.nn.layers.pool import (
    bn_maxpool2_forward,
    bn_maxpool2_input_grad,
    bn_maxpool2_weight_grad,
    maxpool2_backward,
    maxpool2_forward,
)

SHAPES = settings(max_examples=15, deadline=None)


# The kernels as the tests call them: out (N, C, PH, PW) without a border.
def relu_maxpool2_forward(z, width, out, argmax):
    maxpool2_forward(z, width, out, 0, argmax, True)


def plain_maxpool2_forward(z, width, out, argmax):
    maxpool2_forward(z, width, out, 0, argmax, False)


def relu_maxpool2_backward(dout, out, argmax, dz):
    maxpool2_backward(dout, out, argmax, dz, True)


def plain_maxpool2_backward(dout, out, argmax, dz):
    maxpool2_backward(dout, out, argmax, dz, False)


pool_shapes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(2, 9),
                        st.integers(2, 9), st.integers(0, 2**31 - 1))


@SHAPES
@given(pool_shapes)
def test_relu_maxpool2_forward_and_backward(shape):
    N, C, OH, OW, seed = shape
    rng = np.random.default_rng(seed)
    width = OW + 4  # the wide layout of a conv output
    z = rng.standard_normal((N, C, OH, width))
    zw = z.reshape(N, C, OH * width).copy()
    out = np.zeros((N, C, OH // 2, OW // 2))
    argmax = np.zeros(out.shape, np.int32)
    relu_maxpool2_forward(zw, width, out, argmax)
    np.testing.assert_array_equal(out, relu_maxpool2(z[..., :OW]))
    # backward vs finite differences of sum(R * pool(z))
    R = rng.standard_normal(out.shape)
    dz = np.full_like(zw, np.nan)
    relu_maxpool2_backward(R, out, argmax, dz)
    junk = zw.reshape(N, C, OH, width)[..., OW:]
    assert junk.size == 0 or np.all(dz.reshape(N, C, OH, width)[..., OW:] == 0)

    def loss(v):
        return float(np.sum(R * relu_maxpool2(v.reshape(N, C, OH, width)[..., :OW])))

    for i in rng.choice(zw.size, min(zw.size, 12), replace=False):
        assert abs(central_difference(loss, zw, i) - dz.flat[i]) < 1e-6


def test_relu_maxpool2_routes_ties_to_the_first_maximum():
    z = np.array([[[3.0, 3.0, 0, 0, 0, 0, 3.0, 3.0, 0, 0, 0, 0]]])  # one 2x2 window, width 6
    out, argmax = np.zeros((1, 1, 1, 1)), np.zeros((1, 1, 1, 1), np.int32)
    relu_maxpool2_forward(z, 6, out, argmax)
    dz = np.zeros_like(z)
    relu_maxpool2_backward(np.ones((1, 1, 1, 1)), out, argmax, dz)
    assert dz[0, 0].tolist() == [1.0] + [0.0] * 11


@SHAPES
@given(pool_shapes)
def test_maxpool2_without_relu_forward_and_backward(shape):
    N, C, OH, OW, seed = shape
    rng = np.random.default_rng(seed)
    width = OW + 2
    z = rng.standard_normal((N, C, OH, width))
    zw = z.reshape(N, C, OH * width).copy()
    out = np.zeros((N, C, OH // 2, OW // 2))
    argmax = np.zeros(out.shape, np.int32)
    plain_maxpool2_forward(zw, width, out, argmax)
    np.testing.assert_array_equal(out, maxpool2(z[..., :OW]))
    R = rng.standard_normal(out.shape)
    dz = np.full_like(zw, np.nan)
    plain_maxpool2_backward(R, out, argmax, dz)
    assert np.all(dz.reshape(N, C, OH, width)[..., OW:] == 0)

    def loss(v):
        return float(np.sum(R * maxpool2(v.reshape(N, C, OH, width)[..., :OW])))

    for i in rng.choice(zw.size, min(zw.size, 12), replace=False):
        assert abs(central_difference(loss, zw, i) - dz.flat[i]) < 1e-6


@SHAPES
@given(pool_shapes, st.integers(0, 3), st.integers(0, 2), st.booleans(), st.booleans(),
       st.booleans())
def test_a_fused_batch_norm_equals_the_two_rows(shape, junk, border, relu, training, flip):
    """bn + (ReLU +) pool as one row against batch norm's row then the pool's:
    the pooled map within 1e-14 (LLVM may contract the normalisation into
    one FMA in one loop and not the other) and its argmax equal, the border
    left alone; dgamma, dbeta and dx within 1e-12 (float64; the sums run in
    another order).
    Odd sizes (a row or column no window covers), junk columns holding
    garbage, and negative gammas (the window's maximum is its input's minimum)."""
    N, C, H, W, seed = shape
    rng = np.random.default_rng(seed)
    S = W + junk
    x = rng.standard_normal((N, C, H, S)) * 2 + 1
    gamma = rng.random(C) + 0.5
    if flip:
        gamma[::2] *= -1
    beta = rng.standard_normal(C)
    mean, var = np.empty(C), np.empty(C)
    if training:
        batch_statistics(x, W, mean, var)
    else:
        mean, var = rng.standard_normal(C), rng.random(C) + 0.5
    PH, PW, B = H // 2, W // 2, border
    # the two rows: batch norm's map, then the pool (and the ReLU) on it
    y = np.zeros_like(x)
    normalise(x, W, gamma, beta, mean, var, training, False, y)
    out = np.zeros((N, C, PH, PW))
    argmax = np.zeros(out.shape, np.int32)
    maxpool2_forward(y.reshape(N, C, H * S), S, out, 0, argmax, relu)
    # fused, into a map with a border that stays as it was
    fused = np.full((N, C, PH + 2 * B, PW + 2 * B), 7.0)
    fused_argmax = np.full(argmax.shape, -1, np.int32)
    bn_maxpool2_forward(x, W, gamma, beta, mean, var, training, fused, B, fused_argmax, relu)
    np.testing.assert_allclose(fused[:, :, B:B + PH, B:B + PW], out, rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(fused_argmax, argmax)
    inside = np.zeros(fused.shape, bool)
    inside[:, :, B:B + PH, B:B + PW] = True
    assert np.all(fused[~inside] == 7.0)
    if not training:
        return  # the backward passes run in training only

    R = rng.standard_normal(out.shape)
    dy = np.zeros_like(x)
    maxpool2_backward(R, out, argmax, dy.reshape(N, C, H * S), relu)
    dgamma, dbeta, dx = np.empty(C), np.empty(C), np.full_like(x, np.nan)
    batchnorm_weight_grad(x, dy, W, mean, var, dgamma, dbeta)
    batchnorm_input_grad(x, dy, W, gamma, mean, var, dgamma, dbeta, dx)
    fused_dgamma, fused_dbeta, fused_dx = np.empty(C), np.empty(C), np.full_like(x, np.nan)
    dout = R.copy()
    bn_maxpool2_weight_grad(x, dout, out, argmax, W, mean, var, relu, fused_dgamma, fused_dbeta)
    np.testing.assert_allclose(fused_dgamma, dgamma, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fused_dbeta, dbeta, rtol=1e-12, atol=1e-12)
    # the weight pass applied the ReLU's backward to dout in place
    np.testing.assert_array_equal(dout, R * (out > 0) if relu else R)
    bn_maxpool2_input_grad(x, dout, argmax, W, gamma, mean, var, fused_dgamma, fused_dbeta,
                           fused_dx)
    np.testing.assert_allclose(fused_dx, dx, rtol=1e-12, atol=1e-12)  # junk columns 0 in both


def test_a_fused_batch_norm_routes_ties_to_the_first_maximum():
    """Equal normalised values in a window: the first wins, as in the pool's
    own row (and PyTorch's max_pool2d), for each pair of a window's
    positions, also where gamma < 0 turns the window's minimum into its
    maximum."""
    # six windows in rows of S = 12, their maxima tied at positions (0, 1),
    # (1, S), (S, S + 1), (0, S + 1), (0, S), (1, S + 1) of the window
    x = np.array([[[[3.0, 3.0, 1.0, 3.0, 1.0, 1.0, 3.0, 1.0, 3.0, 1.0, 1.0, 3.0],
                    [1.0, 1.0, 3.0, 1.0, 3.0, 3.0, 1.0, 3.0, 3.0, 1.0, 1.0, 3.0]]]])
    out, argmax = np.zeros((1, 1, 1, 6)), np.zeros((1, 1, 1, 6), np.int32)
    one, zero = np.ones(1), np.zeros(1)
    bn_maxpool2_forward(x, 12, one, zero, zero, one, False, out, 0, argmax, False)
    assert argmax.ravel().tolist() == [0, 3, 16, 6, 8, 11]
    # gamma < 0: the 1.0s are the maxima, tied at (S, S + 1), (0, S + 1),
    # (0, 1), (1, S), (1, S + 1), (0, S)
    bn_maxpool2_forward(x, 12, -one, zero, zero, one, False, out, 0, argmax, False)
    assert argmax.ravel().tolist() == [12, 2, 4, 7, 9, 10]


def test_a_fused_batch_norm_predicts_with_the_running_statistics():
    """Prediction through the fused row normalises by the running statistics
    (the stored variance as it is: no batch's m - 1 over m), against numpy
    on one sample of four pixels, where the two would differ by a quarter."""
    m = models.build("bn,relu,pool,dense", input_shape=(2, 2, 2), num_classes=3)
    params = m.init(0)
    rng = np.random.default_rng(0)
    t = m.tensors(params)
    for name in t:
        t[name][...] = rng.random(t[name].shape) + 0.1
    t["bn1.bias"][...] = [-0.3, 0.2]
    x = rng.random((1, 2, 2, 2)).astype(np.float32)
    xin = (x[0] - models.INPUT_MEAN) / models.INPUT_STD
    shape = (2, 1, 1)
    y = ((xin - t["bn1.running_mean"].reshape(shape))
         / np.sqrt(t["bn1.running_var"].reshape(shape) + 1e-5)
         * t["bn1.weight"].reshape(shape) + t["bn1.bias"].reshape(shape))
    pooled = np.maximum(y, 0).max(axis=(1, 2))
    want = t["fc1.weight"] @ pooled + t["fc1.bias"]
    np.testing.assert_allclose(m.logits(params, x)[0], want, rtol=1e-5, atol=1e-6)


def test_a_batch_norm_before_a_pool_lowers_into_the_pools_row():
    """bn (relu) pool is one row, with the batch norm's input and tensors and
    no map of its own: the workspace holds the input, the pooled map and the
    logits only. A batch norm that is not right before a pool keeps its row."""
    m = models.build("bn,relu,pool,dense", input_shape=(2, 4, 4), num_classes=3)
    plan = m.workspace(1).plan
    assert [layers.row_op(row).name for row in plan] == ["bn+pool", "dense"]
    assert plan[:, P.P_RELU].tolist() == [1, 0]
    assert plan[:, P.P_GRAD].tolist() == [0, 1]  # on the network's input: no input gradient
    assert m.workspace(1).acts_size == 2 * 4 * 4 + 2 * 2 * 2 + 3
    offsets = dict((name, off) for name, _, off in m.layout)
    assert (plan[0, P.P_WOFF], plan[0, P.P_BOFF], plan[0, P.P_SOFF]) == (
        offsets["bn1.weight"], offsets["bn1.bias"], offsets["bn1.running_mean"])
    m = models.build("bn,relu,conv4k3s,pool,dense", input_shape=(2, 4, 4), num_classes=3)
    assert [layers.row_op(row).name for row in m.workspace(1).plan] == [
        "bn", "pad", "conv", "pool", "dense"]
