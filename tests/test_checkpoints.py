"""Checkpoints: an interrupted sequential run resumes bit-identically; a
parallel one resumes and completes its epochs; bad files are clear errors and
a failed write leaves the old checkpoint whole."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from iasgd import checkpoints, engine
from iasgd import data as datasets
from iasgd.nn import models


@pytest.fixture(scope="module")
def synthetic():
    return datasets.synthetic(seed=0, n_train=2000, n_test=200)


class StopInEpoch:
    """Hooks that ask the run to stop once it is inside `epoch` (after at
    least one progress report there), and save its checkpoint to `path`."""

    def __init__(self, epoch: int, path):
        self.epoch, self.path, self.current, self.progressed, self.saved = epoch, path, 0, 0, 0

    def hooks(self) -> engine.Hooks:
        return engine.Hooks(on_epoch_start=self.start, on_progress=self.progress,
                            should_stop=self.should_stop, on_checkpoint=self.save)

    def start(self, epoch, _):
        self.current, self.progressed = epoch, 0

    def progress(self, done, _):
        self.progressed += done > 0

    def should_stop(self):
        return "interrupted" if self.current == self.epoch and self.progressed else None

    def save(self, snap):
        checkpoints.save(self.path, {"model": "lenet"}, snap)
        self.saved += 1


def interrupted_then_resumed(model, data, cfg, tmp_path, epoch=2):
    stopper = StopInEpoch(epoch, tmp_path / "c.h5")
    first = engine.train(model, data, cfg, stopper.hooks())
    assert first.status == "interrupted" and stopper.saved == 1
    assert len(first.epochs) == epoch - 1
    config, snap = checkpoints.load(tmp_path / "c.h5")
    assert config == {"model": "lenet"}
    if cfg.algo == "sequential":  # stopped inside the epoch, not at its end
        assert 0 < snap.meta["step"] < engine.steps_per_epoch(2000, cfg.batch_size)
    return first, engine.train(model, data, cfg, resume=snap)


def test_sequential_resume_is_bit_identical(synthetic, tmp_path):
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(epochs=3, batch_size=8, lr=0.02, seed=4)
    whole = engine.train(model, synthetic, cfg)
    _, resumed = interrupted_then_resumed(model, synthetic, cfg, tmp_path)
    assert resumed.status == "completed"
    assert resumed.params.tobytes() == whole.params.tobytes()
    assert [e.train_loss for e in resumed.epochs] == [e.train_loss for e in whole.epochs]
    assert [e.test_accuracy for e in resumed.epochs] == [e.test_accuracy for e in whole.epochs]
    assert resumed.applied == whole.applied


@pytest.mark.parametrize(("algo", "extra"), [
    ("interval", {"interval_schedule": "probe", "y0": 8, "probe_steps": 20, "exec_steps": 60}),
    ("hogwild", {"threads_schedule": "window", "window": 2, "probe_steps": 20,
                 "exec_steps": 60}),
    ("sync", {}),
])
def test_parallel_resume_completes_the_run(synthetic, tmp_path, algo, extra):
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(algo=algo, threads=3, epochs=3, lr=0.02, **extra)
    first, resumed = interrupted_then_resumed(model, synthetic, cfg, tmp_path)
    quota = engine.steps_per_epoch(2000, 16)
    assert resumed.status == "completed"
    assert [e.epoch for e in resumed.epochs] == [1, 2, 3]
    assert all(e.complete for e in resumed.epochs)
    assert resumed.applied == 3 * quota == resumed.staleness_hist.sum()
    assert sum(sum(e.staleness_hist) for e in resumed.epochs) == 3 * quota
    assert resumed.bound_violations == 0
    assert resumed.epochs[-1].test_accuracy > 0.9
    if algo == "interval":  # the controller went on where it stopped
        assert resumed.interval_trace[: len(first.interval_trace)] == first.interval_trace


@pytest.mark.parametrize(("every", "seen"), [(2, [3, 5]), (3, [4, 5]), (0, [5])])
def test_checkpoint_every_writes_at_epoch_ends_and_after_the_last(synthetic, every, seen):
    model = models.build("lenet", "synthetic")
    epochs_seen = []
    hooks = engine.Hooks(on_checkpoint=lambda snap: epochs_seen.append(snap.meta["epoch"]))
    engine.train(model, synthetic, engine.TrainConfig(epochs=4), hooks, checkpoint_every=every)
    assert epochs_seen == seen  # meta["epoch"]: the next epoch to run; 5 = after the last


@pytest.mark.parametrize("algo", ["sequential", "hogwild"])
def test_a_run_stopped_by_its_time_budget_resumes(synthetic, tmp_path, algo):
    """The checkpoint is taken before the cut epoch is recorded, so a resume
    finishes that epoch once (sequential: bit-identically)."""
    model = models.build("lenet", "synthetic")
    threads = 1 if algo == "sequential" else 2
    cfg = engine.TrainConfig(algo=algo, threads=threads, epochs=2, batch_size=8, lr=0.02, seed=3)
    path = tmp_path / "c.h5"
    hooks = engine.Hooks(on_checkpoint=lambda snap: checkpoints.save(path, {}, snap))
    cut = engine.train(model, synthetic, dataclasses.replace(cfg, time_budget=1e-4), hooks)
    assert cut.status == "time_budget" and not cut.epochs[-1].complete
    _, snap = checkpoints.load(path)
    resumed = engine.train(model, synthetic, cfg, resume=snap)
    quota = engine.steps_per_epoch(2000, 8)
    assert resumed.status == "completed"
    assert [(e.epoch, e.complete) for e in resumed.epochs] == [(1, True), (2, True)]
    assert resumed.applied == 2 * quota == resumed.staleness_hist.sum()
    if algo == "sequential":
        whole = engine.train(model, synthetic, cfg)
        assert resumed.params.tobytes() == whole.params.tobytes()
        assert [e.train_loss for e in resumed.epochs] == [e.train_loss for e in whole.epochs]


def test_bad_checkpoints_are_one_line_errors(tmp_path):
    with pytest.raises(checkpoints.CheckpointError, match="does not exist"):
        checkpoints.load(tmp_path / "none.h5")
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"not hdf5 at all" * 100)
    with pytest.raises(checkpoints.CheckpointError, match="corrupt or truncated"):
        checkpoints.load(garbage)
    good = tmp_path / "good.h5"
    checkpoints.save(good, {}, engine.Snapshot({"a": np.arange(100000)}, {"x": 1}))
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(checkpoints.CheckpointError, match="corrupt or truncated") as info:
        checkpoints.load(truncated)
    assert "\n" not in str(info.value)
    import h5py

    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = 1
    with pytest.raises(checkpoints.CheckpointError, match="not an iasgd checkpoint"):
        checkpoints.load(other)


def test_a_failed_write_leaves_the_old_checkpoint(tmp_path):
    path = tmp_path / "c.h5"
    checkpoints.save(path, {"v": 1}, engine.Snapshot({"a": np.ones(3)}, {}))
    before = path.read_bytes()
    with pytest.raises(TypeError):
        checkpoints.save(path, {"v": 2}, engine.Snapshot({"a": np.array([object()])}, {}))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5"]  # no temporary left
