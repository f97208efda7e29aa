"""python -m iasgd.plot: results of real, simulated and sweep runs overlay in
one figure with labels from their configurations; bad input is one line on
stderr and exit code 2, with no figure written."""

from __future__ import annotations

import json
import math
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


def panels(fig) -> dict:
    """The Axes of a figure by panel name (plot.PANELS)."""
    return {ax.get_label(): ax for ax in fig.axes}


def test_the_figure_marks_bounds_traces_and_labels():
    runs = [plot.results_run(results("interval", 8, interval=16), "a.json"),
            plot.results_run(results("hogwild", 8, threads_schedule="window"), "b.json")]
    plot.label_runs(runs)
    fig = plot.figure(runs)
    axes = panels(fig)
    assert list(axes) == ["accuracy-time", "loss-time", "accuracy-epoch", "loss-epoch",
                          "time-to-target", "staleness", "schedules"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "interval y=16, 8 threads", "hogwild, 8 threads, m window"]
    hist_ax, trace_ax = axes["staleness"], axes["schedules"]
    assert hist_ax.get_yscale() == "log" and hist_ax.get_xscale() == "symlog"
    bounds = [line.get_xdata()[0] for line in hist_ax.lines if line.get_linestyle() == "--"]
    assert bounds == [15]  # interval's y - 1; hogwild is unbounded: no line
    assert len(trace_ax.lines) == 2  # y of the interval run, m of the elastic one
    y_line = trace_ax.lines[0]
    assert list(y_line.get_ydata()) == [16, 12, 12] and y_line.get_xdata()[-1] == 4.5
    assert list(axes["accuracy-epoch"].lines[0].get_ydata()) == pytest.approx([60, 70, 80])
    assert len(axes["loss-time"].lines) == len(axes["loss-epoch"].lines) == 2
    assert axes["accuracy-time"].get_xlabel() == "training time (s)"
    assert "seeds" not in axes["accuracy-time"].get_title()  # one run each: no band


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
    common = ["--dataset", "synthetic", "--epochs", "1", "--lr", "0.02", "--quiet"]
    assert run.main([*common, "--algo", "interval", "--threads", "2", "--interval", "4",
                     "--no-checkpoint", "--out", str(real)]) == 0
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
    assert both[0].epochs == [] and both[0].loss == []  # a sweep records no epochs
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


# seeds, time to target, staleness survival, panels, --target


def sweep_of(curves: dict[tuple[str, str], list[list[list[float]]]],
             hists: dict[tuple[str, str], list[list[int]]] | None = None,
             **options) -> dict:
    """A hand-made sweep: curves[(ALGO, THREADS)] = one [[t_s, acc], ...] per seed."""
    runs: dict = {}
    for (algo, n), per_seed in curves.items():
        hist = (hists or {}).get((algo, n)) or [[1, 1]] * len(per_seed)
        runs.setdefault(algo, {})[n] = [
            {"staleness_hist": hist[seed], "curve": curve} for seed, curve in enumerate(per_seed)]
    return {"options": {"dataset": "cifar10", "interval": 16, "y0": None, "gate": "wait",
                        "batch_size": 16, "lr": 0.005, "momentum": 0.5, "time_budget": 4.0,
                        **options},
            "simulated": False, "summary": {}, "runs": runs}


def test_seeds_are_one_group_with_a_mean_line_and_a_min_max_band(tmp_path):
    path = write(tmp_path / "s.json", sweep_of({("hogwild", "8"): [
        [[1.0, 0.4], [3.0, 0.6]],
        [[2.0, 0.3], [4.0, 0.7]],
    ]}))
    runs = plot.load(f"{path}:hogwild:8")
    (group,) = plot.group_runs(runs)
    assert group.label == "hogwild, 8 threads (2 seeds)" and len(group.runs) == 2
    # where both have data, 2-3 s: seed 0 is 0.5, 0.6 and seed 1 is 0.3, 0.5 there
    grid, mean, lo, hi = plot.aggregate([(r.time_s, r.accuracy) for r in runs])
    assert list(grid) == [2.0, 3.0]
    assert list(mean) == pytest.approx([0.4, 0.55])
    assert list(lo) == pytest.approx([0.3, 0.5]) and list(hi) == pytest.approx([0.5, 0.6])
    fig = plot.figure(runs)
    acc = panels(fig)["accuracy-time"]
    (line,) = acc.lines  # one mean line, not one per seed
    assert list(line.get_ydata()) == pytest.approx([40, 55])
    assert len(acc.collections) == 1  # the band
    assert "shaded: min-max" in acc.get_title()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["hogwild, 8 threads (2 seeds)"]


def test_results_files_of_one_configuration_group_by_seed_not_by_copy():
    seeds = [plot.results_run(results("hogwild", 2, seed=s), f"r{s}.json") for s in (0, 1, 2)]
    (group,) = plot.group_runs(seeds)
    assert group.label == "hogwild, 2 threads (3 seeds)"
    copies = [plot.results_run(results("hogwild", 2), n) for n in ("x.json", "y.json")]
    assert [g.label for g in plot.group_runs(copies)] == ["hogwild, 2 threads (x.json)",
                                                          "hogwild, 2 threads (y.json)"]
    lrs = [plot.results_run(results("hogwild", 2, lr=lr, seed=s), f"{lr}-{s}.json")
           for lr in (0.01, 0.02) for s in (0, 1)]
    assert [g.label for g in plot.group_runs(lrs)] == [
        "hogwild, 2 threads (lr=0.01) (2 seeds)", "hogwild, 2 threads (lr=0.02) (2 seeds)"]


def test_a_sweep_with_several_lrs_groups_by_lr_and_picks_by_seed(tmp_path):
    doc = sweep_of({("hogwild", "8"): [[[1.0, 0.5]]] * 4})
    for i, saved in enumerate(doc["runs"]["hogwild"]["8"]):
        saved.update(lr=[0.005, 0.01][i // 2], seed=i % 2)  # as --lrs 0.005,0.01 --seeds 2
    path = write(tmp_path / "lrs.json", doc)
    groups = plot.group_runs(plot.load(f"{path}:hogwild:8"))
    assert [(g.label, [r.config["seed"] for r in g.runs]) for g in groups] == [
        ("hogwild, 8 threads (lr=0.005) (2 seeds)", [0, 1]),
        ("hogwild, 8 threads (lr=0.01) (2 seeds)", [0, 1])]
    assert [r.config["lr"] for r in plot.load(f"{path}:hogwild:8:1")] == [0.005, 0.01]


def test_picks_take_comma_separated_lists(tmp_path):
    path = write(tmp_path / "s.json", sweep())
    runs = plot.load(f"{path}:hogwild,interval-decay:8,2:1")
    assert [(r.config["algo"], r.config["threads"], r.config["seed"]) for r in runs] == [
        ("hogwild", 8, 1), ("hogwild", 2, 1), ("interval", 8, 1), ("interval", 2, 1)]


def test_survival_curve_of_a_hand_made_histogram():
    # 10 updates: 5 with tau 0, 3 with tau 1, 2 with tau 3
    assert plot.survival([5, 3, 0, 2, 0, 0]) == pytest.approx([1.0, 0.5, 0.2, 0.2])
    assert plot.survival([7]) == [1.0]  # sequential: every update fresh
    assert plot.survival([0, 0]) == []  # no updates
    runs = [plot.results_run(results("hogwild", 2, seed=s), f"r{s}.json") for s in (0, 1)]
    runs[1].hist = [0, 0, 0, 0, 2]
    assert plot.pooled_histogram(runs) == [10, 5, 2, 1, 2]
    staleness = panels(plot.figure(runs))["staleness"]
    curve = staleness.lines[0]  # pooled over the two seeds: 20 updates
    assert list(curve.get_xdata()) == [0, 1, 2, 3, 4]
    assert list(curve.get_ydata()) == pytest.approx([1.0, 0.5, 0.25, 0.15, 0.1])
    assert "pooled over seeds" in staleness.get_title()


def test_time_to_target_per_thread_count_from_hand_made_curves(tmp_path):
    path = write(tmp_path / "s.json", sweep_of({
        ("hogwild", "2"): [[[1.0, 0.4], [3.0, 0.6]],       # 0.5 at 2.0 s
                           [[1.0, 0.3], [2.0, 0.7]]],      # 0.5 at 1.5 s
        ("hogwild", "8"): [[[1.0, 0.5], [2.0, 0.6]],       # 0.5 at once: 1.0 s
                           [[1.0, 0.2], [2.0, 0.45]]],     # never
    }))
    assert plot.time_to_target([1.0, 3.0], [0.4, 0.6], 0.5) == pytest.approx(2.0)
    assert plot.time_to_target([1.0, 2.0], [math.nan, 0.6], 0.5) == 2.0  # after a NaN
    assert plot.time_to_target([1.0], [0.4], 0.5) is None
    two, eight = plot.group_runs(plot.load(f"{path}:hogwild:2,8"))
    assert plot.group_time_to_target(two, 0.5) == plot.Reach(1.75, 1.5, 2.0, 2, 2)
    assert plot.group_time_to_target(eight, 0.5) == plot.Reach(None, None, None, 1, 2)
    runs = plot.load(f"{path}:hogwild:2,8")
    assert plot.default_target(runs) == 45  # the 8-thread seed 1 peaks at 45 %
    ax = panels(plot.figure(runs, targets=[50]))["time-to-target"]
    assert ax.get_xscale() == "log"  # 2 to 8 threads: a log2 axis
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "8"]
    mean_line = ax.lines[0]
    assert list(mean_line.get_ydata()[:1]) == pytest.approx([1.75])
    assert math.isnan(mean_line.get_ydata()[1])  # not reached by every seed: no point
    assert "Time to 50 %" in ax.get_title() and "not reached by every seed" in ax.get_title()
    assert [t.get_text() for t in ax.texts] == ["1/2"]
    auto = panels(plot.figure(runs))["time-to-target"]
    assert "Time to 45 %" in auto.get_title() and "highest all runs reach" in auto.get_title()


def test_panels_without_data_are_left_out(tmp_path):
    path = write(tmp_path / "s.json", sweep())
    fig = plot.figure(plot.load(f"{path}:hogwild:2,8"))
    assert list(panels(fig)) == ["accuracy-time", "time-to-target", "staleness"]
    assert fig.axes[0].get_subplotspec().get_geometry()[:2] == (1, 3)
    fixed = plot.results_run(results("interval", 4), "a.json")
    fixed.y_trace = [(0.0, 8.0)]  # a fixed y is not a schedule
    no_loss = plot.results_run(results("hogwild", 4), "b.json")
    no_loss.loss = [math.nan] * 3
    assert list(panels(plot.figure([fixed]))) == [
        "accuracy-time", "loss-time", "accuracy-epoch", "loss-epoch", "time-to-target",
        "staleness"]
    assert "loss-time" not in panels(plot.figure([no_loss]))
    zero = plot.results_run(results("hogwild", 4), "z.json")
    zero.accuracy = zero.epoch_accuracy = [0.0, 0.0, 0.0]  # no target any run reaches
    assert "time-to-target" not in panels(plot.figure([zero]))
    assert [plot.grid_shape(n) for n in (1, 3, 4, 6, 7)] == [(1, 1), (1, 3), (2, 2), (2, 3),
                                                             (2, 4)]


@pytest.mark.parametrize(("values", "targets"), [
    (None, []),
    (["55"], [55.0]),
    (["50,55", "57.5%", "55"], [50.0, 55.0, 57.5]),
    ([" 60 % , 1"], [60.0, 1.0]),
])
def test_targets_are_percent_repeatable_or_comma_separated(values, targets):
    assert plot.parse_targets(values) == targets


@pytest.mark.parametrize(("args", "needle"), [
    (["--target", "abc"], "--target abc: abc is not a number"),
    (["--target", "55,"], "nothing is not a number"),
    (["--target", "0.55"], "--target 0.55: 0.55 is not a test accuracy in percent from 1 to 100"),
    (["--target", "150"], "from 1 to 100"),
    (["--target", "nan"], "from 1 to 100"),
    (["--target", "50,51,52,53,54"], "at most 4 targets, got 5"),
    (["--target"], "expected one argument"),
])
def test_bad_targets_are_one_line(tmp_path, capsys, args, needle):
    path = write(tmp_path / "r.json", results())
    assert plot.main([path, *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith("iasgd: error: ") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_targets_reach_the_figure(tmp_path):
    path = write(tmp_path / "r.json", results())
    out = tmp_path / "f.svg"
    assert plot.main([path, "--target", "55", "--target", "65", "--out", str(out)]) == 0
    assert "Time to 55 %, 65 % test accuracy" in out.read_text()
