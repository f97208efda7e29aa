"""Single-thread training throughput of LeNet-5, iasgd vs PyTorch, side by side.

    python bench/kernels.py [--batch-sizes 8,16,64] [--steps 400] [--repeats 5]

For each batch size: samples/s of full SGD-with-momentum training steps on
CIFAR-10-shaped data (after a warm-up; median, min and max of the repeats),
iasgd's compiled step next to the same network and optimiser in PyTorch with
torch.set_num_threads(1) where torch is importable, and their ratio. Then the
time to the first training step of a fresh process, with an empty numba cache
(full compile) and with a warm one (cached start-up).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from iasgd import kernels as K  # noqa: E402
from iasgd import models  # noqa: E402

LR, MOMENTUM = 0.005, 0.5


def iasgd_samples_per_s(batch: int, steps: int, repeats: int, images, labels) -> list[float]:
    m = models.build("lenet", "cifar10")
    params = m.init(0)
    velocity = np.zeros_like(params)
    ws = m.workspace(batch)
    flat = images.reshape(images.shape[0], -1)
    order = np.random.default_rng(0).permutation(images.shape[0]).astype(np.int64)
    losses = np.zeros(order.size // batch + 1)

    def run(count: int) -> None:
        K.train_steps(params, velocity, ws.grad, ws.plan.conv, ws.plan.dense, ws.acts,
                      ws.dacts, ws.argmax, ws.labels, flat, *m.image_transform, labels, order,
                      0, count, batch, LR, MOMENTUM, losses)

    return timed(run, batch, steps, repeats)


def timed(run, batch: int, steps: int, repeats: int) -> list[float]:
    """samples/s of `repeats` calls of run(steps), after a warm-up of 10 steps."""
    run(10)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(steps)
        rates.append(steps * batch / (time.perf_counter() - t0))
    return rates


def torch_samples_per_s(batch: int, steps: int, repeats: int, images, labels) -> list[float]:
    import torch
    from torch_reference import torch_inputs, torch_net

    torch.set_num_threads(1)
    m = models.build("lenet", "cifar10")
    net = torch_net(m, m.init(0))
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    x = torch_inputs(images)  # converted once: PyTorch gets its data for free
    y = torch.from_numpy(labels)
    order = torch.from_numpy(np.random.default_rng(0).permutation(images.shape[0]))

    def run(count: int) -> None:
        for s in range(count):
            idx = order[s * batch:(s + 1) * batch]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()

    return timed(run, batch, steps, repeats)


STARTUP_SCRIPT = """
import time; t0 = time.perf_counter()
import numpy as np
from iasgd import models, kernels as K
m = models.build("lenet", "cifar10"); p = m.init(0); ws = m.workspace(16)
images = np.zeros((16, 3072), np.uint8); labels = np.zeros(16, np.int64)
K.train_steps(p, np.zeros_like(p), ws.grad, ws.plan.conv, ws.plan.dense, ws.acts, ws.dacts,
              ws.argmax, ws.labels, images, *m.image_transform, labels,
              np.arange(16), 0, 1, 16, 0.005, 0.5, np.zeros(1))
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
    ap.add_argument("--batch-sizes", default="8,16,64")
    ap.add_argument("--steps", type=int, default=400, help="training steps per repetition")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None

    rng = np.random.default_rng(0)
    n = max(int(b) for b in args.batch_sizes.split(",")) * (args.steps + 10)
    images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, n).astype(np.int64)

    print(f"LeNet-5 (CIFAR-10 shape), SGD lr={LR} momentum={MOMENTUM}, one thread; "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    print(f"samples/s: median (min-max) of {args.repeats} x {args.steps} steps after warm-up")
    print(f"| batch | iasgd samples/s          | PyTorch {torch_version or '(absent)'} samples/s "
          "| ratio |")
    print("|------:|-------------------------:|--------------------------:|------:|")
    for b in (int(s) for s in args.batch_sizes.split(",")):
        ours = iasgd_samples_per_s(b, args.steps, args.repeats, images, labels)
        if torch_version:
            theirs = torch_samples_per_s(b, args.steps, args.repeats, images, labels)
            ratio = f"{statistics.median(ours) / statistics.median(theirs):.2f}x"
            print(f"| {b:5d} | {fmt(ours):>24} | {fmt(theirs):>25} | {ratio:>5} |")
        else:
            print(f"| {b:5d} | {fmt(ours):>24} | {'-':>25} | {'-':>5} |")
    with tempfile.TemporaryDirectory() as cache:
        cold = startup_seconds(cache)
        warm = statistics.median(startup_seconds(cache) for _ in range(3))
    print(f"fresh process to first step: {cold:.1f} s with an empty numba cache (full compile), "
          f"{warm:.2f} s cached")


if __name__ == "__main__":
    main()
