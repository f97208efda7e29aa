"""Writing files so that no reader ever sees half of one: results, checkpoints
and data caches go to a temporary file beside the target, renamed onto it in
one step."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _json_safe(value: Any) -> Any:
    """NaN and infinities become null: strict JSON that every tool reads."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value



@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block succeeds, move it
    onto `path` in one rename (with the permissions a new file would get), so
    a reader never sees half a file and the old one survives any failure."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)



def write_json_atomic(path: str | Path, document: dict[str, Any]) -> None:
    """Write JSON atomically (see `replacing`); non-finite numbers as null."""
    with replacing(path) as tmp, open(tmp, "w") as f:
        json.dump(_json_safe(document), f, indent=2, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
