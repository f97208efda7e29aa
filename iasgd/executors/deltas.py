"""The compiled vector ops of a cluster node's exchange with the parameter
server (iasgd.executors.cluster; the messages: iasgd.executors.exchange):
a node's accumulated update, the server applying a push, a node moving onto
fresh parameters. Each is one pass over flat (P,) float32 arrays, called
from Python without the GIL."""

from __future__ import annotations

from iasgd.compiled import jit_fastmath as jit


@jit
def difference(a, b, out):
    """out = a - b, elementwise ((P,) each): a node's accumulated update,
    its parameters minus those of its last pull."""
    for i in range(out.size):
        out[i] = a[i] - b[i]


@jit
def add_scaled(params, delta, scale):
    """params += scale * delta ((P,) each): the server applies a push (or a
    sync round's sum of pushes, scaled by 1 / pushes)."""
    s = params.dtype.type(scale)
    for i in range(params.size):
        params[i] += s * delta[i]


@jit
def rebase(params, base, delta, fresh):
    """params += fresh - (base + delta) ((P,) each): a node moves onto the
    parameters it just pulled and keeps the updates its threads applied
    since it pushed `delta` (taken as params - base). Written as one add
    per parameter, so it races with the threads' updates as Hogwild! does."""
    for i in range(params.size):
        params[i] += fresh[i] - base[i] - delta[i]
