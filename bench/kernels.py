"""Single-thread training throughput of every preset, iasgd vs PyTorch, side by side.

    python bench/kernels.py [--models lenet,mlp,vgg-small] [--batch-sizes 8,16,64]
                            [--seconds 1.0] [--repeats 5]

For each model and batch size: samples/s of full SGD-with-momentum training
steps on CIFAR-10-shaped data (after a warm-up; median, min and max of the
repeats), iasgd's compiled step next to the same network and optimiser in
PyTorch with torch.set_num_threads(1) where torch is importable, and their
ratio. The two take turns repetition by repetition, so that a noisy machine
slows both alike. Each repetition runs about --seconds of steps (calibrated
in the warm-up). Then the time to the first training step of a fresh
process, with an empty numba cache (full compile) and with a warm one
(cached start-up).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from iasgd.nn import kernels as K  # noqa: E402
from iasgd.nn import models  # noqa: E402

LR, MOMENTUM = 0.005, 0.5
DATASET = "cifar10"


def iasgd_runner(model: models.Model, batch: int, images: np.ndarray,
                 labels: np.ndarray) -> Callable[[int], None]:
    """run(count): count training steps of iasgd's compiled loop."""
    params = model.init(0)
    velocity = np.zeros_like(params)
    ws = model.workspace(batch)
    flat = images.reshape(images.shape[0], -1)
    order = np.random.default_rng(0).permutation(images.shape[0]).astype(np.int64)
    losses = np.zeros(order.size // batch + 1)
    limit = order.size // batch

    def run(count: int) -> None:
        for first in range(0, count, limit):  # wrap around the data
            K.train_steps(K.Weights(params, velocity), ws.buffers,
                          K.Images(flat, labels, *model.image_transform),
                          K.Steps(order, 0, min(limit, count - first), batch, LR, MOMENTUM),
                          losses)

    return run


def torch_runner(model: models.Model, batch: int, images: np.ndarray,
                 labels: np.ndarray) -> Callable[[int], None]:
    """run(count): count training steps of the same net in PyTorch, 1 thread."""
    import torch
    from torch_reference import torch_inputs, torch_net

    torch.set_num_threads(1)
    net = torch_net(model, model.init(0))
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    x = torch_inputs(images)  # converted once: PyTorch gets its data for free
    y = torch.from_numpy(labels)
    order = torch.from_numpy(np.random.default_rng(0).permutation(images.shape[0]))
    limit = images.shape[0] // batch

    def run(count: int) -> None:
        for s in range(count):
            idx = order[(s % limit) * batch:(s % limit + 1) * batch]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()

    return run


def side_by_side(runners: list[Callable[[int], None]], batch: int, seconds: float,
                 repeats: int) -> list[list[float]]:
    """samples/s of each runner, `repeats` times, taking turns; each repetition
    runs about `seconds` of steps, calibrated on a warm-up."""
    steps = []
    for run in runners:
        run(2)  # compile / allocate
        t0 = time.perf_counter()
        run(5)
        per_step = (time.perf_counter() - t0) / 5
        steps.append(max(5, round(seconds / per_step)))
    rates: list[list[float]] = [[] for _ in runners]
    for _ in range(repeats):
        for i, run in enumerate(runners):
            t0 = time.perf_counter()
            run(steps[i])
            rates[i].append(steps[i] * batch / (time.perf_counter() - t0))
    return rates


STARTUP_SCRIPT = """
import time; t0 = time.perf_counter()
import numpy as np
from iasgd.nn import models
from iasgd.nn import kernels as K
m = models.build("lenet", "cifar10"); p = m.init(0); ws = m.workspace(16)
images = np.zeros((16, 3072), np.uint8); labels = np.zeros(16, np.int64)
K.train_steps(K.Weights(p, np.zeros_like(p)), ws.buffers,
              K.Images(images, labels, *m.image_transform),
              K.Steps(np.arange(16), 0, 1, 16, 0.005, 0.5), np.zeros(1))
m.predict_images(p, np.zeros((1, 3, 32, 32), np.uint8))
print(time.perf_counter() - t0)
"""


def startup_seconds(cache_dir: str) -> float:
    """Wall time of a fresh interpreter from start to its first training step
    (and first prediction) done, with NUMBA_CACHE_DIR=cache_dir."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", STARTUP_SCRIPT], check=True, env=env,
                   capture_output=True)
    return time.perf_counter() - t0


def fmt(rates: list[float]) -> str:
    return f"{statistics.median(rates):9,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(models.MODELS),
                    help="presets or spec strings, comma-separated; separate specs with ';'")
    ap.add_argument("--batch-sizes", default="8,16,64")
    ap.add_argument("--seconds", type=float, default=1.0, help="seconds per repetition")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-startup", action="store_true", help="skip the start-up timing")
    args = ap.parse_args()
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    names = args.models.split(";") if ";" in args.models else args.models.split(",")
    batches = [int(b) for b in args.batch_sizes.split(",")]

    rng = np.random.default_rng(0)
    n = max(batches) * 64
    images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, n).astype(np.int64)

    print(f"CIFAR-10 shape, SGD lr={LR} momentum={MOMENTUM}, one thread; "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"samples/s: median (min-max) of {args.repeats} repetitions of ~{args.seconds:g} s "
          "after warm-up, the two taking turns")
    print(f"| model | params | batch | iasgd samples/s | PyTorch {torch_version or '(absent)'} "
          "samples/s | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        model = models.build(name, DATASET)
        for b in batches:
            runners = [iasgd_runner(model, b, images, labels)]
            if torch_version:
                runners.append(torch_runner(model, b, images, labels))
            rates = side_by_side(runners, b, args.seconds, args.repeats)
            if torch_version:
                ratio = f"{statistics.median(rates[0]) / statistics.median(rates[1]):.2f}x"
                theirs = fmt(rates[1])
            else:
                ratio = theirs = "-"
            print(f"| {name} | {model.num_params:,} | {b} | {fmt(rates[0])} | {theirs} | "
                  f"{ratio} |", flush=True)
    if not args.no_startup:
        with tempfile.TemporaryDirectory() as cache:
            cold = startup_seconds(cache)
            warm = statistics.median(startup_seconds(cache) for _ in range(3))
        print(f"fresh process to first step: {cold:.1f} s with an empty numba cache "
              f"(full compile), {warm:.2f} s cached")


if __name__ == "__main__":
    main()
