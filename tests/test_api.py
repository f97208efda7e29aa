"""The package API: what `from iasgd import ...` gives, and the Python
examples of the front page, docs/models.md and the package docstring, run
as written."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

import iasgd

REPO = Path(__file__).resolve().parents[1]


def test_every_public_name_is_there() -> None:
    for name in iasgd.__all__:
        assert getattr(iasgd, name) is not None, name
    assert {"train", "TrainConfig", "build", "load", "RunResult", "ConfigError"} <= set(
        iasgd.__all__)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def examples() -> list[tuple[str, str]]:
    found = [(f"{name}[{i}]", block)
             for name in ("README.md", "docs/models.md")
             for i, block in enumerate(python_blocks((REPO / name).read_text()))
             if "model.pt" not in block]  # the export's example: tests/test_export.py
    doc = iasgd.__doc__ or ""
    start = doc.index("    from iasgd import")
    end = doc.index("\n\n", doc.index("print("))
    found.append(("iasgd.__doc__", textwrap.dedent(doc[start:end])))
    return found


@pytest.mark.parametrize(("where", "code"), examples(), ids=[w for w, _ in examples()])
def test_python_examples_run_as_written(where: str, code: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # whatever an example writes stays out of the tree
    exec(compile(code, where, "exec"), {})
