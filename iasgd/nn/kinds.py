"""What a layer kind is: the record each module of iasgd.nn.layers exports,
and the state of a lowering that its rows are written through.

A `Kind` says everything about one layer kind: its spec token, its layer
dataclass, its output shape and parameter tensors, how it lowers to plan
rows (iasgd.nn.plan), its PyTorch module (iasgd.export) and which fusions
it takes part in. A `RowOp` is one kind of plan row: which op functions run
its three passes (`passes`: the functions themselves, which iasgd.nn.ops
compiles and tables), how long compiling each takes, and its FLOPs and label
for the benches. The generic driver (iasgd.nn.models) and the op table
(iasgd.nn.ops) only loop over these records.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from iasgd.nn import plan as P

OpFunction = Callable[..., None]  # op(params, grad, plan, i, acts, dacts, argmax, n)
Shape = tuple[int, ...]  # (C, H, W) for a map, (D,) for a vector
Params = tuple[tuple[str, Shape], ...]  # (suffix, shape) of a layer's tensors: ("weight", ...)


def no_flops(row: np.ndarray, n: int) -> tuple[float, float]:
    """A row without multiply-adds worth counting."""
    return 0.0, 0.0


def plain_label(name: str) -> Callable[[np.ndarray], str]:
    """A label "name CxHxW" (of the row's input)."""
    return lambda row: f"{name} {row[P.P_C]}x{row[P.P_H]}x{row[P.P_W]}"


@dataclass(frozen=True, eq=False)
class RowOp:
    """One kind of plan row.

    passes(row): the op functions of the row's forward, weight gradient and
    input gradient (iasgd.nn.plan.nothing where a pass has no work);
    compile_s: every function `passes` can return, with about how many
    seconds compiling it takes on its own (a cold start's estimates,
    iasgd.executors.precompile); flops(row, n): the forward's and the
    backward's FLOPs for n samples (2 per multiply-add); label(row): how
    the benches name it; relu_after: a ReLU right after the row is fused
    into it (its P_RELU column, applied to its output)."""

    name: str
    passes: Callable[[np.ndarray], tuple[OpFunction, OpFunction, OpFunction]]
    compile_s: Mapping[OpFunction, float]
    flops: Callable[[np.ndarray, int], tuple[float, float]] = no_flops
    label: Callable[[np.ndarray], str] | None = None
    relu_after: bool = False

    def describe(self, row: np.ndarray) -> str:
        return (self.label or plain_label(self.name))(row)

    @classmethod
    def without_weights(cls, name: str, forward: OpFunction, input_grad: OpFunction, *,
                        compile_s: float = 0.9,
                        label: Callable[[np.ndarray], str] | None = None) -> RowOp:
        """A row without weights (relu, pad, flatten, the pools): `forward`,
        no weight gradient, and `input_grad` where the row's input needs a
        gradient (its P_GRAD), each about `compile_s` seconds to compile."""

        def passes(row: np.ndarray) -> tuple[OpFunction, OpFunction, OpFunction]:
            return forward, P.nothing, input_grad if row[P.P_GRAD] else P.nothing

        return cls(name, passes, {forward: compile_s, input_grad: compile_s}, label=label)


@dataclass(frozen=True)
class Sizing:
    """What a kind's `shape` may need besides its layer and input shape."""

    where: str  # "conv8k3 (layer 2)": how errors name the layer
    num_classes: int
    last: bool  # the output layer


@dataclass(frozen=True)
class LayerShape:
    """A layer with its output shape ((C, H, W) or (D,)) and parameter tensors."""

    layer: Any
    name: str  # conv1, fc2, relu, ... (parameter tensors are <name>.weight/.bias)
    shape: Shape
    params: tuple[tuple[str, Shape], ...]


def _no_border(layer: Any) -> int:
    return 0


@dataclass(frozen=True, eq=False)
class Kind:
    """A layer kind.

    name: the kind, as the summary and the torch modules name it; layer: its
    dataclass (an instance's `spec()` writes its token); token: the regular
    expression its spec token matches in full (lower case); grammar: the
    token for the spec help; parse(match): the layer of a matched token;
    shape(layer, input shape, sizing): its output shape and parameter
    tensors, ValueError (one line, naming `sizing.where`) if it does not
    fit; lower(lowering, layer shape, next layer shape or None): its plan
    rows; torch(layer shape, input shape): its PyTorch modules, (name, module)
    each (a module with parameters takes the layer's name, others the name
    and a count: relu1, pool1, ...); ops: the kinds of row it lowers to;
    order: where it stands in the grammar and the op table; prefix: its
    parameter tensors' name prefix (conv -> conv1.weight), None without
    parameters; output: it may be the output layer; relu_before: a ReLU
    right before it is fused into its rows (its lowering applies
    `Lowering.fused_relu`); border(layer): the zero border it wants around
    its input (a "same" conv's padding), which the row before it may write;
    statistics: the suffixes of its tensors that are running statistics, not
    trained (they follow every trained tensor in the flat array, and the
    update moves them toward the batch's: iasgd.nn.network); initial:
    constant initial values by tensor suffix (the others get PyTorch's
    default uniform); whole_batch: its rows need the whole batch in one pass
    (batch statistics), so a model with it never runs a batch in slices;
    torch_only: tensors its PyTorch module holds and iasgd does not (batch
    norm's batch count), by suffix: exports write them with these values
    so that PyTorch loads them strictly, and loading ignores them.
    """

    name: str
    layer: type
    token: str
    grammar: str
    parse: Callable[[re.Match], Any]
    shape: Callable[[Any, Shape, Sizing], tuple[Shape, Params]]
    lower: Callable[[Lowering, LayerShape, LayerShape | None], None]
    torch: Callable[[LayerShape, Shape], list[tuple[str, Any]]]
    ops: tuple[RowOp, ...]
    order: int
    prefix: str | None = None
    output: bool = False
    relu_before: bool = False
    border: Callable[[Any], int] = _no_border
    statistics: tuple[str, ...] = ()
    initial: Mapping[str, float] = field(default_factory=dict)
    whole_batch: bool = False
    torch_only: Mapping[str, int] = field(default_factory=dict)
    pattern: re.Pattern = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", re.compile(self.token))


def image(shape: Shape, where: str) -> tuple[int, int, int]:
    """(C, H, W) of a map; ValueError if the map was flattened before."""
    if len(shape) != 3:
        raise ValueError(f"{where} needs an image, but the map was flattened before")
    c, h, w = shape
    return c, h, w


class Lowering:
    """The state of a lowering: the current map (c, h, w with row stride s
    at x_off; `spatial` until flattened), the rows so far, and the
    workspace they lay out (`acts` floats, `argmax` pooling indices, the
    `scratch` that conv paths share after the activations)."""

    def __init__(self, input_shape: Shape, capacity: int, slice_size: int,
                 offsets: Mapping[str, int], codes: Mapping[RowOp, int]) -> None:
        c, h, w = input_shape
        self.c, self.h, self.w, self.s = c, h, w, w
        self.spatial = True
        self.acts = capacity * c * h * w  # the input holds the whole batch
        self.capacity = slice_size  # every later map holds a slice
        self.x_off = 0
        self.argmax = 0
        self.has_params = False  # a row before this one has parameters: it needs a backward
        self.border = 0  # the zero border the current map has already (a pool wrote it)
        self.relu = False  # a ReLU fused into the next row (Kind.relu_before)
        self.scratch = 0
        self.rows: list[list[int]] = []
        self._scratch_rows: list[list[int]] = []
        self._offsets = offsets
        self._codes = codes

    def offset(self, tensor: str) -> int:
        """Where the parameter tensor `tensor` (conv1.weight) starts."""
        return self._offsets[tensor]

    def alloc(self, size: int) -> int:
        """Room for a map of `size` floats per sample; its offset."""
        off = self.acts
        self.acts += self.capacity * size
        return off

    def alloc_argmax(self, size: int) -> int:
        """Room for `size` pooling indices per sample; their offset."""
        off = self.argmax
        self.argmax += self.capacity * size
        return off

    def emit(self, op: RowOp, co: int, oh: int, ow: int, os_: int, z_off: int, *, k: int = 0,
             woff: int = 0, boff: int = 0, aoff: int = 0, soff: int = 0, relu: int = 0,
             path: int = 0) -> list[int]:
        """A row of `op` from the current map to (co, oh, ow) with row stride
        os_ at z_off; returns it (its columns may still be set)."""
        row = [0] * P.PLAN_COLUMNS
        row[P.P_OP], row[P.P_C], row[P.P_H], row[P.P_W], row[P.P_S] = (
            self._codes[op], self.c, self.h, self.w, self.s)
        row[P.P_CO], row[P.P_OH], row[P.P_OW], row[P.P_OS] = co, oh, ow, os_
        row[P.P_XOFF], row[P.P_ZOFF], row[P.P_GRAD] = self.x_off, z_off, int(self.has_params)
        row[P.P_K], row[P.P_WOFF], row[P.P_BOFF], row[P.P_AOFF] = k, woff, boff, aoff
        row[P.P_RELU], row[P.P_PATH], row[P.P_SOFF] = relu, path, soff
        self.rows.append(row)
        return row

    def take_back(self, op: RowOp) -> list[int] | None:
        """The last row if it is a row of `op` without a fused ReLU, taken
        back with the map it wrote (the last one allocated): the current map
        is that row's input again, for the next row to take the row's work
        into its own (a pool takes a batch norm's). None, and nothing
        changed, otherwise."""
        row = self.rows[-1] if self.rows else None
        if row is None or row[P.P_OP] != self._codes[op] or row[P.P_RELU]:
            return None
        size = row[P.P_CO] * row[P.P_OH] * row[P.P_OS]
        if row[P.P_ZOFF] + self.capacity * size != self.acts or row[P.P_ZOFF] != self.x_off:
            return None
        self.rows.pop()
        self.acts = row[P.P_ZOFF]
        self.move(row[P.P_XOFF], row[P.P_C], row[P.P_H], row[P.P_W], row[P.P_S])
        return row

    def move(self, z_off: int, c: int, h: int, w: int, s: int, border: int = 0) -> None:
        """The current map is now (c, h, w; s) at z_off, inside `border`."""
        self.x_off, self.c, self.h, self.w, self.s, self.border = z_off, c, h, w, s, border

    def fused_relu(self) -> int:
        """1 if a ReLU was fused into the row being lowered (and taken), else 0."""
        relu, self.relu = self.relu, False
        return int(relu)

    def needs_scratch(self, row: list[int], floats: int) -> None:
        """`row` uses `floats` of scratch, shared by every row that does (one
        row's pass uses it at a time), after the activations."""
        self.scratch = max(self.scratch, floats)
        self._scratch_rows.append(row)

    def finish(self) -> np.ndarray:
        """The plan table (op columns still 0: iasgd.nn.ops fills them)."""
        if self.scratch:
            for row in self._scratch_rows:
                row[P.P_COFF] = self.acts
            self.acts += self.scratch
        return np.array(self.rows, dtype=np.int64).reshape(-1, P.PLAN_COLUMNS)
