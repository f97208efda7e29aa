"""Smoke test of bench/scaling.py --quick: it runs, and its files appear and parse."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import scaling


def test_quick_sweep_writes_table_json_and_plots(tmp_path, capsys):
    doc = scaling.main(["--quick", "--threads", "1,2", "--algos", "sequential,interval,elastic",
                        "--seeds", "1", "--name", "smoke", "--out-dir", str(tmp_path)])
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["smoke-accuracy.png", "smoke-staleness.png", "smoke-throughput.png",
                     "smoke-time-to-target.png", "smoke.json", "smoke.md"]
    for png in tmp_path.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "smoke.json").read_text()) == doc
    assert set(doc["summary"]) == {"sequential", "interval", "elastic"}
    assert set(doc["summary"]["interval"]) == {"1", "2"}
    assert set(doc["summary"]["sequential"]) == {"1"}  # sequential runs one thread only
    row = doc["summary"]["interval"]["2"]
    assert row["samples_per_s"][0] > 0 and 0 <= row["acceptance_rate"] <= 1
    table = (tmp_path / "smoke.md").read_text()
    assert table.count("\n") == 2 + 5  # header, rule, five (algorithm, n) rows
    assert "| interval | 2 |" in table and table in capsys.readouterr().out


def test_quick_simulated_sweep_says_so(tmp_path):
    doc = scaling.main(["--quick", "--simulate", "--threads", "4,32", "--algos",
                        "hogwild,interval,sync", "--seeds", "1", "--name", "sim",
                        "--out-dir", str(tmp_path)])
    assert doc["simulated"] is True
    assert set(doc["summary"]) == {"hogwild", "interval"}  # sync is not simulated
    assert (tmp_path / "sim.md").read_text().startswith("SIMULATED")
    hogwild = doc["summary"]["hogwild"]
    assert hogwild["32"]["staleness_mean"] > hogwild["4"]["staleness_mean"]
