"""The command line: a real run writes its results; bad input is one line on
stderr, exit code 2, before any work and without touching the output file."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from iasgd import run
from iasgd.config import TrainConfig
from iasgd.recipes import RECIPES

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
    # the results and the end-of-run checkpoint, no temporary left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.ckpt.h5", "r.json"]
    assert doc["checkpoint"] == str(tmp_path / "r.ckpt.h5")
    assert f"--resume {tmp_path / 'r.ckpt.h5'} --epochs 4" in proc.stdout
    assert "\ncompleted: 2 epochs in " in proc.stdout


def test_quiet_prints_nothing(tmp_path):
    proc = cli("--dataset", "synthetic", "--epochs", "1", "--quiet", "--out",
               str(tmp_path / "r.json"))
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""


@pytest.mark.parametrize("how", [["--lr", "80"],
                                 ["--lr", "1e39", "--algo", "hogwild", "--threads", "2",
                                  "--simulate"]])
def test_divergence_exits_3_and_keeps_the_results(tmp_path, how):
    out = tmp_path / "r.json"
    proc = cli("--dataset", "synthetic", *how, "--quiet", "--out", str(out))
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
    (["--model", "conv8,tanh,dense"], "unknown layer 'tanh' (layer 2)"),
    (["--model", "conv0k3s,dense"], "zero channels"),
    (["--model", "conv8k3s" + ",pool" * 6 + ",dense"], "too small for a 2x2 pool"),
    (["--model", "conv8k9,conv8k9,conv8k9,conv8k9,dense"], "too small for a 9x9 valid conv"),
    (["--model", "conv8k3s,dense7"], "must have 10 outputs"),
    (["--hidden", "12,0"], "--hidden"),
    (["--hidden", "12,x"], "--hidden"),
    (["--hidden", "64"], "--hidden applies to --model mlp"),
    (["--out", "/no/such/dir/r.json"], "does not exist"),
    (["--archive", "/no/such/archive.tar.gz"], "--archive"),
    (["--no-such-option"], "unrecognized"),
    (["--threads", "100000"], "--threads 100000"),
    (["--threads", "0"], "--threads"),
    (["--threads", "4"], "--threads applies to --algo sync, async, hogwild, interval only"),
    (["--algo", "interval", "--interval", "0"], "--interval"),
    (["--algo", "interval", "--gate", "maybe"], "--gate"),
    (["--algo", "interval", "--interval-schedule", "decay", "--y0", "8", "--y-min", "9"],
     "--y-min 9 is above --y0 8"),
    (["--algo", "interval", "--interval-schedule", "probe", "--y0", "4", "--probe-offset", "2",
      "--y-min", "7"], "lies wholly below --y-min"),
    (["--algo", "hogwild", "--interval-schedule", "decay"], "applies to --algo interval only"),
    (["--algo", "hogwild", "--threads", "4", "--threads-schedule", "window", "--m0", "5"],
     "--m0 5 must lie in"),
    (["--algo", "sync", "--threads", "2", "--threads-schedule", "window"], "--threads-schedule"),
    (["--algo", "sync", "--threads", "2", "--lr-schedule", "inverse"], "--lr-schedule"),
    (["--tail-amplitude", "1.5"], "--tail-amplitude"),
    (["--probe-loss-scale", "-1"], "--probe-loss-scale"),
    (["--loss-window", "0"], "--loss-window"),
    (["--staleness-budget", "0"], "--staleness-budget"),
    (["--staleness-budget", "inf"], "--staleness-budget"),
    (["--out", "/proc/iasgd-results.json"], "cannot write in /proc"),
    (["--checkpoint", "/no/such/dir/c.h5"], "does not exist"),
    (["--checkpoint-every", "-1"], "--checkpoint-every"),
    (["--resume", "/no/such/checkpoint.h5"], "does not exist"),
    (["--no-checkpoint", "--checkpoint-every", "2"], "contradict"),
    (["--no-checkpoint", "--checkpoint", "c.h5"], "contradict"),
    (["--batch-size", "100000000"], "larger than the training set"),
    (["--algo", "hogwild", "--threads", "1000", "--batch-size", "4000"], "GiB of workspace"),
    (["--time-budget", "nan"], "--time-budget"),
    (["--epochs", "1e3"], "--epochs"),
    (["--interval", "-5"], "--interval"),
    (["--y0", "0"], "--y0"),
    (["--window", "0"], "--window"),
    (["--probe-steps", "0"], "--probe-steps"),
    (["--decay-every", "x"], "--decay-every"),
    (["--simulate", "--algo", "sequential"], "--simulate covers"),
    (["--simulate", "--sim-step-spread", "0"], "--sim-step-spread"),
    (["--simulate", "--algo", "hogwild", "--threads", "4", "--resume", "x.h5"], "--resume"),
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


def start_training(tmp_path, *args):
    """A real run in a subprocess, returned once its first epoch is done."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "iasgd.run", "--dataset", "synthetic",
                             "--epochs", "500", "--lr", "0.02", "--out",
                             str(tmp_path / "r.json"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:
        if line.startswith("epoch   1"):
            return proc
    raise AssertionError(f"no first epoch: {proc.stderr.read()}")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.parametrize("algo", [["--algo", "sequential"],
                                  ["--algo", "interval", "--threads", "3"]])
def test_a_signal_saves_checkpoint_and_results_then_resume_finishes(tmp_path, signum, code,
                                                                    algo):
    proc = start_training(tmp_path, *algo)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "--resume" in err and "Traceback" not in err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["status"] == "interrupted" and doc["epochs"]
    ckpt = tmp_path / "r.ckpt.h5"
    assert doc["checkpoint"] == str(ckpt) and ckpt.exists()
    done = len(doc["epochs"])
    resumed = cli("--resume", str(ckpt), "--epochs", str(done + 2), "--out",
                  str(tmp_path / "r2.json"))
    assert resumed.returncode == 0, resumed.stderr
    doc2 = json.loads((tmp_path / "r2.json").read_text())
    assert doc2["status"] == "completed"
    assert [e["epoch"] for e in doc2["epochs"]] == list(range(1, done + 3))
    assert doc2["config"]["algo"] == algo[1]


def test_a_second_ctrl_c_exits_at_once(tmp_path):
    proc = start_training(tmp_path, "--algo", "hogwild", "--threads", "2")
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in err


def test_resume_refuses_another_model_or_dataset(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert run.main(["--dataset", "synthetic", "--epochs", "1", "--quiet", "--out", str(out),
                     "--checkpoint-every", "1"]) == 0
    ckpt = str(tmp_path / "r.ckpt.h5")
    for args, needle in ((["--model", "mlp"], "--model lenet, not mlp"),
                         (["--dataset", "fashion-mnist"], "--dataset synthetic"),
                         (["--lr", "0.1"], "--lr 0.005, not 0.1")):
        assert run.main(["--resume", ckpt, "--quiet", "--out", str(out), *args]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1
    (tmp_path / "bad.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 50)
    assert run.main(["--resume", str(tmp_path / "bad.h5"), "--out", str(out)]) == 2
    assert "corrupt or truncated" in capsys.readouterr().err


# A child's peak RSS, printed by the child itself. Not getrusage's ru_maxrss:
# Linux carries the parent's high-water mark across fork and exec into the
# child's, so a child of a large pytest process reports pytest's size (CI saw
# 2.3 GB for a run that peaks at 0.45 GB). VmHWM belongs to the address space
# that exec made, so it counts the child alone.
PEAK_RSS_KB = ("print('peak_rss_kb', next(int(line.split()[1])"
               " for line in open('/proc/self/status') if line.startswith('VmHWM:')))")


def child_peak_rss_kb(stdout: str) -> int:
    """The figure PEAK_RSS_KB printed, from a child's stdout."""
    return int(stdout.split("peak_rss_kb")[-1].split()[0])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_a_childs_peak_rss_is_its_own_not_its_parents():
    ballast = np.ones(300 * 1024 * 1024, np.uint8)  # 300 MB touched in this process
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS_KB], capture_output=True, text=True,
                          timeout=60)
    assert ballast[-1] == 1
    assert child_peak_rss_kb(proc.stdout) < 200 * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_128_threads_start_train_and_stop_in_under_2_gb(tmp_path):
    """LeNet-5 with 128 worker threads (oversubscribed), its peak RSS measured."""
    script = ("import sys; from iasgd import run; code = run.main(sys.argv[1:]); "
              f"{PEAK_RSS_KB}; sys.exit(code)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script, "--dataset", "synthetic", "--algo",
                           "hogwild", "--threads", "128", "--epochs", "1", "--quiet", "--out",
                           str(tmp_path / "r.json")], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert child_peak_rss_kb(proc.stdout) < 2 * 1024 * 1024
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["status"] == "completed" and doc["config"]["threads"] == 128
    assert doc["applied"] == 250  # 4,000 synthetic images / 16


def test_simulate_says_so_everywhere(tmp_path):
    out = tmp_path / "r.json"
    proc = cli("--dataset", "synthetic", "--simulate", "--algo", "interval", "--threads", "8",
               "--interval", "4", "--sim-cores", "2", "--sim-step-spread", "0.2", "--epochs", "1",
               "--lr", "0.02", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "SIMULATED: 8 workers on 2 cores" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["simulated"]["cores"] == 2 and "simulated" in doc["simulated"]["note"]
    assert doc["staleness"]["max"] <= 3 and doc["applied"] == 250


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_a_simulated_run_with_its_epochs_written(tmp_path, signum, code):
    """A simulated run shows each epoch as it ends and, stopped by a signal,
    writes what it simulated so far (no checkpoint: simulated runs have none)."""
    proc = start_training(tmp_path, "--simulate", "--algo", "interval", "--threads", "4")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err and "nothing was written" not in err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["status"] == "interrupted" and doc["epochs"] and "simulated" in doc
    assert "interrupted" in err and str(tmp_path / "r.json") in err


def trained(tmp_path, name: str, *args: str) -> dict:
    """run.main in this process, quiet; the results document."""
    out = tmp_path / f"{name}.json"
    assert run.main(["--dataset", "synthetic", "--quiet", "--out", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_a_finished_sequential_run_extends_bit_identically(tmp_path):
    """2 epochs, then --resume of its end-of-run checkpoint to 3, against 3 at once."""
    from iasgd import checkpoints

    first = trained(tmp_path, "a", "--epochs", "2", "--lr", "0.02", "--seed", "5")
    assert first["checkpoint"] == str(tmp_path / "a.ckpt.h5")
    extended = trained(tmp_path, "a", "--resume", str(tmp_path / "a.ckpt.h5"), "--epochs", "3")
    whole = trained(tmp_path, "b", "--epochs", "3", "--lr", "0.02", "--seed", "5")
    assert [e["epoch"] for e in extended["epochs"]] == [1, 2, 3]
    assert extended["epochs"][:2] == first["epochs"]  # the first two kept as they were
    for key in ("train_loss", "test_accuracy", "staleness_hist", "complete"):
        assert [e[key] for e in extended["epochs"]] == [e[key] for e in whole["epochs"]]
    assert extended["applied"] == whole["applied"] and extended["config"]["epochs"] == 3
    params = [checkpoints.load(tmp_path / f"{n}.ckpt.h5")[1].arrays["params"] for n in "ab"]
    assert params[0].tobytes() == params[1].tobytes()


def test_a_resume_prints_unless_it_is_told_to_be_quiet(tmp_path, capsys):
    """--quiet is this command's, not the saved run's: a flag cannot be
    unset, so an inherited one would silence every later resume."""
    trained(tmp_path, "q", "--epochs", "1")  # quiet
    capsys.readouterr()
    ckpt = str(tmp_path / "q.ckpt.h5")
    assert run.main(["--resume", ckpt, "--epochs", "2"]) == 0
    assert "epoch   2" in capsys.readouterr().out
    assert run.main(["--resume", ckpt, "--epochs", "3", "--quiet"]) == 0
    assert capsys.readouterr().out == ""


def test_a_finished_parallel_run_extends(tmp_path):
    trained(tmp_path, "r", "--algo", "hogwild", "--threads", "2", "--epochs", "1")
    doc = trained(tmp_path, "r", "--resume", str(tmp_path / "r.ckpt.h5"), "--epochs", "2")
    assert doc["status"] == "completed" and [e["epoch"] for e in doc["epochs"]] == [1, 2]
    assert doc["applied"] == 2 * 250 == sum(doc["staleness"]["hist"])  # 4,000 images / 16


def test_a_resume_with_nothing_left_to_train_is_refused(tmp_path, capsys):
    trained(tmp_path, "r", "--epochs", "2", "--time-budget", "100")
    ckpt = str(tmp_path / "r.ckpt.h5")
    for args, needle in ((["--epochs", "2"], "give --epochs more than 2"),
                         ([], "give --epochs more than 2"),  # the saved --epochs
                         (["--epochs", "3", "--time-budget", "1e-6"], "larger --time-budget")):
        assert run.main(["--resume", ckpt, "--out", str(tmp_path / "r2.json"), *args]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1
    assert not (tmp_path / "r2.json").exists()


def test_no_checkpoint_writes_none(tmp_path):
    doc = trained(tmp_path, "r", "--epochs", "1", "--no-checkpoint")
    assert doc["checkpoint"] is None and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_the_cache_index_name_is_numbas(tmp_path):
    """cache_index_name says what numba itself writes: the index of a compiled
    function that numba cached is where the name says."""
    from iasgd import compiled
    from iasgd.nn import network as K

    if getattr(K.all_finite, "_cache", None) is None:  # pragma: no cover (NUMBA_DISABLE_JIT)
        pytest.skip("no cache without the jit")
    index = Path(K.all_finite._cache._cache_file._index_path)
    assert index.name == compiled.cache_index_name(K.all_finite)


def test_a_cold_cache_says_it_compiles_and_a_warm_one_does_not(tmp_path):
    """The one test that compiles everything (an empty NUMBA_CACHE_DIR): ~15-30 s."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    command = [sys.executable, "-m", "iasgd.run", "--dataset", "synthetic", "--epochs", "1",
               "--no-checkpoint", "--out", str(tmp_path / "r.json")]
    runs = [subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
            for _ in range(2)]
    assert [p.returncode for p in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    cold = runs[0].stdout.splitlines()
    say = [i for i, line in enumerate(cold)
           if line.startswith("compiling the kernels of this model and algorithm, which numba's "
                              "cache does not hold yet (once for each new model, algorithm or ")]
    done = [i for i, line in enumerate(cold) if line.startswith("kernels compiled in ")]
    first_epoch = [i for i, line in enumerate(cold) if line.startswith("epoch   1")]
    assert len(say) == len(done) == len(first_epoch) == 1, runs[0].stdout
    assert say[0] < done[0] < first_epoch[0]
    assert re.search(r"about \d+-\d+ s", cold[say[0]])
    assert "compil" not in runs[1].stdout + runs[1].stderr


def test_a_spec_model_trains_is_recorded_and_resumes_only_as_itself(tmp_path, capsys):
    out = tmp_path / "r.json"
    spec = "Conv4k3S, relu,pool,dense16,relu,dense"
    assert run.main(["--dataset", "synthetic", "--model", spec, "--epochs", "1", "--lr", "0.02",
                     "--out", str(out), "--checkpoint-every", "1"]) == 0
    said = capsys.readouterr().out
    assert "conv4k3s,relu,pool,dense16,relu,dense (16,682 parameters)" in said
    doc = json.loads(out.read_text())
    assert doc["config"]["model"] == "conv4k3s,relu,pool,dense16,relu,dense"  # canonical
    assert doc["epochs"][-1]["test_accuracy"] > 0.5
    ckpt = str(tmp_path / "r.ckpt.h5")
    assert run.main(["--resume", ckpt, "--quiet", "--out", str(out), "--model",
                     "conv8k3s,relu,pool,dense16,relu,dense"]) == 2
    err = capsys.readouterr().err
    assert "cannot change the model" in err and err.count("\n") == 1
    # the same layers spelt another way are the same model
    assert run.main(["--resume", ckpt, "--quiet", "--out", str(out), "--epochs", "2",
                     "--model", "conv4k3s,relu,pool,dense16,relu,dense10"]) == 2
    assert run.main(["--resume", ckpt, "--quiet", "--out", str(out), "--epochs", "2",
                     "--model", "conv4k3s,relu,pool,dense16,relu,dense"]) == 0
    assert json.loads(out.read_text())["status"] == "completed"


def test_a_resume_without_out_extends_the_results_and_checkpoint_it_resumes(tmp_path,
                                                                              monkeypatch):
    """The command the run prints (--resume DIR/r.ckpt.h5 --epochs N), given in
    another folder, extends DIR/r.json and DIR/r.ckpt.h5 and writes nothing
    where it is given; a relative --out of the first run is found beside its
    checkpoint, whatever its name."""
    from iasgd import checkpoints

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "results.json").write_text("another run's\n")
    monkeypatch.chdir(tmp_path)
    for out in ("sub/r.json", "sub/s.results"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        assert run.main(["--dataset", "synthetic", "--quiet", "--epochs", "1", "--out", out]) == 0
    monkeypatch.chdir(elsewhere)
    for name, results in (("r", "r.json"), ("s", "s.results")):
        ckpt = tmp_path / "sub" / f"{name}.ckpt.h5"
        assert run.main(["--resume", str(ckpt), "--epochs", "2", "--quiet"]) == 0
        doc = json.loads((tmp_path / "sub" / results).read_text())
        assert doc["status"] == "completed" and [e["epoch"] for e in doc["epochs"]] == [1, 2]
        assert doc["checkpoint"] == str(ckpt)
        assert checkpoints.load(ckpt)[1].meta["epoch"] == 3  # the next epoch to run
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == [
        "r.ckpt.h5", "r.json", "s.ckpt.h5", "s.results"]
    assert [p.name for p in elsewhere.iterdir()] == ["results.json"]
    assert (elsewhere / "results.json").read_text() == "another run's\n"


def test_a_resume_with_out_writes_there_and_keeps_what_it_resumes(tmp_path):
    trained(tmp_path, "r", "--epochs", "1")
    before = {name: (tmp_path / name).read_bytes() for name in ("r.json", "r.ckpt.h5")}
    doc = trained(tmp_path, "x", "--resume", str(tmp_path / "r.ckpt.h5"), "--epochs", "2")
    assert [e["epoch"] for e in doc["epochs"]] == [1, 2]
    assert doc["checkpoint"] == str(tmp_path / "x.ckpt.h5")  # beside --out, as for any run
    assert {name: (tmp_path / name).read_bytes() for name in before} == before


def test_a_resume_without_out_never_writes_over_another_runs_results(tmp_path, capsys):
    """A checkpoint saved under its own --checkpoint name c.h5: its results
    default to c.json beside it, which here belongs to another run."""
    trained(tmp_path, "a", "--epochs", "1", "--checkpoint", str(tmp_path / "c.h5"))
    trained(tmp_path, "c", "--epochs", "1", "--seed", "7")
    before = (tmp_path / "c.json").read_bytes()
    assert run.main(["--resume", str(tmp_path / "c.h5"), "--epochs", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another run" in err and "--out" in err
    assert (tmp_path / "c.json").read_bytes() == before
    (tmp_path / "c.json").unlink()  # once it is gone, c.json is this run's to write
    assert run.main(["--resume", str(tmp_path / "c.h5"), "--epochs", "2", "--quiet"]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["config"]["seed"] == 0


def test_a_resume_checks_the_options_it_merges_with_the_checkpoints(tmp_path, capsys):
    """--threads on a resume is compared with the saved run's (not checked
    against this command line's default --algo sequential)."""
    trained(tmp_path, "iv", "--algo", "interval", "--threads", "3", "--epochs", "1")
    ckpt = str(tmp_path / "iv.ckpt.h5")
    assert run.main(["--resume", ckpt, "--threads", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--threads 3, not 2" in err
    assert "cannot change the training options" in err
    assert run.main(["--resume", ckpt, "--threads", "3", "--epochs", "2", "--quiet"]) == 0
    doc = json.loads((tmp_path / "iv.json").read_text())
    assert [e["epoch"] for e in doc["epochs"]] == [1, 2] and doc["config"]["threads"] == 3


def test_a_cluster_lost_for_good_still_writes_its_results(tmp_path, capsys, monkeypatch):
    """A ClusterError that carries the results so far (the server or every node
    lost): one line, exit 1, and the results file written from them."""
    from iasgd.executors.ray_cluster import ClusterError
    from iasgd.results import RunResult

    def lost(*args, **kwargs):
        raise ClusterError("the parameter server was lost, so the run stopped",
                           RunResult(status="server_lost"))

    monkeypatch.setattr(run.engine, "train", lost)
    out = tmp_path / "r.json"
    assert run.main(["--dataset", "synthetic", "--quiet", "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip() == ("iasgd: error: the parameter server was lost, "
                                               "so the run stopped")
    assert json.loads(out.read_text())["status"] == "server_lost"


def test_a_cluster_runs_summary_shows_both_staleness_levels(capsys):
    document = {"final_test_accuracy": 0.5, "status": "completed", "epochs": [{}],
                "train_time_s": 2.0, "samples_per_s": 100.0, "applied": 40, "computed": 40,
                "acceptance_rate": 1.0,
                "staleness": {"mean": 0.5, "max": 3, "bound": 3},
                "cluster": {"node_staleness": {"mean": 1.25, "max": 1, "bound": 1}}}
    run.report(run.Display(quiet=False, epochs=1), document, "r.json")
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith("staleness within nodes mean 0.50 max 3 (bound 3), between "
                              "nodes mean 1.25 max 1 (bound 1); 40 of 40")


@pytest.mark.parametrize(("argv", "text"), [
    ([], "y=16"),
    (["--y0", "8", "--interval-schedule", "decay"], "y decay from 8"),
    (["--interval-schedule", "per-worker", "--interval", "32"], "y=32 per active worker"),
    (["--interval-schedule", "budget", "--interval", "32", "--lr", "0.01"],
     "y=32 per active worker while they fit staleness budget 0.15, else 8"),
])
def test_the_first_line_says_how_y_is_set(argv, text):
    args = run.build_parser().parse_args(["--algo", "interval", "--threads", "4", *argv])
    assert run.interval_text(run.train_config(args)) == text


@pytest.mark.parametrize(("argv", "text"), [
    ([], ""),
    (["--momentum", "0.9", "--nesterov", "--weight-decay", "5e-4", "--label-smoothing", "0.1",
      "--lr-warmup", "0.05", "--lr-decay", "cosine"],
     ", nesterov, weight decay 0.0005, label smoothing 0.1, warm-up 5%, cosine decay"),
])
def test_the_first_line_names_the_sgd_knobs_that_are_set(argv, text):
    assert run._sgd_extras(run.train_config(run.build_parser().parse_args(argv))) == text


def test_help_defines_the_terms_it_uses(capsys):
    with pytest.raises(SystemExit):
        run.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "follow-loss (y shrinks with the smoothed training loss against loss_first, its " \
           "value at the end of epoch 1" in text
    assert "beta = 2 ln(1 + (n+1)/2) / (n+1)" in text
    assert "--loss-window STEPS probe, follow-loss and the thread window:" in text
    assert "interval-budget: --algo interval --interval-schedule budget" in text


def test_a_time_budget_runs_closing_hint_is_a_command_that_runs(tmp_path, capsys,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run.main(["--dataset", "synthetic", "--epochs", "50", "--time-budget", "0.3"]) == 0
    said = capsys.readouterr().out.splitlines()
    hint = said[-1]
    # the summary in words (issue 60, item 5: it said "time_budget: 1 epochs in ...")
    epochs = len(json.loads((tmp_path / "results.json").read_text())["epochs"])
    summary = [line for line in said if " in " in line and "training (" in line]
    assert summary[0].startswith(f"stopped at its time budget: {epochs} "
                                 f"epoch{'' if epochs == 1 else 's'} in "), summary
    command = hint.split("to train on: ")[1]
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "iasgd.run"]
    assert argv[3:] == ["--resume", "results.ckpt.h5", "--time-budget", "0.6"]
    assert run.main([*argv[3:], "--quiet"]) == 0
    assert json.loads((tmp_path / "results.json").read_text())["train_time_s"] >= 0.3


def test_a_variant_run_is_recorded_and_resumes_as_itself(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert run.main(["--dataset", "synthetic", "--epochs", "1", "--quiet", "--variant",
                     "interval-budget", "--threads", "4", "--out", str(out)]) == 0
    config = json.loads(out.read_text())["config"]
    assert config["variant"] == "interval-budget"
    assert (config["algo"], config["interval_schedule"], config["interval"]) == (
        "interval", "budget", 32)
    assert run.main(["--resume", str(tmp_path / "v.ckpt.h5"), "--epochs", "2", "--quiet"]) == 0
    assert json.loads(out.read_text())["config"]["variant"] == "interval-budget"


def test_the_compile_estimate_grows_with_the_load(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert run.compile_range(8, 2) == (8, 9)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0, 0.0, 0.0))
    assert run.compile_range(8, 2) == (8, 16)


def test_an_older_checkpoint_with_an_option_that_did_nothing_still_resumes(tmp_path):
    from iasgd import checkpoints

    out = tmp_path / "r.json"
    assert run.main(["--dataset", "synthetic", "--epochs", "1", "--quiet", "--algo", "hogwild",
                     "--threads", "2", "--out", str(out)]) == 0
    ckpt = tmp_path / "r.ckpt.h5"
    config, snapshot = checkpoints.load(str(ckpt))
    checkpoints.save(ckpt, {**config, "interval": 8, "gate": "drop"}, snapshot)  # as older ones
    out.unlink()
    assert run.main(["--resume", str(ckpt), "--epochs", "2", "--quiet"]) == 0
    resumed = json.loads(out.read_text())["config"]
    assert (resumed["interval"], resumed["gate"]) == (16, "wait")


def test_a_recipe_sets_the_options_the_command_line_does_not():
    cfg, opts, _ = run.command_line(["--recipe", "cifar10", "--epochs", "3", "--algo", "hogwild",
                                     "--threads", "2", "--lr", "0.02"])
    settings = RECIPES["cifar10"].settings
    assert (opts.recipe, opts.model, opts.dataset) == ("cifar10", "vgg-bn", "cifar10")
    assert (cfg.epochs, cfg.lr, cfg.algo, cfg.threads) == (3, 0.02, "hogwild", 2)  # given: kept
    for name in ("batch_size", "momentum", "nesterov", "weight_decay", "lr_warmup", "lr_decay"):
        assert getattr(cfg, name) == settings[name], name
    plain, _, _ = run.command_line(["--epochs", "3"])
    assert plain.momentum != settings["momentum"] and not plain.nesterov


def test_every_recipe_names_options_that_exist_and_no_algorithm():
    fields = {f.name for c in (TrainConfig, run.RunOptions) for f in dataclasses.fields(c)}
    for name, recipe in RECIPES.items():
        assert set(recipe.settings) <= fields, name
        assert not set(recipe.settings) & {"algo", "variant", "threads"}, name
        run.command_line(["--recipe", name])  # its values pass every check
