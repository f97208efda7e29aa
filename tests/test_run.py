"""The command line: a real run writes its results; bad input is one line on
stderr, exit code 2, before any work and without touching the output file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from iasgd import run

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "iasgd.run", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def test_synthetic_run_writes_results(tmp_path):
    out = tmp_path / "r.json"
    proc = cli("--dataset", "synthetic", "--epochs", "2", "--lr", "0.02", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "epoch   2" in proc.stdout and "test acc" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["status"] == "completed"
    assert doc["config"]["dataset"] == "synthetic" and doc["config"]["lr"] == 0.02
    assert [e["epoch"] for e in doc["epochs"]] == [1, 2]
    assert set(doc["epochs"][0]) >= {"epoch", "train_loss", "test_accuracy", "wall_s",
                                     "samples_per_s"}
    assert doc["samples_per_s"] > 0
    assert doc["epochs"][-1]["test_accuracy"] > 0.9
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary left behind


def test_quiet_prints_nothing(tmp_path):
    proc = cli("--dataset", "synthetic", "--epochs", "1", "--quiet", "--out",
               str(tmp_path / "r.json"))
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""


def test_divergence_exits_3_and_keeps_the_results(tmp_path):
    out = tmp_path / "r.json"
    proc = cli("--dataset", "synthetic", "--lr", "80", "--quiet", "--out", str(out))
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and "diverged at epoch 1" in proc.stderr
    assert "smaller --lr" in proc.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "diverged" and doc["diverged_at"]["epoch"] == 1


def test_error_is_one_line_without_traceback(tmp_path):
    proc = cli("--batch-size", "0", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "--batch-size" in proc.stderr
    assert not (tmp_path / "r.json").exists()


BAD = [
    (["--batch-size", "0"], "--batch-size"),
    (["--batch-size", "-3"], "--batch-size"),
    (["--batch-size", "lots"], "--batch-size"),
    (["--lr", "-0.1"], "--lr"),
    (["--lr", "0"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--momentum", "1"], "--momentum"),
    (["--momentum", "-0.5"], "--momentum"),
    (["--epochs", "0"], "--epochs"),
    (["--time-budget", "0"], "--time-budget"),
    (["--seed", "-1"], "--seed"),
    (["--seed", "1.5"], "--seed"),
    (["--dataset", "imagenet"], "--dataset"),
    (["--model", "resnet"], "--model"),
    (["--hidden", "12,0"], "--hidden"),
    (["--hidden", "12,x"], "--hidden"),
    (["--hidden", "64"], "--hidden applies to --model mlp"),
    (["--out", "/no/such/dir/r.json"], "does not exist"),
    (["--archive", "/no/such/archive.tar.gz"], "--archive"),
    (["--no-such-option"], "unrecognized"),
    (["--threads", "100000"], "--threads 100000"),
    (["--threads", "0"], "--threads"),
    (["--threads", "4"], "--algo sequential runs one thread"),
    (["--algo", "interval", "--interval", "0"], "--interval"),
    (["--algo", "interval", "--gate", "maybe"], "--gate"),
    (["--algo", "interval", "--interval-schedule", "decay", "--y0", "8", "--y-min", "9"],
     "--y-min 9 is above --y0 8"),
    (["--algo", "interval", "--interval-schedule", "probe", "--y0", "4", "--probe-offset", "2",
      "--y-min", "7"], "lies wholly below --y-min"),
    (["--algo", "hogwild", "--interval-schedule", "decay"], "applies to --algo interval only"),
    (["--algo", "hogwild", "--threads", "4", "--m0", "5"], "--m0 5 must lie in"),
    (["--algo", "sync", "--threads", "2", "--threads-schedule", "window"], "--threads-schedule"),
    (["--algo", "sync", "--threads", "2", "--lr-schedule", "inverse"], "--lr-schedule"),
    (["--tail-amplitude", "1.5"], "--tail-amplitude"),
    (["--probe-loss-scale", "-1"], "--probe-loss-scale"),
    (["--loss-window", "0"], "--loss-window"),
]


@pytest.mark.parametrize(("args", "needle"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_with_one_line(args, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run.main(["--dataset", "synthetic", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1 and err.startswith("iasgd: error: ")
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_a_directory_is_refused(capsys, tmp_path):
    assert run.main(["--dataset", "synthetic", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_missing_archive_without_network_is_one_line(capsys, tmp_path, monkeypatch):

    def no_network(*_a, **_k):
        raise OSError("network is unreachable")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    code = run.main(["--dataset", "cifar10", "--data-dir", str(tmp_path), "--quiet",
                     "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "cifar-10-python.tar.gz" in err and str(tmp_path) in err


def test_help_documents_every_option_and_default(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--dataset", "--model", "--hidden", "--data-dir", "--archive", "--batch-size",
                   "--lr", "--momentum", "--epochs", "--time-budget", "--seed", "--out",
                   "--quiet", "--algo"):
        assert option in text
    assert "(default: 16)" in text and "(default: 0.005)" in text
