"""Ctrl-C at random moments of a command-line run: every one must end in one
line and exit 130, with no traceback and nothing half-written, and the next
run must start clean.

    python bench/interrupts.py                  20 moments in the first 10 s
    python bench/interrupts.py --cold           ... each with an empty numba cache
    python bench/interrupts.py --moments 5 --until 3 --dataset cifar10 --archive A

Moments count from when iasgd takes over the signals, tens of milliseconds
into the process (before that, Python's own start-up answers Ctrl-C, with a
traceback, as it does for any program). Each run trains in a folder of its
own (its data cache there too, so that a registry dataset is converted in
it); SIGINT goes to the run's whole process group, as a terminal sends it.
Prints one row per moment and exits 1 if any moment ended otherwise.
tests/test_console.py runs five fixed moments.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iasgd import checkpoints  # noqa: E402


def wait_until_iasgd_handles_signals(pid: int) -> None:
    """Until process `pid` catches SIGTERM, which Python leaves alone and
    iasgd/__init__.py takes first thing (/proc/PID/status's SigCgt mask):
    before that, Python's own start-up answers Ctrl-C, as for any program."""
    while True:
        status = Path(f"/proc/{pid}/status").read_text()
        if int(status.split("SigCgt:")[1].split()[0], 16) >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.001)


def interrupted_run(folder: Path, seconds: float, argv: list[str], env: dict) -> dict:
    """Start a run in `folder`, Ctrl-C it after `seconds`; what it left."""
    cmd = [sys.executable, "-m", "iasgd.run", "--epochs", "1000", "--out",
           str(folder / "r.json"), "--data-dir", str(folder / "data"), *argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True, cwd=folder)
    t0 = time.perf_counter()
    wait_until_iasgd_handles_signals(proc.pid)
    startup = time.perf_counter() - t0
    time.sleep(seconds)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    lines = err.splitlines()
    leftovers = [p.name for p in folder.rglob("*.tmp")]
    saved = (folder / "r.ckpt.h5").exists()
    if saved:
        checkpoints.load(str(folder / "r.ckpt.h5"))  # raises if half-written
    ok = (proc.returncode == 130 and "Traceback" not in err and bool(lines)
          and lines[-1].startswith("iasgd: ") and not leftovers)
    return {"seconds": seconds, "startup": startup, "code": proc.returncode,
            "last": lines[-1] if lines else "", "checkpoint": saved, "leftovers": leftovers,
            "ok": ok}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--moments", type=int, default=20)
    p.add_argument("--until", type=float, default=10.0, help="latest moment, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cold", action="store_true", help="each run with an empty numba cache")
    args, run_argv = p.parse_known_args()
    run_argv = run_argv or ["--dataset", "synthetic"]
    rng = random.Random(args.seed)
    moments = sorted(rng.uniform(0, args.until) for _ in range(args.moments))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, seconds in enumerate(moments):
            folder = Path(tmp) / f"m{i}"
            folder.mkdir()
            if args.cold:
                env["NUMBA_CACHE_DIR"] = str(folder / "numba")
            row = interrupted_run(folder, seconds, run_argv, env)
            failed += not row["ok"]
            print(f"{seconds:6.2f} s (after {1e3 * row['startup']:3.0f} ms of Python's start-up)"
                  f"  exit {row['code']}  "
                  f"{'checkpoint' if row['checkpoint'] else 'nothing saved':13}  "
                  f"{'ok' if row['ok'] else 'FAILED'}  {row['last'][:72]}", flush=True)
        clean = subprocess.run([sys.executable, "-m", "iasgd.run", *run_argv, "--epochs", "1",
                                "--quiet", "--out", str(Path(tmp) / "m0" / "again.json"),
                                "--data-dir", str(Path(tmp) / "m0" / "data")],
                               env=env, cwd=Path(tmp) / "m0", capture_output=True, text=True)
        print(f"the next run: exit {clean.returncode} {clean.stderr.strip()}")
    print(f"{len(moments) - failed} of {len(moments)} moments ended well")
    return 1 if failed or clean.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
