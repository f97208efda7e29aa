"""The sequential runner's glue around train_steps (its arithmetic is
tests/nn/test_network.py's, its resume tests/test_checkpoints.py's)."""

from __future__ import annotations

from iasgd import data as datasets
from iasgd import engine
from iasgd.executors import sequential
from iasgd.nn import models


def record_steps_calls(monkeypatch) -> list:
    """The (steps, augment, knobs) arguments of every train_steps call the
    sequential runner makes from now on (the calls still run)."""
    train_steps = sequential.N.train_steps
    calls = []

    def recorded(weights, buffers, inputs, steps, losses, augment, knobs):
        calls.append((steps, augment, knobs))
        return train_steps(weights, buffers, inputs, steps, losses, augment, knobs)
    monkeypatch.setattr(sequential.N, "train_steps", recorded)
    return calls


def test_each_epochs_steps_go_on_from_the_updates_before_it(monkeypatch):
    # the step size's schedule counts the run's updates, not the epoch's
    data = datasets.synthetic(seed=0, n_train=200, n_test=50)
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(epochs=3, batch_size=16, lr_decay="linear")
    quota = engine.steps_per_epoch(200, 16)
    calls = record_steps_calls(monkeypatch)
    engine.train(model, data, cfg)
    seen = {(steps.epoch_start, steps.sgd.planned) for steps, _, _ in calls if steps.count}
    assert sorted(seen) == [(e * quota, 3 * quota) for e in range(3)]


def test_the_steps_are_told_to_augment_only_where_the_run_does(monkeypatch):
    """train_steps' `augment`: True where --augment asks, None otherwise (a
    None argument keeps the augmenting code out of the compiled steps: a
    shorter cold start, bench/coldstart.py); the augmented run trains on
    other images."""
    data = datasets.synthetic(seed=0, n_train=64, n_test=16)
    model = models.build("lenet", "synthetic")
    calls = record_steps_calls(monkeypatch)
    params = {}
    for augment in ("none", "crop,flip", "flip"):
        calls.clear()
        padding = {"crop_padding": 2} if "crop" in augment else {}
        cfg = engine.TrainConfig(epochs=1, batch_size=16, augment=augment, **padding)
        params[augment] = engine.train(model, data, cfg).params
        assert {told for _, told, _ in calls} == ({None} if augment == "none" else {True})
    assert params["none"].tobytes() != params["crop,flip"].tobytes()


def test_the_steps_compile_the_other_knobs_only_where_the_run_sets_one(monkeypatch):
    """train_steps' `knobs`: None in the paper's setting (the default job:
    its steps compile none of the recipe's knobs), True with weight decay or
    a schedule, or a model with running statistics."""
    data = datasets.synthetic(seed=0, n_train=32, n_test=16)
    calls = record_steps_calls(monkeypatch)
    mlp = models.build("mlp", "synthetic", hidden=(8,))
    with_bn = models.build("dense8,bn,relu,dense", "synthetic")
    for model, knobs, want in ((mlp, {}, None), (mlp, {"weight_decay": 5e-4}, True),
                               (mlp, {"lr_decay": "cosine"}, True), (with_bn, {}, True)):
        calls.clear()
        engine.train(model, data, engine.TrainConfig(epochs=1, batch_size=16, **knobs))
        assert {told for _, _, told in calls} == {want}
