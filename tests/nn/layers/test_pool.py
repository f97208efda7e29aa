"""The max-pool kind's kernels against numpy and central finite differences,
with and without the fused ReLU."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import central_difference, maxpool2, relu_maxpool2

from iasgd.nn.layers.pool import maxpool2_backward, maxpool2_forward

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
