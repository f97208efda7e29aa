"""Controllers without threads, fed synthetic losses and a fake clock; step-size
factors against their formulas; then real runs where y and m move."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iasgd import data as datasets
from iasgd import engine
from iasgd import schedules as S
from iasgd.executors import threads as threads_executor
from iasgd.nn import models
from iasgd.protocol import gate as G
from iasgd.protocol import workers as W
from iasgd.results import Hooks, RunResult, Status

# ------------------------------------------------------------ loss monitor


def test_window_mean_covers_the_last_entries_across_wraparound():
    mon = S.LossMonitor(size=4)
    assert mon.window_mean(0) is None
    for pos, loss in enumerate([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]):
        mon.ring[pos % 4] = loss  # what workers do
        assert mon.window_mean(pos + 1) == pytest.approx(
            np.mean([1.0, 2.0, 3.0, 4.0, 5.0, 6.0][max(0, pos - 3):pos + 1]))


def test_ema_folds_in_only_new_losses():
    mon = S.LossMonitor(size=8, alpha=0.5)
    for pos, loss in enumerate([4.0, 2.0]):
        mon.ring[pos] = loss
    assert mon.ema(2) == pytest.approx(0.5 * 4 + 0.5 * 2)
    mon.ring[2] = 1.0
    assert mon.ema(3) == pytest.approx(0.5 * 3 + 0.5 * 1)
    assert mon.ema(3) == pytest.approx(2.0)  # nothing new: unchanged


# ---------------------------------------------------------------- schedules


def test_decay_reaches_y_min_on_schedule():
    d = S.Decay(y0=20, y_min=4, every=100, by=3)
    assert [d.update(a, 0.0, None, None) for a in (0, 99, 100, 250, 500, 10**6)] == \
        [20, 20, 17, 14, 5, 4]


def test_follow_loss_follows_its_formula():
    f = S.FollowLoss(y0=512, y_min=4, x0=0.2)
    assert f.update(0, 0.0, 2.0, None) == 512  # before loss_first is known
    c = 0.2 / (0.2 - 1)
    for ratio in (1.0, 0.8, 0.5, 0.3):
        want = max(4, round(512 * ((1 - c) * ratio + c)))
        assert f.update(0, 0.0, 2.0 * ratio, 2.0) == want
    assert f.update(0, 0.0, 2.0 * 0.2, 2.0) == 4  # y would be 0: clipped at y_min
    assert f.update(0, 0.0, 2.0 * 0.6, 2.0) == 256  # linear: half way at 0.6


def drive(controller, slope_of, steps_per_tick=64, ticks=2000, loss_first=None,
          loss_level=lambda applied: 1.0):
    """Feed a controller a loss that falls at slope_of(value) per second, one
    second per tick; returns the values it used, one per tick."""
    loss, used = 10.0, []
    for tick in range(ticks):
        applied = tick * steps_per_tick
        value = controller.update(applied, float(tick), loss * loss_level(applied), loss_first)
        used.append(value)
        loss += slope_of(value)
    return used


def test_probe_picks_the_steepest_slope_and_executes_it():
    p = S.WindowProbe(start=32, offset=16, step=4, probe_steps=128, exec_steps=1024,
                      loss_scale=0.9, low=4)
    assert p.queue == [48, 44, 40, 36, 32, 28, 24, 20, 16]
    used = drive(p, slope_of=lambda y: -1.0 / (1 + abs(y - 24)), ticks=60)
    chosen = [e["chosen"] for e in p.log if "chosen" in e]
    assert chosen[0] == 24
    first_phase = [e for e in p.log if "value" in e][:9]
    slopes = {e["value"]: e["slope"] for e in first_phase}
    assert set(slopes) == {48, 44, 40, 36, 32, 28, 24, 20, 16}
    assert min(slopes, key=slopes.get) == 24
    # each probed value held for probe_steps updates (2 ticks of 64), then 24 for exec
    first_exec = used.index(24, used.index(20))
    assert used[first_exec:first_exec + 1024 // 64] == [24] * 16


def test_probe_clips_at_y_min_and_ends_the_phase_there():
    p = S.WindowProbe(start=8, offset=16, step=4, probe_steps=64, exec_steps=512,
                      loss_scale=0.9, low=4)
    assert p.queue == [24, 20, 16, 12, 8, 4]


def test_probe_recentres_and_narrows_as_the_loss_falls():
    p = S.WindowProbe(start=64, offset=16, step=4, probe_steps=1, exec_steps=1,
                      loss_scale=0.9, low=4)
    loss, applied = 30.0, 0
    p.update(applied, 0.0, loss, 50.0)
    for _ in range(9):  # one probe per update; the loss falls fastest at y = 56
        applied += 1
        loss -= 1.0 / (1 + abs(p.value - 56))
        p.update(applied, float(applied), loss, 50.0)
    assert p.log[-1] == {"t_s": 9.0, "applied": 9, "chosen": 56}
    p.update(10, 10.0, 10.0, 50.0)  # execute phase over, loss at 20 % of loss_first
    s = 0.9 * 10.0 / 50.0 + 0.1
    step, offset = max(1, round(4 * s)), max(1, round(16 * s))
    assert (step, offset) == (1, 4)
    assert p.queue == [60, 59, 58, 57, 56, 55, 54, 53, 52]  # narrower, centred on 56
    assert p.value == 60


def test_thread_window_moves_top_down_and_recentres():
    w = S.thread_window(n=8, m0=8, window=4, probe_steps=64, exec_steps=256)
    assert w.queue == [8, 7, 6]  # 8 + 2 clipped to n, down to 8 - 2
    drive(w, slope_of=lambda m: -1.0 / (1 + abs(m - 6)), ticks=30)
    chosen = [e["chosen"] for e in w.log if "chosen" in e]
    assert chosen[0] == 6
    probed_after = [e["value"] for e in w.log if "value" in e][3:6]
    assert probed_after == [8, 7, 6]  # window around 6: 8, 7, 6, 5, 4
    assert S.thread_window(n=3, m0=1, window=4, probe_steps=1, exec_steps=1).queue == [3, 2, 1]


def test_a_probe_measures_from_the_first_loss_estimate():
    p = S.WindowProbe(start=8, offset=4, step=4, probe_steps=2, exec_steps=10,
                      loss_scale=0.9, low=4)
    p.update(0, 0.0, None, None)
    p.update(5, 1.0, None, None)  # still no estimate: the probe has not started
    p.update(6, 2.0, 5.0, None)  # the first estimate: the probe of 12 starts here
    p.update(8, 4.0, 4.0, None)
    assert p.log[0] == {"t_s": 4.0, "applied": 8, "value": 12, "slope": -0.5}


def test_an_unmeasurable_probe_is_never_chosen():
    p = S.WindowProbe(start=8, offset=4, step=4, probe_steps=1, exec_steps=10,
                      loss_scale=0.9, low=4)
    p.update(0, 0.0, 5.0, None)
    p.update(1, 0.0, 4.0, None)  # no time passed: slope unknown (inf)
    p.update(2, 1.0, 3.0, None)  # slope -1
    p.update(3, 2.0, 2.9, None)  # slope -0.1
    assert next(e for e in p.log if "chosen" in e)["chosen"] == 8


# -------------------------------------------------------- step-size factors


def test_lr_factors_match_their_formulas():
    tau = np.arange(50)
    np.testing.assert_allclose(S.lr_factors("none", 50, 8), 1.0)
    np.testing.assert_allclose(S.lr_factors("inverse", 50, 8), 1 / (tau + 1), rtol=1e-6)
    beta = 2 / 9 * math.log(1 + 9 / 2)
    np.testing.assert_allclose(S.lr_factors("fleet", 50, 8), np.exp(-beta * tau), rtol=1e-6)


def test_tail_factors_come_from_the_mid_point_cdf():
    sample = np.array([10, 30, 40, 20])  # taus 0..3: P 0.1, 0.3, 0.4, 0.2
    f = S.lr_factors("tail", 6, 8, amplitude=0.5, staleness_sample=sample)
    # F(tau) = P(t < tau) + P(t = tau) / 2, by hand
    mid = np.array([0.05, 0.1 + 0.15, 0.4 + 0.2, 0.8 + 0.1, 1.0, 1.0])
    np.testing.assert_allclose(f, 1 + 0.5 * (1 - 2 * mid), rtol=1e-6)
    assert f[0] > 1 > f[3]  # fresher than typical boosted, staler damped
    # over the sample itself the mean factor is exactly 1
    p = sample / sample.sum()
    assert np.dot(p, f[:4]) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(S.lr_factors("tail", 6, 8, staleness_sample=None), 1.0)


@pytest.mark.parametrize("tau", [0, 3])
def test_tail_leaves_a_one_point_sample_unscaled(tau):
    """Every sampled tau equal (one thread: all 0): the factor there is 1, not
    the plain CDF's 1 - A = 0, which stopped one-thread runs from learning."""
    sample = np.zeros(8)
    sample[tau] = 2048
    f = S.lr_factors("tail", 8, 1, amplitude=1.0, staleness_sample=sample)
    assert f[tau] == pytest.approx(1.0)


# ------------------------------------------------------- real runs, threads


@pytest.fixture(scope="module")
def tiny():
    data = datasets.synthetic(seed=1, n_train=4000, n_test=50, shape=(1, 4, 4), num_classes=2)
    model = models.build("mlp", input_shape=(1, 4, 4), num_classes=2, hidden=(4,))
    return model, data


def test_changing_y_keeps_each_intervals_bound(tiny):
    """32 threads, y decaying fast from 40 to 2: every interval's bound is its
    own y - 1, which the workers check at every apply."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="interval", threads=32, gate="wait", epochs=12,
                             batch_size=4, interval_schedule="decay", y0=40, y_min=2,
                             decay_every=300, decay_by=3)
    result = engine.train(model, data, cfg)
    assert result.bound_violations == 0
    assert result.staleness_hist.sum() == result.applied == 12 * 1000
    ys = [y for _, _, y in result.interval_trace]
    assert ys[0] == 40 and ys[-1] == 2 and len(ys) >= 5
    assert ys == sorted(ys, reverse=True)
    assert result.staleness_bound == 39
    assert result.staleness_max <= 39


@pytest.fixture(scope="module")
def lenet_data():
    return datasets.synthetic(seed=0, n_train=3000, n_test=300)


@pytest.mark.parametrize(("knobs", "trace"), [
    ({"interval_schedule": "decay", "y0": 16, "decay_every": 50, "decay_by": 2}, "interval"),
    ({"interval_schedule": "probe", "y0": 12, "probe_offset": 8, "probe_step": 4,
      "probe_steps": 40, "exec_steps": 120}, "interval"),
    ({"interval_schedule": "follow-loss", "y0": 64, "loss_window": 100}, "interval"),
    ({"threads_schedule": "window", "window": 4, "probe_steps": 40, "exec_steps": 120},
     "threads"),
    ({"lr_schedule": "inverse"}, None),
    ({"lr_schedule": "fleet"}, None),
    ({"lr_schedule": "tail"}, None),
])
def test_each_schedule_trains_and_moves_its_knob(lenet_data, knobs, trace):
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(algo="interval", threads=4, epochs=3, lr=0.02, **knobs)
    result = engine.train(model, lenet_data, cfg)
    losses = [e.train_loss for e in result.epochs]
    assert losses[-1] < 0.5 * losses[0]
    assert result.bound_violations == 0
    if trace == "interval":
        assert len({y for _, _, y in result.interval_trace}) > 1
    elif trace == "threads":
        assert len({m for _, _, m in result.threads_trace}) > 1
        assert any("chosen" in e for e in result.probe_log)


# ------------------------------------------------- threads fitted to the cores


def test_fitted_workers_are_one_per_core():
    assert S.fitted_workers(128, 2) == 2
    assert S.fitted_workers(8, 16) == 8  # never more than the threads
    assert S.fitted_workers(8, None) == 8  # one core each (the simulator's default)
    assert S.fitted_workers(4, 0) == 1


def test_the_cores_schedule_opens_the_gate_with_one_worker_per_core():
    cfg = engine.TrainConfig(algo="interval", threads=16, threads_schedule="cores")
    control = S.Controllers(cfg, 100, RunResult(status=Status.COMPLETED), cores=4)
    assert control.new_gate()[G.M] == 4
    fixed = S.Controllers(engine.TrainConfig(algo="interval", threads=16), 100,
                          RunResult(status=Status.COMPLETED), cores=4)
    assert fixed.new_gate()[G.M] >= 16  # the fixed schedule runs every thread


def test_fitted_threads_run_one_step_per_core_and_keep_the_bound(tiny, monkeypatch):
    """16 threads told the machine has 2 cores: at most 2 are ever inside a
    step at once (the other 14 sleep, parked), and the run trains as usual."""
    monkeypatch.setattr(threads_executor, "usable_cores", lambda: 2)
    model, data = tiny
    cfg = engine.TrainConfig(algo="interval", threads=16, interval=8, epochs=2, batch_size=4,
                             threads_schedule="cores")
    run = threads_executor.ThreadedRun(model, data, cfg)
    result = run.run(Hooks())
    assert result.applied == 2 * 1000 and result.bound_violations == 0
    computed = run.team.counters[:, W.COMPUTED]
    assert computed[:2].sum() == result.computed and not computed[2:].any()
    assert result.max_concurrent_steps <= 2
    assert {m for _, _, m in result.threads_trace} == {2}


def test_per_worker_y_is_the_interval_times_the_active_workers_and_follows_them():
    cfg = engine.TrainConfig(algo="interval", threads=16, threads_schedule="cores",
                             interval_schedule="per-worker", interval=32)
    control = S.Controllers(cfg, 100, RunResult(status=Status.COMPLETED), cores=4)
    assert control.new_gate()[G.Y] == 32 * 4
    # a thread window moves m; y follows it at the next look
    cfg = engine.TrainConfig(algo="interval", threads=16, threads_schedule="window", m0=8,
                             interval_schedule="per-worker", interval=3)
    control = S.Controllers(cfg, 100, RunResult(status=Status.COMPLETED))
    state = control.new_gate()
    assert state[G.Y] == 3 * state[G.M]
    control.m = S.Fixed(5)
    control.step(0.0, 0, 0, state, np.ones(4, np.float32), lambda: np.zeros(4, np.int64))
    assert state[G.M] == 5 and state[G.Y_NEXT] == 3 * 5


def test_a_per_worker_run_keeps_its_bound(tiny, monkeypatch):
    """8 threads told they have 2 cores, 3 updates of y per active worker:
    every interval opens with y = 6 and no update is staler than 5."""
    monkeypatch.setattr(threads_executor, "usable_cores", lambda: 2)
    model, data = tiny
    cfg = engine.TrainConfig(algo="interval", threads=8, interval=3, epochs=1, batch_size=4,
                             threads_schedule="cores", interval_schedule="per-worker")
    result = threads_executor.ThreadedRun(model, data, cfg).run(Hooks())
    assert {y for _, _, y in result.interval_trace} == {6}
    assert result.bound_violations == 0 and result.staleness_max <= 5


def voluntary_switches(native_id: int) -> int | None:
    """How often the thread went to sleep so far (Linux; None elsewhere)."""
    try:
        with open(f"/proc/self/task/{native_id}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux /proc only")
def test_parked_threads_sleep_through_the_run(lenet_data, monkeypatch):
    """The 14 parked workers of a fitted run (16 threads, 2 cores) sleep
    until the run ends: a parked worker that woke every 10 ms (the futex
    safety net) took ~100 switches a second away from the 2 that compute,
    12 % of their throughput at 128 threads on 2 cores. Counted in the
    kernel's switches of each thread, not in time."""
    monkeypatch.setattr(threads_executor, "usable_cores", lambda: 2)
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(algo="interval", threads=16, epochs=4, lr=0.02,
                             threads_schedule="cores")
    run = threads_executor.ThreadedRun(model, lenet_data, cfg)
    counts: dict[int, int] = {}

    def count_parked_sleeps(record) -> None:
        for t in run.team.threads[2:]:
            switches = voluntary_switches(t.native_id)
            if switches is not None:
                counts[t.native_id] = switches
    result = run.run(Hooks(on_epoch_end=count_parked_sleeps))
    assert len(counts) == 14 and result.train_time_s > 0
    # a few for starting and for each epoch's allowance at most; not one per 10 ms
    assert max(counts.values()) <= 10 + 10 * result.train_time_s, (counts, result.train_time_s)


def test_a_per_worker_y_past_the_largest_interval_opens_the_largest():
    cfg = engine.TrainConfig(algo="interval", threads=4, interval=G.MAX_Y,
                             interval_schedule="per-worker")
    control = S.Controllers(cfg, 100, RunResult(status=Status.COMPLETED))
    assert control.new_gate()[G.Y] == G.MAX_Y


# ------------------------------------------------------- staleness budget


def test_the_budget_fits_y_minus_one_steps_and_not_y():
    # the two learning rates of the sweeps, at momentum 0.5 and B = 0.15
    assert S.budget_interval(0.15, 0.005, 0.5) == 16
    assert S.budget_interval(0.15, 0.01, 0.5) == 8
    assert S.budget_interval(0.15, 0.0, 0.5) == G.MAX_Y
    assert S.budget_interval(1e9, 0.001, 0.0) == G.MAX_Y


@given(budget=st.floats(1e-3, 10.0), lr=st.floats(1e-4, 1.0), momentum=st.floats(0.0, 0.99))
def test_the_budget_interval_is_the_largest_y_within_the_budget(budget, lr, momentum):
    y = S.budget_interval(budget, lr, momentum)
    step = lr / (1 - momentum)
    assert 1 <= y <= G.MAX_Y
    assert (y - 1) * step <= budget * (1 + 1e-6)
    if y < G.MAX_Y:
        assert y * step > budget * (1 - 1e-6)


def budget_controller(threads: int, cores: int | None, **knobs) -> S.Controllers:
    cfg = engine.TrainConfig(algo="interval", threads=threads, threads_schedule="cores",
                             interval_schedule="budget", interval=32, **knobs)
    return S.Controllers(cfg, 100, RunResult(status=Status.COMPLETED), cores=cores)


@pytest.mark.parametrize(("threads", "cores", "lr", "y"), [
    (128, 2, 0.005, 64),  # 2 active workers fit the budget: 32 per worker, as per-worker
    (128, 2, 0.01, 64),
    # budget y 16 at lr 0.005: 8 workers' staleness, up to 2 (8 - 1) = 14, fits its
    # bound of 15; 9 workers' (16) does not
    (8, None, 0.005, 32 * 8),
    (9, None, 0.005, 16),
    (16, None, 0.005, 16),
    (128, None, 0.005, 16),
    (128, None, 0.01, 8),
    (128, None, 0.05, 4),  # the budget's y is 2, y_min 4 holds
])
def test_budget_y_is_per_worker_until_the_workers_staleness_outgrows_it(threads, cores, lr, y):
    state = budget_controller(threads, cores, lr=lr, momentum=0.5).new_gate()
    assert state[G.Y] == y


def test_budget_y_follows_the_active_workers():
    control = budget_controller(64, None, lr=0.005, momentum=0.5, staleness_budget=0.15)
    state = control.new_gate()
    assert state[G.Y] == 16
    control.m = S.Fixed(8)  # as a thread window would move m
    control.step(0.0, 0, 0, state, np.ones(4, np.float32), lambda: np.zeros(4, np.int64))
    assert state[G.M] == 8 and state[G.Y_NEXT] == 32 * 8
    control.m = S.Fixed(9)
    control.step(0.1, 10, 10, state, np.ones(4, np.float32), lambda: np.zeros(4, np.int64))
    assert state[G.Y_NEXT] == 16


def test_a_budget_run_keeps_its_bound(tiny):
    """8 threads at lr 0.05: the budget's y is 2 (1 + floor(0.15 * 0.5 / 0.05)),
    y_min lifts it to 3; 8 workers are staler than that, so every interval opens with
    y = 3 and no update is staler than 2."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="interval", threads=8, epochs=1, batch_size=4, lr=0.05,
                             interval_schedule="budget", y_min=3)
    result = threads_executor.ThreadedRun(model, data, cfg).run(Hooks())
    assert {y for _, _, y in result.interval_trace} == {3}
    assert result.bound_violations == 0 and result.staleness_max <= 2
