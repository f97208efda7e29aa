"""The ReLU kind's kernels."""

from __future__ import annotations

import numpy as np

from iasgd.nn.layers.relu import relu_backward_inplace, relu_inplace


def test_relu_forward_and_backward():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((4, 7)).astype(np.float32)
    r = z.copy()
    relu_inplace(r)
    np.testing.assert_array_equal(r, np.maximum(z, 0))
    d = np.ones_like(z)
    relu_backward_inplace(d, r)
    np.testing.assert_array_equal(d, (z > 0).astype(np.float32))
