"""iasgd.plot.grouping: labels from configurations, seeds grouped into one
line, and what is computed over a group (mean and band, pooled staleness,
time to target)."""

from __future__ import annotations

import math

import pytest
from documents import panels, results, sweep_of, write

from iasgd.plot import figures, grouping, readers


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
    assert grouping.describe(doc["config"], simulated=False) == label
    assert grouping.describe(doc["config"], simulated=True) == f"SIMULATED {label}"


def test_same_labels_are_told_apart_by_what_differs():
    runs = [readers.results_run(results("hogwild", 2, seed=s), f"r{s}.json") for s in (0, 1)]
    runs.append(readers.results_run(results("hogwild", 2, seed=1), "copy.json"))
    grouping.label_runs(runs)
    assert [r.label for r in runs] == ["hogwild, 2 threads (seed=0)",
                                       "hogwild, 2 threads (seed=1)",
                                       "hogwild, 2 threads (seed=1)"]
    same = [readers.results_run(results("hogwild", 2), name) for name in ("x.json", "y.json")]
    grouping.label_runs(same)
    assert [r.label for r in same] == ["hogwild, 2 threads (x.json)",
                                       "hogwild, 2 threads (y.json)"]


def test_seeds_are_one_group_with_a_mean_line_and_a_min_max_band(tmp_path):
    path = write(tmp_path / "s.json", sweep_of({("hogwild", "8"): [
        [[1.0, 0.4], [3.0, 0.6]],
        [[2.0, 0.3], [4.0, 0.7]],
    ]}))
    runs = readers.load(f"{path}:hogwild:8")
    (group,) = grouping.group_runs(runs)
    assert group.label == "hogwild, 8 threads (2 seeds)" and len(group.runs) == 2
    # where both have data, 2-3 s: seed 0 is 0.5, 0.6 and seed 1 is 0.3, 0.5 there
    grid, mean, lo, hi = grouping.aggregate([(r.time_s, r.accuracy) for r in runs])
    assert list(grid) == [2.0, 3.0]
    assert list(mean) == pytest.approx([0.4, 0.55])
    assert list(lo) == pytest.approx([0.3, 0.5]) and list(hi) == pytest.approx([0.5, 0.6])
    fig = figures.figure(runs)
    acc = panels(fig)["accuracy-time"]
    (line,) = acc.lines  # one mean line, not one per seed
    assert list(line.get_ydata()) == pytest.approx([40, 55])
    assert len(acc.collections) == 1  # the band
    assert "shaded: min-max" in acc.get_title()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["hogwild, 8 threads (2 seeds)"]


def test_results_files_of_one_configuration_group_by_seed_not_by_copy():
    seeds = [readers.results_run(results("hogwild", 2, seed=s), f"r{s}.json") for s in (0, 1, 2)]
    (group,) = grouping.group_runs(seeds)
    assert group.label == "hogwild, 2 threads (3 seeds)"
    copies = [readers.results_run(results("hogwild", 2), n) for n in ("x.json", "y.json")]
    assert [g.label for g in grouping.group_runs(copies)] == ["hogwild, 2 threads (x.json)",
                                                          "hogwild, 2 threads (y.json)"]
    lrs = [readers.results_run(results("hogwild", 2, lr=lr, seed=s), f"{lr}-{s}.json")
           for lr in (0.01, 0.02) for s in (0, 1)]
    assert [g.label for g in grouping.group_runs(lrs)] == [
        "hogwild, 2 threads (lr=0.01) (2 seeds)", "hogwild, 2 threads (lr=0.02) (2 seeds)"]


def test_survival_curve_of_a_hand_made_histogram():
    # 10 updates: 5 with tau 0, 3 with tau 1, 2 with tau 3
    assert grouping.survival([5, 3, 0, 2, 0, 0]) == pytest.approx([1.0, 0.5, 0.2, 0.2])
    assert grouping.survival([7]) == [1.0]  # sequential: every update fresh
    assert grouping.survival([0, 0]) == []  # no updates
    runs = [readers.results_run(results("hogwild", 2, seed=s), f"r{s}.json") for s in (0, 1)]
    runs[1].hist = [0, 0, 0, 0, 2]
    assert grouping.pooled_histogram(runs) == [10, 5, 2, 1, 2]
    staleness = panels(figures.figure(runs))["staleness"]
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
    assert grouping.time_to_target([1.0, 3.0], [0.4, 0.6], 0.5) == pytest.approx(2.0)
    assert grouping.time_to_target([1.0, 2.0], [math.nan, 0.6], 0.5) == 2.0  # after a NaN
    assert grouping.time_to_target([1.0], [0.4], 0.5) is None
    two, eight = grouping.group_runs(readers.load(f"{path}:hogwild:2,8"))
    assert grouping.group_time_to_target(two, 0.5) == grouping.Reach(1.75, 1.5, 2.0, 2, 2)
    assert grouping.group_time_to_target(eight, 0.5) == grouping.Reach(None, None, None, 1, 2)
    runs = readers.load(f"{path}:hogwild:2,8")
    assert grouping.default_target(runs) == 45  # the 8-thread seed 1 peaks at 45 %
    ax = panels(figures.figure(runs, targets=[50]))["time-to-target"]
    assert ax.get_xscale() == "log"  # 2 to 8 threads: a log2 axis
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "8"]
    mean_line = ax.lines[0]
    assert list(mean_line.get_ydata()[:1]) == pytest.approx([1.75])
    assert math.isnan(mean_line.get_ydata()[1])  # not reached by every seed: no point
    assert "Time to 50 %" in ax.get_title() and "not reached by every seed" in ax.get_title()
    assert [t.get_text() for t in ax.texts] == ["1/2"]
    auto = panels(figures.figure(runs))["time-to-target"]
    assert "Time to 45 %" in auto.get_title() and "highest all runs reach" in auto.get_title()
