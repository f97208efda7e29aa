"""The compiled ops of a network: the table of op functions that the compiled
network passes call through, built from the layer kinds' records.

A plan row (iasgd.nn.plan) has three passes: its forward, the gradient of
its weights and the gradient of its input. Its kind of row (a RowOp of
iasgd.nn.layers) picks the op function of each (or `nothing`), all with one
signature; `assign` writes each pass's position in `OPS` into the row
(P_FWD, P_DW, P_DX), and `table` compiles the functions a plan uses into a
Net's op table.

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
from iasgd.nn import layers
from iasgd.nn.plan import P_DW, P_DX, P_FWD, Net, nothing

# Every op function of every kind of row, once, `nothing` first.
OPS = tuple(dict.fromkeys([nothing, *(op for row_op in layers.ROW_OPS
                                      for op in row_op.compile_s)]))
POSITION = {op: position for position, op in enumerate(OPS)}
# About how many seconds compiling each op takes (iasgd.executors.precompile)
COMPILE_S = {op: seconds for row_op in layers.ROW_OPS for op, seconds in row_op.compile_s.items()}


def row_ops(row: np.ndarray) -> tuple[Any, Any, Any]:
    """The forward, weight-gradient and input-gradient functions of one plan
    row (`nothing` where the pass has no work)."""
    return layers.row_op(row).passes(row)


def assign(plan: np.ndarray) -> np.ndarray:
    """Write each row's functions' positions in OPS into its P_FWD, P_DW and
    P_DX columns, in place; returns `plan`."""
    for row in plan:
        row[P_FWD], row[P_DW], row[P_DX] = (POSITION[op] for op in row_ops(row))
    return plan


def used(plan: np.ndarray) -> list:
    """The functions of OPS that `plan` calls, in OPS order."""
    positions = set(plan[:, [P_FWD, P_DW, P_DX]].ravel().tolist()) | {0}
    return [OPS[p] for p in sorted(positions)]


def signature(dtype: Any = np.float32) -> Any:
    """The one numba signature of every op, for float32 (training) or float64
    (the tests' finite differences) parameters and activations."""
    real = types.Array(numba.from_dtype(np.dtype(dtype)), 1, "C")
    params = types.Array(real.dtype, 1, "C", readonly=True)  # the ops only read them
    return types.none(params, real, types.int64[:, ::1], types.int64, real, real,
                      types.int32[::1], types.int64)


_COMPILED: dict[tuple[Any, str], Any] = {}  # (op, dtype) -> its compiled callback


def compiled_op(op: Any, dtype: Any = np.float32) -> Any:
    """One op compiled for `dtype` (loaded from the disk cache when it is there;
    once per process)."""
    key = (op, np.dtype(dtype).name)
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


@typeof_impl.register(Net)
def _typeof_net(net: Net, c: Any) -> Any:
    """A Net's numba type, worked out once per kind of plan and table (for
    the same reason as OpTable's)."""
    plan = net.plan
    key = (plan.dtype, plan.ndim, plan.flags.c_contiguous, plan.flags.writeable,
           numba.typeof(net.ops))
    if key not in _NET_TYPES:
        _NET_TYPES[key] = types.NamedTuple([numba.typeof(plan), key[-1], types.int64], Net)
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
    needed = set() if _STAND_INS[0] else set(used(plan))
    idle = compiled_op(nothing, dtype)
    ops = OpTable(compiled_op(op, dtype) if op in needed else idle for op in OPS)
    ops.numba_type = types.UniTuple(types.FunctionType(signature(dtype)), len(ops))
    return ops


def network(plan: np.ndarray, slice_size: int, dtype: Any = np.float32) -> Net:
    """The Net (plan, op table and slice) that the compiled network passes take."""
    return Net(plan, table(plan, dtype), slice_size)
