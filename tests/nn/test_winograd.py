"""Same 3x3 convs by Winograd's F(2x2, 3x3) (iasgd.nn.conv.winograd),
through the entries that choose it (conv3_same_forward_lanes,
conv3_input_lanes), against float64 references: scipy's correlation and
the transposed conv (tests/nn/test_simd.py's checks)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_simd import check_input_lanes, check_same_forward

from iasgd.nn import simd
from iasgd.nn.conv import winograd as W

pytestmark = pytest.mark.skipif(not simd.available(), reason="needs AVX-512")

# output sizes whose tiles come in whole blocks of 8: 8 x 8 (vgg-bn's
# 64 -> 128), 16 x 16 (its 32 -> 64), and others, square or not
SIZES = [(8, 8), (16, 16), (4, 8), (8, 4), (2, 16), (4, 16), (8, 12), (16, 2)]
shapes = st.tuples(
    st.integers(1, 9),  # N: chunks of several samples and a short last one
    st.sampled_from([16, 32]),  # the input channels: whole vectors
    st.sampled_from([32, 64]),  # the output channels: whole groups
    st.sampled_from(SIZES),
    st.integers(0, 3),  # junk columns
    st.integers(0, 2**31 - 1),
)


def test_usable_takes_even_sizes_whole_blocks_of_tiles_and_channels():
    assert W.usable(64, 128, 8, 8) and W.usable(32, 64, 16, 16)
    assert not W.usable(64, 128, 7, 8)  # an odd size
    assert not W.usable(64, 128, 6, 6)  # 9 tiles: not whole blocks of 8
    assert not W.usable(8, 128, 8, 8)  # input channels: not a vector
    assert not W.usable(64, 48, 8, 8)  # output channels: not two vectors
    assert W.scratch_floats(64, 48, 8, 8, 10) == 0


@settings(max_examples=20, deadline=None)
@given(shapes, st.integers(0, 4))
def test_the_forward_matches_scipy(shape, slack):
    """The forward, with a NaN border and NaN junk columns the conv never
    reads, scratch that starts as NaN, nothing outside the outputs written."""
    N, C, O, (OH, OW), junk, seed = shape
    assert W.usable(C, O, OH, OW)
    check_same_forward(N, C, O, OH, OW, junk, seed, slack)


@settings(max_examples=20, deadline=None)
@given(shapes, st.integers(0, 4))
def test_the_input_gradient_matches_the_transposed_conv(shape, slack):
    """The input gradient: the flipped weights' transform, the output
    gradient (NaN junk) padded, dx's interior only written."""
    N, O, C, (OH, OW), junk, seed = shape  # a conv from C to O: its dx from O to C
    assert W.usable(O, C, OH, OW)
    check_input_lanes(N, C, O, OH, OW, junk, seed, slack)
