"""Thread scaling of the parallel algorithms on this machine, side by side.

    python bench/threads.py [--updates 2000] [--repeats 3] [--many 16]

LeNet-5 on CIFAR-10-shaped synthetic data, b=16. For each algorithm: applied
samples/s with 1, 2 and --many threads (median of the repeats), the ratios
2 threads / 1 thread and many / 2, what the drop gate throws away, and the
fraction of worker time spent holding the GIL. Then the cost of one
uncontended pass through the interval gate (ticket, slot, apply).
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

CASES = [  # label, algo, extra config
    ("hogwild", "hogwild", {}),
    ("interval y=16 wait", "interval", {"interval": 16, "gate": "wait"}),
    ("interval y=16 drop", "interval", {"interval": 16, "gate": "drop"}),
    ("async (lock)", "async", {}),
    ("sync", "sync", {}),
]


def measure(model, data, algo: str, counts: tuple[int, ...], extra: dict, repeats: int):
    """Median applied samples/s for each thread count, and each count's last
    result. The counts take turns within each repetition, so that a drift of
    the machine's speed hits them all alike."""
    rates: dict[int, list[float]] = {n: [] for n in counts}
    last = {}
    for r in range(repeats):
        for n in counts:
            cfg = engine.TrainConfig(algo=algo, threads=n, epochs=1, seed=r, **extra)
            last[n] = engine.train(model, data, cfg)
            rates[n].append(last[n].samples / last[n].train_time_s)
    return {n: statistics.median(v) for n, v in rates.items()}, last


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
    args = ap.parse_args()

    b = 16
    data = datasets.synthetic(seed=0, n_train=args.updates * b, n_test=100)
    model = models.build("lenet", "synthetic")
    print(f"LeNet-5, b={b}, {args.updates} updates per run, median of {args.repeats}; "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    print(f"| algorithm | 1 thread | 2 threads | {args.many} threads | 2 vs 1 | "
          f"{args.many} vs 2 | accepted at {args.many} | GIL at 2 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, algo, extra in CASES:
        rates, last = measure(model, data, algo, (1, 2, args.many), extra, args.repeats)
        one, two, many = rates[1], rates[2], rates[args.many]
        r2, rm = last[2], last[args.many]
        accepted = rm.applied / rm.computed
        print(f"| {label} | {one:,.0f} | {two:,.0f} | {many:,.0f} | {two / one:.2f}x | "
              f"{many / two:.2f}x | {100 * accepted:.0f}% | {100 * r2.gil_fraction:.3f}% |")
    print(f"interval gate, one uncontended update (ticket + slot + apply): "
          f"{gate_ns_per_update():.1f} ns")


if __name__ == "__main__":
    main()
