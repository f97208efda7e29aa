"""Thread sweeps and the time-to-accuracy comparison of the algorithms.

    python bench/scaling.py --threads 1,2,4,8,16 --seeds 3 --dataset cifar10 \\
        --archive ../shared/data/cifar-10-jpeg-python.tar.gz \\
        --time-budget 45 --target-accuracy 0.5
    python bench/scaling.py --quick        # synthetic data, seconds per run

The full sweep above is 123 runs; an interrupted sweep picks up where it
stopped with --resume (finished runs are saved after each one).

Every (algorithm, thread count, seed) runs on its own, one after another, for
--time-budget seconds of training (evaluation excluded). The script prints a
table per algorithm and thread count and writes bench/results/<name>.json,
<name>.md and PNG plots: throughput vs threads, time to the target accuracy
vs threads, test accuracy vs training time, and the staleness distribution of
each algorithm at the largest thread count.

Algorithms: sequential, sync, async, hogwild, interval (fixed y),
interval-decay, interval-probe, elastic (hogwild with the thread-count
window), async-tail (hogwild with TAIL-tau step sizes).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from iasgd import data as datasets  # noqa: E402
from iasgd import engine, metrics, models, sim  # noqa: E402
from iasgd.algorithms import VARIANTS  # noqa: E402

ALGOS = VARIANTS  # sweep name -> TrainConfig fields
PASSED_THROUGH = ("batch_size", "lr", "momentum", "interval", "gate", "y0", "y_min",
                  "decay_every", "decay_by", "probe_offset", "probe_step", "probe_steps",
                  "exec_steps", "window")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--threads", default="1,2,4,8,16", help="thread counts to sweep")
    p.add_argument("--algos", default=",".join(ALGOS), help="algorithms to compare")
    p.add_argument("--seeds", type=int, default=3, help="runs per (algorithm, threads)")
    p.add_argument("--dataset", default="cifar10", choices=datasets.DATASETS)
    p.add_argument("--model", default="lenet",
                   help="a preset (lenet, mlp, vgg-small) or a layer spec, as iasgd.run takes")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--archive", default=None)
    p.add_argument("--time-budget", type=float, default=45.0, help="training seconds per run")
    p.add_argument("--target-accuracy", type=float, default=0.5,
                   help="test accuracy whose time to reach is compared")
    p.add_argument("--name", default=None, help="results name (default: from the options)")
    p.add_argument("--out-dir", default=str(REPO / "bench" / "results"),
                   help="where the JSON, markdown and PNG files go")
    p.add_argument("--resume", action="store_true",
                   help="keep the finished runs of an interrupted sweep with the same "
                        "options (<name>.partial.json) and run only the rest")
    p.add_argument("--from-results", default=None, metavar="JSON",
                   help="run nothing: rebuild the table and plots of a finished sweep "
                        "from its results file (e.g. for another --target-accuracy)")
    p.add_argument("--quick", action="store_true",
                   help="synthetic data, tiny budget: a smoke test in seconds")
    p.add_argument("--simulate", action="store_true",
                   help="simulate the threads (iasgd.sim) from measured step times; "
                        "--time-budget is then in simulated seconds; sequential (one "
                        "thread, nothing to simulate) is skipped")
    p.add_argument("--sim-cores", type=int, default=None,
                   help="cores the simulated workers share (default: one each)")
    for name in PASSED_THROUGH:
        default = getattr(engine.TrainConfig, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(default) if default is not None
                       else int, default=default)
    args = p.parse_args(argv)
    if args.from_results:  # the sweep's own options come from the file
        return args
    try:
        model = models.build(args.model, "synthetic" if args.quick else args.dataset)
    except ValueError as e:
        p.error(f"--model {args.model}: {e}")
    if args.model not in models.MODELS:
        args.model = model.spec  # canonical, so that a resume compares like with like
    args.threads = [int(n) for n in args.threads.split(",")]
    args.algos = args.algos.split(",")
    unknown = [a for a in args.algos if a not in ALGOS]
    if unknown:
        p.error(f"unknown algorithms {unknown}; choose from {', '.join(ALGOS)}")
    if args.quick:
        args.dataset, args.time_budget = "synthetic", min(args.time_budget, 1.0)
        args.seeds = min(args.seeds, 2)
        args.target_accuracy = min(args.target_accuracy, 0.9)
        args.lr = 0.02
        args.probe_steps, args.exec_steps = 20, 60
    if args.simulate:
        args.algos = [a for a in args.algos if ALGOS[a]["algo"] in sim.SIMULATED_ALGOS]
        if args.quick:  # simulated seconds: a few epochs of the synthetic set
            args.time_budget = min(args.time_budget, 0.05)
    model_tag = "" if args.model == "lenet" else (
        f"{args.model}-" if args.model in models.MODELS else "spec-")
    args.name = args.name or ("quick-" if args.quick else "") + (
        f"{'simulated-' if args.simulate else ''}{model_tag}{args.dataset}-"
        f"{'-'.join(map(str, args.threads))}")
    return args


def sweep_options(args: argparse.Namespace) -> dict:
    """The options that decide what each run computes (not where files go)."""
    return {k: v for k, v in vars(args).items()
            if k not in ("resume", "out_dir", "data_dir", "archive", "from_results")}


def finished_runs(partial: Path, args: argparse.Namespace) -> tuple[dict, float]:
    """The runs an interrupted sweep with the same options saved in `partial`,
    and the seconds it ran; exits with code 2 and one line when the options
    differ."""
    if not partial.exists():
        return {}, 0.0
    saved = json.loads(partial.read_text())
    current = json.loads(json.dumps(sweep_options(args)))  # as the file holds them
    changed = sorted(k for k in current.keys() | saved["options"].keys()
                     if saved["options"].get(k) != current.get(k))
    if changed:
        print(f"scaling.py: {partial} was made with other options ({', '.join(changed)}); "
              "rerun with those options, or without --resume to start over", file=sys.stderr)
        raise SystemExit(2)
    return runs_by_threads(saved["runs"]), saved.get("seconds", 0.0)


def runs_by_threads(saved: dict) -> dict[str, dict[int, list[dict]]]:
    """Runs as a JSON file holds them (thread counts as strings), keyed by int."""
    return {a: {int(n): rs for n, rs in by_n.items()} for a, by_n in saved.items()}


def config_for(args: argparse.Namespace, algo: str, threads: int, seed: int) -> engine.TrainConfig:
    knobs = {name: getattr(args, name) for name in PASSED_THROUGH}
    return engine.TrainConfig(**knobs, **ALGOS[algo], threads=threads, seed=seed,
                              epochs=1_000_000, time_budget=args.time_budget)


def run_one(model, data, cfg: engine.TrainConfig, target: float, simulation=None) -> dict:
    """One run's figures: throughput, staleness, accuracy over time, time to
    target. simulation: (step_time, cores) to simulate instead of running."""
    if simulation is None:
        result = engine.train(model, data, cfg)
    else:
        step_time, cores = simulation
        result = sim.simulate(model, data, cfg, step_time, cores=cores)
    doc = metrics.results_document({}, result, model.num_params)
    curve = [[e["wall_s"], e["test_accuracy"]] for e in doc["epochs"]]
    return {
        "samples_per_s": doc["samples_per_s"],
        "staleness_mean": doc["staleness"]["mean"],
        "staleness_max": doc["staleness"]["max"],
        "staleness_hist": doc["staleness"]["hist"],
        "acceptance_rate": doc["acceptance_rate"],
        "time_to_target_s": time_to_target(curve, target),
        "final_accuracy": doc["final_test_accuracy"],
        "curve": curve,
    }


def time_to_target(curve: list[list[float]], target: float) -> float | None:
    """Training seconds until the test accuracy first reaches `target`.
    curve: [seconds, accuracy] at each epoch end. The crossing is
    interpolated linearly between the two evaluations around it (accuracy
    is measured only at epoch ends, seconds apart); it is the first
    evaluation itself when that one already reaches the target. None: never."""
    before = None
    for t, acc in curve:
        if acc is None or not math.isfinite(acc):  # a diverged run
            before = None
            continue
        if acc >= target:
            if before is None:
                return t
            t0, acc0 = before
            return t0 + (target - acc0) / (acc - acc0) * (t - t0)
        before = (t, acc)
    return None


def summarise(runs: list[dict]) -> dict:
    """Median/min/max throughput, mean staleness, time to target over seeds."""
    rates = [r["samples_per_s"] for r in runs]
    times = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
    return {
        "samples_per_s": [statistics.median(rates), min(rates), max(rates)],
        "staleness_mean": statistics.mean(r["staleness_mean"] for r in runs),
        "staleness_max": max(r["staleness_max"] for r in runs),
        "acceptance_rate": statistics.mean(r["acceptance_rate"] for r in runs),
        "time_to_target_s": ([statistics.mean(times), statistics.pstdev(times)]
                             if len(times) == len(runs) else None),
        "reached": len(times),
        "final_accuracy": statistics.mean(r["final_accuracy"] for r in runs),
    }


def table(summary: dict, args: argparse.Namespace) -> str:
    """Markdown table: one row per (algorithm, threads)."""
    digits = 1 if args.time_budget >= 10 else 3  # simulated budgets are about a second
    lines = ["| algorithm | n | samples/s median (min-max) | mean tau | max tau | accepted | "
             f"time to {100 * args.target_accuracy:.0f}% (s) | vs async | acc at budget |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for algo, by_n in summary.items():
        for n, s in by_n.items():
            med, lo, hi = s["samples_per_s"]
            ttt = s["time_to_target_s"]
            ttt_text = f"{ttt[0]:.{digits}f} ± {ttt[1]:.{digits}f}" if ttt else \
                f"not reached ({s['reached']}/{args.seeds})"
            base = summary.get("async", {}).get(n, {}).get("time_to_target_s")
            ratio = f"{ttt[0] / base[0]:.2f}" if ttt and base else "-"
            lines.append(f"| {algo} | {n} | {med:,.0f} ({lo:,.0f}-{hi:,.0f}) | "
                         f"{s['staleness_mean']:.2f} | {s['staleness_max']} | "
                         f"{100 * s['acceptance_rate']:.0f}% | {ttt_text} | {ratio} | "
                         f"{100 * s['final_accuracy']:.1f}% |")
    return "\n".join(lines)


def plot(summary: dict, runs: dict, args: argparse.Namespace, out: Path) -> list[Path]:
    """The four PNG figures; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    paths = []
    largest = max(args.threads)

    def save(fig, name: str) -> None:
        if args.simulate:
            fig.suptitle("SIMULATED", color="firebrick", fontsize=9, x=0.99, ha="right")
        path = out.with_name(f"{out.name}-{name}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo, by_n in summary.items():
        ns = sorted(by_n)
        ax.plot(ns, [by_n[n]["samples_per_s"][0] for n in ns], marker="o", label=algo)
    ax.set(xlabel="threads", ylabel="applied samples/s (median)", xscale="log", xticks=args.threads,
           xticklabels=args.threads, title="Throughput")
    ax.legend(fontsize=7)
    save(fig, "throughput")

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo, by_n in summary.items():
        ns = [n for n in sorted(by_n) if by_n[n]["time_to_target_s"]]
        ax.errorbar(ns, [by_n[n]["time_to_target_s"][0] for n in ns],
                    yerr=[by_n[n]["time_to_target_s"][1] for n in ns], marker="o", label=algo,
                    capsize=3)
    ax.set(xlabel="threads", ylabel="seconds", xscale="log", xticks=args.threads,
           xticklabels=args.threads,
           title=f"Time to {100 * args.target_accuracy:.0f}% test accuracy (mean ± std)")
    ax.legend(fontsize=7)
    save(fig, "time-to-target")

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo in summary:
        for i, run in enumerate(runs[algo].get(largest, [])):
            t, acc = zip(*run["curve"], strict=True) if run["curve"] else ((), ())
            ax.plot(t, acc, color=f"C{list(summary).index(algo)}", alpha=0.8,
                    label=algo if i == 0 else None)
    ax.axhline(args.target_accuracy, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="training seconds", ylabel="test accuracy",
           title=f"Test accuracy over time, {largest} threads")
    ax.legend(fontsize=7)
    save(fig, "accuracy")

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo in summary:
        hist = [0]
        for run in runs[algo].get(largest, []):
            h = run["staleness_hist"]
            hist = [a + b for a, b in zip(hist + [0] * (len(h) - len(hist)),
                                          h + [0] * (len(hist) - len(h)), strict=True)]
        total = sum(hist) or 1
        ax.plot(range(len(hist)), [c / total for c in hist], drawstyle="steps-mid", label=algo)
    ax.set(xlabel="staleness tau", ylabel="share of applied updates", yscale="log",
           title=f"Staleness distribution, {largest} threads")
    ax.legend(fontsize=7)
    save(fig, "staleness")
    return paths


def run_sweep(args: argparse.Namespace, out: Path) -> tuple[dict, float]:
    """Every (algorithm, threads, seed) run, one at a time, each saved in
    <out>.partial.json as it finishes. Returns the runs by algorithm and
    thread count, and the seconds the sweep took."""
    if args.quick:
        data = datasets.synthetic(seed=0, n_train=2000, n_test=300)
    else:
        data = datasets.load(args.dataset, args.data_dir, args.archive)
    model = models.build(args.model, args.dataset)
    simulation = None
    if args.simulate:
        times = sim.measure_step_times(model, data, args.batch_size)
        simulation = (sim.measured_steps(times), args.sim_cores)
        cores = f"{args.sim_cores} cores" if args.sim_cores else "one core per worker"
        print(f"SIMULATED runs: step times measured here, mean {1e3 * times.mean():.2f} ms; "
              f"{cores}")
    partial = out.with_suffix(".partial.json")
    runs, seconds_before = finished_runs(partial, args) if args.resume else ({}, 0.0)
    combos = [(a, n) for a in args.algos for n in args.threads
              if not (a == "sequential" and n != 1)]
    todo = sum(args.seeds - len(runs.get(a, {}).get(n, [])) for a, n in combos)
    if args.simulate:
        print(f"{todo} runs of {args.time_budget:g} simulated s of training each", flush=True)
    else:
        print(f"{todo} runs of {args.time_budget:g} s of training each: "
              f"{todo * args.time_budget / 60:.0f} min plus evaluation", flush=True)
    t_start = time.perf_counter()
    for i, (algo, n) in enumerate(combos, start=1):
        for seed in range(len(runs.get(algo, {}).get(n, [])), args.seeds):
            print(f"[{i}/{len(combos)}] {algo} n={n} seed={seed} ...", end=" ", flush=True)
            run = run_one(model, data, config_for(args, algo, n, seed), args.target_accuracy,
                          simulation)
            runs.setdefault(algo, {}).setdefault(n, []).append(run)
            # after every run, so an interrupted sweep loses at most one run
            metrics.write_json_atomic(partial, {
                "options": sweep_options(args), "runs": runs,
                "seconds": seconds_before + time.perf_counter() - t_start})
            print(f"{run['samples_per_s']:,.0f} samples/s, acc {100 * run['final_accuracy']:.1f}%",
                  flush=True)
    return runs, seconds_before + time.perf_counter() - t_start


def rescored_runs(args: argparse.Namespace) -> tuple[argparse.Namespace, dict, dict]:
    """--from-results: the runs of a finished sweep, their time to target
    recomputed from their accuracy curves for this --target-accuracy. Returns
    the sweep's options (with this target, name and output folder), its runs
    and the saved document."""
    path = Path(args.from_results)
    try:
        saved = json.loads(path.read_text())
        options, runs = saved["options"], saved["runs"]
    except (OSError, ValueError, KeyError) as e:
        print(f"scaling.py: --from-results {path}: not a sweep results file ({e})",
              file=sys.stderr)
        raise SystemExit(2) from None
    keep = {"target_accuracy": args.target_accuracy, "out_dir": args.out_dir,
            "name": args.name or path.stem}
    args = argparse.Namespace(**{**options, **keep, "from_results": str(path)})
    runs = runs_by_threads(runs)
    for by_n in runs.values():
        for rs in by_n.values():
            for run in rs:
                run["time_to_target_s"] = time_to_target(run["curve"], args.target_accuracy)
    return args, runs, saved


def write_report(args: argparse.Namespace, runs: dict, out: Path, facts: dict) -> dict:
    """Print the table; write <out>.json, <out>.md and the plots. facts:
    machine, date and sweep_seconds of the sweep. Returns the JSON document."""
    summary = {a: {n: summarise(rs) for n, rs in by_n.items()} for a, by_n in runs.items()}
    text = table(summary, args)
    if args.simulate:
        text = "SIMULATED (iasgd.sim): times and throughput are simulated\n\n" + text
    print(text)
    document = {"options": dict(vars(args)), "simulated": bool(args.simulate), **facts,
                "summary": {a: {str(n): s for n, s in by_n.items()} for a, by_n in summary.items()},
                "runs": {a: {str(n): rs for n, rs in by_n.items()} for a, by_n in runs.items()}}
    metrics.write_json_atomic(out.with_suffix(".json"), document)
    out.with_suffix(".md").write_text(text + "\n")
    paths = plot(summary, runs, args, out)
    print(f"wrote {out.with_suffix('.json')}, {out.with_suffix('.md')} and "
          f"{', '.join(p.name for p in paths)}")
    return json.loads(out.with_suffix(".json").read_text())


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.from_results:
        args, runs, saved = rescored_runs(args)
        facts = {k: saved[k] for k in ("machine", "date", "sweep_seconds")}
    out = Path(args.out_dir) / args.name
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.from_results:
        return write_report(args, runs, out, facts)
    runs, seconds = run_sweep(args, out)
    facts = {"machine": metrics.machine_info(), "date": time.strftime("%Y-%m-%d"),
             "sweep_seconds": seconds}
    document = write_report(args, runs, out, facts)
    out.with_suffix(".partial.json").unlink(missing_ok=True)
    return document


if __name__ == "__main__":
    main()
