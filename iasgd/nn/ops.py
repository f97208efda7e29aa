"""The compiled ops of a network: which function runs each pass of a plan row,
and the table of them that the compiled network passes call through.

A plan row (iasgd.nn.kernels) has three passes: its forward, the gradient of
its weights and the gradient of its input. Each is one of the `*_op`
functions of kernels.py (or `nothing`), all with one signature; `assign`
writes each pass's position in `OPS` into the row (P_FWD, P_DW, P_DX), and
`table` compiles the functions a plan uses into a Net's op table.

Why a table of C callbacks instead of plain calls: numba compiles a callee
into every caller and re-optimises it there, at every level of the call
tree, and it would compile every kernel any plan might use into every
function that runs a network. Called through a pointer, each op is compiled
once, by itself, and only when a plan needs it: a LeNet-5 never compiles
the 3x3 or the GEMM convolutions. (The indirect call costs about 25 ns, a
few per layer and step.) The table always has len(OPS) entries, unused ones
being `nothing`, so the compiled functions that take a Net have one type.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import typeof_impl

from iasgd import compiled
from iasgd.nn import kernels as K

OPS = (K.nothing,
       K.conv5_forward_op, K.conv3_forward_op, K.conv_gemm_forward_op, K.conv5_simd_forward_op,
       K.conv3_simd_forward_op,
       K.pad_forward_op,
       K.relu_forward_op, K.pool_forward_op, K.flatten_forward_op, K.dense_forward_op,
       K.conv5_weights_op, K.conv3_weights_op, K.conv_gemm_weights_op,
       K.conv5_simd_weights_op, K.dense_weights_op,
       K.conv5_input_op, K.conv3_input_op, K.conv_gemm_input_op, K.pad_input_op,
       K.relu_input_op, K.pool_input_op, K.flatten_input_op, K.dense_input_op)
POSITION = {op.__name__: position for position, op in enumerate(OPS)}

# Op code -> the forward and input-gradient functions of the ops without weights.
_PLAIN = {K.OP_PAD: "pad", K.OP_RELU: "relu", K.OP_POOL: "pool", K.OP_FLATTEN: "flatten"}


def row_ops(row: np.ndarray) -> tuple[str, str, str]:
    """The names of the forward, weight-gradient and input-gradient functions
    of one plan row (`nothing` where the pass has no work)."""
    op, needs_input_grad = int(row[K.P_OP]), bool(row[K.P_GRAD])
    if op == K.OP_CONV:
        gemm, k = int(row[K.P_GEMM]), int(row[K.P_K])

        def conv(bit: int) -> str:
            return "conv_gemm" if gemm & bit else f"conv{k}"
        forward = f"conv{k}_simd" if gemm & K.SIMD_FORWARD else conv(K.GEMM_FORWARD)
        weights = "conv5_simd" if gemm & K.SIMD_WEIGHTS else conv(K.GEMM_WEIGHTS)
        return (f"{forward}_forward_op", f"{weights}_weights_op",
                f"{conv(K.GEMM_INPUT)}_input_op" if needs_input_grad else "nothing")
    if op == K.OP_DENSE:
        return ("dense_forward_op", "dense_weights_op",
                "dense_input_op" if needs_input_grad else "nothing")
    name = _PLAIN[op]
    return f"{name}_forward_op", "nothing", f"{name}_input_op" if needs_input_grad else "nothing"


def assign(plan: np.ndarray) -> np.ndarray:
    """Write each row's functions' positions in OPS into its P_FWD, P_DW and
    P_DX columns, in place; returns `plan`."""
    for row in plan:
        row[K.P_FWD], row[K.P_DW], row[K.P_DX] = (POSITION[name] for name in row_ops(row))
    return plan


def used(plan: np.ndarray) -> list:
    """The functions of OPS that `plan` calls, in OPS order."""
    positions = set(plan[:, [K.P_FWD, K.P_DW, K.P_DX]].ravel().tolist()) | {0}
    return [OPS[p] for p in sorted(positions)]


def signature(dtype: Any = np.float32) -> Any:
    """The one numba signature of every op, for float32 (training) or float64
    (the tests' finite differences) parameters and activations."""
    real = types.Array(numba.from_dtype(np.dtype(dtype)), 1, "C")
    params = types.Array(real.dtype, 1, "C", readonly=True)  # the ops only read them
    return types.none(params, real, types.int64[:, ::1], types.int64, real, real,
                      types.int32[::1], types.int64)


_COMPILED: dict[tuple[str, str], Any] = {}  # (op name, dtype) -> its compiled callback


def compiled_op(op: Any, dtype: Any = np.float32) -> Any:
    """One op compiled for `dtype` (loaded from the disk cache when it is there;
    once per process)."""
    key = (op.__name__, np.dtype(dtype).name)
    if key not in _COMPILED:
        _COMPILED[key] = compiled.compile_callback(op, signature(dtype))
    return _COMPILED[key]


class OpTable(tuple):
    """A Net's ops: a tuple that knows its numba type. numba would otherwise
    work the type out element by element on every call from Python that
    passes a Net (about 20 us per compiled callback, 0.35 ms per call: as
    much as a third of a LeNet-5 step for the simulator, which makes its
    compiled calls step by step)."""

    numba_type: Any = None


@typeof_impl.register(OpTable)
def _typeof_op_table(table: OpTable, c: Any) -> Any:
    return table.numba_type


_NET_TYPES: dict[tuple, Any] = {}  # (plan's type, ops' type) -> the Net's type


@typeof_impl.register(K.Net)
def _typeof_net(net: K.Net, c: Any) -> Any:
    """A Net's numba type, worked out once per kind of plan and table (for
    the same reason as OpTable's)."""
    plan = net.plan
    key = (plan.dtype, plan.ndim, plan.flags.c_contiguous, plan.flags.writeable,
           numba.typeof(net.ops))
    if key not in _NET_TYPES:
        _NET_TYPES[key] = types.NamedTuple([numba.typeof(plan), key[-1], types.int64], K.Net)
    return _NET_TYPES[key]


_STAND_INS = [False]  # inside `stand_ins()`: tables hold `nothing` only


@contextlib.contextmanager
def stand_ins() -> Iterator[None]:
    """Inside the block every op table built holds the compiled `nothing` in
    every position: a Net of the same numba type as the real one, so that
    the functions that take it compile (and are cached) just as for the
    real one, without waiting for its ops to compile (another process
    compiles those: iasgd.executors.precompile). Such a Net computes
    nothing: whatever runs with it leaves its outputs meaningless."""
    _STAND_INS[0] = True
    try:
        yield
    finally:
        _STAND_INS[0] = False


def table(plan: np.ndarray, dtype: Any = np.float32) -> OpTable:
    """The op table of a Net for `plan`: position p holds OPS[p] compiled
    for `dtype` if the plan calls it, else the compiled `nothing` (in every
    position inside `stand_ins`)."""
    needed = set() if _STAND_INS[0] else {op.__name__ for op in used(plan)}
    idle = compiled_op(K.nothing, dtype)
    ops = OpTable(compiled_op(op, dtype) if op.__name__ in needed else idle for op in OPS)
    ops.numba_type = types.UniTuple(types.FunctionType(signature(dtype)), len(ops))
    return ops


def network(plan: np.ndarray, slice_size: int, dtype: Any = np.float32) -> K.Net:
    """The Net (plan, op table and slice) that the compiled network passes take."""
    return K.Net(plan, table(plan, dtype), slice_size)
