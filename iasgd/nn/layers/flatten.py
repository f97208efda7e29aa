"""Flatten: (C, H, W) -> (C*H*W,) in C order, as PyTorch's flatten(1).

A map without junk columns is already flat: flattening it costs nothing (no
row). A wide map (row stride S > W) is copied compactly. A dense layer on a
map flattens it itself (`to_vector`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from iasgd.compiled import jit_inline
from iasgd.nn.kinds import Kind, LayerShape, Lowering, Params, RowOp, Shape, Sizing
from iasgd.nn.plan import P_W, copy_values, input4, output2


@dataclass(frozen=True)
class Flatten:
    def spec(self) -> str:
        return "flatten"


@jit_inline
def flatten_rows(x, width, flat, back):
    """The copy between a map x (N, C, H, S) of valid width `width` and its
    flat form (N, C*H*width), C order: flat = x's valid columns, or where
    `back` (a constant at each call) x = flat unflattened, x's junk columns
    zeroed."""
    N, C, H, _ = x.shape
    for n in range(N):
        for c in range(C):
            for i in range(H):
                base = (c * H + i) * width
                row, part = x[n, c, i], flat[n, base:base + width]
                if back:
                    copy_values(part, row[:width])
                    row[width:] = 0
                else:
                    copy_values(row[:width], part)


@jit_inline
def flatten_forward(x, width, out):
    """out (N, C*H*width) = the valid columns of x (N, C, H, S), in C order."""
    flatten_rows(x, width, out, False)


@jit_inline
def flatten_backward(dout, width, dx):
    """dx (N, C, H, S) = dout (N, C*H*width) unflattened; junk columns zeroed."""
    flatten_rows(dx, width, dout, True)


def flatten_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    flatten_forward(input4(acts, row, n), row[P_W], output2(acts, row, n))


def flatten_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    flatten_backward(output2(dacts, row, n), row[P_W], input4(dacts, row, n))


ROW = RowOp.without_weights("flatten", flatten_forward_op, flatten_input_op)


def to_vector(lo: Lowering) -> None:
    """Make the current map a vector: a compact copy where it has junk columns."""
    if not lo.spatial:
        return
    d = lo.c * lo.h * lo.w
    x_off = lo.x_off
    if lo.s != lo.w:  # drop the junk columns
        x_off = lo.alloc(d)
        lo.emit(ROW, d, 1, 1, 1, x_off)
    lo.spatial = False
    lo.move(x_off, d, 1, 1, 1)


def _shape(layer: Flatten, shape: Shape, sizing: Sizing) -> tuple[Shape, Params]:
    return (math.prod(shape),), ()


def _lower(lo: Lowering, ls: LayerShape, nxt: LayerShape | None) -> None:
    to_vector(lo)


def _torch(ls: LayerShape, shape: Shape) -> list[tuple[str, Any]]:
    from torch import nn

    return [("flatten", nn.Flatten())]


KIND = Kind("flatten", Flatten, r"flatten", "flatten", lambda m: Flatten(), _shape, _lower,
            _torch, (ROW,), order=40)
