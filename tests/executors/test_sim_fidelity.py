"""The simulator does what the threads do at the edges of a run (issue 22):
it evaluates at the same --eval-every boundaries, finishes and applies the
steps under way when the time budget runs out, and models what the machine
adds to a step (async's lock, contention between cores, cold caches after a
context switch). Every figure here is worked out by hand on fixed
schedules (equal step times) or is a property of any schedule: nothing
depends on how busy the machine is.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from iasgd import data as datasets
from iasgd import engine
from iasgd.config import config_where_it_applies
from iasgd.executors import simulated as sim
from iasgd.nn import models

Q = 0.004  # the simulator's default time slice, s


@pytest.fixture(scope="module")
def tiny():
    data = datasets.synthetic(seed=1, n_train=2000, n_test=50, shape=(1, 4, 4), num_classes=2)
    return models.build("mlp", input_shape=(1, 4, 4), num_classes=2, hidden=(4,)), data


def constant_steps(seconds: float):
    return lambda rng: seconds


# ------------------------------------------------------------ --eval-every


def test_eval_every_evaluates_at_each_boundary_in_simulated_time(tiny):
    """Boundaries as the threads have them (multiples of N applied since the
    start, then each epoch end, whose evaluation is the record's), at the
    simulated time of the boundary: 4 workers on their own cores apply 4
    updates every millisecond."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=4, epochs=2, batch_size=4, eval_every=200)
    r = sim.simulate(model, data, cfg, constant_steps(0.001))
    assert r.status == "completed" and r.applied == 1000
    assert [a for _, a, _ in r.evals] == [200, 400, 500, 600, 800, 1000]
    assert [t for t, _, _ in r.evals] == pytest.approx([0.05, 0.1, 0.125, 0.15, 0.2, 0.25])
    assert r.evals[2][2] == r.epochs[0].test_accuracy
    assert r.evals[-1][2] == r.epochs[1].test_accuracy
    assert r.train_time_s == pytest.approx(0.25)


def test_eval_every_drains_the_workers_at_each_boundary(tiny):
    """As on threads, a boundary lets every step under way finish and the
    next chunk starts all workers afresh: 8 workers on their own cores,
    equal steps, read together at a chunk's start and apply in turn (taus
    0..7), then tau 7 for the rest of the chunk. Chunks of 100: the ramp of
    7 updates below 7 comes back 5 times an epoch instead of once."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=8, epochs=1, batch_size=4, eval_every=100)
    r = sim.simulate(model, data, cfg, constant_steps(Q))
    assert r.staleness_hist[:8].tolist() == [5] * 7 + [465]
    assert len(r.evals) == 5


def test_one_simulated_worker_with_eval_every_trains_as_without(tiny):
    """With one worker a boundary changes nothing but the evals: the same
    batches, so the same parameters, to the bit."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=1, epochs=2, batch_size=4, seed=5)
    plain = sim.simulate(model, data, cfg, constant_steps(0.001))
    every = sim.simulate(model, data, dataclasses.replace(cfg, eval_every=70),
                         constant_steps(0.001))
    assert every.params.tobytes() == plain.params.tobytes()
    assert plain.evals == [] and [a for _, a, _ in every.evals][:3] == [70, 140, 210]


def test_one_simulated_worker_evaluates_like_one_thread():
    """The simulator and a real thread share the chunk loop and the
    evaluation: with one worker the evals' updates and accuracies agree."""
    data = datasets.synthetic(seed=2, n_train=320, n_test=40)
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(algo="hogwild", threads=1, epochs=2, lr=0.02, seed=7,
                             eval_every=8)
    real = engine.train(model, data, cfg)
    simulated = sim.simulate(model, data, cfg, constant_steps(0.001))
    assert [e[1:] for e in simulated.evals] == [e[1:] for e in real.evals]


@pytest.mark.parametrize("algo", ["hogwild", "sync"])
def test_a_simulated_worker_draws_the_augmentation_of_a_thread(algo):
    """With --augment the simulator draws each batch's codes from the
    worker's stream as a real thread does (right after the batch): one
    worker, the same parameters to the bit; and the augmentation did
    change the run."""
    data = datasets.synthetic(seed=2, n_train=160, n_test=20)
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(algo=algo, threads=1, epochs=1, lr=0.02, seed=7,
                             augment="crop,flip", crop_padding=3)
    real = engine.train(model, data, cfg)
    simulated = sim.simulate(model, data, cfg, constant_steps(0.001))
    assert real.applied == simulated.applied == 10
    assert simulated.params.tobytes() == real.params.tobytes()
    plain = sim.simulate(model, data, dataclasses.replace(cfg, augment="none", crop_padding=4),
                         constant_steps(0.001))
    assert plain.params.tobytes() != real.params.tobytes()


# ------------------------------------------------------------ the time budget


def test_steps_under_way_at_the_budget_finish_and_are_applied(tiny):
    """The threads check the deadline before each step, so a step begun
    before it is applied after it: 4 workers on their own cores, 1 ms
    steps, a budget of 30.5 ms: 31 waves of 4 updates, the last ending at
    31 ms (the old simulator dropped the wave under way: 120 updates)."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=4, epochs=10, batch_size=4,
                             time_budget=0.0305)
    r = sim.simulate(model, data, cfg, constant_steps(0.001))
    assert r.status == "time_budget"
    assert r.applied == r.computed == 124 == r.staleness_hist.sum()
    assert r.train_time_s == pytest.approx(0.031)


@pytest.mark.parametrize("algo", ["hogwild", "async", "interval"])
def test_at_the_budget_every_ticket_taken_is_applied_on_shared_cores(tiny, algo):
    """64 workers on 2 cores in 4 ms slices, 1.5 ms steps: at the budget
    most workers are in the middle of a step; every one of those steps is
    applied (the books balance) and the run ends once the last is."""
    model, data = tiny
    cfg = config_where_it_applies(algo=algo, threads=64, epochs=10, batch_size=4, interval=8,
                             time_budget=0.1)
    r = sim.simulate(model, data, cfg, constant_steps(0.0015), cores=2)
    assert r.status == "time_budget" and not r.epochs[-1].complete
    assert r.applied == r.computed == r.staleness_hist.sum()
    # a step begun by 0.1 s ends within the 64 slices of a round of the workers
    assert 0.1 < r.train_time_s < 0.1 + 64 * Q / 2 + 0.0015
    # 2 cores, one step per 1.5 ms each: the budget and the steps under way
    assert r.applied == pytest.approx(2 * r.train_time_s / 0.0015, abs=3)


def test_sync_applies_a_round_whose_steps_all_began_before_the_budget(tiny):
    """Sync, 4 workers on 4 cores, 1 ms steps: rounds of 1 ms. A budget of
    10.5 ms: the 11th round began at 10 ms, before it, and is applied."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="sync", threads=4, epochs=10, batch_size=4,
                             time_budget=0.0105)
    r = sim.simulate(model, data, cfg, constant_steps(0.001))
    assert r.status == "time_budget" and r.applied == 44
    assert r.train_time_s == pytest.approx(0.011)


# ------------------------------------------------------------ the machine's costs


def test_without_costs_or_live_reads_async_and_hogwild_give_the_same_run(tiny):
    """The bare model: async's lock is held for no time, so nobody waits for
    it, and hogwild reads a snapshot as async does: the same run."""
    model, data = tiny
    bare = sim.Costs(live_reads=False)
    runs = [sim.simulate(model, data,
                         engine.TrainConfig(algo=algo, threads=16, epochs=1, batch_size=4),
                         sim.lognormal_steps(0.001, 0.3), cores=2, costs=bare)
            for algo in ("async", "hogwild")]
    assert runs[0].params.tobytes() == runs[1].params.tobytes()
    assert runs[0].staleness_hist.tolist() == runs[1].staleness_hist.tolist()


def test_async_lock_serialises_its_critical_sections(tiny):
    """8 workers on their own cores, 1 ms steps, of which the write (0.5 ms)
    holds the lock, as does a 0.5 ms copy before it: each update needs 1 ms
    of the lock alone, so 500 updates take at least 0.5 s, where hogwild,
    which takes no lock, needs 500 / 8 steps of 1 ms."""
    model, data = tiny
    costs = sim.Costs(read_s=0.0005, apply_s=0.0005)
    runs = {algo: sim.simulate(model, data,
                               engine.TrainConfig(algo=algo, threads=8, epochs=1, batch_size=4),
                               constant_steps(0.001), costs=costs)
            for algo in ("async", "hogwild")}
    assert runs["async"].applied == runs["hogwild"].applied == 500
    assert runs["async"].train_time_s >= 500 * 0.001 * (1 - 1e-9)
    assert runs["hogwild"].train_time_s == pytest.approx(63 * 0.001)  # 62.5 waves of 8
    # waiting for the lock makes each step see fewer updates than hogwild's 7
    assert runs["async"].staleness_hist.tolist() != runs["hogwild"].staleness_hist.tolist()


def test_async_on_its_own_cores_ends_when_its_last_update_does(tiny):
    """With a core each (no time slices), a worker spinning for the lock
    waits for no event of its own. That wait once left a void event at
    infinity in the queue, which set the clock to infinity when it was
    popped: every --eval-every chunk after the first never ran and the run
    lasted forever. Bounds by hand: each update holds the lock 1 ms alone
    (>= 0.5 s for 500), and no update takes longer than its copy, step and
    write one after the other (<= 2 ms each, 1 s in all)."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="async", threads=8, epochs=1, batch_size=4, eval_every=100)
    r = sim.simulate(model, data, cfg, constant_steps(0.001),
                     costs=sim.Costs(read_s=0.0005, apply_s=0.0005))
    assert r.applied == r.computed == 500 == r.staleness_hist.sum()
    assert [a for _, a, _ in r.evals] == [100, 200, 300, 400, 500]
    times = [t for t, _, _ in r.evals]
    assert times == sorted(times) and times[-1] == r.train_time_s
    assert 0.5 <= r.train_time_s <= 1.0


def test_a_lock_holder_preempted_in_its_critical_section_stalls_the_others(tiny):
    """2 workers on 1 core, slices of 4 ms, steps of 3 ms (the last 1.5 ms
    the locked write) after a locked copy of 1 ms: a slice ends inside a
    critical section every few steps, and the worker that then gets the
    core finds the lock's holder off it and yields the core back. Every
    update is still applied once, and the core never idles: 4 ms of CPU
    per update."""
    model, data = tiny
    costs = sim.Costs(read_s=0.001, apply_s=0.0015)
    cfg = engine.TrainConfig(algo="async", threads=2, epochs=1, batch_size=4)
    r = sim.simulate(model, data, cfg, constant_steps(0.003), cores=1, costs=costs)
    assert r.applied == r.computed == 500 == r.staleness_hist.sum()
    # one core does all the work: 4 ms of CPU per update (copy + step)
    assert r.train_time_s == pytest.approx(500 * 0.004, rel=1e-6)


def test_contention_slows_each_step_by_the_busy_cores(tiny):
    """4 workers on their own cores with contention 0.1: every step takes
    1 ms * (1 + 0.1 * 3), so an epoch of 500 updates takes 125 of them."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=4, epochs=1, batch_size=4)
    r = sim.simulate(model, data, cfg, constant_steps(0.001), costs=sim.Costs(contention=0.1))
    assert r.train_time_s == pytest.approx(125 * 0.0013)
    one = sim.simulate(model, data, dataclasses.replace(cfg, threads=1), constant_steps(0.001),
                       costs=sim.Costs(contention=0.1))
    assert one.train_time_s == pytest.approx(500 * 0.001)  # alone: no one to contend with


def test_contention_counts_the_cores_computing_not_the_woken_waiters(tiny):
    """8 workers on their own cores, intervals of y = 2 under the wait gate,
    contention 0.1: two steps run at a time, so each takes 1 ms * (1 + 0.1),
    and an epoch of 500 updates is 250 intervals of 1.1 ms. The six woken
    waiters that find the new interval full go back to sleep without
    computing; counting them as busy (8 cores) made every step 1.7 ms."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="interval", interval=2, gate="wait", threads=8, epochs=1,
                             batch_size=4)
    r = sim.simulate(model, data, cfg, constant_steps(0.001), costs=sim.Costs(contention=0.1))
    assert r.applied == 500 and r.bound_violations == 0
    assert r.train_time_s == pytest.approx(250 * 0.0011)


def test_a_step_cut_by_its_slice_pays_the_switch_when_it_resumes(tiny):
    """2 workers on 1 core, slices of 4 ms, 1.5 ms steps, 0.5 ms per
    switch. A runs 2 steps and 1 ms of a third, B the same; A resumes its
    cut step (0.5 ms left + 0.5 ms cold caches) and runs 2 more, ending
    with its slice; B the same; then both start afresh. 10 updates per
    16 ms of which 1 ms is switching: 500 updates take 0.8 s instead of
    0.75 s. With a core each nobody is cut and nothing is charged."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=2, epochs=1, batch_size=4)
    costs = sim.Costs(switch_s=0.0005)
    shared = sim.simulate(model, data, cfg, constant_steps(0.0015), cores=1, costs=costs)
    assert shared.train_time_s == pytest.approx(0.8)
    plain = sim.simulate(model, data, cfg, constant_steps(0.0015), cores=1)
    assert plain.train_time_s == pytest.approx(0.75)
    own = sim.simulate(model, data, cfg, constant_steps(0.0015), costs=costs)
    assert own.train_time_s == pytest.approx(250 * 0.0015)


def test_slices_of_varying_length_move_the_cuts_not_the_work(tiny):
    """4 workers on 1 core, 1.5 ms steps: with slices of exactly 4 ms every
    worker's third step is cut at the same point of every round, so the
    staleness takes a few values only; with slices of 4 ms * U(0.5, 1.5)
    the cuts fall anywhere and the histogram spreads. The core never idles
    either way: 500 steps take 0.75 s of it. With a core each there are no
    slices and the spread changes nothing."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=4, epochs=1, batch_size=4)
    fixed = sim.simulate(model, data, cfg, constant_steps(0.0015), cores=1)
    spread = sim.simulate(model, data, cfg, constant_steps(0.0015), cores=1,
                          costs=sim.Costs(slice_spread=0.5))
    for r in (fixed, spread):
        assert r.applied == 500 and r.train_time_s == pytest.approx(0.75)
    assert np.count_nonzero(spread.staleness_hist) > np.count_nonzero(fixed.staleness_hist) + 2
    own = [sim.simulate(model, data, cfg, constant_steps(0.0015), costs=sim.Costs(slice_spread=s))
           for s in (0.0, 0.5)]
    assert own[0].staleness_hist.tolist() == own[1].staleness_hist.tolist()


def test_forward_positions_follow_the_layers_multiply_adds():
    """LeNet-5 on CIFAR-10: conv1 is read first, conv2 after conv1's 352,800
    multiply-adds (and the ReLU and pool outputs), the dense layers last;
    every read falls in the forward third of the step."""
    model = models.build("lenet", "cifar10")
    positions = sim.forward_positions(model)
    assert [off for off, _ in positions] == [0, 456, 2872, 50992]
    shares = [at for _, at in positions]
    assert shares[0] == 0 and shares == sorted(shares) and shares[-1] < sim.FORWARD_SHARE


def test_live_reads_change_what_a_cut_step_computes_not_when(tiny):
    """Live reads: a step cut by its slice reads the layers its forward pass
    has not reached when it resumes. The schedule, and so the staleness,
    is the same as with snapshots; the parameters are not (steps of 10
    slices: cut at a tenth, inside the forward pass). With one worker
    nobody else writes, so nothing changes at all."""
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=8, epochs=1, batch_size=4)
    runs = [sim.simulate(model, data, cfg, constant_steps(10 * Q), cores=2,
                         costs=sim.Costs(live_reads=live)) for live in (False, True)]
    assert runs[0].staleness_hist.tolist() == runs[1].staleness_hist.tolist()
    assert runs[0].params.tobytes() != runs[1].params.tobytes()
    one = dataclasses.replace(cfg, threads=1)
    alone = [sim.simulate(model, data, one, constant_steps(10 * Q), cores=1,
                          costs=sim.Costs(live_reads=live)) for live in (False, True)]
    assert alone[0].params.tobytes() == alone[1].params.tobytes()


def test_a_cut_steps_forward_progress_never_goes_back(tiny, monkeypatch):
    """Live reads refresh the layers a resumed step has not reached; the
    switch cost burnt first is not progress. With a switch longer than a
    slice (1.5 slices) a step is cut again before it has paid it, and the
    progress its next resume reads from must not fall below the last."""
    model, data = tiny
    seen: dict[int, list[float]] = {}
    real_read_rest = sim.Simulation.read_rest

    def spy(self, w, done):
        seen.setdefault(w, []).append(done)
        real_read_rest(self, w, done)

    monkeypatch.setattr(sim.Simulation, "read_rest", spy)
    cfg = engine.TrainConfig(algo="hogwild", threads=2, epochs=1, batch_size=4)
    sim.simulate(model, data, cfg, constant_steps(10 * Q), cores=1,
                 costs=sim.Costs(switch_s=1.5 * Q))
    assert seen
    for dones in seen.values():
        # a new step starts its progress at 0; within one step it only grows
        steps, current = [], []
        for d in dones:
            if current and d < current[-1] - 0.5:
                steps.append(current)
                current = []
            current.append(d)
        steps.append(current)
        assert all(0 <= d <= 1 for d in dones)
        assert all(step == sorted(step) for step in steps)


def test_the_costs_keep_the_books_and_the_interval_bound(tiny):
    model, data = tiny
    costs = sim.Costs(contention=0.05, switch_s=0.0002, read_s=0.0001, apply_s=0.0002)
    for algo in ("hogwild", "async", "interval"):
        cfg = config_where_it_applies(algo=algo, threads=24, epochs=1, batch_size=4, interval=6,
                                 eval_every=150)
        r = sim.simulate(model, data, cfg, sim.lognormal_steps(0.001, 0.4), cores=3,
                         costs=costs)
        assert r.status == "completed" and r.applied == 500 == r.staleness_hist.sum()
        if algo == "interval":
            assert r.staleness_max <= 5 and r.bound_violations == 0


def test_sections_are_measured_in_seconds(tiny):
    model, _ = tiny
    read_s, apply_s = sim.measure_sections(model, repeats=5)
    assert 0 < read_s < 0.1 and 0 < apply_s < 0.1


def test_the_simulator_needs_a_positive_time_slice(tiny):
    model, data = tiny
    with pytest.raises(ValueError, match="time slice"):
        sim.simulate(model, data, engine.TrainConfig(algo="hogwild", threads=4),
                     constant_steps(0.001), cores=2, quantum=0.0)


def test_staleness_hist_counts_are_integers(tiny):
    model, data = tiny
    cfg = engine.TrainConfig(algo="hogwild", threads=4, epochs=1, batch_size=4)
    r = sim.simulate(model, data, cfg, constant_steps(0.001), cores=2)
    assert r.staleness_hist.dtype == np.int64


# ------------------------------------------- against recorded real staleness

RECORDED = Path(__file__).resolve().parents[2] / "bench" / "results" / "cifar10-2-128.json"


def test_hogwild_at_128_threads_on_2_cores_has_the_recorded_real_staleness():
    """Issue 22's case, against real runs already made (the committed sweep
    bench/results/cifar10-2-128.json: 128 threads on this project's 2-core
    machine, 3 seeds, --eval-every 1000): given the real per-core step
    time (2 cores * b / samples per s: 1.56 ms, where one thread alone
    takes about 1.05 ms) and 4 ms time slices, the simulator's staleness
    distribution is within total variation 0.15 of the real one and its
    mean within 10 %. Staleness depends on the timing, not on the model,
    so a tiny model stands in for LeNet-5; the simulated side is fixed
    (seeded), the real side recorded, so the machine's load plays no part.
    One epoch of 1,250 simulated updates, compared in bins of 4 values of
    tau: bins of one measure sampling noise as much as the simulator (TV
    0.18 here, 0.135 with 9,375 updates; in bins of 4, 0.13 and 0.10).
    (Before the fix: no eval_every in the simulator and single-thread step
    times gave mean 116 against 92, TV 0.37.)"""
    saved = json.loads(RECORDED.read_text())
    options, runs = saved["options"], saved["runs"]["hogwild"]["128"]
    real = np.zeros(max(len(r["staleness_hist"]) for r in runs), np.int64)
    for r in runs:
        real[:len(r["staleness_hist"])] += r["staleness_hist"]
    step_s = 2 * options["batch_size"] / statistics.median(r["samples_per_s"] for r in runs)
    data = datasets.synthetic(seed=1, n_train=20000, n_test=50, shape=(1, 4, 4), num_classes=2)
    model = models.build("mlp", input_shape=(1, 4, 4), num_classes=2, hidden=(4,))
    cfg = engine.TrainConfig(algo="hogwild", threads=128, epochs=1,
                             batch_size=options["batch_size"],
                             eval_every=options["eval_every"])
    hist = sim.simulate(model, data, cfg, sim.lognormal_steps(step_s, 0.1), cores=2,
                        quantum=Q).staleness_hist
    size = -(-max(real.size, hist.size) // 4) * 4
    p, q = np.zeros(size), np.zeros(size)
    p[:real.size], q[:hist.size] = real / real.sum(), hist / hist.sum()
    taus = np.arange(size)
    assert 0.5 * np.abs(p.reshape(-1, 4).sum(1) - q.reshape(-1, 4).sum(1)).sum() <= 0.15
    assert taus @ q == pytest.approx(taus @ p, rel=0.1)
