"""Single-thread training throughput of every preset, iasgd vs PyTorch, side by side.

    python bench/kernels.py [--models lenet,mlp,vgg-small] [--batch-sizes 8,16,64]
                            [--seconds 1.0] [--repeats 5] [--baseline REF]

For each model and batch size: samples/s of full SGD-with-momentum training
steps on CIFAR-10-shaped data (after a warm-up; median, min and max of the
repeats), iasgd's compiled step next to the same network and optimiser in
PyTorch with torch.set_num_threads(1) where torch is importable, and their
ratio. The two take turns repetition by repetition, so that a noisy machine
slows both alike. Each repetition runs about --seconds of steps (calibrated
in the warm-up). iasgd's rate is also given in GFLOP/s (the convolutions'
and dense layers' multiply-adds, forward and backward, counted as 2 FLOP)
and as a fraction of the single-core sgemm rate (numpy's BLAS, one thread,
512 x 512 x 512 float32), which takes its turn too: each repetition's
steps against the sgemm rate of the same turn, since the VM's speed drifts
by 10-30 % within a run. With --baseline REF
(a git commit of this repository), the same steps of REF's iasgd take their
turn too, in a child process that imports that version (a before/after
table measured in one run).

Then a per-op breakdown of each model and batch size: the time of every op
of the plan, forward and backward, each run alone (the row's compiled ops,
repeated inside compiled code) and the GFLOP/s of those with
arithmetic, and the batch's gather: plain, and with --augment crop,flip
(padding 4: the codes' draw and the augmented gather) and what that adds
to the ops' time. Then the time to the first training step of a fresh process,
with an empty numba cache and with a warm one, as bench/coldstart.py
measures it (the run's own path: compiling in child processes).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from baseline import baseline_tree  # noqa: E402

from iasgd.nn import models  # noqa: E402
from iasgd.nn.blas import single_threaded_blas  # noqa: E402

try:  # a --baseline child may run a tree from before iasgd.nn.network and plan
    from iasgd.nn import network as K
    from iasgd.nn.plan import Images, Steps, Weights
except ImportError:
    from iasgd.nn import kernels as K
    Images, Steps, Weights = K.Images, K.Steps, K.Weights

LR, MOMENTUM = 0.005, 0.5
# A --baseline child's tree may predate the Sgd bundle (Steps' lr, momentum
# and network_loss_and_grad's label smoothing)
WITH_SGD = "sgd" in Steps._fields
# and its train_steps the `augment` and `knobs` arguments (None: no
# augmentation; the paper's step)
PAPER_EXTRAS = tuple(None for name in ("augment", "knobs")
                     if name in K.train_steps.py_func.__code__.co_varnames)


def paper_steps(order: np.ndarray, first: int, count: int, batch: int) -> tuple:
    """train_steps' Steps for the paper's step (LR, MOMENTUM), in this tree's form."""
    if WITH_SGD:
        from iasgd.nn.plan import plain_sgd
        return Steps(order, first, count, batch, plain_sgd(LR, MOMENTUM), 0)
    return Steps(order, first, count, batch, LR, MOMENTUM)


def loss_and_grad(params: np.ndarray, ws, labels: np.ndarray) -> float:
    """network_loss_and_grad over a workspace, hard labels, in this tree's form."""
    smoothing = (0.0,) if WITH_SGD else ()
    return K.network_loss_and_grad(params, ws.grad, ws.net, ws.acts, ws.dacts, ws.argmax,
                                   labels, *smoothing)
DATASET = "cifar10"


SGEMM_SIZE = 512


def sgemm_runner() -> Callable[[int], None]:
    """run(count): count 512^3 float32 products of numpy's BLAS (the caller
    limits it to one thread): the sgemm rate, taking its turn beside the
    steps."""
    rng = np.random.default_rng(0)
    a, b = (rng.random((SGEMM_SIZE, SGEMM_SIZE), dtype=np.float32) for _ in range(2))
    c = np.empty_like(a)

    def run(count: int) -> None:
        for _ in range(count):
            np.dot(a, b, out=c)

    return run


def sgemm_gflops(seconds: float = 1.0) -> float:
    """Single-core float32 GEMM rate of numpy's BLAS, best of repeated 512^3
    products over about `seconds` (the caller limits BLAS to one thread)."""
    run = sgemm_runner()
    run(1)
    best = math.inf
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        run(1)
        best = min(best, time.perf_counter() - t0)
    return 2 * SGEMM_SIZE ** 3 / best / 1e9


def op_flops(row: np.ndarray, n: int) -> tuple[float, float]:
    """FLOPs of a plan row's forward and backward for n samples (2 per
    multiply-add; the conv's wide junk columns not counted): its kind's count."""
    from iasgd.nn import layers  # the parent's tree only (a --baseline child may lack it)

    return layers.row_op(row).flops(row, n)


def model_flops(model: models.Model) -> float:
    """FLOPs of one sample's forward and backward."""
    plan = model.workspace(1).plan
    return sum(sum(op_flops(row, 1)) for row in plan)


def op_repeaters() -> tuple[Callable[..., None], Callable[..., None]]:
    """Compiled loops that repeat one plan row's forward, or its backward
    (built here: the plan's columns come from the parent's tree, which a
    --baseline child, importing this file, may not have)."""
    from iasgd.nn.plan import P_DW, P_DX, P_FWD

    @numba.njit(nogil=True)
    def forward(params, grad, net, i, acts, argmax, n, reps):
        # with the gradient buffer, as a training step: a batch norm's
        # forward then computes the batch's statistics (without, it would
        # predict by the running ones)
        plan = net.plan
        for _ in range(reps):
            net.ops[plan[i, P_FWD]](params, grad, plan, i, acts, acts, argmax, n)

    @numba.njit(nogil=True)
    def backward(params, grad, net, i, acts, dacts, argmax, n, reps):
        plan = net.plan
        for _ in range(reps):
            net.ops[plan[i, P_DW]](params, grad, plan, i, acts, dacts, argmax, n)
            net.ops[plan[i, P_DX]](params, grad, plan, i, acts, dacts, argmax, n)

    return forward, backward


def op_label(row: np.ndarray) -> str:
    """conv 32->64 k3 on 18x18, dense 4096->128, pool 32x32x32, ...: its kind's label."""
    from iasgd.nn import layers

    return layers.row_op(row).describe(row)


def _rate(flops: float, seconds: float) -> str:
    return f"{flops / seconds / 1e9:6.1f}" if flops and seconds else "     -"


def op_breakdown(model: models.Model, batch: int, seconds: float = 0.05) -> list[str]:
    """Table rows: each op's forward and backward time per batch and GFLOP/s
    (a batch that runs in slices: an op's time on one slice, times their count)."""
    ws = model.workspace(batch)
    n = ws.slice_size
    params = model.init(0)
    rng = np.random.default_rng(0)
    ws.acts[:batch * model.input_size] = rng.uniform(-1, 1, batch * model.input_size)
    labels = rng.integers(0, model.num_classes, batch)
    loss_and_grad(params, ws, labels)

    def timed(run: Callable[[int], None]) -> float:
        run(1)  # compile / warm
        t0 = time.perf_counter()
        run(3)
        reps = max(3, round(seconds / max((time.perf_counter() - t0) / 3, 1e-7)))
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            run(reps)
            best = min(best, (time.perf_counter() - t0) / reps)
        return best * batch / n

    lines = []
    total = [0.0, 0.0]
    _repeat_forward_op, _repeat_backward_op = op_repeaters()
    for i, row in enumerate(ws.plan):
        fwd = timed(lambda r, i=i: _repeat_forward_op(params, ws.grad, ws.net, i, ws.acts,
                                                      ws.argmax, n, r))
        bwd = timed(lambda r, i=i: _repeat_backward_op(params, ws.grad, ws.net, i, ws.acts,
                                                       ws.dacts, ws.argmax, n, r))
        f_fl, b_fl = op_flops(row, batch)
        total[0] += fwd
        total[1] += bwd
        lines.append(f"| {model.name} | {batch} | {op_label(row)} | {fwd * 1e6:8.1f} | "
                     f"{_rate(f_fl, fwd)} | {bwd * 1e6:8.1f} | {_rate(b_fl, bwd)} |")
    sliced = f" (in slices of {n})" if n < batch else ""
    lines.append(f"| {model.name} | {batch} | all ops{sliced} | {total[0] * 1e6:8.1f} | | "
                 f"{total[1] * 1e6:8.1f} | |")
    # the batch's gather (its own row: not in "all ops"), plain and augmented
    # (--augment crop,flip, padding 4: drawing the codes and the gather)
    plain, augmented = gather_repeaters()
    images, _ = bench_images(max(4 * batch, 256))
    flat = images.reshape(images.shape[0], -1)
    idx = rng.integers(0, flat.shape[0], batch)
    scale, shift = model.image_transform
    x = ws.acts[:batch * flat.shape[1]].reshape(batch, -1)
    codes, stream = np.zeros((batch, 3), np.int64), np.array([1], np.uint64)
    gather = timed(lambda r: plain(flat, idx, scale, shift, x, r)) * n / batch
    shape = tuple(int(v) for v in model.input_shape)
    crop_flip = timed(lambda r: augmented(flat, idx, codes, stream, shape, 4, scale, shift,
                                          x, r)) * n / batch
    step = total[0] + total[1]
    lines.append(f"| {model.name} | {batch} | gather | {gather * 1e6:8.1f} | | | |")
    lines.append(f"| {model.name} | {batch} | gather crop,flip pad 4, codes drawn "
                 f"(+{(crop_flip - gather) / step:.1%} of all ops) | {crop_flip * 1e6:8.1f} "
                 "| | | |")
    return lines


def gather_repeaters() -> tuple[Callable[..., None], Callable[..., None]]:
    """Compiled loops repeating a batch's plain gather, or its codes' draw
    and augmented gather (crop and flip), as the training steps make them."""
    from iasgd.nn import augment as A  # the parent's tree only

    @numba.njit(nogil=True)
    def plain(images, idx, scale, shift, x, reps):
        for _ in range(reps):
            K.gather_images(images, idx, scale, shift, x)

    @numba.njit(nogil=True)
    def augmented(images, idx, codes, rng, shape, pad, scale, shift, x, reps):
        for _ in range(reps):
            A.draw_codes(codes, idx.size, pad, True, rng)
            A.gather_augmented(images, idx, codes, shape, scale, shift, x)

    return plain, augmented


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
            K.train_steps(Weights(params, velocity), ws.buffers,
                          Images(flat, labels, *model.image_transform),
                          paper_steps(order, 0, min(limit, count - first), batch),
                          losses, *PAPER_EXTRAS)

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


# A child process that imports one version of iasgd (the tree's) and then
# this file's iasgd_runner, and runs the steps it is told: one line "count"
# in, one line "done" out; it ends when its stdin closes.
CHILD_STEPS = r"""
import sys
tree, bench, name = sys.argv[1:4]
batch, n = int(sys.argv[4]), int(sys.argv[5])
sys.path[:0] = [tree, bench]
from iasgd.nn import models  # the tree's iasgd, before kernels puts this repository first
from iasgd.nn.blas import single_threaded_blas
import kernels as B
assert models.__file__.startswith(tree), models.__file__
single_threaded_blas()
images, labels = B.bench_images(n)
run = B.iasgd_runner(models.build(name, B.DATASET), batch, images, labels)
for line in sys.stdin:
    run(int(line))
    print("done", flush=True)
"""


def bench_images(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n random CIFAR-10-shaped uint8 images and labels (the same for a seed)."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    return images, rng.integers(0, 10, n).astype(np.int64)


class ChildSteps:
    """run(count): count training steps of the iasgd in `tree` (REF's, or
    this repository's), in a child process (CHILD_STEPS) until close()."""

    def __init__(self, tree: Path, name: str, batch: int, n: int) -> None:
        self.what = f"{tree}: {name}, batch {batch}"
        self.child = subprocess.Popen([sys.executable, "-c", CHILD_STEPS, str(tree),
                                       str(REPO / "bench"), name, str(batch), str(n)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      env={**os.environ, "PYTHONPATH": ""})

    def __call__(self, count: int) -> None:
        assert self.child.stdin is not None and self.child.stdout is not None
        self.child.stdin.write(f"{count}\n")
        self.child.stdin.flush()
        if self.child.stdout.readline().strip() != "done":
            sys.exit(f"the child timing {self.what} failed")

    def close(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.close()
        self.child.wait()


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
    ap.add_argument("--no-breakdown", action="store_true", help="skip the per-op breakdown")
    ap.add_argument("--baseline", metavar="REF",
                    help="also time this git commit's iasgd, taking turns (before/after)")
    args = ap.parse_args()
    single_threaded_blas()  # the kernels' GEMMs, and the sgemm reference, on one core
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    names = args.models.split(";") if ";" in args.models else args.models.split(",")
    batches = [int(b) for b in args.batch_sizes.split(",")]

    n = max(batches) * 64
    images, labels = bench_images(n)
    tree = baseline_tree(args.baseline) if args.baseline else None

    sgemm = sgemm_gflops()
    print(f"CIFAR-10 shape, SGD lr={LR} momentum={MOMENTUM}, one thread; "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"single-core sgemm (numpy's BLAS, {SGEMM_SIZE}^3 float32): {sgemm:.1f} GFLOP/s "
          "(best product of the first second)")
    print(f"samples/s: median (min-max) of {args.repeats} repetitions of ~{args.seconds:g} s "
          "after warm-up, taking turns; GFLOP/s: iasgd's median; sgemm GFLOP/s: the median "
          "of the sgemm turns; of sgemm: the median over the repetitions of iasgd's rate over "
          "the sgemm rate of the same turn (the VM's speed drifts)")
    before = f" {args.baseline} samples/s | this / {args.baseline} |" if tree else ""
    print(f"| model | params | batch | iasgd samples/s | GFLOP/s | sgemm GFLOP/s | of sgemm "
          f"| PyTorch {torch_version or '(absent)'} samples/s | ratio |{before}")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if tree else ""))
    built = []
    for name in names:
        model = models.build(name, DATASET)
        built.append(model)
        flops = model_flops(model)
        for b in batches:
            # before/after: both versions run alike, each in a child of its own
            children = [ChildSteps(REPO, name, b, n), ChildSteps(tree, name, b, n)] if tree \
                else []
            runners = [children[0] if tree else iasgd_runner(model, b, images, labels)]
            if torch_version:
                runners.append(torch_runner(model, b, images, labels))
            runners += children[1:]
            runners.append(sgemm_runner())
            rates = side_by_side(runners, b, args.seconds, args.repeats)
            gemm = [r / b * 2 * SGEMM_SIZE ** 3 / 1e9 for r in rates.pop()]  # GFLOP/s
            of_sgemm = statistics.median(ours * flops / 1e9 / g
                                         for ours, g in zip(rates[0], gemm, strict=True))
            for child in children:
                child.close()
            if torch_version:
                ratio = f"{statistics.median(rates[0]) / statistics.median(rates[1]):.2f}x"
                theirs = fmt(rates[1])
            else:
                ratio = theirs = "-"
            gflops = statistics.median(rates[0]) * flops / 1e9
            old = (f" {fmt(rates[-1])} | "
                   f"{statistics.median(rates[0]) / statistics.median(rates[-1]):.2f}x |"
                   if tree else "")
            print(f"| {name} | {model.num_params:,} | {b} | {fmt(rates[0])} | {gflops:.1f} | "
                  f"{statistics.median(gemm):.1f} | {of_sgemm:.0%} | {theirs} | {ratio} |{old}",
                  flush=True)
    if not args.no_breakdown:
        print("\nper-op breakdown: microseconds per batch of each op run alone, and its "
              "GFLOP/s (backward: weight and input gradients together)")
        print("| model | batch | op | forward us | GFLOP/s | backward us | GFLOP/s |")
        print("|---|---:|---|---:|---:|---:|---:|")
        for model in built:
            for b in batches:
                print("\n".join(op_breakdown(model, b)), flush=True)
    if not args.no_startup:
        print_startup()


def print_startup() -> None:
    """The time of a fresh process to its first training step, cold and
    warm, as bench/coldstart.py measures it: the run's own path (the
    kernels compiled side by side in child processes), LeNet-5 on synthetic
    CIFAR-shaped data, sequential."""
    import coldstart  # bench/coldstart.py, beside this file

    job = argparse.Namespace(dataset="synthetic", model="lenet", algo="sequential", threads=1)
    with tempfile.TemporaryDirectory(prefix="iasgd-kernels-") as cache:
        cold = coldstart.time_to_first_step(job, cache)["first_step"]
        warm = statistics.median(coldstart.time_to_first_step(job, cache)["first_step"]
                                 for _ in range(3))
    print(f"fresh process to first step (bench/coldstart.py: LeNet-5, sequential): "
          f"{cold:.1f} s with an empty numba cache, {warm:.2f} s cached")


if __name__ == "__main__":
    main()
