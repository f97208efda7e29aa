"""The mutation check (tests/protocol/mutants.py) as part of the suite: every bug it
plants in the gate, the worker loop or the atomics must be caught. Deselected from
the everyday suite (pyproject's addopts); CI runs it as `python -m pytest -m mutation`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.mutation
@pytest.mark.timeout(3600)
def test_every_planted_bug_is_caught():
    script = ROOT / "tests" / "protocol" / "mutants.py"
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT,
                         capture_output=True, text=True, timeout=3000)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SURVIVED" not in out.stdout
