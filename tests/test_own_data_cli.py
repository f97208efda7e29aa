"""A user's own data and a model taken out and brought back, from the
command line: `--dataset FILE` trains and resumes, a bad file is one line and
exit 2, `--init FILE` starts from an export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_export import LOGITS_ATOL, read_with_its_own_tool

from iasgd import checkpoints, data, export, run


def own_npz(path: Path, n: int = 240, seed: int = 0) -> Path:
    """A learnable 3-class problem of 8x8 grayscale uint8 images (NHWC), no test split."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.integers(0, 40, (n, 8, 8, 1)).astype(np.uint8)
    for k in range(3):  # a bright band per class
        x[y == k, 2 * k:2 * k + 2, :, 0] += 200
    np.savez(path, x_train=x, y_train=y)
    return path


def cli(tmp_path: Path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "r.json"
    code = run.main(["--quiet", "--out", str(out), "--data-dir", str(tmp_path / "cache"),
                     *args])
    return code, json.loads(out.read_text()) if out.exists() else None


def test_own_npz_trains_from_the_command_line_and_resumes(tmp_path):
    mine = own_npz(tmp_path / "mine.npz")
    code, doc = cli(tmp_path, "--dataset", str(mine), "--model", "mlp", "--hidden", "16",
                    "--algo", "hogwild", "--threads", "2", "--epochs", "2", "--lr", "0.05")
    assert code == 0
    assert doc["config"]["dataset"] == str(mine.resolve())
    assert doc["final_test_accuracy"] > 0.6  # chance is 1/3
    # the held-out tenth: 24 images, the same whatever --seed
    held_out = data.load(str(mine), tmp_path / "cache", progress=False)
    assert held_out.x_test.shape == (24, 1, 8, 8) and held_out.num_classes == 3
    code = run.main(["--quiet", "--resume", str(tmp_path / "r.ckpt.h5"), "--epochs", "3"])
    assert code == 0
    assert len(json.loads((tmp_path / "r.json").read_text())["epochs"]) == 3


def test_a_spec_is_sized_for_the_files_images(tmp_path):
    mine = own_npz(tmp_path / "mine.npz")
    code, doc = cli(tmp_path, "--dataset", str(mine), "--model", "conv4k3s,relu,pool,dense",
                    "--epochs", "1")
    assert code == 0 and doc["config"]["model"] == "conv4k3s,relu,pool,dense"


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p.write_bytes(b"not a zip"), "mine.npz"),
    (lambda p: np.savez(p, x_train=np.zeros((4, 8, 8), np.uint8)), "y_train"),
    (lambda p: np.savez(p, x_train=np.zeros((4, 8, 8), np.uint8), y_train=np.array([0, 1, 2])),
     "mine.npz"),
    (lambda p: np.savez(p, x_train=np.full((4, 8, 8), 2.0), y_train=np.arange(4)), "[0, 1]"),
    (lambda p: np.savez(p, x_train=np.array([object()] * 4, dtype=object),
                        y_train=np.arange(4)), "mine.npz"),
])
def test_a_bad_file_is_one_line_and_exit_2(tmp_path, capsys, make, message):
    path = tmp_path / "mine.npz"
    make(path)
    code, doc = cli(tmp_path, "--dataset", str(path), "--epochs", "1")
    err = capsys.readouterr().err.strip()
    assert code == 2 and doc is None
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_missing_file_or_an_unknown_name_is_one_line(tmp_path, capsys):
    code, _ = cli(tmp_path, "--dataset", str(tmp_path / "nowhere.npz"))
    assert code == 2 and "nowhere.npz" in capsys.readouterr().err
    code, _ = cli(tmp_path, "--dataset", "cifar11")
    err = capsys.readouterr().err
    assert code == 2 and "unknown dataset 'cifar11'" in err and len(err.splitlines()) == 1


def test_init_starts_from_an_export_and_fine_tunes(tmp_path, capsys):
    """--init FILE: the run starts from the exported parameters, not from --seed's."""
    code, first = cli(tmp_path, "--dataset", "synthetic", "--epochs", "1", "--lr", "0.02")
    assert code == 0
    export.export(tmp_path / "r.ckpt.h5", tmp_path / "w.npz")
    exported = np.load(tmp_path / "w.npz", allow_pickle=False)
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    code, second = cli(tuned, "--dataset", "synthetic", "--epochs", "1", "--lr", "1e-30",
                       "--momentum", "0", "--init", str(tmp_path / "w.npz"))
    assert code == 0
    # a step of 1e-30 leaves float32 parameters as they are: the accuracy is the export's
    assert second["final_test_accuracy"] == pytest.approx(first["final_test_accuracy"])
    assert "conv1.weight" in exported.files
    code, _ = cli(tuned, "--dataset", "synthetic", "--model", "mlp",
                  "--init", str(tmp_path / "w.npz"))
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    code, _ = cli(tuned, "--init", str(tmp_path / "w.npz"), "--resume", str(tmp_path / "r.ckpt.h5"))
    assert code == 2 and "--init" in capsys.readouterr().err


# ------------------------------------------------------------------ a model trained on a file


def images_npz(path: Path, shape: tuple[int, ...], n: int = 160, classes: int = 4,
               seed: int = 0) -> Path:
    """n random uint8 images of `shape` ((H, W, C) or (H, W)) in `classes` classes."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x_train=rng.integers(0, 256, (n, *shape), dtype=np.uint8),
             y_train=np.arange(n) % classes)
    return path


def predicts_like_iasgd(weights: Path, model, params: np.ndarray) -> None:
    """The file, read by its format's own tool into PyTorch, gives iasgd's logits."""
    torch = pytest.importorskip("torch")
    tensors, meta = read_with_its_own_tool(weights)
    assert tuple(meta["input_shape"]) == model.input_shape
    assert meta["num_classes"] == model.num_classes
    net = export.torch_module(meta)
    net.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=True)
    net.eval()
    images = np.random.default_rng(1).integers(0, 256, (8, *model.input_shape), dtype=np.uint8)
    x = torch.from_numpy(images).float() * meta["input_scale"] + meta["input_shift"]
    with torch.no_grad():
        theirs = net(x).numpy()
        assert torch.equal(export.load_torch(weights)(x), net(x))
    ours = model.logits(params, images.astype(np.float32) / 255)
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=LOGITS_ATOL)


@pytest.mark.parametrize(("shape", "model"), [
    ((32, 32, 3), ["--model", "conv4k3s,relu,pool,dense"]),
    ((28, 28), ["--model", "mlp", "--hidden", "16"]),
], ids=["rgb-32x32", "gray-28x28"])
def test_a_model_trained_on_a_file_leaves_without_it(tmp_path, shape, model):
    """Issue 41, item 1: the checkpoint of a run on a file of one's own records the model's
    input shape and class count, so that it exports to every format, loads in PyTorch and
    starts another run (--init) with the file in place, moved or deleted."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    mine = images_npz(tmp_path / "mine.npz", shape)
    channels = 3 if len(shape) == 3 else 1
    code, doc = cli(tmp_path, "--dataset", str(mine), *model, "--epochs", "1",
                    "--batch-size", "16", "--lr", "0.01")
    assert code == 0
    assert doc["config"]["input_shape"] == [channels, *shape[:2]]
    assert doc["config"]["num_classes"] == 4
    checkpoint = tmp_path / "r.ckpt.h5"
    saved, _ = checkpoints.load(checkpoint)
    assert saved["input_shape"] == [channels, *shape[:2]] and saved["num_classes"] == 4
    moved = tmp_path / "elsewhere" / "mine.npz"
    for where, init in (("in place", ".pt"), ("moved", ".safetensors"), ("deleted", ".npz")):
        if where == "moved":
            moved.parent.mkdir()
            mine.rename(moved)
            data_file = moved
        elif where == "deleted":
            moved.unlink()
            data_file = images_npz(tmp_path / "other" / "fresh.npz", shape, seed=2)
        else:
            data_file = mine
        trained, params, _ = export.checkpoint_model(checkpoint)
        out = tmp_path / where.replace(" ", "-")
        out.mkdir()
        for suffix in (".pt", ".safetensors", ".npz"):
            weights = out / f"m{suffix}"
            assert export.main([str(checkpoint), "--to", str(weights)]) == 0, (where, suffix)
            predicts_like_iasgd(weights, trained, params)
            assert export.load_weights(weights, trained).tobytes() == params.tobytes()
        assert export.load_weights(checkpoint, trained).tobytes() == params.tobytes()
        assert export.load_torch(checkpoint).state_dict().keys() == \
            export.load_torch(out / "m.pt").state_dict().keys()
        for start in (checkpoint, out / f"m{init}"):  # a step of 1e-30 changes nothing
            code, tuned = cli(out, "--dataset", str(data_file), *model, "--epochs", "1",
                              "--batch-size", "16", "--lr", "1e-30", "--momentum", "0",
                              "--init", str(start), "--no-checkpoint")
            assert code == 0, (where, start)
            if where != "deleted":  # the same images, the same held-out split
                assert tuned["final_test_accuracy"] == doc["final_test_accuracy"]


def rewrite_config(checkpoint: Path, results: Path, change) -> None:
    """Rewrite a checkpoint and its results with change(config) as their configuration, as
    another iasgd would have written them."""
    config, snapshot = checkpoints.load(checkpoint)
    change(config)
    checkpoints.save(checkpoint, config, snapshot)
    document = json.loads(results.read_text())
    change(document["config"])
    results.write_text(json.dumps(document))


def test_resume_takes_recorded_keys_that_are_no_option(tmp_path, capsys):
    """The recorded input_shape and num_classes, and any saved key that is not an option
    of this iasgd, neither break a resume nor are compared with the command line."""
    mine = own_npz(tmp_path / "mine.npz")
    code, doc = cli(tmp_path, "--dataset", str(mine), "--model", "mlp", "--hidden", "8",
                    "--epochs", "1")
    assert code == 0 and doc["config"]["input_shape"] == [1, 8, 8]
    checkpoint = tmp_path / "r.ckpt.h5"
    rewrite_config(checkpoint, tmp_path / "r.json",
                   lambda config: config.update(from_a_newer_iasgd=[1, 2]))
    code = run.main(["--quiet", "--resume", str(checkpoint), "--epochs", "2"])
    assert code == 0, capsys.readouterr().err
    resumed = json.loads((tmp_path / "r.json").read_text())
    assert len(resumed["epochs"]) == 2
    assert resumed["config"]["input_shape"] == [1, 8, 8]
    assert resumed["config"]["num_classes"] == 3


def test_an_older_checkpoint_of_a_file_says_what_to_do(tmp_path, capsys):
    """A checkpoint of an iasgd that did not record the shape and class count: a one-line
    error for its export; a resume records them, and the export then works."""
    mine = own_npz(tmp_path / "mine.npz")
    code, _ = cli(tmp_path, "--dataset", str(mine), "--model", "mlp", "--hidden", "8",
                  "--epochs", "1")
    assert code == 0
    checkpoint = tmp_path / "r.ckpt.h5"
    rewrite_config(checkpoint, tmp_path / "r.json",
                   lambda config: [config.pop(k) for k in ("input_shape", "num_classes")])
    capsys.readouterr()
    assert export.main([str(checkpoint), "--to", str(tmp_path / "m.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not record the input shape" in err, err
    assert str(mine.resolve()) in err and "--resume" in err
    assert run.main(["--quiet", "--resume", str(checkpoint), "--epochs", "2"]) == 0
    assert export.main([str(checkpoint), "--to", str(tmp_path / "m.npz")]) == 0


def test_a_batch_larger_than_the_file_is_refused_before_any_cache_is_written(tmp_path, capsys):
    """Issue 41, item 4c: --batch-size beyond a file's training images is one line and exit
    2, and leaves no cache of the file behind; a batch that fits caches it as ever."""
    import h5py

    rng = np.random.default_rng(0)
    mine = tmp_path / "mine.h5"
    with h5py.File(mine, "w") as f:
        f["x_train"] = rng.integers(0, 256, (100, 8, 8), dtype=np.uint8)
        f["y_train"] = np.arange(100) % 3
    cache = tmp_path / "cache"
    code, doc = cli(tmp_path, "--dataset", str(mine), "--model", "mlp", "--hidden", "8",
                    "--batch-size", "5000", "--epochs", "1")
    err = capsys.readouterr().err.strip()
    assert code == 2 and doc is None
    assert len(err.splitlines()) == 1 and "--batch-size 5000" in err, err
    assert not cache.exists() or not any(cache.iterdir()), list(cache.iterdir())
    code, _ = cli(tmp_path, "--dataset", str(mine), "--model", "mlp", "--hidden", "8",
                  "--batch-size", "16", "--epochs", "1")
    assert code == 0 and len(list(cache.glob("mine.h5.*.h5"))) == 1


def test_a_file_saved_as_x_and_y_trains(tmp_path):
    """Issue 41, item 9: np.savez(f, x=..., y=...), the most common spelling, trains, with a
    held-out test split."""
    rng = np.random.default_rng(0)
    mine = tmp_path / "xy.npz"
    np.savez(mine, x=rng.integers(0, 256, (120, 8, 8), dtype=np.uint8), y=np.arange(120) % 3)
    code, doc = cli(tmp_path, "--dataset", str(mine), "--model", "mlp", "--hidden", "8",
                    "--epochs", "1", "--batch-size", "8")
    assert code == 0 and doc["config"]["num_classes"] == 3
    assert doc["epochs"][0]["test_accuracy"] is not None
    assert data.load(mine, tmp_path / "cache", progress=False).x_test.shape == (12, 1, 8, 8)


def write_nchw_npz(path: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 256, (60, 3, 32, 32), dtype=np.uint8),
             y_train=np.arange(60) % 3)


def write_small_h5(path: Path) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        f["x_train"] = np.zeros((100, 8, 8), np.uint8)
        f["y_train"] = np.arange(100) % 3


def write_small_npz(path: Path) -> None:
    np.savez(path, x_train=np.zeros((60, 8, 8, 1), np.uint8), y_train=np.arange(60) % 3)


@pytest.mark.parametrize(("write", "args", "line"), [
    # issue 60, item 4: NCHW images with --layout nhwc were cached and the model blamed
    (write_nchw_npz, ["--layout", "nhwc"],
     "iasgd: error: {file}: layout nhwc reads images of shape (60, 3, 32, 32) as 32 channels "
     "of 3x32, but axis 1 holds 3 entries, as channels do: pass layout 'nchw' or 'auto'"),
    # and a batch larger than the file printed the file's summary before its error
    (write_small_h5, ["--batch-size", "5000", "--model", "mlp"],
     "iasgd: error: --batch-size 5000 is larger than the training set (90 images)"),
    # and a model that does not fit a valid file: its summary said and its cache written
    (write_small_npz, [],
     "iasgd: error: --model lenet on mine.npz: conv16k5v (layer 4): its 2x2 input is too "
     "small for a 5x5 valid conv"),
], ids=["layout", "batch-size", "model"])
def test_a_refused_file_run_is_its_one_line_and_writes_nothing(tmp_path, write, args, line):
    """What a user sees, in a fresh process without --quiet: the error line alone
    on stderr, nothing on stdout, no cache and no results in the folder."""
    import os
    import subprocess
    import sys

    mine = tmp_path / ("mine.h5" if write is write_small_h5 else "mine.npz")
    write(mine)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "iasgd.run", "--dataset", mine.name, *args],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr == line.format(file=mine) + "\n" and proc.stdout == ""
    assert [p.name for p in tmp_path.iterdir()] == [mine.name]
