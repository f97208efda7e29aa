"""Smoke test of bench/scaling.py --quick: it runs, and its files appear and parse."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import scaling

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
# --quick, with 0.3 s of training per run where a test checks the sweep's
# shape, not what its runs learn (--quick alone gives each run 1 s)
SHORT = ["--quick", "--time-budget", "0.3"]


def test_quick_sweep_writes_table_json_and_plots(tmp_path, capsys):
    doc = scaling.main([*SHORT, "--threads", "1,2", "--algos", "sequential,interval,elastic",
                        "--seeds", "1", "--name", "smoke", "--out-dir", str(tmp_path)])
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["smoke-accuracy.png", "smoke-staleness.png", "smoke-throughput.png",
                     "smoke-time-to-target.png", "smoke.json", "smoke.md"]
    for png in tmp_path.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "smoke.json").read_text()) == doc
    assert set(doc["summary"]) == {"0.02"}  # --quick runs lr 0.02 alone
    summary = doc["summary"]["0.02"]
    assert set(summary) == {"sequential", "interval", "elastic"}
    assert set(summary["interval"]) == {"1", "2"}
    assert set(summary["sequential"]) == {"1"}  # sequential runs one thread only
    row = summary["interval"]["2"]
    assert row["samples_per_s"][0] > 0 and 0 <= row["acceptance_rate"] <= 1
    table = (tmp_path / "smoke.md").read_text()
    heading, headline, per_algorithm = table.rstrip("\n").split("\n\n")
    assert heading.startswith("**Headline, lr 0.02**")
    assert headline.count("\n") == 2  # header, rule, one row: 2 threads, the one target
    assert headline.splitlines()[-1].startswith("| 2 | ")
    assert per_algorithm.count("\n") == 1 + 5  # header, rule, five (algorithm, n) rows
    assert "| interval | 2 |" in per_algorithm and table in capsys.readouterr().out


def test_quick_simulated_sweep_says_so(tmp_path):
    doc = scaling.main(["--quick", "--simulate", "--threads", "4,32", "--algos",
                        "sequential,hogwild,interval-decay,sync", "--seeds", "1", "--name", "sim",
                        "--out-dir", str(tmp_path)])
    assert doc["simulated"] is True
    # one thread has nothing to simulate
    assert set(doc["summary"]["0.02"]) == {"hogwild", "interval-decay", "sync"}
    assert (tmp_path / "sim.md").read_text().startswith("SIMULATED")
    hogwild = doc["summary"]["0.02"]["hogwild"]
    assert hogwild["32"]["staleness_mean"] > hogwild["4"]["staleness_mean"]


def test_simulated_sweep_takes_the_step_time_it_is_given(tmp_path):
    """--sim-step-ms: 4 hogwild workers on their own cores, 2 ms steps
    without spread, apply 2,000 updates per simulated second, whatever the
    machine's own speed (a busy machine inflates measured steps)."""
    doc = scaling.main(["--quick", "--simulate", "--threads", "4", "--algos", "hogwild",
                        "--seeds", "1", "--sim-step-ms", "2", "--sim-step-spread", "0",
                        "--name", "fixed-lr0.02", "--out-dir", str(tmp_path)])
    rate = doc["summary"]["0.02"]["hogwild"]["4"]["samples_per_s"][0]
    assert rate == pytest.approx(2000 * doc["options"]["batch_size"], rel=0.02)
    # a name with a dot keeps it: its files are <name>.json and <name>.md
    assert {"fixed-lr0.02.json", "fixed-lr0.02.md"} <= {p.name for p in tmp_path.iterdir()}


def test_a_sweep_runs_every_combination_once_per_seed_before_the_next_seed(tmp_path,
                                                                           monkeypatch):
    """Seed by seed: a drift of the machine's speed then shifts every
    algorithm and thread count alike."""
    calls = []
    real_run_one = scaling.run_one

    def record(*args, **kwargs):
        calls.append(args[2])
        return real_run_one(*args, **kwargs)

    monkeypatch.setattr(scaling, "run_one", record)
    scaling.main([*SHORT, "--threads", "2,4", "--algos", "hogwild,interval", "--seeds", "2",
                  "--name", "order", "--out-dir", str(tmp_path)])
    assert [(c.seed, c.threads, c.algo) for c in calls] == [
        (seed, n, algo) for seed in (0, 1) for n in (2, 4) for algo in ("hogwild", "interval")]


def test_interrupted_sweep_resumes_with_its_finished_runs(tmp_path, monkeypatch):
    options = [*SHORT, "--threads", "1,2", "--algos", "hogwild", "--seeds", "2",
               "--name", "cut", "--out-dir", str(tmp_path)]
    calls = []
    real_run_one = scaling.run_one

    def run_one_then_interrupt(*args, **kwargs):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(args[2])
        return real_run_one(*args, **kwargs)

    monkeypatch.setattr(scaling, "run_one", run_one_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        scaling.main(options)
    saved = json.loads((tmp_path / "cut.partial.json").read_text())
    assert [len(rs) for rs in saved["runs"]["hogwild"].values()] == [2, 1]

    calls.clear()
    doc = scaling.main([*options, "--resume"])
    assert [(c.threads, c.seed) for c in calls] == [(2, 1)]  # only the missing run
    assert not (tmp_path / "cut.partial.json").exists()
    assert doc["runs"]["hogwild"]["1"] == saved["runs"]["hogwild"]["1"]
    assert len(doc["runs"]["hogwild"]["2"]) == 2


def test_resume_refuses_a_sweep_made_with_other_options(tmp_path, capsys):
    (tmp_path / "x.partial.json").write_text(json.dumps(
        {"options": {"seeds": 5}, "runs": {}}))
    with pytest.raises(SystemExit) as stop:
        scaling.main(["--quick", "--name", "x", "--out-dir", str(tmp_path), "--resume"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "other options" in err and "seeds" in err


def test_time_to_target_interpolates_between_epoch_ends():
    curve = [[2.0, 0.30], [4.0, 0.40], [6.0, 0.60], [8.0, 0.55]]
    assert scaling.time_to_target(curve, 0.5) == pytest.approx(5.0)
    assert scaling.time_to_target(curve, 0.6) == pytest.approx(6.0)
    assert scaling.time_to_target(curve, 0.2) == 2.0  # reached at the first evaluation
    assert scaling.time_to_target(curve, 0.7) is None
    assert scaling.time_to_target([[1.0, None], [2.0, 0.9]], 0.5) == 2.0  # no estimate before


def summary_of(times: dict[str, list[float | None]], target: str = "0.5") -> dict:
    """A summarise()-like entry for each algorithm at 8 threads: its
    mean ± std time to `target` (None: some seed did not reach it)."""
    return {algo: {8: {"time_to_target_s": {target: t}, "reached": {target: 2 if t else 1},
                       "seeds": 2}}
            for algo, t in times.items()}


def test_headline_divides_the_fastest_interval_variant_by_the_fastest_baseline():
    args = scaling.argparse.Namespace(targets=[0.5])
    summary = {"0.005": summary_of({"interval": [9.0, 1.0], "interval-decay": [6.0, 0.5],
                                    "hogwild": [12.0, 2.0], "async-tail": [8.0, 1.0],
                                    "async": None, "sequential": [5.0, 0.0]})}
    rows, text = scaling.headline(summary, args)
    # sequential is no baseline; async did not reach 50% in every seed
    assert rows == [{"lr": "0.005", "threads": 8, "target": "0.5",
                     "baseline": ("async-tail", 8.0), "interval": ("interval-decay", 6.0),
                     "ratio": pytest.approx(0.75), "ratio_to_hogwild": pytest.approx(0.5)}]
    assert "| 8 | 50% | 9.0 ± 1.0 | 6.0 ± 0.5 | 12.0 ± 2.0 | 8.0 ± 1.0 | - (1/2) | " \
           "async-tail 8.0 | 0.75 (interval-decay) | 0.50 |" in text
    assert "floor" not in text  # no 2-thread runs, no floor


def test_headline_measures_the_fastest_interval_variant_against_the_2_thread_floor():
    args = scaling.argparse.Namespace(targets=[0.5])
    times = {"interval": {8: [13.0, 1.0], 2: [12.5, 0.5]}, "hogwild": {8: [20.0, 2.0],
                                                                       2: [10.0, 1.0]}}
    summary = {"0.01": {algo: {n: {"time_to_target_s": {"0.5": t}, "reached": {"0.5": 3},
                                   "seeds": 3} for n, t in by_n.items()}
                        for algo, by_n in times.items()}}
    rows, text = scaling.headline(summary, args)
    at_8 = next(r for r in rows if r["threads"] == 8)
    assert at_8["floor"] == ("hogwild", 10.0)  # the fastest 2-thread time of any variant
    assert at_8["ratio_to_floor"] == pytest.approx(1.3)
    assert "| 8 | 50% | 13.0 ± 1.0 | 20.0 ± 2.0 | hogwild 20.0 | 0.65 (interval) | 0.65 |" \
           " hogwild 10.0 | 1.30 |" in text


def test_headline_says_when_no_baseline_reached_the_target():
    summary = {"0.01": summary_of({"interval": [9.0, 1.0], "hogwild": None})}
    rows, text = scaling.headline(summary, scaling.argparse.Namespace(targets=[0.5]))
    assert rows[0]["baseline"] is None and rows[0]["ratio"] is None
    assert "none reached | - | - |" in text


def test_from_results_rescores_a_finished_sweep_for_another_target(tmp_path):
    doc = scaling.main(["--quick", "--threads", "2", "--algos", "hogwild", "--seeds", "1",
                        "--name", "done", "--out-dir", str(tmp_path)])
    curve = doc["runs"]["hogwild"]["2"][0]["curve"]
    target = curve[-1][1]  # surely reached, by the last epoch at the latest
    again = scaling.main(["--from-results", str(tmp_path / "done.json"), "--target-accuracy",
                          str(target), "--out-dir", str(tmp_path / "again")])
    assert again["options"]["threads"] == [2] and again["options"]["targets"] == [target]
    run = again["runs"]["hogwild"]["2"][0]
    assert run["time_to_target_s"] == {
        scaling.key(target): scaling.time_to_target(curve, target)}
    assert scaling.time_to_target(curve, target) is not None
    assert again["machine"] == doc["machine"] and again["sweep_seconds"] == doc["sweep_seconds"]
    assert (tmp_path / "again" / "done-accuracy.png").exists()
    assert f"time to {100 * target:.0f}%" in (tmp_path / "again" / "done.md").read_text()


def test_from_results_refuses_a_file_that_is_not_a_sweep(tmp_path, capsys):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        scaling.main(["--from-results", str(tmp_path / "x.json")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "is not a bench/scaling.py sweep (no options and runs)" in err
    assert err.startswith("scaling.py: --from-results ") and err.count("\n") == 1


def test_quick_sweep_passes_the_model_through(tmp_path):
    doc = scaling.main(["--quick", "--threads", "2", "--algos", "hogwild", "--seeds", "1",
                        "--model", "conv4k3s,relu,pool,dense", "--out-dir", str(tmp_path)])
    assert doc["options"]["model"] == "conv4k3s,relu,pool,dense"
    assert [p.name for p in tmp_path.glob("*.json")] == ["quick-spec-synthetic-2.json"]


def test_a_bad_model_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        scaling.main(["--quick", "--model", "conv4k3s,pool,pool,pool,pool,pool,pool,dense"])
    assert info.value.code == 2
    assert "too small for a 2x2 pool" in capsys.readouterr().err


def test_targets_lrs_and_eval_every_give_a_table_and_plot_each(tmp_path):
    doc = scaling.main([*SHORT, "--threads", "2", "--algos", "sequential,hogwild,interval-y4",
                        "--seeds", "1", "--lrs", "0.01,0.02", "--targets", "0.5,0.9",
                        "--eval-every", "25", "--name", "grid", "--out-dir", str(tmp_path)])
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["grid-accuracy.png", "grid-staleness.png", "grid-throughput.png",
                     "grid-time-to-target-50.png", "grid-time-to-target-90.png", "grid.json",
                     "grid.md"]
    assert doc["options"]["lrs"] == [0.01, 0.02] and doc["options"]["targets"] == [0.5, 0.9]
    assert set(doc["summary"]) == {"0.01", "0.02"}
    assert set(doc["summary"]["0.01"]) == {"sequential", "hogwild", "interval-y4"}
    assert set(doc["runs"]["sequential"]) == {"1"}  # at one thread, though --threads is 2
    assert doc["runs"]["sequential"]["1"][0]["evals"][0][1] == 25
    runs = doc["runs"]["interval-y4"]["2"]
    assert [(r["lr"], r["seed"]) for r in runs] == [(0.01, 0), (0.02, 0)]
    for run in runs:
        assert run["evals"] and run["evals"][0][1] == 25  # every 25 applied updates
        assert run["eval_time_s"] > 0
        assert set(run["time_to_target_s"]) == {"0.5", "0.9"}
        assert run["time_to_target_s"]["0.5"] == scaling.time_to_target(
            [[t, a] for t, _, a in run["evals"]], 0.5)
    assert run["staleness_max"] <= 3  # interval-y4: y = 4
    text = (tmp_path / "grid.md").read_text()
    assert text.count("| hogwild | 2 |") == 4  # a table per (lr, target)
    for heading in ("**lr 0.01, time to 50%**", "**lr 0.02, time to 90%**"):
        assert heading in text


def test_time_to_target_reads_the_evals_between_epoch_ends():
    run = {"curve": [[4.0, 0.3], [8.0, 0.7]],
           "evals": [[1.0, 10, 0.3], [2.0, 20, 0.6], [4.0, 30, 0.3], [8.0, 40, 0.7]]}
    scaling.score(run, [0.5, 0.65])
    assert run["time_to_target_s"]["0.5"] == pytest.approx(1 + 2 / 3)
    assert run["time_to_target_s"]["0.65"] == pytest.approx(4 + 4 * 0.35 / 0.4)
    del run["evals"]  # older runs: epoch ends only
    scaling.score(run, [0.5])
    assert run["time_to_target_s"]["0.5"] == pytest.approx(6.0)


def sweep_files() -> list[Path]:
    """The committed results of bench/scaling.py (finished or partial), not
    those of the other benchmarks."""
    docs = {p: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    return [p for p, doc in docs.items()
            if "runs" in doc and "algos" in doc.get("options", {})]


@pytest.mark.parametrize("path", sweep_files(), ids=lambda p: p.stem)
def test_committed_results_load_with_from_results(tmp_path, path):
    saved = json.loads(path.read_text())
    doc = scaling.main(["--from-results", str(path), "--targets", "0.5,0.55",
                        "--out-dir", str(tmp_path)])
    assert doc["options"]["targets"] == [0.5, 0.55]
    lrs = saved["options"].get("lrs", [saved["options"]["lr"]])
    assert set(doc["summary"]) == {scaling.key(lr) for lr in lrs}
    saved_algos = set(saved["runs"])  # a partial file has no summary, newer ones one by lr
    assert {a for by_algo in doc["summary"].values() for a in by_algo} == saved_algos
    for algo, by_n in saved["runs"].items():
        for n, runs in by_n.items():
            assert len(doc["runs"][algo][n]) == len(runs)
            for old, new in zip(runs, doc["runs"][algo][n], strict=True):
                assert new["lr"] == old.get("lr", lrs[0])
                assert new["final_accuracy"] == old["final_accuracy"]
                if saved["options"].get("target_accuracy") == 0.5:  # the same number as before
                    assert new["time_to_target_s"]["0.5"] == old["time_to_target_s"]
            seeds = {}
            for new in doc["runs"][algo][n]:  # seeds count up per lr
                assert new["seed"] == seeds.get(new["lr"], 0)
                seeds[new["lr"]] = new["seed"] + 1
    assert all(set(row) >= {"threads", "target", "baseline", "ratio"} for row in doc["headline"])
    assert (tmp_path / f"{path.stem}-time-to-target-55.png").exists()


def test_resume_of_an_lr_sweep_runs_only_the_missing_lr(tmp_path, monkeypatch):
    options = ["--quick", "--threads", "2", "--algos", "hogwild", "--seeds", "1",
               "--lrs", "0.01,0.02", "--name", "lrs", "--out-dir", str(tmp_path)]
    calls = []
    real_run_one = scaling.run_one

    def run_one_then_interrupt(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt
        calls.append(args[2])
        return real_run_one(*args, **kwargs)

    monkeypatch.setattr(scaling, "run_one", run_one_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        scaling.main(options)
    monkeypatch.setattr(scaling, "run_one", lambda *a, **k: calls.append(a[2]) or real_run_one(
        *a, **k))
    # other targets are no other options: time to target is computed at the end
    doc = scaling.main([*options, "--resume", "--targets", "0.6"])
    assert [c.lr for c in calls] == [0.01, 0.02]
    assert [r["lr"] for r in doc["runs"]["hogwild"]["2"]] == [0.01, 0.02]


def test_foreign_share_is_the_other_processes_share_of_the_cpus():
    # 2 CPUs for 10 s: 20 CPU-s; the machine used 13, this process 8 -> 5 by others
    assert scaling.foreign_share((100.0, 50.0), (113.0, 58.0), 10.0, cpus=2) == 0.25
    assert scaling.foreign_share((100.0, 50.0), (108.0, 58.0), 10.0, cpus=2) == 0.0
    assert scaling.foreign_share(None, (1.0, 1.0), 10.0) is None
    reading = scaling.machine_cpu_s()
    if reading is not None:  # Linux: the machine has used at least what we used
        assert reading[0] >= reading[1] > 0


def test_a_run_other_processes_disturbed_is_run_again(monkeypatch, capsys):
    args = scaling.parse_args(["--quick", "--max-foreign", "0.05"])
    readings = iter([(0.0, 0.0), (1.0, 0.0),   # first run: others used a whole CPU
                     (5.0, 0.0), (5.0, 0.0)])  # second: nothing but us
    monkeypatch.setattr(scaling, "machine_cpu_s", lambda: next(readings))
    monkeypatch.setattr(scaling, "wait_until_quiet", lambda share: None)
    monkeypatch.setattr(scaling.time, "perf_counter", iter(range(0, 100, 1)).__next__)
    runs = []
    monkeypatch.setattr(scaling, "run_one", lambda *a, **k: runs.append(a) or {"seed": 0})
    run = scaling.undisturbed_run(args, None, None, None, None)
    assert len(runs) == 2 and run["foreign_cpu"] == 0.0
    assert "disturbed (other processes used" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(scaling.ALGOS))
def test_every_sweep_variant_is_a_valid_run_named_in_the_results_docs(name):
    args = scaling.parse_args(["--algos", name])
    cfg = scaling.config_for(args, name, threads=1 if name == "sequential" else 4, seed=0)
    cfg.check()
    docs = (RESULTS.parents[1] / "docs" / "results.md").read_text()
    assert f"`{name}`" in docs


def test_a_recipe_gives_every_run_its_knobs_and_epochs_and_a_flag_still_wins():
    from iasgd.recipes import RECIPES

    settings = RECIPES["cifar10"].settings
    args = scaling.parse_args(["--recipe", "cifar10", "--threads", "2", "--lr", "0.1"])
    assert (args.model, args.dataset, args.batch_size) == (
        settings["model"], settings["dataset"], settings["batch_size"])
    assert args.name == "recipe-cifar10-2"
    for algo in ("sync", "hogwild", "interval-budget"):
        cfg = scaling.config_for(args, algo, threads=2, seed=0)
        cfg.check()
        assert (cfg.epochs, cfg.time_budget, cfg.lr) == (settings["epochs"], None, 0.1)
        for name in ("momentum", "nesterov", "weight_decay", "augment", "crop_padding",
                     "lr_warmup", "lr_decay"):
            assert getattr(cfg, name) == settings[name], name
    plain = scaling.config_for(scaling.parse_args(["--threads", "2"]), "hogwild", 2, 0)
    assert (plain.augment, plain.lr_decay, plain.time_budget) == ("none", "none", 45.0)


def test_a_sweep_by_epochs_trains_each_run_for_them(tmp_path):
    doc = scaling.main(["--quick", "--threads", "2", "--algos", "hogwild,interval", "--seeds",
                        "1", "--epochs", "2", "--out-dir", str(tmp_path)])
    for by_n in doc["runs"].values():
        [run] = by_n["2"]
        assert len(run["curve"]) == 2 and run["status"] == "completed"


def test_stop_at_target_ends_a_run_soon_after_the_epoch_that_reached_it(tmp_path):
    doc = scaling.main(["--quick", "--threads", "2", "--algos", "hogwild", "--seeds", "1",
                        "--epochs", "6", "--targets", "0.3", "--stop-at-target",
                        "--out-dir", str(tmp_path)])
    [run] = doc["runs"]["hogwild"]["2"]
    first = next(i for i, (_, acc) in enumerate(run["curve"]) if acc >= 0.3)
    assert run["status"] == "target_reached" and first < 5
    assert len(run["curve"]) <= first + 2  # the epoch that reached it, and the one cut short
    assert run["time_to_target_s"]["0.3"] is not None
