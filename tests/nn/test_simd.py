"""iasgd.nn.simd's vectors and the explicit-vector conv passes, against numpy
and scipy."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import conv2d_valid

from iasgd.compiled import jit
from iasgd.nn import simd
from iasgd.nn.conv import vector as V
from iasgd.nn.conv import vector_weights as VW


@jit
def _fma_of_loaded(a, b, c, out):
    """out[:16] = a[1:17] * b[0] + c[:16] + b[0], through every intrinsic."""
    product = simd.fma(simd.load(a, 1), simd.splat(b[0]), simd.load(c, 0))
    simd.store(out, 0, simd.add(product, simd.splat_at(b, 0)))


def test_load_splat_fma_store_match_numpy():
    rng = np.random.default_rng(0)
    a, c = (rng.standard_normal(20).astype(np.float32) for _ in range(2))
    b = np.float32([1.5])
    out = np.full(20, np.nan, np.float32)
    _fma_of_loaded(a, b, c, out)
    np.testing.assert_allclose(out[:16], a[1:17] * b[0] + c[:16] + b[0], rtol=1e-6)
    assert np.isnan(out[16:]).all()  # 16 lanes, no more


@jit
def _first_minus_fill_and_total(a, at, count, fill, out):
    """out[:16] = load_first(a, at, count, fill) - fill; out[16] = their total."""
    v = simd.sub(simd.load_first(a, at, count, fill), simd.splat(fill))
    simd.store(out, 0, v)
    out[16] = simd.total(v)


def test_load_first_reads_count_lanes_fills_the_rest_and_total_adds_them():
    """The lanes past `count` hold the fill and are never read (NaN there
    would show)."""
    rng = np.random.default_rng(1)
    for count in (0, 1, 7, 15, 16, 30):
        size = min(count, 16)
        a = np.full(size + 16, np.nan, np.float32)
        a[:size] = rng.standard_normal(size)
        out = np.full(18, np.nan, np.float32)
        _first_minus_fill_and_total(a, 0, count, np.float32(0.25), out)
        want = np.zeros(16, np.float32)
        want[:size] = a[:size] - np.float32(0.25)
        np.testing.assert_array_equal(out[:16], want)
        assert out[16] == pytest.approx(float(want.sum()), rel=1e-6, abs=1e-6)
        assert np.isnan(out[17])


@jit
def _masked(a, at, bits, out):
    simd.store(out, 0, simd.load_masked(a, at, bits))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**16 - 1), st.integers(0, 8))
def test_load_masked_reads_the_lanes_of_set_bits_and_zeros_the_rest(bits, at):
    """Lane l holds a[at + l] where bit l is set, 0 elsewhere; NaN in the
    lanes left out never shows (they are not read)."""
    rng = np.random.default_rng(bits)
    a = rng.standard_normal(at + 16).astype(np.float32)
    lanes = np.array([bits >> lane & 1 for lane in range(16)], bool)
    a[at:][~lanes] = np.nan
    out = np.full(17, np.nan, np.float32)
    _masked(a, at, bits, out)
    np.testing.assert_array_equal(out[:16], np.where(lanes, a[at:at + 16], 0))
    assert np.isnan(out[16])


@jit
def _store_masked(a, at, bits, out):
    simd.store_masked(out, at, simd.load(a, 0), bits)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**16 - 1), st.integers(0, 8))
def test_store_masked_writes_the_lanes_of_set_bits_and_nothing_else(bits, at):
    a = np.arange(16, dtype=np.float32)
    out = np.full(at + 17, np.nan, np.float32)
    _store_masked(a, at, bits, out)
    lanes = np.array([bits >> lane & 1 for lane in range(16)], bool)
    np.testing.assert_array_equal(out[at:at + 16], np.where(lanes, a, np.nan))
    assert np.isnan(out[:at]).all() and np.isnan(out[at + 16])


def test_the_vectors_take_float32_arrays_only():
    with pytest.raises(numba.core.errors.TypingError):
        numba.njit(lambda a: simd.load(a, 0))(np.zeros(16))


@jit
def _transpose(src, src_at, src_stride, dst, dst_at, dst_stride):
    simd.transpose(src, src_at, src_stride, dst, dst_at, dst_stride)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 5), st.integers(16, 21), st.integers(0, 5), st.integers(16, 21))
def test_transpose_copies_a_16_by_16_block_transposed_and_nothing_else(a, sa, b, sb):
    src = np.random.default_rng(a + sa).standard_normal(a + 16 * sa + 3).astype(np.float32)
    dst = np.full(b + 16 * sb + 3, np.nan, np.float32)
    _transpose(src, a, sa, dst, b, sb)
    block = np.lib.stride_tricks.as_strided(src[a:], (16, 16), (4 * sa, 4))
    written = np.lib.stride_tricks.as_strided(dst[b:], (16, 16), (4 * sb, 4))
    np.testing.assert_array_equal(written, block.T)
    mask = np.ones(dst.size, bool)
    for c in range(16):
        mask[b + c * sb:b + c * sb + 16] = False
    assert np.isnan(dst[mask]).all()


simd_conv_shapes = st.tuples(
    st.integers(1, 2),  # N
    st.integers(1, 5),  # C
    st.sampled_from([16, 32]),  # O: whole vectors of output channels
    st.integers(0, 3),  # H - k
    st.integers(V.SIMD_BLOCK, V.SIMD_BLOCK + 13),  # OW: one block, several, a moved-back last one
    st.integers(0, 3),  # junk columns: the row stride S = W + junk
    st.integers(0, 2**31 - 1),
)


@settings(max_examples=20, deadline=None)
@given(simd_conv_shapes)
def test_conv5_forward_simd_matches_scipy(shape):
    N, C, O, dh, OW, junk, seed = shape
    k = 5
    H, W = k + dh, OW + k - 1
    S = W + junk
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, S)).astype(np.float32)  # junk columns hold garbage
    w = rng.standard_normal((O, C, k, k)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    groups = w.reshape(O // simd.LANES, simd.LANES, C, k, k)
    wt = np.ascontiguousarray(groups.transpose(0, 2, 3, 4, 1)).ravel()  # (O/16, C, k, k, 16)
    out = np.full((N, O, (H - k + 1) * S), np.nan, np.float32)
    V.conv5_forward_simd(x, wt, b, out, W, np.zeros(V.SIMD_BLOCK * simd.LANES, np.float32))
    got = out.reshape(N, O, H - k + 1, S)[..., :OW]
    want = conv2d_valid(x[..., :W].astype(np.float64), w.astype(np.float64), b)
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


@settings(max_examples=20, deadline=None)
@given(st.tuples(
    st.integers(1, 2),  # N
    st.integers(1, 5),  # C
    st.sampled_from([8, 16, 24]),  # O: whole blocks of V.SIMD3_CHANNELS
    st.integers(2, 5),  # OH: a pair of rows, several, an odd last one
    st.integers(simd.LANES, simd.LANES + 20),  # OW: one vector, several, a moved-back last one
    st.integers(0, 3),  # junk columns
    st.integers(0, 2**31 - 1),
))
def test_conv3_forward_simd_matches_scipy(shape):
    N, C, O, OH, OW, junk, seed = shape
    k = 3
    H, W = OH + k - 1, OW + k - 1
    S = W + junk
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, S)).astype(np.float32)  # junk columns hold garbage
    w = rng.standard_normal((O, C, k, k)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    G = V.SIMD3_CHANNELS
    wt = np.ascontiguousarray(w.reshape(O // G, G, C, k, k).transpose(0, 2, 3, 4, 1)).ravel()
    out = np.full((N, O, OH * S), np.nan, np.float32)
    V.conv3_forward_simd(x, wt, b, out, W)
    got = out.reshape(N, O, OH, S)
    want = conv2d_valid(x[..., :W].astype(np.float64), w.astype(np.float64), b)
    assert np.abs(got[..., :OW] - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert np.isnan(got[..., OW:]).all()  # junk columns: not written


@settings(max_examples=20, deadline=None)
@given(st.tuples(
    st.integers(1, 3),  # N
    st.integers(1, 8),  # C
    st.sampled_from([16, 32]),  # O: whole vectors of output channels
    st.integers(0, 3),  # H - k
    st.integers(1, 13),  # OW: odd and even (pixels go in pairs)
    st.integers(0, 3),  # junk columns
    st.integers(0, 2**31 - 1),
))
def test_conv5_backward_weights_simd_matches_numpy(shape):
    N, C, O, dh, OW, junk, seed = shape
    check_weight_gradient(VW.conv5_backward_weights_simd, 5, (N, C, O, dh + 1, OW, junk, seed),
                          ((dh + 1) * OW + C * 25) * simd.LANES)


@settings(max_examples=25, deadline=None)
@given(st.tuples(
    st.integers(1, 3),  # N
    st.integers(1, 5),  # C
    st.sampled_from([32, 64]),  # O: whole groups of SIMD3_WEIGHT_CHANNELS
    st.integers(1, 6),  # OH: one block of rows, several (WEIGHTS3_BLOCK)
    st.integers(1, 36),  # OW: whole vectors of columns, a short last one, only that
    st.integers(0, 3),  # junk columns
    st.integers(0, 2**31 - 1),
))
def test_conv3_backward_weights_simd_matches_numpy(shape):
    """The output gradient's rows go into the lanes 16 columns at a time; a
    short last block reads on into the next row or channel, except at the
    end of the batch."""
    _, C, O, OH, OW, *_ = shape
    check_weight_gradient(VW.conv3_backward_weights_simd, 3, shape,
                          VW.weights3_scratch_floats(C, O, OH, OW))


def check_weight_gradient(kernel, k, shape, scratch_floats):
    """dw[o, c, kh, kw] = sum over samples and output pixels of dout * the
    input under tap (kh, kw); db[o] = the sum of dout: numpy in float64.
    The input's junk columns are NaN (never read), the scratch starts as
    NaN (all it reads it wrote)."""
    N, C, O, OH, OW, junk, seed = shape
    H, W = OH + k - 1, OW + k - 1
    S = W + junk
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, S)).astype(np.float32)
    x[..., W:] = np.nan
    dout = rng.standard_normal((N, O, OH, S)).astype(np.float32)
    dout[..., OW:] = 0  # the kernels' contract: zero in junk columns
    dw = np.full((O, C, k, k), np.nan, np.float32)
    db = np.full(O, np.nan, np.float32)
    kernel(x, dout.reshape(N, O, OH * S), dw, db, W, np.full(scratch_floats, np.nan, np.float32))
    windows = np.lib.stride_tricks.sliding_window_view(x[..., :W].astype(np.float64),
                                                       (k, k), axis=(2, 3))  # (N, C, OH, OW, k, k)
    want = np.einsum("noij,ncijhw->ochw", dout[..., :OW].astype(np.float64), windows)
    assert np.abs(dw - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    np.testing.assert_allclose(db, dout.sum(axis=(0, 2, 3), dtype=np.float64), rtol=1e-5,
                               atol=1e-5)


@jit
def _input_lanes(w, dout, dx, width, scratch):
    """conv3_input_lanes, an overload that only compiled code can call."""
    V.conv3_input_lanes(w, dout, dx, width, scratch)


@jit
def _same_forward_lanes(x, w, b, out, width, scratch):
    V.conv3_same_forward_lanes(x, w, b, out, width, scratch)


def test_side_by_side_takes_the_fewest_vectors_for_the_slice():
    """Narrow maps go side by side to at least a vector of outputs, as many
    as make the slice's groups take the fewest vectors (the smaller count
    on ties): vgg-bn's 8 x 8 maps two at a time (a vector exactly); maps
    of 5 columns four at a time in a slice of 3 (two vectors), all nine of
    a slice of 9 (three), all five of a slice of 5 (two, where groups of
    four take four); a vector's width and more alone."""
    assert [V.side_by_side(8, n) for n in (16, 64, 8, 1)] == [2, 2, 2, 2]
    assert [V.side_by_side(5, n) for n in (3, 9, 5, 1)] == [4, 9, 5, 4]
    L = simd.LANES
    for width in range(1, 40):
        for n in (1, 2, 5, 9, 16, 17, 33, 64, 100):
            p = V.side_by_side(width, n)
            assert 1 <= p <= 16 and (p * width >= L or width >= L)
            assert (p == 1) == (width >= L)
            if width >= L:
                continue
            vectors = {q: -(-n // q) * -(-(q * width) // L)
                       for q in range(1, 17) if q * width >= L}
            assert vectors[p] == min(vectors.values())
            assert p == min(q for q, v in vectors.items() if v == vectors[p])
            assert V.most_side_by_side(width, n) >= p


narrow_or_wide = st.tuples(
    st.integers(1, 17),  # N: a last group of fewer samples side by side, 16 of 8 columns
    st.integers(1, 5),  # the channels the kernel reads
    st.integers(2, 5),  # OH: a pair of rows, several, an odd last one
    st.integers(1, 36),  # OW: side by side below a vector's width, alone above
    st.integers(0, 3),  # junk columns
    st.integers(0, 2**31 - 1),
)


def transposed_conv(w, dout):
    """dx[n, c] = sum over o of dout[n, o] spread by w[o, c] (N, C, OH+2,
    OW+2), in float64: the full input gradient of a valid 3x3 conv."""
    N, _, OH, OW = dout.shape
    want = np.zeros((N, w.shape[1], OH + 2, OW + 2))
    for kh in range(3):
        for kw in range(3):
            want[:, :, kh:kh + OH, kw:kw + OW] += np.einsum(
                "oc,noij->ncij", w[:, :, kh, kw].astype(np.float64), dout.astype(np.float64))
    return want


@settings(max_examples=25, deadline=None)
@given(narrow_or_wide, st.sampled_from([8, 16]), st.integers(0, 8))
def test_conv3_input_lanes_matches_the_transposed_conv_inside_the_border(shape, C, slack):
    """The input gradient of a "same" 3x3 conv through conv3_input_lanes:
    the weights flipped and reordered, the output gradient padded (side by
    side where narrow), in scratch that starts as UNWRITTEN (all it reads it
    wrote; sized for a workspace of up to N + `slack` samples, whose P may
    be smaller than N's), against numpy in float64. Only dx's interior is
    written: a same conv's input border is padding, and junk columns are junk."""
    N, O, OH, OW, junk, seed = shape
    check_input_lanes(N, C, O, OH, OW, junk, seed, slack)


# What the scratch of the same convs' checks starts as: finite, so that a
# value copied from scratch the kernel never wrote into a place it must not
# write shows (NaN would look like the place left alone), and huge, so that
# one read into an output shows too.
UNWRITTEN = np.float32(1e30)


def check_input_lanes(N, C, O, OH, OW, junk, seed, slack):
    """conv3_input_lanes's dx of a same conv from C to O channels against
    the transposed conv in float64, as the test above says."""
    H, W = OH + 2, OW + 2
    S = W + junk
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((O, C, 3, 3)).astype(np.float32)
    dout = rng.standard_normal((N, O, OH, S)).astype(np.float32)
    dout[..., OW:] = np.nan  # junk columns of the output gradient: never read
    dx = np.full((N, C, H, S), np.nan, np.float32)
    scratch = np.full(V.input_scratch_floats(C, O, OH, OW, N + slack, S), UNWRITTEN, np.float32)
    _input_lanes(w, dout.reshape(N, O, OH * S), dx, W, scratch)
    inside = transposed_conv(w, dout[..., :OW])[:, :, 1:-1, 1:-1]
    assert np.abs(dx[:, :, 1:-1, 1:W - 1] - inside).max() <= 1e-5 * max(1.0, np.abs(inside).max())
    border = np.ones((H, S), bool)
    border[1:-1, 1:W - 1] = False
    assert np.isnan(dx[:, :, border]).all()


@settings(max_examples=25, deadline=None)
@given(narrow_or_wide, st.sampled_from([8, 16]), st.integers(0, 8))
def test_conv3_same_forward_lanes_matches_scipy(shape, O, slack):
    """A "same" 3x3 conv's forward side by side: its padded input's border
    is NaN (the kernel pads its copies itself, so it never reads it), the
    output's junk columns are not written; scratch as the input gradient's
    test sizes it."""
    N, C, OH, OW, junk, seed = shape
    check_same_forward(N, C, O, OH, OW, junk, seed, slack)


def check_same_forward(N, C, O, OH, OW, junk, seed, slack):
    """conv3_same_forward_lanes from C to O channels against scipy in
    float64, as the test above says."""
    H, W = OH + 2, OW + 2
    S = W + junk
    rng = np.random.default_rng(seed)
    x = np.full((N, C, H, S), np.nan, np.float32)
    x[:, :, 1:-1, 1:W - 1] = rng.standard_normal((N, C, OH, OW))
    w = rng.standard_normal((O, C, 3, 3)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    out = np.full((N, O, OH * S), np.nan, np.float32)
    scratch = np.full(V.same_forward_scratch_floats(C, O, OH, OW, N + slack, S), UNWRITTEN,
                      np.float32)
    _same_forward_lanes(x, w, b, out, W, scratch)
    got = out.reshape(N, O, OH, S)
    padded = np.where(np.isnan(x), 0, x)[..., :W].astype(np.float64)
    want = conv2d_valid(padded, w.astype(np.float64), b)
    assert np.abs(got[..., :OW] - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert np.isnan(got[..., OW:]).all()
