"""Global average pool: (C, H, W) -> (C,), each channel's mean over its
plane (PyTorch's adaptive_avg_pool2d(x, 1) then flatten(1)), and each
input of a plane gets 1 / (H*W) of its channel's gradient.

It reads a wide map (row stride S, junk columns skipped) and writes a
vector, so a dense layer follows it directly. A ReLU before it stays a row
of its own: a mean and ReLU do not commute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iasgd.compiled import jit_inline
from iasgd.nn.kinds import Kind, LayerShape, Lowering, Params, RowOp, Shape, Sizing, image
from iasgd.nn.plan import P_W, input4, output2


@dataclass(frozen=True)
class GlobalAvgPool:
    """Each channel's mean over its whole plane."""

    def spec(self) -> str:
        return "gap"


@jit_inline
def global_mean_forward(x, width, out):
    """out (N, C) = the mean of each plane x[n, c, :, :width] of the wide
    map x (N, C, H, S); the junk columns are not read."""
    N, C, H, _ = x.shape
    count = x.dtype.type(H * width)
    for n in range(N):
        for c in range(C):
            s = x.dtype.type(0)
            for i in range(H):
                row = x[n, c, i]
                for j in range(width):
                    s += row[j]
            out[n, c] = s / count


@jit_inline
def global_mean_backward(dout, width, dx):
    """dx (N, C, H, S) wide, overwritten: dout[n, c] / (H*width) on every
    valid input of plane (n, c), zero in the junk columns."""
    N, C, H, S = dx.shape
    count = dx.dtype.type(H * width)
    for n in range(N):
        for c in range(C):
            g = dout[n, c] / count
            for i in range(H):
                row = dx[n, c, i]
                for j in range(width):
                    row[j] = g
                for j in range(width, S):
                    row[j] = 0


def gap_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    global_mean_forward(input4(acts, row, n), row[P_W], output2(acts, row, n))


def gap_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    global_mean_backward(output2(dacts, row, n), row[P_W], input4(dacts, row, n))


ROW = RowOp.without_weights("gap", gap_forward_op, gap_input_op)


def _shape(layer: GlobalAvgPool, shape: Shape, sizing: Sizing) -> tuple[Shape, Params]:
    c, _, _ = image(shape, sizing.where)
    return (c,), ()


def _lower(lo: Lowering, ls: LayerShape, nxt: LayerShape | None) -> None:
    z = lo.alloc(lo.c)
    lo.emit(ROW, lo.c, 1, 1, 1, z)
    lo.spatial = False
    lo.move(z, lo.c, 1, 1, 1)


def _torch(ls: LayerShape, shape: Shape) -> list[tuple[str, Any]]:
    from torch import nn

    return [("gap", nn.AdaptiveAvgPool2d(1)), ("flatten", nn.Flatten())]


KIND = Kind("gap", GlobalAvgPool, r"gap", "gap", lambda m: GlobalAvgPool(), _shape, _lower,
            _torch, (ROW,), order=38)
