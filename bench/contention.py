"""What cores cost each other: the simulator's contention model, measured.

    python bench/contention.py                       # this machine, synthetic data
    python bench/contention.py --threads 1,2,4,8,16,32,64,128 --dataset cifar10 \\
        --archive ../shared/data/cifar-10-jpeg-python.tar.gz

The simulator (iasgd.executors.simulated.Costs, docs/simulator.md) draws
each step's time from single-thread measurements and adds two costs of the
machine:

- contention C: a step that begins while k cores run workers takes
  (1 + C (k - 1)) times its single-thread time: the cores share the
  parameter array's cache lines (every update writes P parameters and P
  velocities that the other cores read) and the memory bandwidth;
- switch S: CPU seconds a worker loses each time it gets a core back
  after other workers ran there (cold caches), when workers outnumber
  cores.

This script measures what they model: Hogwild! at each thread count of
--threads for --updates applied updates on real threads, giving the time of
one step on one core, `per-core step = busy cores * b / samples per s` with
busy cores = min(threads, CPUs), against one thread alone. Then

- up to one thread per CPU, C(k) = (step(k) / step(1) - 1) / (k - 1) for
  each k: the model says C(k) is one constant; on a 16-core machine the row
  of C(k) for k = 2 .. 16 is the validation (a C that grows or falls with k
  means the linear model is wrong there, and by how much);
- beyond one thread per CPU, with time slices of --quantum seconds, the
  switch cost that explains the slower steps:
  S(n) = quantum * (1 - step(CPUs) / step(n)) (a slice that holds
  (quantum - S) / step(CPUs) steps of the uncontended length).

Prints a table and the flags to give `python -m iasgd.run --simulate` (or
Costs) for this machine, and the share of the CPUs other processes used
meanwhile: the figures depend on the load, measure on a quiet machine.
Nothing in the test suite depends on this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scaling import foreign_share, machine_cpu_s  # noqa: E402

from iasgd import data as datasets  # noqa: E402
from iasgd import engine, files  # noqa: E402
from iasgd.executors import simulated as sim  # noqa: E402
from iasgd.nn import models  # noqa: E402


def per_core_step_s(model, data, threads: int, updates: int, batch: int, seed: int) -> float:
    """Seconds of one Hogwild! step on one core with `threads` real threads:
    busy cores * b / samples per second over `updates` applied updates."""
    n_train = updates * batch  # one epoch of exactly `updates` updates
    sub = datasets.Dataset(data.name, data.x_train[:n_train], data.y_train[:n_train],
                           data.x_test[:16], data.y_test[:16], data.num_classes)
    cfg = engine.TrainConfig(algo="hogwild", threads=threads, epochs=1, batch_size=batch,
                             lr=0.001, seed=seed)
    r = engine.train(model, sub, cfg)
    busy = min(threads, os.cpu_count() or 1)
    return busy * r.train_time_s / r.applied


def fit(steps: dict[int, float], single: float, cpus: int, quantum: float) -> dict:
    """C(k) up to one thread per CPU and S(n) beyond it (module doc)."""
    contention = {k: (s / single - 1) / (k - 1) for k, s in steps.items() if 1 < k <= cpus}
    full = steps.get(min(max(steps), cpus))
    switch = {n: quantum * (1 - full / s) for n, s in steps.items() if n > cpus and full}
    return {"contention": contention, "switch_s": switch,
            "C": statistics.median(contention.values()) if contention else 0.0,
            "S": max(statistics.median(switch.values()), 0.0) if switch else 0.0}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2,4,8,16,32,64,128")
    p.add_argument("--dataset", default="synthetic", choices=datasets.DATASETS)
    p.add_argument("--archive", default=None)
    p.add_argument("--model", default="lenet")
    p.add_argument("--updates", type=int, default=3000, help="applied updates per measurement")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="measurements per thread count "
                                                          "(the median is kept)")
    p.add_argument("--quantum", type=float, default=0.004,
                   help="the time slice the switch cost is fitted for (s)")
    p.add_argument("--out", default=None, help="write the figures to this JSON file")
    args = p.parse_args(argv)
    threads = sorted({int(t) for t in args.threads.split(",")})
    data = (datasets.synthetic(seed=0, n_train=args.updates * args.batch_size, n_test=16)
            if args.dataset == "synthetic"
            else datasets.load(args.dataset, archive=args.archive))
    model = models.build(args.model, data.name if args.dataset != "synthetic" else "synthetic")
    cpus = os.cpu_count() or 1
    single = float(statistics.median(sim.measure_step_times(model, data, args.batch_size, 300)))
    read_s, apply_s = sim.measure_sections(model)
    before, t0 = machine_cpu_s(), time.perf_counter()
    steps = {}
    print(f"{cpus} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, {model.num_params:,} parameters; "
          f"one step alone (sim.measure_step_times) {1e3 * single:.3f} ms; "
          f"copy {1e6 * read_s:.1f} us, write {1e6 * apply_s:.1f} us")
    print("| threads | per-core step (ms), median (range) | / one thread alone |")
    print("|---:|---:|---:|")
    for n in threads:
        runs = [per_core_step_s(model, data, n, args.updates, args.batch_size, seed)
                for seed in range(args.repeats)]
        steps[n] = statistics.median(runs)
        print(f"| {n} | {1e3 * steps[n]:.3f} ({1e3 * min(runs):.3f}-{1e3 * max(runs):.3f}) "
              f"| {steps[n] / single:.2f} |", flush=True)
    foreign = foreign_share(before, machine_cpu_s(), time.perf_counter() - t0)
    f = fit(steps, steps.get(1, single), cpus, args.quantum)
    print("C(k):", ", ".join(f"{k}: {c:.3f}" for k, c in f["contention"].items()) or "-")
    print("S(n):", ", ".join(f"{n}: {1e3 * s:.2f} ms" for n, s in f["switch_s"].items()) or "-")
    print(f"--sim-contention {f['C']:.3f} --sim-switch {f['S']:.5f} "
          f"(other processes used {'?' if foreign is None else f'{foreign:.0%}'} of the CPUs)")
    document = {"cpus": cpus, "date": time.strftime("%Y-%m-%d %H:%M"), "model": model.spec,
                "single_step_s": single, "read_s": read_s, "apply_s": apply_s,
                "per_core_step_s": steps, "fit": f, "foreign_cpu": foreign,
                "options": vars(args)}
    if args.out:
        files.write_json_atomic(Path(args.out), json.loads(json.dumps(document)))
    return document


if __name__ == "__main__":
    main()
