"""bench/sim_vs_real.py on small sweep files written here, against numbers worked out by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import sim_vs_real


def run(hist: list[int], accuracies: list[float], rate: float = 1000.0) -> dict:
    return {"staleness_hist": hist, "curve": [[i + 1.0, a] for i, a in enumerate(accuracies)],
            "samples_per_s": rate}


def sweep(path: Path, runs: dict[str, list[dict]], threads: int = 8) -> Path:
    path.write_text(json.dumps({"options": {}, "runs": {a: {str(threads): rs}
                                                        for a, rs in runs.items()}}))
    return path


def test_staleness_and_accuracy_agreement_in_numbers(tmp_path):
    real = sweep(tmp_path / "real.json", {
        "hogwild": [run([2, 2, 0, 0], [0.30, 0.40, 0.50]), run([0, 4, 0, 0], [0.34, 0.44])],
        "async": [run([1], [0.2])]})  # not simulated: left out
    sim = sweep(tmp_path / "sim.json", {
        "hogwild": [run([0, 0, 4, 4], [0.32, 0.50, 0.6], rate=2000.0)]})
    doc = sim_vs_real.main(["--real", str(real), "--sim", str(sim), "--threads", "8",
                            "--out-dir", str(tmp_path), "--name", "cmp"])
    c = doc["comparison"]
    assert list(c) == ["hogwild"]
    s = c["hogwild"]["staleness"]
    # real pooled counts [2, 6, 0, 0]: mean 0.75; simulated [0, 0, 4, 4]: mean 2.5
    assert s["real"] == {"mean": 0.75, "p50": 1, "p90": 1, "p99": 1, "max": 1}
    assert s["simulated"] == {"mean": 2.5, "p50": 2, "p90": 3, "p99": 3, "max": 3}
    assert s["total_variation"] == pytest.approx(1.0)  # disjoint supports
    acc = c["hogwild"]["accuracy_per_epoch"]
    # real: 2 epochs both seeds reached, means 0.32 and 0.42; simulated 0.32, 0.50
    assert acc["epochs"] == 2
    assert acc["real"] == pytest.approx([0.32, 0.42])
    assert acc["max_abs_diff"] == pytest.approx(0.08)
    assert acc["mean_abs_diff"] == pytest.approx(0.04)
    assert c["hogwild"]["samples_per_s"] == {"real": 1000.0, "simulated": 2000.0}
    assert (tmp_path / "cmp.md").read_text().count("| hogwild |") == 1
    assert json.loads((tmp_path / "cmp.json").read_text())["threads"] == 8


def test_identical_distributions_are_at_distance_zero():
    assert sim_vs_real.total_variation(sim_vs_real.pooled_hist([run([1, 3], [])]),
                                       sim_vs_real.pooled_hist([run([2, 6, 0], [])])) == 0.0


def test_a_file_that_is_not_a_sweep_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit) as e:
        sim_vs_real.main(["--real", str(bad), "--sim", str(bad)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "is not a bench/scaling.py sweep (not a JSON object)" in err and err.count("\n") == 1
