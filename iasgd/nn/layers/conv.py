"""Convolutions: k x k (k odd), stride 1, bias; "valid" (no padding) or
"same" ((k-1)/2 zeros all round, a pad row in front of the conv row, unless
the pool before it wrote its map inside that border).

A conv row reads a map of row stride S and writes wide rows of the same
stride (iasgd.nn.plan). How each of its passes runs is its PATH bits,
chosen here by `conv_paths` for the conv's shape and this machine: the
direct 3x3 and 5x5 kernels (iasgd.nn.conv.direct), im2col + BLAS GEMM for
any odd k (iasgd.nn.conv.gemm), or explicit vectors on machines with
AVX-512 (iasgd.nn.conv.vector, vector_weights). The measurements behind the rules are in
bench/results/conv-paths.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from iasgd.compiled import jit_inline
from iasgd.nn import simd
from iasgd.nn.conv import direct, gemm, vector, vector_weights, winograd
from iasgd.nn.conv.vector import SIMD3_CHANNELS, SIMD_BLOCK
from iasgd.nn.conv.vector_weights import SIMD3_WEIGHT_CHANNELS
from iasgd.nn.kinds import Kind, LayerShape, Lowering, Params, RowOp, Shape, Sizing, image
from iasgd.nn.plan import (
    P_C,
    P_CO,
    P_COFF,
    P_GRAD,
    P_H,
    P_K,
    P_OH,
    P_OW,
    P_PATH,
    P_S,
    P_W,
    P_WOFF,
    bias,
    copy_values,
    input4,
    nothing,
    output3,
    output4,
    view2,
    view4,
)


@dataclass(frozen=True)
class Conv:
    """k x k convolution, stride 1; padding "valid" (none) or "same" ((k-1)/2)."""

    out: int
    k: int = 3
    padding: str = "valid"

    def spec(self) -> str:
        return f"conv{self.out}k{self.k}{self.padding[0]}"


# PATH bits of a conv row: which passes run as GEMMs (any kernel size; the
# direct kernels exist for 3x3 and 5x5 only), and SIMD_FORWARD: the forward
# runs as conv5_forward_simd or conv3_forward_simd (a "same" 3x3 conv's on
# narrow rows as conv3_same_simd, side by side), SIMD_WEIGHTS: the weight
# gradient as conv5_backward_weights_simd or conv3_backward_weights_simd,
# SIMD_INPUT: the input gradient of a same 3x3 conv as conv3_same_simd
# (explicit vectors), SIMD_SAME: with SIMD_FORWARD, the forward of a same
# 3x3 conv as conv3_same_forward_lanes. Both run a same conv by Winograd's
# F(2x2, 3x3) where it applies (iasgd.nn.conv.winograd.usable), else
# conv3_same_simd (narrow maps side by side).
GEMM_FORWARD = 1
GEMM_WEIGHTS = 2
GEMM_INPUT = 4
GEMM_ALL = GEMM_FORWARD | GEMM_WEIGHTS | GEMM_INPUT
SIMD_FORWARD = 8
SIMD_WEIGHTS = 16
SIMD_INPUT = 32
SIMD_SAME = 64

# The rules of conv_paths (their measurements: bench/results/conv-paths.md).
# The input gradient of a 3x3 or 5x5 conv runs as a GEMM from this many
# output channels on; the convs from few channels stay direct in every pass.
GEMM_INPUT_MIN_CHANNELS = 32
# The explicit-vector passes run where the machine has the registers they
# are written for (IASGD_SIMD=0 turns them off, e.g. to compare). A 5x5
# forward (16 output channels in the lanes) from SIMD_MIN_TAPS taps per
# output, and where a sample's input and a group of 16 channels' weights fit
# in SIMD_MAX_FLOATS (32 KB of L1); the same scheme was slower on 3x3 convs,
# which have their own (16 output pixels in the lanes).
SIMD = simd.available() and os.environ.get("IASGD_SIMD", "1") != "0"
SIMD_MIN_TAPS = 64
SIMD_MAX_FLOATS = 8192
# The explicit-vector weight gradient of a 5x5 conv with whole vectors of
# output channels, from this many taps per output (4 input channels): below
# it, on large maps, the direct kernel's long rows win.
SIMD_WEIGHTS_MIN_TAPS = 100
# A 3x3 conv whose output rows are narrower than NARROW_COLUMNS, from
# NARROW_MIN_CHANNELS input channels on, runs its weight gradient as a GEMM
# too, and its forward unless a "same" conv's runs in vectors side by side:
# the direct loops' rows are too short to vectorise (vgg-bn's 64 -> 128 on
# 8x8: 40 GFLOP/s forward; its whole step went from 829 to 1,195 samples/s
# at b = 64 with GEMMs, bench/results/recipe-cifar10.md).
NARROW_COLUMNS = 16
NARROW_MIN_CHANNELS = 64
# A 3x3 conv from 32 channels to 64 or more runs its weight gradient as a
# GEMM at any width: 1.4-1.6x the direct kernel on 32 -> 64 and 64 -> 64 on
# 16x16 maps (vgg-bn's and vgg-small's middle conv; bench/results/conv-paths.md,
# 2026-12-06); on 32 -> 32 the two were within this VM's noise.
GEMM_WEIGHTS_MIN_CHANNELS = 32
GEMM_WEIGHTS_MIN_OUT = 64
# Where the machine has the vectors, a 3x3 conv's weight gradient runs in
# them instead, with whole groups of SIMD3_WEIGHT_CHANNELS output channels
# (any input channels and width): alone at b = 64, vgg-bn's 32 -> 64 and
# 64 -> 128 1.3-1.5x the GEMM, its 3 -> 32 1.0-1.2x the direct kernel, 32 ->
# 32 and 16 -> 32 1.6-2.0x it.


def conv_paths(k: int, out: int, needs_input_grad: bool, out_width: int = 0,
               channels: int = 0, in_floats: int = 0, out_height: int = 0,
               same: bool = False) -> int:
    """The PATH bits (GEMM_*, SIMD_*) of a k x k conv from `channels` to
    `out` channels with `out_width` output columns and `in_floats` floats of
    input per sample (C*H*S), and `out_height` output rows: other sizes than
    3x3 and 5x5 run every pass as GEMMs, a 3x3 conv from many channels to
    many its weight gradient (GEMM_WEIGHTS_MIN_CHANNELS, _OUT). On a machine
    with AVX-512 some passes run as explicit vectors (iasgd.nn.simd): a 5x5
    conv with whole vectors of output channels, its forward with a block's
    width of columns, SIMD_MIN_TAPS taps (channels * k * k) or more, and an
    input that fits in L1 beside a group of weights (SIMD_MAX_FLOATS), its
    weight gradient from SIMD_WEIGHTS_MIN_TAPS taps; a 3x3 conv's forward
    with whole blocks of SIMD3_CHANNELS output channels and two rows, from a
    vector's width of columns or, a "same" conv (`same`), at any width
    (narrow maps side by side, vector.conv3_same_simd; SIMD_SAME, and by
    Winograd's F(2x2, 3x3) where winograd.usable), and a same 3x3 conv's
    input gradient with whole blocks of input channels, and a 3x3 conv's
    weight gradient with whole groups of SIMD3_WEIGHT_CHANNELS output
    channels; elsewhere a 3x3 conv on narrow rows from many channels its
    weight gradient as a GEMM, and its forward where it is not in vectors
    (NARROW_COLUMNS)."""
    if k not in (3, 5):
        return GEMM_ALL
    bits = 0
    taps = channels * k * k
    vectors = SIMD and k == 5 and out % simd.LANES == 0
    if (vectors and out_width >= SIMD_BLOCK and taps >= SIMD_MIN_TAPS
            and in_floats + taps * simd.LANES <= SIMD_MAX_FLOATS):
        bits |= SIMD_FORWARD
    if vectors and taps >= SIMD_WEIGHTS_MIN_TAPS:
        bits |= SIMD_WEIGHTS
    wide3 = SIMD and k == 3 and out_width >= simd.LANES and out_height >= 2
    same3 = SIMD and k == 3 and same and out_height >= 2  # any width: side by side
    if (wide3 or same3) and out % SIMD3_CHANNELS == 0:
        bits |= SIMD_FORWARD
        if same3 and (out_width < simd.LANES
                      or winograd.usable.py_func(channels, out, out_height, out_width)):
            bits |= SIMD_SAME
    if needs_input_grad and same3 and channels % SIMD3_CHANNELS == 0:
        bits |= SIMD_INPUT
    elif needs_input_grad and out >= GEMM_INPUT_MIN_CHANNELS:
        bits |= GEMM_INPUT
    if SIMD and k == 3 and out % SIMD3_WEIGHT_CHANNELS == 0:
        bits |= SIMD_WEIGHTS
    gemm_weights = 0 if bits & SIMD_WEIGHTS else GEMM_WEIGHTS
    if k == 3 and out_width < NARROW_COLUMNS and channels >= NARROW_MIN_CHANNELS:
        bits |= gemm_weights | (0 if bits & SIMD_FORWARD else GEMM_FORWARD)
    if k == 3 and channels >= GEMM_WEIGHTS_MIN_CHANNELS and out >= GEMM_WEIGHTS_MIN_OUT:
        bits |= gemm_weights
    return bits


def scratch_floats(c: int, k: int, out: int, out_height: int, out_width: int, stride: int,
                   bits: int, n: int) -> int:
    """Floats of scratch the GEMM and explicit-vector passes of a conv need
    (`bits`: its PATH bits), in acts and in dacts alike: the GEMMs a block of
    samples' column matrices and products (iasgd.nn.conv.gemm.scratch_sizes);
    conv5_forward_lanes the reordered weights and one block of accumulators,
    conv3_forward_lanes the reordered weights, conv5_weights_lanes a sample's
    output gradient of 16 channels and their weight gradient; on narrow rows
    conv3_same_forward_lanes the reordered weights and the maps side by side,
    conv3_input_lanes the flipped weights, zeros and the maps side by side,
    conv3_weights_lanes a sample's output gradient and the weight gradient;
    n: the most samples a pass runs on (how many go side by side)."""
    ckk = c * k * k
    gemms = (max(gemm.scratch_sizes(ckk, out, out_height, out_width, stride))
             if bits & GEMM_ALL else 0)
    forward = 0
    if bits & SIMD_SAME:
        forward = vector.same_forward_scratch_floats(c, out, out_height, out_width, n, stride)
    elif bits & SIMD_FORWARD:
        forward = ckk * out + (SIMD_BLOCK * simd.LANES if k == 5 else 0)
    weights = 0
    if bits & SIMD_WEIGHTS:
        weights = ((out_height * out_width + ckk) * simd.LANES if k == 5
                   else vector_weights.weights3_scratch_floats(c, out, out_height, out_width))
    inputs = (vector.input_scratch_floats(c, out, out_height, out_width, n, stride)
              if bits & SIMD_INPUT else 0)
    return max(gemms, forward, weights, inputs)


# ------------------------------------------------------------------ pad rows


@jit_inline
def pad_forward(x, width, border, out):
    """Copy x (N, C, H, S), valid width `width`, into the middle of out (N, C,
    H+2B, width+2B) and zero the border B around it (every element written)."""
    N, C, H, _ = x.shape
    for n in range(N):
        for c in range(C):
            y = out[n, c]
            for i in range(border):
                y[i, :] = 0
                y[H + border + i, :] = 0
            for i in range(H):
                row = y[border + i]
                row[:border] = 0
                copy_values(x[n, c, i, :width], row[border:border + width])
                row[border + width:] = 0


@jit_inline
def pad_backward(dout, width, border, dx):
    """dx (N, C, H, S) = the middle of dout (N, C, H+2B, width+2B); junk
    columns of dx (>= width) are zeroed."""
    N, C, H, _ = dx.shape
    for n in range(N):
        for c in range(C):
            for i in range(H):
                row = dx[n, c, i]
                copy_values(dout[n, c, border + i, border:border + width], row[:width])
                row[width:] = 0



def pad_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    pad_forward(input4(acts, row, n), row[P_W], row[P_K], output4(acts, row, n))


def pad_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    pad_backward(output4(dacts, row, n), row[P_W], row[P_K], input4(dacts, row, n))


PAD = RowOp.without_weights("pad", pad_forward_op, pad_input_op)


# ------------------------------------------------------------------ conv rows


def conv5_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    direct.conv5_forward(input4(acts, row, n), _weights(params, row), bias(params, row),
                         output3(acts, row, n), row[P_W])


def conv3_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    direct.conv3_forward(input4(acts, row, n), _weights(params, row), bias(params, row),
                         output3(acts, row, n), row[P_W])


def conv3_simd_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    vector.conv3_forward_lanes(input4(acts, row, n), _weights(params, row), bias(params, row),
                               output3(acts, row, n), row[P_W], acts[row[P_COFF]:])


def conv3_same_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    vector.conv3_same_forward_lanes(input4(acts, row, n), _weights(params, row),
                                    bias(params, row), output3(acts, row, n), row[P_W],
                                    acts[row[P_COFF]:])


def conv5_simd_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    vector.conv5_forward_lanes(input4(acts, row, n), _weights(params, row), bias(params, row),
                               output3(acts, row, n), row[P_W], acts[row[P_COFF]:])


def conv_gemm_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    CKK = row[P_C] * row[P_K] * row[P_K]
    cols = gemm_columns(row)
    gemm.conv_forward_gemm(input4(acts, row, n), view2(params, row[P_WOFF], row[P_CO], CKK),
                           bias(params, row), output3(acts, row, n), row[P_W],
                           scratch(acts, row, 0, CKK * cols), scratch(acts, row, CKK * cols,
                                                                     row[P_CO] * cols))


def conv5_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    direct.conv5_backward_weights(input4(acts, row, n), output3(dacts, row, n),
                                  _weights(grad, row), bias(grad, row), row[P_W])


def conv5_simd_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    vector_weights.conv5_weights_lanes(input4(acts, row, n), output3(dacts, row, n),
                               _weights(grad, row), bias(grad, row), row[P_W],
                               dacts[row[P_COFF]:])


def conv3_simd_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    vector_weights.conv3_weights_lanes(input4(acts, row, n), output3(dacts, row, n),
                               _weights(grad, row), bias(grad, row), row[P_W],
                               dacts[row[P_COFF]:])


def conv3_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    direct.conv3_backward_weights(input4(acts, row, n), output3(dacts, row, n),
                                  _weights(grad, row), bias(grad, row), row[P_W])


def conv_gemm_weights_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    CO, CKK = row[P_CO], row[P_C] * row[P_K] * row[P_K]
    cols = gemm_columns(row)
    sums = CO * cols
    gemm.conv_backward_weights_gemm(input4(acts, row, n), output3(dacts, row, n),
                                    view2(grad, row[P_WOFF], CO, CKK), bias(grad, row),
                                    row[P_W], scratch(acts, row, 0, CKK * cols),
                                    scratch(dacts, row, 0, sums),
                                    view2(dacts, row[P_COFF] + sums, CKK, CO),
                                    view2(dacts, row[P_COFF] + sums + CKK * CO, CKK, CO))


def conv5_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    direct.conv5_backward_input(_weights(params, row), output3(dacts, row, n),
                                input4(dacts, row, n), row[P_W])


def conv3_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    direct.conv3_backward_input(_weights(params, row), output3(dacts, row, n),
                                input4(dacts, row, n), row[P_W])


def conv3_simd_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    vector.conv3_input_lanes(_weights(params, row), output3(dacts, row, n),
                             input4(dacts, row, n), row[P_W], dacts[row[P_COFF]:])


def conv_gemm_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    CO, CKK = row[P_CO], row[P_C] * row[P_K] * row[P_K]
    cols = gemm_columns(row)
    gemm.conv_backward_input_gemm(view2(params, row[P_WOFF], CO, CKK),
                                  output3(dacts, row, n), input4(dacts, row, n), row[P_W],
                                  scratch(dacts, row, 0, CO * cols),
                                  scratch(dacts, row, CO * cols, CKK * cols))


@jit_inline
def gemm_columns(row):
    """The columns of one GEMM block of a conv row (iasgd.nn.conv.gemm)."""
    _, _, _, P, B = gemm.block_geometry(row[P_H], row[P_S], row[P_W], row[P_K])
    return P * B


@jit_inline
def scratch(flat, row, start, size):
    """`size` floats of a row's scratch from its `start`th, flat."""
    return flat[row[P_COFF] + start:row[P_COFF] + start + size]


@jit_inline
def _weights(flat, row):
    k = row[P_K]
    return view4(flat, row[P_WOFF], row[P_CO], row[P_C], k, k)


# The op functions of each pass, by path: the direct kernels by kernel size.
_DIRECT = {3: (conv3_forward_op, conv3_weights_op, conv3_input_op),
           5: (conv5_forward_op, conv5_weights_op, conv5_input_op)}
_GEMM = (conv_gemm_forward_op, conv_gemm_weights_op, conv_gemm_input_op)
_SIMD_FORWARD = {3: conv3_simd_forward_op, 5: conv5_simd_forward_op}
_SIMD_WEIGHTS = {3: conv3_simd_weights_op, 5: conv5_simd_weights_op}


def _conv_passes(row: Any) -> tuple:
    bits, k = int(row[P_PATH]), int(row[P_K])
    plain = _DIRECT.get(k, _GEMM)
    forward, weights, inputs = (
        _GEMM[p] if bits & bit else plain[p]
        for p, bit in enumerate((GEMM_FORWARD, GEMM_WEIGHTS, GEMM_INPUT)))
    if bits & SIMD_FORWARD:
        forward = conv3_same_forward_op if bits & SIMD_SAME else _SIMD_FORWARD[k]
    if bits & SIMD_WEIGHTS:
        weights = _SIMD_WEIGHTS[k]
    if bits & SIMD_INPUT:
        inputs = conv3_simd_input_op
    return forward, weights, inputs if row[P_GRAD] else nothing


def _flops(row: Any, n: int) -> tuple[float, float]:
    k = row[P_K]
    one = 2.0 * n * row[P_CO] * row[P_C] * k * k * row[P_OH] * row[P_OW]
    return one, one * (2 if row[P_GRAD] else 1)  # weights (+ input) gradient


def _label(row: Any) -> str:
    """conv 32->64 k3 on 18x18 (gemm dx, simd fwd)"""
    bits = row[P_PATH]
    gemms = "/".join(label for bit, label in ((GEMM_FORWARD, "fwd"), (GEMM_WEIGHTS, "dw"),
                                              (GEMM_INPUT, "dx")) if bits & bit)
    vectors = "/".join(label for bit, label in ((SIMD_FORWARD, "fwd"), (SIMD_WEIGHTS, "dw"),
                                                (SIMD_INPUT, "dx")) if bits & bit)
    ways = ([f"gemm {gemms}"] if gemms else []) + ([f"simd {vectors}"] if vectors else [])
    return (f"conv {row[P_C]}->{row[P_CO]} k{row[P_K]} on {row[P_H]}x{row[P_W]}"
            + (f" ({', '.join(ways)})" if ways else ""))


# About how long compiling each op takes (precompile's estimates: the vector
# passes of a 5x5 conv are the slowest, the others about alike).
ROW = RowOp("conv", _conv_passes,
            {**{op: 1.5 for ops in (*_DIRECT.values(), _GEMM) for op in ops},
             conv3_simd_forward_op: 1.5, conv5_simd_forward_op: 1.9, conv5_simd_weights_op: 1.9,
             conv3_simd_input_op: 1.5, conv3_same_forward_op: 1.5, conv3_simd_weights_op: 1.5},
            _flops, _label)


# ------------------------------------------------------------------ the kind


def _shape(layer: Conv, shape: Shape, sizing: Sizing) -> tuple[Shape, Params]:
    where = sizing.where
    c, h, w = image(shape, where)
    if layer.out < 1:
        raise ValueError(f"{where}: zero channels")
    if layer.k < 1 or layer.k % 2 == 0:
        raise ValueError(f"{where}: the kernel size must be odd, got {layer.k}")
    if layer.padding not in ("valid", "same"):
        raise ValueError(f"{where}: padding must be 'valid' or 'same'")
    if layer.padding == "valid":
        if h < layer.k or w < layer.k:
            raise ValueError(f"{where}: its {h}x{w} input is too small for a "
                             f"{layer.k}x{layer.k} valid conv")
        h, w = h - layer.k + 1, w - layer.k + 1
    return (layer.out, h, w), (("weight", (layer.out, c, layer.k, layer.k)),
                               ("bias", (layer.out,)))


def _border(layer: Conv) -> int:
    return (layer.k - 1) // 2 if layer.padding == "same" else 0


def _lower(lo: Lowering, ls: LayerShape, nxt: LayerShape | None) -> None:
    layer = ls.layer
    p = _border(layer)
    if p and lo.border != p:  # a pad row, unless the row before wrote the border
        c, ph, pw = lo.c, lo.h + 2 * p, lo.w + 2 * p
        z = lo.alloc(c * ph * pw)
        lo.emit(PAD, c, ph, pw, pw, z, k=p)
        lo.move(z, c, ph, pw, pw)
    c, h, s = lo.c, lo.h, lo.s
    oh, ow = h - layer.k + 1, lo.w - layer.k + 1
    z = lo.alloc(layer.out * oh * s)  # wide rows: the input's stride
    path = conv_paths(layer.k, layer.out, lo.has_params, ow, c, c * h * s, oh, p > 0)
    row = lo.emit(ROW, layer.out, oh, ow, s, z, k=layer.k,
                  woff=lo.offset(f"{ls.name}.weight"), boff=lo.offset(f"{ls.name}.bias"),
                  path=path)
    if path:
        lo.needs_scratch(row, scratch_floats(c, layer.k, layer.out, oh, ow, s, path,
                                             lo.capacity))
    lo.has_params = True
    lo.move(z, layer.out, oh, ow, s)


def _parse(m: Any) -> Conv:
    padding = {"s": "same", "v": "valid", None: "valid"}[m["pad"]]
    return Conv(int(m["out"]), int(m["k"] or 3), padding)


def _torch(ls: LayerShape, shape: Shape) -> list[tuple[str, Any]]:
    from torch import nn

    layer = ls.layer
    return [("conv", nn.Conv2d(shape[0], layer.out, layer.k, padding=_border(layer)))]


KIND = Kind("conv", Conv, r"conv(?P<out>\d+)(?:k(?P<k>\d+))?(?P<pad>[sv])?",
            "conv<C>[k<K>][s|v] (C channels, odd kernel K, default 3, s = same or v = valid "
            "padding, default v)", _parse, _shape, _lower, _torch, (ROW, PAD), order=10,
            prefix="conv", border=_border)
