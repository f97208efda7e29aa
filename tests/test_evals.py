"""Evaluation every N applied updates (TrainConfig.eval_every): the sequential
runner stays bit-identical, the threads executor evaluates at each boundary
outside the training clock and a resumed run keeps its evals (the
simulator's: tests/executors/test_sim_fidelity.py)."""

from __future__ import annotations

import dataclasses
import time

import pytest
from test_checkpoints import interrupted_then_resumed

from iasgd import config, engine, results
from iasgd import data as datasets
from iasgd.executors.epochs import TrainingClock
from iasgd.nn import models

N_TRAIN = 2000


@pytest.fixture(scope="module")
def synthetic():
    return datasets.synthetic(seed=0, n_train=N_TRAIN, n_test=200)


@pytest.fixture(scope="module")
def lenet():
    return models.build("lenet", "synthetic")


def test_eval_points_stop_at_every_multiple_then_the_end():
    assert config.eval_points(0, 125, 0) == [125]
    assert config.eval_points(0, 125, 50) == [50, 100, 125]
    assert config.eval_points(100, 250, 50) == [150, 200, 250]  # 250 is the end itself
    assert config.eval_points(130, 250, 50) == [150, 200, 250]  # a resume mid-chunk
    assert config.eval_points(0, 30, 50) == [30]


def test_sequential_with_eval_every_is_bit_identical_to_without(synthetic, lenet):
    cfg = engine.TrainConfig(epochs=2, lr=0.02, seed=3)
    plain = engine.train(lenet, synthetic, cfg)
    every = engine.train(lenet, synthetic, dataclasses.replace(cfg, eval_every=40))
    assert every.params.tobytes() == plain.params.tobytes()
    assert [e.train_loss for e in every.epochs] == [e.train_loss for e in plain.epochs]
    assert plain.evals == []
    quota = engine.steps_per_epoch(N_TRAIN, cfg.batch_size)  # 125: boundaries 40, 80, 120, 125
    applied = [a for _, a, _ in every.evals]
    assert applied == [40, 80, 120, 125, 160, 200, 240, 250]
    assert applied[3] == quota and applied[-1] == 2 * quota
    times = [t for t, _, _ in every.evals]
    assert times == sorted(times) and times[-1] == pytest.approx(every.train_time_s)
    assert every.evals[3][2] == every.epochs[0].test_accuracy  # epoch ends: the record's
    assert all(0 <= acc <= 1 for _, _, acc in every.evals)


@pytest.mark.parametrize("algo", ["hogwild", "interval", "sync"])
def test_threads_evaluate_at_each_boundary_outside_the_clock(synthetic, lenet, algo):
    cfg = engine.TrainConfig(algo=algo, threads=2, epochs=2, lr=0.02, seed=1, eval_every=30)
    result = engine.train(lenet, synthetic, cfg)
    assert result.status == "completed"
    quota = engine.steps_per_epoch(N_TRAIN, cfg.batch_size)
    expected = sorted({*range(30, 2 * quota, 30), quota, 2 * quota})
    assert [a for _, a, _ in result.evals] == expected
    times = [t for t, _, _ in result.evals]
    assert times == sorted(times)
    assert times[-1] == pytest.approx(result.train_time_s)
    assert result.evals[expected.index(quota)][1:] == [quota, result.epochs[0].test_accuracy]
    assert result.applied == 2 * quota and result.bound_violations == 0
    # eight evaluations inside the epochs: none of their time is training time
    assert result.eval_time_s > 0
    doc = results.results_document({}, result, lenet.num_params)
    assert doc["evals"] == result.evals


def test_time_budget_with_eval_every_stops_and_keeps_its_evals(lenet):
    data = datasets.synthetic(seed=0, n_train=20000, n_test=100)
    cfg = engine.TrainConfig(algo="hogwild", threads=2, epochs=50, time_budget=0.5,
                             eval_every=20)
    result = engine.train(lenet, data, cfg)
    assert result.status == "time_budget"
    assert result.train_time_s < 3
    assert all(t <= result.train_time_s + 1e-6 for t, _, _ in result.evals)
    assert len(result.evals) >= 2


def slow_evaluations(monkeypatch, seconds: float) -> None:
    """Every evaluation takes at least `seconds` more (a big test set, a busy
    machine)."""
    evaluate = results.test_accuracy

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return evaluate(*args, **kwargs)
    monkeypatch.setattr(results, "test_accuracy", slow)


def test_evaluations_do_not_spend_the_time_budget(lenet, monkeypatch):
    # Each evaluation outlasts the whole budget: the workers, waiting at the
    # boundary, must not find their deadline passed meanwhile, so the budget
    # is spent training (a floor: a busy machine only trains longer).
    # (about 90 updates in the budget here, so some 17 evaluations; a machine
    # four times as busy still makes 4)
    slow_evaluations(monkeypatch, 0.2)
    data = datasets.synthetic(seed=0, n_train=20000, n_test=100)
    cfg = engine.TrainConfig(algo="hogwild", threads=2, epochs=50, time_budget=0.15,
                             eval_every=5)
    result = engine.train(lenet, data, cfg)
    assert result.status == "time_budget"
    assert result.train_time_s >= 0.15
    assert len(result.evals) >= 2
    assert all(t <= result.train_time_s + 1e-6 for t, _, _ in result.evals)


def test_an_evaluation_leaves_the_clock_where_it_recorded_it(synthetic, lenet, monkeypatch):
    # The divergence check before an evaluation is left out of the clock
    # with it: the time recorded for the evaluation must be the time the
    # clock goes on from, or a run that stops right after ends before it.
    # (The sequential runner's clock counts its compiled calls only.)
    cfg = engine.TrainConfig(algo="interval", threads=2, epochs=1, eval_every=10)
    ex = engine._runner(cfg)(lenet, synthetic, cfg)
    check = ex.check_diverged

    def slow_check():
        time.sleep(0.2)
        return check()
    monkeypatch.setattr(ex, "check_diverged", slow_check)
    ex.clock = TrainingClock()
    assert ex.evaluate_inside_epoch()
    assert ex.train_seconds() >= ex.result.evals[-1][0]


@pytest.mark.parametrize("algo", ["sequential", "interval"])
def test_a_resumed_run_keeps_its_evals_and_goes_on_at_the_boundaries(synthetic, lenet, tmp_path,
                                                                     algo):
    threads = 1 if algo == "sequential" else 2
    cfg = engine.TrainConfig(algo=algo, threads=threads, epochs=3, lr=0.02, seed=2,
                             eval_every=50)
    # no timed monitor ticks at all: the threads' progress and the stop come
    # at the eval_every boundaries, whatever the machine's speed (a chunk
    # shorter than one tick once saw neither, and the run never stopped)
    first, resumed = interrupted_then_resumed(lenet, synthetic, cfg, tmp_path,
                                              monitor_seconds=600.0)
    assert resumed.status == "completed"
    assert resumed.evals[: len(first.evals)] == first.evals
    quota = engine.steps_per_epoch(N_TRAIN, cfg.batch_size)
    assert [a for _, a, _ in resumed.evals] == sorted({*range(50, 3 * quota, 50), quota,
                                                       2 * quota, 3 * quota})
    if algo == "sequential":
        whole = engine.train(lenet, synthetic, cfg)
        assert resumed.params.tobytes() == whole.params.tobytes()
        assert [e[1:] for e in resumed.evals] == [e[1:] for e in whole.evals]
