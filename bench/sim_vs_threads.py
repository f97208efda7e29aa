"""Real threads against the simulator, algorithm by algorithm and thread
count by thread count: how close their staleness and accuracy are.

    python bench/sim_vs_threads.py                    # synthetic data, LeNet-5
    python bench/sim_vs_threads.py --dataset cifar10 \\
        --archive ../shared/data/cifar-10-jpeg-python.tar.gz --epochs 2 --seeds 3
    python bench/sim_vs_threads.py --recorded bench/results/cifar10-2-128.json

Run mode (the default): each algorithm of --algos at each thread count of
--threads runs --seeds times on real threads of this machine and in the
simulator given this machine's cores (min(threads, CPUs)), step times
measured here (single-thread), async's critical sections measured here,
time slices of --quantum and the costs --contention and --switch
(docs/simulator.md; bench/contention.py measures them). Both run the same
epochs of updates with the same --eval-every, so their evaluations fall on
the same updates. Prints, per algorithm and thread count: mean, p90 and max
staleness (real / simulated, pooled over seeds), the total variation
distance of the pooled distributions, the mean and largest absolute
difference of the test accuracy (mean over seeds) over the evaluation
points, the throughput, and whether the goal (TV <= 0.15, mean accuracy
difference <= 2 points) is met; then the accuracy at each evaluation point.
The real side depends on the machine's load: the share of the CPUs other
processes used meanwhile is printed; measure on a quiet machine.

Recorded mode (--recorded SWEEP): staleness only, against a real sweep of
bench/scaling.py already run (its runs, eval_every, batch size and
variants' knobs). Each algorithm is simulated on a tiny model (staleness
depends on the timing, not on the model; a schedule that steers by the
loss, probe or elastic, is marked as approximate) with the per-core step
time of the recorded runs (busy cores * b / samples per s) or, with
--step-ms, that single-thread time and the costs. No real run is made.

Writes bench/results/<name>.json and <name>.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import sim_vs_real  # noqa: E402  (bench/, beside this file)
from scaling import foreign_share, machine_cpu_s  # noqa: E402

from iasgd import data as datasets  # noqa: E402
from iasgd import engine, files, sweeps  # noqa: E402
from iasgd.algorithms import sweep_variant  # noqa: E402
from iasgd.config import config_where_it_applies  # noqa: E402
from iasgd.executors import simulated as sim  # noqa: E402
from iasgd.nn import models  # noqa: E402

GOAL_TV, GOAL_ACC = 0.15, 0.02  # issue 22: TV distance, mean |accuracy difference|
LOSS_STEERED = ("interval-probe", "elastic")  # their schedules read the loss
KNOBS = ("batch_size", "lr", "momentum", "interval", "gate", "y0", "y_min", "decay_every",
         "decay_by", "probe_offset", "probe_step", "probe_steps", "exec_steps", "window")


def variant_config(name: str, threads: int, seed: int, **fields) -> engine.TrainConfig:
    """The TrainConfig of sweep variant `name` (iasgd.algorithms.sweep_variant)."""
    variant = sweep_variant(name)
    if variant is None:
        raise SystemExit(f"sim_vs_threads.py: unknown algorithm {name!r}")
    return config_where_it_applies(threads=threads, seed=seed, **{**fields, **variant})


def accuracy_points(runs: list) -> dict[int, float]:
    """{applied: mean test accuracy over runs} at the evaluation points every run has."""
    by_run = [{int(a): acc for _, a, acc in r.evals} for r in runs]
    common = set.intersection(*(set(b) for b in by_run))
    return {a: statistics.mean(b[a] for b in by_run) for a in sorted(common)}


def agreement(real_hists: list, sim_hists: list, real_acc: dict, sim_acc: dict) -> dict:
    """Staleness facts, TV distance and accuracy differences of one case."""
    pooled = [sim_vs_real.pooled_hist([{"staleness_hist": list(h)} for h in hists])
              for hists in (real_hists, sim_hists)]
    points = sorted(set(real_acc) & set(sim_acc))
    diffs = [abs(real_acc[a] - sim_acc[a]) for a in points]
    out = {"staleness": {"real": sim_vs_real.staleness_facts(pooled[0]),
                         "simulated": sim_vs_real.staleness_facts(pooled[1]),
                         "total_variation": sim_vs_real.total_variation(*pooled)},
           "accuracy": {"points": points, "real": [real_acc[a] for a in points],
                        "simulated": [sim_acc[a] for a in points],
                        "mean_abs_diff": statistics.mean(diffs) if diffs else None,
                        "max_abs_diff": max(diffs) if diffs else None}}
    acc_ok = out["accuracy"]["mean_abs_diff"] is None or out["accuracy"]["mean_abs_diff"] \
        <= GOAL_ACC
    out["goal_met"] = out["staleness"]["total_variation"] <= GOAL_TV and acc_ok
    return out


def row(algo: str, threads: int, c: dict) -> str:
    r, s = c["staleness"]["real"], c["staleness"]["simulated"]
    acc = c["accuracy"]
    diff = (f"{100 * acc['mean_abs_diff']:.1f} / {100 * acc['max_abs_diff']:.1f}"
            if acc.get("mean_abs_diff") is not None else "-")
    rate = c.get("samples_per_s")
    rate = f"{rate['real']:,.0f} / {rate['simulated']:,.0f}" if rate else "-"
    return (f"| {algo} | {threads} | {r['mean']:.1f} / {s['mean']:.1f} | {r['p90']} / {s['p90']} "
            f"| {r['max']} / {s['max']} | {c['staleness']['total_variation']:.2f} | {diff} "
            f"| {rate} | {'yes' if c['goal_met'] else 'no'}{c.get('note', '')} |")


HEADER = ["| algorithm | threads | mean tau real / sim | p90 | max | TV distance | "
          "mean / max abs acc diff (pt) | samples/s real / sim | goal |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---|"]


# ------------------------------------------------------------------ run mode


def run_mode(args: argparse.Namespace) -> dict:
    if args.dataset == "synthetic":
        data = datasets.synthetic(seed=0, n_train=args.n_train, n_test=1000)
        model = models.build(args.model, "synthetic")
    else:
        data = datasets.load(args.dataset, archive=args.archive)
        model = models.build(args.model, args.dataset)
    cpus = os.cpu_count() or 1
    step_times = sim.measure_step_times(model, data, args.batch_size, 200)
    read_s, apply_s = sim.measure_sections(model)
    costs = sim.Costs(contention=args.contention, switch_s=args.switch, read_s=read_s,
                      apply_s=apply_s, live_reads=not args.snapshot_reads,
                      slice_spread=args.slice_spread)
    print(f"{cpus} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, {args.seeds} seeds, "
          f"{args.dataset}, {args.epochs} epochs, eval every {args.eval_every}; one step alone "
          f"{1e3 * float(np.median(step_times)):.2f} ms; {costs}", flush=True)
    fields = {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
              "eval_every": args.eval_every}
    lines, out = [*HEADER], {}
    before, t0 = machine_cpu_s(), time.perf_counter()
    for threads in args.threads:
        for algo in args.algos:
            real, simulated = [], []
            for seed in range(args.seeds):
                cfg = variant_config(algo, threads, seed, **fields)
                real.append(engine.train(model, data, cfg))
                simulated.append(sim.simulate(model, data, cfg, sim.measured_steps(step_times),
                                              cores=min(threads, cpus), quantum=args.quantum,
                                              costs=costs))
            c = agreement([r.staleness_hist for r in real], [r.staleness_hist for r in simulated],
                          accuracy_points(real), accuracy_points(simulated))
            c["samples_per_s"] = {k: statistics.median(r.samples / r.train_time_s for r in rs)
                                  for k, rs in (("real", real), ("simulated", simulated))}
            out[f"{algo}@{threads}"] = c
            lines.append(row(algo, threads, c))
            print(lines[-1], flush=True)
    foreign = foreign_share(before, machine_cpu_s(), time.perf_counter() - t0)
    lines += ["", "Test accuracy at each evaluation point (updates: real / simulated, %):", ""]
    for case, c in out.items():
        acc = c["accuracy"]
        lines.append(f"- {case}: " + ", ".join(
            f"{a}: {100 * r:.1f} / {100 * s:.1f}"
            for a, r, s in zip(acc["points"], acc["real"], acc["simulated"], strict=True)))
    lines.append("")
    lines.append(f"other processes used {'?' if foreign is None else f'{foreign:.0%}'} of the "
                 f"CPUs meanwhile")
    return {"lines": lines, "cases": out, "foreign_cpu": foreign,
            "costs": dataclasses.asdict(costs),
            "single_step_s": float(np.median(step_times))}


# ------------------------------------------------------------- recorded mode


def simulated_staleness(name: str, threads: int, cores: int, step_s: float, options: dict,
                        epochs: int = 3, n_train: int = 50000, seed: int = 0,
                        quantum: float = 0.004, costs: sim.Costs | None = None) -> np.ndarray:
    """The staleness histogram of sweep variant `name` simulated on a tiny
    model (staleness depends on the timing only) with steps of `step_s`
    seconds (lognormal, spread 0.1), the sweep's `options` (eval_every,
    batch size and the variants' knobs)."""
    data = datasets.synthetic(seed=1, n_train=n_train, n_test=50, shape=(1, 4, 4),
                              num_classes=2)
    model = models.build("mlp", input_shape=(1, 4, 4), num_classes=2, hidden=(4,))
    fields = {k: options[k] for k in KNOBS if options.get(k) is not None}
    cfg = variant_config(name, threads, seed, epochs=epochs,
                         eval_every=options.get("eval_every") or 0, **fields)
    r = sim.simulate(model, data, cfg, sim.lognormal_steps(step_s, 0.1), cores=cores,
                     quantum=quantum, costs=costs)
    return r.staleness_hist


def recorded_mode(args: argparse.Namespace) -> dict:
    try:
        saved = sweeps.read(args.recorded, (*sweeps.PLOTTED, "samples_per_s"))
    except sweeps.SweepError as e:
        print(f"sim_vs_threads.py: --recorded {e}", file=sys.stderr)
        raise SystemExit(2) from None
    options, cpus = saved["options"], saved["machine"]["cpu_count"]
    costs = sim.Costs(contention=args.contention, switch_s=args.switch,
                      live_reads=not args.snapshot_reads, slice_spread=args.slice_spread)
    # the recorded per-core step time already holds what contention and switches cost
    scheduler_only = sim.Costs(live_reads=costs.live_reads, slice_spread=args.slice_spread)
    how = (f"single-thread steps of {args.step_ms} ms with {costs}" if args.step_ms
           else "per-core step times of the recorded runs")
    print(f"against {args.recorded} ({cpus} CPUs, eval every {options.get('eval_every')}); "
          f"simulated on a tiny model, {how}")
    lines, out = [*HEADER], {}
    for threads in args.threads:
        for algo in args.algos:
            runs = saved["runs"].get(algo, {}).get(str(threads))
            if not runs:
                continue
            cores = min(threads, cpus)
            rate = statistics.median(r["samples_per_s"] for r in runs)
            step = (args.step_ms / 1e3 if args.step_ms
                    else cores * options["batch_size"] / rate)
            hist = simulated_staleness(algo, threads, cores, step, options,
                                       quantum=args.quantum,
                                       costs=costs if args.step_ms else scheduler_only)
            c = agreement([r["staleness_hist"] for r in runs], [hist], {}, {})
            c["note"] = " (loss-steered: approximate)" if algo in LOSS_STEERED else ""
            out[f"{algo}@{threads}"] = c
            lines.append(row(algo, threads, c))
            print(lines[-1], flush=True)
    return {"lines": lines, "cases": out, "recorded": args.recorded}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="2,16,64,128",
                    type=lambda s: [int(t) for t in s.split(",")])
    ap.add_argument("--algos", default="hogwild,async,interval,interval-y64,interval-decay,sync",
                    type=lambda s: s.split(","))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--dataset", default="synthetic", choices=datasets.DATASETS)
    ap.add_argument("--archive", default=None)
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--n-train", type=int, default=16000, help="synthetic: training images")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--quantum", type=float, default=0.004, help="simulated time slice (s)")
    ap.add_argument("--contention", type=float, default=0.0, help="Costs.contention")
    ap.add_argument("--switch", type=float, default=0.0, help="Costs.switch_s (s)")
    ap.add_argument("--slice-spread", type=float, default=0.0, help="Costs.slice_spread")
    ap.add_argument("--snapshot-reads", action="store_true",
                    help="Costs.live_reads off: a step reads a snapshot when it begins")
    ap.add_argument("--recorded", default=None, help="a real sweep of bench/scaling.py: "
                                                     "staleness only, no real run")
    ap.add_argument("--step-ms", type=float, default=None,
                    help="recorded mode: single-thread step time instead of the recorded "
                         "runs' per-core one (with --contention and --switch)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    document = recorded_mode(args) if args.recorded else run_mode(args)
    document["options"] = dict(vars(args))
    name = args.name or f"sim-vs-threads-{'recorded' if args.recorded else args.dataset}"
    out = Path(args.out_dir) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    files.write_json_atomic(out.with_suffix(".json"), document)
    out.with_suffix(".md").write_text("\n".join(document["lines"]) + "\n")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return document


if __name__ == "__main__":
    main()
