"""Every kernel against a numpy/scipy reference (forward, float32 vs float64,
relative tolerance 1e-5) and against central finite differences (backward, on
the kernels' own float64 specialisation, tolerance 1e-6 relative)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    central_difference,
    conv2d_valid,
    maxpool2,
    relu_maxpool2,
    softmax_xent,
)

from iasgd.nn import kernels as K
from iasgd.nn.blas import single_threaded_blas

FWD_RTOL = 1e-5  # float32 kernels vs float64 references, relative to the max
FD_RTOL = 1e-6   # float64 kernels vs central differences
SHAPES = settings(max_examples=15, deadline=None)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


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
    K.conv5_forward(x, w, b, out)
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
        K.conv5_forward(x, w, b, out)
        return float(np.sum(R * valid_part(out, W)))

    dw, db, dx = np.zeros_like(w), np.zeros_like(b), np.full_like(x, np.nan)
    K.conv5_backward_weights(x, wide(R, W), dw, db)
    K.conv5_backward_input(w, wide(R, W), dx)
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
    K.relu_maxpool2_forward(zw, width, out, argmax)
    np.testing.assert_array_equal(out, relu_maxpool2(z[..., :OW]))
    # backward vs finite differences of sum(R * pool(z))
    R = rng.standard_normal(out.shape)
    dz = np.full_like(zw, np.nan)
    K.relu_maxpool2_backward(R, out, argmax, dz)
    junk = zw.reshape(N, C, OH, width)[..., OW:]
    assert junk.size == 0 or np.all(dz.reshape(N, C, OH, width)[..., OW:] == 0)

    def loss(v):
        return float(np.sum(R * relu_maxpool2(v.reshape(N, C, OH, width)[..., :OW])))

    for i in rng.choice(zw.size, min(zw.size, 12), replace=False):
        assert abs(central_difference(loss, zw, i) - dz.flat[i]) < 1e-6


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
    K.dense_forward(a32, w32, b32, out32 := np.zeros((N, O), np.float32))
    # against the same float32 inputs in float64, relative to the size of the
    # terms: a sum that nearly cancels would magnify the inputs' rounding
    exact = a32.astype(np.float64) @ w32.T.astype(np.float64) + b32
    terms = np.abs(a32) @ np.abs(w32.T) + np.abs(b32)
    assert np.max(np.abs(out32 - exact)) <= FWD_RTOL * np.max(terms)
    R = rng.standard_normal((N, O))

    def loss(_):
        K.dense_forward(a, w, b, out)
        return float(np.sum(R * out))

    dw, db, da = np.zeros_like(w), np.zeros_like(b), np.zeros_like(a)
    K.dense_backward_weights(a, R, dw, db)
    K.dense_backward_input(w, R, da)
    for arr, grad in ((w, dw), (b, db), (a, da)):
        for i in rng.choice(arr.size, min(arr.size, 6), replace=False):
            fd = central_difference(loss, arr, i)
            assert abs(fd - grad.flat[i]) <= FD_RTOL * max(1.0, abs(fd))


# One shape per code path of the dense kernels (N rows, I inputs, O outputs;
# the input gradient's loops run over O rows of weights for N rows of output):
# a short group of rows and an even O; one full group of 8 and an odd O
# (the last output paired with itself); three groups (two passes that add to
# the first) with odd O and odd N; inputs in several blocks of
# K.DENSE_BLOCK columns, the last one short, with an even and an odd O (the
# later blocks add to the first's sums); a last group of 7 rows (its eighth
# would be the row past the end); BLAS for the gradients from
# K.BLAS_MIN_ROWS rows (the forward's loops still); a single entry.
DENSE_PATHS = [(4, 20, 8), (8, 20, 7), (17, 20, 19), (11, 2 * K.DENSE_BLOCK + 5, 6),
               (3, K.DENSE_BLOCK + 8, 1), (9, 2 * K.DENSE_BLOCK + 5, 5),
               (15, 20, 9), (K.BLAS_MIN_ROWS + 3, 20, 18), (1, 1, 1)]


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
        K.dense_forward(a, w, b, out)
        K.dense_backward_weights(a, dout, dw, db)
        K.dense_backward_input(w, dout, da)
    a64, w64, d64 = a.astype(np.float64), w.astype(np.float64), dout.astype(np.float64)
    for got, want in ((out, a64 @ w64.T + b), (dw, d64.T @ a64), (db, d64.sum(0)),
                      (da, d64 @ w64)):
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_relu_forward_and_backward():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((4, 7)).astype(np.float32)
    r = z.copy()
    K.relu_inplace(r)
    np.testing.assert_array_equal(r, np.maximum(z, 0))
    d = np.ones_like(z)
    K.relu_backward_inplace(d, r)
    np.testing.assert_array_equal(d, (z > 0).astype(np.float32))


@SHAPES
@given(st.integers(1, 6), st.integers(2, 12), st.floats(0.1, 30), st.integers(0, 2**31 - 1))
def test_softmax_cross_entropy(n, k, scale, seed):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, k)) * scale
    labels = rng.integers(0, k, n)
    d32 = np.zeros((n, k), np.float32)
    loss32 = K.softmax_cross_entropy(logits.astype(np.float32), labels, d32, n)
    assert loss32 == pytest.approx(softmax_xent(logits, labels), rel=1e-5, abs=1e-5)
    d = np.zeros((n, k))
    loss = K.softmax_cross_entropy(logits, labels, d, n)
    for i in rng.choice(logits.size, min(logits.size, 6), replace=False):
        fd = central_difference(lambda v: softmax_xent(v, labels), logits, i)
        assert abs(fd - d.flat[i]) < 1e-6
    # a batch in two slices: their shares add up to the whole batch's loss and gradient
    cut = n // 2
    parts = np.zeros((n, k))
    share = (K.softmax_cross_entropy(logits[:cut], labels[:cut], parts[:cut], n)
             + K.softmax_cross_entropy(logits[cut:], labels[cut:], parts[cut:], n))
    assert share == pytest.approx(loss, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(parts, d, rtol=1e-12, atol=1e-15)


def test_softmax_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[1e4, 0.0, -1e4]], np.float32)
    d = np.zeros_like(logits)
    assert K.softmax_cross_entropy(logits, np.array([1]), d, 1) == pytest.approx(1e4)
    assert np.all(np.isfinite(d))


def test_sgd_momentum_update_matches_formula():
    rng = np.random.default_rng(3)
    p, v, g = (rng.standard_normal(50).astype(np.float32) for _ in range(3))
    want_v = 0.9 * v + g
    want_p = p - 0.1 * want_v
    K.sgd_momentum_update(p, v, g, 0.1, 0.9)
    # float32 with fused multiply-add: agree to a few ulps
    np.testing.assert_allclose(v, want_v, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(p, want_p, rtol=1e-6, atol=1e-6)


def test_gather_images_transforms_rows():
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (10, 12), dtype=np.uint8)
    idx = np.array([3, 3, 9, 0])
    x = np.zeros((4, 12), np.float32)
    K.gather_images(images, idx, 2 / 255, -1.0, x)
    np.testing.assert_allclose(x, images[idx] * (2 / 255) - 1, rtol=1e-6, atol=1e-6)


def test_affine_copy():
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    dst = np.zeros(6, np.float32)
    K.affine_copy(src, 2.0, -1.0, dst)
    np.testing.assert_array_equal(dst, np.arange(6) * 2 - 1)


def test_argmax_rows_takes_first_maximum():
    scores = np.array([[1.0, 3.0, 3.0], [5.0, 5.0, 0.0]], np.float32)
    out = np.zeros(2, np.int64)
    K.argmax_rows(scores, out)
    assert out.tolist() == [1, 0]


def test_relu_maxpool2_routes_ties_to_the_first_maximum():
    z = np.array([[[3.0, 3.0, 0, 0, 0, 0, 3.0, 3.0, 0, 0, 0, 0]]])  # one 2x2 window, width 6
    out, argmax = np.zeros((1, 1, 1, 1)), np.zeros((1, 1, 1, 1), np.int32)
    K.relu_maxpool2_forward(z, 6, out, argmax)
    dz = np.zeros_like(z)
    K.relu_maxpool2_backward(np.ones((1, 1, 1, 1)), out, argmax, dz)
    assert dz[0, 0].tolist() == [1.0] + [0.0] * 11


@pytest.mark.parametrize("preset", ["lenet", "vgg-small"])
def test_train_steps_match_pytorch_sgd(preset):
    """40 steps of LeNet-5 / vgg-small with momentum, step by step against
    PyTorch's SGD on the same batches from the same initial parameters."""
    torch = pytest.importorskip("torch")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from torch_reference import torch_flat_params, torch_inputs, torch_net

    from iasgd.nn import models

    torch.set_num_threads(1)
    m = models.build(preset, "cifar10")
    params = m.init(0)
    net = torch_net(m, params)
    opt = torch.optim.SGD(net.parameters(), lr=0.005, momentum=0.5)
    rng = np.random.default_rng(0)
    steps, b = 40, 16
    images = rng.integers(0, 256, (steps * b, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, steps * b)
    ws = m.workspace(b)
    losses = np.zeros(steps)
    K.train_steps(K.Weights(params, np.zeros_like(params)), ws.buffers,
                  K.Images(images.reshape(steps * b, -1), labels, *m.image_transform),
                  K.Steps(np.arange(steps * b), 0, steps, b, 0.005, 0.5), losses)
    for s in range(steps):
        batch = slice(s * b, (s + 1) * b)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch_inputs(images[batch])),
                                                 torch.from_numpy(labels[batch]))
        loss.backward()
        opt.step()
        assert losses[s] == pytest.approx(loss.item(), abs=1e-5)
    # float32 sums in another order; seen: 1.5e-8 (lenet), 1.8e-7 (vgg-small)
    np.testing.assert_allclose(params, torch_flat_params(net), atol=1e-6)


# ------------------------------------------- any kernel size, wide inputs, pad/flatten


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


def conv_forward(path, x, w, b, out, W):
    if path == "direct":
        K.conv_forward(x, w, b, out, W)
        return
    _, C, H, S = x.shape
    O, _, k, _ = w.shape
    col = np.full((C * k * k, (H - k + 1) * S), np.nan, x.dtype)  # all of it written
    K.conv_forward_gemm(x, w.reshape(O, -1), b, out, W, col)


def conv_backward(path, x, w, dout, dw, db, dx, W):
    if path == "direct":
        K.conv_backward_weights(x, dout, dw, db, W)
        K.conv_backward_input(w, dout, dx, W)
        return
    _, C, H, S = x.shape
    O, _, k, _ = w.shape
    col = np.full((C * k * k, (H - k + 1) * S), np.nan, x.dtype)
    acc, tmp = (np.full((C * k * k, O), np.nan, x.dtype) for _ in range(2))
    K.conv_backward_weights_gemm(x, dout, dw.reshape(O, -1), db, W, col, acc, tmp)
    K.conv_backward_input_gemm(w.reshape(O, -1), dout, dx, W, col)


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


@SHAPES
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 6), st.integers(1, 6),
       st.integers(0, 3), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_pad_and_flatten_forward_and_backward(N, C, H, W, junk, border, seed):
    rng = np.random.default_rng(seed)
    S = W + junk
    x = rng.standard_normal((N, C, H, S))
    padded = np.full((N, C, H + 2 * border, W + 2 * border), np.nan)
    K.pad_forward(x, W, border, padded)
    want = np.pad(x[..., :W], ((0, 0), (0, 0), (border, border), (border, border)))
    np.testing.assert_array_equal(padded, want)
    R = rng.standard_normal(padded.shape)
    dx = np.full_like(x, np.nan)
    K.pad_backward(R, W, border, dx)
    np.testing.assert_array_equal(dx[..., :W], R[:, :, border:-border, border:-border])
    assert np.all(dx[..., W:] == 0)

    flat = np.full((N, C * H * W), np.nan)
    K.flatten_forward(x, W, flat)
    np.testing.assert_array_equal(flat, x[..., :W].reshape(N, -1))
    Rf = rng.standard_normal(flat.shape)
    K.flatten_backward(Rf, W, dx)
    np.testing.assert_array_equal(dx[..., :W], Rf.reshape(N, C, H, W))
    assert np.all(dx[..., W:] == 0)


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
    K.maxpool2_forward(zw, width, out, argmax)
    np.testing.assert_array_equal(out, maxpool2(z[..., :OW]))
    R = rng.standard_normal(out.shape)
    dz = np.full_like(zw, np.nan)
    K.maxpool2_backward(R, out, argmax, dz)
    assert np.all(dz.reshape(N, C, OH, width)[..., OW:] == 0)

    def loss(v):
        return float(np.sum(R * maxpool2(v.reshape(N, C, OH, width)[..., :OW])))

    for i in rng.choice(zw.size, min(zw.size, 12), replace=False):
        assert abs(central_difference(loss, zw, i) - dz.flat[i]) < 1e-6


def test_single_threaded_blas_limits_the_blas_the_kernels_call():
    """numba's np.dot calls scipy's OpenBLAS: inside the context it (and any
    other BLAS loaded) runs one thread; the limits come back after."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with single_threaded_blas():
        blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
        assert any("scipy" in i["filepath"] and "64_" not in i["filepath"] for i in blas)
        assert all(i["num_threads"] == 1 for i in blas)
