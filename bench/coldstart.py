"""Time from a fresh process to its first training step, cold and warm.

    python bench/coldstart.py                       # LeNet-5, sequential, synthetic data
    python bench/coldstart.py --dataset cifar10 --algo interval --threads 4
    python bench/coldstart.py --baseline main --repeats 3   # before/after, in turns

Each measurement is a new Python process that imports iasgd, loads the data,
builds the model and trains until the first progress report (the first chunk
of steps applied, or the end of the epoch if that comes first); the parent
clocks it from before the process starts. "cold" runs with an empty numba
cache (a fresh NUMBA_CACHE_DIR), "warm" with the one the cold run just
filled. The child also prints when its imports, its data and
its kernels (the moment the clock of the first epoch starts) were ready, so
the time of each phase shows. Run it on a quiet machine: it measures seconds.
With --baseline REF, REF's iasgd (a commit of this repository) takes its
turn before this checkout's in every round, each with its own fresh cache,
so that a machine's drift slows both alike; --repeats sets the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from baseline import baseline_tree  # noqa: E402

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


def time_to_first_step(args: argparse.Namespace, cache_dir: str | None,
                       tree: Path = REPO) -> dict[str, float]:
    """One fresh process's phase times (seconds since before it started) with
    the iasgd in `tree` and its numba cache in `cache_dir` (None: iasgd's usual cache)."""
    spec = json.dumps({"dataset": args.dataset, "model": args.model, "algo": args.algo,
                       "threads": args.threads})
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    env["COLDSTART_T0"] = repr(time.time())
    # `python -c` puts the working directory first on sys.path, ahead of
    # PYTHONPATH: run in the tree so that its iasgd is the one timed
    proc = subprocess.run([sys.executable, "-c", CHILD, spec], capture_output=True, text=True,
                          env=env, timeout=900, cwd=tree)
    if proc.returncode != 0:
        sys.exit(f"the child failed:\n{proc.stderr[-2000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("COLDSTART "))
    return json.loads(line.split(" ", 1)[1])


def one_round(args: argparse.Namespace, tree: Path) -> list[tuple[str, dict[str, float]]]:
    """A cold run of `tree`'s iasgd with an empty numba cache, then the warm
    runs with the cache it filled."""
    with tempfile.TemporaryDirectory(prefix="iasgd-coldstart-") as cache:
        runs = [("cold", time_to_first_step(args, cache, tree))]
        runs += [("warm", time_to_first_step(args, cache, tree))
                 for _ in range(args.warm_repeats)]
    return runs


def width(runs: list) -> int:
    return max(len(name) for name, _ in runs) + 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="synthetic")
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--algo", default="sequential")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warm-repeats", type=int, default=3)
    ap.add_argument("--baseline", metavar="REF",
                    help="time REF's iasgd too, in turns with this checkout's")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of cold + warm runs (with --baseline: each tree per round)")
    args = ap.parse_args(argv)
    phases = ("python", "imports", "data", "kernels", "first_step")
    print(f"{args.model} on {args.dataset}, {args.algo} x {args.threads}; seconds since "
          "the process was started")
    trees = [("this", REPO)]
    if args.baseline:
        trees.insert(0, (args.baseline, baseline_tree(args.baseline)))
    runs = [(f"{name} {kind}", marks) for _ in range(args.repeats) for name, tree in trees
            for kind, marks in one_round(args, tree)]
    print(f"{'run':<{width(runs)}}" + "".join(f"{p:>12}" for p in phases))
    for name, marks in runs:
        print(f"{name:<{width(runs)}}" + "".join(f"{marks[p]:12.2f}" for p in phases))
    if args.baseline:
        cold = {name: statistics.median(m["first_step"] for n, m in runs if n == f"{name} cold")
                for name, _ in trees}
        base, this = cold[args.baseline], cold["this"]
        print(f"median cold first step: {args.baseline} {base:.2f} s, this {this:.2f} s, "
              f"this / {args.baseline} {this / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
