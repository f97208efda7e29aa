"""Smoke test of bench/coldstart.py: a fresh process reaches its first step
and reports each phase (with iasgd's usual, warm cache: a cold one takes
minutes and is the benchmark's job)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import baseline
import coldstart


def test_a_fresh_process_reports_its_phases_in_order():
    args = argparse.Namespace(dataset="synthetic", model="mlp", algo="hogwild", threads=2)
    marks = coldstart.time_to_first_step(args, cache_dir=None)
    phases = [marks[p] for p in ("python", "imports", "data", "kernels", "first_step")]
    assert phases[0] > 0 and phases == sorted(phases)


def test_a_baseline_is_the_commits_files_and_a_bad_ref_is_one_line(capsys):
    tree = baseline.baseline_tree("HEAD")
    committed = subprocess.run(["git", "show", "HEAD:iasgd/__init__.py"], cwd=baseline.REPO,
                               capture_output=True, text=True, check=True).stdout
    assert (tree / "iasgd" / "__init__.py").read_text() == committed
    assert baseline.baseline_tree("HEAD") == tree  # extracted once
    with pytest.raises(SystemExit) as stop:
        baseline.baseline_tree("no-such-ref")
    assert stop.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
