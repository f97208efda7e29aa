"""Explicit vectors of 16 float32 lanes for the compiled kernels.

LLVM vectorises the kernels' plain loops by itself, but it keeps their
accumulators in memory between loops (numba's arrays may alias), so a loop
body that does 10 multiply-adds also loads and stores its sums. Written with
these vectors instead, a kernel holds its accumulators in registers across
the whole reduction: `F32x16` is a numba type whose value is one LLVM
`<16 x float>`, and the intrinsics below load, store, broadcast and
multiply-add them. LLVM splits the vectors for machines with narrower
registers, so the code is correct everywhere; `available()` says whether
this machine has the AVX-512 registers it is written for (models.py uses
the vector kernels only there).

Every intrinsic takes float32 arrays only (C-contiguous, 1-d) and does no
bounds checks: `arr[i : i + LANES]` must lie inside the array.
"""

from __future__ import annotations

from typing import Any

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

LANES = 16
_VECTOR = ir.VectorType(ir.FloatType(), LANES)
# how an intrinsic's name spells a pointer to it: typed or opaque pointers
_POINTER_SUFFIX = "p0" if str(ir.PointerType(_VECTOR)) == "ptr" else "p0v16f32"


def available() -> bool:
    """Whether this CPU has AVX-512 (32 registers of 16 float32 lanes)."""
    return bool(llvm.get_host_cpu_features().get("avx512f", False))


class F32x16(types.Type):
    """16 float32 lanes, in one register where the machine has them."""

    def __init__(self) -> None:
        super().__init__(name="f32x16")


f32x16 = F32x16()


@register_model(F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm: Any, fe_type: Any) -> None:
        super().__init__(dmm, fe_type, _VECTOR)


def _float32_vector(arr: Any) -> bool:
    return (isinstance(arr, types.Array) and arr.dtype == types.float32 and arr.ndim == 1
            and arr.layout == "C")


def _lanes_at(context: Any, builder: Any, arrty: Any, arr: Any, index: Any) -> Any:
    """A <16 x float>* to arr[index]."""
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [index]), ir.PointerType(_VECTOR))


def _broadcast(builder: Any, value: Any) -> Any:
    """A <16 x float> of copies of the float `value` (LLVM turns it into one
    broadcast, from memory where `value` was just loaded)."""
    one = builder.insert_element(ir.Constant(_VECTOR, ir.Undefined), value,
                                 ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(_VECTOR, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))


@intrinsic
def load(typingctx: Any, arr: Any, index: Any) -> Any:
    """arr[index : index + 16] as a vector."""
    if not (_float32_vector(arr) and isinstance(index, types.Integer)):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.load(_lanes_at(context, builder, sig.args[0], *args), align=4)
    return f32x16(arr, index), codegen


@intrinsic
def store(typingctx: Any, arr: Any, index: Any, vector: Any) -> Any:
    """arr[index : index + 16] = vector."""
    if not (_float32_vector(arr) and isinstance(index, types.Integer) and vector == f32x16):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        builder.store(args[2], _lanes_at(context, builder, sig.args[0], args[0], args[1]),
                      align=4)
        return context.get_dummy_value()
    return types.none(arr, index, vector), codegen


@intrinsic
def splat(typingctx: Any, value: Any) -> Any:
    """A vector of 16 copies of the float32 `value`."""
    if value != types.float32:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return _broadcast(builder, args[0])
    return f32x16(value), codegen


@intrinsic
def splat_at(typingctx: Any, arr: Any, index: Any) -> Any:
    """A vector of 16 copies of arr[index] (one broadcast load: unlike
    `splat(arr[index])`, no check for a negative index in front of it)."""
    if not (_float32_vector(arr) and isinstance(index, types.Integer)):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return _broadcast(builder, builder.load(builder.gep(data, [args[1]]), align=4))
    return f32x16(arr, index), codegen


def _lane_by_lane(name: str, instruction: str, doc: str) -> Any:
    """The intrinsic `name` of two vectors: `instruction` (an llvmlite
    IRBuilder method: fadd, fsub, fmul) lane by lane."""

    def typer(typingctx: Any, a: Any, b: Any) -> Any:
        if not a == b == f32x16:
            return None

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return getattr(builder, instruction)(*args)
        return f32x16(a, b), codegen
    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


add = _lane_by_lane("add", "fadd", "a + b, lane by lane.")
sub = _lane_by_lane("sub", "fsub", "a - b, lane by lane.")
mul = _lane_by_lane("mul", "fmul", "a * b, lane by lane.")


@intrinsic
def load_first(typingctx: Any, arr: Any, index: Any, count: Any, fill: Any) -> Any:
    """arr[index : index + count] in the first `count` lanes (all 16 from 16
    on) and `fill` in the others, which are not read (one masked load: the
    lanes past `count` may lie past the array, or hold NaN)."""
    if not (_float32_vector(arr) and isinstance(index, types.Integer)
            and isinstance(count, types.Integer) and fill == types.float32):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        arr, index, count, fill = args
        lanes = ir.Constant(ir.VectorType(ir.IntType(64), LANES), list(range(LANES)))
        wide = context.cast(builder, count, sig.args[2], types.int64)
        limit = builder.shuffle_vector(
            builder.insert_element(ir.Constant(lanes.type, ir.Undefined), wide,
                                   ir.Constant(ir.IntType(32), 0)),
            ir.Constant(lanes.type, ir.Undefined),
            ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))
        mask = builder.icmp_signed("<", lanes, limit)
        return _masked_load(builder, _lanes_at(context, builder, sig.args[0], arr, index), mask,
                            _broadcast(builder, fill))
    return f32x16(arr, index, count, fill), codegen


@intrinsic
def load_masked(typingctx: Any, arr: Any, index: Any, bits: Any) -> Any:
    """arr[index + l] in lane l where bit l of the integer `bits` is set, 0
    in the others, which are not read (one masked load, no arithmetic: the
    lanes left out may lie past the array, or hold NaN)."""
    if not (_float32_vector(arr) and isinstance(index, types.Integer)
            and isinstance(bits, types.Integer)):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        arr, index, bits = args
        return _masked_load(builder, _lanes_at(context, builder, sig.args[0], arr, index),
                            _lane_mask(builder, bits), ir.Constant(_VECTOR, [0.0] * LANES))
    return f32x16(arr, index, bits), codegen


@intrinsic
def store_masked(typingctx: Any, arr: Any, index: Any, vector: Any, bits: Any) -> Any:
    """arr[index + l] = lane l of vector where bit l of the integer `bits`
    is set; the others are not written (nor read: they may lie past the
    array)."""
    if not (_float32_vector(arr) and isinstance(index, types.Integer) and vector == f32x16
            and isinstance(bits, types.Integer)):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        arr, index, vector, bits = args
        mask = _lane_mask(builder, bits)
        masked = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_VECTOR, ir.PointerType(_VECTOR),
                                                            ir.IntType(32), mask.type]),
            "llvm.masked.store.v16f32." + _POINTER_SUFFIX)
        at = _lanes_at(context, builder, sig.args[0], arr, index)
        builder.call(masked, [vector, at, ir.Constant(ir.IntType(32), 4), mask])
        return context.get_dummy_value()
    return types.none(arr, index, vector, bits), codegen


def _masked_load(builder: Any, at: Any, mask: Any, others: Any) -> Any:
    """The <16 x float> at the pointer `at` in the lanes of `mask` (a <16 x
    i1>), the lanes of `others` elsewhere (LLVM's masked load)."""
    load = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_VECTOR, [ir.PointerType(_VECTOR), ir.IntType(32),
                                                  mask.type, _VECTOR]),
        "llvm.masked.load.v16f32." + _POINTER_SUFFIX)
    return builder.call(load, [at, ir.Constant(ir.IntType(32), 4), mask, others])


def _lane_mask(builder: Any, bits: Any) -> Any:
    """The <16 x i1> of an integer's low 16 bits (bit l: lane l)."""
    width = bits.type.width
    lanes = (builder.trunc(bits, ir.IntType(LANES)) if width > LANES
             else builder.zext(bits, ir.IntType(LANES)) if width < LANES else bits)
    return builder.bitcast(lanes, ir.VectorType(ir.IntType(1), LANES))


@intrinsic
def total(typingctx: Any, a: Any) -> Any:
    """The sum of a's 16 lanes, as a float32 (in a tree of adds)."""
    if a != f32x16:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        v, width = args[0], LANES
        while width > 1:  # fold the upper half onto the lower
            width //= 2
            half = ir.VectorType(ir.FloatType(), width)
            mask = ir.VectorType(ir.IntType(32), width)
            low = builder.shuffle_vector(v, v, ir.Constant(mask, list(range(width))))
            high = builder.shuffle_vector(v, v, ir.Constant(mask, list(range(width, 2 * width))))
            v = builder.fadd(low, high)
            assert v.type == half
        return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))
    return types.float32(a), codegen


@intrinsic
def fma(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """a * b + c, lane by lane, rounded once (LLVM's fma)."""
    if not a == b == c == f32x16:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        fused = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VECTOR, [_VECTOR] * 3), "llvm.fma.v16f32")
        return builder.call(fused, args)
    return f32x16(a, b, c), codegen


def _transposed(builder: Any, rows: list) -> list:
    """The 16 vectors of the transpose of the 16 x 16 matrix whose rows are
    `rows`: four rounds of 8 pairs of shuffles, round k swapping bit k of
    the row index with bit k of the lane index (each shuffle one permute
    instruction, 64 in all)."""
    rows = list(rows)
    mask = ir.VectorType(ir.IntType(32), LANES)
    for k in range(4):
        step = 1 << k
        low = [c if not c & step else LANES + c - step for c in range(LANES)]
        high = [c + step if not c & step else LANES + c for c in range(LANES)]
        for r in range(LANES):
            if r & step:
                continue
            a, b = rows[r], rows[r + step]
            rows[r] = builder.shuffle_vector(a, b, ir.Constant(mask, low))
            rows[r + step] = builder.shuffle_vector(a, b, ir.Constant(mask, high))
    return rows


@intrinsic
def transpose(typingctx: Any, src: Any, src_at: Any, src_stride: Any, dst: Any, dst_at: Any,
              dst_stride: Any) -> Any:
    """Copy a 16 x 16 block transposed: dst[dst_at + c*dst_stride + r] =
    src[src_at + r*src_stride + c] for r, c < 16 (16 vector loads, 64
    shuffles and 16 vector stores, where element by element takes 256 loads
    and stores)."""
    ints = (src_at, src_stride, dst_at, dst_stride)
    if not (_float32_vector(src) and _float32_vector(dst)
            and all(isinstance(i, types.Integer) for i in ints)):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        src, src_at, src_stride, dst, dst_at, dst_stride = (
            arg if m in (0, 3) else context.cast(builder, arg, sig.args[m], types.intp)
            for m, arg in enumerate(args))
        rows = [builder.load(_lanes_at(context, builder, sig.args[0], src, builder.add(
            src_at, builder.mul(src_stride, ir.Constant(src_stride.type, r)))), align=4)
            for r in range(LANES)]
        for c, column in enumerate(_transposed(builder, rows)):
            at = builder.add(dst_at, builder.mul(dst_stride, ir.Constant(dst_stride.type, c)))
            builder.store(column, _lanes_at(context, builder, sig.args[3], dst, at), align=4)
        return context.get_dummy_value()
    return types.none(src, src_at, src_stride, dst, dst_at, dst_stride), codegen
