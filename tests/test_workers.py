"""The parallel algorithms with real threads: stress runs of the interval gate
(32 threads on this machine's cores, tiny steps), liveness with timeouts, the
staleness each algorithm must report, and proof that the GIL is released."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from iasgd import data as datasets
from iasgd import engine, models
from iasgd import workers as W

TIMEOUT_S = 120
TINY_N = 4000  # samples of the tiny problem: 1,000 updates per epoch at b=4


@pytest.fixture(scope="module")
def tiny():
    """A tiny MLP problem: steps of microseconds, so the gate is the bottleneck."""
    data = datasets.synthetic(seed=1, n_train=TINY_N, n_test=50, shape=(1, 4, 4), num_classes=2)
    model = models.build("mlp", input_shape=(1, 4, 4), num_classes=2, hidden=(4,))
    return model, data


def train_with_timeout(model, data, cfg, timeout=TIMEOUT_S):
    """engine.train in a thread: fail (instead of hanging the suite) on deadlock."""
    box: dict = {}

    def target():
        try:
            box["result"] = engine.train(model, data, cfg)
        except BaseException as err:
            box["error"] = err

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"deadlock: {cfg} did not finish in {timeout} s"
    assert not any(th.name.startswith("iasgd-worker") for th in threading.enumerate())
    if "error" in box:
        raise box["error"]
    return box["result"]


def check_accounting(result, cfg, quota):
    hist = result.staleness_hist
    assert hist.sum() == result.applied
    assert result.computed == result.applied + result.dropped
    for record in result.epochs:
        if record.complete:
            assert sum(record.staleness_hist) == quota
    if result.status == "completed":
        assert result.applied == cfg.epochs * quota
    assert result.bound_violations == 0
    bound = result.staleness_bound
    if bound is not None:
        assert result.staleness_max <= bound
        assert np.flatnonzero(hist).max() <= bound


@pytest.mark.parametrize("gate", ["wait", "drop"])
@pytest.mark.parametrize("y", [1, 2, 3, 7, 64])
def test_interval_stress_32_threads_keeps_the_bound(tiny, y, gate):
    model, data = tiny
    cfg = engine.TrainConfig(algo="interval", threads=32, interval=y, gate=gate, epochs=5,
                             batch_size=4, lr=0.05)
    result = train_with_timeout(model, data, cfg)
    quota = engine.steps_per_epoch(TINY_N, 4)
    check_accounting(result, cfg, quota)
    assert result.intervals == result.applied // y  # every completed interval holds y
    if gate == "wait":
        assert result.dropped == 0
    if y == 1:
        assert result.staleness_hist[0] == result.applied


@pytest.mark.parametrize(("algo", "threads", "y", "gate"), [
    ("interval", 1, 1, "wait"),
    ("interval", 1, 5, "drop"),
    ("interval", 8, 3, "wait"),  # y < n
    ("interval", 8, 3, "drop"),
    ("interval", 3, 10**6, "wait"),  # y larger than the whole run
    ("interval", 4, 7, "drop"),  # 1,000 updates per epoch: the run ends mid-interval
    ("sync", 3, 1, "wait"),  # 1,000 gradients per epoch: a last round of 1
    ("sync", 1, 1, "wait"),
    ("async", 8, 1, "wait"),
    ("hogwild", 8, 1, "wait"),
])
def test_liveness(tiny, algo, threads, y, gate):
    model, data = tiny
    cfg = engine.TrainConfig(algo=algo, threads=threads, interval=y, gate=gate, epochs=2,
                             batch_size=4, lr=0.05)
    result = train_with_timeout(model, data, cfg)
    check_accounting(result, cfg, engine.steps_per_epoch(TINY_N, 4))


@pytest.mark.parametrize("gate", ["wait", "drop"])
def test_time_budget_stops_waiting_workers(gate):
    data = datasets.synthetic(seed=0, n_train=40000, n_test=50)
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(algo="interval", threads=6, interval=2, gate=gate, epochs=5,
                             time_budget=0.5)
    result = train_with_timeout(model, data, cfg)
    assert result.status == "time_budget"
    assert not result.epochs[-1].complete
    check_accounting(result, cfg, engine.steps_per_epoch(40000, 16))


def test_a_failing_worker_stops_the_run(tiny, monkeypatch):
    model, data = tiny
    real = W.async_worker
    calls = {"n": 0}

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 3:  # the third call: a worker of the first epoch
            raise MemoryError("simulated failure")
        real(*args)

    monkeypatch.setattr(W, "async_worker", flaky)
    cfg = engine.TrainConfig(algo="interval", threads=4, interval=3, epochs=200, batch_size=4)
    with pytest.raises(RuntimeError, match=r"worker \d+ failed: MemoryError: simulated failure"):
        train_with_timeout(model, data, cfg)


def test_cli_reports_a_failing_worker(monkeypatch, capsys, tmp_path):
    def broken(*args):
        raise ValueError("boom")

    monkeypatch.setattr(W, "sync_worker", broken)
    from iasgd import run

    code = run.main(["--dataset", "synthetic", "--algo", "sync", "--threads", "2", "--quiet",
                     "--out", str(tmp_path / "r.json")])
    assert code == 1
    assert "worker 0 failed: ValueError: boom" in capsys.readouterr().err


@pytest.mark.parametrize("algo", ["hogwild", "async"])
def test_unbounded_algorithms_report_real_staleness(algo):
    data = datasets.synthetic(seed=0, n_train=2000, n_test=50)
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(algo=algo, threads=8, epochs=1)
    result = train_with_timeout(model, data, cfg)
    check_accounting(result, cfg, engine.steps_per_epoch(2000, 16))
    assert result.staleness_bound is None
    # 8 threads with millisecond steps on a few cores overlap: real staleness
    assert result.staleness_max > 0
    assert result.staleness_hist[1:].sum() > 0


def test_sync_has_zero_staleness(tiny):
    model, data = tiny
    cfg = engine.TrainConfig(algo="sync", threads=4, epochs=2, batch_size=4)
    result = train_with_timeout(model, data, cfg)
    assert result.staleness_hist[0] == result.applied


@pytest.mark.parametrize("algo", ["sync", "async", "hogwild", "interval"])
def test_parallel_algorithms_learn(algo):
    data = datasets.synthetic(seed=0, n_train=3000, n_test=300)
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(algo=algo, threads=3, interval=4, epochs=3, lr=0.02)
    result = train_with_timeout(model, data, cfg)
    assert result.epochs[-1].test_accuracy >= 0.95


def test_the_gil_is_released_during_steps():
    """Like numba's test_gil: two or more workers are inside the compiled step
    at the same moment, which a held GIL would make impossible."""
    data = datasets.synthetic(seed=0, n_train=2000, n_test=50)
    model = models.build("lenet", "synthetic")
    result = train_with_timeout(model, data, engine.TrainConfig(algo="hogwild", threads=4,
                                                                epochs=1))
    assert result.max_concurrent_steps >= 2
    assert result.gil_fraction < 0.05


@pytest.mark.parametrize(("algo", "extra"), [
    ("sequential", {}), ("hogwild", {}), ("async", {}), ("sync", {}),
    ("interval", {"interval": 4, "gate": "wait"}), ("interval", {"interval": 4, "gate": "drop"}),
])
def test_every_algorithm_trains_a_spec_model(algo, extra):
    """Any layer list goes through the same plan: a tiny conv net with a same
    conv, a valid conv, a pool and a flatten of a wide map learns with
    every algorithm (3 threads), and in the simulator."""
    from iasgd import sim

    data = datasets.synthetic(seed=2, n_train=600, n_test=200, shape=(2, 8, 8), num_classes=3)
    model = models.build("conv4k3s,relu,pool,conv4k3,relu,dense8,relu,dense",
                         input_shape=(2, 8, 8), num_classes=3)
    threads = 1 if algo == "sequential" else 3
    epochs = 12 if algo == "sync" else 4  # sync makes one update of 3 gradients per round
    cfg = engine.TrainConfig(algo=algo, threads=threads, epochs=epochs, batch_size=8, lr=0.05,
                             **extra)
    result = train_with_timeout(model, data, cfg)
    assert result.epochs[-1].test_accuracy >= 0.9, result.epochs[-1]
    if algo != "sequential":
        simulated = sim.simulate(model, data, cfg, sim.lognormal_steps(1e-3, 0.2), cores=3)
        assert simulated.epochs[-1].test_accuracy >= 0.9, simulated.epochs[-1]
