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
from iasgd.nn.kinds import Kind, LayerShape, Lowering, RowOp, Shape
from iasgd.nn.layers.pool import lower_pool, pool_map, pool_shape, pooled, wide_input, window_rows
from iasgd.nn.plan import P_K, P_S


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
    N, C, OH, _ = out.shape
    quarter = z.dtype.type(0.25)
    for n in range(N):
        for c in range(C):
            for i in range(OH - 2 * border):
                _, r0, r1, o = window_rows(z, out, n, c, i, width, border)
                for j in range(o.size):
                    o[j] = (r0[2 * j] + r0[2 * j + 1] + r1[2 * j] + r1[2 * j + 1]) * quarter


@jit_inline
def avgpool2_backward(dout, width, dz):
    """dz (N, C, H*width) wide, overwritten: a quarter of each output's
    gradient dout (N, C, PH, PW) on each input of its window, zero on the
    inputs no window covers (an odd last row or column, junk columns)."""
    N, C, PH, _ = dout.shape
    quarter = dz.dtype.type(0.25)
    dz[:] = 0
    for n in range(N):
        for c in range(C):
            for i in range(PH):
                _, r0, r1, d = window_rows(dz, dout, n, c, i, width, 0)
                for j in range(d.size):
                    g = d[j] * quarter
                    r0[2 * j] = g
                    r0[2 * j + 1] = g
                    r1[2 * j] = g
                    r1[2 * j + 1] = g


# ------------------------------------------------------------------ its row
# (the views of its maps, its shape and its lowering: the max-pool's,
# iasgd.nn.layers.pool)


def avgpool_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    avgpool2_forward(wide_input(acts, row, n), row[P_S], pool_map(acts, row, n), row[P_K])


def avgpool_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    avgpool2_backward(pooled(dacts, row, n), row[P_S], wide_input(dacts, row, n))


ROW = RowOp.without_weights("avgpool", avgpool_forward_op, avgpool_input_op)


def _lower(lo: Lowering, ls: LayerShape, nxt: LayerShape | None) -> None:
    lower_pool(lo, nxt, ROW)


def _torch(ls: LayerShape, shape: Shape) -> list[tuple[str, Any]]:
    from torch import nn

    return [("avgpool", nn.AvgPool2d(2))]


KIND = Kind("avgpool", AvgPool, r"avgpool", "avgpool", lambda m: AvgPool(), pool_shape, _lower,
            _torch, (ROW,), order=35)
