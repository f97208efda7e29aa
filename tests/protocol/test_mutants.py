"""The mutation check (tests/protocol/mutants.py) as part of the suite: every bug it
plants in the gate, the worker loop or the atomics must be caught."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_planted_bug_is_caught():
    script = ROOT / "tests" / "protocol" / "mutants.py"
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT,
                         capture_output=True, text=True, timeout=1200)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SURVIVED" not in out.stdout
