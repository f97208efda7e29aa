"""The layer kinds: one module each, found here by discovery.

Every public module of this package exports `KIND`, its record
(iasgd.nn.kinds.Kind). A new layer kind is a new module here and its tests:
the spec grammar, the shapes and parameter layout, the lowering, the op
table, the export to PyTorch and the benches' counts all read the records
(docs/architecture.md, "Adding a layer kind").
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import numpy as np

from iasgd.nn.kinds import Kind, RowOp
from iasgd.nn.plan import P_OP


def kind_of(layer: Any) -> Kind:
    """The kind of a layer (an instance of one kind's dataclass)."""
    try:
        return _BY_LAYER[type(layer)]
    except KeyError:
        raise ValueError(f"unknown layer {layer!r}") from None


def row_op(row: np.ndarray) -> RowOp:
    """The kind of a plan row."""
    return ROW_OPS[int(row[P_OP])]


def _discover() -> tuple[Kind, ...]:
    kinds = [importlib.import_module(f"{__name__}.{info.name}").KIND
             for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")]
    return tuple(sorted(kinds, key=lambda kind: (kind.order, kind.name)))


KINDS = _discover()  # in grammar order
_BY_LAYER = {kind.layer: kind for kind in KINDS}
# Every kind of plan row, once; a row's P_OP is its position here.
ROW_OPS: tuple[RowOp, ...] = tuple(dict.fromkeys(op for kind in KINDS for op in kind.ops))
CODES = {op: code for code, op in enumerate(ROW_OPS)}
