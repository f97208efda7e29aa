"""The sequential trainer: it learns, it is bit-reproducible, it honours the
time budget; and (slow) LeNet-5 on real CIFAR-10 data."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from iasgd import data as datasets
from iasgd import engine, files, results
from iasgd.executors import sequential
from iasgd.nn import models

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SHARED_CIFAR10 = SHARED_DATA / "cifar-10-jpeg-python.tar.gz"


@pytest.fixture(scope="module")
def synthetic():
    return datasets.synthetic(seed=0, n_train=2000, n_test=500)


def test_sequential_lenet_learns_synthetic_data(synthetic):
    model = models.build("lenet", "synthetic")
    result = engine.train(model, synthetic, engine.TrainConfig(epochs=3, lr=0.02, seed=1))
    assert result.status == "completed"
    assert [e.epoch for e in result.epochs] == [1, 2, 3]
    assert result.epochs[-1].test_accuracy >= 0.98
    assert result.epochs[-1].train_loss < result.epochs[0].train_loss
    assert result.samples == 3 * 2000


def test_sequential_mlp_learns_synthetic_data(synthetic):
    model = models.build("mlp", "synthetic", hidden=(64, 32))
    cfg = engine.TrainConfig(epochs=3, lr=0.02, momentum=0.5, seed=2)
    result = engine.train(model, synthetic, cfg)
    assert result.epochs[-1].test_accuracy >= 0.98


def test_sequential_is_bit_reproducible_per_seed(synthetic):
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(epochs=1, batch_size=7, seed=5)  # 2000 % 7 != 0: a short last batch
    a = engine.train(model, synthetic, cfg)
    b = engine.train(model, synthetic, cfg)
    c = engine.train(model, synthetic, dataclasses.replace(cfg, seed=6))
    assert a.params.tobytes() == b.params.tobytes()
    assert a.epochs[0].train_loss == b.epochs[0].train_loss
    assert not np.array_equal(a.params, c.params)


def test_time_budget_stops_mid_epoch():
    data = datasets.synthetic(seed=0, n_train=20000, n_test=100)
    model = models.build("lenet", "synthetic")
    result = engine.train(model, data, engine.TrainConfig(epochs=50, time_budget=0.3))
    assert result.status == "time_budget"
    assert len(result.epochs) < 50
    assert result.train_time_s < 5
    assert not result.epochs[-1].complete or len(result.epochs) > 1


def test_hooks_see_every_epoch_and_progress(synthetic):
    seen: list = []
    hooks = engine.Hooks(on_epoch_start=lambda e, n: seen.append(("start", e, n)),
                         on_progress=lambda done, live: seen.append(("progress", done)),
                         on_epoch_end=lambda r: seen.append(("end", r.epoch)))
    engine.train(models.build("lenet", "synthetic"), synthetic,
                 engine.TrainConfig(epochs=2), hooks)
    starts = [i for i, s in enumerate(seen) if s[0] == "start"]
    ends = [i for i, s in enumerate(seen) if s[0] == "end"]
    assert [seen[i] for i in starts] == [("start", 1, 2000), ("start", 2, 2000)]
    assert [seen[i] for i in ends] == [("end", 1), ("end", 2)]
    for first, last in zip(starts, ends, strict=True):
        done = [s[1] for s in seen[first + 1:last]]
        assert done and done == sorted(done) and done[-1] == 2000


def test_mean_step_loss_weights_the_short_last_batch():
    # batches of 4, 4 and 2 samples
    assert results.mean_step_loss(np.array([1.0, 2.0, 4.0]), 4, 10) == pytest.approx(
        (4 + 8 + 8) / 10)


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_CIFAR10.exists(),
                    reason=f"shared CIFAR-10 archive not found at {SHARED_CIFAR10}")
def test_lenet_on_5000_cifar10_images_beats_25_percent(tmp_path_factory):
    cache = Path(os.environ.get("IASGD_TEST_CACHE", tmp_path_factory.mktemp("data")))
    full = datasets.load("cifar10", cache, SHARED_CIFAR10, progress=False)
    subset = datasets.Dataset("cifar10", full.x_train[:5000].copy(), full.y_train[:5000].copy(),
                              full.x_test, full.y_test, full.num_classes)
    model = models.build("lenet", "cifar10")
    # 625 steps is few for the paper's lr 0.005 (12-17 % after them); this
    # setting gave 29-34 % over seeds 0-3.
    cfg = engine.TrainConfig(epochs=1, batch_size=8, lr=0.01, momentum=0.9)
    result = engine.train(model, subset, cfg)
    assert result.epochs[0].test_accuracy > 0.25


@pytest.mark.parametrize("algo", ["sequential", "hogwild", "interval", "sync"])
def test_divergence_stops_the_run_and_says_where(synthetic, algo):
    model = models.build("lenet", "synthetic")
    # lr 1e39 is infinite in float32: the first update makes parameters
    # non-finite. (A merely large lr such as 80 can kill every ReLU before
    # anything overflows, leaving a finite loss: that made this test flaky.)
    cfg = engine.TrainConfig(algo=algo, threads=1 if algo == "sequential" else 2, lr=1e39,
                             epochs=3)
    result = engine.train(model, synthetic, cfg)
    assert result.status == "diverged"
    assert result.diverged_at["step"] >= 1
    assert len(result.epochs) == result.diverged_at["epoch"] < 3  # stopped there


def test_nan_is_written_as_null(tmp_path):
    path = tmp_path / "r.json"
    files.write_json_atomic(path, {"a": float("nan"), "b": [1.0, float("inf")]})
    assert path.read_text().split() == ["{", '"a":', "null,", '"b":', "[", "1.0,", "null", "]",
                                        "}"]


def test_sequential_epoch_with_a_short_last_batch_matches_a_numpy_loop():
    """40 images at b = 16: batches of 16, 16 and 8 in the epoch's shuffled
    order, each one momentum step on its own mean gradient."""
    data = datasets.synthetic(seed=6, n_train=40, n_test=8)
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(epochs=1, lr=0.03, momentum=0.5, seed=3)
    result = engine.train(model, data, cfg)
    order = sequential.shuffle_streams(3).permutation(40)
    params = model.init(3).astype(np.float64)
    velocity = np.zeros_like(params)
    losses = []
    for lo in (0, 16, 32):
        idx = order[lo:lo + 16]
        loss, grad = model.loss_and_grad(params.astype(np.float32),
                                         data.x_train[idx].astype(np.float32) / 255.0,
                                         data.y_train[idx])
        losses.append((loss, idx.size))
        velocity = 0.5 * velocity + grad
        params -= 0.03 * velocity
    np.testing.assert_allclose(result.params, params, rtol=1e-4, atol=1e-6)
    mean = sum(loss * n for loss, n in losses) / 40  # sample-weighted
    assert result.epochs[0].train_loss == pytest.approx(mean, rel=1e-5)


@pytest.mark.parametrize("algo", ["sequential", "sync", "hogwild", "interval"])
def test_every_executor_trains_a_batch_norm_net(synthetic, algo):
    """The running statistics are updated by every worker's steps (they
    leave their initial mean 0 and variance 1), never by SGD (they stay a
    mean and a variance: the variances positive), and evaluation uses them."""
    model = models.build("conv8k3s,bn,relu,pool,dense16,bn,relu,dense", "synthetic")
    cfg = engine.TrainConfig(algo=algo, threads=1 if algo == "sequential" else 2, epochs=2,
                             lr=0.05, momentum=0.9, weight_decay=5e-4, seed=2, batch_size=32)
    result = engine.train(model, synthetic, cfg)
    assert result.status == "completed"
    stats = model.tensors(result.params)
    for bn in ("bn1", "bn2"):
        assert np.all(stats[f"{bn}.running_var"] > 0)
        assert np.abs(stats[f"{bn}.running_mean"]).max() > 1e-3
        assert np.abs(stats[f"{bn}.running_var"] - 1).max() > 1e-3
    assert result.epochs[-1].test_accuracy > 0.5
