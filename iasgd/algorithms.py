"""What algorithms and gate policies exist: one row each. The CLI's choices,
the configuration's checks, the executors (threads, simulator) and the
benchmarks read this table; adding an algorithm is a row here and its step
in iasgd.protocol.workers.

A row says which compiled loop runs the algorithm's steps, its code in that
loop, what bounds its staleness and whether the simulator covers it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iasgd.protocol import gate as G
from iasgd.protocol import workers as W


@dataclass(frozen=True)
class Algorithm:
    name: str
    loop: str  # "sequential" (engine), "async" (workers.async_worker), "sync" (workers.sync_worker)
    code: int  # the algorithm's code in its worker loop (-1: none)
    bound: str  # "zero": no staleness; "interval": each interval's y - 1; "none": unbounded
    simulated: bool  # iasgd.executors.simulated covers it
    help: str
    snapshot: bool = False  # reads a private copy of the parameters (needs (P,) per worker)
    locked: bool = False  # holds the gate's lock through its read and through its write

    @property
    def parallel(self) -> bool:
        return self.loop != "sequential"

    @property
    def stale(self) -> bool:
        """Its updates can be stale, so staleness-driven schedules apply."""
        return self.bound != "zero"


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("sequential", "sequential", -1, "zero", False,
              "one thread: mini-batch SGD with momentum, reshuffled every epoch"),
    Algorithm("sync", "sync", -1, "zero", True,
              "rounds: every thread computes a gradient on the same parameters, they are "
              "averaged and applied as one update"),
    Algorithm("async", "async", W.ASYNC, "none", True,
              "a consistent snapshot of the parameters under a lock, compute, apply under "
              "the lock", snapshot=True, locked=True),
    Algorithm("hogwild", "async", W.HOGWILD, "none", True,
              "read and write the shared parameters with no lock"),
    Algorithm("interval", "async", W.INTERVAL, "interval", True,
              "Hogwild! inside intervals of y applied updates that no gradient crosses"),
)}


@dataclass(frozen=True)
class Policy:
    name: str
    code: int  # iasgd.protocol.gate's code
    help: str


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("wait", G.WAIT, "take one of the interval's y slots before reading; wait for the "
                           "next interval when all are taken"),
    Policy("drop", G.DROP, "compute freely; at commit, drop an update whose interval closed "
                           "or is full"),
)}


# The variants that sweeps compare (bench/scaling.py) and plots name: an
# algorithm with the strategy that makes it what the papers call it.
VARIANTS: dict[str, dict[str, str | int]] = {
    **{name: {"algo": name} for name in ALGORITHMS},
    "interval-decay": {"algo": "interval", "interval_schedule": "decay"},
    "interval-probe": {"algo": "interval", "interval_schedule": "probe"},
    "elastic": {"algo": "hogwild", "threads_schedule": "window"},
    "async-tail": {"algo": "hogwild", "lr_schedule": "tail"},
    # issue 25's variants (docs/algorithms.md, "Interval variants")
    "interval-tail": {"algo": "interval", "lr_schedule": "tail"},
    "interval-fit": {"algo": "interval", "threads_schedule": "cores", "lr_schedule": "tail"},
    # the control for interval-fit: what one thread per core does without intervals
    "hogwild-fit": {"algo": "hogwild", "threads_schedule": "cores"},
    # interval-fit with y = 32 per active worker instead of a fixed 16
    "interval-per-core": {"algo": "interval", "interval_schedule": "per-worker", "interval": 32,
                          "threads_schedule": "cores", "lr_schedule": "tail"},
    # interval-per-core while the active workers' own staleness fits the step
    # size's budget, the budget's y beyond (docs/algorithms.md, "Staleness budget")
    "interval-budget": {"algo": "interval", "interval_schedule": "budget", "interval": 32,
                        "threads_schedule": "cores", "lr_schedule": "tail"},
}


def sweep_variant(name: str) -> dict | None:
    """The TrainConfig fields of a sweep name: a VARIANTS name, or
    `interval-y<Y>` (algo interval with a fixed y = Y). None: unknown."""
    if name in VARIANTS:
        return VARIANTS[name]
    if name.startswith("interval-y") and name[len("interval-y"):].isdigit():
        return {"algo": "interval", "interval": int(name[len("interval-y"):])}
    return None


def staleness_bound(algo: str, state: np.ndarray) -> int | None:
    """The largest staleness a run of `algo` allowed (None: unbounded). With
    a schedule of y each interval's bound is its own y - 1, so the run's is
    the largest y an interval opened with (the gate's Y_MAX), minus 1."""
    bound = ALGORITHMS[algo].bound
    if bound == "interval":
        return int(state[G.Y_MAX]) - 1
    return 0 if bound == "zero" else None
