"""The dense kind's kernels against numpy (float32 vs float64, every code
path) and central finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import FD_RTOL, FWD_RTOL, central_difference

from iasgd.nn.blas import single_threaded_blas
from iasgd.nn.layers import dense as D
from iasgd.nn.layers.dense import dense_backward_input, dense_backward_weights, dense_forward

SHAPES = settings(max_examples=15, deadline=None)


dense_shapes = st.tuples(st.integers(1, 20), st.integers(1, 40), st.integers(1, 12),
                         st.integers(0, 2**31 - 1))


@SHAPES
@given(dense_shapes)
def test_dense_forward_and_backward(shape):
    N, I, O, seed = shape
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((N, I))
    w = rng.standard_normal((O, I))
    b = rng.standard_normal(O)
    out = np.zeros((N, O))
    a32, w32, b32 = (v.astype(np.float32) for v in (a, w, b))
    dense_forward(a32, w32, b32, out32 := np.zeros((N, O), np.float32))
    # against the same float32 inputs in float64, relative to the size of the
    # terms: a sum that nearly cancels would magnify the inputs' rounding
    exact = a32.astype(np.float64) @ w32.T.astype(np.float64) + b32
    terms = np.abs(a32) @ np.abs(w32.T) + np.abs(b32)
    assert np.max(np.abs(out32 - exact)) <= FWD_RTOL * np.max(terms)
    R = rng.standard_normal((N, O))

    def loss(_):
        dense_forward(a, w, b, out)
        return float(np.sum(R * out))

    dw, db, da = np.zeros_like(w), np.zeros_like(b), np.zeros_like(a)
    dense_backward_weights(a, R, dw, db)
    dense_backward_input(w, R, da)
    for arr, grad in ((w, dw), (b, db), (a, da)):
        for i in rng.choice(arr.size, min(arr.size, 6), replace=False):
            fd = central_difference(loss, arr, i)
            assert abs(fd - grad.flat[i]) <= FD_RTOL * max(1.0, abs(fd))


# One shape per code path of the dense kernels (N rows, I inputs, O outputs;
# the input gradient's loops run over O rows of weights for N rows of output):
# a short group of rows and an even O; one full group of 8 and an odd O
# (the last output paired with itself); three groups (two passes that add to
# the first) with odd O and odd N; inputs in several blocks of
# D.DENSE_BLOCK columns, the last one short, with an even and an odd O (the
# later blocks add to the first's sums); a last group of 7 rows (its eighth
# would be the row past the end); BLAS for the gradients from
# D.BLAS_MIN_ROWS rows (the forward's loops still); a single entry.
DENSE_PATHS = [(4, 20, 8), (8, 20, 7), (17, 20, 19), (11, 2 * D.DENSE_BLOCK + 5, 6),
               (3, D.DENSE_BLOCK + 8, 1), (9, 2 * D.DENSE_BLOCK + 5, 5),
               (15, 20, 9), (D.BLAS_MIN_ROWS + 3, 20, 18), (1, 1, 1)]


@pytest.mark.parametrize("N,I,O", DENSE_PATHS)
def test_dense_paths_match_numpy(N, I, O):
    """Every path of the float32 dense kernels against float64 numpy, within
    float32 rounding (1e-5 of the result's largest entry)."""
    rng = np.random.default_rng(N * I * O)
    # each input is the first rows of a larger array whose other rows are NaN:
    # a kernel that reads a row past the end spoils its result
    a, w, dout = (np.vstack([rng.standard_normal(s), np.full((8, s[1]), np.nan)])
                  .astype(np.float32)[:s[0]] for s in ((N, I), (O, I), (N, O)))
    b = rng.standard_normal(O).astype(np.float32)
    # outputs start as NaN: every entry must be written, none added to
    out, dw, db, da = (np.full(s, np.nan, np.float32) for s in ((N, O), (O, I), (O,), (N, I)))
    with single_threaded_blas():
        dense_forward(a, w, b, out)
        dense_backward_weights(a, dout, dw, db)
        dense_backward_input(w, dout, da)
    a64, w64, d64 = a.astype(np.float64), w.astype(np.float64), dout.astype(np.float64)
    for got, want in ((out, a64 @ w64.T + b), (dw, d64.T @ a64), (db, d64.sum(0)),
                      (da, d64 @ w64)):
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
