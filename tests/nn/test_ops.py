"""iasgd.nn.ops: which op runs each pass of a plan row, and the op table."""

from __future__ import annotations

import inspect

import numpy as np

from iasgd.nn import kernels as K
from iasgd.nn import models, ops


def plan_of(spec: str) -> np.ndarray:
    model = models.build(spec, "cifar10")
    return models.activation_plan(model.arch, model.layout, 2).table


def test_every_op_function_of_the_kernels_is_in_the_table_once():
    defined = {name for name, f in inspect.getmembers(K, inspect.isfunction)
               if name.endswith("_op") and f.__module__ == K.__name__}
    assert defined == {op.__name__ for op in ops.OPS[1:]}
    assert len(set(ops.OPS)) == len(ops.OPS) and ops.OPS[0] is K.nothing


def test_lenet_runs_direct_5x5_convs_and_its_first_conv_computes_no_input_gradient():
    rows = [ops.row_ops(row) for row in plan_of("lenet")]
    # the 16-channel conv's forward and weight gradient: explicit vectors,
    # where the machine has AVX-512
    second = "conv5_simd" if models.SIMD else "conv5"
    assert rows == [("conv5_forward_op", "conv5_weights_op", "nothing"),
                    ("pool_forward_op", "nothing", "pool_input_op"),
                    (f"{second}_forward_op", f"{second}_weights_op", "conv5_input_op"),
                    ("pool_forward_op", "nothing", "pool_input_op"),
                    ("dense_forward_op", "dense_weights_op", "dense_input_op"),
                    ("dense_forward_op", "dense_weights_op", "dense_input_op")]


def test_the_gemm_bits_pick_the_gemm_op_of_each_pass():
    plan = plan_of("conv8k3s,relu,dense")
    conv = next(row for row in plan if row[K.P_OP] == K.OP_CONV)
    conv[K.P_GRAD] = 1
    for bits, want in ((0, ("conv3_forward_op", "conv3_weights_op", "conv3_input_op")),
                       (K.GEMM_WEIGHTS | K.GEMM_INPUT,
                        ("conv3_forward_op", "conv_gemm_weights_op", "conv_gemm_input_op")),
                       (K.GEMM_ALL, ("conv_gemm_forward_op", "conv_gemm_weights_op",
                                     "conv_gemm_input_op"))):
        conv[K.P_GEMM] = bits
        assert ops.row_ops(conv) == want
    assert [ops.row_ops(row)[0] for row in plan][:1] == ["pad_forward_op"]
    conv = next(row for row in plan_of("conv16k5,relu,dense") if row[K.P_OP] == K.OP_CONV)
    conv[K.P_GEMM] = K.SIMD_FORWARD
    assert ops.row_ops(conv) == ("conv5_simd_forward_op", "conv5_weights_op", "nothing")
    conv[K.P_GEMM] = K.SIMD_WEIGHTS
    assert ops.row_ops(conv) == ("conv5_forward_op", "conv5_simd_weights_op", "nothing")
    conv = next(row for row in plan_of("conv16k3,relu,dense") if row[K.P_OP] == K.OP_CONV)
    conv[K.P_GEMM] = K.SIMD_FORWARD
    assert ops.row_ops(conv) == ("conv3_simd_forward_op", "conv3_weights_op", "nothing")


def test_assign_writes_the_positions_the_table_holds_them_at():
    plan = plan_of("vgg-small")
    for row in plan:
        names = ops.row_ops(row)
        assert [ops.OPS[row[c]].__name__ for c in (K.P_FWD, K.P_DW, K.P_DX)] == list(names)


def test_the_table_compiles_only_the_ops_its_plan_uses():
    plan = plan_of("lenet")
    table = ops.table(plan)
    assert len(table) == len(ops.OPS)
    used = {op.__name__ for op in ops.used(plan)}
    assert "conv3_forward_op" not in used and "conv5_forward_op" in used
    idle = ops.compiled_op(K.nothing)
    for op, entry in zip(ops.OPS, table, strict=True):
        assert (entry is idle) == (op.__name__ not in used or op is K.nothing)
    assert ops.table(plan) == table  # compiled once per process
