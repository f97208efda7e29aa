"""The asynchrony simulator: its staleness on fixed schedules worked out by
hand, against real threads on this machine, and its own invariants.

Against real threads, only what holds however busy the machine is: the
books, the staleness bound and learning. How the real staleness compares
(it falls when other jobs take the cores) is measured by
bench/sim_vs_threads.py and reported in docs/performance.md.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from iasgd import data as datasets
from iasgd import engine, results
from iasgd.config import config_where_it_applies
from iasgd.executors import sim_costs
from iasgd.executors import simulated as sim
from iasgd.nn import models


@pytest.fixture(scope="module")
def problem():
    data = datasets.synthetic(seed=0, n_train=8000, n_test=300)
    model = models.build("lenet", "synthetic")
    return model, data, sim.measure_step_times(model, data, 16, 100)


def mean_tau(hist) -> float:
    hist = np.asarray(hist, float)
    return float(np.dot(np.arange(hist.size), hist) / hist.sum())


@pytest.mark.parametrize(("algo", "threads", "extra"), [
    ("hogwild", 2, {}),
    ("hogwild", 8, {}),
    ("interval", 2, {"interval": 4, "gate": "wait"}),
    ("interval", 8, {"interval": 4, "gate": "wait"}),
    ("interval", 8, {"interval_schedule": "decay", "y0": 8, "y_min": 2, "decay_every": 100,
                     "decay_by": 2}),
    # lr 0.02: the budget's y is 1 + floor(0.15 * 0.5 / 0.02) = 4; 8 workers' own
    # staleness (up to 14) exceeds its bound 3, so y = 4
    ("interval", 8, {"interval_schedule": "budget"}),
])
def test_simulated_and_real_threads_keep_the_same_books_and_bounds(problem, algo, threads,
                                                                    extra):
    """The same run on real threads and in the simulator (given this
    machine's cores), in what holds whatever the load: every update of the
    epoch applied and counted once, the same staleness bound kept by both,
    and both learn. How close their staleness is depends on how busy the
    machine is: bench/sim_vs_threads.py measures it."""
    model, data, step_times = problem
    cfg = engine.TrainConfig(algo=algo, threads=threads, epochs=1, lr=0.02, **extra)
    real = engine.train(model, data, cfg)
    simulated = sim.simulate(model, data, cfg, sim.measured_steps(step_times),
                             cores=min(threads, os.cpu_count() or 1))
    quota = engine.steps_per_epoch(data.x_train.shape[0], cfg.batch_size)
    for r in (real, simulated):
        assert r.status == "completed" and r.epochs[0].complete
        assert r.applied == r.computed == quota == r.staleness_hist.sum()
        assert r.staleness_bound == simulated.staleness_bound and r.bound_violations == 0
        if algo == "interval":
            # the k-th update of an interval was read in it: tau <= k - 1
            y = r.staleness_bound + 1
            assert r.staleness_max <= y - 1
            assert mean_tau(r.staleness_hist) <= (y - 1) / 2
            if "interval" in extra:
                assert taus_within_their_interval(r.staleness_hist, y, r.applied)
        # the untrained loss is ln 10 = 2.3; both end the epoch far below it
        assert r.epochs[0].train_loss < 1.0, (r is real, r.epochs[0].train_loss)


def taus_within_their_interval(hist, y: int, applied: int) -> bool:
    """For a fixed y: no more updates have tau >= t than intervals have
    positions k > t (the k-th update of an interval has tau <= k - 1)."""
    full, rest = divmod(applied, y)
    tail = np.cumsum(np.asarray(hist)[::-1])[::-1]  # tail[t]: updates with tau >= t
    return all(tail[t] <= full * (y - t) + max(rest - t, 0) for t in range(min(y, tail.size)))


Q = 0.004  # the simulator's default time slice, s


@pytest.mark.parametrize(("algo", "extra", "cores", "step_s", "hist"), [
    # 8 workers on 2 cores, each step exactly one slice: a step never waits
    # for a core once begun, so between a read and its apply only the other
    # core's apply lands: tau 1, but for the very first update
    ("hogwild", {}, 2, Q, [1, 499]),
    # the same with steps of two slices: each step is cut in the middle, and
    # all 8 read before any of the next wave applies. Waves of 8 in order
    # w0..w7 (2 at a time); a worker reads when it next gets a core, and w0
    # gets one as w6 applies, just before w7: taus 0..7 in the first wave,
    # then 1, 1, 2, ..., 7 in 61 waves, and 1, 1, 2, 3 in the last 4
    ("hogwild", {}, 2, 2 * Q, [1, 125, 63, 63, 62, 62, 62, 62]),
    # a core each: all 8 read at 0 and apply in turn (taus 0..7), and each
    # reads again right after its apply, so from then on the 7 others land
    # between its read and its apply
    ("hogwild", {}, None, Q, [1, 1, 1, 1, 1, 1, 1, 493]),
    # interval y=4, wait, on 2 cores, one-slice steps: the first two slots
    # read together (taus 0, 1); each later slot is taken as an apply frees
    # a core, and the other core's apply lands in it: 0, 1, 1, 1 per interval
    ("interval", {"interval": 4}, 2, Q, [125, 375]),
    # interval y=4, wait, a core each: 4 slots read together, apply in turn
    # (0, 1, 2, 3), 4 workers wait, and the interval's last apply lets the
    # next 4 in: the bound (y - 1) / 2 on the mean is reached
    ("interval", {"interval": 4}, None, Q, [125, 125, 125, 125]),
], ids=["hogwild-2-cores-1-slice-steps", "hogwild-2-cores-2-slice-steps", "hogwild-own-cores",
        "interval-2-cores", "interval-own-cores"])
def test_simulated_staleness_on_fixed_schedules(tiny, algo, extra, cores, step_s, hist):
    """The simulator's time model against staleness worked out by hand: 8
    workers with equal step times (so the schedule is fixed), one epoch of
    500 updates; time slicing, the cores and the wait gate each decide it."""
    model, data = tiny
    cfg = engine.TrainConfig(algo=algo, threads=8, epochs=1, batch_size=4, **extra)
    r = sim.simulate(model, data, cfg, constant_steps(step_s), cores=cores, quantum=Q)
    assert r.staleness_hist[:len(hist)].tolist() == hist
    assert r.staleness_hist.sum() == r.applied == sum(hist) == 500


@pytest.fixture(scope="module")
def tiny():
    data = datasets.synthetic(seed=1, n_train=2000, n_test=50, shape=(1, 4, 4), num_classes=2)
    return models.build("mlp", input_shape=(1, 4, 4), num_classes=2, hidden=(4,)), data


@pytest.mark.parametrize("gate", ["wait", "drop"])
def test_simulated_intervals_keep_the_bound_and_the_books(tiny, gate):
    model, data = tiny
    cfg = engine.TrainConfig(algo="interval", threads=32, interval=5, gate=gate, epochs=2,
                             batch_size=4)
    r = sim.simulate(model, data, cfg, sim.lognormal_steps(0.001, 0.5), cores=4)
    assert np.flatnonzero(r.staleness_hist).max() <= 4 == r.staleness_bound
    assert r.applied == 2 * 500 == r.staleness_hist.sum()
    assert r.computed == r.applied + r.dropped
    assert (r.dropped > 0) == (gate == "drop")
    assert r.intervals == r.applied // 5


def test_128_simulated_threads_on_their_own_cores(tiny):
    """With a core each and nearly equal step times, hogwild's staleness
    averages n - 1 once all workers run (each epoch starts them together, so
    its first 128 updates ramp up from 0; a worker with a shorter step may
    finish twice inside a longer one, so some exceed n - 1); the run is
    deterministic for a seed."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=128, epochs=2, batch_size=4, seed=3)
    a = sim.simulate(model, data, cfg, sim.lognormal_steps(0.002, 0.05))
    b = sim.simulate(model, data, cfg, sim.lognormal_steps(0.002, 0.05))
    hist = a.staleness_hist
    assert np.flatnonzero(hist).max() < 2 * 128
    ramp_then_steady = (128 * 63.5 + 372 * 127) / 500  # per epoch of 500 updates
    assert mean_tau(hist) == pytest.approx(ramp_then_steady, abs=3)
    assert a.staleness_hist.tolist() == b.staleness_hist.tolist()
    assert a.params.tobytes() == b.params.tobytes()
    assert a.train_time_s == pytest.approx(1000 / 128 * 0.002, rel=0.2)  # simulated seconds


def test_the_simulator_refuses_what_it_does_not_model(tiny):
    model, data = tiny
    with pytest.raises(ValueError, match="simulator covers"):
        sim.simulate(model, data, engine.TrainConfig(algo="sequential"),
                     sim.lognormal_steps(0.001, 0.1))


def constant_steps(seconds: float):
    return lambda rng: seconds


@pytest.mark.parametrize(("threads", "cores"), [(4, 4), (8, 2), (5, 3)])
def test_simulated_sync_rounds_take_as_long_as_their_steps_on_the_cores(tiny, threads, cores):
    """Every update averages a round of `threads` gradients on the same
    parameters (tau 0); with equal steps of t seconds a round of k steps
    lasts max(t, k * t / cores), the time-sliced makespan (an epoch's last
    round may have fewer than `threads`)."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="sync", threads=threads, epochs=2, batch_size=4)
    r = sim.simulate(model, data, cfg, constant_steps(0.001), cores=cores)
    full, last = divmod(500, threads)
    epoch_s = sum(max(0.001, k * 0.001 / cores) for k in [threads] * full + [last] * (last > 0))
    assert r.applied == r.computed == 1000 == r.staleness_hist[0] == r.staleness_hist.sum()
    assert r.train_time_s == pytest.approx(2 * epoch_s)
    assert r.staleness_bound == 0 and r.status == "completed"
    assert r.epochs[-1].train_loss < r.epochs[0].train_loss


def test_simulated_decay_follows_its_formula_and_keeps_each_bound(tiny):
    model, data = tiny
    cfg = engine.TrainConfig(algo="interval", interval_schedule="decay", y0=12, y_min=3,
                             decay_every=100, decay_by=2, threads=16, epochs=2, batch_size=4)
    r = sim.simulate(model, data, cfg, sim.lognormal_steps(0.001, 0.3), cores=16)
    ys = [y for _, _, y in r.interval_trace]
    assert ys[0] == 12 and ys[-1] == 3 and ys == sorted(ys, reverse=True)
    for _, applied, y in r.interval_trace:
        # y of the interval open at a tick: a value the formula gave, never
        # ahead of it (a new y opens the next interval after the tick that set it)
        assert y in (12, 10, 8, 6, 4, 3)
        assert y >= max(3, 12 - 2 * (applied // 100))
    assert r.bound_violations == 0
    assert r.staleness_max <= r.staleness_bound == 11


def test_simulated_probe_measures_slopes_and_executes_the_best(tiny):
    model, data = tiny
    cfg = engine.TrainConfig(algo="interval", interval_schedule="probe", y0=8, y_min=2,
                             probe_offset=4, probe_step=2, probe_steps=40, exec_steps=100,
                             threads=12, epochs=3, batch_size=4, lr=0.05)
    r = sim.simulate(model, data, cfg, sim.lognormal_steps(0.001, 0.3), cores=12)
    probes = [e for e in r.probe_log if "slope" in e]
    chosen = [e["chosen"] for e in r.probe_log if "chosen" in e]
    assert [e["value"] for e in probes[:5]] == [12, 10, 8, 6, 4]
    assert chosen and chosen[0] in (12, 10, 8, 6, 4)
    assert r.bound_violations == 0 and r.staleness_max <= r.staleness_bound


def test_simulated_thread_window_parks_workers(tiny):
    """m0 = 1 with a window of one value: only worker 0 ever runs, so
    hogwild has no staleness and one core's worth of speed."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=8, threads_schedule="window", m0=1,
                             window=1, epochs=2, batch_size=4)
    r = sim.simulate(model, data, cfg, constant_steps(0.001), cores=8)
    assert r.staleness_hist[0] == r.applied == 1000
    assert r.train_time_s == pytest.approx(1000 * 0.001)
    assert {m for _, _, m in r.threads_trace} == {1}


@pytest.mark.parametrize(("cores", "active"), [(2, 2), (None, 8)])
def test_simulated_fitted_threads_run_one_per_core(tiny, cores, active):
    """The cores schedule: 8 hogwild workers on 2 simulated cores run 2 at a
    time (equal steps: every update has tau 1 after the first), on a core
    each all 8."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=8, threads_schedule="cores", epochs=1,
                             batch_size=4)
    r = sim.simulate(model, data, cfg, constant_steps(0.001), cores=cores)
    assert {m for _, _, m in r.threads_trace} == {active}
    assert r.staleness_max == active - 1
    assert r.train_time_s == pytest.approx(math.ceil(500 / active) * 0.001)


def test_simulated_thread_window_moves_m_and_staleness_follows(tiny):
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=8, threads_schedule="window", window=6,
                             probe_steps=30, exec_steps=60, epochs=2, batch_size=4)
    r = sim.simulate(model, data, cfg, constant_steps(0.001), cores=8)
    ms = [m for _, _, m in r.threads_trace]
    assert ms[:4] == [8, 7, 6, 5] and min(ms) >= 1  # probes top-down from the centre
    assert r.staleness_max <= 8  # a worker finishing twice in another's step: rare, bounded


def test_simulated_step_sizes_follow_staleness(tiny):
    """inverse scales each step by 1 / (tau + 1): no change where tau is
    always 0 (one worker), a different run where it is not."""
    model, data = tiny
    steps = sim.lognormal_steps(0.001, 0.3)

    def params(threads, schedule):
        cfg = engine.TrainConfig(algo="hogwild", threads=threads, epochs=1, batch_size=4,
                                 lr_schedule=schedule)
        return sim.simulate(model, data, cfg, steps).params

    assert params(1, "inverse").tobytes() == params(1, "none").tobytes()
    assert params(6, "inverse").tobytes() != params(6, "none").tobytes()


def test_simulated_time_budget_cuts_the_run_in_simulated_seconds(tiny):
    model, data = tiny
    cfg = engine.TrainConfig(algo="interval", threads=4, epochs=100, batch_size=4,
                             time_budget=0.3)
    r = sim.simulate(model, data, cfg, constant_steps(0.001))
    assert r.status == "time_budget" and r.train_time_s == pytest.approx(0.3)
    assert not r.epochs[-1].complete and r.epochs[-2].complete
    assert r.applied == pytest.approx(0.3 / 0.001 * 4, abs=4)  # 4 workers, 1 ms steps


def test_simulated_run_stops_when_its_hooks_ask(tiny):
    """A stop request (a target reached, an interrupt) ends a simulated run
    at the monitor's next tick, with the hooks' reason as its status, and
    keeps the epochs already recorded."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="interval", threads=4, epochs=50, batch_size=4)
    ends = []
    hooks = results.Hooks(on_epoch_end=ends.append,
                          should_stop=lambda: "target_reached" if len(ends) >= 2 else None)
    r = sim.simulate(model, data, cfg, constant_steps(0.001), hooks=hooks)
    assert r.status == "target_reached"
    assert 2 <= len(r.epochs) <= 3 and all(e.complete for e in r.epochs[:2])


@pytest.mark.parametrize("algo", ["hogwild", "sync"])
def test_simulated_divergence_stops_the_run(tiny, algo):
    model, data = tiny
    cfg = engine.TrainConfig(algo=algo, threads=4, epochs=5, batch_size=4, lr=1e12,
                             momentum=0.9)
    r = sim.simulate(model, data, cfg, constant_steps(0.001))
    assert r.status == "diverged" and r.diverged_at["epoch"] == 1
    assert len(r.epochs) == 1


@pytest.mark.parametrize("algo", ["hogwild", "interval", "sync"])
def test_one_simulated_worker_trains_exactly_like_one_thread(algo):
    """The simulator makes the threads' compiled calls: with one worker, the
    same seed gives the same batches, so the same parameters, losses and
    staleness records as a real thread, to the bit."""
    data = datasets.synthetic(seed=2, n_train=320, n_test=40)
    model = models.build("lenet", "synthetic")
    cfg = config_where_it_applies(algo=algo, threads=1, epochs=2, lr=0.02, interval=3, seed=7)
    real = engine.train(model, data, cfg)
    simulated = sim.simulate(model, data, cfg, sim.lognormal_steps(0.001, 0.1))
    assert simulated.params.tobytes() == real.params.tobytes()
    for a, b in zip(real.epochs, simulated.epochs, strict=True):
        assert (a.train_loss, a.test_accuracy, a.staleness_hist, a.complete) == (
            b.train_loss, b.test_accuracy, b.staleness_hist, b.complete)
    for key in ("applied", "computed", "dropped", "intervals", "staleness_max",
                "staleness_bound", "bound_violations", "samples"):
        assert getattr(real, key) == getattr(simulated, key), key


def test_simulated_sync_rounds_are_the_sync_threads_rounds():
    """The simulator's rounds (run_sync_rounds) are sync_worker's, one
    worker after another: n real sync threads are deterministic (each
    averages the same rows, in the same order, over its own columns), so n
    simulated workers must reach the same parameters, losses and books, to
    the bit, the last round of an epoch short (50 updates: 16 rounds of 3,
    one of 2)."""
    data = datasets.synthetic(seed=2, n_train=200, n_test=40)
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(algo="sync", threads=3, epochs=2, batch_size=4, lr=0.02,
                             momentum=0.5, seed=5)
    real = engine.train(model, data, cfg)
    simulated = sim.simulate(model, data, cfg, sim.lognormal_steps(0.001, 0.1), cores=2)
    assert simulated.params.tobytes() == real.params.tobytes()
    for a, b in zip(real.epochs, simulated.epochs, strict=True):
        assert (a.train_loss, a.test_accuracy, a.staleness_hist) == (
            b.train_loss, b.test_accuracy, b.staleness_hist)
    for key in ("applied", "computed", "samples", "staleness_max", "bound_violations"):
        assert getattr(real, key) == getattr(simulated, key), key


def test_measured_step_times_leave_out_the_cost_of_calling_from_python(problem, monkeypatch):
    """Real workers run their steps inside one compiled loop, so a simulated
    step must not carry the cost of one call from Python (argument typing
    and unboxing: 0.7 ms of a 1.9 ms LeNet-5 measurement before). On a fake
    clock where every call costs 0.5 ms and every step 1 ms, the
    measurement is exactly the steps' 1 ms (no wall clock is read, so the
    machine's load cannot change the outcome)."""
    model, data, _ = problem
    clock = [0.0]

    def fake_train_steps(weights, buffers, images, steps, losses, augment, knobs):
        clock[0] += 0.0005 + 0.001 * steps.count
        return steps.count

    monkeypatch.setattr(sim_costs.N, "train_steps", fake_train_steps)
    monkeypatch.setattr(sim_costs.time, "perf_counter", lambda: clock[0])
    measured = sim.measure_step_times(model, data, 16, 20)
    assert measured == pytest.approx(np.full(20, 0.001))
