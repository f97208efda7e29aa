"""iasgd.plot.readers: results files of real and simulated runs and runs
picked from sweeps become Runs; bad or foreign files are one line on stderr
and exit code 2, with no figure written."""

from __future__ import annotations

import sys

import pytest
from documents import PNG_MAGIC, REPO, results, sweep, sweep_of, write

from iasgd import run, sweeps
from iasgd.algorithms import VARIANTS
from iasgd.plot import cli, grouping, readers


def test_real_and_simulated_runs_of_iasgd_run(tmp_path, capsys):
    """The documents python -m iasgd.run writes are what plot reads."""
    real, simulated = tmp_path / "real.json", tmp_path / "sim.json"
    common = ["--dataset", "synthetic", "--epochs", "1", "--lr", "0.02", "--quiet"]
    assert run.main([*common, "--algo", "interval", "--threads", "2", "--interval", "4",
                     "--no-checkpoint", "--out", str(real)]) == 0
    assert run.main([*common, "--simulate", "--algo", "hogwild", "--threads", "8",
                     "--out", str(simulated)]) == 0
    runs = readers.load(str(real)) + readers.load(str(simulated))
    grouping.label_runs(runs)
    assert [r.label for r in runs] == ["interval y=4, 2 threads", "SIMULATED hogwild, 8 threads"]
    assert runs[0].bound == 3 and runs[1].bound is None and runs[0].y_trace
    out = tmp_path / "fig.svg"
    assert cli.main([str(real), str(simulated), "--out", str(out)]) == 0
    assert "SIMULATED" in out.read_text()  # in the legend and the title
    assert capsys.readouterr().out == f"{out}\n"


def test_sweep_runs_are_picked_by_algorithm_threads_and_seed(tmp_path, capsys):
    path = write(tmp_path / "sweep.json", sweep())
    both = readers.load(f"{path}:interval-decay:8")
    assert len(both) == 2 and [r.config["seed"] for r in both] == [0, 1]
    assert both[0].bound == 15 and both[0].time_s == [1.0, 2.0, 3.0]
    assert both[0].epochs == [] and both[0].loss == []  # a sweep records no epochs
    (one,) = readers.load(f"{path}:hogwild:2:1")
    assert one.bound is None and one.config["seed"] == 1 and one.hist == [4, 3, 2, 1]
    grouping.label_runs([*both, one])
    assert [r.label for r in both] == ["interval decay y0=16, 8 threads (seed=0)",
                                       "interval decay y0=16, 8 threads (seed=1)"]
    assert cli.main([f"{path}:interval-decay:8:0", f"{path}:hogwild:8:0"]) == 0
    assert (tmp_path / "sweep.png").read_bytes()[:8] == PNG_MAGIC


def test_the_shipped_sweeps_can_be_plotted(tmp_path):
    """Runs of bench/results/*.json; the sweep names plot reads are bench/scaling.py's."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import scaling
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert scaling.ALGOS is sweeps.ALGOS is VARIANTS  # the names sweep_variant reads
    real = REPO / "bench/results/cifar10-1-2-4-8-16.json"
    simulated = REPO / "bench/results/simulated-cifar10-16-128.json"
    out = tmp_path / "f.png"
    assert cli.main([f"{real}:interval:16:0", f"{simulated}:async:128",
                      "--out", str(out)]) == 0
    runs = readers.load(f"{real}:interval:16:0") + readers.load(f"{simulated}:async:128")
    assert [r.simulated for r in runs] == [False, True]


def test_a_sweep_with_several_lrs_groups_by_lr_and_picks_by_seed(tmp_path):
    doc = sweep_of({("hogwild", "8"): [[[1.0, 0.5]]] * 4})
    for i, saved in enumerate(doc["runs"]["hogwild"]["8"]):
        saved.update(lr=[0.005, 0.01][i // 2], seed=i % 2)  # as --lrs 0.005,0.01 --seeds 2
    path = write(tmp_path / "lrs.json", doc)
    groups = grouping.group_runs(readers.load(f"{path}:hogwild:8"))
    assert [(g.label, [r.config["seed"] for r in g.runs]) for g in groups] == [
        ("hogwild, 8 threads (lr=0.005) (2 seeds)", [0, 1]),
        ("hogwild, 8 threads (lr=0.01) (2 seeds)", [0, 1])]
    assert [r.config["lr"] for r in readers.load(f"{path}:hogwild:8:1")] == [0.005, 0.01]


def test_picks_take_comma_separated_lists(tmp_path):
    path = write(tmp_path / "s.json", sweep())
    runs = readers.load(f"{path}:hogwild,interval-decay:8,2:1")
    assert [(r.config["algo"], r.config["threads"], r.config["seed"]) for r in runs] == [
        ("hogwild", 8, 1), ("hogwild", 2, 1), ("interval", 8, 1), ("interval", 2, 1)]


@pytest.mark.parametrize(("name", "content", "needle"), [
    ("nojson.json", "{not json", "is not JSON"),
    ("list.json", "[1, 2, 3]", "is not an iasgd results file"),
    ("other.json", '{"name": "something else"}', "is not an iasgd results file"),
    ("empty.json", "", "is not JSON"),
    ("binary.json", b"\xff\xfe\x00garbage", "cannot read it"),
])
def test_bad_or_foreign_json_is_one_line(tmp_path, capsys, name, content, needle):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert cli.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith("iasgd: error: ")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no figure


def damaged(doc: dict) -> dict:
    del doc["epochs"][1]["wall_s"]
    return doc


@pytest.mark.parametrize(("make", "needle"), [
    (lambda: damaged(results()), "damaged (KeyError"),
    (lambda: {**results(), "epochs": "three"}, "damaged"),
    (lambda: {**results(), "staleness": {"hist": "x", "bound": None}}, "damaged"),
])
def test_damaged_results_are_one_line(tmp_path, capsys, make, needle):
    path = write(tmp_path / "r.json", make())
    assert cli.main([path]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


@pytest.mark.parametrize(("change", "needle"), [
    (lambda doc: doc["runs"]["hogwild"]["8"][0].pop("staleness_hist"),
     "is not a bench/scaling.py sweep (runs[hogwild][8][0] has no staleness_hist)"),
    (lambda doc: doc["runs"].update(hogwild=[]),
     "is not a bench/scaling.py sweep (runs[hogwild] is not an object of thread counts)"),
    (lambda doc: doc.update(version=sweeps.VERSION + 1), "newer than this iasgd reads"),
])
def test_a_damaged_sweep_is_one_line(tmp_path, capsys, change, needle):
    doc = sweep()
    doc["runs"]["hogwild"]["8"] = [dict(r) for r in doc["runs"]["hogwild"]["8"]]
    change(doc)
    path = write(tmp_path / "s.json", doc)
    assert cli.main([f"{path}:interval-decay:2"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith(f"iasgd: error: {path} ") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]
