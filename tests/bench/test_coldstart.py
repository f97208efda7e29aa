"""Smoke test of bench/coldstart.py: a fresh process reaches its first step
and reports each phase (with iasgd's usual, warm cache: a cold one takes
minutes and is the benchmark's job)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import coldstart


def test_a_fresh_process_reports_its_phases_in_order():
    args = argparse.Namespace(dataset="synthetic", model="mlp", algo="hogwild", threads=2)
    marks = coldstart.time_to_first_step(args, cache_dir=None)
    phases = [marks[p] for p in ("python", "imports", "data", "kernels", "first_step")]
    assert phases[0] > 0 and phases == sorted(phases)
