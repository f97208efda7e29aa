"""Every way a command-line run can end ends well (iasgd.console, iasgd.run):
a reader that goes away (`| head -1`, `> /dev/full`, a closed terminal)
costs the run nothing; Ctrl-C at any moment is one line and exit 130 with
nothing half-written; a results file that cannot be written is one line,
exit 2, the checkpoint kept."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iasgd import checkpoints, console, files, run

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
TRAIN = [sys.executable, "-m", "iasgd.run", "--dataset", "synthetic", "--lr", "0.02"]


def finished_run(tmp_path: Path, stdout, *args: str, stderr=subprocess.PIPE
                 ) -> subprocess.CompletedProcess:
    return subprocess.run([*TRAIN, "--epochs", "2", "--out", str(tmp_path / "r.json"), *args],
                          stdout=stdout, stderr=stderr, text=True, env=ENV, timeout=300)


def assert_written(tmp_path: Path) -> None:
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["status"] == "completed" and len(doc["epochs"]) == 2
    assert checkpoints.load(str(tmp_path / "r.ckpt.h5"))[1].meta["epoch"] == 3


def test_a_closed_pipe_on_stdout_costs_the_run_nothing(tmp_path):
    # `| head -1` once head has exited: every write to stdout fails with EPIPE
    read, write = os.pipe()
    os.close(read)
    try:
        proc = finished_run(tmp_path, write)
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert_written(tmp_path)


def test_a_full_disk_on_stdout_costs_the_run_nothing(tmp_path):
    with open("/dev/full", "w") as full:
        proc = finished_run(tmp_path, full)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert_written(tmp_path)


def test_a_closed_terminal_costs_the_run_nothing(tmp_path):
    master, slave = os.openpty()
    # 12 epochs of about 0.6 s: the terminal goes after the first, with 11 to go
    proc = subprocess.Popen([*TRAIN, "--epochs", "12", "--out", str(tmp_path / "r.json")],
                            stdin=slave, stdout=slave, stderr=slave, env=ENV,
                            start_new_session=True)
    os.close(slave)
    seen = b""
    while b"epoch   1" not in seen:  # training, with its bar on the terminal
        chunk = os.read(master, 4096)
        assert chunk, seen
        seen += chunk
    assert proc.poll() is None  # still training when the terminal goes
    os.close(master)  # the terminal goes: writes to it fail with EIO, and its
    proc.send_signal(signal.SIGHUP)  # session's leader gets SIGHUP, as the kernel sends
    assert proc.wait(timeout=300) == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["status"] == "completed" and len(doc["epochs"]) == 12


def test_a_results_file_that_cannot_be_written_is_one_line_and_keeps_the_checkpoint(
        tmp_path, capsys, monkeypatch):
    def full(path, document):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "write_json_atomic", full)
    out = tmp_path / "r.json"
    code = run.main(["--dataset", "synthetic", "--epochs", "1", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (f"iasgd: error: cannot write the results to {out} (No space left on "
                   f"device); the checkpoint is in {tmp_path / 'r.ckpt.h5'}\n")
    assert (tmp_path / "r.ckpt.h5").exists()


def test_write_line_mutes_a_stream_whose_reader_is_gone(tmp_path):
    read, write = os.pipe()
    os.close(read)
    stream = os.fdopen(write, "w")
    console.write_line("lost", stream)  # EPIPE: muted, not raised
    console.write_line("lost too", stream)
    stream.close()  # the last flush goes to /dev/null
    console.write_line("nothing", None)


# Ctrl-C (SIGINT to the whole process group, as a terminal sends it) at
# moments spread over a run's start (imports, data, the model), its first
# steps and its training, counted from when iasgd takes over from Python's
# own start-up (tens of milliseconds, where Python itself answers Ctrl-C).
# bench/interrupts.py does the same at 20 random moments, a cold numba cache
# included.
MOMENTS = (0.0, 0.3, 0.7, 1.2, 2.5)


def wait_until_iasgd_handles_signals(pid: int) -> None:
    """Until process `pid` catches SIGTERM, which Python leaves alone and
    iasgd/__init__.py takes first thing (/proc/PID/status's SigCgt mask)."""
    while True:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(status.split("SigCgt:")[1].split()[0], 16)
        if caught >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.001)


def interrupt_at(tmp_path: Path, seconds: float) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([*TRAIN, "--epochs", "500", "--out", str(tmp_path / "r.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True, cwd=tmp_path)
    wait_until_iasgd_handles_signals(proc.pid)
    time.sleep(seconds)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("seconds", MOMENTS)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(tmp_path, seconds):
    proc = interrupt_at(tmp_path, seconds)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("iasgd: "), proc.stderr
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    if (tmp_path / "r.ckpt.h5").exists():  # it stopped training: what it saved is whole
        assert checkpoints.load(str(tmp_path / "r.ckpt.h5"))[1].meta["epoch"] >= 1
        assert json.loads((tmp_path / "r.json").read_text())["status"] == "interrupted"
    else:
        assert "nothing was written" in last and not (tmp_path / "r.json").exists()
