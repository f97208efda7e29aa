"""Thread scaling of the parallel algorithms on this machine, side by side.

    python bench/threads.py [--updates 2000] [--repeats 3] [--many 16] [--cases hogwild,...]
                            [--model lenet]

LeNet-5 (or --model) on CIFAR-10-shaped synthetic data, b=16. For each algorithm: applied
samples/s with 1, 2 and --many threads (median of the repeats), the ratios
2 threads / 1 thread and many / 2, each thread count's rate against the
first algorithm's at the same count, what the drop gate throws away, and the
fraction of worker time spent holding the GIL. Every algorithm and thread
count runs once per repetition, in turn, so that a drift of the machine's
speed hits them all alike. Then the cost of one uncontended pass through
the interval gate (ticket, slot, apply).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numba as nb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iasgd import data as datasets
from iasgd import engine
from iasgd.nn import models
from iasgd.protocol import gate as G

CASES = {  # --cases name: label, algo, extra config
    "hogwild": ("hogwild", "hogwild", {}),
    "interval-y16": ("interval y=16 wait", "interval", {"interval": 16, "gate": "wait"}),
    # what y = 32 per active worker (interval-per-core) gives 2 workers
    "interval-y64": ("interval y=64 wait", "interval", {"interval": 64, "gate": "wait"}),
    "interval-y16-drop": ("interval y=16 drop", "interval", {"interval": 16, "gate": "drop"}),
    "async": ("async (lock)", "async", {}),
    "sync": ("sync", "sync", {}),
}


def measure(model, data, cases: list, counts: tuple[int, ...], repeats: int):
    """Median applied samples/s of each case (label, algo, extra config) and
    thread count, and the last result of each. Every case and count runs
    once per repetition, in turn."""
    rates: dict[tuple[str, int], list[float]] = {}
    last = {}
    for r in range(repeats):
        for label, algo, extra in cases:
            for n in counts:
                cfg = engine.TrainConfig(algo=algo, threads=n, epochs=1, seed=r, **extra)
                last[label, n] = engine.train(model, data, cfg)
                rates.setdefault((label, n), []).append(
                    last[label, n].samples / last[label, n].train_time_s)
    return {key: statistics.median(v) for key, v in rates.items()}, last


@nb.njit(cache=True)
def _gate_round_trips(state, rounds):
    for _ in range(rounds):
        G.take_ticket(state)
        G.try_slot(state)
        G.begin_apply(state)
        G.finish_apply(state)


def gate_ns_per_update(rounds: int = 2_000_000) -> float:
    state = G.new_state(16, limit=10 * rounds)
    _gate_round_trips(state, 10)
    t0 = time.perf_counter()
    _gate_round_trips(state, rounds)
    return (time.perf_counter() - t0) / rounds * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=2000, help="applied updates per run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--many", type=int, default=16, help="the oversubscribed thread count")
    ap.add_argument("--cases", default=",".join(CASES),
                    help="which, comma-separated (the first is the others' reference)")
    ap.add_argument("--model", default="lenet", help="a preset or a layer spec")
    args = ap.parse_args()

    b = 16
    data = datasets.synthetic(seed=0, n_train=args.updates * b, n_test=100)
    model = models.build(args.model, "synthetic")
    print(f"{args.model}, b={b}, {args.updates} updates per run, median of {args.repeats}; "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        ap.error(f"unknown --cases {', '.join(sorted(unknown))}; choose from {', '.join(CASES)}")
    cases = [CASES[name] for name in args.cases.split(",")]
    counts = (1, 2, args.many)
    rates, last = measure(model, data, cases, counts, args.repeats)
    first = cases[0][0]
    print(f"| algorithm | 1 thread | 2 threads | {args.many} threads | 2 vs 1 | "
          f"{args.many} vs 2 | vs {first} at 1 / 2 / {args.many} | accepted at {args.many} "
          "| GIL at 2 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, _, _ in cases:
        one, two, many = (rates[label, n] for n in counts)
        against = " / ".join(f"{rates[label, n] / rates[first, n]:.3f}" for n in counts)
        r2, rm = last[label, 2], last[label, args.many]
        accepted = rm.applied / rm.computed
        print(f"| {label} | {one:,.0f} | {two:,.0f} | {many:,.0f} | {two / one:.2f}x | "
              f"{many / two:.2f}x | {against} | {100 * accepted:.0f}% | "
              f"{100 * r2.gil_fraction:.3f}% |")
    print(f"interval gate, one uncontended update (ticket + slot + apply): "
          f"{gate_ns_per_update():.1f} ns")


if __name__ == "__main__":
    main()
