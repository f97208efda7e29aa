"""numba settings of iasgd: the jit flags and where compiled code is cached.

Every module with compiled code decorates its functions with `jit` (or
`jit_fastmath`, the layer kernels) from here, so the flags live in one place.

Cache. numba invalidates a cached function only when its own source file
changes, not when a function it inlines from another module does (a worker
loop in protocol/workers.py inlines the passes of nn/network.py and the
atomics of protocol/atomics.py): a stale cache would silently run old code. So iasgd's functions
are cached in a directory named for a digest of the modules that hold
compiled code, in every subfolder -- those that import numba or this module at
module level (found by reading them, so a new compiled module is covered
without a list to keep) --
and of IASGD_PORTABLE_WAIT, which changes the code atomics.py emits. Editing
run.py or data/loader.py therefore keeps the cache; editing nn/network.py empties it.

The directory applies to iasgd's functions only: `jit` sets
numba.config.CACHE_DIR just while it enables caching on one dispatcher
(numba's locator reads the setting then and keeps the path), then restores
it. Other numba users in the process keep numba's own behaviour. This relies
on numba's public setting and `Dispatcher.enable_caching` only; a custom
cache locator would subclass numba-private classes whose names changed
between 0.60 (`_UserProvidedCacheLocator`, `_CacheImpl`) and 0.68.

A user's NUMBA_CACHE_DIR is respected: iasgd's cache then lives under
$NUMBA_CACHE_DIR/iasgd/, still named for the digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numba

PORTABLE_WAIT_VARIABLE = "IASGD_PORTABLE_WAIT"  # read by atomics.py; part of the digest

# Every compiled function runs without the GIL (worker threads call them in
# parallel) and is cached on disk (a cold compile takes ~15-25 s). None gets
# numba's C-callable wrapper: nothing calls them from C (the layer ops, which
# compiled code calls through pointers, are compiled by compile_callback), and
# each wrapper costs compile time.
FLAGS: dict[str, Any] = {"nogil": True, "no_cfunc_wrapper": True}
# Reassociation lets LLVM vectorise float reductions; nnan/ninf are left out on
# purpose so that a diverging run still produces NaN/inf we can detect.
FASTMATH = frozenset({"reassoc", "contract", "nsz", "arcp"})

_PACKAGE = Path(__file__).resolve().parent
# A module-level import of numba or of this module marks a module as holding compiled
# code (run.py and results.py import numba inside functions, for its settings only).
_COMPILED_IMPORT = re.compile(
    r"^(import numba\b|from numba\b|import iasgd\.compiled\b|from iasgd\.compiled\b"
    r"|from iasgd import .*\bcompiled\b)", re.MULTILINE)


def compiled_sources(package: Path = _PACKAGE) -> list[Path]:
    """The modules of `package` and its subpackages that hold compiled code,
    sorted by their path inside the package."""
    return [path for path in sorted(package.rglob("*.py"),
                                    key=lambda p: p.relative_to(package).as_posix())
            if "__pycache__" not in path.parts
            and _COMPILED_IMPORT.search(path.read_text(encoding="utf-8"))]


def cache_key(package: Path = _PACKAGE) -> str:
    """16 hex digits: a digest of the compiled modules' names and sources and of
    $IASGD_PORTABLE_WAIT."""
    digest = hashlib.sha256()
    digest.update(os.environ.get(PORTABLE_WAIT_VARIABLE, "").encode())
    for source in compiled_sources(package):
        digest.update(source.relative_to(package).as_posix().encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir(package: Path = _PACKAGE) -> Path:
    """Where iasgd's compiled functions are cached: under $NUMBA_CACHE_DIR/iasgd if
    the user set it, else the package's __pycache__, else (package not writable,
    e.g. installed system-wide) $XDG_CACHE_HOME/iasgd; named numba-<cache_key>."""
    user = os.environ.get("NUMBA_CACHE_DIR")
    if user:
        base = Path(user) / "iasgd"
    elif os.access(package, os.W_OK):
        base = package / "__pycache__"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "iasgd"
    return base / f"numba-{cache_key(package)}"


CACHE_DIR = cache_dir()

# Every edit of a compiled module, and every upgrade of iasgd, compiles into
# a new numba-<digest> directory beside the old ones (3-9 MB each for the
# presets; a working copy had gathered 58 of them, 78 MB). A cold start
# deletes all but the newest few (by when they were last written), and none
# written in the last hour: a process of the old code may still be adding to
# its directory (its deferred evaluation, a model it had not run yet).
KEEP_OTHER_CACHES = 2
KEEP_CACHES_WRITTEN_S = 3600.0
_CACHE_NAME = re.compile(r"numba-[0-9a-f]{16}")


def prune_caches(current: Path | None = None, keep: int = KEEP_OTHER_CACHES,
                 recent_s: float = KEEP_CACHES_WRITTEN_S) -> list[Path]:
    """Delete the numba-<digest> directories beside `current` (default:
    CACHE_DIR) except `current`, the `keep` last written others and any
    written in the last `recent_s` seconds; returns those deleted. Nothing
    else in their folder is touched, and a folder it cannot list is left
    alone (housekeeping never stops a run)."""
    current = Path(current or CACHE_DIR)
    try:
        others = [d for d in current.parent.iterdir()
                  if d.is_dir() and _CACHE_NAME.fullmatch(d.name) and d.name != current.name]
    except OSError:  # not there yet, or not ours to list
        return []
    written = {d: _last_written(d) for d in others}
    by_age = sorted(others, key=written.__getitem__, reverse=True)
    cutoff = time.time() - recent_s
    stale = [d for d in by_age[keep:] if written[d] < cutoff]
    for d in stale:
        shutil.rmtree(d, ignore_errors=True)
    return stale


def _last_written(directory: Path) -> float:
    # numba writes into one subfolder per source folder: their times move,
    # the directory's own does not
    try:
        return max(p.stat().st_mtime for p in (directory, *directory.iterdir()))
    except OSError:  # deleted meanwhile (another process pruning)
        return time.time()


@contextlib.contextmanager
def _numba_cache_dir(path: Path) -> Iterator[None]:
    """numba.config.CACHE_DIR = path inside the block, restored after."""
    previous = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(path)
    try:
        yield
    finally:
        numba.config.CACHE_DIR = previous


def _decorator(**flags: Any) -> Callable[[Callable[..., Any]], Any]:
    """A decorator that compiles with `flags` and caches in CACHE_DIR."""
    def decorate(func: Callable[..., Any]) -> Any:
        dispatcher = numba.njit(**flags)(func)
        if numba.config.DISABLE_JIT:  # a plain Python function: nothing to cache
            return dispatcher
        with _numba_cache_dir(CACHE_DIR):
            dispatcher.enable_caching()  # what njit(cache=True) calls, at our path
        return dispatcher
    return decorate


jit = _decorator(**FLAGS)
jit_fastmath = _decorator(**FLAGS, fastmath=set(FASTMATH))
# Small helpers (array views, taps), the layer kernels (each copied into
# the op that calls it), the training step's parts (loss, update, batch
# gathering) and every call below a worker loop (the gate, a step's read,
# compute and apply): numba copies their code into each caller before
# typing it, instead of compiling, optimising, emitting and caching each
# one as a function of its own for every type it is called with. Each such
# function cost about 0.3 s of a cold start, and its code was optimised
# again inside its caller (LLVM inlined them anyway): inlining them took
# the interval worker loop from 8.7 to 5.0 s of compiling, the sequential
# steps from 2.2 to 1.7 s and LeNet-5's ops from 16-18 to 13-15 CPU-s. It
# also keeps the cache safe for compiling side by side
# (iasgd.executors.precompile): every cached function is reached from one
# layer op or entry only. Inlined code is compiled with its caller's flags,
# so a function that inlines these has the fast-math flags too.
jit_inline = _decorator(**FLAGS, fastmath=set(FASTMATH), inline="always")

# The network passes call the layer ops through numba's first-class function
# type (iasgd.nn.ops), which numba still labels experimental; iasgd's tests
# cover the one use it makes of it.
warnings.filterwarnings("ignore", category=numba.NumbaExperimentalFeatureWarning,
                        message="First-class function type")


def compile_callback(func: Callable[..., Any], signature: Any) -> Any:
    """`func` compiled for `signature` as a C callback (numba.cfunc: callable
    from compiled code through a pointer, so callers do not compile it into
    themselves), with the layer kernels' fast-math flags, cached in CACHE_DIR.
    Without the jit (NUMBA_DISABLE_JIT), `func` itself."""
    if numba.config.DISABLE_JIT:
        return func
    with _numba_cache_dir(CACHE_DIR):
        return numba.cfunc(signature, fastmath=set(FASTMATH), cache=True)(func)


def cache_index_name(dispatcher: Any) -> str:
    """The file name of a compiled function's index in numba's cache:
    `<module>.<qualname>-<first line>.py<XY>.nbi`, module being the last part
    of its dotted name (numba's naming, which iasgd relies on here only)."""
    func = getattr(dispatcher, "py_func", dispatcher)  # a dispatcher or a plain function
    module = func.__module__.rsplit(".", 1)[-1]
    return (f"{module}.{func.__qualname__}-{func.__code__.co_firstlineno}"
            f".py{sys.version_info.major}{sys.version_info.minor}.nbi")


def uncached(dispatchers: list[Any], cache_dir: Path | None = None) -> list[Any]:
    """Those of `dispatchers` that the on-disk cache (default: CACHE_DIR) has
    no index for: their first call compiles them."""
    if numba.config.DISABLE_JIT:  # nothing will be compiled
        return []
    base = Path(cache_dir or CACHE_DIR)
    found = {index.name for index in base.rglob("*.nbi")} if base.is_dir() else set()
    return [d for d in dispatchers if cache_index_name(d) not in found]
