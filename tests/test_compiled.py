"""Tests for iasgd.compiled: one set of jit flags, a cache key over the compiled
modules only, and a cache directory for iasgd's functions only."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numba
import pytest

from iasgd import compiled
from iasgd.nn import network as K

PACKAGE = Path(compiled.__file__).parent


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    """A copy of the iasgd sources to edit."""
    return Path(shutil.copytree(PACKAGE, tmp_path / "iasgd",
                                ignore=shutil.ignore_patterns("__pycache__")))


def append_comment(path: Path) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write("\n# an edit\n")


def test_compiled_sources_are_the_modules_with_compiled_code() -> None:
    names = {path.relative_to(PACKAGE).as_posix() for path in compiled.compiled_sources()}
    assert {"protocol/atomics.py", "compiled.py", "protocol/gate.py", "nn/network.py",
            "nn/plan.py", "nn/layers/conv.py", "nn/conv/direct.py", "protocol/workers.py",
            "executors/deltas.py"} <= names
    assert not names & {"run.py", "data/loader.py", "nn/models.py", "engine.py", "__init__.py",
                        "executors/threads.py", "executors/simulated.py", "nn/kinds.py"}


def test_every_compiled_module_takes_its_flags_from_here() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.name != "compiled.py":
            assert not re.search(r"\bnjit\(|\bjit\(", path.read_text()), path


def test_editing_a_plain_module_keeps_the_key(package_copy: Path) -> None:
    key = compiled.cache_key(package_copy)
    assert key == compiled.cache_key(PACKAGE)
    for name in ("run.py", "data/loader.py", "nn/models.py", "__init__.py",
                 "executors/threads.py"):
        append_comment(package_copy / name)
    assert compiled.cache_key(package_copy) == key


@pytest.mark.parametrize("name", ["nn/network.py", "nn/layers/dense.py", "protocol/workers.py",
                                  "protocol/gate.py", "protocol/atomics.py", "compiled.py"])
def test_editing_a_compiled_module_changes_the_key(name: str, package_copy: Path) -> None:
    key = compiled.cache_key(package_copy)
    append_comment(package_copy / name)
    assert compiled.cache_key(package_copy) != key


@pytest.mark.parametrize("folder", [".", "nn", "protocol", "a_new_subpackage"])
def test_a_new_module_with_compiled_code_joins_the_key(folder: str, package_copy: Path) -> None:
    key = compiled.cache_key(package_copy)
    (package_copy / folder).mkdir(exist_ok=True)
    (package_copy / folder / "extra.py").write_text("from iasgd.compiled import jit\n")
    assert compiled.cache_key(package_copy) != key


def test_moving_a_compiled_module_changes_the_key(package_copy: Path) -> None:
    """The key covers where a compiled module lives, not only what it says."""
    key = compiled.cache_key(package_copy)
    (package_copy / "nn" / "network.py").rename(package_copy / "protocol" / "network.py")
    assert compiled.cache_key(package_copy) != key


def test_portable_wait_is_in_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.PORTABLE_WAIT_VARIABLE, raising=False)
    key = compiled.cache_key()
    monkeypatch.setenv(compiled.PORTABLE_WAIT_VARIABLE, "1")
    assert compiled.cache_key() != key


def test_cache_dir_default_and_user_numba_cache_dir(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    key = compiled.cache_key()
    assert compiled.cache_dir() == PACKAGE / "__pycache__" / f"numba-{key}"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert compiled.cache_dir() == tmp_path / "iasgd" / f"numba-{key}"


def _cache_path(dispatcher: object) -> str:
    return dispatcher._cache._cache_path  # type: ignore[attr-defined]


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="no caching without the jit")
def test_cache_dir_applies_to_iasgd_functions_only() -> None:
    assert Path(_cache_path(K.train_steps)).is_relative_to(compiled.CACHE_DIR)
    assert str(compiled.CACHE_DIR) not in str(numba.config.CACHE_DIR)

    @numba.njit(cache=True)
    def someone_elses(x):  # pragma: no cover (never called)
        return x

    assert not Path(_cache_path(someone_elses)).is_relative_to(compiled.CACHE_DIR)


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="no caching without the jit")
def test_user_numba_cache_dir_is_respected(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"  # numba caches only functions defined in a file
    probe.write_text(
        "import json, numba\n"
        "from iasgd import compiled\n"
        "from iasgd.nn import network\n"
        "from iasgd.protocol import workers\n"
        "theirs = numba.njit(cache=True)(lambda x: x)\n"
        "print(json.dumps([str(compiled.CACHE_DIR), network.train_steps._cache._cache_path,\n"
        "                  workers.next_random._cache._cache_path, theirs._cache._cache_path]))\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "user")}
    out = subprocess.run([sys.executable, str(probe)], env=env, check=True,
                         capture_output=True, text=True).stdout
    ours, kernel, worker, theirs = (Path(p) for p in json.loads(out))
    assert ours.parent == tmp_path / "user" / "iasgd"
    assert kernel.is_relative_to(ours) and worker.is_relative_to(ours)
    assert theirs.is_relative_to(tmp_path / "user") and not theirs.is_relative_to(ours)


def _cache_written(base: Path, name: str, hours_ago: float) -> Path:
    """A numba-<digest>-like directory under base, its subfolder (as numba
    lays them out) last written `hours_ago`."""
    directory = base / name
    sub = directory / "nn_0123"
    sub.mkdir(parents=True)
    (sub / "kernels.f-1.py311.nbi").write_bytes(b"")
    when = time.time() - hours_ago * 3600
    for path in (sub / "kernels.f-1.py311.nbi", sub, directory):
        os.utime(path, (when, when))
    return directory


def test_prune_caches_keeps_the_current_the_newest_and_the_recent(tmp_path: Path) -> None:
    digest = "numba-{:016x}".format
    current = _cache_written(tmp_path, digest(0), hours_ago=500)  # in use, however old
    recent = [_cache_written(tmp_path, digest(i), hours_ago=0.1 * i) for i in (1, 2, 3)]
    old = [_cache_written(tmp_path, digest(i), hours_ago=i) for i in (5, 6, 7)]
    # the subfolder, not the directory itself, says when numba last wrote
    touched = _cache_written(tmp_path, digest(8), hours_ago=100)
    os.utime(touched / "nn_0123", (time.time() - 1800, time.time() - 1800))
    kept_by_name = [_cache_written(tmp_path, name, hours_ago=100)
                    for name in ("numba-xyz", "numba-0123", "other", f"{digest(9)}.bak")]
    (tmp_path / f"{digest(10)}").write_text("a file, not a cache")

    deleted = compiled.prune_caches(current, keep=2, recent_s=3600)

    assert sorted(deleted) == sorted(old)  # recent[2] is third newest, but recent
    assert all(not d.exists() for d in old)
    assert all(d.is_dir() for d in (current, *recent, touched, *kept_by_name))
    assert (tmp_path / f"{digest(10)}").is_file()


def test_prune_caches_keeps_the_newest_others_however_old(tmp_path: Path) -> None:
    digest = "numba-{:016x}".format
    current = tmp_path / digest(0)
    others = [_cache_written(tmp_path, digest(i), hours_ago=10 * i) for i in (1, 2, 3, 4)]
    assert compiled.prune_caches(current, keep=2, recent_s=3600) == others[2:]
    assert [d.exists() for d in others] == [True, True, False, False]
    assert compiled.prune_caches(current, keep=0, recent_s=3600) == others[:2]
    assert compiled.prune_caches(tmp_path / "missing" / digest(0)) == []


def test_prune_caches_leaves_a_folder_it_cannot_list(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    old = _cache_written(tmp_path, f"numba-{1:016x}", hours_ago=100)

    def refuse(self: Path):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", refuse)
    assert compiled.prune_caches(tmp_path / f"numba-{0:016x}", keep=0) == []
    assert old.is_dir()
