"""The conv kind's kernels: the direct 3x3 and 5x5 kernels and im2col + GEMM
against scipy (forward, float32 vs float64) and central finite differences
(backward, on the kernels' own float64 specialisation); the pad row."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import FD_RTOL, FWD_RTOL, central_difference, conv2d_valid, rel_err

from iasgd.nn.conv import direct, gemm
from iasgd.nn.layers.conv import pad_backward, pad_forward

SHAPES = settings(max_examples=15, deadline=None)


# The direct kernels, called as the tests' entry points: by kernel size, on
# an input whose valid width is its row stride unless given.
def conv_forward_direct(x, w, b, out, width=None):
    kernel = direct.conv5_forward if w.shape[2] == 5 else direct.conv3_forward
    kernel(x, w, b, out, x.shape[3] if width is None else width)


def conv_backward_weights_direct(x, dout, dw, db, width=None):
    kernel = direct.conv5_backward_weights if dw.shape[2] == 5 else direct.conv3_backward_weights
    kernel(x, dout, dw, db, x.shape[3] if width is None else width)


def conv_backward_input_direct(w, dout, dx, width=None):
    kernel = direct.conv5_backward_input if w.shape[2] == 5 else direct.conv3_backward_input
    kernel(w, dout, dx, dx.shape[3] if width is None else width)


conv_shapes = st.tuples(
    st.integers(1, 3),  # N
    st.integers(1, 4),  # C
    st.integers(1, 5),  # O
    st.integers(5, 12),  # H
    st.integers(5, 12),  # W
    st.integers(0, 2**31 - 1),  # seed
)


def conv_case(shape, dtype):
    N, C, O, H, W, seed = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    w = rng.standard_normal((O, C, 5, 5)).astype(dtype)
    b = rng.standard_normal(O).astype(dtype)
    return rng, x, w, b


def wide(valid: np.ndarray, W: int) -> np.ndarray:
    """(N, O, OH, OW) -> wide (N, O, OH*W) with zero junk columns."""
    N, O, OH, OW = valid.shape
    out = np.zeros((N, O, OH, W), valid.dtype)
    out[..., :OW] = valid
    return out.reshape(N, O, OH * W)


def valid_part(wide_out: np.ndarray, W: int) -> np.ndarray:
    N, O, P = wide_out.shape
    return wide_out.reshape(N, O, P // W, W)[..., : W - 4]


@SHAPES
@given(conv_shapes)
def test_conv5_forward_matches_scipy(shape):
    _, x, w, b = conv_case(shape, np.float32)
    W = x.shape[3]
    out = np.full((x.shape[0], w.shape[0], (x.shape[2] - 4) * W), np.nan, np.float32)
    conv_forward_direct(x, w, b, out)
    assert rel_err(valid_part(out, W), conv2d_valid(x, w, b)) < FWD_RTOL


@SHAPES
@given(conv_shapes)
def test_conv5_backward_matches_finite_differences(shape):
    rng, x, w, b = conv_case(shape, np.float64)
    N, C, H, W = x.shape
    O = w.shape[0]
    # loss = sum(R * conv(x)) over valid outputs, so dL/dout = R
    R = rng.standard_normal((N, O, H - 4, W - 4))
    out = np.zeros((N, O, (H - 4) * W))

    def loss(_):
        conv_forward_direct(x, w, b, out)
        return float(np.sum(R * valid_part(out, W)))

    dw, db, dx = np.zeros_like(w), np.zeros_like(b), np.full_like(x, np.nan)
    conv_backward_weights_direct(x, wide(R, W), dw, db)
    conv_backward_input_direct(w, wide(R, W), dx)
    for arr, grad in ((w, dw), (b, db), (x, dx)):
        for i in rng.choice(arr.size, min(arr.size, 6), replace=False):
            fd = central_difference(loss, arr, i)
            assert abs(fd - grad.flat[i]) <= FD_RTOL * max(1.0, abs(fd))
    # and in full against the transposed-convolution reference
    ref_dx = np.zeros_like(x)
    for n in range(N):
        for o in range(O):
            for c in range(C):
                for kh in range(5):
                    for kw in range(5):
                        ref_dx[n, c, kh:kh + H - 4, kw:kw + W - 4] += w[o, c, kh, kw] * R[n, o]
    assert rel_err(dx, ref_dx) < 1e-12


# ------------------------------------------- any kernel size, wide inputs


any_conv_shapes = st.tuples(
    st.integers(1, 2),  # N
    st.integers(1, 6),  # C (the 3x3 kernels take 4 at a time: remainders too)
    st.integers(1, 6),  # O
    st.sampled_from([1, 3, 5, 7]),  # k (the direct path maps 1 -> 3, 7 -> 5)
    st.integers(0, 5),  # H - k
    st.integers(0, 5),  # W - k
    st.integers(0, 3),  # junk columns: the input's row stride S = W + junk
    st.integers(0, 2**31 - 1),  # seed
)


def any_conv_case(shape, dtype):
    N, C, O, k, dh, dw, junk, seed = shape
    H, W = k + dh, k + dw
    S = W + junk
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, S)).astype(dtype)  # junk columns hold garbage
    w = rng.standard_normal((O, C, k, k)).astype(dtype)
    b = rng.standard_normal(O).astype(dtype)
    return rng, x, w, b, W


CONV_PATHS = ["direct", "gemm"]  # the 3x3/5x5 kernels, im2col + BLAS GEMM (any k)


def path_shape(path, shape):
    """The direct kernels take k = 3 and 5 only: map 1 -> 3 and 7 -> 5 there."""
    if path == "direct":
        N, C, O, k, *rest = shape
        return (N, C, O, {1: 3, 7: 5}.get(k, k), *rest)
    return shape


def gemm_scratch(x, w, W):
    """The GEMM passes' flat scratch, acts' and dacts', NaN: all they read they wrote."""
    _, C, H, _ = x.shape
    O, _, k, _ = w.shape
    sizes = gemm.scratch_sizes(C * k * k, O, H - k + 1, W - k + 1, x.shape[3])
    return [np.full(size, np.nan, x.dtype) for size in sizes]


def conv_forward(path, x, w, b, out, W):
    if path == "direct":
        conv_forward_direct(x, w, b, out, W)
        return
    O = w.shape[0]
    CKK = w[0].size
    acts, _ = gemm_scratch(x, w, W)
    cols = acts.size // (CKK + O)
    gemm.conv_forward_gemm(x, w.reshape(O, -1), b, out, W, acts[:CKK * cols], acts[CKK * cols:])


def conv_backward(path, x, w, dout, dw, db, dx, W):
    if path == "direct":
        conv_backward_weights_direct(x, dout, dw, db, W)
        conv_backward_input_direct(w, dout, dx, W)
        return
    O = w.shape[0]
    CKK = w[0].size
    acts, dacts = gemm_scratch(x, w, W)
    cols = acts.size // (CKK + O)
    sums = O * cols
    acc = dacts[sums:sums + CKK * O].reshape(CKK, O)
    tmp = dacts[sums + CKK * O:sums + 2 * CKK * O].reshape(CKK, O)
    gemm.conv_backward_weights_gemm(x, dout, dw.reshape(O, -1), db, W, acts[:CKK * cols],
                                    dacts[:sums], acc, tmp)
    gemm.conv_backward_input_gemm(w.reshape(O, -1), dout, dx, W, dacts[:sums],
                                  dacts[sums:sums + CKK * cols])


@pytest.mark.parametrize("path", CONV_PATHS)
@SHAPES
@given(any_conv_shapes)
def test_conv_forward_any_kernel_on_wide_input_matches_scipy(path, shape):
    _, x, w, b, W = any_conv_case(path_shape(path, shape), np.float32)
    N, _, H, S = x.shape
    k = w.shape[2]
    out = np.full((N, w.shape[0], (H - k + 1) * S), np.nan, np.float32)
    conv_forward(path, x, w, b, out, W)
    got = out.reshape(N, -1, H - k + 1, S)[..., : W - k + 1]
    assert rel_err(got, conv2d_valid(x[..., :W], w, b)) < FWD_RTOL


@pytest.mark.parametrize("path", CONV_PATHS)
@SHAPES
@given(any_conv_shapes)
def test_conv_backward_any_kernel_matches_finite_differences(path, shape):
    rng, x, w, b, W = any_conv_case(path_shape(path, shape), np.float64)
    N, C, H, S = x.shape
    O, _, k, _ = w.shape
    OH, OW = H - k + 1, W - k + 1
    R = rng.standard_normal((N, O, OH, OW))
    Rw = np.zeros((N, O, OH, S))
    Rw[..., :OW] = R
    Rw = Rw.reshape(N, O, OH * S)
    out = np.zeros((N, O, OH * S))

    def loss(_):
        conv_forward(path, x, w, b, out, W)
        return float(np.sum(R * out.reshape(N, O, OH, S)[..., :OW]))

    dw, db, dx = np.zeros_like(w), np.zeros_like(b), np.full_like(x, np.nan)
    conv_backward(path, x, w, Rw, dw, db, dx, W)
    for arr, grad in ((w, dw), (b, db)):
        for i in rng.choice(arr.size, min(arr.size, 6), replace=False):
            fd = central_difference(loss, arr, i)
            assert abs(fd - grad.flat[i]) <= FD_RTOL * max(1.0, abs(fd))
    for _ in range(6):  # inputs in the valid columns
        at = (rng.integers(N), rng.integers(C), rng.integers(H), rng.integers(W))
        fd = central_difference(loss, x, int(np.ravel_multi_index(at, x.shape)))
        assert abs(fd - dx[at]) <= FD_RTOL * max(1.0, abs(fd))
    # dx in full against the transposed convolution; junk columns exactly zero
    ref_dx = np.zeros((N, C, H, W))
    for n in range(N):
        for o in range(O):
            for c in range(C):
                for kh in range(k):
                    for kw in range(k):
                        ref_dx[n, c, kh:kh + OH, kw:kw + OW] += w[o, c, kh, kw] * R[n, o]
    assert rel_err(dx[..., :W], ref_dx) < 1e-12
    assert np.all(dx[..., W:] == 0)


# Blocks of samples: (N, H, W, S) with more samples than one GEMM block holds
# and a last block of one sample, in both column layouts, and R, a row's
# columns: 28 valid in rows of 30 (junk under an eighth: whole rows, 210
# columns a sample, blocks of 2, the last computed in place), 8 in rows of 10
# (the valid ones: 64 a sample, blocks of 8), 20 in rows of 23 (blocks of 2).
BLOCKED = [(5, 9, 30, 30, 30), (9, 10, 10, 10, 8), (5, 12, 22, 23, 20)]


@pytest.mark.parametrize(("N", "H", "W", "S", "R"), BLOCKED)
def test_gemm_passes_over_several_blocks_match_numpy(N, H, W, S, R):
    C, O, k = 2, 3, 3
    OH, OW = H - k + 1, W - k + 1
    assert gemm.column_stride.py_func(S, OW) == R
    assert gemm.block_samples.py_func(OH * R) < N  # several blocks
    assert N % gemm.block_samples.py_func(OH * R) == 1  # the last is one sample
    rng = np.random.default_rng(7)
    x = rng.standard_normal((N, C, H, S))  # junk columns hold garbage
    w = rng.standard_normal((O, C, k, k))
    b = rng.standard_normal(O)
    R_out = rng.standard_normal((N, O, OH, OW))
    dout = np.zeros((N, O, OH, S))  # an output gradient's junk columns are 0
    dout[..., :OW] = R_out
    dout = dout.reshape(N, O, OH * S)

    out = np.full((N, O, OH * S), np.nan)
    conv_forward("gemm", x, w, b, out, W)
    out = out.reshape(N, O, OH, S)
    assert rel_err(out[..., :OW], conv2d_valid(x[..., :W], w, b)) < 1e-12
    assert np.all(out[..., OW:] == 0)

    dw, db, dx = np.full_like(w, np.nan), np.full_like(b, np.nan), np.full_like(x, np.nan)
    conv_backward("gemm", x, w, dout, dw, db, dx, W)
    windows = np.lib.stride_tricks.sliding_window_view(x[..., :W], (k, k), axis=(2, 3))
    assert rel_err(dw, np.einsum("nchwij,nohw->ocij", windows, R_out)) < 1e-12
    assert rel_err(db, R_out.sum(axis=(0, 2, 3))) < 1e-12
    ref_dx = np.zeros((N, C, H, W))
    for kh in range(k):
        for kw in range(k):
            ref_dx[:, :, kh:kh + OH, kw:kw + OW] += np.einsum("oc,nohw->nchw", w[:, :, kh, kw],
                                                              R_out)
    assert rel_err(dx[..., :W], ref_dx) < 1e-12
    assert np.all(dx[..., W:] == 0)


@SHAPES
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 6), st.integers(1, 6),
       st.integers(0, 3), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_pad_forward_and_backward(N, C, H, W, junk, border, seed):
    rng = np.random.default_rng(seed)
    S = W + junk
    x = rng.standard_normal((N, C, H, S))
    padded = np.full((N, C, H + 2 * border, W + 2 * border), np.nan)
    pad_forward(x, W, border, padded)
    want = np.pad(x[..., :W], ((0, 0), (0, 0), (border, border), (border, border)))
    np.testing.assert_array_equal(padded, want)
    R = rng.standard_normal(padded.shape)
    dx = np.full_like(x, np.nan)
    pad_backward(R, W, border, dx)
    np.testing.assert_array_equal(dx[..., :W], R[:, :, border:-border, border:-border])
    assert np.all(dx[..., W:] == 0)
