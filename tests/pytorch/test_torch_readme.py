"""The README's PyTorch example runs as it is shown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Your PyTorch model under the gate", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_readme_example_runs(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("interval: 400 updates by 4 workers"), out.stdout
    assert "0 violations" in out.stdout and "(bound <= 15)" in out.stdout
