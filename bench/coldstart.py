"""Time from a fresh process to its first training step, cold and warm.

    python bench/coldstart.py                       # LeNet-5, sequential, synthetic data
    python bench/coldstart.py --dataset cifar10 --algo interval --threads 4

Each measurement is a new Python process that imports iasgd, loads the data,
builds the model and trains until the first progress report (the first chunk
of steps applied, or the end of the epoch if that comes first); the parent
clocks it from before the process starts. "cold" runs with an empty numba
cache (a fresh NUMBA_CACHE_DIR), "warm" with the one the cold run just
filled. The child also prints when its imports, its data and
its kernels (the moment the clock of the first epoch starts) were ready, so
the time of each phase shows. Run it on a quiet machine: it measures seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The child: each phase's time since the parent's clock started (T0 in its env).
CHILD = r"""
import json, os, sys, time
t0 = float(os.environ["COLDSTART_T0"])
marks = {"python": time.time() - t0}
import iasgd
marks["imports"] = time.time() - t0
args = json.loads(sys.argv[1])
data = iasgd.load(args["dataset"])
marks["data"] = time.time() - t0
model = iasgd.build(args["model"], args["dataset"])
first = {}

def epoch_start(epoch, samples):
    marks.setdefault("kernels", time.time() - t0)

def progress(done, live):
    first.setdefault("step", time.time() - t0)

stop = lambda: "interrupted" if first else None
hooks = iasgd.Hooks(on_epoch_start=epoch_start, on_progress=progress, should_stop=stop)
cfg = iasgd.TrainConfig(algo=args["algo"], threads=args["threads"], epochs=1,
                        eval_every=0)
iasgd.train(model, data, cfg, hooks)
# an epoch that ends before its first progress report: its end bounds the first step
marks["first_step"] = first.get("step", time.time() - t0)
print("COLDSTART", json.dumps(marks))
"""


def time_to_first_step(args: argparse.Namespace, cache_dir: str | None) -> dict[str, float]:
    """One fresh process's phase times (seconds since before it started), with
    its numba cache in `cache_dir` (None: iasgd's usual cache)."""
    spec = json.dumps({"dataset": args.dataset, "model": args.model, "algo": args.algo,
                       "threads": args.threads})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    env["COLDSTART_T0"] = repr(time.time())
    # `python -c` puts the working directory first on sys.path, ahead of
    # PYTHONPATH: run in REPO so that this checkout's iasgd is the one timed
    proc = subprocess.run([sys.executable, "-c", CHILD, spec], capture_output=True, text=True,
                          env=env, timeout=900, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"the child failed:\n{proc.stderr[-2000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("COLDSTART "))
    return json.loads(line.split(" ", 1)[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="synthetic")
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--algo", default="sequential")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warm-repeats", type=int, default=3)
    args = ap.parse_args(argv)
    phases = ("python", "imports", "data", "kernels", "first_step")
    print(f"{args.model} on {args.dataset}, {args.algo} x {args.threads}; seconds since "
          "the process was started")
    print(f"{'run':<6}" + "".join(f"{p:>12}" for p in phases))
    with tempfile.TemporaryDirectory(prefix="iasgd-coldstart-") as cache:
        runs = [("cold", time_to_first_step(args, cache))]
        runs += [("warm", time_to_first_step(args, cache)) for _ in range(args.warm_repeats)]
    for name, marks in runs:
        print(f"{name:<6}" + "".join(f"{marks[p]:12.2f}" for p in phases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
