"""The flatten kind's kernels: a compact copy of a wide map and back."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from iasgd.nn.layers.flatten import flatten_backward, flatten_forward

SHAPES = settings(max_examples=15, deadline=None)


@SHAPES
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 6), st.integers(1, 6),
       st.integers(0, 3), st.integers(0, 2**31 - 1))
def test_flatten_forward_and_backward(N, C, H, W, junk, seed):
    rng = np.random.default_rng(seed)
    S = W + junk
    x = rng.standard_normal((N, C, H, S))
    dx = np.full_like(x, np.nan)
    flat = np.full((N, C * H * W), np.nan)
    flatten_forward(x, W, flat)
    np.testing.assert_array_equal(flat, x[..., :W].reshape(N, -1))
    Rf = rng.standard_normal(flat.shape)
    flatten_backward(Rf, W, dx)
    np.testing.assert_array_equal(dx[..., :W], Rf.reshape(N, C, H, W))
    assert np.all(dx[..., W:] == 0)


