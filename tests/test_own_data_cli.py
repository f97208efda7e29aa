"""A user's own data and a model taken out and brought back, from the
command line: `--dataset FILE` trains and resumes, a bad file is one line and
exit 2, `--init FILE` starts from an export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from iasgd import data, export, run


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
