"""Thread sweeps and the time-to-accuracy comparison of the algorithms.

    python bench/scaling.py --threads 1,2,4,8,16 --seeds 3 --dataset cifar10 \\
        --archive ../shared/data/cifar-10-jpeg-python.tar.gz \\
        --time-budget 45 --targets 0.5,0.55,0.6 --eval-every 500
    python bench/scaling.py --quick        # synthetic data, seconds per run
    python bench/scaling.py --recipe cifar10 --threads 2,128 --seeds 2 \\
        --algos sync,hogwild,async-tail,hogwild-fit,interval-budget \\
        --archive ../shared/data/cifar-10-jpeg-python.tar.gz --targets 0.7,0.75,0.8

The full sweep above is 123 runs; an interrupted sweep picks up where it
stopped with --resume (finished runs are saved after each one).

With --recipe (iasgd/recipes.py) every run trains with the recipe's
model, augmentation, optimiser and step-size schedule for its epochs (the
schedule is planned over them), not for --time-budget; an option given
here still wins, and --epochs alone makes any sweep stop by epochs.

Sequential runs at one thread whatever --threads says; the other algorithms
at every count of --threads. Every (algorithm, thread count, learning rate,
seed) runs on its own, one
after another, for --time-budget seconds of training (evaluation excluded).
The script prints a table per learning rate and target (a row per algorithm
and thread count) and writes bench/results/<name>.json (the sweep file, whose
format iasgd/sweeps.py defines), <name>.md and PNG plots: throughput vs
threads, time to each target accuracy vs threads, test accuracy vs training
time, and the staleness distribution of each algorithm at the largest
thread count (per learning rate when --lrs has several).

Time to target is interpolated between evaluations: every --eval-every
applied updates when given (outside the training clock), else epoch ends.

Runs go thread count by thread count in the order --threads gives, so an
interrupted sweep has whole columns. A real run measures wall time, so other
processes on the machine would distort it: before each run the sweep waits
until other processes use at most --max-foreign of the CPUs, and a run they
disturbed beyond that (read from /proc/stat, Linux only) is run again, up to
RETRIES times; each run records its share as foreign_cpu.

Algorithms: sequential, sync, async, hogwild, interval (fixed y = --interval),
interval-y<Y> (fixed y = Y, e.g. interval-y64), interval-decay, interval-probe,
elastic (hogwild with the thread-count window), async-tail (hogwild with
TAIL-tau step sizes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from iasgd import data as datasets  # noqa: E402
from iasgd import engine, results, sweeps  # noqa: E402
from iasgd.algorithms import sweep_variant  # noqa: E402
from iasgd.config import config_where_it_applies  # noqa: E402
from iasgd.executors import simulated as sim  # noqa: E402
from iasgd.nn import models  # noqa: E402
from iasgd.recipes import RECIPES  # noqa: E402
from iasgd.sweeps import accuracy_points  # noqa: E402

ALGOS = sweeps.ALGOS  # sweep name -> TrainConfig fields
PASSED_THROUGH = ("batch_size", "lr", "momentum", "interval", "gate", "y0", "y_min",
                  "decay_every", "decay_by", "probe_offset", "probe_step", "probe_steps",
                  "exec_steps", "window", "staleness_budget")


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
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs per run instead of --time-budget (a recipe's own with --recipe)")
    p.add_argument("--stop-at-target", action="store_true",
                   help="stop a run at the first epoch end that reaches the highest "
                        "of --targets (its accuracy column is then the accuracy there)")
    p.add_argument("--recipe", default=None, choices=sorted(RECIPES),
                   help="train every run with this recipe (iasgd/recipes.py): its data, model, "
                        "augmentation, optimiser and step-size schedule for its epochs; an "
                        "option named here wins")
    p.add_argument("--targets", "--target-accuracy", dest="targets", default=None,
                   help="test accuracies whose time to reach is compared, comma-separated "
                        "(default 0.5; with --from-results the sweep's own; "
                        "--target-accuracy: the old name)")
    p.add_argument("--lrs", default=None,
                   help="learning rates to sweep, comma-separated (default: --lr alone)")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="evaluate every N applied updates (outside the training clock) as "
                        "well as at epoch ends; 0: epoch ends only")
    p.add_argument("--name", default=None, help="results name (default: from the options)")
    p.add_argument("--out-dir", default=str(REPO / "bench" / "results"),
                   help="where the JSON, markdown and PNG files go")
    p.add_argument("--resume", action="store_true",
                   help="keep the finished runs of an interrupted sweep with the same "
                        "options (<name>.partial.json) and run only the rest")
    p.add_argument("--from-results", default=None, metavar="JSON",
                   help="run nothing: rebuild the tables and plots of a finished sweep "
                        "from its results file (e.g. for other --targets)")
    p.add_argument("--quick", action="store_true",
                   help="synthetic data, tiny budget: a smoke test in seconds")
    p.add_argument("--simulate", action="store_true",
                   help="simulate the threads (iasgd.executors.simulated) from measured step "
                        "times; --time-budget is then in simulated seconds; sequential (one "
                        "thread, nothing to simulate) is skipped")
    p.add_argument("--sim-cores", type=int, default=None,
                   help="cores the simulated workers share (default: one each)")
    p.add_argument("--sim-step-ms", type=float, default=None, metavar="MS",
                   help="simulated: mean single-thread step time, lognormal with "
                        "--sim-step-spread (default: drawn from 200 steps measured at the "
                        "start, which a busy machine inflates)")
    p.add_argument("--sim-step-spread", type=float, default=0.1, metavar="SIGMA",
                   help="simulated: spread (sigma of log-time) of --sim-step-ms's steps")
    p.add_argument("--sim-contention", type=float, default=0.0, metavar="C",
                   help="simulated: each other busy core makes a step this much longer "
                        "(docs/simulator.md, 'Contention, calibrated')")
    p.add_argument("--sim-switch", type=float, default=0.0, metavar="SECONDS",
                   help="simulated: CPU seconds a time-sliced worker loses resuming a cut step")
    p.add_argument("--max-foreign", type=float, default=None, metavar="SHARE",
                   help="share of the machine's CPUs other processes may use during a real "
                        "run before it is run again (default 0.05; off with --quick and "
                        "--simulate; 1: off)")
    for name in PASSED_THROUGH:
        default = getattr(engine.TrainConfig, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(default) if default is not None
                       else int, default=default)
    args = p.parse_args(argv)
    if args.recipe:  # the recipe's settings as defaults: a flag given still wins
        p.set_defaults(**{k: v for k, v in RECIPES[args.recipe].settings.items()
                          if k in vars(args)})
        args = p.parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")
    try:
        args.targets = None if args.targets is None else [float(t)
                                                          for t in args.targets.split(",")]
        args.lrs = None if args.lrs is None else [float(x) for x in args.lrs.split(",")]
    except ValueError as e:
        p.error(f"--targets and --lrs take comma-separated numbers ({e})")
    if args.from_results:  # the sweep's own options come from the file
        return args
    args.targets = args.targets or [0.5]
    if args.eval_every < 0:
        p.error(f"--eval-every must be >= 0, got {args.eval_every}")
    if args.sim_contention < 0 or args.sim_switch < 0 or args.sim_step_spread < 0:
        p.error("--sim-contention, --sim-switch and --sim-step-spread must be >= 0")
    if args.sim_step_ms is not None and not args.sim_step_ms > 0:
        p.error(f"--sim-step-ms must be > 0, got {args.sim_step_ms}")
    try:
        model = models.build(args.model, "synthetic" if args.quick else args.dataset)
    except ValueError as e:
        p.error(f"--model {args.model}: {e}")
    if args.model not in models.MODELS:
        args.model = model.spec  # canonical, so that a resume compares like with like
    args.threads = [int(n) for n in args.threads.split(",")]
    args.algos = args.algos.split(",")
    unknown = [a for a in args.algos if sweep_variant(a) is None]
    if unknown:
        p.error(f"unknown algorithms {unknown}; choose from {', '.join(ALGOS)}")
    if args.quick:
        args.dataset, args.time_budget = "synthetic", min(args.time_budget, 1.0)
        args.seeds = min(args.seeds, 2)
        args.targets = [min(t, 0.9) for t in args.targets]
        args.lr = 0.02
        args.probe_steps, args.exec_steps = 20, 60
    args.lrs = args.lrs or [args.lr]
    if args.max_foreign is None:
        args.max_foreign = 1.0 if args.quick or args.simulate else 0.05
    if args.simulate:
        args.algos = [a for a in args.algos
                      if sweep_variant(a)["algo"] in sim.SIMULATED_ALGOS]
        if args.quick:  # simulated seconds: a few epochs of the synthetic set
            args.time_budget = min(args.time_budget, 0.05)
    if args.recipe:
        model_tag = "recipe-"  # the dataset follows: recipe-cifar10-2-128
    else:
        model_tag = "" if args.model == "lenet" else (
            f"{args.model}-" if args.model in models.MODELS else "spec-")
    args.name = args.name or ("quick-" if args.quick else "") + (
        f"{'simulated-' if args.simulate else ''}{model_tag}{args.dataset}-"
        f"{'-'.join(map(str, args.threads))}")
    return args


def sweep_options(args: argparse.Namespace) -> dict:
    """The options that decide what each run computes (not where files go)."""
    return {k: v for k, v in vars(args).items()
            if k not in ("resume", "out_dir", "data_dir", "archive", "from_results", "targets",
                         "max_foreign")}


def key(x: float) -> str:
    """A target or learning rate as a JSON key: 0.55 -> "0.55"."""
    return f"{x:g}"


def finished_runs(partial: Path, args: argparse.Namespace) -> tuple[dict, float]:
    """The runs an interrupted sweep with the same options saved in `partial`,
    and the seconds it ran; exits with code 2 and one line when the options
    differ (the targets may: time to target is computed when reporting)."""
    if not partial.exists():
        return {}, 0.0
    saved = read_sweep(partial, "--resume")
    options = {k: v for k, v in sweeps.upgraded(saved["options"]).items() if k != "targets"}
    current = json.loads(json.dumps(sweep_options(args)))  # as the file holds them
    changed = sorted(k for k in current.keys() | options.keys()
                     if options.get(k) != current.get(k))
    if changed:
        print(f"scaling.py: {partial} was made with other options ({', '.join(changed)}); "
              "rerun with those options, or without --resume to start over", file=sys.stderr)
        raise SystemExit(2)
    return runs_by_threads(saved["runs"], options), saved.get("seconds", 0.0)


def runs_by_threads(saved: dict, options: dict) -> dict[str, dict[int, list[dict]]]:
    """Runs as a JSON file holds them (thread counts as strings), keyed by
    int; each run tagged with its lr and seed (sweeps.tagged: files older
    than --lrs ran the sweep's one lr)."""
    return {algo: {int(n): sweeps.tagged(rs, options["lrs"][0]) for n, rs in by_n.items()}
            for algo, by_n in saved.items()}


def read_sweep(path: Path, option: str) -> dict:
    """The sweep in `path` with what the tables need; exits with code 2 and
    one line (naming `option`) if it is not one."""
    try:
        return sweeps.read(path, sweeps.PLOTTED + sweeps.REPORTED)
    except sweeps.SweepError as e:
        print(f"scaling.py: {option} {e}", file=sys.stderr)
        raise SystemExit(2) from None


def runs_of(runs: dict, algo: str, n: int, lr: float) -> list[dict]:
    return [r for r in runs.get(algo, {}).get(n, []) if key(r["lr"]) == key(lr)]


def config_for(args: argparse.Namespace, algo: str, threads: int, seed: int,
               lr: float | None = None) -> engine.TrainConfig:
    knobs = recipe_knobs(args)
    knobs.update({name: getattr(args, name) for name in PASSED_THROUGH})
    knobs.update(sweep_variant(algo), lr=args.lr if lr is None else lr)
    length = ({"epochs": 1_000_000, "time_budget": args.time_budget} if args.epochs is None
              else {"epochs": args.epochs, "time_budget": None})
    return config_where_it_applies(**knobs, **length, threads=threads, seed=seed,
                                   eval_every=args.eval_every)


def recipe_knobs(args: argparse.Namespace) -> dict:
    """The training knobs of --recipe that this script has no option for
    (augmentation, Nesterov, weight decay, the step-size schedule)."""
    if not args.recipe:
        return {}
    fields = {f.name for f in dataclasses.fields(engine.TrainConfig)}
    return {k: v for k, v in RECIPES[args.recipe].settings.items()
            if k in fields and k not in vars(args)}


def run_length(args: argparse.Namespace) -> str:
    """What one run trains for, in words."""
    if args.epochs is not None:
        return f"{args.epochs} epochs"
    return f"{args.time_budget:g}{' simulated' if args.simulate else ''} s of training"


def run_one(model, data, cfg: engine.TrainConfig, targets: list[float],
            simulation=None, stop_at: float | None = None) -> dict:
    """One run's figures: throughput, staleness, accuracy over time (at
    epoch ends, and every eval_every updates in `evals`), time to each
    target. simulation: (step_time, cores, costs) to simulate instead of
    running; stop_at: the run stops (status "target_reached") soon after
    the first epoch end whose test accuracy is at least this."""
    if simulation is None:
        result = engine.train(model, data, cfg, stop_at_accuracy(stop_at))
    else:
        step_time, cores, costs = simulation
        result = sim.simulate(model, data, cfg, step_time, cores=cores, costs=costs,
                              hooks=stop_at_accuracy(stop_at))
    run = sweeps.record(results.results_document({}, result, model.num_params), cfg.lr,
                        cfg.seed)
    score(run, targets)
    return run


def stop_at_accuracy(target: float | None) -> results.Hooks:
    """Hooks that stop a run once an epoch ends at `target` test accuracy
    or more (None: never)."""
    reached: list[bool] = []
    if target is not None:
        def on_epoch_end(record: results.EpochRecord) -> None:
            if record.test_accuracy >= target:
                reached.append(True)
        return results.Hooks(on_epoch_end=on_epoch_end,
                             should_stop=lambda: "target_reached" if reached else None)
    return results.Hooks()


def score(run: dict, targets: list[float]) -> None:
    """Set run["time_to_target_s"]: {target: seconds or None}, and with
    evals run["updates_to_target"]: {target: applied updates or None}."""
    points = accuracy_points(run)
    run["time_to_target_s"] = {key(t): time_to_target(points, t) for t in targets}
    if run.get("evals"):
        by_update = [[applied, acc] for _, applied, acc in run["evals"]]
        run["updates_to_target"] = {key(t): time_to_target(by_update, t) for t in targets}


def mean_and_std(values: list[float | None]) -> list[float] | None:
    """[mean, population std] of the values; None unless every one is known."""
    if not values or any(v is None for v in values):
        return None
    return [statistics.mean(values), statistics.pstdev(values)]


def time_to_target(curve: list[list[float]], target: float) -> float | None:
    """Training seconds until the test accuracy first reaches `target`.
    curve: [seconds, accuracy] at each evaluation (epoch ends, or every
    --eval-every updates); scored by iasgd.results.time_to_target."""
    return results.time_to_target([t for t, _ in curve], [a for _, a in curve], target)


def summarise(runs: list[dict], targets: list[float]) -> dict:
    """Median/min/max throughput, mean staleness, time to each target (mean
    and std over the seeds, None unless every seed reached it) over seeds."""
    rates = [r["samples_per_s"] for r in runs]
    ttt, reached, updates = {}, {}, {}
    for t in targets:
        times = [r["time_to_target_s"][key(t)] for r in runs]
        ttt[key(t)] = mean_and_std(times)
        reached[key(t)] = sum(x is not None for x in times)
        updates[key(t)] = mean_and_std([r.get("updates_to_target", {}).get(key(t))
                                        for r in runs])
    return {
        "samples_per_s": [statistics.median(rates), min(rates), max(rates)],
        "staleness_mean": statistics.mean(r["staleness_mean"] for r in runs),
        "staleness_max": max(r["staleness_max"] for r in runs),
        "acceptance_rate": statistics.mean(r["acceptance_rate"] for r in runs),
        "time_to_target_s": ttt,
        "updates_to_target": updates,
        "reached": reached,
        "final_accuracy": statistics.mean(r["final_accuracy"] or 0.0 for r in runs),
        "diverged": sum(r.get("status") == "diverged" for r in runs),
        "seeds": len(runs),
    }


def table(summary: dict, args: argparse.Namespace) -> str:
    """Markdown tables, one per (learning rate, target): a row per
    (algorithm, threads). summary: {lr: {algo: {n: summarise(...)}}}. With
    one lr and one target, one table without a heading."""
    # simulated budgets are about a second
    digits = 1 if args.epochs is not None or args.time_budget >= 10 else 3
    blocks = []
    for lr, by_algo in summary.items():
        for target in args.targets:
            t = key(target)
            lines = []
            if len(summary) > 1 or len(args.targets) > 1:
                lines += [f"**lr {lr}, time to {100 * target:.0f}%**", ""]
            lines += ["| algorithm | n | samples/s median (min-max) | mean tau | max tau | "
                      f"accepted | time to {100 * target:.0f}% (s) | updates to it (k) | "
                      "vs async | acc at budget |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for algo, by_n in by_algo.items():
                for n, s in by_n.items():
                    med, lo, hi = s["samples_per_s"]
                    ttt = s["time_to_target_s"][t]
                    ttt_text = f"{ttt[0]:.{digits}f} ± {ttt[1]:.{digits}f}" if ttt else \
                        f"not reached ({s['reached'][t]}/{s['seeds']})"
                    base = by_algo.get("async", {}).get(n, {}).get("time_to_target_s", {})
                    base = base.get(t) if base else None
                    ratio = f"{ttt[0] / base[0]:.2f}" if ttt and base else "-"
                    upd = s.get("updates_to_target", {}).get(t)
                    upd_text = f"{upd[0] / 1e3:.1f} ± {upd[1] / 1e3:.1f}" if upd else "-"
                    diverged = f" ({s['diverged']} diverged)" if s.get("diverged") else ""
                    lines.append(f"| {algo} | {n} | {med:,.0f} ({lo:,.0f}-{hi:,.0f}) | "
                                 f"{s['staleness_mean']:.2f} | {s['staleness_max']} | "
                                 f"{100 * s['acceptance_rate']:.0f}% | {ttt_text} | {upd_text} | "
                                 f"{ratio} | {100 * s['final_accuracy']:.1f}%{diverged} |")
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def is_interval(algo: str) -> bool:
    return sweep_variant(algo)["algo"] == "interval"


def fastest(by_algo: dict, n: int, target: str,
            pick: Callable[[str], bool]) -> tuple[str, float] | None:
    """(algorithm, mean seconds) of the algorithm among those `pick` accepts
    that reached `target` at n threads in every seed soonest; None if none."""
    times = [(s[n]["time_to_target_s"][target][0], algo) for algo, s in by_algo.items()
             if pick(algo) and n in s and s[n]["time_to_target_s"][target]]
    if not times:
        return None
    seconds, algo = min(times)
    return algo, seconds


def headline_columns(by_algo: dict) -> list[str]:
    """The headline's algorithms: the interval variants, then the baselines
    (sequential, one thread, is the floor's business, not a column)."""
    algos = [a for a in by_algo if a != "sequential"]
    return [a for a in algos if is_interval(a)] + [a for a in algos if not is_interval(a)]


def headline(summary: dict, args: argparse.Namespace) -> tuple[list[dict], str]:
    """The comparison the sweep is for: per (lr, threads > 1, target), the
    mean ± std time to target of every parallel variant, the fastest
    baseline (every algorithm other than interval and sequential), the
    fastest interval variant's time divided by it and by Hogwild!'s, and,
    when the sweep has 2 threads, by the floor: the fastest 2-thread time of
    any variant (with 2 cores, what more threads can at best match).
    Returns the rows (for the JSON) and a Markdown table per lr."""
    rows, blocks = [], []
    for lr, by_algo in summary.items():
        shown = headline_columns(by_algo)
        counts = sorted({n for by_n in by_algo.values() for n in by_n if n > 1}, reverse=True)
        floored = 2 in counts
        lines = [f"**Headline, lr {lr}**: time to target (s), mean ± std over seeds; "
                 "ratio = fastest interval variant / fastest baseline (or / hogwild"
                 + (", or / the fastest 2-thread time, the floor" if floored else "") + ")", "",
                 "| n | target | " + " | ".join(shown) +
                 " | fastest baseline | ratio | ratio to hogwild |"
                 + (" floor | ratio to floor |" if floored else ""),
                 "|---:|---:|" + "---:|" * len(shown) + "---|---|---:|"
                 + ("---|---:|" if floored else "")]
        for n in counts:
            for target in args.targets:
                t = key(target)
                cells = []
                for algo in shown:
                    s = by_algo[algo].get(n)
                    ttt = s and s["time_to_target_s"][t]
                    cells.append(f"{ttt[0]:.1f} ± {ttt[1]:.1f}" if ttt else
                                 f"- ({s['reached'][t]}/{s['seeds']})" if s else "")
                base = fastest(by_algo, n, t, lambda a: not is_interval(a) and a != "sequential")
                best = fastest(by_algo, n, t, is_interval)
                hogwild = fastest(by_algo, n, t, lambda a: a == "hogwild")
                ratio = best[1] / base[1] if best and base else None
                to_hogwild = best[1] / hogwild[1] if best and hogwild else None
                row = {"lr": lr, "threads": n, "target": t, "baseline": base,
                       "interval": best, "ratio": ratio, "ratio_to_hogwild": to_hogwild}
                base_text = f"{base[0]} {base[1]:.1f}" if base else "none reached"
                ratio_text = f"{ratio:.2f} ({best[0]})" if ratio else "-"
                hogwild_text = f"{to_hogwild:.2f}" if to_hogwild else "-"
                line = (f"| {n} | {100 * target:.0f}% | " + " | ".join(cells) +
                        f" | {base_text} | {ratio_text} | {hogwild_text} |")
                if floored:
                    floor = fastest(by_algo, 2, t, lambda a: a != "sequential")
                    to_floor = best[1] / floor[1] if best and floor else None
                    row.update(floor=floor, ratio_to_floor=to_floor)
                    line += (f" {floor[0]} {floor[1]:.1f} |" if floor else " - |") + (
                        f" {to_floor:.2f} |" if to_floor else " - |")
                rows.append(row)
                lines.append(line)
        blocks.append("\n".join(lines))
    return rows, "\n\n".join(blocks)


def plot(summary: dict, runs: dict, args: argparse.Namespace, out: Path) -> list[Path]:
    """The PNG figures (a time-to-target figure per target); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    paths = []
    largest = max(args.threads)
    ticks = sorted({n for by_algo in summary.values() for by_n in by_algo.values()
                    for n in by_n} | set(args.threads))
    several = len(summary) > 1
    algos = list(dict.fromkeys(a for by_algo in summary.values() for a in by_algo))
    styles = ["-", "--", ":", "-."]
    # one line per (lr, algorithm): colour by algorithm, line style by lr
    groups = [(lr, algo, by_n, dict(color=f"C{algos.index(algo) % 10}",
                                    ls=styles[i % len(styles)],
                                    label=f"{algo} lr {lr}" if several else algo))
              for i, (lr, by_algo) in enumerate(summary.items())
              for algo, by_n in by_algo.items()]

    def save(fig, name: str) -> None:
        if args.simulate:
            fig.suptitle("SIMULATED", color="firebrick", fontsize=9, x=0.99, ha="right")
        path = out.with_name(f"{out.name}-{name}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(6, 4))
    for _, _, by_n, style in groups:
        ns = sorted(by_n)
        ax.plot(ns, [by_n[n]["samples_per_s"][0] for n in ns], marker="o", **style)
    ax.set(xlabel="threads", ylabel="applied samples/s (median)", xscale="log", xticks=ticks,
           xticklabels=ticks, title="Throughput")
    ax.legend(fontsize=7)
    save(fig, "throughput")

    for target in args.targets:
        t = key(target)
        fig, ax = plt.subplots(figsize=(6, 4))
        for _, _, by_n, style in groups:
            ns = [n for n in sorted(by_n) if by_n[n]["time_to_target_s"][t]]
            ax.errorbar(ns, [by_n[n]["time_to_target_s"][t][0] for n in ns],
                        yerr=[by_n[n]["time_to_target_s"][t][1] for n in ns], marker="o",
                        capsize=3, **style)
        ax.set(xlabel="threads", ylabel="seconds", xscale="log", xticks=ticks,
               xticklabels=ticks,
               title=f"Time to {100 * target:.0f}% test accuracy (mean ± std)")
        ax.legend(fontsize=7)
        save(fig, "time-to-target" if len(args.targets) == 1
             else f"time-to-target-{100 * target:.0f}")

    fig, ax = plt.subplots(figsize=(6, 4))
    for lr, algo, _, style in groups:
        for i, run in enumerate(runs_of(runs, algo, largest, float(lr))):
            points = accuracy_points(run)
            t, acc = zip(*points, strict=True) if points else ((), ())
            ax.plot(t, acc, alpha=0.8, **{**style, "label": style["label"] if i == 0 else None})
    for target in args.targets:
        ax.axhline(target, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="training seconds", ylabel="test accuracy",
           title=f"Test accuracy over time, {largest} threads")
    ax.legend(fontsize=7)
    save(fig, "accuracy")

    fig, ax = plt.subplots(figsize=(6, 4))
    for lr, algo, _, style in groups:
        hist = [0]
        for run in runs_of(runs, algo, largest, float(lr)):
            h = run["staleness_hist"]
            hist = [a + b for a, b in zip(hist + [0] * (len(h) - len(hist)),
                                          h + [0] * (len(hist) - len(h)), strict=True)]
        total = sum(hist) or 1
        ax.plot(range(len(hist)), [c / total for c in hist], drawstyle="steps-mid", **style)
    ax.set(xlabel="staleness tau", ylabel="share of applied updates", yscale="log",
           title=f"Staleness distribution, {largest} threads")
    ax.legend(fontsize=7)
    save(fig, "staleness")
    return paths


def threads_of(algo: str, args: argparse.Namespace) -> list[int]:
    """The thread counts an algorithm runs at: sequential at 1 alone
    (whatever --threads says), the others at every one of --threads."""
    return [1] if algo == "sequential" else list(args.threads)


def run_sweep(args: argparse.Namespace, out: Path) -> tuple[dict, float]:
    """Every (learning rate, algorithm, threads, seed) run, one at a time,
    each saved in <out>.partial.json as it finishes. Returns the runs by
    algorithm and thread count, and the seconds the sweep took."""
    if args.quick:
        data = datasets.synthetic(seed=0, n_train=2000, n_test=300)
    else:
        data = datasets.load(args.dataset, args.data_dir, args.archive)
    model = models.build(args.model, args.dataset)
    simulation = None
    if args.simulate:
        if args.sim_step_ms is None:
            times = sim.measure_step_times(model, data, args.batch_size)
            step_time, steps = sim.measured_steps(times), (
                f"measured here, mean {1e3 * times.mean():.2f} ms")
        else:
            step_time = sim.lognormal_steps(args.sim_step_ms / 1e3, args.sim_step_spread)
            steps = f"lognormal, mean {args.sim_step_ms:g} ms, spread {args.sim_step_spread:g}"
        costs = sim.Costs(contention=args.sim_contention, switch_s=args.sim_switch)
        simulation = (step_time, args.sim_cores, costs)
        cores = f"{args.sim_cores} cores" if args.sim_cores else "one core per worker"
        print(f"SIMULATED runs: step times {steps}; {cores}; contention "
              f"{args.sim_contention:g}, switch {args.sim_switch:g} s")
    partial = named(out, ".partial.json")
    runs, seconds_before = finished_runs(partial, args) if args.resume else ({}, 0.0)
    counts = list(dict.fromkeys([1, *args.threads]))  # sequential's one thread first
    combos = [(lr, a, n) for lr in args.lrs for n in counts for a in args.algos
              if n in threads_of(a, args)]
    todo = sum(max(args.seeds - len(runs_of(runs, a, n, lr)), 0) for lr, a, n in combos)
    total = "" if args.simulate or args.epochs is not None else (
        f": {todo * args.time_budget / 60:.0f} min plus evaluation")
    print(f"{todo} runs of {run_length(args)} each{total}", flush=True)
    t_start = time.perf_counter()
    # seed by seed, every combination once per pass: the machine's speed
    # drifts (a VM's neighbours), and a drift then shifts every algorithm
    # and thread count alike instead of whichever ran in the slow hour
    done = 0
    for seed in range(args.seeds):
        for lr, algo, n in combos:
            if len(runs_of(runs, algo, n, lr)) > seed:
                continue  # finished before a resume
            done += 1
            lr_text = f" lr={lr:g}" if len(args.lrs) > 1 else ""
            print(f"[{done}/{todo}] {algo} n={n}{lr_text} seed={seed} ...", end=" ",
                  flush=True)
            run = undisturbed_run(args, model, data, config_for(args, algo, n, seed, lr),
                                  simulation)
            runs.setdefault(algo, {}).setdefault(n, []).append(run)
            # after every run, so an interrupted sweep loses at most one run
            sweeps.write(partial, {
                "options": sweep_options(args), "runs": runs,
                "seconds": seconds_before + time.perf_counter() - t_start})
            print(f"{run['samples_per_s']:,.0f} samples/s, "
                  f"acc {100 * (run['final_accuracy'] or 0):.1f}%", flush=True)
    return runs, seconds_before + time.perf_counter() - t_start


RETRIES = 5  # reruns of a run other processes disturbed, before it is kept as it is
QUIET_PROBE_S = 2.0  # how long the machine is watched before a run


def machine_cpu_s() -> tuple[float, float] | None:
    """CPU seconds used so far: by the whole machine (every CPU and
    process, time stolen by the hypervisor included) and by this process
    alone. None where /proc/stat does not exist."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields)
    own = os.times()
    return ((user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"),
            own.user + own.system)


def foreign_share(before: tuple[float, float] | None, after: tuple[float, float] | None,
                  wall_s: float, cpus: int | None = None) -> float | None:
    """Share (0..1) of the machine's CPUs that other processes used between
    two machine_cpu_s() readings wall_s seconds apart; None if unknown."""
    if before is None or after is None or wall_s <= 0:
        return None
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(others, 0.0) / (wall_s * (cpus or os.cpu_count() or 1))


def wait_until_quiet(max_share: float) -> None:
    """Return once other processes use at most max_share of the CPUs over
    QUIET_PROBE_S; say so while waiting."""
    said = 0.0
    while True:
        before, t0 = machine_cpu_s(), time.perf_counter()
        time.sleep(QUIET_PROBE_S)
        share = foreign_share(before, machine_cpu_s(), time.perf_counter() - t0)
        if share is None or share <= max_share:
            return
        if time.perf_counter() - said > 60:
            print(f"(waiting: other processes use {share:.0%} of the CPUs) ", end="",
                  flush=True)
            said = time.perf_counter()


def undisturbed_run(args: argparse.Namespace, model, data, cfg: engine.TrainConfig,
                    simulation) -> dict:
    """run_one on a quiet machine: a real run that other processes
    disturbed beyond --max-foreign is run again (RETRIES times at most; the
    last one is kept, with its foreign_cpu share saying how disturbed)."""
    for attempt in range(RETRIES + 1):
        checked = simulation is None and args.max_foreign < 1
        if checked:
            wait_until_quiet(args.max_foreign)
        before, t0 = machine_cpu_s(), time.perf_counter()
        run = run_one(model, data, cfg, args.targets, simulation,
                      stop_at=max(args.targets) if args.stop_at_target else None)
        run["foreign_cpu"] = foreign_share(before, machine_cpu_s(), time.perf_counter() - t0)
        if not checked or run["foreign_cpu"] is None or run["foreign_cpu"] <= args.max_foreign:
            return run
        if attempt < RETRIES:
            print(f"disturbed (other processes used {run['foreign_cpu']:.0%} of the CPUs), "
                  "again ...", end=" ", flush=True)
    return run


def rescored_runs(args: argparse.Namespace) -> tuple[argparse.Namespace, dict, dict]:
    """--from-results: the runs of a finished sweep (older files too), to be
    scored for these --targets (default: the sweep's own). Returns the
    sweep's options (with the targets, name and output folder), its runs
    and the saved document."""
    path = Path(args.from_results)
    saved = read_sweep(path, "--from-results")
    options, runs = sweeps.upgraded(saved["options"]), saved["runs"]
    keep = {"targets": args.targets or options["targets"], "out_dir": args.out_dir,
            "name": args.name or path.stem}
    args = argparse.Namespace(**{**options, **keep, "from_results": str(path)})
    return args, runs_by_threads(runs, options), saved


def write_report(args: argparse.Namespace, runs: dict, out: Path, facts: dict) -> dict:
    """Score every run for args.targets; print the tables; write <out>.json,
    <out>.md and the plots. facts: machine, date and sweep_seconds of the
    sweep. Returns the JSON document."""
    for by_n in runs.values():
        for rs in by_n.values():
            for run in rs:
                score(run, args.targets)
    summary = {key(lr): {a: {n: summarise(runs_of(runs, a, n, lr), args.targets)
                             for n in by_n if runs_of(runs, a, n, lr)}
                         for a, by_n in runs.items()}
               for lr in args.lrs}
    summary = {lr: {a: by_n for a, by_n in by_algo.items() if by_n}
               for lr, by_algo in summary.items()}
    headline_rows, headline_text = headline(summary, args)
    text = headline_text + "\n\n" + table(summary, args)
    if args.simulate:
        text = ("SIMULATED (iasgd.executors.simulated): times and throughput are "
                "simulated\n\n" + text)
    print(text)
    document = {"options": dict(vars(args)), "simulated": bool(args.simulate), **facts,
                "summary": {lr: {a: {str(n): s for n, s in by_n.items()}
                                 for a, by_n in by_algo.items()}
                            for lr, by_algo in summary.items()},
                "headline": headline_rows,
                "runs": {a: {str(n): rs for n, rs in by_n.items()} for a, by_n in runs.items()}}
    sweeps.write(named(out, ".json"), document)
    named(out, ".md").write_text(text + "\n")
    paths = plot(summary, runs, args, out)
    print(f"wrote {named(out, '.json')}, {named(out, '.md')} and "
          f"{', '.join(p.name for p in paths)}")
    return json.loads(named(out, ".json").read_text())


def named(out: Path, suffix: str) -> Path:
    """`out` (the results' path, no suffix: --out-dir/--name) with `suffix`
    appended: a name with a dot (sweep-lr0.01) keeps all of it."""
    return out.with_name(out.name + suffix)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.from_results:
        args, runs, saved = rescored_runs(args)
        # an interrupted sweep's <name>.partial.json has its seconds, not the facts
        facts = {"machine": saved.get("machine"), "date": saved.get("date"),
                 "sweep_seconds": saved.get("sweep_seconds", saved.get("seconds"))}
    out = Path(args.out_dir) / args.name
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.from_results:
        return write_report(args, runs, out, facts)
    runs, seconds = run_sweep(args, out)
    facts = {"machine": results.machine_info(), "date": time.strftime("%Y-%m-%d"),
             "sweep_seconds": seconds}
    document = write_report(args, runs, out, facts)
    named(out, ".partial.json").unlink(missing_ok=True)
    return document


if __name__ == "__main__":
    main()
