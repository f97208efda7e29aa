"""How fast a run stops on this machine: Ctrl-C and the time budget, in
seconds, side by side with what the docs promise.

    python bench/latency.py [--repeats 5] [--threads 128] [--budget 2.0] [--warm 1.0]

LeNet-5 on CIFAR-10-shaped synthetic data (2,500 updates per epoch), hogwild
with --threads workers on however many cores this machine has, as
tests/protocol/test_workers.py runs them (the tests check the mechanism in
counts; the seconds depend on the machine's load, so they are measured
here). Each scenario runs --repeats times:

- Ctrl-C: a real SIGINT to this process after --warm seconds of training;
  the seconds from the signal until every worker has left and the
  checkpoint is taken, and the updates applied after the stop request (at
  most one per worker).
- time budget: a run with --budget seconds of training time; by how much its
  training time exceeds the budget (the steps in flight at the deadline,
  and the workers leaving).

Prints the median and the maximum of each beside its promise, and the share
of the CPUs that other processes used meanwhile (bench/scaling.py's measure;
the load average would count these runs' own 128 threads).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaling import foreign_share, machine_cpu_s  # bench/, beside this file

from iasgd import data as datasets
from iasgd import engine
from iasgd.executors import simulated as sim
from iasgd.executors import threads
from iasgd.nn import models
from iasgd.protocol import gate as G

CTRL_C_PROMISE_S = 0.1  # every worker gone, checkpoint taken (docs/performance.md)
BUDGET_PROMISE_S = 0.15  # training time at most budget + this (docs/performance.md)


def ctrl_c_once(model, data, n: int, warm_s: float) -> tuple[float, int]:
    """One run stopped by a real SIGINT after warm_s seconds: (seconds from
    the signal to the checkpoint, updates applied after the stop request)."""
    run = threads.ThreadedRun(model, data, engine.TrainConfig(algo="hogwild", threads=n,
                                                              epochs=100))
    state, box = run.team.state, {}

    def should_stop():
        if "flag" not in box:
            return None
        if "v" not in box:  # the request the executor makes on this answer, counted here
            G.request_stop(state)
            box["v"] = int(G.read_version(state))
        return "interrupted"

    def interrupt():
        time.sleep(warm_s)
        box["sent"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    hooks = engine.Hooks(should_stop=should_stop,
                         on_checkpoint=lambda snap: box.setdefault("saved", time.monotonic()))
    previous = signal.signal(signal.SIGINT, lambda signum, frame: box.setdefault("flag", True))
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        result = run.run(hooks)
    finally:
        signal.signal(signal.SIGINT, previous)
    if result.status != "interrupted":
        raise SystemExit(f"latency.py: the run ended {result.status}, not interrupted")
    return box["saved"] - box["sent"], int(state[G.VERSION]) - box["v"]


def budget_once(model, data, n: int, budget_s: float) -> float:
    """One run with a time budget: seconds of training beyond it."""
    cfg = engine.TrainConfig(algo="hogwild", threads=n, epochs=100, time_budget=budget_s)
    result = engine.train(model, data, cfg)
    if result.status != "time_budget":
        raise SystemExit(f"latency.py: the run ended {result.status}, not on its budget")
    return result.train_time_s - budget_s


def row(name: str, promise_s: float, values: list[float], extra: str = "") -> str:
    within = sum(v <= promise_s for v in values)
    return (f"| {name} | {1000 * promise_s:.0f} ms | {1000 * statistics.median(values):.0f} ms "
            f"| {1000 * max(values):.0f} ms | {within}/{len(values)} | {extra} |")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=128)
    ap.add_argument("--budget", type=float, default=2.0, help="time budget, s")
    ap.add_argument("--warm", type=float, default=1.0, help="training before the SIGINT, s")
    args = ap.parse_args(argv)

    model = models.build("lenet", "synthetic")
    data = datasets.synthetic(seed=0, n_train=40000, n_test=50)
    step_s = statistics.median(sim.measure_step_times(model, data, 16, 50))
    budget_once(model, data, args.threads, 0.2)  # loads the compiled loop; not counted
    cores = os.cpu_count() or 1
    print(f"{args.threads} hogwild workers on {cores} CPUs, LeNet-5 b=16, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print(f"one step alone: {1000 * step_s:.1f} ms; with {args.threads} workers sharing "
          f"{cores} cores a step in flight spans about "
          f"{1000 * step_s * args.threads / cores:.0f} ms of wall time")
    stops, after, overshoots = [], [], []
    before, t0 = machine_cpu_s(), time.perf_counter()
    for _ in range(args.repeats):  # the scenarios take turns: a drift of load hits both
        seconds, updates = ctrl_c_once(model, data, args.threads, args.warm)
        stops.append(seconds)
        after.append(updates)
        overshoots.append(budget_once(model, data, args.threads, args.budget))
    foreign = foreign_share(before, machine_cpu_s(), time.perf_counter() - t0)
    share = f"{foreign:.0%}" if foreign is not None else "an unknown share"
    print(f"other processes used {share} of the CPUs meanwhile")
    print("| scenario | promise | median | max | runs within | |")
    print("|---|---:|---:|---:|---:|---|")
    print(row("Ctrl-C to checkpoint", CTRL_C_PROMISE_S, stops,
              f"updates after the request: {min(after)}-{max(after)} "
              f"(at most {args.threads})"))
    print(row(f"time budget {args.budget:g} s: overshoot", BUDGET_PROMISE_S, overshoots))
    return {"ctrl_c_s": stops, "updates_after_request": after, "budget_overshoot_s": overshoots,
            "step_s": step_s, "foreign_cpu": foreign}


if __name__ == "__main__":
    main()
