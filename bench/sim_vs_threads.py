"""The simulator against real threads on this machine, in small runs
repeated: how close their staleness is, and how the machine's load moves it.

    python bench/sim_vs_threads.py [--repeats 3]

LeNet-5 on synthetic data (8,000 samples, b=16: one epoch of 500 updates),
lr 0.02, the five runs tests/executors/test_simulated.py makes on both (the
test checks what holds whatever the load; the agreement itself depends on
it, so it is measured here). Each run is made --repeats times on real
threads (seeds 0, 1, ...) and in the simulator given min(threads, CPUs)
cores and step times measured here, with the same seeds. Prints per run:
mean staleness real (median and range over the repeats) and simulated, the
total variation distance of the pooled distributions (bench/sim_vs_real.py),
the first-epoch loss, and whether the medians agree within 30 % + 0.3 (the
test's old tolerance); and the share of the CPUs that other processes used
meanwhile (bench/scaling.py's measure).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sim_vs_real  # bench/, beside this file
from scaling import foreign_share, machine_cpu_s

from iasgd import data as datasets
from iasgd import engine
from iasgd.executors import simulated as sim
from iasgd.nn import models

CASES = [  # label, algo, threads, extra config
    ("hogwild, 2 threads", "hogwild", 2, {}),
    ("hogwild, 8 threads", "hogwild", 8, {}),
    ("interval y=4 wait, 2 threads", "interval", 2, {"interval": 4, "gate": "wait"}),
    ("interval y=4 wait, 8 threads", "interval", 8, {"interval": 4, "gate": "wait"}),
    ("interval decay from y0=8, 8 threads", "interval", 8,
     {"interval_schedule": "decay", "y0": 8, "y_min": 2, "decay_every": 100, "decay_by": 2}),
]


def mean_tau(hist) -> float:
    hist = np.asarray(hist, float)
    return float(np.dot(np.arange(hist.size), hist) / hist.sum())


def compare(model, data, step_times, algo: str, threads: int, extra: dict,
            repeats: int) -> dict:
    """Real and simulated runs of one case, seed by seed."""
    cores = min(threads, os.cpu_count() or 1)
    real, simulated = [], []
    for seed in range(repeats):
        cfg = engine.TrainConfig(algo=algo, threads=threads, epochs=1, lr=0.02, seed=seed,
                                 **extra)
        real.append(engine.train(model, data, cfg))
        simulated.append(sim.simulate(model, data, cfg, sim.measured_steps(step_times),
                                      cores=cores))
    real_tau = [mean_tau(r.staleness_hist) for r in real]
    sim_tau = [mean_tau(r.staleness_hist) for r in simulated]
    pooled = [sim_vs_real.pooled_hist([{"staleness_hist": r.staleness_hist.tolist()}
                                       for r in runs]) for runs in (real, simulated)]
    return {"real_tau": real_tau, "sim_tau": sim_tau,
            "total_variation": sim_vs_real.total_variation(*pooled),
            "real_loss": statistics.median(r.epochs[0].train_loss for r in real),
            "sim_loss": statistics.median(r.epochs[0].train_loss for r in simulated)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    data = datasets.synthetic(seed=0, n_train=8000, n_test=300)
    model = models.build("lenet", "synthetic")
    step_times = sim.measure_step_times(model, data, 16, 100)
    print(f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{args.repeats} seeds; one step alone {1000 * float(np.median(step_times)):.2f} ms")
    print("| run | mean tau real: median (range) | simulated | TV distance | "
          "first-epoch loss real / sim | within 30 % + 0.3 |")
    print("|---|---:|---:|---:|---:|---|")
    out = {}
    before, t0 = machine_cpu_s(), time.perf_counter()
    for label, algo, threads, extra in CASES:
        c = out[label] = compare(model, data, step_times, algo, threads, extra, args.repeats)
        real, simulated = statistics.median(c["real_tau"]), statistics.median(c["sim_tau"])
        ok = abs(simulated - real) <= 0.3 * real + 0.3
        print(f"| {label} | {real:.2f} ({min(c['real_tau']):.2f}-{max(c['real_tau']):.2f}) "
              f"| {simulated:.2f} | {c['total_variation']:.2f} "
              f"| {c['real_loss']:.2f} / {c['sim_loss']:.2f} | {'yes' if ok else 'no'} |")
    foreign = foreign_share(before, machine_cpu_s(), time.perf_counter() - t0)
    share = f"{foreign:.0%}" if foreign is not None else "an unknown share"
    print(f"other processes used {share} of the CPUs meanwhile")
    return out


if __name__ == "__main__":
    main()
