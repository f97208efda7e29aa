"""bench/torch_gate.py's hold and its accuracy clock: workers started held
take no step until released, a hold stops every one of them between steps,
and the clock counts training only (it once counted the workers' start-up)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import torch_gate  # noqa: E402


def steps_after(flags, seconds: float) -> int:
    time.sleep(seconds)
    return int(flags.counts.sum())


def wait_until(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.perf_counter() + timeout_s
    while not condition() and time.perf_counter() < deadline:
        time.sleep(0.01)
    return condition()


def test_workers_started_held_step_only_between_release_and_hold():
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8).share_memory_()
    labels = torch.randint(0, 10, (64,)).share_memory_()
    model = torch_gate.LeNet5().share_memory()
    cfg = {"lr": 0.005, "momentum": 0.5, "b": 4, "seed": 0}
    procs, flags = torch_gate.start(2, model, None, images, labels, cfg, held=True)
    try:
        # nobody asked them to stop: they wait from the start
        assert wait_until(lambda: int(flags.parked.sum()) == 2)
        assert steps_after(flags, 0.3) == 0
        flags.release()
        assert wait_until(lambda: int(flags.counts.sum()) > 0)
        flags.hold(timeout_s=60)
        held_at = int(flags.counts.sum())
        assert steps_after(flags, 0.3) == held_at
    finally:
        torch_gate.finish(procs, None, flags)


def test_a_hold_that_cannot_complete_says_how_many_workers_it_held():
    flags = torch_gate.Flags.shared(3)
    flags.parked[0] = 1  # one of three between steps, two never get there
    with pytest.raises(TimeoutError, match="1 of 3 workers held"):
        flags.hold(timeout_s=0.05)


def slow_starting_worker(flags, rank: int, startup_s: float) -> None:
    """bench/torch_gate.py's worker after startup_s of getting ready, with
    steps of a millisecond."""
    time.sleep(startup_s)
    while torch_gate.may_step(flags, rank):
        time.sleep(0.001)
        flags.counts[rank] += 1


def test_the_clock_starts_when_the_last_worker_is_ready(monkeypatch):
    flags = torch_gate.Flags.shared(2)
    flags.pause[0] = 1  # started held
    workers = [threading.Thread(target=slow_starting_worker, args=(flags, r, 1.5 + 1.5 * r))
               for r in range(2)]
    for w in workers:
        w.start()
    monkeypatch.setattr(torch_gate, "evaluate", lambda *_: 0.5)
    try:
        startup_s, evals, reached = torch_gate.train_to_60(
            flags, None, None, None, None, None, SimpleNamespace(seconds=0.2, eval_s=0.1))
    finally:
        flags.stop[0] = 1
        for w in workers:
            w.join()
    # the last worker is ready 3 s after the threads start, the first at 1.5 s;
    # the hold began a few milliseconds after they started
    assert startup_s > 2.0
    assert len(evals) >= 2 and evals[-1][0] >= 0.2 and reached == {}
    # the 3 s of start-up are not training (about 0.2 s was: a margin of 10x for a busy machine)
    assert evals[-1][0] < 3.0
    assert evals[0][1] > 0  # and training began at the first release
