"""python -m iasgd.plot: results of real, simulated and sweep runs overlay in
one figure with labels from their configurations; bad input is one line on
stderr and exit code 2, with no figure written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from iasgd import plot, run

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def results(algo: str = "interval", threads: int = 4, **config) -> dict:
    """A small results document as python -m iasgd.run writes it."""
    y = config.get("interval", 8)
    bounded = {"interval": y - 1, "sequential": 0, "sync": 0}
    return {
        "config": {"algo": algo, "threads": threads, "interval": y, "gate": "wait",
                   "interval_schedule": "fixed", "y0": None, "threads_schedule": "fixed",
                   "lr_schedule": "none", "dataset": "synthetic", "model": "lenet", "seed": 0,
                   "lr": 0.02, **config},
        "status": "completed",
        "epochs": [{"epoch": e, "train_loss": 1.0 / e, "test_accuracy": 0.5 + 0.1 * e,
                    "wall_s": 1.5 * e, "samples_per_s": 1000.0, "complete": True,
                    "staleness_hist": [5, 3]} for e in (1, 2, 3)],
        "staleness": {"hist": [10, 5, 2, 1] if algo != "sequential" else [30],
                      "mean": 0.6, "max": 3, "bound": bounded.get(algo)},
        "interval_trace": [[0.0, 0, y], [2.0, 100, y - 4]] if algo == "interval" else [],
        "threads_trace": [[0.0, 0, threads], [3.0, 200, 2]]
        if config.get("threads_schedule") == "window" else [],
    }


def sweep() -> dict:
    """A small bench/scaling.py sweep: two algorithms, two thread counts, two seeds."""
    one = {"samples_per_s": 1e4, "staleness_mean": 1.0, "staleness_max": 3,
           "staleness_hist": [4, 3, 2, 1], "acceptance_rate": 1.0, "time_to_target_s": 2.0,
           "final_accuracy": 0.6, "curve": [[1.0, 0.4], [2.0, 0.5], [3.0, 0.6]]}
    return {"options": {"dataset": "cifar10", "interval": 16, "y0": None, "gate": "wait",
                        "batch_size": 16, "lr": 0.005, "momentum": 0.5, "time_budget": 3.0},
            "simulated": False, "summary": {},
            "runs": {algo: {n: [one, one] for n in ("2", "8")}
                     for algo in ("interval-decay", "hogwild")}}


def write(path: Path, doc: object) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def test_two_runs_overlay_beside_the_first_file(tmp_path, capsys):
    a = write(tmp_path / "a.json", results("interval", 8, interval=16))
    b = write(tmp_path / "b.json", results("hogwild", 8))
    assert plot.main([a, b]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'a.png'}\n"  # the path, and only it
    assert (tmp_path / "a.png").read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.png", "b.json"]


def test_the_figure_marks_bounds_traces_and_labels():
    runs = [plot.results_run(results("interval", 8, interval=16), "a.json"),
            plot.results_run(results("hogwild", 8, threads_schedule="window"), "b.json")]
    plot.label_runs(runs)
    fig = plot.figure(runs)
    acc_t, loss_t, hist_ax, acc_e, loss_e, trace_ax = fig.axes
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "interval y=16, 8 threads", "hogwild, 8 threads, m window"]
    assert hist_ax.get_yscale() == "log"
    bounds = [line.get_xdata()[0] for line in hist_ax.lines if line.get_linestyle() == "--"]
    assert bounds == [15]  # interval's y - 1; hogwild is unbounded: no line
    assert len(trace_ax.lines) == 2  # y of the interval run, m of the elastic one
    y_line = trace_ax.lines[0]
    assert list(y_line.get_ydata()) == [16, 12, 12] and y_line.get_xdata()[-1] == 4.5
    assert list(acc_e.lines[0].get_ydata()) == pytest.approx([60, 70, 80])
    assert len(loss_t.lines) == len(loss_e.lines) == 2
    assert acc_t.get_xlabel() == "training time (s)"


@pytest.mark.parametrize(("algo", "threads", "config", "label"), [
    ("sequential", 1, {}, "sequential"),
    ("hogwild", 16, {}, "hogwild, 16 threads"),
    ("interval", 8, {"interval": 16}, "interval y=16, 8 threads"),
    ("interval", 8, {"interval": 16, "gate": "drop"}, "interval y=16 drop, 8 threads"),
    ("interval", 8, {"interval_schedule": "decay", "y0": 32}, "interval decay y0=32, 8 threads"),
    ("interval", 8, {"interval_schedule": "probe", "interval": 16},
     "interval probe y0=16, 8 threads"),
    ("hogwild", 4, {"lr_schedule": "tail"}, "hogwild, 4 threads, lr tail"),
    ("sync", 2, {}, "sync, 2 threads"),
])
def test_labels_come_from_the_configuration(algo, threads, config, label):
    doc = results(algo, threads, **config)
    assert plot.describe(doc["config"], simulated=False) == label
    assert plot.describe(doc["config"], simulated=True) == f"SIMULATED {label}"


def test_same_labels_are_told_apart_by_what_differs():
    runs = [plot.results_run(results("hogwild", 2, seed=s), f"r{s}.json") for s in (0, 1)]
    runs.append(plot.results_run(results("hogwild", 2, seed=1), "copy.json"))
    plot.label_runs(runs)
    assert [r.label for r in runs] == ["hogwild, 2 threads (seed=0)",
                                       "hogwild, 2 threads (seed=1)",
                                       "hogwild, 2 threads (seed=1)"]
    same = [plot.results_run(results("hogwild", 2), name) for name in ("x.json", "y.json")]
    plot.label_runs(same)
    assert [r.label for r in same] == ["hogwild, 2 threads (x.json)",
                                       "hogwild, 2 threads (y.json)"]


def test_real_and_simulated_runs_of_iasgd_run(tmp_path, capsys):
    """The documents python -m iasgd.run writes are what plot reads."""
    real, simulated = tmp_path / "real.json", tmp_path / "sim.json"
    common = ["--dataset", "synthetic", "--epochs", "1", "--lr", "0.02", "--quiet",
              "--no-checkpoint"]
    assert run.main([*common, "--algo", "interval", "--threads", "2", "--interval", "4",
                     "--out", str(real)]) == 0
    assert run.main([*common, "--simulate", "--algo", "hogwild", "--threads", "8",
                     "--out", str(simulated)]) == 0
    runs = plot.load(str(real)) + plot.load(str(simulated))
    plot.label_runs(runs)
    assert [r.label for r in runs] == ["interval y=4, 2 threads", "SIMULATED hogwild, 8 threads"]
    assert runs[0].bound == 3 and runs[1].bound is None and runs[0].y_trace
    out = tmp_path / "fig.svg"
    assert plot.main([str(real), str(simulated), "--out", str(out)]) == 0
    assert "SIMULATED" in out.read_text()  # in the legend and the title
    assert capsys.readouterr().out == f"{out}\n"


def test_sweep_runs_are_picked_by_algorithm_threads_and_seed(tmp_path, capsys):
    path = write(tmp_path / "sweep.json", sweep())
    both = plot.load(f"{path}:interval-decay:8")
    assert len(both) == 2 and [r.config["seed"] for r in both] == [0, 1]
    assert both[0].bound == 15 and both[0].time_s == [1.0, 2.0, 3.0]
    (one,) = plot.load(f"{path}:hogwild:2:1")
    assert one.bound is None and one.config["seed"] == 1 and one.hist == [4, 3, 2, 1]
    plot.label_runs([*both, one])
    assert [r.label for r in both] == ["interval decay y0=16, 8 threads (seed=0)",
                                       "interval decay y0=16, 8 threads (seed=1)"]
    assert plot.main([f"{path}:interval-decay:8:0", f"{path}:hogwild:8:0"]) == 0
    assert (tmp_path / "sweep.png").read_bytes()[:8] == PNG_MAGIC


def test_the_shipped_sweeps_can_be_plotted(tmp_path):
    """Runs of bench/results/*.json; SWEEP_ALGOS matches bench/scaling.py's ALGOS."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import scaling
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert plot.SWEEP_ALGOS == scaling.ALGOS
    real = REPO / "bench/results/cifar10-1-2-4-8-16.json"
    simulated = REPO / "bench/results/simulated-cifar10-16-128.json"
    out = tmp_path / "f.png"
    assert plot.main([f"{real}:interval:16:0", f"{simulated}:async:128",
                      "--out", str(out)]) == 0
    runs = plot.load(f"{real}:interval:16:0") + plot.load(f"{simulated}:async:128")
    assert [r.simulated for r in runs] == [False, True]


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
    assert plot.main([str(path)]) == 2
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
    assert plot.main([path]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_bad_arguments_are_one_line(tmp_path, capsys):
    good = write(tmp_path / "r.json", results())
    sweep_path = write(tmp_path / "s.json", sweep())
    for args, needle in (
        ([], "required"),
        ([str(tmp_path / "none.json")], "no such file"),
        ([good, "--out", str(tmp_path / "f.xyz")], "unknown figure format .xyz"),
        ([good, "--out", str(tmp_path / "no" / "f.png")], "does not exist"),
        ([good, "--out", str(tmp_path)], "unknown figure format"),
        ([sweep_path], "pick runs as"),
        ([f"{sweep_path}:hogwild:16"], "no runs hogwild:16"),
        ([f"{sweep_path}:hogwild:2:7"], "has seeds 0-1"),
        ([f"{good}:hogwild:2"], "not a bench/scaling.py sweep"),
    ):
        assert plot.main(args) == 2, args
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, (args, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "s.json"]


def test_without_matplotlib_it_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    assert plot.main([write(tmp_path / "r.json", results())]) == 2
    err = capsys.readouterr().err
    assert err == "iasgd: error: plotting needs matplotlib: pip install 'iasgd[plot]'\n"


def test_an_unwritable_directory_is_one_line(tmp_path, capsys, monkeypatch):
    path = write(tmp_path / "r.json", results())

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr("tempfile.mkstemp", refuse)
    assert plot.main([path]) == 2
    err = capsys.readouterr().err
    assert "cannot write the figure" in err and err.count("\n") == 1
