"""The cluster exchange's compiled vector ops against numpy, to the bit
(each is one elementwise float32 operation per parameter)."""

from __future__ import annotations

import numpy as np

from iasgd.executors import deltas


def _vectors(count: int, size: int = 1001) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(count)]


def test_difference_is_a_minus_b():
    a, b = _vectors(2)
    out = np.empty_like(a)
    deltas.difference(a, b, out)
    np.testing.assert_array_equal(out, a - b)


def test_add_scaled_adds_the_scaled_delta_in_place():
    params, delta = _vectors(2)
    expected = params + np.float32(0.25) * delta
    deltas.add_scaled(params, delta, 0.25)
    np.testing.assert_array_equal(params, expected)


def test_rebase_moves_onto_fresh_parameters_keeping_the_updates_since_the_push():
    params, base, delta, fresh = _vectors(4)
    expected = params + ((fresh - base) - delta)
    deltas.rebase(params, base, delta, fresh)
    np.testing.assert_allclose(params, expected, rtol=0, atol=1e-6)
