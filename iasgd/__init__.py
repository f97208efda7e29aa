"""iasgd: fast parallel SGD on the cores of one machine (Interval-Asynchrony
and its baselines), with numba-compiled kernels."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def _numba_cache_per_source_version() -> None:
    """Keep numba's on-disk cache in a directory named for a digest of this
    package's sources. numba invalidates a cached function only when its own
    file changes, not when a function it calls in another module does (a
    worker loop in workers.py inlines the kernels of kernels.py): a stale
    cache would silently run old code. A user's NUMBA_CACHE_DIR is respected."""
    import numba

    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    # the wait kind changes the code that atomics.py emits (see there)
    digest.update(os.environ.get("IASGD_PORTABLE_WAIT", "").encode())
    for source in sorted(here.glob("*.py")):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    base = here / "__pycache__"
    if not os.access(here, os.W_OK):  # e.g. installed system-wide
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "iasgd"
    numba.config.CACHE_DIR = str(base / f"numba-{digest.hexdigest()[:16]}")


_numba_cache_per_source_version()
