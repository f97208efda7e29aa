"""ReLU: max(x, 0), in place on any map or vector.

A ReLU right before a max-pool or right after a dense layer is fused into
that row (iasgd.nn.models' fusion step); elsewhere it is a row of its own,
working in place on the map before it (wide rows included: the junk
columns' gradients stay zero).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iasgd.compiled import jit_inline
from iasgd.nn.kinds import Kind, LayerShape, Lowering, Params, RowOp, Shape, Sizing
from iasgd.nn.plan import P_C, P_H, P_S, P_XOFF


@dataclass(frozen=True)
class ReLU:
    def spec(self) -> str:
        return "relu"


@jit_inline
def relu_inplace(z):
    """z = max(z, 0), any shape (flat view taken)."""
    f = z.reshape(z.size)
    for i in range(f.size):
        if f[i] < 0:
            f[i] = 0


@jit_inline
def relu_backward_inplace(dz, z):
    """dz *= (z > 0), where z holds the ReLU *output*; same shapes."""
    df = dz.reshape(dz.size)
    zf = z.reshape(z.size)
    for i in range(df.size):
        if zf[i] <= 0:
            df[i] = 0


def relu_forward_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    relu_inplace(acts[row[P_XOFF]:row[P_XOFF] + n * row[P_C] * row[P_H] * row[P_S]])


def relu_input_op(params, grad, plan, i, acts, dacts, argmax, n):
    row = plan[i]
    size = n * row[P_C] * row[P_H] * row[P_S]
    relu_backward_inplace(dacts[row[P_XOFF]:row[P_XOFF] + size],
                          acts[row[P_XOFF]:row[P_XOFF] + size])


ROW = RowOp.without_weights("relu", relu_forward_op, relu_input_op)


def _shape(layer: ReLU, shape: Shape, sizing: Sizing) -> tuple[Shape, Params]:
    return shape, ()


def _lower(lo: Lowering, ls: LayerShape, nxt: LayerShape | None) -> None:
    lo.emit(ROW, lo.c, lo.h, lo.w, lo.s, lo.x_off)  # in place


def _torch(ls: LayerShape, shape: Shape) -> list[tuple[str, Any]]:
    from torch import nn

    return [("relu", nn.ReLU())]


KIND = Kind("relu", ReLU, r"relu", "relu", lambda m: ReLU(), _shape, _lower, _torch, (ROW,),
            order=20)
