"""2x2 average pooling, stride 2, floor for odd sizes (PyTorch's
avg_pool2d(x, 2)): each output is the mean of its window, and each input of
a window gets a quarter of its output's gradient.

Like the max-pool it reads a wide map and writes a compact one, inside the
zero border the next layer wants (a "same" conv's padding), so that conv
needs no pad row. A ReLU before it stays a row of its own: the mean of a
window and ReLU do not commute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iasgd.compiled import jit_inline
from iasgd.nn.kinds import Kind, LayerShape, Lowering, Params, RowOp, Shape, Sizing, image
from iasgd.nn.layers import kind_of
from iasgd.nn.plan import (
    P_C,
    P_CO,
    P_GRAD,
    P_H,
    P_K,
    P_OH,
    P_OS,
    P_OW,
    P_S,
    P_XOFF,
    P_ZOFF,
    nothing,
    view3,
    view4,
)


@dataclass(frozen=True)
class AvgPool:
    """2x2 average pool, stride 2 (floor for odd sizes)."""

    def spec(self) -> str:
        return "avgpool"


@jit_inline
def avgpool2_forward(z, width, out, border):
    """The 2x2 average pool of a wide map (floor for odd sizes).

    z: (N, C, H*width) with row stride `width`; out: the whole output map
    (N, C, PH + 2B, PW + 2B), PH, PW = H//2, W//2 for the valid width W,
    the means written inside a border of B = `border` pixels (the border
    itself is not written).
    """
    N, C, OH, OW = out.shape
    PH, PW = OH - 2 * border, OW - 2 * border
    quarter = z.dtype.type(0.25)
    for n in range(N):
        for c in range(C):
            plane = z[n, c]
            for i in range(PH):
                top = 2 * i * width
                r0 = plane[top:top + width]
                r1 = plane[top + width:top + 2 * width]
                o = out[n, c, border + i, border:border + PW]
                for j in range(PW):
                    o[j] = (r0[2 * j] + r0[2 * j + 1] + r1[2 * j] + r1[2 * j + 1]) * quarter


@jit_inline
def avgpool2_backward(dout, width, dz):
    """dz (N, C, H*width) wide, overwritten: a quarter of each output's
    gradient dout (N, C, PH, PW) on each input of its window, zero on the
    inputs no window covers (an odd last row or column, junk columns)."""
    N, C, PH, PW = dout.shape
    quarter = dz.dtype.type(0.25)
    dz[:] = 0
    for n in range(N):
        for c in range(C):
            plane = dz[n, c]
            for i in range(PH):
                top = 2 * i * width
                r0 = plane[top:top + width]
                r1 = plane[top + width:top + 2 * width]
                d = dout[n, c, i]
                for j in range(PW):
                    g = d[j] * quarter
                    r0[2 * j] = g
                    r0[2 * j + 1] = g
                    r1[2 * j] = g
                    r1[2 * j + 1] = g


# ------------------------------------------------------------------ its row


def avgpool_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    avgpool2_forward(view3(acts, row[P_XOFF], n, row[P_C], row[P_H] * row[P_S]), row[P_S],
                     _map(acts, row, n), row[P_K])


def avgpool_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    B = row[P_K]
    dout = _map(dacts, row, n)[:, :, B:B + row[P_OH], B:B + row[P_OW]]
    avgpool2_backward(dout, row[P_S], view3(dacts, row[P_XOFF], n, row[P_C], row[P_H] * row[P_S]))


@jit_inline
def _map(flat, row, n):
    """The row's whole output map (n, CO, OH + 2K, OS), its border included."""
    return view4(flat, row[P_ZOFF], n, row[P_CO], row[P_OH] + 2 * row[P_K], row[P_OS])


def _passes(row: Any) -> tuple:
    return avgpool_forward_op, nothing, avgpool_input_op if row[P_GRAD] else nothing


ROW = RowOp("avgpool", _passes, {avgpool_forward_op: 0.9, avgpool_input_op: 0.9})


def _shape(layer: AvgPool, shape: Shape, sizing: Sizing) -> tuple[Shape, Params]:
    c, h, w = image(shape, sizing.where)
    if h < 2 or w < 2:
        raise ValueError(f"{sizing.where}: its {h}x{w} input is too small for a 2x2 pool")
    return (c, h // 2, w // 2), ()


def _lower(lo: Lowering, ls: LayerShape, nxt: LayerShape | None) -> None:
    c, ph, pw = lo.c, lo.h // 2, lo.w // 2
    b = kind_of(nxt.layer).border(nxt.layer) if nxt is not None else 0  # the next one's padding
    z = lo.alloc(c * (ph + 2 * b) * (pw + 2 * b))
    lo.emit(ROW, c, ph, pw, pw + 2 * b, z, k=b)
    lo.move(z, c, ph + 2 * b, pw + 2 * b, pw + 2 * b, border=b)


def _torch(ls: LayerShape, shape: Shape) -> list[tuple[str, Any]]:
    from torch import nn

    return [("avgpool", nn.AvgPool2d(2))]


KIND = Kind("avgpool", AvgPool, r"avgpool", "avgpool", lambda m: AvgPool(), _shape, _lower,
            _torch, (ROW,), order=35)
