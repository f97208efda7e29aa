"""Checkpoints: an interrupted sequential run resumes bit-identically; a
parallel one resumes and completes its epochs; bad files, and checkpoints
whose contents do not fit the run resuming them, are clear errors; a failed
write leaves the old checkpoint whole, and a killed one's temporary is
removed by the next write."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from iasgd import checkpoints, engine, run
from iasgd import data as datasets
from iasgd.executors import sequential, threads
from iasgd.nn import models

REPO = Path(__file__).resolve().parents[1]

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


def interrupted_then_resumed(model, data, cfg, tmp_path, epoch=2, monitor_seconds=0.001):
    """A run stopped inside `epoch` (StopInEpoch), and its resume. Progress
    comes after every sequential step (its chunks would otherwise grow to
    0.1 s, on a fast machine a whole epoch, and the stop come at its end)
    and every `monitor_seconds` from the threads' monitor (its 20 ms could
    outlast a whole epoch too)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sequential, "CHUNK_SECONDS", 0.0)
        patch.setattr(threads, "MONITOR_SECONDS", monitor_seconds)
        stopper = StopInEpoch(epoch, tmp_path / "c.h5")
        first = engine.train(model, data, cfg, stopper.hooks())
        assert first.status == "interrupted" and stopper.saved == 1
        assert len(first.epochs) == epoch - 1
        config, snap = checkpoints.load(tmp_path / "c.h5")
        assert config == {"model": "lenet"}
        if cfg.algo == "sequential":  # stopped inside the epoch, not at its end
            assert 0 < snap.meta["step"] < engine.steps_per_epoch(2000, cfg.batch_size)
        return first, engine.train(model, data, cfg, resume=snap)


@pytest.mark.parametrize("knobs", [{}, {"lr_decay": "cosine", "lr_warmup": 0.2,
                                      "weight_decay": 1e-3, "nesterov": True,
                                      "label_smoothing": 0.1},
                                   {"augment": "crop,flip", "crop_padding": 3}],
                         ids=["paper", "scheduled", "augmented"])
def test_sequential_resume_is_bit_identical(synthetic, tmp_path, knobs):
    # scheduled: stopped in epoch 2, mid-decay, the resume goes on with the
    # step size of the update it resumes at; augmented: the resumed steps
    # draw the codes the whole run drew at those steps
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(epochs=3, batch_size=8, lr=0.02, seed=4, **knobs)
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


# ---------------------------------------------------------------- forged checkpoints


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory):
    """Real end-of-run checkpoints of tiny runs on the default synthetic data:
    sequential lenet, interval lenet on 2 threads, sequential mlp."""
    where = tmp_path_factory.mktemp("saved")
    for name, args in (("seq", []), ("par", ["--algo", "interval", "--threads", "2"]),
                       ("mlp", ["--model", "mlp"])):
        assert run.main(["--dataset", "synthetic", "--epochs", "1", "--quiet",
                         "--out", str(where / f"{name}.json"), *args]) == 0
    return where


def _rewrite_json(f, key, edit) -> None:
    value = json.loads(f[key][()])
    edit(value)
    del f[key]
    f[key] = json.dumps(value)


def _drop_array(name):
    return lambda f: f["arrays"].__delitem__(name)


def _replace_array(name, change):
    def edit(f):
        array = change(f["arrays"][name][()])
        del f["arrays"][name]
        f["arrays"].create_dataset(name, data=array)
    return edit


def _edit_meta(change):
    return lambda f: _rewrite_json(f, "meta", change)


FORGERIES = {  # name: (saved run, edit of its checkpoint, what the error must name)
    "no params": ("seq", _drop_array("params"), "'params'"),
    "no epoch": ("seq", _edit_meta(lambda m: m.pop("epoch")), "'epoch'"),
    "epoch a string": ("seq", _edit_meta(lambda m: m.update(epoch="2")), "'epoch'"),
    "short params": ("seq", _replace_array("params", lambda a: a[:-1]), "'params'"),
    "float64 params": ("seq", _replace_array("params", lambda a: a.astype(np.float64)),
                       "float64"),
    "short losses": ("seq", _replace_array("losses", lambda a: a[:-1]), "'losses'"),
    "short state": ("par", _replace_array("state", lambda a: a[:-1]), "'state'"),
    "short probe": ("par", _replace_array("probe", lambda a: a[:1]), "'probe'"),
    "no ring": ("par", _drop_array("ring"), "'ring'"),
    "no control": ("par", _edit_meta(lambda m: m.pop("control")), "'control'"),
    "a ray run's": ("par", _edit_meta(lambda m: m.update(backend="ray")), "ray"),
    "mlp as lenet": ("mlp", lambda f: _rewrite_json(
        f, "config", lambda c: c.update(model="lenet", hidden=None)), "'params'"),
}


def forged(saved_runs, tmp_path, name):
    """A copy of a saved run's checkpoint, rewritten by FORGERIES[name]."""
    import h5py

    run_name, edit, _ = FORGERIES[name]
    path = tmp_path / "forged.ckpt.h5"
    shutil.copy(saved_runs / f"{run_name}.ckpt.h5", path)
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


@pytest.mark.parametrize("name", FORGERIES)
def test_a_forged_checkpoint_is_refused_by_the_api_in_one_line(saved_runs, tmp_path, name):
    config, snap = checkpoints.load(forged(saved_runs, tmp_path, name))
    args = argparse.Namespace(**config)
    model = models.build(args.model, args.dataset, hidden=args.hidden)
    data = datasets.load("synthetic")
    cfg = dataclasses.replace(run.train_config(args), epochs=3)
    with pytest.raises(checkpoints.CheckpointError, match=FORGERIES[name][2]) as info:
        engine.train(model, data, cfg, resume=snap)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", FORGERIES)
def test_a_forged_checkpoint_is_refused_by_the_cli_in_one_line(saved_runs, tmp_path, name,
                                                               capsys, monkeypatch):
    path = forged(saved_runs, tmp_path, name)
    monkeypatch.chdir(tmp_path)
    assert run.main(["--resume", str(path), "--epochs", "3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"iasgd: error: --resume {path}: ") and err.count("\n") == 1
    assert FORGERIES[name][2] in err
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # nothing written


def test_python_m_iasgd_run_refuses_a_forged_checkpoint_without_a_traceback(saved_runs,
                                                                             tmp_path):
    path = forged(saved_runs, tmp_path, "short state")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "iasgd.run", "--resume", str(path),
                           "--epochs", "3"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "'state'" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", ["no params", "short params", "no epoch", "par"])
def test_a_ray_resume_checks_the_snapshot_before_starting_ray(saved_runs, tmp_path, name,
                                                              monkeypatch):
    """--backend ray: the parameters' length and the backend are checked (RayRun restores
    the rest on its server), before any Ray is started."""
    from iasgd.executors import ray_cluster

    def no_ray(*_a, **_k):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(ray_cluster, "connect", no_ray)
    if name == "par":  # a threads run's snapshot, otherwise intact
        _, snap = checkpoints.load(saved_runs / "par.ckpt.h5")
        needle = "threads"
    else:
        _, snap = checkpoints.load(forged(saved_runs, tmp_path, name))
        snap.meta["backend"] = "ray"
        needle = FORGERIES[name][2]
    cfg = engine.TrainConfig(algo="hogwild", threads=2, backend="ray", nodes=2)
    with pytest.raises(checkpoints.CheckpointError, match=needle):
        engine.train(models.build("lenet", "synthetic"), datasets.load("synthetic"), cfg,
                     resume=snap)


# ---------------------------------------------------------------- stale temporaries

WRITER = """
import os, socket, sys
from iasgd import files
if sys.argv[2] == "elsewhere":
    socket.gethostname = lambda: "elsewhere"
with files.replacing(sys.argv[1]) as tmp:
    tmp.write_bytes(b"half a checkpoint")
    print(tmp.name, flush=True)
    if sys.argv[2] == "live":
        sys.stdin.readline()  # a writer still at work, until told to die
    os._exit(9)  # killed while writing
"""


def writer(path, how: str) -> subprocess.Popen:
    """A process that starts writing `path` with files.replacing and dies
    inside the write (how: "dead" at once, "live" when its stdin closes,
    "elsewhere" at once, as if on another machine)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), how], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_a_write_removes_the_temporaries_of_dead_writers_only(tmp_path):
    path = tmp_path / "r.ckpt.h5"
    # the dead one last: each write clears what died before it
    live = writer(path, "live")
    elsewhere = writer(path, "elsewhere")  # its writer may be alive on its machine
    other = writer(tmp_path / "other.ckpt.h5", "dead")  # another file's
    live_tmp, elsewhere_tmp, other_tmp = (p.stdout.readline().strip()
                                          for p in (live, elsewhere, other))
    dead = writer(path, "dead")
    dead_tmp = dead.stdout.readline().strip()
    assert [p.wait() for p in (elsewhere, other, dead)] == [9, 9, 9]
    assert {dead_tmp, live_tmp, other_tmp, elsewhere_tmp} <= {p.name
                                                               for p in tmp_path.iterdir()}
    snap = engine.Snapshot({"a": np.ones(3)}, {})
    checkpoints.save(path, {}, snap)
    left = {p.name for p in tmp_path.iterdir()}
    assert dead_tmp not in left
    assert {live_tmp, other_tmp, elsewhere_tmp} <= left  # a live writer's temporary stays
    live.stdin.close()
    assert live.wait() == 9
    checkpoints.save(path, {}, snap)  # now that it is dead, its temporary goes
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [path.name, other_tmp, elsewhere_tmp])
    assert checkpoints.load(path)[1].arrays["a"].tolist() == [1, 1, 1]
