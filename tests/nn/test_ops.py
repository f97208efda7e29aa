"""iasgd.nn.ops: which op runs each pass of a plan row, and the op table,
both built from the layer kinds' records."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from iasgd.nn import layers, models, ops
from iasgd.nn import plan as P
from iasgd.nn.layers import conv as C
from iasgd.nn.plan import nothing


def plan_of(spec: str) -> np.ndarray:
    model = models.build(spec, "cifar10")
    return models.lower(model.arch, model.layout, 2).table


def names(functions) -> tuple[str, ...]:
    return tuple(f.__name__ for f in functions)


def test_every_op_function_of_the_layer_kinds_is_in_the_table_once():
    defined = {f for kind in layers.KINDS
               for module in (inspect.getmodule(kind.parse),)
               for name, f in inspect.getmembers(module, inspect.isfunction)
               if name.endswith("_op") and f.__module__ == module.__name__}
    assert defined == set(ops.OPS[1:])
    assert len(set(ops.OPS)) == len(ops.OPS) and ops.OPS[0] is nothing
    assert set(ops.COMPILE_S) == set(ops.OPS[1:]) and all(s > 0 for s in ops.COMPILE_S.values())


def test_every_kind_of_row_has_one_code():
    assert {"conv", "pad", "relu", "pool", "flatten", "dense"} <= {op.name for op in layers.ROW_OPS}
    assert len({op.name for op in layers.ROW_OPS}) == len(layers.ROW_OPS)
    assert all(layers.CODES[op] == code for code, op in enumerate(layers.ROW_OPS))


def test_lenet_runs_direct_5x5_convs_and_its_first_conv_computes_no_input_gradient():
    rows = [names(ops.row_ops(row)) for row in plan_of("lenet")]
    # the 16-channel conv's forward and weight gradient: explicit vectors,
    # where the machine has AVX-512
    second = "conv5_simd" if C.SIMD else "conv5"
    assert rows == [("conv5_forward_op", "conv5_weights_op", "nothing"),
                    ("pool_forward_op", "nothing", "pool_input_op"),
                    (f"{second}_forward_op", f"{second}_weights_op", "conv5_input_op"),
                    ("pool_forward_op", "nothing", "pool_input_op"),
                    ("dense_forward_op", "dense_weights_op", "dense_input_op"),
                    ("dense_forward_op", "dense_weights_op", "dense_input_op")]


def test_the_path_bits_pick_the_op_of_each_pass():
    plan = plan_of("conv8k3s,relu,dense")
    conv = next(row for row in plan if layers.row_op(row) is C.ROW)
    conv[P.P_GRAD] = 1
    for bits, want in ((0, ("conv3_forward_op", "conv3_weights_op", "conv3_input_op")),
                       (C.GEMM_WEIGHTS | C.GEMM_INPUT,
                        ("conv3_forward_op", "conv_gemm_weights_op", "conv_gemm_input_op")),
                       (C.GEMM_ALL, ("conv_gemm_forward_op", "conv_gemm_weights_op",
                                     "conv_gemm_input_op"))):
        conv[P.P_PATH] = bits
        assert names(ops.row_ops(conv)) == want
    assert [names(ops.row_ops(row))[0] for row in plan][:1] == ["pad_forward_op"]
    conv = next(row for row in plan_of("conv16k5,relu,dense") if layers.row_op(row) is C.ROW)
    conv[P.P_PATH] = C.SIMD_FORWARD
    assert names(ops.row_ops(conv)) == ("conv5_simd_forward_op", "conv5_weights_op", "nothing")
    conv[P.P_PATH] = C.SIMD_WEIGHTS
    assert names(ops.row_ops(conv)) == ("conv5_forward_op", "conv5_simd_weights_op", "nothing")
    conv = next(row for row in plan_of("conv16k3,relu,dense") if layers.row_op(row) is C.ROW)
    conv[P.P_PATH] = C.SIMD_FORWARD
    assert names(ops.row_ops(conv)) == ("conv3_simd_forward_op", "conv3_weights_op", "nothing")
    conv[P.P_PATH] = C.SIMD_WEIGHTS
    assert names(ops.row_ops(conv)) == ("conv3_forward_op", "conv3_simd_weights_op", "nothing")
    conv[P.P_PATH] = C.SIMD_FORWARD | C.SIMD_SAME
    assert names(ops.row_ops(conv)) == ("conv3_same_forward_op", "conv3_weights_op", "nothing")


def test_the_rules_put_the_gradients_of_wide_3x3_convs_on_gemms_or_vectors():
    """conv_paths on vgg-bn's convs. On machines with the vectors every
    forward, every weight gradient (whole groups of SIMD3_WEIGHT_CHANNELS)
    and the input gradients run in them (same convs, whole blocks of
    SIMD3_CHANNELS; 64 -> 128's 8x8 maps side by side), the forwards of the
    same convs 32 -> 64 and 64 -> 128 as same convs (by Winograd's F(2x2,
    3x3), which the 16x16 maps take too). Elsewhere 3 -> 32
    is direct in its gradients, 32 -> 64 and 64 -> 128 run their weight
    gradients as GEMMs (GEMM_WEIGHTS_MIN_OUT, NARROW_COLUMNS), 64 -> 128
    its other passes too; 32 -> 32 stays direct."""
    convs = [names(ops.row_ops(row)) for row in plan_of("vgg-bn")
             if layers.row_op(row) is C.ROW]
    if C.SIMD:
        assert convs == [
            ("conv3_simd_forward_op", "conv3_simd_weights_op", "nothing"),
            ("conv3_same_forward_op", "conv3_simd_weights_op", "conv3_simd_input_op"),
            ("conv3_same_forward_op", "conv3_simd_weights_op", "conv3_simd_input_op")]
    else:
        assert convs == [
            ("conv3_forward_op", "conv3_weights_op", "nothing"),
            ("conv3_forward_op", "conv_gemm_weights_op", "conv_gemm_input_op"),
            ("conv_gemm_forward_op", "conv_gemm_weights_op", "conv_gemm_input_op")]
    narrow = C.conv_paths(3, 32, True, 16, 32, 32 * 18 * 18, 16)
    assert not narrow & C.GEMM_WEIGHTS and narrow & C.GEMM_INPUT
    # whole groups of output channels only; the others keep the GEMM
    uneven = C.conv_paths(3, 48, True, 8, 64, 64 * 10 * 10, 8, True)
    assert uneven & C.GEMM_WEIGHTS and not uneven & C.SIMD_WEIGHTS
    wide = C.conv_paths(3, 64, True, 16, 32, 32 * 18 * 18, 16, True)
    assert bool(wide & C.SIMD_WEIGHTS) == C.SIMD != bool(wide & C.GEMM_WEIGHTS)
    # a wide same conv's forward runs as a same conv where Winograd takes it
    # (whole vectors of input channels), else as the valid conv of its padded input
    assert bool(wide & C.SIMD_SAME) == C.SIMD
    assert not C.conv_paths(3, 64, True, 16, 8, 8 * 18 * 18, 16, True) & C.SIMD_SAME


@pytest.mark.skipif(not C.SIMD, reason="the vector paths need AVX-512")
def test_the_vector_paths_take_same_3x3_convs_at_any_width():
    """SIMD_INPUT writes the interior of the input's gradient only, so it
    takes "same" convs alone (their input border is padding), with whole
    blocks of SIMD3_CHANNELS input channels and two rows; narrow same convs
    run their forward in vectors too (side by side), narrow valid ones not."""
    def bits(channels=32, width=16, height=16, same=True, grad=True, k=3, out=64):
        return C.conv_paths(k, out, grad, width, channels, channels * 18 * 18, height, same)

    assert bits() & C.SIMD_INPUT and not bits() & C.GEMM_INPUT
    for other in (bits(same=False), bits(channels=12), bits(height=1)):
        assert not other & C.SIMD_INPUT and other & C.GEMM_INPUT
    assert not bits(grad=False) & (C.SIMD_INPUT | C.GEMM_INPUT)
    assert not bits(k=5) & C.SIMD_INPUT
    narrow = bits(channels=64, width=8, height=8)
    assert narrow & C.SIMD_INPUT and narrow & C.SIMD_FORWARD and narrow & C.SIMD_WEIGHTS
    assert not narrow & (C.GEMM_FORWARD | C.GEMM_INPUT)
    valid = bits(channels=64, width=8, height=8, same=False)
    assert not valid & C.SIMD_FORWARD and valid & C.GEMM_FORWARD
    assert not bits(width=8, out=12) & C.SIMD_FORWARD


def test_assign_writes_the_positions_the_table_holds_them_at():
    plan = plan_of("vgg-small")
    for row in plan:
        assert [ops.OPS[row[c]] for c in (P.P_FWD, P.P_DW, P.P_DX)] == list(ops.row_ops(row))


def test_the_table_compiles_only_the_ops_its_plan_uses():
    plan = plan_of("lenet")
    table = ops.table(plan)
    assert len(table) == len(ops.OPS)
    used = set(ops.used(plan))
    assert C.conv3_forward_op not in used and C.conv5_forward_op in used
    idle = ops.compiled_op(nothing)
    for op, entry in zip(ops.OPS, table, strict=True):
        assert (entry is idle) == (op not in used or op is nothing)
    assert ops.table(plan) == table  # compiled once per process
